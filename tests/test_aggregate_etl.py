"""Aggregate stage, ETL sections (cpu, memory, processes) against the synthesizer's ground truth.

Synthesized traces go through the real decode and symbolize stages; every number the truth file
holds (samples per function/module/crate/process, commit per stack and process) must come out
exactly. Edge cases the synthesizer does not produce are in ``test_aggregate_etl_cases.py``.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from pipeline.config import Config
from pipeline.runs import read_manifest, read_table
from tests.conftest import assert_same_tables
from tests.helpers.runs import etl_config, synth_run

# full stacks; stack keys, 32-bit and XPRESS-compressed; stack keys with 64-bit heap snapshots
PIPELINE_VARIANTS = ["plain64", "xpress32_cached", "plain64_cached"]


@pytest.fixture(scope="module", params=PIPELINE_VARIANTS)
def aggregated_run(request, tmp_path_factory, dask_pool):
    """(run dir, truth) of a synthesized trace after decode, symbolize and aggregate."""
    return synth_run(tmp_path_factory.mktemp(f"agg-{request.param}"), request.param, dask_pool)


def rows(run, table: str) -> list[dict]:
    return read_table(run, "aggregated", table).to_pylist()


def self_inclusive(table: list[dict], key) -> dict:
    out = {}
    for r in table:
        k = key(r)
        assert k not in out, f"duplicate key {k}"
        out[k] = {"self": r["self_samples"], "inclusive": r["inclusive_samples"]}
    return out


def test_samples_per_function_module_crate_equal_truth(aggregated_run):
    run, truth = aggregated_run
    s = truth["samples"]
    functions = self_inclusive(rows(run, "cpu_by_function"), lambda r: f"{r['module']}!{r['raw_name'] or r['function']}")
    assert functions == s["per_function"]
    assert self_inclusive(rows(run, "cpu_by_module"), lambda r: r["module"]) == s["per_module"]
    assert self_inclusive(rows(run, "cpu_by_code_crate"), lambda r: r["crate"]) == s["per_crate"]
    assert sum(r["self_samples"] for r in rows(run, "cpu_by_function")) == s["total"]


def test_samples_per_process_instance_equal_truth(aggregated_run):
    run, truth = aggregated_run
    got = {(r["pid"], r["start_ns"]): r["samples"] for r in rows(run, "cpu_by_process")}
    want = {(p["pid"], p["start_ns"]): p["samples"] for p in truth["processes"] if p["samples"]}
    assert {k: got.get(k) for k in want} == want
    assert sum(got.values()) == truth["samples"]["total"]
    assert got[(0, None)] == truth["samples"]["idle"]
    # per compiled crate: the rustc processes' samples, by --crate-name
    crates = defaultdict(int)
    for p in truth["processes"]:
        if p["kind"] == "rustc" and p["samples"]:
            crates[p["crate"]] += p["samples"]
    assert {r["crate"]: r["samples"] for r in rows(run, "cpu_by_crate")} == dict(crates)


def test_folded_stacks_sum_to_samples_and_start_with_the_process(aggregated_run):
    run, truth = aggregated_run
    folded = rows(run, "cpu_folded")
    assert sum(r["samples"] for r in folded) == truth["samples"]["total"]
    by_root = defaultdict(int)
    for r in folded:
        by_root[r["stack"].split(";", 1)[0]] += r["samples"]
    assert by_root["Idle"] == truth["samples"]["idle"]
    core = sum(p["samples"] for p in truth["processes"] if p["kind"] == "rustc" and p["crate"] == "core")
    assert by_root["rustc.exe core"] == core
    # root first: the outermost frame of a user thread comes right after the process frame
    assert any(r["stack"].startswith("rustc.exe core;ntdll.dll!RtlUserThreadStart;") for r in folded)


def test_commit_per_stack_and_process_equal_truth(aggregated_run):
    run, truth = aggregated_run
    stacks = {r["stack_id"]: tuple(r["frames"]) for r in read_table(run, "decoded", "stacks").to_pylist()}
    got = defaultdict(lambda: {"commit_bytes": 0, "allocs": 0})
    for r in rows(run, "commit_by_stack"):
        key = stacks.get(r["stack_id"], ("no stack",))
        got[key]["commit_bytes"] += r["commit_bytes"]
        got[key]["allocs"] += r["allocs"]
    want = {tuple(int(x, 16) for x in truth["stacks"][t]["frames"]): v for t, v in truth["commit"]["per_stack"].items()}
    assert dict(got) == want
    per_pid = defaultdict(int)
    for r in rows(run, "commit_by_process"):
        per_pid[str(r["pid"])] += r["commit_bytes"]
    assert {k: v for k, v in per_pid.items() if v} == truth["commit"]["per_pid"]
    memory = read_manifest(run, "aggregated")["sections"]["memory"]
    assert memory["commit_bytes"] == truth["commit"]["total_bytes"]
    assert memory["returned_bytes"] == truth["commit"]["released_bytes"]
    assert memory["frees_unmatched"] == 0
    outstanding = sum(r["outstanding_bytes"] for r in rows(run, "commit_by_stack"))
    assert outstanding == truth["commit"]["total_bytes"] - truth["commit"]["released_bytes"]
    by_fn = rows(run, "commit_by_function")
    assert max(r["inclusive_commit_bytes"] for r in by_fn) <= truth["commit"]["total_bytes"]
    assert sum(r["self_commit_bytes"] for r in by_fn) == truth["commit"]["total_bytes"]


def per_function(truth, per_stack: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Self (the leaf frame's) and inclusive (once per stack holding it) sums of the measures of ``per_stack``
    (template id -> {measure: value}) per function ``module!symbol`` of the truth's stacks."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for template, values in per_stack.items():
        functions = truth["stacks"][template]["functions"]
        for m, v in values.items():
            out[functions[0]][f"self_{m}"] += v
            for f in set(functions):
                out[f][f"inclusive_{m}"] += v
    return {f: {k: v for k, v in ms.items() if v or k.startswith("inclusive")} for f, ms in out.items()}


def function_key(r) -> str:
    return f"{r['module']}!{r['raw_name'] or r['function']}"


def measures_of(r, names) -> dict[str, int]:
    return {f"{kind}_{m}": r[f"{kind}_{m}"] for m in names for kind in ("self", "inclusive")
            if kind == "inclusive" or r[f"{kind}_{m}"]}


def test_commit_per_function_equals_truth(aggregated_run):
    run, truth = aggregated_run
    got = {}
    for r in rows(run, "commit_by_function"):
        assert function_key(r) not in got
        got[function_key(r)] = measures_of(r, ["commit_bytes", "allocs"])
    assert got == per_function(truth, truth["commit"]["per_stack"])


def test_heap_snapshot_per_function_and_growth_equal_truth(aggregated_run):
    run, truth = aggregated_run
    ok = {(r["pid"], r["instance"], r["timestamp_ns"]) for r in rows(run, "heap_snapshots_summary") if r["status"] == "ok"}
    got = defaultdict(dict)
    for r in rows(run, "heap_snapshot_by_function"):
        snap = (r["pid"], r["instance"], r["timestamp_ns"])
        assert function_key(r) not in got[snap]
        got[snap][function_key(r)] = measures_of(r, ["bytes", "blocks"])
    want = {}
    for s in truth["heap"]["snapshots"]:
        snap = (s["pid"], s["instance"], s["timestamp_ns"])
        if snap in ok and s["per_stack"]:      # (a snapshot of untracked blocks only has no function)
            want[snap] = per_function(truth, s["per_stack"])
    assert dict(got) == want
    if truth["trace"]["pointer_size"] == 8:
        assert len(want) >= len(truth["heap"]["snapshots"]) // 2
    # growth from each snapshot to the next of its process: inclusive bytes per function, after - before
    growth = defaultdict(dict)
    for r in rows(run, "heap_snapshot_growth"):
        growth[(r["pid"], r["from_instance"], r["from_ns"], r["to_instance"], r["to_ns"])][function_key(r)] = (
            r["bytes_before"], r["bytes_after"], r["growth_bytes"])
    runs = defaultdict(list)
    for s in truth["heap"]["snapshots"]:
        if (s["pid"], s["instance"], s["timestamp_ns"]) in ok:
            runs[(s["pid"], s["process_start_raw"])].append(s)
    want_growth = {}
    for snaps in runs.values():
        snaps.sort(key=lambda s: (s["timestamp_ns"], s["instance"]))
        for a, b in zip(snaps, snaps[1:]):
            before, after = per_function(truth, a["per_stack"]), per_function(truth, b["per_stack"])
            want_growth[(a["pid"], a["instance"], a["timestamp_ns"], b["instance"], b["timestamp_ns"])] = {
                f: (before.get(f, {}).get("inclusive_bytes", 0), after.get(f, {}).get("inclusive_bytes", 0),
                    after.get(f, {}).get("inclusive_bytes", 0) - before.get(f, {}).get("inclusive_bytes", 0))
                for f in set(before) | set(after)}
    assert dict(growth) == want_growth
    assert read_manifest(run, "aggregated")["sections"].get("memory", {}).get("heap_snapshot_pairs", 0) == len(want_growth)


def test_memory_views_are_fully_symbolized_and_demangled(aggregated_run):
    """With every symbol file at hand no frame of a commit or heap view stays module+0x...; Rust's legacy
    (stage0) and v0 (stage1) manglings both read demangled there, as in the CPU views."""
    run, truth = aggregated_run
    memory = read_manifest(run, "aggregated")["sections"]["memory"]
    assert memory["commit_frames_unresolved"] == 0
    assert memory.get("heap_frames_unresolved", 0) == 0
    for table, column in [("commit_by_stack", "folded"), ("commit_folded", "stack"), ("heap_snapshot_by_stack", "folded"),
                          ("heap_folded", "stack"), ("cpu_folded", "stack")]:
        values = [r[column] for r in rows(run, table) if r[column]]
        assert values and not [v for v in values if "+0x" in v], table
    for table in ["cpu_by_function", "commit_by_function", "heap_snapshot_by_function"]:
        functions = rows(run, table)
        assert functions and all(r["raw_name"] for r in functions), table
        legacy = [r for r in functions if r["raw_name"].startswith("_ZN")]
        v0 = [r for r in functions if r["raw_name"].startswith("_R")]
        assert legacy and v0, table
        for r in legacy + v0:
            assert "::" in r["function"] and not r["function"].startswith(("_ZN", "_R")), r
        assert not [r for r in legacy if r["function"].rsplit("::", 1)[-1].startswith("h")
                    and len(r["function"].rsplit("::", 1)[-1]) == 17], "legacy hash left in the name"


def test_one_stack_is_one_folded_path_in_every_view(aggregated_run):
    """A stack id resolves to exactly one folded path, the same in the commit and heap views, and it is the
    truth's path of that stack (the truth's mangled symbols read through the run's own name pairs)."""
    run, truth = aggregated_run
    display = {}
    for table in ["cpu_by_function", "commit_by_function", "heap_snapshot_by_function"]:
        for r in rows(run, table):
            display[function_key(r)] = f"{r['module']}!{r['function']}"
    truth_path = {tuple(int(x, 16) for x in s["frames"]): ";".join(display[f] for f in reversed(s["functions"]))
                  for s in truth["stacks"].values()}
    frames = {r["stack_id"]: tuple(r["frames"]) for r in read_table(run, "decoded", "stacks").to_pylist()}
    paths = defaultdict(set)
    for table in ["commit_by_stack", "heap_snapshot_by_stack"]:
        for r in rows(run, table):
            if r["stack_id"] is not None:
                paths[r["stack_id"]].add(r["folded"])
    assert paths
    assert {k: v for k, v in paths.items() if len(v) != 1} == {}
    assert {k: v.pop() for k, v in paths.items()} == {k: truth_path[frames[k]] for k in paths}


