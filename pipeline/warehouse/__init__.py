"""Warehouse stage: every run's manifests and aggregated tables in one DuckDB file, for SQL across runs.

Entry point: :func:`run` (the job runner's stage) = :func:`ingest` (:mod:`.ingest`) of one run directory into
``config.warehouse.path``. A run is keyed by its ``run_id`` (the run directory's name); ingesting it
again replaces all of its rows in one transaction, so ingestion is idempotent and a crash leaves
the previous state. Each ``aggregated/<table>.parquet`` becomes rows of the warehouse table of the
same name with ``run_id`` in front (tables and columns are created as they first appear, so new
aggregate sections need no change here). ``runs`` holds one row per run, ``run_metrics`` the numbers runs are
compared by and ``verdicts`` each run's comparison with its baseline (:mod:`.comparison`, :mod:`.significance`; each
family's verdict from the whole history, :func:`judge_history` in :mod:`.history`), kept current as runs come in; the views ``metrics``, ``run_baselines``, ``comparisons`` and ``regressions`` answer
"what changed". Every table, view and column is described in ``schema.md``.
"""

from pipeline.warehouse.baseline import compare, folded
from pipeline.warehouse.history import judge_history
from pipeline.warehouse.ingest import AGGREGATED, STAGES, headline, holds, ingest, job_of, run, stale_reason
from pipeline.warehouse.store import NOT_INGESTED, connect, prune

__all__ = ["AGGREGATED", "NOT_INGESTED", "STAGES", "compare", "connect", "folded", "headline", "holds", "ingest",
           "job_of", "judge_history", "prune", "run", "stale_reason"]
