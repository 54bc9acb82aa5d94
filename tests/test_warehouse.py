"""Warehouse: ingestion of real runs (synthesized ETL trace, rustc self-profiles), idempotence,
baselines, significance and the CLI."""

from __future__ import annotations

import re
import shutil

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import warehouse
from pipeline.cli import main as cli_main
from pipeline.config import Config
from pipeline.runs import read_manifest, read_table
from tests.conftest import fixture_path
from tests.synth_traces import VARIANTS

VARIANTS_SMALL = VARIANTS["plain32_cached"]


@pytest.fixture(scope="module")
def profile_run(tmp_path_factory, dask_pool):
    """The workspace-clean cargo build's self-profiles through decode and aggregate."""
    from pipeline import aggregate, decode

    run = tmp_path_factory.mktemp("wh-sp") / "selfprofile-20260301-120000"
    decode.run(run, Config(), dask_pool, inputs=[fixture_path("selfprofile/workspace-clean")])
    aggregate.run(run, Config(), dask_pool)
    return run


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def scale_function(run, fn: dict, extra: int) -> None:
    """Add ``extra`` samples (self and inclusive) to one function (a cpu_by_function row) of a run."""
    path = run / "aggregated" / "cpu_by_function.parquet"
    t = pq.read_table(path)
    hit = pc.and_(pc.and_(pc.equal(t.column("function"), fn["function"]), pc.equal(t.column("module"), fn["module"])),
                  pc.equal(t.column("raw_name"), fn["raw_name"]))
    assert pc.sum(hit.cast("int64")).as_py() == 1
    for col in ("self_samples", "inclusive_samples"):
        t = t.set_column(t.schema.get_field_index(col), col,
                         pc.if_else(hit, pc.add(t.column(col), extra), t.column(col)))
    pq.write_table(t, path)


def q(db, sql, params=None):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def test_ingest_keeps_every_table_and_manifest(etl_run, tmp_path):
    run = copy_run(etl_run, tmp_path / "nightly-20260101-010000")
    db = tmp_path / "wh.duckdb"
    summary = warehouse.ingest(db, run, labels={"machine": "ci-1"})
    assert summary["run_id"] == "nightly-20260101-010000"
    decoded = read_manifest(run, "decoded")
    (row,) = q(db, "SELECT job, trace_sha256, labels['machine'], cpu_samples, stages FROM runs")
    assert row[0] == "nightly" and row[1] == decoded["inputs"][0]["sha256_tree"] and row[2] == "ci-1"
    assert row[3] == read_manifest(run, "aggregated")["sections"]["cpu"]["samples"]
    assert row[4] == ["decoded", "symbolized", "aggregated"]
    for table, n in read_manifest(run, "aggregated")["tables"].items():
        if table in warehouse.NOT_INGESTED:
            assert not q(db, "SELECT 1 FROM information_schema.tables WHERE table_name = ?", [table])
            continue
        assert q(db, f'SELECT count(*) FROM "{table}" WHERE run_id = ?', [summary["run_id"]])[0][0] == n, table
    assert {r[0] for r in q(db, "SELECT stage FROM stage_manifests")} == {"decoded", "symbolized", "aggregated"}
    assert q(db, "SELECT row_count FROM table_rows WHERE stage = 'decoded' AND table_name = 'samples'")[0][0] \
        == decoded["tables"]["samples"]


def test_reingest_replaces_the_run(etl_run, tmp_path):
    run = copy_run(etl_run, tmp_path / "nightly-20260101-010000")
    db = tmp_path / "wh.duckdb"
    warehouse.ingest(db, run)
    before = q(db, "SELECT count(*), sum(self_samples) FROM cpu_by_function")[0]
    warehouse.ingest(db, run)
    assert q(db, "SELECT count(*), sum(self_samples) FROM cpu_by_function")[0] == before
    assert q(db, "SELECT count(*) FROM runs")[0][0] == 1
    assert q(db, "SELECT count(*) FROM stage_manifests")[0][0] == 3
    top = read_table(run, "aggregated", "cpu_by_function").to_pylist()[0]
    scale_function(run, top, 1000)
    warehouse.ingest(db, run)
    assert q(db, "SELECT count(*), sum(self_samples) FROM cpu_by_function")[0] == (before[0], before[1] + 1000)


