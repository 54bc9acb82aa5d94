"""A short run of the fuzzer (``make fuzz`` runs it for half an hour): damaged real traces and self-profiles
through every stage, with no traceback and no record lost without an error row."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, fixture_path


def test_fuzz_smoke():
    files = [fixture_path("etl/airbus/AMSITrace.etl"), fixture_path("etl/airbus/ShutdownPerfDiagLogger.etl"),
             fixture_path("selfprofile/workspace-clean/___-0009370.mm_profdata")]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz.py"), "--mutations", "8", "--seed", "11",
                           *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "fuzz: 24 damaged runs of 3 files, 0 failures, 0 silent losses"
