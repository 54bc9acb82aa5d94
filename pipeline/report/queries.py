"""Query section of the report: rustc self-profile views.

Applies when ``aggregated/`` holds ``query_summary``. Writes into ``RUN_DIR/report/``:

* ``profile_queries.counts.txt``: ``label,count,duration_seconds`` of every query and every timed
  pass (generic activity) of the build (count = executions, duration = inclusive time), sorted by
  duration: the old ``-Z profile-queries`` counts file, which listed "each provider (or timed pass)";
* ``query_summary.txt`` / ``query_summary.html``: measureme ``summarize``-style tables for the whole
  build and for each crate, then the artifact sizes;
* ``profile_queries.html`` (+ ``profile_queries/trace-<file_id>.js``): the nested trace view, one
  process at a time, loaded on demand and rendered lazily;
* ``chrome_trace.json``: interval events of every process in Chrome trace format, like
  ``crox --dir``;
* ``query_stacks.folded``: folded stacks (``crate;label;label self_ns``) for flamegraph tools.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

from pipeline.mirror import placed_by
from pipeline.runs import atomic_write_text
from pipeline.stages import AGGREGATED, DECODED

EVENTS_STAGE, AGG_STAGE = DECODED, AGGREGATED
#: measureme string ids up to this are virtual: for queries, rustc's DepNodeIndex of the invocation.
MAX_VIRTUAL_STRING_ID = 100_000_000
#: rustc's own self-profiler cost: it allocates the query strings at the end of the session.
PROFILER_OVERHEAD = "self_profile_alloc_query_strings"
TRACE_DIR = "profile_queries"

#: summarize's optional columns: shown only when some row has a non-zero value.
OPTIONAL = [("cache_hits", "Cache hits", False), ("blocked_ns", "Blocked time", True),
            ("incr_load_ns", "Incremental load time", True),
            ("incr_hashing_ns", "Incremental result hashing time", True)]


# ----------------------------------------------------------------------------------------------
# Number formats (Rust's Debug for Duration, which summarize prints)


def _decimal(ns: int, unit: int, precision: int | None) -> str:
    whole, frac = divmod(ns, unit)
    if precision is None:  # {:?}: every digit, trailing zeros dropped
        digits = len(str(unit)) - 1
        text = str(frac).rjust(digits, "0").rstrip("0") if digits else ""
        return f"{whole}.{text}" if text else str(whole)
    scale = 10 ** precision
    q, r = divmod(frac * scale, unit)
    if 2 * r >= unit:  # round half up on the next digit
        q += 1
        if q == scale:
            whole, q = whole + 1, 0
    return f"{whole}.{str(q).rjust(precision, '0')}" if precision else str(whole)


def fmt_duration(ns: int, precision: int | None = 2) -> str:
    """Rust ``{:.2?}`` (default) or ``{:?}`` (precision None) of a Duration of ``ns`` nanoseconds."""
    ns = int(ns)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    for unit, suffix in ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs")):
        if ns >= unit:
            return sign + _decimal(ns, unit, precision) + suffix
    return sign + (f"{ns}.{'0' * precision}ns" if precision else f"{ns}ns")


# ----------------------------------------------------------------------------------------------
# Text and HTML tables


def summary_columns(rows: list[dict]) -> list[tuple[str, str, bool]]:
    """(key, title, is_duration) of the columns summarize would print for these rows."""
    cols = [("label", "Item", False), ("self_ns", "Self time", True), ("pct_total", "% of total time", False),
            ("time_ns", "Time", True), ("invocations", "Item count", False)]
    return cols + [c for c in OPTIONAL if any(r[c[0]] for r in rows)]


def cell(row: dict, key: str, is_duration: bool) -> str:
    value = row[key]
    if is_duration:
        return fmt_duration(value)
    if key == "pct_total":
        return f"{value or 0:.3f}"
    return str(value)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """A prettytable-like box (title row, no separators between rows)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line]) + "\n"