def test_regressions_against_the_previous_run_of_the_job(etl_run, tmp_path):
    db = tmp_path / "wh.duckdb"
    first = copy_run(etl_run, tmp_path / "nightly-20260101-010000")
    same = copy_run(etl_run, tmp_path / "nightly-20260102-010000")
    slower = copy_run(etl_run, tmp_path / "nightly-20260103-010000")
    other = copy_run(etl_run, tmp_path / "demo-20260104-010000")
    functions = read_table(etl_run, "aggregated", "cpu_by_function").to_pylist()
    names = [f["function"] for f in functions]
    big = next(f for f in functions if names.count(f["function"]) == 1)    # one key in the metrics
    small = next(f for f in functions if 50 <= f["inclusive_samples"] <= 200 and names.count(f["function"]) == 1)
    scale_function(slower, big, big["self_samples"])        # +100%: a regression
    scale_function(slower, small, 2)                        # +2 samples: noise
    for run in (first, same, slower, other):
        # run_time comes from the decoded manifest; keep the copies in name order
        warehouse.ingest(db, run)
    baselines = dict(q(db, "SELECT run_id, baseline_run_id FROM run_baselines"))
    assert len({w for (w,) in q(db, "SELECT workload FROM runs")}) == 1     # one build, one workload
    assert baselines == {"nightly-20260101-010000": None, "nightly-20260102-010000": "nightly-20260101-010000",
                         "nightly-20260103-010000": "nightly-20260102-010000", "demo-20260104-010000": None}
    assert q(db, "SELECT count(*) FROM regressions WHERE run_id = 'nightly-20260102-010000'")[0][0] == 0
    regs = q(db, """SELECT kind, key, baseline_value, value, z FROM regressions
                    WHERE run_id = 'nightly-20260103-010000' ORDER BY kind""")
    key = f"{big['module']}!{big['function']}"
    # (a function's samples and shares explain; the shares, free of the build's total, are the steadier)
    assert {r[1] for r in regs} == {key}
    assert {"cpu_function_self_share", "cpu_function_inclusive_share"} <= {r[0] for r in regs}
    self_row = next(r for r in q(db, """SELECT kind, key, baseline_value, value, z FROM comparisons
                                        WHERE run_id = 'nightly-20260103-010000' AND kind = 'cpu_function_self'
                                        AND key = ?""", [key]))
    v, b = 2 * big["self_samples"], big["self_samples"]
    assert self_row[2:4] == (b, v) and self_row[4] > 0
    noise = q(db, """SELECT verdict FROM comparisons WHERE run_id = 'nightly-20260103-010000'
                     AND kind = 'cpu_function_inclusive' AND key = ?""", [f"{small['module']}!{small['function']}"])
    assert noise == [("noise",)]
    # compare() with the default baseline, and against an explicit one
    c = warehouse.compare(db, "nightly-20260103-010000")
    flagged = [r for r in c["headline"] + c["changes"] if r["verdict"] != "noise"]
    assert {r["key"] for r in flagged} == {key} and all(r["verdict"] == "regression" for r in flagged)
    assert c["changes"][0]["key"] == key                              # regressions first, by impact
    back = warehouse.compare(db, str(first), "nightly-20260103-010000")
    # (the first run has no history before it: the noise is the prior's alone, so a change is only a suspect)
    moved = [r for r in back["changes"] if r["verdict"] != "noise"]
    assert {r["verdict"] for r in moved} == {"suspect"} and all(r["adjusted_change"] < 0 for r in moved)
    # the demo run is another job: no baseline, and compare says so
    alone = warehouse.compare(db, "demo-20260104-010000")
    assert alone["baseline_run_id"] is None and "no earlier run of job 'demo'" in alone["reason"]


