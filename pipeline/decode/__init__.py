"""Decode stage: ETL traces and rustc self-profiles into parquet tables in ``RUN_DIR/decoded/``.

Entry point: :func:`run` (:mod:`.stage`). Inputs are recognized by content, not by name (:mod:`.inputs`). One run
holds at most one ETL trace and any number of self-profiles; both decode into the same ``decoded/`` output: the
trace by :mod:`.etl`, the self-profiles by :mod:`.measureme`. An input may be an fsspec URL
(:mod:`pipeline.sources`): the tasks then read their parts of it from there.
"""

from pipeline.decode.inputs import ETL, PERF, SELF_PROFILE, classify, sniff
from pipeline.decode.stage import STAGE, WARM_UP, headline, inputs_changed, refuse_changed, run

__all__ = ["ETL", "PERF", "SELF_PROFILE", "STAGE", "WARM_UP", "classify", "headline", "inputs_changed", "refuse_changed",
           "run", "sniff"]