def test_commit_per_crate_and_peak(aggregated_run):
    run, truth = aggregated_run
    procs = rows(run, "commit_by_process")
    per_crate = defaultdict(lambda: [0, 0, 0])
    for r in procs:
        if r["crate"] is not None:
            c = per_crate[r["crate"]]
            c[0] += r["commit_bytes"]
            c[1] += r["outstanding_bytes"]
            c[2] = max(c[2], r["peak_commit_bytes"])
    assert {r["crate"]: [r["commit_bytes"], r["outstanding_bytes"], r["peak_commit_bytes"]]
            for r in rows(run, "commit_by_crate")} == dict(per_crate)
    # function crates: the crate of each of the truth's frames (as the functions tables name it, checked against
    # the truth's samples per crate by test_samples_per_function_module_crate_equal_truth), once per stack
    crate_of = {function_key(r): r["crate"] for t in ("cpu_by_function", "commit_by_function") for r in rows(run, t)}
    want = defaultdict(int)
    for template, v in truth["commit"]["per_stack"].items():
        for c in {crate_of[f] for f in truth["stacks"][template]["functions"]} - {None}:
            want[c] += v["commit_bytes"]
    assert {r["crate"]: r["inclusive_commit_bytes"] for r in rows(run, "commit_by_code_crate")} == dict(want)
    memory = read_manifest(run, "aggregated")["sections"]["memory"]
    assert memory["outstanding_bytes"] == truth["commit"]["total_bytes"] - truth["commit"]["released_bytes"]
    assert max(r["peak_commit_bytes"] for r in procs) <= memory["peak_commit_bytes"] <= truth["commit"]["total_bytes"]