def test_self_profile_queries_are_metrics(profile_run, tmp_path):
    db = tmp_path / "wh.duckdb"
    warehouse.ingest(db, profile_run)
    summary = read_table(profile_run, "aggregated", "query_summary").to_pylist()
    build = {r["label"]: r["self_ns"] for r in summary if r["scope"] == "build"}
    got = dict(q(db, "SELECT key, value FROM metrics WHERE kind = 'query_self_ns'"))
    assert got == {k: float(v) for k, v in build.items()}
    crates = {r["crate"] for r in read_table(profile_run, "aggregated", "query_totals").to_pylist() if r["scope"] == "crate"}
    assert {r[0] for r in q(db, "SELECT key FROM metrics WHERE kind = 'query_crate_ns'")} == crates
    assert q(db, "SELECT job, query_total_ns > 0, cpu_samples FROM runs") == [("selfprofile", True, None)]


def two_nights(etl_run, tmp_path, ingest):
    """Two copies of one run, the second with its top function's samples doubled, ingested with ``ingest``."""
    a = copy_run(etl_run, tmp_path / "nightly-20260101-010000")
    b = copy_run(etl_run, tmp_path / "nightly-20260102-010000")
    top = read_table(etl_run, "aggregated", "cpu_by_function").to_pylist()[0]
    scale_function(b, top, top["self_samples"])
    for run in (a, b):
        ingest(run)
    return a, b, top


