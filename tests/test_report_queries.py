"""Report stage, query section: files, formats, and profile_queries.html in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import fixture_path
from tests.helpers.browser import ARTIFACTS, pages_without_errors, speedscope_titles
from tests.helpers.selfprofile import read_events, rust_path, summarize

@pytest.fixture(scope="module")
def report_run(tmp_path_factory, dask_pool):
    """A cargo build's profiles plus a fresh rustc run with per-hit instants, through decode/aggregate/report."""
    from pipeline import aggregate, decode, report
    from pipeline.config import Config

    tmp = tmp_path_factory.mktemp("report")
    hits = tmp / "hits"
    hello = fixture_path("selfprofile/hello-default/hello.rs")
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", PATH=rust_path())
    subprocess.run(["rustc", "--crate-name", "hello", f"-Zself-profile={hits}",
                    "-Zself-profile-events=default,query-cache-hit", str(hello), "-o", str(tmp / "hello_bin")],
                   env=env, check=True, capture_output=True, timeout=300, cwd=tmp)
    run = tmp / "run"
    config = Config()
    decode.run(run, config, dask_pool, inputs=[fixture_path("selfprofile/workspace-clean"), hits])
    aggregate.run(run, config, dask_pool)
    report.run(run, config, dask_pool)
    return run


def file_ids(run: Path) -> dict[str, int]:
    from pipeline.runs import read_table

    return {f["crate"]: f["file_id"] for f in read_table(run, "decoded", "self_profiles").to_pylist()
            if f["status"] == "ok"}


def test_fmt_duration_matches_rust_debug():
    from pipeline.report.queries import fmt_duration

    assert fmt_duration(4_510_000_000) == "4.51s"
    assert fmt_duration(712_940_000) == "712.94ms"
    assert fmt_duration(1_500) == "1.50µs"
    assert fmt_duration(0) == "0.00ns"
    assert fmt_duration(999) == "999.00ns"
    assert fmt_duration(1_999_999) == "2.00ms"          # rounds half up on the next digit
    assert fmt_duration(10_896_488_447, None) == "10.896488447s"
    assert fmt_duration(10_000_000_000, None) == "10s"
    assert fmt_duration(1_500_000, None) == "1.5ms"


def test_index_has_query_section_and_files(report_run):
    from pipeline.runs import read_manifest

    out = report_run / "report"
    index = (out / "index.html").read_text()
    assert '<section id="queries"' in index and "rustc queries" in index
    for name in ["profile_queries.html", "query_summary.html", "query_summary.txt", "profile_queries.counts.txt",
                 "chrome_trace.json", "query_stacks.folded"]:
        assert (out / name).stat().st_size > 0 and f'href="{name}"' in index
    assert "profiler overhead (<code>self_profile_alloc_query_strings</code>)" in index
    assert "Files not decoded" in index and "cargo probe run" in index   # the ___ probe, skipped
    manifest = read_manifest(report_run, "report")
    assert "profile_queries.counts.txt" in manifest["sections"]["queries"]["files"]


def test_counts_txt_is_sorted_and_matches_reference(report_run):
    lines = (report_run / "report" / "profile_queries.counts.txt").read_text().splitlines()
    assert lines[0] == "label,count,duration_seconds"
    rows = [line.rsplit(",", 2) for line in lines[1:]]
    durations = [float(d) for _, _, d in rows]
    assert durations == sorted(durations, reverse=True) and len(rows) > 100
    # Inclusive time and executions per query label, summed over the build's files by the reference.
    ref: dict[str, list[int]] = {}
    for path in sorted(fixture_path("selfprofile/workspace-clean").glob("[!_]*.mm_profdata")) + \
            sorted((report_run.parent / "hits").glob("*.mm_profdata")):
        for label, r in summarize(read_events(path)[1])[0].items():
            acc = ref.setdefault(label, [0, 0])
            acc[0] += r[2]
            acc[1] += r[1]
    for label, count, dur in rows:
        assert [int(count), round(float(dur) * 1e9)] == ref[label], label
    # timed passes (generic activities) are listed beside the queries, as in the seed's file
    labels = {label for label, _, _ in rows}
    assert {"typeck", "type_of"} <= labels and {"parse_crate", "expand_crate", "codegen_module", "run_linker"} <= labels


