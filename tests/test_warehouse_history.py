"""A synthesized history of nightly runs with known answers: the same build re-run 33 times with run-to-run
noise as large as a real machine's (``bootprof synth --rerun K``, its default noise, fitted to real rustc builds),
three of them with injected changes. Every run goes through the real decode, symbolize, aggregate and warehouse
stages. The comparisons must find every injected change and, on every noise-only night from the second on, flag
nothing: no regression of any metric, no job that would fail."""

from __future__ import annotations

import json

import pytest

from pipeline import aggregate, decode, symbolize, synth, warehouse
from pipeline.cluster import Pool
from pipeline.config import Config, SynthConfig

NIGHTS = 33
SLOW_CRATE = "rustc_middle"
HOT_FUNCTION = "rustc_hir_typeck::typeck"
BIG_COMMIT = "LLVMRustOptimize"
INJECT = {31: [f"crate:{SLOW_CRATE}:2"], 32: [f"function:{HOT_FUNCTION}:4"], 33: [f"commit:{BIG_COMMIT}:2"]}
#: Kinds at the function and crate level, where a noise-only night must flag nothing.
DETAIL = ("crate_wall_ns", "cpu_crate", "cpu_function_self", "cpu_function_inclusive", "cpu_function_self_share",
          "cpu_function_inclusive_share", "commit_function", "commit_crate", "peak_commit", "query_self_ns",
          "query_count", "query_crate_ns")


def night(k: int) -> str:
    return f"nightly-20261101-{k:06d}"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("history")
    db = tmp / "warehouse.duckdb"
    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.cache_dir = tmp / "symcache"
    for k in range(1, NIGHTS + 1):
        trace = tmp / f"trace-{k}" / "trace.etl"
        synth.run(trace, SynthConfig(seed=3, size="2MB", cpus=4, rerun=k, inject=INJECT.get(k, [])))
        config.symbolize.symbol_path = str(trace.parent / "symbols")
        run = tmp / night(k)
        decode.run(run, config, Pool(None), inputs=[trace])
        symbolize.run(run, config, Pool(None))
        aggregate.run(run, config, Pool(None))
        warehouse.ingest(db, run, job="nightly")
    return db, tmp


def verdicts(db, k: int) -> list[dict]:
    return warehouse.compare(db, night(k))["changes"]


def test_noise_only_nights_flag_nothing_from_the_second_night(history):
    from pipeline.compare import verdict

    db, _ = history
    false = {}
    checked = 0
    for k in range(2, 31):
        c = warehouse.compare(db, night(k))
        assert c["baseline_run_id"] == night(k - 1) and c["workload"].startswith("build of 44 crates")
        rows = c["headline"] + c["changes"]
        checked += len(rows)
        flagged = [(r["kind"], r["key"], r["relative_change"]) for r in rows if r["verdict"] == "regression"]
        if flagged or verdict.exceeds_budget(c, 5.0):
            false[night(k)] = flagged
        if k >= 12:                               # (ten past changes of its own: the noise is the metric's own)
            assert all(r["confidence"] == "history" for r in rows if r["history"] >= 10)
    assert checked > 10_000 and false == {}


def test_every_injected_change_is_found(history):
    db, _ = history
    from pipeline.compare import verdict

    slow = warehouse.compare(db, night(31))
    assert slow["verdict"] == "regression"
    assert [(f["family"], f["key"]) for f in verdict.exceeds_budget(slow, 5.0)] == [("crate time", SLOW_CRATE)]
    rows = {(r["kind"], r["key"]): r for r in slow["changes"]}
    assert rows[("crate_wall_ns", SLOW_CRATE)]["verdict"] == "regression"
    assert rows[("crate_wall_ns", SLOW_CRATE)]["confidence"] == "history"
    # (back to its usual time the next night: against the history's median, no change at all)
    back = {(f["family"], f["key"]): f["verdict"] for f in warehouse.compare(db, night(32))["families"]}
    assert back[("crate time", SLOW_CRATE)] == "noise"
    # (stage0's and stage1's copy of the function, each found by its inclusive samples or share: a 2 MB trace holds
    # ~100 samples of it, where the counting error alone is 10 %)
    hot = [r for r in verdicts(db, 32) if r["kind"] in ("cpu_function_inclusive", "cpu_function_inclusive_share")
           and r["key"].endswith("!" + HOT_FUNCTION)]
    assert len({r["key"] for r in hot}) == 2
    assert {r["key"] for r in hot if r["verdict"] == "regression"} == {r["key"] for r in hot}
    big = [r for r in verdicts(db, 33) if r["kind"] == "commit_function" and r["key"].endswith("!" + BIG_COMMIT)]
    assert len(big) == 2 and all(r["verdict"] == "regression" for r in big)
    # night 31 flags the crate and nothing else of the crate and function levels (night 32's and 33's changes
    # reach every caller of the function, every crate's codegen: real consequences, not noise)
    assert {r["key"] for r in verdicts(db, 31) if r["verdict"] == "regression" and r["kind"] in DETAIL} == {SLOW_CRATE}


def test_the_same_trace_twice_changes_nothing_and_workloads_never_meet(history, tmp_path):
    import shutil

    db, tmp = history
    again = tmp_path / "nightly-20261102-000001"
    shutil.copytree(tmp / night(NIGHTS), again)
    warehouse.ingest(db, again, job="nightly")
    c = warehouse.compare(db, again.name)
    assert c["baseline_run_id"] == night(NIGHTS)
    # (against the run before nothing moved; against the history, night 33's doubled commit of one function is seen
    # a second time: a lasting change of the memory families, and nothing else)
    assert all(r["change"] == 0 for r in c["headline"] + c["changes"])
    assert {r["verdict"] for r in c["headline"] + c["changes"] if r["role"] != "vote"} == {"noise"}
    flagged = {f["family"] for f in c["families"] if f["verdict"] != "noise"}
    assert flagged <= {"crate memory", "build memory"}, flagged
    # a run of another workload filed under the same job has no baseline, and says so
    from tests.conftest import fixture_path

    other = tmp_path / "nightly-20261103-000001"
    config = Config()
    config.cluster.mode = "synchronous"
    decode.run(other, config, Pool(None), inputs=[fixture_path("etl/airbus/AMSITrace.etl")])
    aggregate.run(other, config, Pool(None))
    warehouse.ingest(db, other, job="nightly")
    c = warehouse.compare(db, other.name)
    assert c["baseline_run_id"] is None and "no earlier run of job 'nightly' and workload 'trace AMSITrace.etl #" in c["reason"]
    assert json.dumps(c)   # (plain data, for the CLI and CI)
