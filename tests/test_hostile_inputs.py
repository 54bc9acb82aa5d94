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


def test_a_perf_run_whose_mmaps_name_proc_dev_a_fifo_and_no_elf_file_opens_none(tmp_path):
    """A made-up perf.data (``--call-graph dwarf``, so the decode reads its images' call frame information) whose
    rustcs map, where their samples fall, ``/proc/self/environ``, ``/dev/zero`` (which never ends), a FIFO (whose
    open waits for a writer that never comes: a decode that opened it would not end), a 4 GiB file of zeros, a link
    to ``/proc/self/environ``, and a real ELF file (this Python) as the control. The decode, symbolize and the
    copies of ``capture --symbols`` each end, and give each image its reason: none of the five is opened, and the
    control is (it fails only on its made-up build id)."""
    import os
    import subprocess
    import sys

    from pipeline.synth.perf import write_perf
    from tests.conftest import ROOT

    fifo = tmp_path / "libfifo.so"
    os.mkfifo(fifo)
    huge = tmp_path / "libhuge.so"
    with open(huge, "wb") as f:
        f.truncate(4 << 30)         # (sparse: no disk used)
    link = tmp_path / "libenviron.so"
    link.symlink_to("/proc/self/environ")
    python = os.path.realpath(sys.executable)
    expect = {"/proc/self/environ": "under /proc", "/dev/zero": "under /dev", str(fifo): "a FIFO",
              str(huge): "not an ELF file", str(link): "under /proc", python: "build id"}
    data = tmp_path / "perf.data"
    write_perf(data, seed=5, rustcs=len(expect), samples=20, dwarf=True, libraries=tuple(expect))
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "symbolize": {"cache_dir": str(tmp_path / "sc")}}),
                      encoding="utf-8")
    run = tmp_path / "run"

    def bootprof(*args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    bootprof("decode", str(data), "--run", str(run))
    reasons = json.loads((run / "decoded" / "_manifest.json").read_text())["perf"]["dwarf_unwind"]
    assert reasons["images_with_cfi"] == 0
    for name, why in expect.items():
        found = [r for r in reasons["images_without_cfi"] if r.startswith(name + ":") or r.startswith(name + " (")]
        assert len(found) == 1 and why in found[0], (name, reasons["images_without_cfi"])

    bootprof("symbolize", "--run", str(run))
    images = pq.read_table(run / "decoded" / "images.parquet").to_pylist()
    keys = {f"elf-{i['build_id']}": i["file_name"] for i in images if i["file_name"] in expect}
    lookups = {r["key"]: r for r in json.loads((run / "symbolized" / "_manifest.json").read_text())["debug_ids"]}
    for key, name in keys.items():
        assert lookups[key]["status"] == "missing", lookups[key]
        assert (expect[name] if name != python else "build id mismatch") in lookups[key]["reason"], lookups[key]

    proc = subprocess.run([sys.executable, "-c", "import json, sys; from pipeline.capture.elfsymbols import "
                           "collect_elf_symbols as c; print(json.dumps(c(sys.argv[1])))", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["copied"] == [] and not (run / "symbols").exists()
    skipped = {s["name"]: s["reason"] for s in out["skipped"]}
    for name, why in expect.items():
        assert (why if name != python else "replaced since the recording") in skipped[name], (name, skipped)


def test_a_network_path_an_mmap_names_is_not_looked_at():
    """A perf.data's file name that is a UNC path on Windows (``//host/share/x.so``, ``\\\\host\\share``): even a
    stat would reach that server with the user's credentials, so it is refused by its name alone."""
    from pipeline.decode.perf.elfload import image_file

    for name in ("//evil.example/share/libx.so", "\\\\evil.example\\share\\libx.so"):
        found, why = image_file(name)
        assert found is None and "a network path" in why, why