def test_summary_text_layout(report_run):
    from pipeline.report.queries import fmt_duration
    from pipeline.runs import read_table

    text = (report_run / "report" / "query_summary.txt").read_text()
    header = text.splitlines()[2]
    assert [c.strip() for c in header.strip("|").split("|")][:5] == [
        "Item", "Self time", "% of total time", "Time", "Item count"]
    assert "Cache hits" in header and "Blocked time" not in header  # optional columns only when non-zero
    total = [t for t in read_table(report_run, "aggregated", "query_totals").to_pylist() if t["scope"] == "build"][0]
    assert f"Total cpu time: {fmt_duration(total['total_ns'], None)}\n" in text
    assert "| Item " in text and "Artifact Size" in text and re.search(r"\| \d+ bytes", text)
    assert text.count("# crate ") == 4


def test_chrome_trace_like_crox(report_run):
    from pipeline.runs import read_table

    events = json.loads((report_run / "report" / "chrome_trace.json").read_text())
    meta = [e for e in events if e["ph"] == "M"]
    spans = [e for e in events if e["ph"] == "X"]
    files = read_table(report_run, "decoded", "self_profiles").to_pylist()
    ok = [f for f in files if f["status"] == "ok"]
    assert sorted(e["args"]["name"] for e in meta if e["name"] == "process_name") == sorted(f["crate"] for f in ok)
    intervals = 0
    for f in ok:
        intervals += sum(e["payload"] == "interval" for e in read_events(Path(f["path"]))[1])
    assert len(spans) == intervals
    app = next(f for f in ok if f["crate"] == "app")
    first = read_events(Path(app["path"]))[1][0]
    mine = next(e for e in spans if e["pid"] == app["pid"] and e["name"] == first["label"])
    origin = min(f["start_time_ns"] for f in ok)
    assert round(mine["ts"] * 1000) == app["start_time_ns"] - origin + first["start"]
    assert round(mine["dur"] * 1000) == first["end"] - first["start"] and mine["cat"] == first["kind"]
    # exact to the nanosecond: no zero-length interval unless it is one, and children end inside their parents
    assert sum(e["dur"] == 0 for e in spans) == sum(
        e["payload"] == "interval" and e["end"] == e["start"] for f in ok for e in read_events(Path(f["path"]))[1])
    assert nesting_errors(spans) == 0


