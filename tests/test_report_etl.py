"""Report stage, ETL sections (cpu, memory, processes): exports and the flame graph in a real Chromium."""

from __future__ import annotations

import csv
import json
import re

import pytest

from pipeline.report.flame import MIN_FRACTION, build_tree
from pipeline.runs import read_table
from tests.helpers.runs import etl_config, synth_run
from tests.helpers.browser import ARTIFACTS, pages_without_errors


@pytest.fixture(scope="module")
def lazy_report_run(tmp_path_factory, dask_pool):
    """(run dir, whether the aggregate and report stages started a cluster): they run with a lazy pool, as
    their CLIs do, after decode and symbolize on the session's cluster."""
    from pipeline import aggregate, report
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    run, _ = synth_run(tmp_path_factory.mktemp("report-etl"), "plain64", dask_pool, ("decode", "symbolize"))
    config = etl_config(run.parent / "input" / "trace.etl", run.parent)
    with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"), lazy=True) as pool:
        aggregate.run(run, config, pool)
        report.run(run, config, pool)
        return run, pool.started


@pytest.fixture(scope="module")
def report_run(lazy_report_run):
    return lazy_report_run[0]


def test_etl_aggregate_and_report_start_no_cluster(lazy_report_run):
    """Their ETL sections are DuckDB and Python: a lazy pool (``bootprof aggregate`` / ``report``) never
    starts the cluster that cost those commands 1.9 and 1.1 s on the 1 GB synth trace."""
    assert lazy_report_run[1] is False


def flame_data(path) -> dict:
    text = path.read_text()
    return json.loads(re.search(r'<script type="application/json" id="flame-data">(.*?)</script>', text, re.S).group(1))


def drive(page, script: str, browser) -> dict[str, str]:
    """Load ``page`` in Chromium with ``script`` (a ``<script>…</script></body>`` that stores what it sees in the
    body's data attributes) in place of its ``</body>``; returns those attributes, unescaped. The driven copy sits
    beside the page, so that its links to static/ work, and is removed afterwards."""
    import html as htmlmod

    driven = page.with_name(f"driven-{page.name}")
    driven.write_text(page.read_text().replace("</body>", script))
    try:
        dom = browser.dump_dom(driven.as_uri())
    finally:
        driven.unlink()
    return {k: htmlmod.unescape(v) for k, v in re.findall(r'data-([a-z-]+)="([^"]*)"',
                                                         re.search(r"<body([^>]*)>", dom).group(1))}


def test_build_tree_layout():
    tree = build_tree([("a;b;c", 3), ("a;b", 1), ("a;d", 2), ("e", 4), ("a;b;c", 1)])
    names = [tree["names"][i] for i in tree["n"]]
    assert names == ["all", "a", "b", "c", "d", "e"]
    assert tree["x"] == [0, 0, 0, 0, 5, 7]
    assert tree["w"] == [11, 7, 5, 4, 2, 4]
    assert tree["s"] == [0, 0, 1, 4, 2, 4]
    assert tree["d"] == [0, 1, 2, 3, 2, 1]


def test_build_tree_by_depths_equals_the_walk_node_by_node():
    """Integer values are laid out one depth at a time with numpy; float values by the walk node by node. Both give
    the same tree, on random stacks with repeated and empty frames, frames named like the root, narrow frames
    (cut) and values of zero and below (left out); and so does the deepest-node search of add_bins."""
    import random

    import numpy as np
    import pyarrow as pa

    from pipeline.report import flame

    rnd = random.Random(5)
    frames = ["a", "b", "all", "", "Z", "é", "a b", "ab"]
    trees = 0
    for _ in range(300):
        rows = [(";".join(rnd.choice(frames) for _ in range(rnd.randint(1, 7))),
                 rnd.choice([0, 1, 2, 5, 1000, 10 ** 6, -3]), rnd.randint(0, 9), rnd.randint(0, 9))
                for _ in range(rnd.randint(0, 40))]
        by_depth = build_tree(rows, ("p", "q"))
        walked = build_tree([(r[0], *map(float, r[1:])) for r in rows], ("p", "q"))
        assert by_depth == {k: [int(v) for v in vs] if k not in ("names", "n", "d") else vs
                            for k, vs in walked.items()}, rows
        trees += len(by_depth["n"]) > 20
        # each stack's deepest node on the tree, against following its frames by name
        n = len(by_depth["n"])
        parent, last = [0] * n, []
        for i in range(1, n):
            del last[by_depth["d"][i] - 1:]
            parent[i] = last[-1] if last else 0
            last.append(i)
        stacks = [r[0] for r in rows] + ["a;nowhere", "zz"]
        got = flame._deepest_nodes(pa.array(stacks), np.array(parent), np.array(by_depth["n"]), by_depth["names"])
        for stack, node in zip(stacks, got.tolist()):
            at = 0
            for frame in stack.split(";"):
                below = [i for i in range(1, n) if parent[i] == at and by_depth["names"][by_depth["n"][i]] == frame]
                if not below:
                    break
                at = below[0]
            assert node == at, (stack, rows)
    assert trees > 50


def test_build_tree_drops_tiny_frames_into_parent_self():
    stacks = [("a;big", 100_000), ("a;tiny", 5)]
    tree = build_tree(stacks)
    assert 5 < 100_005 * MIN_FRACTION
    names = [tree["names"][i] for i in tree["n"]]
    assert names == ["all", "a", "big"]
    assert tree["s"][1] == 5 and tree["w"][0] == 100_005


def test_exports_hold_every_sample(report_run):
    out = report_run / "report"
    total = sum(r["samples"] for r in read_table(report_run, "aggregated", "cpu_folded").to_pylist())
    lines = (out / "cpu_folded.txt").read_text().splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == total
    sp = json.loads((out / "cpu.speedscope.json").read_text())
    prof = sp["profiles"][0]
    assert prof["type"] == "sampled" and sum(prof["weights"]) == total == prof["endValue"]
    frames = sp["shared"]["frames"]
    first = lines[0].rsplit(" ", 1)[0].split(";")
    assert [frames[i]["name"] for i in prof["samples"][0]] == first
    for table in ("cpu_by_function", "cpu_by_process", "commit_by_stack", "process_tree"):
        with open(out / f"{table}.csv", encoding="utf-8", newline="") as f:
            assert sum(1 for _ in csv.DictReader(f)) == read_table(report_run, "aggregated", table).num_rows
    data = flame_data(out / "flamegraph_cpu.html")
    assert data["w"][0] == total and sum(data["s"]) == total


def test_flamegraph_renders_in_chromium(report_run, tmp_path, browser):
    page = report_run / "report" / "flamegraph_cpu.html"
    dom = browser.dump_dom(page.as_uri())
    svg = re.search(r'<svg id="flame"[^>]*>', dom).group(0)
    drawn = int(re.search(r'data-drawn="(\d+)"', svg).group(1))
    start = dom.index('<svg id="flame"')
    drawing = dom[start:dom.index("</svg>", start)]
    assert drawn == drawing.count('<g class="frame"') and drawn > 100
    assert "rustc.exe core (" in dom and "Idle (" in dom


