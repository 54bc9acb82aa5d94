"""Memory section of the report: VirtualAlloc commit flame graph and tables, heap snapshot summaries.

Applies when ``aggregated/`` has ``commit_folded`` or ``heap_snapshots_summary``. Writes
``flamegraph_commit.html`` (bytes committed per stack), ``commit_folded.bytes.txt`` (folded stacks whose values
are bytes: ``flamegraph.pl --countname bytes``) and CSV exports.
"""

from __future__ import annotations

import html

from pipeline.report.flame import STATIC, Writer, binned_tree, count, flame_page, fmt_bytes, fmt_ms, table, tree_page
from pipeline.report.processes import process_name
from pipeline.report.timerange import CANDIDATES, Follow, Pool
from pipeline.runs import read_manifest
from pipeline.stages import AGGREGATED

AGG = AGGREGATED
COMMIT_TABLES = ["commit_by_process", "commit_by_crate", "commit_by_function", "commit_by_code_crate", "commit_by_stack",
                 "commit_over_time"]
HEAP_TABLES = ["heap_snapshots_summary", "heap_snapshot_by_stack", "heap_snapshot_by_function", "heap_snapshot_growth"]


def section(ctx):
    has_commit = ctx.has(AGG, "commit_folded")
    has_heap = ctx.has(AGG, "heap_snapshots_summary")
    if not (has_commit or has_heap):
        return None
    from pipeline.report.base import Section

    top_n = ctx.config.report.top_n
    w = Writer(ctx)
    parts, summary = [], {}
    # (the tables below that follow a picked range keep the rows alive in it: processes, snapshots, growth)
    pool = _pool(ctx)
    lifetimes = ({r["process_key"]: (r["start_ns"], r["end_ns"]) for r in ctx.read(AGG, "process_tree").to_pylist()}
                 if ctx.has(AGG, "process_tree") else {})
    if has_commit:
        folded = [(r["stack"], r["commit_bytes"]) for r in ctx.read(AGG, "commit_folded").to_pylist()]
        tree = binned_tree(ctx, folded, "commit_folded_over_time", "commit_bytes",
                           read_manifest(ctx.run_dir, AGG)["sections"].get("memory", {}).get("commit_time_bins"))
        w.text("flamegraph_commit.html", flame_page("VirtualAlloc commit", folded, "bytes",
                                                    "Width: bytes committed by each stack (over the whole trace, or "
                                                    "by the commits of the range picked on the strip).", tree=tree))
        w.text("commit_folded.bytes.txt", "".join(f"{s} {v}\n" for s, v in folded))
        w.text("commit_tree.html", tree_page("Commit stacks", folded, "bytes",
                                             "Bytes committed by VirtualAlloc, by process, then by call stack from the "
                                             "thread's start: the callers of the most committing code, largest first."))
        for t in COMMIT_TABLES:
            if ctx.has(AGG, t):
                w.csv(AGG, t)
        procs = ctx.read(AGG, "commit_by_process").to_pylist()
        functions = ctx.read(AGG, "commit_by_function").to_pylist()
        by_outstanding = sorted(functions, key=lambda r: (-r["inclusive_outstanding_bytes"], r["module"] or "",
                                                          r["function"]))
        stacks = ctx.read(AGG, "commit_by_stack").to_pylist()
        total = sum(r["commit_bytes"] for r in procs)
        outstanding = sum(r["outstanding_bytes"] for r in procs)
        summary.update(commit_bytes=total, outstanding_bytes=outstanding)
        memory = read_manifest(ctx.run_dir, AGG).get("sections", {}).get("memory", {})
        peak = (f" The commit of all processes together peaked at {fmt_bytes(memory['peak_commit_bytes'])}, at "
                f"{fmt_ms(memory.get('peak_ns'))}." if memory.get("peak_commit_bytes") else "")
        parts.append(f"""<p>{fmt_bytes(total)} committed by VirtualAlloc, {fmt_bytes(outstanding)} still committed at
the end of the trace.{peak} <a href="flamegraph_commit.html" data-range><b>Commit flame graph</b></a> &middot;
<a href="commit_tree.html"><b>Commit stack tree</b></a> (drill down from the keyboard, largest first)</p>
<h3>Peak commit per process</h3>
{table(procs, [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
                       ("peak_commit_bytes", "peak commit", fmt_bytes), ("peak_ns", "peak at", fmt_ms),
                       ("commit_bytes", "committed", fmt_bytes), ("outstanding_bytes", "outstanding at end", fmt_bytes),
                       ("allocs", "commits", count), ("frees", "frees", count)], 'commit-processes',
       Follow(pool, "peak_commit_bytes", alive=[lifetimes.get(r["process_key"]) for r in procs]), top_n)}
{_commit_chart(ctx, w)}
{_crates(ctx, w, top_n)}
<h3>Functions holding the most outstanding commit (inclusive)</h3>
{table(by_outstanding[:top_n], [("module", "module", None), ("function", "function", None),
                                 ("inclusive_outstanding_bytes", "outstanding", fmt_bytes),
                                 ("inclusive_commit_bytes", "committed", fmt_bytes),
                                 ("inclusive_allocs", "commits", count)], 'commit-functions')}
<h3>Stacks that committed the most</h3>
{table(stacks[:top_n], [("stack_id", "stack", None), ("commit_bytes", "committed", fmt_bytes),
                        ("outstanding_bytes", "outstanding", fmt_bytes), ("allocs", "commits", count),
                        ("folded", "frames (root first)", None)], 'commit-stacks')}""")
    if has_heap and ctx.has(AGG, "heap_snapshot_by_function"):
        w.text("heap_snapshots.html", _heap_page(ctx))
    if has_heap:
        for t in HEAP_TABLES:
            if ctx.has(AGG, t):
                w.csv(AGG, t)
        snaps = ctx.read(AGG, "heap_snapshots_summary").to_pylist()
        summary["heap_snapshots"] = len(snaps)
        flame = ""
        if ctx.has(AGG, "heap_folded"):
            folded = [(r["stack"], r["bytes"]) for r in ctx.read(AGG, "heap_folded").to_pylist()]
            w.text("flamegraph_heap.html", flame_page("Heap bytes at each process's largest snapshot", folded, "bytes",
                                                      "Width: busy heap bytes by allocating stack."))
            w.text("heap_folded.bytes.txt", "".join(f"{s} {v}\n" for s, v in folded))
            flame = '<p><a href="flamegraph_heap.html"><b>Heap flame graph</b></a> (largest snapshot of each process)</p>'
        flame += ('<p><a href="heap_snapshots.html" data-range><b>Pick a snapshot, or compare two</b></a> (functions by '
                  'busy bytes, and their growth; with a range picked on the timeline, the snapshots taken in it)</p>') if ctx.has(AGG, "heap_snapshot_by_function") else ""
        parts.append(f"""<h3>Heap snapshots</h3>{flame}
{table(snaps, [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
               ("instance", "snapshot", None), ("timestamp_ns", "time", fmt_ms), ("bytes", "busy", fmt_bytes),
               ("blocks", "blocks", count), ("untracked_bytes", "without stack", fmt_bytes)], 'heap-snapshots',
       Follow(pool, None, alive=[(r["timestamp_ns"], r["timestamp_ns"]) for r in snaps]), top_n)}
{_heap_functions(ctx, w, snaps, top_n, pool)}""")
    body = w.links() + "\n".join(parts) + pool.script()
    w.close()
    return Section("memory", f"Memory ({ctx.recorder()})", body, w.files, summary)


