"""Report stage, query section: files, formats, and profile_queries.html in a real headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import fixture_path
from tests.test_capture_selfprofile import rust_path
from tests.test_selfprofile_reference import read_events, summarize

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--window-size=1300,1000"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed (Debian package 'chromium'; make system-deps installs it)")
    return path


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
    every = json.loads("[" + Path(chrome_events_of_part(str(part), str(tmp_path / "a"), files)).read_text() + "]")
    long = json.loads("[" + Path(chrome_events_of_part(str(part), str(tmp_path / "b"), files, 100_000)).read_text() + "]")
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


def dump_dom(url: str, profile: Path) -> str:
    proc = subprocess.run([chromium(), *CHROME_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


SPEEDSCOPE = Path(__file__).resolve().parents[1] / ".venv" / "speedscope" / "node_modules" / "speedscope" / "dist" / "release"


def speedscope_titles(files: list[Path], tmp_path: Path) -> dict[str, str | None]:
    """Open each file in speedscope (the npm package, which ``make test`` installs) in headless Chromium over the
    DevTools protocol, both served over HTTP on loopback (``#profileURL=``); returns per file name the page title,
    which speedscope sets to ``<profile name> - speedscope`` once it has imported the file, or ``alert: <message>``
    when it raised an alert instead (a file it cannot import)."""
    import functools
    import http.server
    import threading

    from tornado.websocket import websocket_connect

    if not (SPEEDSCOPE / "index.html").exists():
        pytest.fail(f"speedscope is not installed at {SPEEDSCOPE} (make test installs it with npm)")
    root = tmp_path / "served"
    root.mkdir()
    (root / "speedscope").symlink_to(SPEEDSCOPE, target_is_directory=True)
    for f in files:
        shutil.copyfile(f, root / f.name)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    titles: dict[str, str | None] = {}

    async def scenario(ws_url):
        cdp = CDP(await websocket_connect(ws_url, max_message_size=1 << 28))
        await cdp.call("Page.enable")
        for f in files:
            cdp.dialogs.clear()
            await cdp.call("Page.navigate", url="about:blank")     # (a new document for each file, not a hash change)
            await cdp.wait_for("location.href === 'about:blank'")
            await cdp.call("Page.navigate", url=f"{base}/speedscope/index.html#profileURL={base}/{f.name}")
            # speedscope imports on the page's main thread: 33 MB of trace events hold it 10 s here and over 60 s
            # on a slow CI runner, and an evaluation is answered only after that, so each may wait out the deadline
            loop = asyncio.get_running_loop()
            end, title = loop.time() + 300, None
            while loop.time() < end and not cdp.dialogs:
                title = await cdp.js("document.title", timeout=max(1.0, end - loop.time()))
                if title and title.endswith(" - speedscope"):
                    break
                await asyncio.sleep(0.1)
            titles[f.name] = f"alert: {cdp.dialogs[0]}" if cdp.dialogs else title
        cdp.ws.close()

    try:
        devtools_page(tmp_path, scenario)
        return titles
    finally:
        server.shutdown()
        server.server_close()


def test_speedscope_import_failures_are_caught(tmp_path):
    """A file speedscope cannot import is reported with speedscope's own alert, at once."""
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": "not a number"')
    title = speedscope_titles([bad], tmp_path)["broken.json"]
    assert title.startswith("alert: "), title


def test_exports_load_in_speedscope(report_run, tmp_path):
    """The self-profile exports import in the real speedscope."""
    out = report_run / "report"
    titles = speedscope_titles([out / "chrome_trace.json", out / "query_stacks.folded"], tmp_path)
    assert titles == {"chrome_trace.json": "chrome_trace.json - speedscope",
                      "query_stacks.folded": "query_stacks.folded - speedscope"}


def body_data(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))


def test_profile_queries_renders_a_large_process_lazily(report_run, tmp_path):
    """app has 104k events: the page shows a bounded number of boxes, classes as in the seed."""
    fid = file_ids(report_run)["app"]
    page = (report_run / "report" / "profile_queries.html").as_uri()
    dom = dump_dom(f"{page}#file={fid}", tmp_path / "chrome")
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


def test_profile_queries_zoom_and_hits(report_run, tmp_path):
    """Zoom to a subtree by its link target; cache hits show as dots inside their query."""
    from pipeline.runs import read_table

    fid = file_ids(report_run)["hello"]
    page = (report_run / "report" / "profile_queries.html").as_uri()
    events = read_table(report_run, "decoded", "query_events").to_pylist()
    mine = [e for e in events if e["file_id"] == fid and e["payload"] != "integer"]
    # Index in the page's data = position among intervals and instants of the file (nothing is cut here).
    analysis = next(i for i, e in enumerate(mine) if e["label"] == "analysis" and e["payload"] == "interval")
    dom = dump_dom(f"{page}#file={fid}&zoom={analysis}", tmp_path / "chrome")
    data = body_data(dom)
    assert data["rendered-zoom"] == str(analysis)
    trace = dom[dom.index('id="trace"'):]
    first = re.search(r'<span class="label">([^<]*)</span>', trace).group(1)
    assert first.strip() == "analysis"
    assert 'id="crumbs"><a href="#file=' in dom and "whole process" in dom
    assert 'class="hit"' in dom and 'class="hits"' in dom