def test_process_tree_matches_truth(aggregated_run):
    run, truth = aggregated_run
    tree = rows(run, "process_tree")
    by_key = {r["process_key"]: r for r in tree}
    for p in truth["processes"]:
        match = [r for r in tree if r["pid"] == p["pid"] and r["start_ns"] == p["start_ns"]]
        assert len(match) == 1, p
        r = match[0]
        assert (r["image_name"], r["command_line"], r["end_ns"], r["samples"]) == (
            p["image_name"], p["command_line"], p["end_ns"], p["samples"])
        assert r["crate"] == (p["crate"] if p["kind"] == "rustc" else None)
        parent = by_key.get(r["parent_key"])
        if parent is not None:
            assert parent["pid"] == p["parent_pid"]
            assert parent["start_ns"] is None or parent["start_ns"] <= r["start_ns"]
    roots = [r for r in tree if r["image_name"] == "python.exe"]
    assert roots[0]["tree_samples"] == sum(p["samples"] for p in truth["processes"])


def test_heap_snapshots_per_stack_equal_truth(aggregated_run):
    run, truth = aggregated_run
    stacks = {r["stack_id"]: tuple(r["frames"]) for r in read_table(run, "decoded", "stacks").to_pylist()}
    frames_of = {t: tuple(int(x, 16) for x in s["frames"]) for t, s in truth["stacks"].items()}
    summary = {(r["pid"], r["instance"], r["timestamp_ns"]): r for r in rows(run, "heap_snapshots_summary")}
    per_stack = defaultdict(dict)
    for r in rows(run, "heap_snapshot_by_stack"):
        if r["stack_id"] is not None:
            per_stack[(r["pid"], r["instance"], r["timestamp_ns"])][stacks[r["stack_id"]]] = {"bytes": r["bytes"], "blocks": r["blocks"]}
    snaps = truth["heap"]["snapshots"]
    assert set(summary) <= {(s["pid"], s["instance"], s["timestamp_ns"]) for s in snaps}
    ok = 0
    for s in snaps:
        got = summary.get((s["pid"], s["instance"], s["timestamp_ns"]))
        if got is None or got["status"] != "ok":
            continue  # the decoder counts and reports snapshots it could not read; they have no blocks here
        ok += 1
        assert (got["blocks"], got["bytes"], got["untracked_blocks"], got["untracked_bytes"]) == (
            s["blocks"], s["tracked_bytes"] + s["untracked_bytes"], s["untracked_blocks"], s["untracked_bytes"])
        want = {frames_of[t]: v for t, v in s["per_stack"].items()}
        assert per_stack[(s["pid"], s["instance"], s["timestamp_ns"])] == want
    if truth["trace"]["pointer_size"] == 8:  # the decoder reads x64 snapshot blobs only (heap-snapshot.md §3)
        assert ok >= len(snaps) // 2


