"""The decoders' numba kernels once more as plain Python (NUMBA_DISABLE_JIT=1), so that Python-level errors and
coverage show: small synthesized traces (XPRESS and stack keys with 64-bit pointers; full stacks with 32-bit
ones, heap snapshots in both) and their rustc self-profiles decode to tables equal to the compiled run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, assert_same_tables


@pytest.mark.parametrize("variant", [dict(seed=5, compress=True, stack_caching=True),
                                     dict(seed=6, pointer_size=4)], ids=["xpress64_cached", "plain32"])
def test_decode_without_jit_equals_compiled(tmp_path, variant):
    from pipeline import synth
    from pipeline.config import SynthConfig

    trace = tmp_path / "input" / "trace.etl"
    synth.run(trace, SynthConfig(size="300KB", cpus=2, **variant))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}}))
    runs = {}
    for mode, extra in (("jit", {}), ("nojit", {"NUMBA_DISABLE_JIT": "1"})):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"} | extra
        runs[mode] = tmp_path / mode
        proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(cfg), "decode", str(trace),
                               str(trace.parent / "selfprofile"), "--run", str(runs[mode])],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert assert_same_tables(runs["jit"] / "decoded", runs["nojit"] / "decoded") >= 15
    manifests = [json.loads((runs[m] / "decoded" / "_manifest.json").read_text()) for m in ("jit", "nojit")]
    assert manifests[0]["tables"] == manifests[1]["tables"] and manifests[0]["tables"]["samples"] > 100
    assert manifests[0]["self_profile"]["decoded"] == manifests[1]["self_profile"]["decoded"] > 10