def nesting_errors(spans: list[dict]) -> int:
    """Intervals of a thread that overlap another one without lying inside it (what makes viewers fail)."""
    bad = 0
    by_thread: dict = {}
    for e in spans:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for spans_of in by_thread.values():
        open_ends: list[int] = []
        for start, end in sorted(spans_of, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if open_ends and end > open_ends[-1]:
                bad += 1
            open_ends.append(end)
    return bad


def test_cache_hits_per_query_execution(report_run):
    """QueryCacheHitCount events carry their invocation's DepNodeIndex: hits land on that Query."""
    fid = file_ids(report_run)["app"]
    text = (report_run / "report" / "profile_queries" / f"trace-{fid}.js").read_text()
    data = json.loads(text[len("bootprofTrace("): -len(");\n")])
    total = sum(r[4] for r in summarize(read_events(fixture_path(
        "selfprofile/workspace-clean/app-0009460.mm_profdata"))[1])[0].values())
    attributed = sum(data["hits"])
    assert total == 129764 and 0.95 * total < attributed <= total
    kinds = {data["kinds"][data["kind"][i]] for i, h in enumerate(data["hits"]) if h}
    assert kinds == {"Query"}


def test_chrome_trace_minimum_duration(report_run, tmp_path):
    from pipeline.report.queries import chrome_events_of_part
    from pipeline.runs import read_table

    files = {r["file_id"]: r for r in read_table(report_run, "aggregated", "self_profile_processes").to_pylist()}
    part = sorted((report_run / "decoded" / "query_events.parquet").glob("*.parquet"))[0]
    every = json.loads("[" + Path(chrome_events_of_part(str(part), str(tmp_path / "a"), files)).read_text(encoding="utf-8") + "]")
    long = json.loads("[" + Path(chrome_events_of_part(str(part), str(tmp_path / "b"), files, 100_000)).read_text(encoding="utf-8") + "]")
    assert long and len(long) == sum(e["dur"] >= 100 for e in every) < len(every)


def test_folded_stacks_add_up_to_total_time(report_run):
    from pipeline.runs import read_table

    per_crate: dict[str, int] = {}
    for line in (report_run / "report" / "query_stacks.folded").read_text().splitlines():
        stack, value = line.rsplit(" ", 1)
        per_crate[stack.split(";")[0]] = per_crate.get(stack.split(";")[0], 0) + int(value)
    totals = {t["crate"]: t["total_ns"] for t in read_table(report_run, "aggregated", "query_totals").to_pylist()
              if t["scope"] == "crate"}
    assert per_crate == totals


def test_trace_data_cut_keeps_the_tree_whole(report_run, tmp_path):
    from pipeline.report.queries import trace_js_of_part

    part = sorted((report_run / "decoded" / "query_events.parquet").glob("*.parquet"))[0]
    written = trace_js_of_part(str(part), str(tmp_path), {}, 1000)
    for w in written:
        text = (tmp_path / Path(w["path"]).name).read_text()
        data = json.loads(text[len("bootprofTrace("): -len(");\n")])
        n = len(data["start"])
        assert n == data["shown"] <= 1000 and data["cut_ns"] > 0
        for i, p in enumerate(data["parent"]):
            assert p == -1 or (i < p < n and data["start"][p] <= data["start"][i]
                               and data["start"][i] + data["dur"][i] <= data["start"][p] + data["dur"][p])


# ------------------------------------------------------------------------------------------------
# A real browser


def test_speedscope_import_failures_are_caught(browser, tmp_path):
    """A file speedscope cannot import is reported with speedscope's own alert, at once."""
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": "not a number"')
    title = speedscope_titles(browser, [bad], tmp_path)["broken.json"]
    assert title.startswith("alert: "), title


@pytest.fixture(scope="module")
def small_report_run(tmp_path_factory):
    """One small rustc's self-profile (``hello-default``) through decode, aggregate and report: exports in the same
    formats as ``report_run``'s, of a size speedscope imports at once."""
    from pipeline import aggregate, decode, report
    from pipeline.cluster import Pool
    from pipeline.config import Config

    run = tmp_path_factory.mktemp("small-report") / "run"
    config = Config()
    for stage in (lambda: decode.run(run, config, Pool(None), inputs=[fixture_path("selfprofile/hello-default")]),
                  lambda: aggregate.run(run, config, Pool(None)), lambda: report.run(run, config, Pool(None))):
        stage()
    return run


def test_exports_load_in_speedscope(small_report_run, browser, tmp_path):
    """The self-profile exports import in the real speedscope (a small run's: the format is the same at any size, and
    33 MB of trace events held speedscope's main thread over 60 s on a slow CI runner)."""
    out = small_report_run / "report"
    titles = speedscope_titles(browser, [out / "chrome_trace.json", out / "query_stacks.folded"], tmp_path)
    assert titles == {"chrome_trace.json": "chrome_trace.json - speedscope",
                      "query_stacks.folded": "query_stacks.folded - speedscope"}


def test_the_chrome_trace_of_a_large_build_stays_compact(report_run):
    """What a large build's export costs to load is its size: at most ``BYTES_PER_SPAN`` a span (one short JSON
    object each, no indentation, integer microseconds where they are whole)."""
    path = report_run / "report" / "chrome_trace.json"
    spans = sum(e["ph"] == "X" for e in json.loads(path.read_text()))
    assert spans > 100_000 and path.stat().st_size <= BYTES_PER_SPAN * spans, (path.stat().st_size, spans)


#: The most a span of ``chrome_trace.json`` may take, in bytes (measured: 127 with the query names of this build; the
#: same spans written indented took 159).
BYTES_PER_SPAN = 140


def body_data(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))