def test_heap_folded_is_each_process_largest_snapshot(aggregated_run):
    run, truth = aggregated_run
    largest = defaultdict(int)
    for r in rows(run, "heap_snapshots_summary"):
        if r["status"] == "ok":
            largest[r["process_key"]] = max(largest[r["process_key"]], r["bytes"])
    assert sum(r["bytes"] for r in rows(run, "heap_folded")) == sum(largest.values())


def test_without_symbols_modules_still_equal_truth(tmp_path, dask_pool):
    """No symbolize stage: frames are module+0xrva from the images loaded at the sample's time (the
    synthetic system loads different rustc_driver builds at one base in different processes)."""
    run, truth = synth_run(tmp_path, "plain64", dask_pool, stages=("decode", "aggregate"))
    assert read_manifest(run, "aggregated")["sections"]["cpu"]["symbolized"] is False
    assert self_inclusive(rows(run, "cpu_by_module"), lambda r: r["module"]) == truth["samples"]["per_module"]
    functions = rows(run, "cpu_by_function")
    assert all(r["raw_name"] is None and r["function"].startswith(f"{r['module']}+0x") for r in functions)


def test_out_of_memory_names_the_setting_and_keeps_the_previous_output(tmp_path):
    """DuckDB out of memory in a section (a limit below the validated minimum, set past the check as a
    too-large run would hit the default): a clear error naming the run, the section and the setting; the
    aggregated output of the run before it stays as it was, and no spill directory is left behind."""
    from pipeline.aggregate import run as aggregate_run
    from pipeline.cluster import Pool
    from pipeline.config import AggregateConfig
    from pipeline.units import Size
    from pipeline.errors import ConfigError

    run, _ = synth_run(tmp_path, "plain64", Pool(None), stages=("decode", "aggregate"))
    before = read_manifest(run, "aggregated")
    cfg = Config(aggregate=AggregateConfig.model_construct(memory_limit=Size("8MB")))
    with pytest.raises(ConfigError, match=r"run: the aggregate section 'cpu' .*aggregate\.memory_limit \(8MB\).*raise it"):
        aggregate_run(run, cfg, Pool(None))
    assert read_manifest(run, "aggregated") == before
    assert sorted(p.name for p in run.iterdir()) == ["aggregated", "decoded"]


