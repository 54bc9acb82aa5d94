"""CPU samples attributed to the self-profile query running on their thread (aggregate section query_cpu),
against the synthesizer's truth: a synthesized build's trace and the self-profiles of its rustc processes
go through the real decode, symbolize and aggregate stages in one run."""

from __future__ import annotations

import importlib
import json
from collections import Counter

import numpy as np
import pytest

from pipeline.aggregate.query_cpu import innermost
from pipeline.runs import read_manifest, read_table
from tests.synth_traces import VARIANTS
from tests.helpers.runs import etl_config


@pytest.fixture(scope="module", params=["plain64", "xpress32_cached"])
def both(request, tmp_path_factory, dask_pool):
    from pipeline import synth

    tmp = tmp_path_factory.mktemp(f"qcpu-{request.param}")
    trace = tmp / "input" / "trace.etl"
    summary = synth.run(trace, VARIANTS[request.param])
    truth = json.loads(trace.with_name("trace.truth.json").read_text())
    run, config = tmp / "run", etl_config(trace, tmp)
    for stage in ("decode", "symbolize", "aggregate"):
        importlib.import_module(f"pipeline.{stage}").run(run, config, dask_pool,
                                                         inputs=[trace, tmp / "input" / "selfprofile"])
    return run, truth, summary


def test_samples_per_process_and_query_equal_truth(both):
    run, truth, _ = both
    got = Counter()
    for r in read_table(run, "aggregated", "cpu_by_query").to_pylist():
        if r["scope"] == "process":
            assert (r["label"] is None) == (r["attribution"] != "query")
            got[(r["pid"], r["crate"], r["label"])] += r["samples"]
    want = Counter()
    for r in truth["query_cpu"]["by_process"]:
        want[(r["pid"], r["crate"], r["label"])] += r["samples"]
    assert got == want
    assert None in {label for _, _, label in want}           # (samples outside any query are in the test)
    section = read_manifest(run, "aggregated")["sections"]["query_cpu"]
    assert section["unprofiled_threads"] == 0 and section["samples"] == sum(want.values())
    assert section["processes"] == sum(p["image_name"] == "rustc.exe" for p in truth["processes"])


def test_build_scope_sums_the_processes(both):
    run, _, _ = both
    rows = read_table(run, "aggregated", "cpu_by_query").to_pylist()
    per = Counter()
    for r in rows:
        if r["scope"] == "process":
            per[(r["kind"], r["label"], r["attribution"])] += r["samples"]
    build = {(r["kind"], r["label"], r["attribution"]): r["samples"] for r in rows if r["scope"] == "build"}
    assert build == dict(per)
    assert abs(sum(r["pct"] for r in rows if r["scope"] == "build") - 100) < 0.1



def test_time_bins_split_the_build_rows(both):
    """cpu_by_query_over_time: per query the bins add up to its build row, and per bin the samples are those
    that cpu_over_time counts for the rustc processes (each has a self-profile here) in the same bin."""
    run, _, _ = both
    build = {(r["kind"], r["label"], r["attribution"]): r["samples"]
             for r in read_table(run, "aggregated", "cpu_by_query").to_pylist() if r["scope"] == "build"}
    per, per_bin = Counter(), Counter()
    for r in read_table(run, "aggregated", "cpu_by_query_over_time").to_pylist():
        per[(r["kind"], r["label"], r["attribution"])] += r["samples"]
        per_bin[r["bin"]] += r["samples"]
    assert dict(per) == build
    rustc = Counter()
    for r in read_table(run, "aggregated", "cpu_over_time").to_pylist():
        if r["image_name"] == "rustc.exe":
            rustc[r["bin"]] += r["samples"]
    assert per_bin == rustc and len(rustc) > 100


def test_leaf_functions_per_query_equal_truth(both):
    run, truth, _ = both
    got = {(r["label"], f"{r['module']}!{r['raw_name'] or r['function']}"): r["self_samples"]
           for r in read_table(run, "aggregated", "cpu_by_query_function").to_pylist() if r["self_samples"]}
    want = {(r["label"], r["function"]): r["samples"] for r in truth["query_cpu"]["by_function"]}
    assert got == want
    assert any(label == "analysis" for label, _ in want)