def _crates(ctx, w, top_n: int) -> str:
    if not ctx.has(AGG, "commit_by_crate"):
        return ""
    crates = w.top(AGG, "commit_by_crate", "peak_commit_bytes DESC, crate", top_n)
    return f"""<h3>Commit per compiled crate</h3>
{table(crates, [("crate", "crate", None), ("processes", "rustc processes", count),
                ("peak_commit_bytes", "largest peak", fmt_bytes), ("commit_bytes", "committed", fmt_bytes),
                ("outstanding_bytes", "outstanding at end", fmt_bytes)], 'commit-crates')}"""


def fmt_growth(n: int | None) -> str:
    return "" if n is None else ("+" if n > 0 else "") + fmt_bytes(n)


def _pool(ctx) -> Pool:
    """The memory tables follow a range by lifetimes only; their pool has the commit bins for its notes."""
    sections = read_manifest(ctx.run_dir, AGG).get("sections", {})
    bins = (sections.get("memory", {}).get("commit_time_bins") or sections.get("cpu", {}).get("time_bins")
            or {"count": 1, "t0_ns": 0, "span_ns": 1})
    return Pool("memory", bins)


def _heap_functions(ctx, w, snaps: list[dict], top_n: int, pool: Pool) -> str:
    """Functions at the largest snapshot, and the largest growth from one snapshot of a process to the next."""
    parts = []
    ok = [s for s in snaps if s["status"] == "ok" and s["blocks"]]
    if ok and ctx.has(AGG, "heap_snapshot_by_function"):
        big = max(ok, key=lambda s: (s["bytes"], -s["timestamp_ns"]))
        rows = w.top(AGG, "heap_snapshot_by_function", "inclusive_bytes DESC, module, function",
                     top_n, f"pid = {int(big['pid'])} AND instance = {int(big['instance'])} "
                        f"AND timestamp_ns = {int(big['timestamp_ns'])}")
        who = process_name(big)
        parts.append(f"""<h3>Functions holding the most heap at the largest snapshot ({html.escape(who)}, pid {big['pid']},
snapshot {big['instance']}, {fmt_bytes(big['bytes'])})</h3>
{table(rows, [("module", "module", None), ("function", "function", None), ("inclusive_bytes", "bytes (inclusive)", fmt_bytes),
              ("inclusive_blocks", "blocks", count), ("self_bytes", "bytes (self)", fmt_bytes)], 'heap-functions')}""")
    if ctx.has(AGG, "heap_snapshot_growth"):
        rows = w.top(AGG, "heap_snapshot_growth", "growth_bytes DESC, pid, from_ns, module, function", CANDIDATES,
                     "growth_bytes > 0")
        if rows:
            parts.append(f"""<h3>Largest heap growth from one snapshot of a process to the next (inclusive)</h3>
{table(rows, [("pid", "pid", None), ("from_instance", "from", None), ("to_instance", "to", None),
              ("module", "module", None), ("function", "function", None), ("bytes_before", "before", fmt_bytes),
              ("bytes_after", "after", fmt_bytes), ("growth_bytes", "growth", fmt_growth),
              ("growth_blocks", "blocks", count)], 'heap-growth',
       Follow(pool, "growth_bytes", alive=[(r["from_ns"], r["to_ns"]) for r in rows]), top_n)}""")
    return "\n".join(parts)


