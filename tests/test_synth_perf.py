"""The made-up perf.data file (``pipeline.synth.perf``: what ``scripts/compile_kernels.py`` compiles the perf walk
on) decodes to its truth: samples per process and thread, the processes named, stacks with kernel and user frames,
the Unix time of its clock; without JIT too (the walk as plain Python). A copy with times at or past 2^63 gives
error rows for those records and the rest of the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pyarrow as pa
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


def _decode(path, run):
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.config import Config

    config = Config()
    config.cluster.mode = "synchronous"
    return decode.run(run, config, Pool(None), inputs=[path])["perf"]


def test_times_at_or_past_2p63_are_error_rows_and_the_rest_decodes(tmp_path):
    """The top bit of four records' times set (a flipped byte; no clock gives such a time and an int64 column would
    hold it negative): a sample's, an EXIT's, and the sample-id trailer's of a COMM and of an MMAP2. Each record is
    skipped with a ``bad_value`` row at its byte offset; the rest decodes as the intact file does; and the same
    without JIT."""
    from pipeline.synth.perf import COMM, EXIT, MMAP2, SAMPLE, write_perf
    from tests.helpers.perfbuild import record_offsets

    path = tmp_path / "perf.data"
    truth = write_perf(path, seed=3)
    data = bytearray(path.read_bytes())
    recs = record_offsets(bytes(data))
    of = {t: [r for r in recs if r[1] == t] for t in (SAMPLE, EXIT, COMM, MMAP2)}
    sample, worker_exit = of[SAMPLE][len(of[SAMPLE]) // 2], of[EXIT][0]
    worker_comm, text_mmap = of[COMM][4], of[MMAP2][4]      # (rustc 210's "opt cgu.0", rustc 220's /synth/bin/rustc)
    assert bytes(data[worker_comm[0] + 16:worker_comm[0] + 25]) == b"opt cgu.0"
    # (the top byte of each time: a sample's after its header, IP and TID; an EXIT's after header, pids and tids;
    # a trailer's (TID, TIME) at the record's end)
    for at in (sample[0] + 31, worker_exit[0] + 31, worker_comm[0] + worker_comm[2] - 1,
               text_mmap[0] + text_mmap[2] - 1):
        data[at] |= 0x80
    damaged = tmp_path / "damaged.data"
    damaged.write_bytes(bytes(data))

    intact, got = _decode(path, tmp_path / "intact"), _decode(damaged, tmp_path / "jit")
    decoded = tmp_path / "jit" / "decoded"
    errors = pq.read_table(decoded / "errors.parquet").to_pylist()
    assert got["errors"] == len(errors) == 4
    assert sorted((e["kind"], e["file_offset"]) for e in errors) == sorted(
        ("bad_value", r[0]) for r in (sample, worker_exit, worker_comm, text_mmap))
    assert all(str(damaged) in e["message"] and "2^63" in e["message"] for e in errors)
    victim = int.from_bytes(data[sample[0] + 16:sample[0] + 20], "little")
    samples = pq.read_table(decoded / "samples.parquet").to_pylist()
    assert Counter(s["pid"] for s in samples) == Counter(truth["per_pid"]) - Counter({victim: 1})
    assert got["samples"] == intact["samples"] - 1 and got["images"] == intact["images"] - 1
    assert got["processes"] == intact["processes"] and got["origin_unix_ns"] == intact["origin_unix_ns"]
    for table in ("samples", "processes", "threads", "images"):
        t = pq.read_table(decoded / f"{table}.parquet")
        for name in t.column_names:
            if name.endswith(("_ns", "timestamp")) and pa.types.is_integer(t.schema.field(name).type):
                assert all(v is None or v >= 0 for v in t.column(name).to_pylist()), (table, name)
    threads = pq.read_table(decoded / "threads.parquet").to_pylist()
    assert [t["thread_name"] for t in threads if t["tid"] == 211] != ["opt cgu.0"]

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"} | {"NUMBA_DISABLE_JIT": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "decode", str(damaged), "--run", str(tmp_path / "nojit")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert assert_same_tables(decoded, tmp_path / "nojit" / "decoded") >= 8
