"""Hostile names and places: trace-derived text that is markup, script or a spreadsheet formula, and run
directories whose names are SQL quotes or glob patterns. The whole pipeline runs on them for real; the pages
are loaded in headless Chromium."""

from __future__ import annotations

import csv
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.cluster import Pool
from pipeline.runs import read_table, table_path
from tests.helpers.runs import etl_config
from tests.synth_traces import VARIANTS

HOSTILE_IMAGE = "<!--<script>rustc.exe"
HOSTILE_COMMAND = '=HYPERLINK("http://127.0.0.1/x","y") --crate-name </script><script>alert(1)</script>'


def test_a_run_named_like_sql_and_globs_with_hostile_process_names(tmp_path, browser):
    """A run directory named ``dec'q [1]*`` goes through every stage (it once failed with a traceback: the path
    was pasted into SQL and read as a pattern). A process whose image name opens an HTML comment and a script,
    and whose command line is a formula and closes a script, is shown as text: the flame graph still draws
    (``<!--<script>`` inside its inline data once blanked every flame page), its frame title holds the name,
    and the CSV cell starts with a quote."""
    from pipeline import aggregate, decode, report, symbolize, synth, warehouse

    trace = tmp_path / "input" / "trace.etl"
    synth.run(trace, VARIANTS["plain64"])
    run = tmp_path / "dec'q [1]*" / "run"
    config = etl_config(trace, tmp_path)
    config.cluster.mode = "synchronous"
    config.warehouse.path = str(tmp_path / "wh'[x].duckdb")
    decode.run(run, config, Pool(None), inputs=[trace])
    # one rustc process gets hostile text in the decoded table, as a trace could carry it
    path = table_path(run, "decoded", "processes")
    procs = pq.read_table(path).to_pylist()
    victim = next(p for p in procs if p["image_name"] == "rustc.exe")
    victim["image_name"], victim["command_line"] = HOSTILE_IMAGE, HOSTILE_COMMAND
    pq.write_table(pa.Table.from_pylist(procs, schema=pq.read_schema(path)), path)
    symbolize.run(run, config, Pool(None))
    aggregate.run(run, config, Pool(None))
    report.run(run, config, Pool(None))
    warehouse.run(run, config, Pool(None))

    page = run / "report" / "flamegraph_cpu.html"
    text = page.read_text()
    data = text[text.index('id="flame-data">') + 16:text.index("</script>", text.index('id="flame-data">'))]
    assert "<" not in data and any(n.startswith(HOSTILE_IMAGE) for n in json.loads(data)["names"])
    dom = browser.dump_dom(page.as_uri())
    frames = re.findall(r'<g class="frame"[^>]*><title>([^<]*)', dom)
    assert len(frames) > 10, "the flame graph drew nothing"
    assert any(t.startswith("&lt;!--&lt;script&gt;rustc.exe") for t in frames)
    index = (run / "report" / "index.html").read_text()
    assert HOSTILE_IMAGE not in index and "&lt;!--&lt;script&gt;rustc.exe" in index
    assert "<script>alert(1)" not in index
    with open(run / "report" / "cpu_by_process.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = [r["command_line"] for r in rows if r["image_name"] == HOSTILE_IMAGE]
    assert cells == ["'" + HOSTILE_COMMAND]
    negative = [r for r in rows if r["pid"].startswith("-")]
    assert all(not r["pid"].startswith("'") for r in negative)      # numbers are never prefixed
    assert read_table(run, "aggregated", "cpu_by_process").num_rows == len(rows)


def test_inline_json_escapes_what_ends_or_opens_markup():
    from pipeline.report.safe import inline_json

    hostile = ["</script><script>x</script>", "<!--<script>", "a\u2028b\u2029c", "&amp;", "é"]
    text = inline_json({"names": hostile})
    assert not re.search(r"[<>&\u2028\u2029]", text)
    assert json.loads(text) == {"names": hostile}