def test_commit_over_time(aggregated_run):
    """Per time bin, the level at its end and its highest level: a process's own peaks are those of
    commit_by_process; all processes together peak at the manifest's peak (a process counts while it runs), and
    end with what the processes still running hold."""
    run, truth = aggregated_run
    series = defaultdict(list)
    for r in rows(run, "commit_over_time"):
        series[r["process_key"]].append(r)
    procs = {r["process_key"]: r for r in rows(run, "commit_by_process")}
    tree = {r["process_key"]: r for r in rows(run, "process_tree")}
    for key, rs in series.items():
        assert [r["bin"] for r in rs] == sorted(r["bin"] for r in rs) and all(0 <= r["bin"] < 200 for r in rs)
        if key is not None:
            assert max(r["peak_bytes"] for r in rs) == procs[key]["peak_commit_bytes"]
            if tree[key]["end_ns"] is not None:
                assert rs[-1]["end_bytes"] == 0          # (it gave its commit back when it ended)
    memory = read_manifest(run, "aggregated")["sections"]["memory"]
    assert max(r["peak_bytes"] for r in series[None]) == memory["peak_commit_bytes"]
    running = sum(p["outstanding_bytes"] for k, p in procs.items() if tree[k]["end_ns"] is None)
    assert series[None][-1]["end_bytes"] == running
    assert len([k for k in series if k is not None]) == min(20, len(procs))


def test_stacks_by_time_bin(aggregated_run):
    """cpu_folded_over_time and commit_folded_over_time split cpu_folded and commit_folded by time bin: per stack
    the bins add up to the whole; cpu_over_time's bins add up to each process's samples, and each lies within
    the process's lifetime (the manifest's time_bins place them)."""
    run, truth = aggregated_run
    for binned, whole, measure, bins in (("cpu_folded_over_time", "cpu_folded", "samples", 500),
                                         ("commit_folded_over_time", "commit_folded", "commit_bytes", 200)):
        per = defaultdict(int)
        for r in rows(run, binned):
            assert 0 <= r["bin"] < bins
            per[r["stack"]] += r[measure]
        assert dict(per) == {r["stack"]: r[measure] for r in rows(run, whole) if r[measure]}, binned
    for binned, whole, key in (("cpu_functions_over_time", "cpu_by_function", ("module", "function", "raw_name")),
                               ("cpu_modules_over_time", "cpu_by_module", ("module",))):
        per = defaultdict(lambda: [0, 0])
        for r in rows(run, binned):
            assert 0 <= r["bin"] < 500 and (r["self_samples"] or r["inclusive_samples"])
            per[tuple(r[c] for c in key)][0] += r["self_samples"]
            per[tuple(r[c] for c in key)][1] += r["inclusive_samples"]
        assert dict(per) == {tuple(r[c] for c in key): [r["self_samples"], r["inclusive_samples"]]
                             for r in rows(run, whole)}, binned
    sections = read_manifest(run, "aggregated")["sections"]
    tb = sections["cpu"]["time_bins"]
    procs = {r["process_key"]: r for r in rows(run, "cpu_by_process")}
    per = defaultdict(int)
    for r in rows(run, "cpu_over_time"):
        per[r["process_key"]] += r["samples"]
        lo = tb["t0_ns"] + r["bin"] * tb["span_ns"] // tb["count"]
        hi = tb["t0_ns"] + (r["bin"] + 1) * tb["span_ns"] // tb["count"]
        assert r["t_ns"] == lo
        p = procs[r["process_key"]]
        if p["start_ns"] is not None:
            assert hi >= p["start_ns"]
        if p["end_ns"] is not None:
            assert lo <= p["end_ns"]
    assert dict(per) == {k: p["samples"] for k, p in procs.items()}
    assert sections["memory"]["commit_time_bins"]["count"] == 200


