"""Where a capture puts what it records in a run directory (the capture, its packs and the job runner read them)."""

from __future__ import annotations

from pathlib import Path

#: The self-profiles of the build's rustc processes.
PROFILE_DIR = "selfprofile"

#: Where the merged ETL trace goes, and where the ETW tool writes it until it is complete.
TRACE = Path("input") / "trace.etl"

PARTIAL_TRACE = Path("input") / "trace.partial.etl"