def test_innermost_interval():
    """Nested intervals on one thread, bounds inclusive: [0,100] holds [10,40] (holding [20,30]) and [40,90];
    [60,60] is an empty interval inside [40,90]; [200,300] is a second root."""
    starts = np.array([0, 10, 20, 40, 60, 200])
    ends = np.array([100, 40, 30, 90, 60, 300])
    parent = np.array([-1, 0, 1, 0, 3, -1])
    t = np.array([-5, 0, 15, 25, 30, 35, 40, 50, 60, 95, 100, 150, 250, 301])
    assert innermost(t, starts, ends, parent).tolist() == [-1, 0, 1, 2, 2, 1, 3, 3, 4, 0, 0, -1, 5, -1]


def test_report_queries_follow_a_time_range(both, browser, dask_pool):
    """The report's queries-by-CPU table in a range picked on the timeline: the queries with samples in it, ranked
    and counted as cpu_by_query_over_time says, their percents of the range's attributed samples."""
    from pipeline import report
    from tests.test_report_etl import index_in_range, ranked

    run, _, _ = both
    if not (run / "report").exists():
        report.run(run, etl_config(run.parent / "input" / "trace.etl", run.parent), dask_pool)
    body, (b0, b1, _, _) = index_in_range(run, ["query-cpu"], browser, bins=(40, 62))
    got = Counter()
    for r in read_table(run, "aggregated", "cpu_by_query_over_time").to_pylist():
        if b0 <= r["bin"] < b1:
            got[(r["kind"], r["label"], r["attribution"])] += r["samples"]
    build = [r for r in read_table(run, "aggregated", "cpu_by_query").to_pylist() if r["scope"] == "build"]
    key = lambda r: (r["kind"], r["label"], r["attribution"])  # noqa: E731
    want = ranked(build, lambda r: got[key(r)], lambda r: got[key(r)] > 0)
    whole = sum(got.values())
    assert [line.split("~")[1:] for line in body["query-cpu"].splitlines()] == [
        [r["kind"] or "", f"{got[key(r)]:,}", f"{100 * got[key(r)] / whole:.2f}%"] for r in want]
    assert len(want) > 3 and body["query-cpu-whole"] == body["query-cpu-before"] != body["query-cpu"]


def test_query_cpu_takes_its_frames_from_the_cpu_section(both, tmp_path, monkeypatch, dask_pool):
    """query_cpu's samples are units of the cpu section too: it adopts their resolved frames from that section
    (the stage resolves them once) and writes the tables it writes when it resolves them itself."""
    import shutil
    import threading

    from pipeline import aggregate
    from pipeline.aggregate import resolve
    from tests.conftest import assert_same_tables

    run, _, _ = both
    config = etl_config(run.parent / "input" / "trace.etl", run.parent)
    copies = []
    for name in ("adopted", "resolved"):
        copy = tmp_path / name
        for stage in ("decoded", "symbolized"):
            shutil.copytree(run / stage, copy / stage)
        copies.append(copy)
    adopted, real = [], resolve.adopt_units
    monkeypatch.setattr(resolve, "adopt_units", lambda *a: adopted.append(real(*a)) or adopted[-1])
    # (the cpu section offers only once query_cpu waits for it: an event, not a sleep of 2 s)
    export, take, taking = resolve.export_units, aggregate.Context.take, threading.Event()
    monkeypatch.setattr(aggregate.Context, "take", lambda ctx, key: taking.set() or take(ctx, key))
    monkeypatch.setattr(resolve, "export_units", lambda *a: taking.wait(300) and export(*a))
    stage = threading.Thread(target=aggregate.run, args=(copies[0], config, dask_pool), daemon=True)
    stage.start()
    stage.join(timeout=600)
    assert not stage.is_alive(), "query_cpu waits for an offer that never comes"
    assert adopted == [True]
    monkeypatch.setattr(aggregate.stage, "OFFERS", {})  # (query_cpu waits for nothing and resolves its units)
    aggregate.run(copies[1], config, dask_pool)
    assert adopted == [True, False]
    assert assert_same_tables(copies[0] / "aggregated", copies[1] / "aggregated") > 20
