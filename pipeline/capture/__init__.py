"""Capture stage: run a build with rustc's self-profiler on, inside an ETW recording (WPR or xperf), or both.

Entry point: :func:`run` (:mod:`.record`; what it asks of rustc: :mod:`.rustc`). The build runs once; what it
records lands in one run directory, ready for ``bootprof run JOB --run RUN_DIR``: self-profiles in
``RUN_DIR/selfprofile/``, the merged ETL trace in ``RUN_DIR/input/trace.etl``, and
``RUN_DIR/capture/_manifest.json`` describing the capture.

Self-profiling: ``-Zself-profile=RUN_DIR/selfprofile`` (and ``-Zself-profile-events=...``)
is appended to ``RUSTFLAGS`` (or ``CARGO_ENCODED_RUSTFLAGS`` when that is set, since cargo then
ignores ``RUSTFLAGS``). Before the build, one tiny rustc run checks that the toolchain accepts ``-Z``
(nightly, or stable with ``RUSTC_BOOTSTRAP=1``) and says so clearly when it does not.

ETW (``pipeline.capture.etw``): the recording starts before the build and is always stopped, merged
into the trace, after it: when the build fails, on Ctrl-C and on SIGTERM. With heap snapshots, the
build's live ``rustc`` processes are snapshotted every PERIOD seconds.
"""

from pipeline.capture.record import PARTIAL_TRACE, PROFILE_DIR, STAGE, TRACE, run
from pipeline.capture.rustc import DEFAULT_EVENTS, check_self_profile, profile_env, rustc_command, toolchain

__all__ = ["DEFAULT_EVENTS", "PARTIAL_TRACE", "PROFILE_DIR", "STAGE", "TRACE", "check_self_profile", "profile_env",
           "run", "rustc_command", "toolchain"]