#: Functions per snapshot kept for the snapshot page (largest inclusive bytes): enough for any look, bounded
#: for a build of thousands of snapshots.
HEAP_PAGE_FUNCTIONS = 300


def _heap_page(ctx) -> str:
    """heap_snapshots.html: pick a snapshot (functions by inclusive busy bytes), or two to compare (growth)."""
    from pipeline.report.base import page
    from pipeline.report.safe import inline_json

    w = Writer(ctx)
    snaps = w.top(AGG, "heap_snapshots_summary", "pid, timestamp_ns, instance", 1 << 30, "status = 'ok' AND blocks > 0")
    rows = w.top(AGG, "heap_snapshot_by_function", "pid, timestamp_ns, instance, inclusive_bytes DESC", 1 << 62)
    w.close()
    key = {(s["pid"], s["instance"], s["timestamp_ns"]): k for k, s in enumerate(snaps)}
    names: dict[str, int] = {}
    kept: dict[int, int] = {}
    out = []
    for r in rows:
        k = key.get((r["pid"], r["instance"], r["timestamp_ns"]))
        if k is None or kept.get(k, 0) >= HEAP_PAGE_FUNCTIONS:
            continue
        kept[k] = kept.get(k, 0) + 1
        f = names.setdefault(f"{r['module'] or '?'}!{r['function']}", len(names))
        out.append([k, f, int(r["inclusive_bytes"]), int(r["inclusive_blocks"])])
    data = {"snapshots": [{"label": f"{process_name(s)} pid {s['pid']} #{s['instance']} at "
                                    f"{fmt_ms(s['timestamp_ns'])}: {fmt_bytes(s['bytes'])}", "t": s["timestamp_ns"]}
                          for s in snaps],
            "functions": list(names), "rows": out}
    js = (STATIC / "heap.js").read_text()
    body = f"""<header><h1>Heap snapshots</h1><p class="meta"><a href="index.html">report</a> &middot; busy heap
bytes by allocating function (inclusive: every stack through it), at a snapshot or between two</p></header>
<main><p><label>snapshot <select id="heap-a"></select></label>
<label>compare with <select id="heap-b"></select></label></p>
<p id="heap-range" class="range-note"></p>
<table id="heap-table" class="heap"></table></main>
<script type="application/json" id="heap-data">{inline_json(data)}</script>
<script>{js}</script>"""
    return page("heap snapshots", body)