class CDP:
    """A minimal Chrome DevTools Protocol client over tornado's websocket (tornado comes with dask)."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0
        self.events: list[dict] = []        # the events that came while waiting for answers
        self.dialogs: list[str] = []        # the messages of alerts the page raised (each dismissed at once)

    async def call(self, method: str, timeout: float = 60.0, **params):
        """Send ``method`` and wait up to ``timeout`` s for its answer (a page whose main thread is busy answers
        an evaluation only when it is done)."""
        self.next_id += 1
        await self.ws.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.read_message(), timeout))
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == "Page.javascriptDialogOpening":       # (an open alert would hold the page)
                    self.dialogs.append(msg["params"].get("message", ""))
                    await self.ws.write_message(json.dumps({"id": 10**9 + len(self.dialogs),
                                                            "method": "Page.handleJavaScriptDialog",
                                                            "params": {"accept": True}}))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expression: str, timeout: float = 60.0):
        result = await self.call("Runtime.evaluate", timeout=timeout, expression=expression, returnByValue=True,
                                 awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def event(self, method: str, timeout: float = 60.0) -> dict:
        """Wait for the next event ``method`` (answers to no call)."""
        while True:
            found = next((e for e in self.events if e["method"] == method), None)
            if found is not None:
                self.events.remove(found)
                return found
            msg = json.loads(await asyncio.wait_for(self.ws.read_message(), timeout))
            if "method" in msg:
                self.events.append(msg)

    async def wait_for(self, expression: str, timeout: float = 30.0):
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            try:
                if await self.js(expression):
                    return
            except RuntimeError:  # the page is still loading (no document.body yet)
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")

    async def click(self, selector: str):
        """A real mouse click (press and release) at the centre of the element."""
        box = await self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                            f" e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();"
                            f" return [r.x + Math.min(r.width / 2, 40), r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


def devtools_page(tmp_path: Path, scenario) -> None:
    """Start headless Chromium with its DevTools endpoint on loopback and run ``await scenario(ws_url)`` against
    its page."""
    proc = subprocess.Popen([chromium(), *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'chrome'}",
                             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", "about:blank"],
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = m.group(1)
                break
        assert port, "chromium did not start its DevTools endpoint"
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        asyncio.run(scenario(next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


#: Where the tests keep what a person may want to look at after a run (screenshots of every report page).
ARTIFACTS = Path(os.environ.get("BOOTPROF_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "runs" / "test-artifacts"))


#: Virtual milliseconds each page's timers run for after its load, before its errors are read.
VIRTUAL_MS = 5000


def pages_without_errors(report_dir: Path, tmp_path: Path, shots: str) -> dict[str, list[str]]:
    """Open every HTML page of a report over the DevTools protocol: the errors each logged (exceptions, console
    errors, failed loads), by page; a full-page screenshot of each goes to ``ARTIFACTS/<shots>/<page>.png``."""
    import base64

    from tornado.websocket import websocket_connect

    out = ARTIFACTS / shots
    out.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[str]] = {}

    async def scenario(ws_url):
        cdp = CDP(await websocket_connect(ws_url, max_message_size=1 << 28))
        for domain in ("Page", "Runtime", "Log"):
            await cdp.call(f"{domain}.enable")
        for page in sorted(report_dir.glob("*.html")):
            cdp.events.clear()
            await cdp.call("Page.navigate", url=page.as_uri())
            await cdp.wait_for("document.readyState === 'complete'")
            # The page's timers run to the end of a virtual time budget (no wall-clock wait): what a view throws a
            # second or more after load is caught too (mutation once unseen: a page that threw at 1 s passed).
            await cdp.call("Emulation.setVirtualTimePolicy", policy="pauseIfNetworkFetchesPending",
                           budget=VIRTUAL_MS)
            await cdp.event("Emulation.virtualTimeBudgetExpired")
            await cdp.call("Emulation.setVirtualTimePolicy", policy="advance")     # (real time again, for the next)
            await cdp.js("1")                   # (collects what the page logged meanwhile)
            errors = []
            for e in cdp.events:
                p = e.get("params", {})
                if e["method"] == "Runtime.exceptionThrown":
                    errors.append(p["exceptionDetails"].get("exception", {}).get("description") or p["exceptionDetails"]["text"])
                elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
                elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                    errors.append(p["entry"]["text"])
            found[page.name] = errors
            shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            (out / f"{page.stem}.png").write_bytes(base64.b64decode(shot["data"]))
        cdp.ws.close()

    devtools_page(tmp_path, scenario)
    return found


def test_every_query_report_page_loads_without_errors(report_run, tmp_path):
    found = pages_without_errors(report_run / "report", tmp_path, "report-queries")
    assert {"index.html", "profile_queries.html", "query_summary.html"} <= set(found)
    assert {name: errors for name, errors in found.items() if errors} == {}
    assert all((ARTIFACTS / "report-queries" / f"{Path(n).stem}.png").stat().st_size > 1000 for n in found)


def test_profile_queries_interaction_in_chromium(report_run, tmp_path):
    """Open a box, zoom into it, go back to the whole process, close everything: real clicks."""
    from tornado.websocket import websocket_connect

    fid = file_ids(report_run)["app"]
    page = (report_run / "report" / "profile_queries.html").as_uri()

    async def scenario(ws_url):
        cdp = CDP(await websocket_connect(ws_url, max_message_size=1 << 28))
        await cdp.call("Page.enable")
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
        cdp.ws.close()

    devtools_page(tmp_path, scenario)


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


def test_page_errors_are_caught(tmp_path):
    """The check of the report pages can fail: a thrown exception, a console error and a missing script."""
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "ok.html").write_text("<!DOCTYPE html><html><body><p>fine</p></body></html>")
    (pages / "bad.html").write_text("<!DOCTYPE html><html><body><script>console.error('broken view');"
                                    "throw new Error('no data');</script><script src='static/none.js'></script>"
                                    "</body></html>")
    (pages / "late.html").write_text("<!DOCTYPE html><html><body><script>setTimeout(() => { throw new "
                                     "Error('thrown at 3 s'); }, 3000);</script></body></html>")
    found = pages_without_errors(pages, tmp_path, "page-errors")
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