def test_profile_queries_renders_a_large_process_lazily(report_run, browser):
    """app has 104k events: the page shows a bounded number of boxes, classes as in the seed."""
    fid = file_ids(report_run)["app"]
    page = (report_run / "report" / "profile_queries.html").as_uri()
    dom = browser.dump_dom(f"{page}#file={fid}")
    data = body_data(dom)
    assert data["rendered-file"] == str(fid) and data["rendered-zoom"] == ""
    nodes = len(re.findall(r'class="node ', dom))
    assert nodes == int(data["nodes"]) and 50 < nodes < 5000
    assert re.search(r'class="node pass frac-\d+ important', dom)    # timed passes, important
    assert 'class="node miss ' in dom                                  # query executions
    assert "frac-50" in dom or "frac-40" in dom or "frac-30" in dom    # large nodes styled by share
    assert "thread 3" in dom
    assert 'class="hits inline" title="' in dom and 'cache hits of ' in dom   # per-execution hit dots
    # the busiest thread comes first, and in it the heaviest top-level event: the query that costs most is at
    # the top of the page (threads by event count put a tiny one first, and the heaviest query far below)
    text = (report_run / "report" / "profile_queries" / f"trace-{fid}.js").read_text()
    t = json.loads(text[len("bootprofTrace("): -len(");\n")])
    roots: dict = {}
    for i, p in enumerate(t["parent"]):
        if p < 0 and not t["instant"][i]:
            roots.setdefault(t["thread"][i], []).append(i)
    busy = {tid: sum(t["dur"][i] for i in ids) for tid, ids in roots.items()}
    tids = [int(x) for x in re.findall(r'class="thread" data-tid="(\d+)"', dom)]
    assert tids == sorted(busy, key=lambda tid: (-busy[tid], tid))
    first = dom.index(f'data-tid="{tids[0]}"')
    heaviest = max(roots[tids[0]], key=lambda i: t["dur"][i])
    assert re.search(r'class="node [^"]*" data-i="(\d+)"', dom[first:]).group(1) == str(heaviest)


def test_profile_queries_zoom_and_hits(report_run, browser):
    """Zoom to a subtree by its link target; cache hits show as dots inside their query."""
    from pipeline.runs import read_table

    fid = file_ids(report_run)["hello"]
    page = (report_run / "report" / "profile_queries.html").as_uri()
    events = read_table(report_run, "decoded", "query_events").to_pylist()
    mine = [e for e in events if e["file_id"] == fid and e["payload"] != "integer"]
    # Index in the page's data = position among intervals and instants of the file (nothing is cut here).
    analysis = next(i for i, e in enumerate(mine) if e["label"] == "analysis" and e["payload"] == "interval")
    dom = browser.dump_dom(f"{page}#file={fid}&zoom={analysis}")
    data = body_data(dom)
    assert data["rendered-zoom"] == str(analysis)
    trace = dom[dom.index('id="trace"'):]
    first = re.search(r'<span class="label">([^<]*)</span>', trace).group(1)
    assert first.strip() == "analysis"
    assert 'id="crumbs"><a href="#file=' in dom and "whole process" in dom
    assert 'class="hit"' in dom and 'class="hits"' in dom


def test_every_query_report_page_loads_without_errors(report_run, browser):
    found = pages_without_errors(browser, report_run / "report", "report-queries")
    assert {"index.html", "profile_queries.html", "query_summary.html"} <= set(found)
    assert {name: errors for name, errors in found.items() if errors} == {}
    assert all((ARTIFACTS / "report-queries" / f"{Path(n).stem}.png").stat().st_size > 1000 for n in found)


