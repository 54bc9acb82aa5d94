"""Where a capture puts what it records in a run directory (the capture, its packs and the job runner read them)."""

from __future__ import annotations

from pathlib import Path

#: The self-profiles of the build's rustc processes.
PROFILE_DIR = "selfprofile"

#: Where the merged ETL trace goes, and where the ETW tool writes it until it is complete.
TRACE = Path("input") / "trace.etl"

PARTIAL_TRACE = Path("input") / "trace.partial.etl"

#: Where ``capture --perf`` puts the perf.data file once perf has written it whole (:mod:`pipeline.capture.perf`).
PERF_TRACE = Path("input") / "perf.data"

#: The recordings a capture may leave, one a run (the run's trace, whichever tool made it).
RECORDINGS = (TRACE, PERF_TRACE)