def test_flamegraph_zoom_and_search_from_the_url(report_run, tmp_path, browser):
    page = report_run / "report" / "flamegraph_cpu.html"
    data = flame_data(page)
    names = [data["names"][i] for i in data["n"]]
    target = names.index("rustc.exe core")
    dom = browser.dump_dom(f"{page.as_uri()}#zoom={target}")
    svg = re.search(r'<svg id="flame"[^>]*>', dom).group(0)
    assert f'data-zoom="{target}"' in svg
    width = re.search(r'width="(\d+)"', svg).group(1)
    node = re.search(rf'<g class="frame" data-i="{target}">.*?<rect x="([\d.]+)" y="\d+" width="([\d.]+)"', dom)
    assert float(node.group(1)) == 0 and abs(float(node.group(2)) - int(width)) <= 1
    assert "Idle (" not in dom  # outside the zoomed frame

    # search: the share of the total under frames matching /hashbrown/, outermost match once
    want, end = 0, -1
    for i, name in enumerate(names):
        if data["x"][i] < end or i == 0:
            continue
        if "hashbrown" in name:
            want += data["w"][i]
            end = data["x"][i] + data["w"][i]
    assert want > 0
    dom = browser.dump_dom(f"{page.as_uri()}#search=hashbrown")
    matched = re.search(r'data-matched="([\d.]+)"', dom).group(1)
    assert matched == f"{100 * want / data['w'][0]:.2f}"
    assert "rgb(190,80,230)" in dom


def test_index_has_the_etl_sections(report_run):
    index = (report_run / "report" / "index.html").read_text()
    for section in ("cpu", "memory", "processes"):
        assert f'<section id="{section}"' in index
    tree = read_table(report_run, "aggregated", "process_tree").to_pylist()
    assert len(re.findall(r'<g class="proc[ "]', index)) == sum(1 for r in tree if r["first_seen_ns"] is not None)
    assert 'src="flamegraph_cpu.html"' in index
    assert (report_run / "report" / "flamegraph_commit.html").exists()
    assert (report_run / "report" / "flamegraph_heap.html").exists() and "flamegraph_heap.html" in index
    # WPA's System Configuration: the machine (the synthesized trace's SysConfig record) and the recording
    i = index.index('<section id="sysconfig"')
    system = index[i:index.index("</section>", i)]
    machine = read_table(report_run, "decoded", "sysconfig").to_pylist()[0]
    trace = read_table(report_run, "decoded", "trace").to_pylist()[0]
    assert f">{machine['computer_name']}<" in system and f">{machine['cpu_count']}<" in system
    assert f"{trace['buffers']:,} of {trace['buffers_written']:,} written" in system


CLICKS = """<script>
(function () {
  const svg = document.getElementById("flame"), out = document.body.dataset;
  const click = (el) => el.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true, view: window}));
  const frame = (i) => svg.querySelector(`g.frame[data-i="${i}"] rect`);
  click(frame(%(target)d));
  out.afterClick = svg.dataset.zoom + "|" + location.hash + "|" + frame(%(target)d).getAttribute("x");
  click(frame(%(target)d));
  out.afterSecondClick = svg.dataset.zoom + "|" + location.hash;
  const input = document.getElementById("flame-search");
  input.value = "hashbrown";
  input.dispatchEvent(new Event("input", {bubbles: true}));
  out.afterSearch = svg.dataset.matched + "|" + location.hash;
  input.value = "([";
  input.dispatchEvent(new Event("input", {bubbles: true}));
  out.badRegex = input.className + "|" + svg.dataset.matched;
  click(frame(%(target)d));
  click(document.getElementById("flame-reset"));
  out.afterReset = svg.dataset.zoom + "|" + (svg.dataset.matched || "none") + "|" + input.value;
})();
</script>
</body>"""


def test_flamegraph_click_search_and_reset_handlers(report_run, tmp_path, browser):
    """The page's own event handlers, driven by DOM events in Chromium: click zooms and toggles back,
    typing searches, a bad regex is marked and ignored, reset clears both."""
    page = report_run / "report" / "flamegraph_cpu.html"
    data = flame_data(page)
    target = [data["names"][i] for i in data["n"]].index("rustc.exe core")
    body = drive(page, CLICKS % {"target": target}, browser)
    assert body["after-click"] == f"{target}|#zoom={target}|0.0"
    assert body["after-second-click"] == "0|"
    matched, hash_ = body["after-search"].split("|")
    assert float(matched) > 0 and hash_ == "#search=hashbrown"
    assert body["bad-regex"] == f"bad|{matched}"
    assert body["after-reset"] == "0|none|"


