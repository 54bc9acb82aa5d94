"""The ETL decoder's kernel unit tests (marker ``kernels``) once more with ``NUMBA_DISABLE_JIT=1``, as LiberTEM
runs its numba tests: every kernel then runs as the plain Python it is written in, so that an error numba's
typing hides (an index past the end that the compiled code reads without a check, a branch that the compiled
code never takes) shows as a Python error, and coverage sees the kernels' lines. ``test_decode_nojit`` does the
same for whole decodes of small synthesized traces."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT

#: The modules that hold the decoder's kernel unit tests.
MODULES = ("tests/test_decode_etl.py", "tests/test_decode_etl_buckets.py")


def _pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "kernels", *args, *MODULES],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)


def test_kernel_unit_tests_pass_as_plain_python():
    # (a pytest of its own: not a worker of this run's pytest-xdist, whose shared directory it would take for its own)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT" and not k.startswith("PYTEST_XDIST")}
    # (numpy warns when plain-Python hashing wraps around uint64 scalars, as the compiled code does silently)
    proc = _pytest("-W", "ignore:overflow encountered:RuntimeWarning", env=env | {"NUMBA_DISABLE_JIT": "1"})
    assert proc.returncode == 0, proc.stdout[-5000:]
    # (every kernel test it selected passed: none skipped, none left out)
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 20 and re.search(r"\d+ deselected", summary), summary
    assert not re.search(r"skipped|xfail|xpass|error|failed", summary), summary
