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
from tests.test_aggregate_etl import etl_config


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