def test_a_damaged_trace_goes_through_every_stage(tmp_path):
    """A real trace with 200 bytes garbled (as ``test_random_corruption_never_crashes`` does) through decode,
    symbolize, aggregate and report: samples whose process cannot be told (no process id) fold under one
    root of their own instead of a null stack, which failed the report's flame graph (found by fuzzing)."""
    import numpy as np

    from pipeline import aggregate, decode, report, symbolize
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from tests.conftest import fixture_path

    data = bytearray(fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl").read_bytes())
    rng = np.random.default_rng(0)
    for pos in rng.integers(int.from_bytes(data[0:4], "little"), len(data), 200):
        data[pos] ^= int(rng.integers(1, 256))
    trace = tmp_path / "damaged.etl"
    trace.write_bytes(bytes(data))
    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.symbol_path, config.symbolize.cache_dir = "", tmp_path / "symbols"
    run = tmp_path / "run"
    decode.run(run, config, Pool(None), inputs=[trace])
    for stage in (symbolize, aggregate, report):
        stage.run(run, config, Pool(None))
    assert read_table(run, "decoded", "errors").num_rows > 0
    no_pid = read_table(run, "decoded", "samples", columns=["pid"]).column("pid").null_count
    assert no_pid > 0                                       # (what this seed is for)
    folded = read_table(run, "aggregated", "cpu_folded").to_pylist()
    assert all(r["stack"] for r in folded)
    assert sum(r["samples"] for r in folded if r["stack"].startswith("[unknown process]")) == no_pid
    assert "[unknown process]" in (run / "report" / "cpu_folded.txt").read_text()


def test_memory_section_answers_by_function(report_run):
    """The memory section names functions, never module+0x..., in its commit and heap tables: the functions
    holding the most heap at the largest snapshot come from heap_snapshot_by_function, the growth table from
    heap_snapshot_growth; the whole trace's commit peak is stated."""
    import html as htmlmod

    index = (report_run / "report" / "index.html").read_text()
    i = index.index('<section id="memory"')
    memory = index[i:index.index("</section>", i)]
    assert "Commit per compiled crate" in memory and "The commit of all processes together peaked at" in memory
    assert "Functions holding the most heap at the largest snapshot" in memory
    assert "<h3>Commit over time</h3>" in memory and memory.count("<polyline") == 11   # all, and 10 processes
    assert "Largest heap growth from one snapshot of a process to the next" in memory
    cells = [htmlmod.unescape(c) for c in re.findall(r'<td class="txt">([^<]*)</td>', memory)]
    assert "rustc_codegen_llvm::back::write::codegen" in cells
    assert not [c for c in cells if "+0x" in c]
    heap = read_table(report_run, "aggregated", "heap_snapshot_by_function").to_pylist()
    assert {r["function"] for r in heap} & set(cells)
    for name in ("commit_by_crate.csv", "commit_by_code_crate.csv", "heap_snapshot_by_function.csv",
                 "heap_snapshot_growth.csv"):
        assert (report_run / "report" / name).stat().st_size > 0 and f'href="{name}"' in memory


IDLE = """<script>
(function () {
  const svg = document.getElementById("flame"), out = document.body.dataset, box = document.getElementById("flame-hide-idle");
  out.before = svg.dataset.shown + "|" + svg.querySelectorAll("g.frame").length;
  box.checked = true;
  box.dispatchEvent(new Event("change", {bubbles: true}));
  out.after = svg.dataset.shown + "|" + location.hash;
  out.idleTitles = [...svg.querySelectorAll("g.frame title")].filter(t => t.textContent.startsWith("Idle")).length;
  out.labels = [...svg.querySelectorAll("g.frame text")].map(t => t.textContent).filter(t => t.includes("!")).length;
  out.named = [...svg.querySelectorAll("g.frame")].filter(g => {
    const title = g.querySelector("title").textContent, label = g.querySelector("text").textContent;
    return label && title.includes("!") && title.split("!")[1].startsWith(label);
  }).length;
})();
</script>
</body>"""


def test_flamegraph_hides_idle_and_labels_functions_first(report_run, tmp_path, browser):
    """WPA-like: the Idle process (most samples of an idle machine) can be hidden, the rest then fills the page;
    labels start with the function (the module is in the tooltip)."""
    page = report_run / "report" / "flamegraph_cpu.html"
    idle = sum(r["samples"] for r in read_table(report_run, "aggregated", "cpu_folded").to_pylist()
               if r["stack"].split(";")[0] == "Idle")
    data = flame_data(page)
    body = drive(page, IDLE, browser)
    assert idle > 0 and body["before"].split("|")[0] == str(data["w"][0])
    assert body["after"] == f"{data['w'][0] - idle}|#idle=0"
    assert body["idle-titles"] == "0" and body["labels"] == "0" and int(body["named"]) > 0


def test_missing_data_and_missing_symbols_are_explained(tmp_path):
    """A kernel trace without CPU samples, VirtualAlloc or heap events: no empty flame graph or tables, but a note
    per missing kind naming the WPR profile or xperf flags that record it. A trace whose frames did not resolve
    (no symbol path) says how to give symbols and lists the images without them."""
    from pipeline import aggregate, decode, report, symbolize
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from tests.conftest import fixture_path

    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.symbol_path, config.symbolize.cache_dir = str(tmp_path / "nothing"), tmp_path / "cache"
    for name, trace in (("kernel", "etl/airbus/AMSITrace.etl"), ("net", "etl/perfview-net45-x86/PerfViewData.etl")):
        run = tmp_path / name
        decode.run(run, config, Pool(None), inputs=[fixture_path(trace)])
        for stage in (symbolize, aggregate, report):
            stage.run(run, config, Pool(None))
    index = (tmp_path / "kernel" / "report" / "index.html").read_text()
    assert '<section id="coverage"' in index and '<section id="cpu"' not in index
    assert not (tmp_path / "kernel" / "report" / "flamegraph_cpu.html").exists()
    for what, how in (("CPU samples", "-stackwalk Profile"), ("VirtualAlloc commits", "-stackwalk VirtualAlloc"),
                      ("heap snapshots", "wpr -singlesnapshot heap PID")):
        assert f"<b>No {what}</b>" in index and how in index
    net = (tmp_path / "net" / "report" / "index.html").read_text()
    assert re.search(r"Only 0\.0% of [\d,]+ frames resolved", net) and "<b>No CPU samples</b>" not in net
    assert "--symbol-path P" in net and "_NT_SYMBOL_PATH" in net and "<code>mscorlib.ni.dll</code>" in net


TABLE_CLICKS = """<script>
(function () {
  const out = document.body.dataset, table = document.querySelector("table.cpu-processes");
  const th = [...table.querySelectorAll("thead th")].find(t => t.textContent === "samples");
  const col = [...table.querySelectorAll("thead th")].indexOf(th);
  const values = () => [...table.tBodies[0].rows].filter(r => r.style.display !== "none")
                                                  .map(r => r.cells[col].dataset.v).join(",");
  th.click();
  out.up = values();
  th.click();
  out.down = values();
  const filter = table.previousElementSibling;
  filter.value = "core";
  filter.dispatchEvent(new Event("input", {bubbles: true}));
  out.filtered = table.dataset.shown + "|" + [...table.tBodies[0].rows].filter(r => r.style.display !== "none")
                                          .every(r => r.textContent.includes("core"));
})();
</script>
</body>"""


def test_report_tables_sort_and_filter_in_chromium(report_run, tmp_path, browser):
    body = drive(report_run / "report" / "index.html", TABLE_CLICKS, browser)
    up = [int(v) for v in body["up"].split(",")]
    assert len(up) > 5 and up == sorted(up) and [int(v) for v in body["down"].split(",")] == sorted(up, reverse=True)
    shown, every = body["filtered"].split("|")
    assert int(shown) > 0 and every == "true"


def test_build_processes_table(report_run):
    """WPA's "rustc Build Processes": one row per rustc, with what its command line says it builds."""
    from pipeline.report.processes import build_processes

    index = (report_run / "report" / "index.html").read_text()
    i = index.index('class="build-processes"')
    rows = re.findall(r"<tr><td class=\"txt\">([^<]*)</td><td class=\"txt\">([^<]*)</td><td class=\"txt\">([^<]*)</td>"
                      r"<td class=\"txt\">([^<]*)</td>", index[i:index.index("</table>", i)])
    tree = read_table(report_run, "aggregated", "process_tree").to_pylist()
    rustc = [r for r in tree if r["crate"]]
    assert len(rows) == len(rustc) and {r[0] for r in rows} == {r["crate"] for r in rustc}
    assert {r[2] for r in rows} == {"stage0", "stage1"} and {r[3] for r in rows} == {"x86_64-pc-windows-msvc"}
    assert {r[1] for r in rows} <= {"lib", "rlib", "dylib", "proc-macro", "bin"} and "lib" in {r[1] for r in rows}
    one = build_processes([{"process_key": 1, "crate": "x", "duration_ns": 5, "command_line":
                            r'"C:\b\stage2\bin\rustc.exe" --crate-name=x --crate-type="proc-macro" --target=aarch64-pc'}],
                          {1: 7})
    assert [(r["crate_type"], r["stage"], r["target"], r["peak_commit_bytes"]) for r in one] == [
        ("proc-macro", "stage2", "aarch64-pc", 7)]


KEYS = """<script>
(function () {
  const tree = document.getElementById("tree"), out = document.body.dataset;
  const key = (k) => tree.dispatchEvent(new KeyboardEvent("keydown", {key: k, bubbles: true, cancelable: true}));
  for (let i = 0; i < 2 * %(depth)d; i++) key("ArrowRight");
  out.path = tree.dataset.path;
  key("ArrowLeft"); key("ArrowLeft");
  out.back = tree.dataset.path;
  out.rows = tree.querySelectorAll(".row").length;
})();
</script>
</body>"""


def test_commit_tree_drills_down_largest_first_from_the_keyboard(report_run, tmp_path, browser):
    """WPA's Commit Stack view: Right opens a row, then goes to its largest child; from the root, 2k presses
    follow the path of the largest child k levels deep. Left closes, then goes back up."""
    from collections import defaultdict

    folded = [(r["stack"], r["commit_bytes"]) for r in read_table(report_run, "aggregated", "commit_folded").to_pylist()]
    depth = 6
    inclusive: dict = defaultdict(int)
    for stack, v in folded:
        frames = stack.split(";")
        for k in range(1, len(frames) + 1):
            inclusive[tuple(frames[:k])] += v
    path: tuple = ()
    for _ in range(depth):
        kids = [(v, p) for p, v in inclusive.items() if len(p) == len(path) + 1 and p[:len(path)] == path]
        path = max(kids, key=lambda vp: (vp[0], [-ord(c) for c in vp[1][-1]]))[1]
    body = drive(report_run / "report" / "commit_tree.html", KEYS % {"depth": depth}, browser)
    assert body["path"].split(";") == list(path)
    assert body["back"].split(";") == list(path[:-1]) and int(body["rows"]) > depth


HEAP_PICK = """<script>
(function () {
  const a = document.getElementById("heap-a"), b = document.getElementById("heap-b"), out = document.body.dataset;
  const table = document.getElementById("heap-table");
  out.one = table.tBodies[0].rows[0].dataset.f + "|" + table.tBodies[0].rows[0].cells[1].dataset.v;
  b.value = "1";
  b.dispatchEvent(new Event("change"));
  const first = table.tBodies[0].rows[0];
  out.two = first.dataset.f + "|" + first.cells[1].dataset.v + "|" + first.cells[2].dataset.v + "|" + first.cells[3].dataset.v;
  out.compared = table.dataset.compared;
})();
</script>
</body>"""


def test_heap_snapshots_pick_and_compare_in_chromium(report_run, tmp_path, browser):
    """Pick a snapshot: its largest function by busy bytes first; pick a second: the largest growth first, with
    the bytes of heap_snapshot_by_function at both."""
    snaps = [s for s in read_table(report_run, "aggregated", "heap_snapshots_summary").to_pylist()
             if s["status"] == "ok" and s["blocks"]]
    snaps.sort(key=lambda s: (s["pid"], s["timestamp_ns"], s["instance"]))
    by = {}
    for r in read_table(report_run, "aggregated", "heap_snapshot_by_function").to_pylist():
        by.setdefault((r["pid"], r["instance"], r["timestamp_ns"]), {})[f"{r['module']}!{r['function']}"] = r["inclusive_bytes"]
    first, second = (by[(s["pid"], s["instance"], s["timestamp_ns"])] for s in snaps[:2])
    body = drive(report_run / "report" / "heap_snapshots.html", HEAP_PICK, browser)
    name, value = body["one"].rsplit("|", 1)
    assert int(value) == first[name] == max(first.values())
    name, x, y, growth = body["two"].rsplit("|", 3)
    growths = {f: second.get(f, 0) - first.get(f, 0) for f in set(first) | set(second)}
    assert (int(x), int(y), int(growth)) == (first.get(name, 0), second.get(name, 0), max(growths.values()))
    assert body["compared"] == "0-1"


def test_heap_snapshots_of_a_picked_range(report_run, tmp_path, browser):
    """heap_snapshots.html#t=<ns>-<ns> (the link of a report with a picked range) offers the snapshots taken in it."""
    snaps = sorted((s for s in read_table(report_run, "aggregated", "heap_snapshots_summary").to_pylist()
                    if s["status"] == "ok" and s["blocks"]), key=lambda s: (s["pid"], s["timestamp_ns"], s["instance"]))
    times = sorted(s["timestamp_ns"] for s in snaps)
    a, b = times[len(times) // 4], times[len(times) // 2]
    dom = browser.dump_dom((report_run / "report" / "heap_snapshots.html").as_uri() + f"#t={a}-{b}")
    picker = re.search(r'<select id="heap-a">(.*?)</select>', dom, re.S).group(1)
    want = [s for s in snaps if a <= s["timestamp_ns"] <= b]
    assert len(re.findall(r"<option", picker)) == len(want) and 0 < len(want) < len(snaps)
    assert f"{len(want)} of {len(snaps)} snapshots were taken in" in dom
    assert 'data-compared="' in dom and 'data-compared=""' not in dom


def test_etl_chrome_trace_against_truth(report_run):
    """``processes.chrome_trace.json``: every process instance of the synthesized build with its lifetime to the
    nanosecond, its threads, and a CPU counter whose bins add up to its samples in the truth; intervals nest."""
    from pipeline.report.processes import CHROME_TRACE
    from tests.test_report_queries import nesting_errors

    truth = json.loads((report_run.parent / "input" / "trace.truth.json").read_text())
    doc = json.loads((report_run / "report" / CHROME_TRACE).read_text())
    events = doc["traceEvents"]
    assert CHROME_TRACE in (report_run / "report" / "index.html").read_text()
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    lifetimes = {e["pid"]: e for e in events if e["ph"] == "X" and e["cat"] == "process"}
    assert set(names) == set(lifetimes)
    key_of = {(e["args"]["pid"], None if e["args"]["running_at_trace_start"] else round(e["ts"] * 1000)): k
              for k, e in lifetimes.items()}
    counters: dict[int, int] = {}
    for e in events:
        if e["ph"] == "C":
            counters[e["pid"]] = counters.get(e["pid"], 0) + e["args"]["samples"]
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X" and e["cat"] == "thread"}
    for p in truth["processes"]:
        key = key_of[(p["pid"], None if p["rundown"] else p["start_ns"])]
        assert names[key].startswith(p["image_name"]) and f"(pid {p['pid']})" in names[key]
        if p["kind"] == "rustc":
            assert f" {p['crate']} " in names[key]
        if p["end_ns"] is not None and not p["rundown"]:
            assert round((lifetimes[key]["ts"] + lifetimes[key]["dur"]) * 1000) == p["end_ns"]
        assert counters.get(key, 0) == p["samples"], p["pid"]
        assert {tid for k, tid in threads if k == key} >= set(p["threads"])
    assert sum(counters.values()) == truth["samples"]["total"]
    assert nesting_errors([e for e in events if e["ph"] == "X"]) == 0
    assert all(e["args"]["samples"] >= 0 for e in events if e["ph"] == "C")


def test_etl_exports_load_in_speedscope(report_run, tmp_path, browser):
    """CPU speedscope JSON, folded stacks of samples and of bytes, and the processes' Chrome trace import in the
    real speedscope."""
    from tests.helpers.browser import speedscope_titles

    names = ["cpu.speedscope.json", "cpu_folded.txt", "commit_folded.bytes.txt", "processes.chrome_trace.json"]
    titles = speedscope_titles(browser, [report_run / "report" / n for n in names], tmp_path)
    assert titles == {**{n: f"{n} - speedscope" for n in names}, "cpu.speedscope.json": "CPU samples - speedscope"}


BUTTERFLY = """<script>
(function () {
  const svg = document.getElementById("flame"), out = document.body.dataset;
  const panel = document.getElementById("flame-butterfly");
  const click = (el) => el.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true, view: window}));
  click(svg.querySelector(`g.frame[data-i="%(target)d"] rect`));
  out.fn = panel.dataset.fn; out.inclusive = panel.dataset.inclusive; out.self = panel.dataset.self;
  out.callers = panel.dataset.callers; out.callees = panel.dataset.callees;
  click(panel.querySelector("table.callers tr[data-n] td"));
  out.next = panel.dataset.fn + "|" + svg.dataset.zoom;
  click(document.getElementById("flame-reset"));
  out.reset = panel.dataset.fn + "|" + panel.innerHTML.length;
})();
</script>
</body>"""


def butterfly_truth(stacks, fn):
    """Callers and callees of ``fn`` from folded stacks: per stack, its outermost occurrence of ``fn``, the
    frame before it (``all`` at the root) and the frame after it; self = stacks that end in ``fn``."""
    callers, callees, incl, self_ = {}, {}, 0, 0
    for stack, value in stacks:
        frames = stack.split(";")
        if fn not in frames:
            continue
        k = frames.index(fn)
        incl += value
        self_ += value if frames[-1] == fn else 0
        caller = frames[k - 1] if k else "all"
        callers[caller] = callers.get(caller, 0) + value
        if k + 1 < len(frames):
            callees[frames[k + 1]] = callees.get(frames[k + 1], 0) + value
    lines = lambda d: "\n".join(sorted(f"{n}={v}" for n, v in d.items()))
    return {"fn": fn, "inclusive": str(incl), "self": str(self_), "callers": lines(callers), "callees": lines(callees)}


def test_flamegraph_callers_and_callees(tmp_path, browser):
    """Click a frame: below the graph, its function merged over every place it occurs (a recursive one once
    per stack), what calls it and what it calls, equal to the same sums over the folded stacks; a caller's row
    goes to that function; reset clears the panel."""
    from pipeline.report.flame import flame_page

    stacks = [("p;main;parse;lex", 40), ("p;main;parse", 10), ("p;main;check;parse;lex", 25),
              ("p;main;check;parse;parse;alloc", 15), ("p;worker;parse;alloc", 30), ("q;parse", 5),
              ("p;main;check;typeck", 50), ("p;main;check", 5)]
    page = tmp_path / "flame.html"
    page.write_text(flame_page("t", stacks, "samples"))
    data = flame_data(page)
    target = [data["names"][i] for i in data["n"]].index("parse")
    body = drive(page, BUTTERFLY % {"target": target}, browser)
    want = butterfly_truth(stacks, "parse")
    assert {k: body[k] for k in want} == want
    assert want["callers"] == "check=40\nmain=50\nq=5\nworker=30" and want["self"] == "15"
    main = [i for i, n in enumerate(data["n"]) if data["names"][n] == "main"][0]     # (the largest caller, first)
    assert body["next"] == f"main|{main}"
    assert body["reset"] == "|0"


RANGE = """<script>
(function () {
  const svg = document.getElementById("flame"), out = document.body.dataset;
  const top = document.getElementById("flame-top"), strip = document.getElementById("flame-range");
  out.whole = svg.dataset.shown + "|" + top.dataset.first;
  location.hash = "%(hash)s";
  setTimeout(function () {
    out.picked = svg.dataset.shown + "|" + top.dataset.first + "|" + strip.dataset.range;
    const r = strip.getBoundingClientRect(), at = (f) => ({clientX: r.left + f * r.width, clientY: r.top + 5, bubbles: true});
    strip.dispatchEvent(new MouseEvent("mousedown", at(%(drag_from)s)));
    window.dispatchEvent(new MouseEvent("mouseup", at(%(drag_to)s)));
    out.dragged = strip.dataset.range + "|" + location.hash + "|" + svg.dataset.shown;
    document.getElementById("flame-range-all").dispatchEvent(new MouseEvent("click", {bubbles: true}));
    out.all = svg.dataset.shown + "|" + (strip.dataset.range || "none");
  }, 100);
})();
</script>
</body>"""


def test_add_bins_equals_the_sums_along_each_path(monkeypatch):
    """Each node's value per bin is the sum of the rows whose stack passes through it (to the deepest node the tree
    kept), whether the (node, bin) matrix is summed at once or in ranges of bins, and from tuples or a table with
    a dictionary column."""
    import random
    from collections import defaultdict

    import pyarrow as pa

    from pipeline.report import flame
    from pipeline.report.flame import add_bins, build_tree

    rnd = random.Random(3)
    rows = [(rnd.randrange(7), ";".join(rnd.choice("abc") for _ in range(rnd.randrange(1, 5))), rnd.randrange(1, 1 << 40))
            for _ in range(300)]
    totals: dict[str, int] = defaultdict(int)
    for _, stack, v in rows:
        totals[stack] += v
    tree = build_tree(sorted(totals.items()))
    want: dict[tuple, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for b, stack, v in rows:
        frames = stack.split(";")
        for d in range(len(frames) + 1):
            want[tuple(frames[:d])][b] += v
    paths, last = [], []
    for i in range(len(tree["n"])):
        del last[tree["d"][i]:]
        last.append(tree["names"][tree["n"][i]])
        paths.append(tuple(last[1:]))
    table = pa.table({"bin": [r[0] for r in rows], "stack": pa.array([r[1] for r in rows]).dictionary_encode(),
                      "v": [r[2] for r in rows]})
    for cells in (1 << 23, 8):
        monkeypatch.setattr(flame, "CELLS", cells)
        for given in (rows, table):
            got = add_bins(build_tree(sorted(totals.items())), given, 7, 0, 7)
            for i, path in enumerate(paths):
                lo, hi = got["bo"][i], got["bo"][i + 1]
                assert dict(zip(got["bb"][lo:hi], got["bv"][lo:hi])) == dict(want[path]), (cells, path)
                assert got["bb"][lo:hi] == sorted(got["bb"][lo:hi])


def test_flamegraph_of_a_time_range(tmp_path, browser):
    """A flame graph with time bins: a range (as bins, or as ns from the process timeline) draws only the stacks of
    those bins, and the top-functions table follows; dragging across the strip picks bins; "whole build" goes back."""
    from pipeline.report.flame import add_bins, build_tree, flame_page

    rows = [(0, "p;a;x", 10), (1, "p;a;y", 20), (2, "p;b;x", 30), (2, "p;a;y", 4), (3, "q;x", 5)]
    stacks: dict[str, int] = {}
    for _, stack, v in rows:
        stacks[stack] = stacks.get(stack, 0) + v
    tree = add_bins(build_tree(sorted(stacks.items())), rows, 4, 1000, 4000)
    page = tmp_path / "flame.html"
    page.write_text(flame_page("t", [], "samples", tree=tree))
    body = drive(page, RANGE % {"hash": "range=1-3", "drag_from": "0.1", "drag_to": "0.3"}, browser)
    assert body["whole"] == "69|x=45"
    assert body["picked"] == "54|x=30|1-3"                 # bins 1 and 2: y 24, x 30
    assert body["dragged"] == "0-2|#range=0-2|30"           # bins 0 and 1: x 10, y 20
    assert body["all"] == "69|none"
    body = drive(page, RANGE % {"hash": "t=2000-3500", "drag_from": "0.9", "drag_to": "0.6"}, browser)
    assert body["picked"] == "54|x=30|1-3"                 # 2000-3500 ns: bins 1 to 2.5, drawn whole
    assert body["dragged"].startswith("2-4|#range=2-4|39")


def test_report_flamegraph_follows_a_time_range(report_run, tmp_path, browser):
    """The CPU flame graph of the report: the samples of a range of bins are exactly those of
    cpu_folded_over_time in it."""
    rows = read_table(report_run, "aggregated", "cpu_folded_over_time").to_pylist()
    want = sum(r["samples"] for r in rows if 100 <= r["bin"] < 250)
    body = drive(report_run / "report" / "flamegraph_cpu.html",
                 RANGE % {"hash": "range=100-250", "drag_from": "0.5", "drag_to": "0.7"}, browser)
    assert body["picked"].split("|")[0] == str(want) and body["picked"].endswith("|100-250")
    assert body["whole"].split("|")[0] == str(sum(r["samples"] for r in rows))
    picked, hash_, shown = body["dragged"].split("|")
    b0, b1 = map(int, picked.split("-"))
    assert 240 <= b0 <= 260 and 340 <= b1 <= 360 and hash_ == f"#range={picked}"
    assert shown == str(sum(r["samples"] for r in rows if b0 <= r["bin"] < b1))


TIMELINE = """<script>
window.addEventListener("load", function () {
  const svg = document.querySelector("svg.timeline"), out = document.body.dataset;
  out.before = svg.dataset.visible;
  const fold = svg.querySelector('g.proc[data-key="%(key)s"] text.fold');
  fold.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  out.folded = svg.dataset.visible + "|" + fold.textContent.slice(0, 1);
  fold.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  out.unfolded = svg.dataset.visible;
  const r = svg.getBoundingClientRect(), label = +svg.dataset.label, width = +svg.getAttribute("width");
  const at = (f) => ({clientX: r.left + (label + f * (width - label)) * r.width / width, clientY: r.top + 20, bubbles: true});
  svg.dispatchEvent(new MouseEvent("mousedown", at(0.25)));
  window.dispatchEvent(new MouseEvent("mouseup", at(0.5)));
  out.view = svg.dataset.view + "|" + document.getElementById("cpu-flame").getAttribute("src");
  document.querySelector(".timeline-reset").dispatchEvent(new MouseEvent("click", {bubbles: true}));
  out.reset = svg.dataset.view + "|" + document.getElementById("cpu-flame").getAttribute("src");
});
</script>
</body>"""


def test_process_timeline_folds_and_zooms(report_run, tmp_path, browser):
    """The report's process timeline: folding a cargo hides its descendants; dragging across a quarter of the
    build zooms there and points the CPU flame graph at that time; "whole build" undoes both."""
    procs = read_table(report_run, "aggregated", "process_tree").to_pylist()
    cargo = min((r for r in procs if r["image_name"] == "cargo.exe"), key=lambda r: r["start_ns"])
    kids: dict = {}
    for r in procs:
        kids.setdefault(r["parent_key"], []).append(r["process_key"])
    todo, below = list(kids.get(cargo["process_key"], [])), 0
    while todo:
        below += 1
        todo.extend(kids.get(todo.pop(), []))
    body = drive(report_run / "report" / "index.html", TIMELINE % {"key": cargo["process_key"]}, browser)
    shown = sum(1 for r in procs if r["first_seen_ns"] is not None)
    assert body["before"] == str(shown) and body["unfolded"] == str(shown)
    assert body["folded"] == f"{shown - below}|\u25b8" and below > 10
    t0 = min(min(r["start_ns"] if r["start_ns"] is not None else r["first_seen_ns"], r["first_seen_ns"])
             for r in procs if r["first_seen_ns"] is not None)
    t1 = max(max(r["end_ns"] if r["end_ns"] is not None else r["last_seen_ns"], r["last_seen_ns"])
             for r in procs if r["first_seen_ns"] is not None)
    view, src = body["view"].split("|")
    a, b = map(int, view.split("-"))
    assert abs(a - (t0 + (t1 - t0) / 4)) < (t1 - t0) / 500 and abs(b - (t0 + (t1 - t0) / 2)) < (t1 - t0) / 500
    assert src == f"flamegraph_cpu.html#t={a}-{b}"
    assert body["reset"] == f"{t0}-{t1}|flamegraph_cpu.html"


def test_every_etl_report_page_loads_without_errors(report_run, tmp_path, browser):
    """Every page of an ETL run's report over the DevTools protocol: no exception, console error or failed load;
    a full-page screenshot of each is kept in ARTIFACTS/report-etl/."""
    found = pages_without_errors(browser, report_run / "report", "report-etl")
    assert {"index.html", "flamegraph_cpu.html", "flamegraph_commit.html", "commit_tree.html", "heap_snapshots.html",
            "process_tree.html"} <= set(found)
    assert {name: errors for name, errors in found.items() if errors} == {}
    assert all((ARTIFACTS / "report-etl" / f"{n[:-5]}.png").stat().st_size > 1000 for n in found)


#: Picks a range of the build on index.html (as the timeline does) and keeps, per table class, the rows shown before,
#: in the range and after "whole build" (cells joined by "~", rows by newlines), and the range's notes (``drive``
#: returns them as CLASS, CLASS-before, CLASS-note and CLASS-whole).
INDEX_RANGE = """<script>
window.addEventListener("load", function () {
  const out = document.body.dataset, classes = %(classes)s;
  const key = (c) => c.replace(/-(.)/g, (_, x) => x.toUpperCase());
  const rows = (cls) => [...document.querySelectorAll("table." + cls + " tbody tr")].filter((r) => r.style.display !== "none")
                        .map((r) => [...r.cells].map((c) => c.textContent).join("~")).join("\\n");
  for (const c of classes) out[key(c) + "Before"] = rows(c);
  window.dispatchEvent(new CustomEvent("bootprof:range", {detail: [%(a)d, %(b)d]}));
  for (const c of classes) {
    out[key(c)] = rows(c);
    out[key(c) + "Note"] = document.querySelector(`p.range-note[data-for="${c}"]`).textContent;
  }
  const bar = () => document.querySelector("#range-bar button").hidden + "|" + location.hash + "|" + document.querySelector("#range-bar").textContent;
  out.bar = bar();
  out.links = [...document.querySelectorAll("a[data-range], iframe.flame")].map((e) => e.getAttribute("href") || e.getAttribute("src")).join(" ");
  document.querySelector("#range-bar button").click();
  for (const c of classes) out[key(c) + "Whole"] = rows(c);
  out.barWhole = bar();
});
</script></body>"""


def index_in_range(run, classes: list[str], browser, bins: tuple[int, int] = (30, 55)) -> tuple[dict, tuple]:
    """Drive INDEX_RANGE on the report of ``run`` with a range inside the index tables' bins ``bins`` (of 100):
    (what the page showed, (the range's first and end bin of the aggregate's 500, its ns))."""
    from pipeline.runs import read_manifest

    tb = read_manifest(run, "aggregated")["sections"]["cpu"]["time_bins"]
    a = tb["t0_ns"] + tb["span_ns"] * (bins[0] + 0.5) / 100
    b = tb["t0_ns"] + tb["span_ns"] * (bins[1] - 0.5) / 100
    body = drive(run / "report" / "index.html", INDEX_RANGE % {"classes": json.dumps(classes), "a": a, "b": b}, browser)
    return body, (bins[0] * 5, bins[1] * 5, int(a), int(b))


def ranked(rows: list[dict], value, keep=lambda r: True, limit: int = 50) -> list[dict]:
    """What a following table shows in a range: the rows kept, largest ``value`` first (ties: the written order)."""
    kept = [(i, r) for i, r in enumerate(rows) if keep(r)]
    return [r for _, r in sorted(kept, key=lambda p: (-value(p[1]), p[0]))][:limit]


def test_index_tables_follow_a_time_range(report_run, browser):
    """A range picked on the process timeline recounts the CPU, process and memory tables of index.html from the
    time bins of the aggregate stage: per table the rows, their order and their numbers equal those computed here
    from cpu_over_time, cpu_functions_over_time and the lifetimes; "whole build" puts every table back."""
    from collections import defaultdict

    from pipeline.report.processes import tree_order

    classes = ["cpu-functions", "cpu-inclusive", "cpu-processes", "cpu-crates", "cpu-modules", "proc-top",
               "build-processes", "commit-processes", "heap-snapshots"]
    body, (b0, b1, a, b) = index_in_range(report_run, classes, browser)
    inside = lambda bin_: b0 <= bin_ < b1  # noqa: E731
    alive = lambda r: (r["start_ns"] is None or r["start_ns"] <= b) and (r["end_ns"] is None or r["end_ns"] >= a)  # noqa: E731
    shown = lambda c: [line.split("~") for line in body[c].splitlines()]  # noqa: E731

    per_proc = defaultdict(int)
    for r in read_table(report_run, "aggregated", "cpu_over_time").to_pylist():
        if inside(r["bin"]):
            per_proc[r["process_key"]] += r["samples"]
    everything = sum(per_proc.values())
    procs = read_table(report_run, "aggregated", "cpu_by_process").to_pylist()
    want = ranked(procs, lambda r: per_proc[r["process_key"]], lambda r: per_proc[r["process_key"]] > 0)
    assert [(c[0], c[3], c[4]) for c in shown("cpu-processes")] == [
        (str(r["pid"]), f"{per_proc[r['process_key']]:,}", f"{100 * per_proc[r['process_key']] / everything:.2f}%") for r in want]
    assert 10 < len(want) < len(procs)

    fn_self, fn_incl = defaultdict(int), defaultdict(int)
    for r in read_table(report_run, "aggregated", "cpu_functions_over_time").to_pylist():
        if inside(r["bin"]):
            fn_self[(r["module"], r["function"], r["raw_name"])] += r["self_samples"]
            fn_incl[(r["module"], r["function"], r["raw_name"])] += r["inclusive_samples"]
    functions = read_table(report_run, "aggregated", "cpu_by_function").to_pylist()
    k = lambda r: (r["module"], r["function"], r["raw_name"])  # noqa: E731
    for cls, value, order in (("cpu-functions", fn_self, functions),
                              ("cpu-inclusive", fn_incl, sorted(functions, key=lambda r: (-r["inclusive_samples"], r["module"] or "", r["function"])))):
        want = ranked(order, lambda r: value[k(r)], lambda r: fn_self[k(r)] or fn_incl[k(r)])
        assert [(c[1], c[2], c[4]) for c in shown(cls)] == [(r["function"], f"{fn_self[k(r)]:,}", f"{fn_incl[k(r)]:,}") for r in want], cls
    assert sum(fn_self.values()) == everything

    # (a crate's rows apart by the stage of the compiler and the target, from the command line)
    from pipeline.report.cpu import crates_by_stage
    from pipeline.report.processes import STAGE, TARGET

    def apart(r):
        cmd = r["command_line"] or ""
        return (r["crate"], STAGE.search(cmd).group(1), TARGET.search(cmd).group(1))

    crates = defaultdict(lambda: [0, 0])
    for r in procs:
        if r["crate"] is not None and per_proc[r["process_key"]]:
            crates[apart(r)][0] += 1
            crates[apart(r)][1] += per_proc[r["process_key"]]
    key = lambda r: (r["crate"], r["stage"], r["target"])  # noqa: E731
    written = crates_by_stage(procs, everything)
    assert len({r["crate"] for r in written}) < len(written)          # (crates built by stage0 and by stage1)
    want = ranked(written, lambda r: crates[key(r)][1], lambda r: crates[key(r)][1] > 0)
    assert [c[:5] for c in shown("cpu-crates")] == [[*key(r), str(crates[key(r)][0]), f"{crates[key(r)][1]:,}"]
                                                    for r in want]

    tree = read_table(report_run, "aggregated", "process_tree").to_pylist()
    kids = defaultdict(list)
    for r in tree:
        kids[r["parent_key"]].append(r["process_key"])
    subtree = {}
    for r, _ in reversed(tree_order(tree)):
        subtree[r["process_key"]] = per_proc[r["process_key"]] + sum(subtree[c] for c in kids[r["process_key"]])
    want = ranked(sorted(tree, key=lambda r: -(r["samples"] or 0)), lambda r: per_proc[r["process_key"]], alive)
    assert [(c[0], c[4], c[5]) for c in shown("proc-top")] == [
        (str(r["pid"]), f"{per_proc[r['process_key']]:,}", f"{subtree[r['process_key']]:,}") for r in want]
    rustc = [r for r in tree if r["crate"]]
    assert sorted(c[7] for c in shown("build-processes")) == sorted(str(r["pid"]) for r in rustc if alive(r))
    assert len(shown("build-processes")) < len(rustc)

    snaps = read_table(report_run, "aggregated", "heap_snapshots_summary").to_pylist()
    assert [(c[0], c[3]) for c in shown("heap-snapshots")] == [
        (str(r["pid"]), str(r["instance"])) for r in snaps if a <= r["timestamp_ns"] <= b][:50]
    lifetimes = {r["process_key"]: r for r in tree}
    commit = read_table(report_run, "aggregated", "commit_by_process").to_pylist()
    assert [c[0] for c in shown("commit-processes")] == [
        str(r["pid"]) for r in commit if alive(lifetimes[r["process_key"]])][:50]

    assert "(whole bins of" in body["cpu-functions-note"] and "whole life" in body["heap-snapshots-note"]
    assert body["bar"].startswith(f"false|#t={a}-{b}|Showing {a / 1e9:.2f} s to {b / 1e9:.2f} s of the trace")
    assert body["bar-whole"].startswith("true||The whole build. Drag across the process timeline")
    assert body["links"] == " ".join(f"{page}#t={a}-{b}" for page in (
        "flamegraph_cpu.html", "flamegraph_cpu.html", "flamegraph_commit.html", "heap_snapshots.html"))
    for c in classes:
        assert body[c + "-whole"] == body[c + "-before"], c
    assert len(shown("cpu-functions")) == 50 or len(functions) < 50


def _pid_section(ctx):
    import os

    from pipeline.report import Section

    return Section("pid", "pid", str(os.getpid()), summary={"pool": ctx.pool is not None})


def _other_pid_section(ctx):
    return _pid_section(ctx)


def test_sections_in_process_run_apart_and_keep_their_order(tmp_path, monkeypatch):
    """``IN_PROCESS`` sections run in processes of their own, without the pool, and come back in
    ``SECTIONS`` order among those that ran here."""
    import os

    from pipeline import report
    from pipeline.cluster import Pool
    from pipeline.config import load_config
    from pipeline.runs import StageOutput

    from pipeline.report import stage

    monkeypatch.setattr(stage, "APART_MIN_CORES", 1)     # (apart on any machine, for this test)
    monkeypatch.setattr(stage, "SECTIONS", [_pid_section, _other_pid_section, _pid_section])
    monkeypatch.setattr(stage, "IN_PROCESS", (_other_pid_section,))
    ctx = report.Context(tmp_path, load_config(None), Pool(None), StageOutput(tmp_path, "report", tmp_path))
    first, apart, last = report.run_sections(ctx)
    assert first.html == last.html == str(os.getpid()) != apart.html
    assert first.summary == {"pool": True} and apart.summary == {"pool": False}
    # A run of inputs small enough to decode in one process: no fork server is started for its sections.
    from pipeline.runs import stage_output

    with stage_output(tmp_path, "decoded", inputs=[{"path": "small.etl", "size": 1000, "sha256_tree": "0"}]):
        pass
    assert {s.html for s in report.run_sections(ctx)} == {str(os.getpid())}


SUMMARY = """<script>
(function () {
  const out = document.body.dataset, s = document.getElementById("summary");
  const card = (k) => s.querySelector(`.card[data-key="${k}"] .v`).textContent;
  out.wall = card("wall time"); out.cpu = card("CPU time"); out.procs = card("rustc processes");
  out.crates = [...s.querySelectorAll("table.crates-wall tbody tr")].map((r) => [...r.cells].map((c) => c.textContent).join("~")).join("|");
  out.cardsTop = Math.round(s.querySelector(".cards").getBoundingClientRect().top);
  out.chartBottom = Math.round(s.querySelector("svg.concurrency").getBoundingClientRect().bottom);
  out.sysconfigTop = Math.round(document.getElementById("sysconfig").getBoundingClientRect().top);
  const svg = s.querySelector("svg.concurrency"), r = svg.getBoundingClientRect();
  const at = (f) => ({clientX: r.left + (+svg.dataset.left + f * +svg.dataset.plot) * r.width / +svg.getAttribute("width"),
                      clientY: r.top + r.height / 2, bubbles: true});
  svg.dispatchEvent(new MouseEvent("mousedown", at(0.2)));
  window.dispatchEvent(new MouseEvent("mousemove", at(0.5)));
  window.dispatchEvent(new MouseEvent("mouseup", at(0.5)));
  out.picked = svg.dataset.pick; out.range = document.body.dataset.range;
  out.view = document.querySelector("svg.timeline").dataset.view;
})();
</script></body>"""


def test_the_summary_opens_the_report_with_the_answers(report_run, browser):
    """The first screen (1400 x 900) shows the summary, not the configuration tables: wall time, CPU time and rustc
    processes equal those computed here from the aggregated tables, and so do the crates that took the longest
    (with their stage); dragging across the concurrency chart picks the range the process timeline then shows. A
    screenshot of the first screen is kept (``ARTIFACTS/report-summary``)."""
    from collections import defaultdict

    from pipeline.report.processes import STAGE
    from pipeline.report.queries import fmt_duration

    tree = read_table(report_run, "aggregated", "process_tree").to_pylist()
    rustc = [r for r in tree if r["crate"] and r["start_ns"] is not None and r["end_ns"] is not None]
    wall = max(r["end_ns"] for r in rustc) - min(r["start_ns"] for r in rustc)
    samples = sum(r["samples"] for r in read_table(report_run, "aggregated", "cpu_by_process").to_pylist()
                  if r["pid"] != 0)
    by_crate = defaultdict(int)
    for r in rustc:
        m = STAGE.search(r["command_line"] or "")
        by_crate[(r["crate"], m.group(1) if m else "")] += r["end_ns"] - r["start_ns"]
    top = sorted(by_crate.items(), key=lambda kv: -kv[1])[:5]

    page = report_run / "report" / "index.html"
    driven = page.with_name("driven-summary.html")
    driven.write_text(page.read_text().replace("</body>", SUMMARY))
    shot = ARTIFACTS / "report-summary" / "first-screen.png"
    try:
        dom = browser.dump_dom(driven.as_uri(), window=(1400, 900))
        browser.dump_dom(page.as_uri(), window=(1400, 900), screenshot=shot)
    finally:
        driven.unlink()
    body = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', re.search(r"<body[^>]*>", dom).group(0)))
    assert body["wall"] == fmt_duration(wall) and body["cpu"] == fmt_duration(samples * 1_000_000)
    assert body["procs"] == f"{len(rustc):,}"
    assert body["crates"].split("|") == [f"{c}~{s}~{fmt_duration(v)}" for (c, s), v in top]
    assert {s for (_, s), _ in top} <= {"stage0", "stage1"}
    assert int(body["cards-top"]) < 300 and int(body["chart-bottom"]) <= 900 < int(body["sysconfig-top"])
    assert body["picked"] and body["range"] == body["picked"] == body["view"], body
    assert shot.stat().st_size > 10_000


def test_the_concurrency_chart_counts_every_process_and_sample_once(report_run):
    """Per time bin, running rustc processes (a process alive half a bin counts a half) and busy CPUs (samples at
    1 kHz, the Idle process left out): over all bins they add up to the rustc processes' wall time and to the
    samples."""
    from pipeline.config import Config
    from pipeline.report.base import Context
    from pipeline.report.summary import SAMPLE_NS, concurrency

    c = concurrency(Context(report_run, Config(), None, None))
    width = (c["t1"] - c["t0"]) / len(c["running"])
    tree = read_table(report_run, "aggregated", "process_tree").to_pylist()
    alive = sum(r["end_ns"] - r["start_ns"] for r in tree if r["crate"] and r["end_ns"] is not None)
    assert sum(c["running"]) * width == pytest.approx(alive, rel=1e-9)
    cpu = read_table(report_run, "aggregated", "cpu_over_time").to_pylist()
    inside = sum(r["samples"] for r in cpu if r["pid"] != 0 and c["t0"] <= r["t_ns"] and r["t_ns"] + r["bin_ns"] <= c["t1"])
    assert inside > 0 and sum(c["busy"]) * width / SAMPLE_NS >= inside * (1 - 1e-9)


def test_the_critical_path_equals_the_synthesizers_truth(report_run):
    """The synthesized build has a dependency graph (each rustc's ``--extern`` names crates of its phase that ended
    before it): the chain from the rustc that ended last back through the dependency each waited for is the
    truth's, in the summary's table and marked on the process timeline."""
    from pipeline.config import Config
    from pipeline.report.base import Context
    from pipeline.report.summary import facts

    truth = json.loads((report_run.parent / "input" / "trace.truth.json").read_text())["critical_path"]
    got = facts(Context(report_run, Config(), None, None))["critical"]
    assert len(truth) >= 3
    assert [(c["crate"], c["stage"], c["pid"]) for c in got] == [(c["crate"], c["stage"], c["pid"]) for c in truth]
    assert [c["wall_ns"] for c in got] == [c["end_ns"] - c["start_ns"] for c in truth]
    assert [c["wait_ns"] for c in got[1:]] == [b["start_ns"] - a["end_ns"] for a, b in zip(truth, truth[1:])]
    index = (report_run / "report" / "index.html").read_text()
    table = index[index.index('class="top critical"'):]
    assert re.findall(r'<tr><td class="txt">([^<]*)</td>', table[:table.index("</table>")]) == [c["crate"] for c in truth]
    marked = re.findall(r'<g class="proc critical" data-key="[^"]*" data-parent="[^"]*" data-start="[^"]*" '
                        r'data-end="[^"]*" data-row="[^"]*" data-pid="(\d+)"', index)
    assert sorted(map(int, marked)) == sorted(c["pid"] for c in truth)


TABLE_VIEWS = """<script>
(function () {
  const out = document.body.dataset;
  const t = document.querySelector("table.build-processes");
  const sel = t.parentNode.querySelector("select.group-by");
  sel.value = [...sel.options].find((o) => o.textContent === "group by stage").value;
  sel.dispatchEvent(new Event("change"));
  out.groups = [...t.querySelectorAll("tr.group-row")].map((r) => r.textContent).join("|");
  out.grouped = [...t.tBodies[0].rows].map((r) => r.classList.contains("group-row") ? "#" : r.cells[2].textContent).join(",");
  const crates = document.querySelector("table.cpu-crates");
  out.crates = [...crates.tBodies[0].rows].map((r) => [...r.cells].slice(0, 2).map((c) => c.textContent).join("~")).join("|");
  const cmd = [...document.querySelectorAll("table.build-processes td.cmd")].find((c) => c.textContent.length > 200);
  const before = cmd.getBoundingClientRect().height;
  cmd.click();
  out.opened = String(cmd.getBoundingClientRect().height > 2 * before);
  const long = [...document.querySelectorAll("main table")].find((x) => x.dataset.short === "1");
  out.short = long.dataset.shown + "/" + long.tBodies[0].rows.length;
  long.nextElementSibling.click();
  out.all = long.dataset.shown;
})();
</script></body>"""


def test_stages_apart_command_lines_on_one_line_and_long_tables_short(report_run, tmp_path, browser):
    """The build processes group by stage (a header row per stage, with its count); the CPU crates are apart by
    stage (a crate built by stage0 and by stage1 is two rows); a command line is one line until clicked; a table of
    more than 20 rows shows 15 until "show all"."""
    from collections import Counter

    from pipeline.report.processes import STAGE

    body = drive(report_run / "report" / "index.html", TABLE_VIEWS, browser)
    tree = read_table(report_run, "aggregated", "process_tree").to_pylist()
    stages = Counter(STAGE.search(r["command_line"]).group(1) for r in tree if r["crate"])
    assert sorted(body["groups"].split("|")) == sorted(f"{s} \u00b7 {n} rows" for s, n in stages.items())
    runs = []
    for cell in body["grouped"].split(","):
        if cell == "#":
            runs.append([])
        else:
            runs[-1].append(cell)
    assert [len(set(r)) for r in runs] == [1] * len(stages)           # (each group holds rows of its stage only)
    crates = [tuple(x.split("~")) for x in body["crates"].split("|")]
    assert len(crates) == len(set(crates)) and Counter(c for c, _ in crates).most_common(1)[0][1] == 2
    assert body["opened"] == "true"
    shown, rows = map(int, body["short"].split("/"))
    assert shown == 15 and rows > 20 and int(body["all"]) == rows


def test_the_report_command_says_each_section_in_one_short_line(report_run):
    """``bootprof report`` prints a line per section with its numbers (the summary's rows and lists stay in the
    manifest and the page): no line grows with the build."""
    from pipeline.report.cli import shown
    from pipeline.runs import read_manifest

    sections = read_manifest(report_run, "report")["sections"]
    lines = {s: shown({k: v for k, v in counts.items() if k != "files"}) for s, counts in sections.items()}
    assert "wall " in lines["summary"] and "cpu samples " in lines["summary"]
    assert all(len(line) < 160 and "{" not in line and "[" not in line for line in lines.values()), lines