def test_cli_ingest_query_compare(etl_run, tmp_path, capsys):
    db = tmp_path / "wh.duckdb"
    a, b, top = two_nights(etl_run, tmp_path, lambda run: cli_main(
        ["warehouse", "--db", str(db), "ingest", "--run", str(run), "--label", "branch=master"]) == 0 or pytest.fail())
    capsys.readouterr()
    assert cli_main(["warehouse", "--db", str(db), "query", "SELECT run_id, labels['branch'] AS branch FROM runs ORDER BY 1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["run_id", "branch"]
    assert out[2].split() == ["nightly-20260101-010000", "master"] and len(out) == 4
    # a doubled function on the second night: no history yet, and a function explains, never fails: a suspect,
    # exit 0, the full name printed
    assert cli_main(["warehouse", "--db", str(db), "compare", "--run", str(b)]) == 0
    out = capsys.readouterr().out
    assert "vs baseline nightly-20260101-010000: no change" in out and f"{top['module']}!{top['function']}" in out
    assert "suspect" in out and "build CPU (samples)" in out
    md = tmp_path / "summary.md"
    assert cli_main(["warehouse", "--db", str(db), "compare", "--run", str(b), "--format", "markdown",
                     "--output", str(md)]) == 0
    text = md.read_text()
    assert text.startswith("### bootprof: `nightly-20260102-010000` vs `nightly-20260101-010000`: **no change**")
    assert "| suspect |" in text and f"`{top['module']}!{top['function']}`" in text
    assert cli_main(["warehouse", "--db", str(db), "compare", "--run", "nightly-20260101-010000"]) == 0
    assert "no earlier run of job 'nightly'" in capsys.readouterr().out
    assert cli_main(["warehouse", "--db", str(db), "query", "SELECT * FROM no_such_table"]) == 2
    assert cli_main(["warehouse", "--db", str(db), "ingest", "--run", str(a), "--label", "oops"]) == 2


def test_nightly_job_twice_then_compare(tmp_path, capsys):
    """jobs/nightly.yaml on one recorded trace, two nights: the second night has the first as its
    baseline and, with the same trace, no regressions; a third, slower night fails the job."""
    import json

    from pipeline import synth
    from tests.conftest import ROOT

    trace = tmp_path / "input" / "build.etl"
    synth.run(trace, VARIANTS_SMALL)
    config = tmp_path / "nightly.yaml"
    db = tmp_path / "wh.duckdb"
    config.write_text(json.dumps({
        "cluster": {"mode": "synchronous"},
        "symbolize": {"symbol_path": str(trace.parent / "symbols"), "cache_dir": str(tmp_path / "symcache")},
        "warehouse": {"path": str(db), "labels": {"machine": "test"}}}))
    runs = [tmp_path / "runs" / f"nightly-2026010{d}-020000" for d in (1, 2)]
    for run in runs:
        assert cli_main(["--config", str(config), "run", str(ROOT / "jobs" / "nightly.yaml"), "--trace", str(trace),
                         "--run", str(run)]) == 0
        assert (run / "report" / "index.html").exists()
    assert q(db, "SELECT run_id, baseline_run_id, labels['machine'] FROM run_baselines JOIN runs USING (run_id) "
                 "ORDER BY run_id") == [(runs[0].name, None, "test"), (runs[1].name, runs[0].name, "test")]
    assert q(db, "SELECT count(*) FROM regressions")[0][0] == 0
    assert q(db, "SELECT count(DISTINCT trace_sha256) FROM runs")[0][0] == 1
    capsys.readouterr()
    assert cli_main(["--config", str(config), "warehouse", "compare", "--run", str(runs[1])]) == 0
    assert "0 regressions, 0 suspects and 0 improvements" in capsys.readouterr().out
    # the job's compare stage: the first night has nothing to compare with, the second no regression
    assert "no earlier run of job 'nightly'" in (runs[0] / "compare" / "summary.md").read_text()
    assert (runs[1] / "compare" / "summary.md").read_text().startswith(
        f"### bootprof: `{runs[1].name}` vs `{runs[0].name}`")
    assert read_manifest(runs[1], "compare")["regressions_past_budget"] == 0
    # a third night of the same build whose rustc_middle crate got 1.5 times slower fails the job (exit 1)
    slow = tmp_path / "input3" / "build.etl"
    synth.run(slow, VARIANTS_SMALL.model_copy(update={"inject": ["crate:rustc_middle:1.5"]}))
    third = tmp_path / "runs" / "nightly-20260103-020000"
    assert cli_main(["--config", str(config), "run", str(ROOT / "jobs" / "nightly.yaml"), "--trace", str(slow),
                     "--run", str(third)]) == 1
    assert "regressions of 5% or more" in capsys.readouterr().out
    summary = (third / "compare" / "summary.md").read_text()
    assert "| regression |" in summary and "`rustc_middle`" in summary
    assert "<svg" in (third / "compare" / "compare.html").read_text()


def test_differential_flame_tree_is_right_at_every_level():
    """Each node's baseline and run shares are the sums over the stacks under it, each run normalized by its own
    total; a frame only one run has is kept (width from that run); children fit their parent."""
    from pipeline.report.flame import PPM, diff_tree

    base = [("p;a;x", 60), ("p;a;y", 20), ("p;b", 20)]              # 100 samples
    run = [("p;a;x", 60), ("p;c", 140)]                              # 200 samples: b removed, c added
    t = diff_tree(base, run)
    nodes = {t["names"][n]: i for i, n in enumerate(t["n"])}
    share = lambda i: (t["a"][i] / PPM, t["b"][i] / PPM)             # noqa: E731
    assert share(nodes["a"]) == (0.8, 0.3) and share(nodes["x"]) == (0.6, 0.3)
    assert share(nodes["b"]) == (0.2, 0.0) and share(nodes["c"]) == (0.0, 0.7)
    assert share(nodes["p"]) == (1.0, 1.0)
    for i in range(len(t["n"])):
        kids = [j for j in range(len(t["n"])) if t["d"][j] == t["d"][i] + 1
                and t["x"][i] <= t["x"][j] < t["x"][i] + t["w"][i]]
        assert sum(t["w"][j] for j in kids) <= t["w"][i]
        assert t["w"][i] >= max(t["a"][i], t["b"][i]) - len(kids) - 1            # (rounded to whole ppm)


def test_compare_html_page_in_chromium(etl_run, tmp_path, browser):
    db = tmp_path / "wh.duckdb"
    a, b, top = two_nights(etl_run, tmp_path, lambda run: warehouse.ingest(db, run))
    page = tmp_path / "compare.html"
    assert cli_main(["warehouse", "--db", str(db), "compare", "--run", str(b), "--format", "html", "--output",
                     str(page), "--budget", "1000"]) == 0
    dom = browser.dump_dom(page.as_uri())
    assert "vs baseline nightly-20260101-010000" in dom and f"{top['module']}!{top['function']}" in dom
    assert len(re.findall(r'<g class="frame"', dom)) > 20 and "change 0.00 points" in dom


def test_prune_keeps_summaries_and_history(etl_run, tmp_path, capsys):
    db = tmp_path / "wh.duckdb"
    runs = [copy_run(etl_run, tmp_path / f"nightly-2026010{d}-010000") for d in range(1, 5)]
    for run in runs:
        warehouse.ingest(db, run)
    metrics = q(db, "SELECT count(*) FROM run_metrics")[0][0]
    assert cli_main(["warehouse", "--db", str(db), "prune", "--keep", "2"]) == 0
    assert "pruned the detail of 2 runs" in capsys.readouterr().out
    assert {r[0] for r in q(db, "SELECT DISTINCT run_id FROM cpu_by_function")} == {runs[2].name, runs[3].name}
    assert q(db, "SELECT count(*) FROM runs")[0][0] == 4 and q(db, "SELECT count(*) FROM run_metrics")[0][0] == metrics
    c = warehouse.compare(db, runs[1].name)          # a pruned run still compares with its (pruned) baseline
    assert c["baseline_run_id"] == runs[0].name and len(c["changes"]) > 100
    assert cli_main(["warehouse", "--db", str(db), "prune", "--keep", "0"]) == 2


GOLDEN_MARKDOWN = """### bootprof: `nightly-5` vs `nightly-4`: **regression**

**Regression: crate compile time `core` +100.0%.**

job `nightly`, workload `stage2`

| verdict | family | baseline | this run | change | against the others | noise | z | judged by |
|---|---|---|---|---|---|---|---|---|
| regression | crate compile time `core` | 2.02 s | 4.20 s | +107.9% | +100.0% | ±7.5% (history) | 4.8 | crate wall time |
| suspect | crate memory `syn` | 0 B | 64.00 MiB | new | new | - | - | crate commit |

Queries of `core` that grew:

| query | self time | this run | invocations | this run |
|---|---|---|---|---|
| `typeck` | 500.00 ms | 1.50 s | 1,000 | 3,000 |

|  | baseline | this run | change | verdict |
|---|---|---|---|---|
| build wall time | 101.00 s | 117.60 s | +16.4% | noise |
| build CPU (samples) | 1,010,000 samples | 1,050,000 samples | +4.0% | noise |

1 regressions, 1 suspects and 0 improvements among 6 build and crate families (9 metrics).

Queries and functions that moved (they explain; they never fail a job on their own):

| verdict | change | metric | name | baseline | this run | noise |
|---|---|---|---|---|---|---|
| regression | +100.0% | function self CPU | `rustc_driver.dll!rustc_middle::ty::Ty::new \\| x` | 10,000 samples | 20,000 samples | ±11.4% (history) |
"""


def test_compare_markdown_golden(tmp_path):
    """Five nights with known metrics (written as ingestion writes them): the fifth night's markdown, byte for
    byte. It opens with the verdict and the crate that regressed (judged against the other crates, whose +5 % that
    night was the machine's), then the queries that explain it; a crate new in the run is shown as a suspect (it
    fails nothing: only a regression does); a function that doubled explains and fails nothing; noise (a function
    +1%) is left out; names are whole and escaped."""
    from pipeline.compare import verdict

    db = tmp_path / "wh.duckdb"
    con = warehouse.connect(db)
    wobble = [1.0, 1.03, 0.98, 1.01, 1.05]             # the machine's speed, night by night
    for k in range(1, 6):
        con.execute("INSERT INTO runs (run_id, job, workload, run_time) VALUES (?, 'nightly', 'stage2', ?::TIMESTAMP)",
                    [f"nightly-{k}", f"2026-01-0{k} 02:00:00"])
        w = wobble[k - 1]
        rows = [("build_wall_ns", "build", 100e9 * w * (1.12 if k == 5 else 1)), ("cpu_build", "build", 1e6 * w),
                ("crate_wall_ns", "core", 2e9 * w * (2 if k == 5 else 1)), ("crate_wall_ns", "std", 3e9 * w),
                ("crate_wall_ns", "alloc", 1e9 * w), ("crate_wall_ns", "proc_macro", 1.5e9 * w),
                ("cpu_function_self", "rustc_driver.dll!rustc_middle::ty::Ty::new | x", 10_000 * (2 if k == 5 else 1)),
                ("cpu_function_self", "rustc_driver.dll!small", 50_000 * (1.01 if k == 5 else 1))]
        if k == 5:
            rows.append(("commit_crate", "syn", 64 << 20))
        for kind, key, value in rows:
            con.execute("INSERT INTO run_metrics VALUES (?, ?, ?, ?, NULL)", [f"nightly-{k}", kind, key, value])
    for k, typeck, count in ((4, 500e6, 1000), (5, 1500e6, 3000)):
        con.execute("INSERT INTO query_summary (run_id, scope, crate, label, self_ns, invocations) VALUES "
                    "(?, 'crate', 'core', 'typeck', ?, ?), (?, 'crate', 'core', 'mir_borrowck', ?, 10)",
                    [f"nightly-{k}", typeck, count, f"nightly-{k}", 300e6])
    con.close()
    c = warehouse.compare(db, "nightly-5")
    assert verdict.markdown(c) == GOLDEN_MARKDOWN
    assert [f["key"] for f in verdict.exceeds_budget(c, 5.0)] == ["core"]
    assert [f["key"] for f in verdict.exceeds_budget(c, 150.0)] == []      # (a new crate fails no job)


def test_a_warehouse_of_an_older_bootprof_takes_new_runs(etl_run, tmp_path):
    """A file made before runs had a workload and query_summary its invocations: connecting adds the columns,
    and a run ingests and compares (its first ingest once failed with a binder error and a traceback)."""
    db = tmp_path / "wh.duckdb"
    con = duckdb.connect(str(db))
    con.execute("""CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, job VARCHAR, run_dir VARCHAR, run_time TIMESTAMP,
        trace_start_utc TIMESTAMP, trace_sha256 VARCHAR, trace_files INTEGER, trace_bytes BIGINT,
        labels MAP(VARCHAR, VARCHAR), stages VARCHAR[], project_version VARCHAR, ingested_utc TIMESTAMP,
        cpu_samples BIGINT, commit_bytes BIGINT, query_total_ns BIGINT)""")
    con.execute("CREATE TABLE query_summary (run_id VARCHAR, scope VARCHAR, file_id INTEGER, crate VARCHAR, "
                "label VARCHAR, self_ns BIGINT, time_ns BIGINT)")
    # (an old run, recorded before the new one's synthesized trace of 2025-12-12: its workload and metrics come from
    # its tables)
    con.execute("""INSERT INTO runs (run_id, job, run_time) VALUES ('nightly-20251231-010000', 'nightly',
                   '2025-12-01 01:00:00')""")
    con.execute("CREATE TABLE cpu_by_crate (run_id VARCHAR, crate VARCHAR, processes BIGINT, samples BIGINT)")
    con.execute("INSERT INTO cpu_by_crate SELECT 'nightly-20251231-010000', crate, processes, samples "
                "FROM read_parquet(?)", [str(etl_run / "aggregated" / "cpu_by_crate.parquet")])
    con.close()
    warehouse.ingest(db, copy_run(etl_run, tmp_path / "nightly-20260101-010000"))
    c = warehouse.compare(db, "nightly-20260101-010000")
    assert c["baseline_run_id"] == "nightly-20251231-010000" and c["workload"].startswith("build of")
    assert {r["key"] for r in c["changes"] if r["kind"] == "cpu_crate" and r["baseline_value"] > 0}


def test_ingest_beside_the_report_takes_its_manifest_once_it_ends(etl_run, tmp_path):
    """A job ingests beside the report stage (``warehouse.run(after=...)``): the aggregated tables go in while the
    report runs; the report's manifest is read once it has ended. A report that fails leaves nothing written."""
    import threading

    from pipeline import report

    run = copy_run(etl_run, tmp_path / "nightly-20260101-010000")
    db = tmp_path / "wh.duckdb"
    asked, done, seen = threading.Event(), threading.Event(), []

    def after():
        seen.append((run / "report").exists())
        asked.set()
        assert done.wait(120)

    ingesting = threading.Thread(target=lambda: seen.append(warehouse.ingest(db, run, after=after)))
    ingesting.start()
    assert asked.wait(120)
    report.run(run, Config(), None)
    done.set()
    ingesting.join(120)
    assert seen[0] is False and seen[1]["run_id"] == run.name
    assert q(db, "SELECT stages FROM runs")[0][0] == ["decoded", "symbolized", "aggregated", "report"]
    assert {r[0] for r in q(db, "SELECT stage FROM stage_manifests")} == {"decoded", "symbolized", "aggregated", "report"}

    def failed():
        raise RuntimeError("the report failed here")

    other = copy_run(etl_run, tmp_path / "nightly-20260102-010000")
    with pytest.raises(RuntimeError, match="the report failed here"):
        warehouse.ingest(db, other, after=failed)
    assert q(db, "SELECT count(*) FROM runs WHERE run_id = ?", [other.name])[0][0] == 0
    assert q(db, "SELECT count(*) FROM cpu_by_function WHERE run_id = ?", [other.name])[0][0] == 0


#: A crate name as a hostile build could give one: a backtick that closes a code span, a live link and image, a line
#: break and a terminal escape sequence.
HOSTILE_CRATE = "evil`](javascript:alert(1))![x](http://127.0.0.1/i.png)\n\x1b[31mred`` |"


def test_names_stay_names_in_markdown_and_on_a_terminal(tmp_path):
    """A crate name with a backtick once ended its code span early in ``summary.md`` (and ``$GITHUB_STEP_SUMMARY``),
    the rest live markdown (a link, an image); on the terminal its escape sequence and line break acted. Rendered
    by a CommonMark renderer with GFM tables (markdown-it-py), every name is one code element and nothing else;
    the terminal lines hold no control character."""
    from markdown_it import MarkdownIt

    from pipeline.compare import headline, verdict

    db = tmp_path / "wh.duckdb"
    con = warehouse.connect(db)
    for k in range(1, 5):
        con.execute("INSERT INTO runs (run_id, job, workload, run_time) VALUES (?, 'nightly', 'stage2', ?::TIMESTAMP)",
                    [f"nightly-{k}", f"2026-01-0{k} 02:00:00"])
        for key, value in ((HOSTILE_CRATE, 2e9 * (3 if k == 4 else 1)), ("std", 3e9), ("core", 1e9)):
            con.execute("INSERT INTO run_metrics VALUES (?, 'crate_wall_ns', ?, ?, NULL)", [f"nightly-{k}", key, value])
    con.execute("INSERT INTO query_summary (run_id, scope, crate, label, self_ns, invocations) VALUES "
                "('nightly-3', 'crate', ?, ?, 1e8, 10), ('nightly-4', 'crate', ?, ?, 9e8, 90)",
                [HOSTILE_CRATE, HOSTILE_CRATE, HOSTILE_CRATE, HOSTILE_CRATE])
    con.close()
    c = warehouse.compare(db, "nightly-4")
    assert [f["key"] for f in c["families"] if f["verdict"] == "regression"] == [HOSTILE_CRATE]
    html = MarkdownIt("commonmark").enable("table").render(verdict.markdown(c))
    assert "<a " not in html and "<img" not in html and "\x1b" not in html, html
    shown = HOSTILE_CRATE.replace("\n", "\\n").replace("\x1b", "\\x1b")
    import html as htmlmod
    codes = [htmlmod.unescape(t) for t in __import__("re").findall(r"<code>(.*?)</code>", html, __import__("re").S)]
    assert codes.count(shown) >= 4, codes         # (headline, family row, queries' title and row)
    lines = verdict.text(c) + "\n" + headline({"baseline_run_id": "nightly-3", "verdict": "regression",
                                                 "regressed": [verdict.family_name(f, str) for f in c["families"]
                                                               if f["verdict"] == "regression"],
                                                 "regressions": 1, "regressions_past_budget": 1, "budget_pct": 5,
                                                 "improvements": 0})
    assert "\x1b" not in lines and shown in lines and not [line for line in lines.splitlines() if line.startswith("[31m")]