def test_profile_queries_interaction_in_chromium(report_run, browser):
    """Open a box, zoom into it, go back to the whole process, close everything: real clicks."""
    fid = file_ids(report_run)["app"]
    page = (report_run / "report" / "profile_queries.html").as_uri()

    async def scenario(cdp):
        await cdp.call("Page.navigate", url=f"{page}#file={fid}")
        await cdp.wait_for(f"document.body.dataset.renderedFile === '{fid}'")
        closed = "#trace .node.important:not(.open):not(.leaf)"
        index = await cdp.js(f"document.querySelector('{closed}').dataset.i")
        await cdp.click(f"{closed.replace(':not(.open)', '')}[data-i='{index}'] > .head .label")
        assert await cdp.js(f"document.querySelector('.node[data-i=\"{index}\"]').classList.contains('open')")
        assert await cdp.js(f"document.querySelector('.node[data-i=\"{index}\"] > .kids').children.length") > 0
        await cdp.click(f".node[data-i='{index}'] > .head .zoom")
        await cdp.wait_for(f"document.body.dataset.renderedZoom === '{index}'")
        assert await cdp.js("document.querySelectorAll('#trace > .node').length") == 1
        assert await cdp.js("location.hash") == f"#file={fid}&zoom={index}"
        await cdp.click("#crumbs a")
        await cdp.wait_for("document.body.dataset.renderedZoom === ''")
        assert await cdp.js("document.querySelectorAll('#trace .node.open').length") > 0
        await cdp.click("#collapse-all")
        assert await cdp.js("document.querySelectorAll('#trace .node.open').length") == 0
        await cdp.click("#expand-important")
        assert await cdp.js("document.querySelectorAll('#trace .node.open').length") > 0

    browser.run(scenario)


def test_run_where_every_profile_is_broken(tmp_path, dask_pool):
    """No decodable file: no data is not a result. The decode stops with the file and the reason, and leaves no
    output that a job would aggregate, report, ingest and compare (it once did all four, and exited 0)."""
    import pytest

    from pipeline import decode
    from pipeline.config import Config
    from pipeline.errors import InputError

    bad = tmp_path / "in"
    bad.mkdir()
    raw = fixture_path("selfprofile/hello-default/hello-0006647.mm_profdata").read_bytes()
    (bad / "hello-0006647.mm_profdata").write_bytes(raw[:1000])
    run = tmp_path / "run"
    with pytest.raises(InputError, match="nothing could be decoded") as caught:
        decode.run(run, Config(), dask_pool, inputs=[bad])
    assert "hello-0006647.mm_profdata" in str(caught.value) and "truncated" in str(caught.value)
    assert not (run / "decoded").exists()


def test_invocation_hits_sum_exactly_per_query():
    """Cache-hit counts go to the Query with their id: summed as integers (a float sum lost counts above
    2**53 and, with an absurd count from a damaged file, could not be cast back); an id shared by two
    Queries is not attributed."""
    import numpy as np
    import pyarrow as pa

    from pipeline.report.queries import invocation_hits

    names = ["Query", "QueryCacheHitCount", "GenericActivity"]
    codes = [0, 1, 1, 0, 1, 0, 0, 2]
    ids = np.array([5, 5, 5, 7, 7, 9, 9, 5], np.uint64)
    big = 2**53 + 1
    value = np.array([0, big, 2, 0, 3, 0, 0, 0], np.uint64)
    kind = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(names))
    assert invocation_hits(kind, ids, value).tolist() == [big + 2, 0, 0, 3, 0, 0, 0, 0]


