"""Compare stage: the run against its baseline in the warehouse, as files a nightly CI shows and an exit status
it fails on.

Entry point: :func:`run` (:mod:`.stage`; ``stages: [..., warehouse, compare]``, e.g. ``jobs/nightly.yaml``), after
the run is ingested. Writes ``RUN_DIR/compare/``: ``summary.md`` (the markdown of ``bootprof warehouse compare``, for a CI
job summary; also appended to ``$GITHUB_STEP_SUMMARY`` when that is set), ``compare.html`` (the tables over a
differential flame graph) and ``comparison.json`` (every metric with its verdict). The summary it returns
counts ``regressions_past_budget``, the build and crate families that regressed with confidence by at least
``warehouse.budget_pct``: ``bootprof run`` exits 1 when it is not 0. Suspects (past the noise, but not with
confidence: no history yet, or too close to it) and the query and function metrics that explain a change never
fail the job. A run with no baseline (the first of its job and workload) writes the files saying so and passes.
"""

from pipeline.compare.stage import STAGE, headline, run

__all__ = ["STAGE", "headline", "run"]