def summarize_text(rows: list[dict], total_ns: int, artifacts: list[dict]) -> str:
    cols = summary_columns(rows)
    longest = max((len(r["label"]) for r in rows), default=0)
    body = []
    for r in rows:
        cells = [cell(r, k, d) for k, _, d in cols]
        cells[0] = r["label"] + " " + "." * (longest - len(r["label"]))
        body.append(cells)
    out = text_table([t for _, t, _ in cols], body)
    out += f"\nTotal cpu time: {fmt_duration(total_ns, None)}\n\n"
    out += text_table(["Item", "Artifact Size"], [[a["label"], f"{a['bytes']} bytes"] for a in artifacts])
    return out


def html_table(rows: list[dict], cols: list[tuple[str, str, bool]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t, _ in cols)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="{"num" if d or isinstance(r[k], (int, float)) else "txt"}">{html.escape(cell(r, k, d))}</td>'
            for k, _, d in cols) + "</tr>"
        for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def by_scope(rows: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    build = [r for r in rows if r["scope"] == "build"]
    crates: dict[str, list[dict]] = {}
    for r in rows:
        if r["scope"] == "crate":
            crates.setdefault(r["crate"], []).append(r)
    return build, crates


# ----------------------------------------------------------------------------------------------
# Chrome trace and nested trace data, one dask task per decoded part


def _files_meta(ctx) -> dict[int, dict]:
    rows = ctx.read(AGG_STAGE, "self_profile_processes").to_pylist()
    return {r["file_id"]: r for r in rows}


def chrome_origin_ns(files: dict[int, dict]) -> int:
    """The Chrome trace's time zero: the earliest profile start (ns since the Unix epoch). Timestamps after it
    are small enough to be exact in the JSON number a viewer parses as a double."""
    return min((f.get("start_time_ns") or 0 for f in files.values()), default=0)


def micros(ns) -> list[str]:
    """Nanoseconds as exact decimal microseconds (``1234.567``): events keep their order and nesting to the
    nanosecond. Whole microseconds gave 193,810 of 248,914 events of a build zero length, and 624 ended after
    their parent (each start and length cut on its own), which made speedscope fail."""
    return [f"{v // 1000}.{v % 1000:03d}" if v >= 0 else f"-{-v // 1000}.{-v % 1000:03d}" for v in ns.tolist()]


def chrome_events_of_part(part: str, out: str, files: dict[int, dict], min_ns: int = 0) -> str | None:
    """Dask task: write the Chrome trace elements (``ph: X``) of one part's interval events that last
    at least ``min_ns`` to ``out``. Returns ``out``, or None when there are none. Times are microseconds
    after :func:`chrome_origin_ns`, exact to the nanosecond (:func:`micros`)."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(part, columns=["file_id", "thread", "kind", "label", "args", "payload", "start_ns", "end_ns"])
    t = t.filter(pc.equal(t["payload"], "interval"))
    if min_ns:
        t = t.filter(pc.greater_equal(pc.subtract(t["end_ns"], t["start_ns"]), min_ns))
    if t.num_rows == 0:
        return None
    t = t.unify_dictionaries().combine_chunks()
    label, kind = t["label"].chunk(0), t["kind"].chunk(0)
    names = [json.dumps(s) for s in label.dictionary.to_pylist()]
    kinds = [json.dumps(s) for s in kind.dictionary.to_pylist()]
    file_id = t["file_id"].to_numpy()
    base = np.array([files.get(int(f), {}).get("start_time_ns") or 0 for f in range(int(file_id.max()) + 1)],
                    dtype=np.int64)
    pids = np.array([files.get(int(f), {}).get("pid") or 0 for f in range(int(file_id.max()) + 1)], dtype=np.int64)
    start = t["start_ns"].to_numpy()
    ts = micros(base[file_id] - chrome_origin_ns(files) + start)
    dur = micros(t["end_ns"].to_numpy() - start)
    pid = pids[file_id].tolist()
    args = [None if a is None else json.dumps({f"arg{i}": v for i, v in enumerate(a)})
            for a in t["args"].to_pylist()]
    lines = [
        f'{{"name":{names[li]},"cat":{kinds[ki]},"ph":"X","ts":{s},"dur":{d},"pid":{p},"tid":{th},"args":{a or "null"}}}'
        for li, ki, s, d, p, th, a in zip(label.indices.to_pylist(), kind.indices.to_pylist(), ts, dur, pid,
                                           t["thread"].to_pylist(), args)
    ]
    Path(out).write_text(",\n".join(lines), encoding="utf-8")
    return out


def write_chrome_trace(ctx, parts: list[str], files: dict[int, dict]) -> Path:
    path = ctx.out.path / "chrome_trace.json"
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        first = True
        for fid, meta in sorted(files.items()):
            for obj in ({"name": "process_name", "ph": "M", "ts": 0, "tid": 0, "cat": "", "pid": meta["pid"],
                         "args": {"name": meta["crate"]}},
                        {"name": "process_sort_index", "ph": "M", "ts": 0, "tid": 0, "cat": "", "pid": meta["pid"],
                         "args": {"sort_index": ((meta["start_time_ns"] or 0) - chrome_origin_ns(files)) // 1000}}):
                f.write(("" if first else ",\n") + json.dumps(obj))
                first = False
        tmp = ctx.out.path / ".chrome_parts"
        tmp.mkdir()
        outs = [str(tmp / f"{i:05d}.json") for i in range(len(parts))]
        min_ns = ctx.config.report.chrome_trace_min_us * 1000
        ctx.pool.require_shared(tmp, placed_by(ctx.run_dir))     # (the tasks read the parts, write their fragments)
        for fragment in ctx.pool.map(_chrome_task, list(zip(parts, outs)), files=files, min_ns=min_ns):
            if fragment:
                f.write("" if first else ",\n")
                with open(fragment, encoding="utf-8") as src:
                    shutil.copyfileobj(src, f)
                first = False
        f.write("\n]\n")
    shutil.rmtree(tmp)
    return path


def _chrome_task(item: tuple[str, str], files: dict[int, dict], min_ns: int) -> str | None:
    return chrome_events_of_part(item[0], item[1], files, min_ns)


def trace_js_of_part(part: str, out_dir: str, files: dict[int, dict], max_events: int) -> list[dict]:
    """Dask task: ``trace-<file_id>.js`` for each file of one part (intervals and instants).

    When a file has more than ``max_events`` such events, the shortest intervals and all instants
    are left out: an event longer than the cut keeps its parents (they are longer still), so the
    tree stays whole and the time of left-out events shows as their parent's self time.
    """
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(part, columns=["file_id", "thread", "kind", "label", "payload", "start_ns", "end_ns",
                                     "parent", "event_index", "string_id", "value"])
    written = []
    for fid in pc.unique(t["file_id"]).to_pylist():
        ft = t.filter(pc.equal(t["file_id"], fid)).unify_dictionaries().combine_chunks()
        ft = ft.sort_by("event_index")
        payload = ft["payload"].chunk(0)
        pay = np.array(payload.dictionary.to_pylist(), dtype=object)[payload.indices.to_numpy()]
        interval, instant = pay == "interval", pay == "instant"
        start = ft["start_ns"].to_numpy(zero_copy_only=False)
        start = np.where(interval | instant, start, 0).astype(np.int64)
        end = np.where(interval, ft["end_ns"].fill_null(0).to_numpy(), start)
        dur = end - start
        keep = interval | instant
        cut = 0
        if keep.sum() > max_events:
            keep = interval.copy()
            if keep.sum() > max_events:
                cut = int(np.sort(dur[interval])[::-1][max_events - 1])
                keep = interval & (dur >= cut)
                while keep.sum() > max_events:  # many events of exactly the cut length
                    cut += 1
                    keep = interval & (dur >= cut)
        idx = np.nonzero(keep)[0]
        new_index = np.full(ft.num_rows, -1, np.int64)
        new_index[idx] = np.arange(len(idx))
        parent = ft["parent"].to_numpy()[idx]
        parent = np.where(parent >= 0, new_index[np.maximum(parent, 0)], -1)
        label, kind = ft["label"].chunk(0), ft["kind"].chunk(0)
        # (a count without a value, as in a damaged file, counts 0)
        hits = invocation_hits(kind, ft["string_id"].to_numpy(), ft["value"].fill_null(0).to_numpy())[idx]
        meta = files.get(fid, {})
        data = {
            "file_id": fid, "crate": meta.get("crate"), "pid": meta.get("pid"), "total_ns": meta.get("total_ns"),
            "events": int(ft.num_rows), "shown": int(len(idx)), "cut_ns": cut,
            "labels": label.dictionary.to_pylist(), "kinds": kind.dictionary.to_pylist(),
            "start": start[idx].tolist(), "dur": dur[idx].tolist(),
            "label": label.indices.to_numpy()[idx].tolist(), "kind": kind.indices.to_numpy()[idx].tolist(),
            "instant": instant[idx].astype(np.int8).tolist(), "parent": parent.tolist(),
            "thread": ft["thread"].to_numpy()[idx].tolist(), "hits": hits.tolist(),
        }
        name = f"trace-{fid}.js"
        text = "bootprofTrace(" + json.dumps(data, separators=(",", ":")) + ");\n"
        Path(out_dir, name).write_text(text, encoding="utf-8")
        written.append({"file_id": fid, "path": f"{TRACE_DIR}/{name}", "shown": len(idx), "cut_ns": cut})
    return written


def invocation_hits(kind, string_id, value):
    """Cache hits of each Query execution: rustc writes one QueryCacheHitCount per invocation with hits,
    with the invocation's DepNodeIndex (a virtual string id) as event id, the same id as its Query.
    Returns the hits per event (0 for everything but attributable Query events)."""
    import numpy as np

    names = kind.dictionary.to_pylist()
    codes = kind.indices.to_numpy()
    out = np.zeros(len(codes), np.int64)
    if "QueryCacheHitCount" not in names or "Query" not in names:
        return out
    counts = (codes == names.index("QueryCacheHitCount")) & (string_id <= MAX_VIRTUAL_STRING_ID)
    ids, inverse = np.unique(string_id[counts], return_inverse=True)
    # (summed as integers: a float sum loses counts above 2**53 and cannot be cast back when a damaged file
    # holds an absurd one)
    totals = np.zeros(len(ids), np.int64)
    np.add.at(totals, inverse.ravel(), value[counts].astype(np.int64, copy=False))
    query = np.nonzero((codes == names.index("Query")) & (string_id <= MAX_VIRTUAL_STRING_ID))[0]
    # Some invocations share an index (e.g. DepNodeIndex 0): hits of a shared id are not attributed.
    qids, qcount = np.unique(string_id[query], return_counts=True)
    query = query[np.isin(string_id[query], qids[qcount == 1])]
    pos = np.searchsorted(ids, string_id[query])
    found = pos < len(ids)
    found[found] = ids[pos[found]] == string_id[query][found]
    out[query[found]] = totals[pos[found]]
    return out


def profile_queries_page(ctx, files: dict[int, dict], traces: list[dict]) -> str:
    from pipeline.report.base import page

    info = {t["file_id"]: t for t in traces}
    rows = []
    for fid, meta in sorted(files.items(), key=lambda kv: -(kv[1]["total_ns"] or 0)):
        tr = info.get(fid)
        if tr is None:
            continue
        cut = f" (events &lt; {fmt_duration(tr['cut_ns'])} left out)" if tr["cut_ns"] else ""
        rows.append(f'<tr><td class="txt"><a href="#file={fid}">{html.escape(meta["crate"] or "?")}</a></td>'
                    f'<td class="num">{meta["pid"]}</td><td class="num">{fmt_duration(meta["total_ns"] or 0)}</td>'
                    f'<td class="num">{meta["events"]}</td><td class="num">{tr["shown"]}{cut}</td></tr>')
    body = f"""<header><h1>profile_queries: nested query trace</h1>
<p class="meta"><a href="index.html">report</a> &middot; boxes are query executions (cache misses) that contain
their children, <span class="legend pass">green boxes</span> are timed passes (generic activities),
dots are cache hits; the percentage is the share of the process's total time. Click a box to open or close
it, <em>zoom</em> to show only its subtree.</p></header>
<main>
<table class="processes"><thead><tr><th>crate</th><th>pid</th><th>total time</th><th>events</th>
<th>shown</th></tr></thead><tbody>{''.join(rows)}</tbody></table>
<div id="controls"><button id="expand-important">open important</button> <button id="collapse-all">close all</button>
<span id="crumbs"></span></div>
<div id="trace" class="trace"><p class="empty">choose a process above</p></div>
</main>
<script src="static/profile_queries.js"></script>"""
    return page("profile_queries", body, head='\n<link rel="stylesheet" href="static/profile_queries.css">')


# ----------------------------------------------------------------------------------------------
# The section


def section(ctx):
    if not ctx.has(AGG_STAGE, "query_summary"):
        return None
    from pipeline.report.base import Section

    top_n = ctx.config.report.top_n
    rows = ctx.read(AGG_STAGE, "query_summary").to_pylist()
    totals = ctx.read(AGG_STAGE, "query_totals").to_pylist()
    artifacts = ctx.read(AGG_STAGE, "artifact_sizes").to_pylist()
    build, crates = by_scope(rows)
    total_of = {(t["scope"], t["crate"]): t["total_ns"] or 0 for t in totals if t["scope"] != "file"}
    art_build = [a for a in artifacts if a["scope"] == "build"]
    written = []

    def write(name: str, text: str) -> None:
        atomic_write_text(ctx.out.path / name, text)
        written.append(name)

    counts = sorted((r for r in build if r["category"] in ("query", "activity")), key=lambda r: (-r["time_ns"], r["label"]))
    write("profile_queries.counts.txt", "label,count,duration_seconds\n" + "".join(
        f"{r['label']},{r['invocations']},{r['time_ns'] / 1e9:.9f}\n" for r in counts))

    text = [f"# whole build ({len(crates)} crates)\n", summarize_text(build, total_of.get(("build", None), 0), art_build)]
    for crate, crows in sorted(crates.items()):
        arts = [a for a in artifacts if a["scope"] == "crate" and a["crate"] == crate]
        text += [f"\n# crate {crate}\n", summarize_text(crows, total_of.get(("crate", crate), 0), arts)]
    write("query_summary.txt", "".join(text))

    cols = summary_columns(build)
    full = [f"<h2>whole build</h2>{html_table(build, cols, 'summary')}"]
    for crate, crows in sorted(crates.items()):
        full.append(f"<h2>crate {html.escape(crate)}</h2>{html_table(crows, summary_columns(crows), 'summary')}")
    from pipeline.report.base import page

    write("query_summary.html", page("query summary", "<main>" + "".join(full) + "</main>"))

    stacks = ctx.read(AGG_STAGE, "query_stacks").to_pylist()
    write("query_stacks.folded", "".join(f"{s['stack']} {s['self_ns']}\n" for s in stacks))

    files = _files_meta(ctx)
    parts = sorted(str(p) for p in (ctx.run_dir / EVENTS_STAGE / "query_events.parquet").rglob("*.parquet"))
    write_chrome_trace(ctx, parts, files)
    written.append("chrome_trace.json")

    trace_dir = ctx.out.path / TRACE_DIR
    trace_dir.mkdir(exist_ok=True)
    traces = [t for r in ctx.pool.map(trace_js_of_part, parts, out_dir=str(trace_dir), files=files,
                                      max_events=ctx.config.report.trace_max_events) for t in r]
    ctx.copy_static("profile_queries.js")
    ctx.copy_static("profile_queries.css")
    write("profile_queries.html", profile_queries_page(ctx, files, traces))

    crate_rows = []
    for crate in sorted(crates):
        procs = [f for f in files.values() if f["crate"] == crate]
        top = max(crates[crate], key=lambda r: r["self_ns"])
        crate_rows.append({"crate": crate, "processes": len(procs), "total": total_of.get(("crate", crate), 0),
                           "events": sum(p["events"] or 0 for p in procs),
                           "top": f"{top['label']} ({fmt_duration(top['self_ns'])})"})
    crate_cols = [("crate", "crate", False), ("processes", "processes", False), ("total", "total time", True),
                  ("events", "events", False), ("top", "largest self time", False)]
    joined = [f for f in files.values() if f.get("etl_match")]
    join_html = ""
    if joined:
        jrows = [{"crate": f["crate"], "pid": f["pid"], "etl_image": f["etl_image"] or "",
                  "etl_pid": f["etl_pid"], "etl_match": f["etl_match"]} for f in joined]
        # (on a page of its own: one row per rustc process was the longest table of index.html)
        from pipeline.report.base import page

        write("self_profiles.html", page("self-profiles and their ETL processes", "<main><h2>Self-profiles matched to "
                                         "ETL processes</h2>" + html_table(jrows, [
            ("crate", "crate", False), ("pid", "pid", False), ("etl_image", "ETL image", False),
            ("etl_pid", "ETL pid", False), ("etl_match", "matched by", False)], "join") + "</main>"))
        join_html = (f"<p class='note'>{len(joined)} of {len(files)} self-profiles matched to their ETL processes "
                     f"(<a href='self_profiles.html'>which</a>).</p>")
    links = " &middot; ".join(f'<a href="{n}">{n}</a>' for n in
                              ["profile_queries.html", "query_summary.html", "query_summary.txt",
                               "profile_queries.counts.txt", "chrome_trace.json", "query_stacks.folded"])
    total_build = total_of.get(("build", None), 0)
    notes = []
    overhead = next((r for r in build if r["label"] == PROFILER_OVERHEAD), None)
    if overhead:
        notes.append(f"profiler overhead (<code>{PROFILER_OVERHEAD}</code>): {fmt_duration(overhead['self_ns'])} "
                     f"self time, {overhead['pct_total'] or 0:.2f}% of the total")
    inputs = ctx.read(EVENTS_STAGE, "self_profiles").to_pylist()
    unknown = sum(f["unknown_events"] or 0 for f in inputs)
    if unknown:
        notes.append(f"{unknown} events with unresolved ids, counted under <code>&lt;unknown&gt;</code>")
    failed = [f for f in inputs if f["status"] != "ok"]
    failed_html = ""
    if failed:
        failed_html = "<h3>Files not decoded</h3>" + html_table(
            [{"path": f["path"], "status": f["status"], "error": f["error"] or ""} for f in failed],
            [("path", "file", False), ("status", "status", False), ("error", "why", False)], "failed")
    body = f"""<p>{len(files)} rustc processes, {len(crates)} crates, total cpu time
<b>{fmt_duration(total_build)}</b> (summed over threads, as measureme's <code>summarize</code>).</p>
{"".join(f"<p class='note'>{n}</p>" for n in notes)}
<p class="links">{links}</p>
<h3>Crates</h3>{html_table(crate_rows, crate_cols, 'crates')}
<h3>Top {min(top_n, len(build))} of {len(build)} labels by self time (whole build)</h3>
{html_table(build[:top_n], cols, 'summary')}
<h3>Artifact sizes</h3>{html_table([{"label": a["label"], "bytes": a["bytes"]} for a in art_build],
                                   [("label", "Item", False), ("bytes", "bytes", False)], 'artifacts')}
{join_html}{failed_html}"""
    return Section("queries", "rustc queries (self-profile)", body, written,
                   {"labels": len(build), "crates": len(crates), "processes": len(files), "traces": len(traces)})
