"""ETL aggregate sections on small decoded/symbolized tables written here: the cases the synthesizer
does not make (reused pid and image range with different code, inlined frames, recursion, missing
symbols, frees of several kinds)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.config import Config
from pipeline.runs import read_manifest, read_table, stage_output

U32, U64, I64 = pa.uint32(), pa.uint64(), pa.int64()
BASE = 0x7FF6_0000_0000
COMMIT, RESERVE, DECOMMIT, RELEASE = 0x1000, 0x2000, 0x4000, 0x8000


def write(run, stage: str, tables: dict[str, pa.Table]) -> None:
    with stage_output(run, stage) as out:
        for name, t in tables.items():
            out.write_table(name, t)


def processes():
    # pid 100 runs twice (A: old.exe, then B: new.exe); pid 7 (cargo) starts both; pid 7 itself is reused
    # later by an unrelated process whose child must not hang below the first pid 7
    rows = [(7, 1, "cargo.exe", "cargo build", 0, 5000),
            (100, 7, "rustc.exe", "rustc --crate-name alpha x.rs", 10, 1000),
            (100, 7, "rustc.exe", 'rustc.exe "--crate-name" beta y.rs', 2000, 4000),
            (7, 1, "late.exe", "late", 6000, None),
            (200, 7, "child.exe", "child", 6500, None)]
    cols = list(zip(*rows))
    return pa.table({"pid": pa.array(cols[0], U32), "parent_pid": pa.array(cols[1], U32),
                     "image_name": cols[2], "command_line": cols[3],
                     "start_ns": pa.array(cols[4], I64), "end_ns": pa.array(cols[5], I64),
                     "exit_status": pa.array([0] * len(rows), pa.int32()),
                     "first_seen_ns": pa.array(cols[4], I64), "last_seen_ns": pa.array([c or 9000 for c in cols[5]], I64)})


def images():
    # the same range holds old.dll in A and new.dll in B
    rows = [(100, BASE, 0x10000, r"C:\x\old.dll", 10, 1000), (100, BASE, 0x10000, r"C:\x\new.dll", 2000, 4000),
            (100, BASE + 0x100000, 0x10000, r"C:\x\nosym.dll", None, None)]
    cols = list(zip(*rows))
    return pa.table({"pid": pa.array(cols[0], U32), "base": pa.array(cols[1], U64), "size": pa.array(cols[2], U64),
                     "file_name": cols[3], "load_ns": pa.array(cols[4], I64), "unload_ns": pa.array(cols[5], I64)})


def frames():
    # (address, module, function, raw_name, inline_depth, image_load_ns)
    rows = [(BASE + 0x10, "old.dll", "old::leaf", "_ZN3old4leaf17h0000000000000000E", 0, 10),
            (BASE + 0x10, "new.dll", "new::outer", "_ZN3new5outer17h0000000000000000E", 0, 2000),
            (BASE + 0x10, "new.dll", "new::inlined", "_ZN3new7inlined17h0000000000000000E", 1, 2000),
            (BASE + 0x20, "old.dll", "old::main", "_ZN3old4main17h0000000000000000E", 0, 10),
            (BASE + 0x20, "new.dll", "new::main", "_ZN3new4main17h0000000000000000E", 0, 2000),
            (BASE + 0x30, "new.dll", "new::rec", "_ZN3new3rec17h0000000000000000E", 0, 2000),
            (BASE + 0x34, "new.dll", "new::rec", "_ZN3new3rec17h0000000000000000E", 0, 2000)]
    cols = list(zip(*rows))
    n = len(rows)
    return pa.table({"address": pa.array(cols[0], U64), "pid": pa.array([100] * n, U32), "module": cols[1],
                     "rva": pa.array([a - BASE for a in cols[0]], U64), "function": cols[2], "raw_name": cols[3],
                     "inline_depth": pa.array(cols[4], pa.uint16()), "file": pa.nulls(n, pa.string()),
                     "line": pa.nulls(n, U32), "resolved": [True] * n,
                     "image_load_ns": pa.array(cols[5], I64),
                     "image_unload_ns": pa.array([1000 if c == 10 else 4000 for c in cols[5]], I64)})


STACKS = {0: [BASE + 0x10, BASE + 0x20],                       # leaf, main
          1: [BASE + 0x10, BASE + 0x30, BASE + 0x34, BASE + 0x20],   # recursion: rec twice
          2: [BASE + 0x100010, BASE + 0x20],                   # leaf in an image without symbols
          3: [0xDEAD0000, BASE + 0x20]}                         # leaf outside every image


def samples():
    # (t, pid, ip, stack_id)
    rows = [(500, 100, BASE + 0x10, 0)] * 3 + [(2500, 100, BASE + 0x10, 0)] * 5 + [(2600, 100, BASE + 0x10, 1)] * 2 \
        + [(2700, 100, BASE + 0x100010, 2), (2800, 100, 0xDEAD0000, 3), (2900, 100, BASE + 0x20, None),
           (100, 7, 0x1234, None), (3000, None, 0x4321, None)]    # the last: no process (a damaged trace)
    cols = list(zip(*rows))
    return pa.table({"timestamp_ns": pa.array(cols[0], I64), "cpu": pa.array([0] * len(rows), pa.uint16()),
                     "tid": pa.array([1] * len(rows), U32), "pid": pa.array(cols[1], U32),
                     "ip": pa.array(cols[2], U64), "stack_id": pa.array(cols[3], I64)})


def virtual_allocs():
    # (t, pid, base, size, flags, kind, stack_id)
    rows = [(20, 100, 0x10000, 100, COMMIT | RESERVE, "alloc", 0),
            (30, 100, 0x20000, 1000, RESERVE, "alloc", 0),          # reserve only: no commit
            (40, 100, 0x30000, 80, COMMIT, "alloc", 0),
            (50, 100, 0x10000, 0, RELEASE, "free", None),           # size 0: all 100 back
            (60, 100, 0x10000, 50, COMMIT, "alloc", 0),             # base reused: a new commit
            (70, 100, 0x30000, 30, DECOMMIT, "free", None),         # partial
            (80, 100, 0x30000, 0, RELEASE, "free", None),           # the remaining 50
            (90, 100, 0x40000, 10, RELEASE, "free", None),          # committed before the trace
            (2100, 100, 0x10000, 40, COMMIT, "alloc", 1)]           # process B, same base again
    cols = list(zip(*rows))
    return pa.table({"timestamp": pa.array(cols[0], I64), "timestamp_ns": pa.array(cols[0], I64),
                     "cpu": pa.array([0] * len(rows), pa.uint16()), "pid": pa.array(cols[1], U32),
                     "tid": pa.nulls(len(rows), U32), "base": pa.array(cols[2], U64), "size": pa.array(cols[3], U64),
                     "flags": pa.array(cols[4], U32), "kind": cols[5], "stack_id": pa.array(cols[6], I64)})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from pipeline import aggregate

    run = tmp_path_factory.mktemp("cases") / "run"
    stacks = pa.table({"stack_id": pa.array(list(STACKS), I64), "frames": pa.array(list(STACKS.values()), pa.list_(U64))})
    write(run, "decoded", {"processes": processes(), "images": images(), "stacks": stacks, "samples": samples(),
                           "virtual_allocs": virtual_allocs()})
    write(run, "symbolized", {"frames": frames()})
    config = Config()
    config.cluster.mode = "synchronous"
    aggregate.run(run, config, None)
    return run


def by(run, table, *keys):
    return {tuple(r[k] for k in keys): r for r in read_table(run, "aggregated", table).to_pylist()}


def test_reused_pid_and_image_range_resolve_by_time(run):
    procs = by(run, "cpu_by_process", "pid", "start_ns")
    assert procs[(100, 10)]["samples"] == 3 and procs[(100, 10)]["crate"] == "alpha"
    assert procs[(100, 2000)]["samples"] == 10 and procs[(100, 2000)]["crate"] == "beta"
    assert procs[(7, 0)]["samples"] == 1
    fns = by(run, "cpu_by_function", "module", "function")
    assert fns[("old.dll", "old::leaf")]["self_samples"] == 3
    assert fns[("old.dll", "old::main")]["inclusive_samples"] == 3
    assert fns[("new.dll", "new::main")]["inclusive_samples"] == 10
    assert ("old.dll", "old::main") in fns and fns[("old.dll", "old::main")]["self_samples"] == 0
    crates = {r["crate"]: r["samples"] for r in read_table(run, "aggregated", "cpu_by_crate").to_pylist()}
    assert crates == {"alpha": 3, "beta": 10}


def test_inlined_leaf_recursion_and_missing_symbols(run):
    fns = by(run, "cpu_by_function", "module", "function")
    # the innermost inlined function is the leaf; its real function is on the stack too
    assert (fns[("new.dll", "new::inlined")]["self_samples"], fns[("new.dll", "new::inlined")]["inclusive_samples"]) == (7, 7)
    assert (fns[("new.dll", "new::outer")]["self_samples"], fns[("new.dll", "new::outer")]["inclusive_samples"]) == (0, 7)
    assert fns[("new.dll", "new::rec")]["inclusive_samples"] == 2      # twice on one stack, counted once
    assert fns[("nosym.dll", "nosym.dll+0x10")]["self_samples"] == 1
    assert fns[(None, "0xdead0000")]["self_samples"] == 1
    assert fns[("new.dll", "new::main")]["self_samples"] == 1           # the sample without a stack: its ip
    assert fns[(None, "0x1234")]["self_samples"] == 1 and fns[(None, "0x4321")]["self_samples"] == 1
    assert {r["crate"] for r in fns.values()} == {"old", "new", None}
    assert sum(r["self_samples"] for r in fns.values()) == 15
    modules = by(run, "cpu_by_module", "module")
    assert modules[("new.dll",)]["inclusive_samples"] == 10 and modules[("nosym.dll",)]["self_samples"] == 1
    folded = {r["stack"]: r["samples"] for r in read_table(run, "aggregated", "cpu_folded").to_pylist()}
    assert folded["rustc.exe beta;new.dll!new::main;new.dll!new::outer;new.dll!new::inlined"] == 5
    assert folded["rustc.exe beta;new.dll!new::main;new.dll!new::rec;new.dll!new::rec;new.dll!new::outer;"
                  "new.dll!new::inlined"] == 2
    assert folded["rustc.exe alpha;old.dll!old::main;old.dll!old::leaf"] == 3
    assert folded["rustc.exe beta;new.dll!new::main;nosym.dll+0x10"] == 1
    assert folded["cargo.exe;0x1234"] == 1
    assert folded["[unknown process];0x4321"] == 1 and None not in folded     # (a null stack broke the report)


def test_commit_frees_and_peak(run):
    memory = read_manifest(run, "aggregated")["sections"]["memory"]
    # the whole trace: A's levels below, then B's +40 at t=2100 (90): peak 180 at t=40, 90 still committed
    assert memory == {"commits": 4, "frees": 4, "frees_unmatched": 1, "commit_bytes": 270, "returned_bytes": 180,
                      "outstanding_bytes": 90, "peak_commit_bytes": 180, "peak_ns": 40, "commit_frames_unresolved": 0,
                      "commit_time_bins": {"count": 200, "t0_ns": 20, "span_ns": 2080}}     # (commits from 20 to 2100 ns)
    rows = read_table(run, "aggregated", "commit_by_process").to_pylist()
    a, b = sorted((r for r in rows if r["pid"] == 100), key=lambda r: r["process_key"])
    # A: +100 (100) +80 (180) -100 (80) +50 (130) -30 (100) -50 (50): peak 180 at t=40
    assert (a["commit_bytes"], a["returned_bytes"], a["outstanding_bytes"]) == (230, 180, 50)
    assert (a["peak_commit_bytes"], a["peak_ns"], a["allocs"], a["frees"]) == (180, 40, 3, 4)
    assert (b["commit_bytes"], b["outstanding_bytes"], b["peak_commit_bytes"]) == (40, 40, 40)
    stacks = by(run, "commit_by_stack", "stack_id")
    assert (stacks[(0,)]["commit_bytes"], stacks[(0,)]["outstanding_bytes"], stacks[(0,)]["allocs"]) == (230, 50, 3)
    assert stacks[(0,)]["folded"] == "old.dll!old::main;old.dll!old::leaf"
    assert stacks[(1,)]["folded"].startswith("new.dll!new::main;new.dll!new::rec;new.dll!new::rec")


def test_process_tree_parents_by_time(run):
    tree = by(run, "process_tree", "pid", "start_ns")
    cargo, late = tree[(7, 0)], tree[(7, 6000)]
    assert tree[(100, 10)]["parent_key"] == cargo["process_key"]
    assert tree[(100, 2000)]["parent_key"] == cargo["process_key"]
    assert tree[(200, 6500)]["parent_key"] == late["process_key"]
    assert cargo["parent_key"] is None and cargo["depth"] == 0 and tree[(100, 10)]["depth"] == 1
    assert cargo["tree_samples"] == 14 and cargo["samples"] == 1
    assert tree[(100, 2000)]["duration_ns"] == 2000 and tree[(200, 6500)]["end_ns"] is None


def test_process_samples_by_hash_join_and_by_asof_join_agree(run, tmp_path, monkeypatch):
    """The processes section finds each sample's instance with a hash join on its pid and the instances' time
    ranges, or, past ``RANGE_JOIN_MAX_INSTANCES`` instances of one pid, with an ASOF join: the same tree
    (pids 7 and 100 run twice here, and some samples come before their pid's first start)."""
    import shutil

    from pipeline import aggregate
    from pipeline.aggregate import processes as P

    for stage in ("decoded", "symbolized"):
        shutil.copytree(run / stage, tmp_path / "run" / stage)
    monkeypatch.setattr(P, "RANGE_JOIN_MAX_INSTANCES", 1)
    config = Config()
    config.cluster.mode = "synchronous"
    aggregate.run(tmp_path / "run", config, None)
    asof = read_table(tmp_path / "run", "aggregated", "process_tree")
    assert asof.equals(read_table(run, "aggregated", "process_tree"))
    assert sum(asof.column("samples").to_pylist()) < read_table(run, "decoded", "samples").num_rows


@pytest.mark.parametrize("limit", [0, 2])
def test_epochs_by_hash_join_and_by_asof_join_agree(tmp_path, monkeypatch, limit):
    """Each sample and commit finds its image epoch with a hash join on its pid and the epochs' time ranges,
    or, when its rows meet more than ``RANGE_JOIN_MAX_BOUNDS`` bounds of their pid on average, with an ASOF
    join: every aggregated table is the same. pid 100 runs twice and its range holds two images in turn; in
    its second run a third image overlaps the second, so their loads and unloads are bounds too (those of
    images that overlap only an image of another run are not: the run's start parts them); samples come
    before its first start, after an unload, and exactly at every bound (a load, an unload, a start). With a
    limit of 2 the average is worked out from the rows (pid 100 has 4 bounds) and still exceeds it."""
    from pipeline import aggregate
    from pipeline.aggregate import resolve

    at_bounds = [(t, 100, BASE + 0x10, s) for t in (10, 1000, 2000, 3000, 4000) for s in (0, 1)] + [(6000, 7, 0x1234, None)]
    overlapping = pa.table({"pid": pa.array([100], U32), "base": pa.array([BASE + 0x8000], U64),
                            "size": pa.array([0x10000], U64), "file_name": [r"C:\x\late.dll"],
                            "load_ns": pa.array([3000], I64), "unload_ns": pa.nulls(1, I64)})
    more = pa.table({"timestamp_ns": pa.array([r[0] for r in at_bounds], I64),
                     "cpu": pa.array([0] * len(at_bounds), pa.uint16()), "tid": pa.array([1] * len(at_bounds), U32),
                     "pid": pa.array([r[1] for r in at_bounds], U32), "ip": pa.array([r[2] for r in at_bounds], U64),
                     "stack_id": pa.array([r[3] for r in at_bounds], I64)})
    stacks = pa.table({"stack_id": pa.array(list(STACKS), I64), "frames": pa.array(list(STACKS.values()), pa.list_(U64))})
    config = Config()
    config.cluster.mode = "synchronous"
    probes = []
    monkeypatch.setattr(resolve, "epoch_probes", lambda con, rows, f=resolve.epoch_probes: probes.append(f(con, rows))
                        or probes[-1])
    for name in ("hash", "asof"):
        if name == "asof":
            monkeypatch.setattr(resolve, "RANGE_JOIN_MAX_BOUNDS", limit)
        write(tmp_path / name, "decoded", {"processes": processes(), "stacks": stacks,
                                           "images": pa.concat_tables([images(), overlapping]),
                                           "samples": pa.concat_tables([samples(), more]),
                                           "virtual_allocs": virtual_allocs()})
        write(tmp_path / name, "symbolized", {"frames": frames()})
        aggregate.run(tmp_path / name, config, None)
    # (samples, then commits: 4 bounds at most in one pid, the hash join; then the ASOF join both times)
    assert probes[:2] == [4, 4] and len(probes) == 4 and all(p > limit for p in probes[2:])
    tables = sorted(read_manifest(tmp_path / "hash", "aggregated")["tables"])
    assert "cpu_folded" in tables and "commit_by_stack" in tables
    for table in tables:
        assert read_table(tmp_path / "asof", "aggregated", table).equals(read_table(tmp_path / "hash", "aggregated", table)), table
    cpu = read_table(tmp_path / "hash", "aggregated", "cpu_by_process").to_pylist()
    assert sum(r["samples"] for r in cpu) == samples().num_rows + more.num_rows


def test_a_process_first_seen_long_before_the_trace(tmp_path):
    """A process without a start whose first event is far before the trace (a damaged timestamp: a fuzzed
    trace gave -2.18e18 ns) still owns its samples; its ordering key overflowed BIGINT and failed the stage."""
    from pipeline import aggregate

    procs = processes().slice(0, 1)
    early = pa.table({"pid": pa.array([300], U32), "parent_pid": pa.array([7], U32), "image_name": ["early.exe"],
                      "command_line": ["early"], "start_ns": pa.nulls(1, I64), "end_ns": pa.array([900], I64),
                      "exit_status": pa.array([0], pa.int32()), "first_seen_ns": pa.array([-2179742219611619964], I64),
                      "last_seen_ns": pa.array([900], I64)})
    stacks = pa.table({"stack_id": pa.array([0], I64), "frames": pa.array([STACKS[0]], pa.list_(U64))})
    mine = samples().slice(0, 3)
    mine = mine.set_column(mine.schema.get_field_index("pid"), "pid", pa.array([300] * 3, U32))
    write(tmp_path / "run", "decoded", {"processes": pa.concat_tables([procs, early]), "images": images(),
                                        "stacks": stacks, "samples": mine})
    config = Config()
    config.cluster.mode = "synchronous"
    aggregate.run(tmp_path / "run", config, None)
    procs = by(tmp_path / "run", "cpu_by_process", "pid", "start_ns")
    assert procs[(300, None)]["samples"] == 3 and procs[(300, None)]["image_name"] == "early.exe"