def test_aggregate_started_beside_symbolize_waits_for_its_frames(tmp_path):
    """A job starts the aggregate stage while symbolize still runs (``aggregate.run(after=...)``): the sections do
    what decoded/ alone allows, wait for symbolized/ before they read a frame, and write the same tables as
    when symbolize ran first; the manifest names the symbolized/ they read. A symbolize that fails fails the
    stage with its error, and nothing of the stage is written."""
    import shutil
    import threading

    from pipeline import symbolize
    from pipeline.aggregate import run as aggregate_run
    from pipeline.cluster import Pool
    from pipeline.runs import manifest_hash

    run, _ = synth_run(tmp_path / "first", "plain64", Pool(None))
    beside = tmp_path / "beside"
    beside.mkdir()
    shutil.copytree(run / "decoded", beside / "decoded")
    config = etl_config(tmp_path / "first" / "input" / "trace.etl", tmp_path / "first")
    asked, done, seen = threading.Event(), threading.Event(), []

    def after():
        seen.append((beside / "symbolized").exists())
        asked.set()
        assert done.wait(120)

    stage = threading.Thread(target=lambda: seen.append(aggregate_run(beside, config, Pool(None), after=after)))
    stage.start()
    assert asked.wait(120)
    symbolize.run(beside, config, Pool(None))
    done.set()
    stage.join(120)
    assert seen[0] is False and isinstance(seen[1], dict)       # (it asked before symbolized/ existed)
    assert_same_tables(run / "aggregated", beside / "aggregated")
    assert read_manifest(beside, "aggregated")["upstream"]["symbolized"] == manifest_hash(beside, "symbolized")

    shutil.rmtree(beside / "aggregated")

    def failed():
        raise RuntimeError("symbolize failed here")

    with pytest.raises(RuntimeError, match="symbolize failed here"):
        aggregate_run(beside, config, Pool(None), after=failed)
    assert not (beside / "aggregated").exists()


@pytest.mark.timeout(300)
def test_an_interrupted_aggregate_does_not_wait_for_symbolize(tmp_path):
    """Ctrl-C while the sections wait for a symbolize that runs beside them: the stage ends at once (the sections
    that wait are let go), and nothing of it is written."""
    import signal
    import sys
    import threading
    import time

    from pipeline.aggregate import run as aggregate_run
    from pipeline.cluster import Pool

    from pipeline.aggregate import FramesFinal

    run, _ = synth_run(tmp_path, "plain64", Pool(None), stages=("decode",))
    never, asked = threading.Event(), threading.Event()

    def waiting() -> bool:
        """Whether a section waits for the frames (a thread in ``FramesFinal.__call__``)."""
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code is FramesFinal.__call__.__code__:
                    return True
                frame = frame.f_back
        return False

    def interrupt() -> None:
        end = time.monotonic() + 120
        while not waiting() and time.monotonic() < end:
            time.sleep(0.01)
        asked.set()
        # (the kernel hands a process's SIGINT to any of its threads, not always the main one: here, this one)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    # (Python's own Ctrl-C handler, whatever this process was started with: a shell without job control starts
    # a background command with SIGINT ignored, and Python then installs none)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            aggregate_run(run, Config(), Pool(None), after=never.wait)      # (a symbolize that does not end)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert asked.is_set() and not (run / "aggregated").exists()