def test_page_errors_are_caught(browser, tmp_path):
    """The check of the report pages can fail: a thrown exception, a console error and a missing script."""
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "ok.html").write_text("<!DOCTYPE html><html><body><p>fine</p></body></html>")
    (pages / "bad.html").write_text("<!DOCTYPE html><html><body><script>console.error('broken view');"
                                    "throw new Error('no data');</script><script src='static/none.js'></script>"
                                    "</body></html>")
    (pages / "late.html").write_text("<!DOCTYPE html><html><body><script>setTimeout(() => { throw new "
                                     "Error('thrown at 3 s'); }, 3000);</script></body></html>")
    found = pages_without_errors(browser, pages, "page-errors")
    assert any("thrown at 3 s" in e for e in found["late.html"]), found["late.html"]
    assert found["ok.html"] == []
    assert any("broken view" in e for e in found["bad.html"]) and any("no data" in e for e in found["bad.html"])
    assert any("ERR_FILE_NOT_FOUND" in e or "none.js" in e for e in found["bad.html"]), found["bad.html"]


def test_the_summary_of_a_self_profile_run(report_run):
    """A run of self-profiles alone (a real cargo build's): its summary gives the wall time (first rustc start to last
    end), the CPU time summed over threads, and the queries with the most self time, equal to those computed here
    from the aggregated tables; its concurrency chart draws the running rustc processes and no busy CPUs."""
    from collections import defaultdict

    from pipeline.report.queries import fmt_duration
    from pipeline.runs import read_table

    index = (report_run / "report" / "index.html").read_text()
    summary = index[index.index('<section id="summary"'):index.index("</section>", index.index('<section id="summary"'))]
    procs = read_table(report_run, "aggregated", "self_profile_processes").to_pylist()
    wall = max(p["wall_end_ns"] for p in procs) - min(p["wall_start_ns"] for p in procs)
    cards = dict(re.findall(r'data-key="([^"]+)"><div class="k">[^<]*</div><div class="v">([^<]*)</div>', summary))
    assert cards["wall time"] == fmt_duration(wall) and cards["CPU time"] == fmt_duration(sum(p["total_ns"] for p in procs))
    queries = defaultdict(int)
    for r in read_table(report_run, "aggregated", "query_summary").to_pylist():
        if r["scope"] == "build":
            queries[r["label"]] += r["self_ns"]
    top = [k for k, _ in sorted(queries.items(), key=lambda kv: -kv[1])[:5]]
    table = summary[summary.index('class="top queries"'):]
    assert re.findall(r'<tr><td class="txt">([^<]*)</td>', table)[:5] == top
    assert '<polyline class="running"' in summary and 'class="busy"' not in summary


def test_the_critical_path_of_a_real_cargo_build():
    """The real cargo build of the fixtures (``workspace-clean``: util, mathx that reads util, app that reads both):
    its self-profiles' command lines give the chain util -> app (app waited for util, which ended after mathx), with
    app's wait its start less util's end."""
    from pipeline.report import critical

    procs = read_table_of("selfprofile/workspace-clean")
    chain = critical.chain(procs)
    assert [c["crate"] for c in chain] == ["util", "app"]
    by = {p["crate"]: p for p in procs}
    assert chain[1]["wait_ns"] == by["app"]["start_ns"] - by["util"]["end_ns"] > 0
    assert by["mathx"]["end_ns"] < by["util"]["end_ns"]


def read_table_of(fixture: str) -> list[dict]:
    """The rustc processes of a fixture's self-profiles (decoded and aggregated here): crate, command line, wall
    start and end."""
    import tempfile

    from pipeline import aggregate, decode
    from pipeline.cluster import connect
    from pipeline.config import Config
    from pipeline.runs import read_table

    with tempfile.TemporaryDirectory() as tmp:
        config = Config()
        config.cluster.mode = "synchronous"
        with connect(config.cluster) as pool:
            decode.run(Path(tmp) / "run", config, pool, inputs=[fixture_path(fixture)])
            aggregate.run(Path(tmp) / "run", config, pool)
        rows = read_table(Path(tmp) / "run", "aggregated", "self_profile_processes").to_pylist()
    return [{"crate": r["crate"], "command_line": r["cmd"], "start_ns": r["wall_start_ns"], "end_ns": r["wall_end_ns"]}
            for r in rows]
