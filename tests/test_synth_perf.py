"""The made-up perf.data file (``pipeline.synth.perf``: what ``scripts/compile_kernels.py`` compiles the perf walk
on) decodes to its truth: samples per process and thread, the processes named, stacks with kernel and user frames,
the Unix time of its clock; without JIT too (the walk as plain Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, assert_same_tables


@pytest.mark.parametrize("dwarf", [False, True], ids=["fp", "dwarf"])
def test_the_made_up_file_decodes_to_its_truth_with_and_without_jit(tmp_path, dwarf):
    from pipeline.synth.perf import write_perf

    data = tmp_path / "perf.data"
    truth = write_perf(data, seed=3, dwarf=dwarf)
    assert write_perf(tmp_path / "again.data", seed=3, dwarf=dwarf) == truth
    assert (tmp_path / "again.data").read_bytes() == data.read_bytes()
    runs = {}
    for mode, extra in (("jit", {}), ("nojit", {"NUMBA_DISABLE_JIT": "1"})):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"} | extra
        runs[mode] = tmp_path / mode
        proc = subprocess.run([sys.executable, "-m", "pipeline", "decode", str(data), "--run", str(runs[mode])],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert assert_same_tables(runs["jit"] / "decoded", runs["nojit"] / "decoded") >= 8
    decoded = runs["jit"] / "decoded"
    samples = pq.read_table(decoded / "samples.parquet").to_pylist()
    assert Counter(s["pid"] for s in samples) == truth["per_pid"]
    assert Counter((s["pid"], s["tid"]) for s in samples) == truth["per_tid"]
    assert all(s["stack_id"] is not None for s in samples) and {s["cpumode"] for s in samples} == {1, 2}
    procs = {p["pid"]: p["image_name"] for p in pq.read_table(decoded / "processes.parquet").to_pylist()}
    assert procs == {100: "cargo", 200: "rustc", 210: "rustc", 220: "rustc"}
    threads = {t["thread_name"] for t in pq.read_table(decoded / "threads.parquet").to_pylist()}
    assert "opt cgu.0" in threads
    images = pq.read_table(decoded / "images.parquet").to_pylist()
    assert sum(1 for i in images if i["build_id"]) == 3 and any(i["file_name"].startswith("[kernel.kallsyms]") and i["pid"] == 0
                                                                  for i in images)
    perf = json.loads((decoded / "_manifest.json").read_text())["perf"]
    assert perf["errors"] == 0 and perf["origin_unix_ns"] == truth["origin_unix_ns"]
    # each sample's frames: its callchain; with dwarf, the kernel part, then the user IP (the made-up files have no
    # call frame information to unwind further with)
    st = pq.read_table(decoded / "stacks.parquet").to_pydict()
    frames = dict(zip(st["stack_id"], st["frames"]))
    order = sorted(range(len(samples)), key=lambda i: samples[i]["stream_pos"])
    assert [frames[samples[i]["stack_id"]] for i in order] == truth["stacks"]
    assert ("dwarf_unwind" in perf) == dwarf