#: Colours of the processes in the commit chart (the total is black).
PALETTE = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]


def _commit_chart(ctx, w, width: int = 1000, height: int = 240, processes: int = 10) -> str:
    """Commit over time (``commit_over_time``) as an SVG chart: all processes together, and the processes with
    the largest peaks, each a step line of its level at the end of each time bin."""
    if not ctx.has(AGG, "commit_over_time"):
        return ""
    rows = w.top(AGG, "commit_over_time", "process_key NULLS FIRST, bin", 1 << 30)
    if not rows:
        return ""
    t0 = min(r["t_ns"] for r in rows)
    t1 = max(r["t_ns"] for r in rows)
    top = max(r["peak_bytes"] for r in rows) or 1
    series: dict = {}
    for r in rows:
        series.setdefault(r["process_key"], []).append(r)
    peaks = sorted((k for k in series if k is not None), key=lambda k: -max(r["peak_bytes"] for r in series[k]))

    def x(t):
        return 50 + (width - 60) * (t - t0) / max(t1 - t0, 1)

    def y(v):
        return 10 + (height - 40) * (1 - v / top)

    def line(rs, colour, stroke, tip):
        pts = []
        for r in rs:
            pts += [f"{x(r['t_ns']):.1f},{y(r['end_bytes']):.1f}"]
        return (f'<polyline fill="none" stroke="{colour}" stroke-width="{stroke}" points="{" ".join(pts)}">'
                f'<title>{html.escape(tip)}</title></polyline>')

    parts = [line(series[None], "#000", 2, f"all processes: peak {fmt_bytes(max(r['peak_bytes'] for r in series[None]))}")
             ] if None in series else []
    legend = []
    for k, key in enumerate(peaks[:processes]):
        rs = series[key]
        who = f"{process_name(rs[0])} (pid {rs[0]['pid']})"
        peak = max(r["peak_bytes"] for r in rs)
        parts.append(line(rs, PALETTE[k % len(PALETTE)], 1.2, f"{who}: peak {fmt_bytes(peak)}"))
        legend.append(f'<span style="color:{PALETTE[k % len(PALETTE)]}">&#9632;</span> {html.escape(who)} '
                      f'{fmt_bytes(peak)}')
    axis = (f'<text x="4" y="18" font-size="10">{fmt_bytes(top)}</text><text x="4" y="{height - 30}" font-size="10">0</text>'
            f'<text x="50" y="{height - 8}" font-size="10">{fmt_ms(t0)}</text>'
            f'<text x="{width - 10}" y="{height - 8}" font-size="10" text-anchor="end">{fmt_ms(t1)}</text>'
            f'<line x1="50" y1="{height - 30}" x2="{width - 10}" y2="{height - 30}" stroke="#999"/>')
    return (f'<h3>Commit over time</h3><svg class="commit-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" style="font: 10px system-ui, sans-serif">{axis}{"".join(parts)}</svg>'
            f'<p class="legend">black: all processes together; {" &middot; ".join(legend)}</p>')
