"""The synthesizer's numba kernels once more as plain Python (NUMBA_DISABLE_JIT=1), so Python-level
errors and coverage are visible; the output must be byte-identical to the compiled run."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import hashlib, sys
from dissect.util.compression.lzxpress import decompress
from pipeline.synth.xpress import compress
from pipeline.synth.records import stack_batch
import numpy as np
data = (b"rustc_middle::ty::context" * 40 + bytes(range(256)) + b"z" * 300) * 3
z = compress(data)
assert decompress(z) == data
frames = np.arange(1, 40, dtype=np.uint64) * 0x1000
b = stack_batch("StackWalk.Stack", 0x1820, 8, 0, np.array([10, 20]), np.array([0, 1]), frames,
                np.array([0, 5]), np.array([5, 30]), ev_ts=np.array([9, 19]), pid=np.array([4, 4]), tid=np.array([8, 8]))
print(hashlib.sha256(z + b.blob.tobytes()).hexdigest())
"""


def _run(env_extra):
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_kernels_without_jit_match_compiled():
    assert _run({"NUMBA_DISABLE_JIT": "1"}) == _run({})


def test_small_trace_without_jit_is_identical(tmp_path):
    script = ("import sys; from pipeline.config import SynthConfig; from pipeline.synth import run; "
              "run(sys.argv[1], SynthConfig(seed=5, size='200KB', cpus=2, stack_caching=True))")
    for name, extra in (("jit", {}), ("nojit", {"NUMBA_DISABLE_JIT": "1"})):
        r = subprocess.run([sys.executable, "-c", script, str(tmp_path / name / "t.etl")], cwd=ROOT,
                           env=dict(os.environ, **extra), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    for f in ("t.etl", "t.truth.json"):
        assert (tmp_path / "jit" / f).read_bytes() == (tmp_path / "nojit" / f).read_bytes()
