"""Processes section of the report: a timeline of every process and the process tree with CPU.

Applies when ``aggregated/`` has ``process_tree``. The timeline is an SVG drawn here (one row per
process in start order, a bar from start to end, open ends drawn to the trace's edge, hover for the
command line); ``process_tree.html`` holds the whole indented tree, ``process_tree.csv`` the table.
``processes.chrome_trace.json`` is the same build in Chrome's Trace Event Format (chrome://tracing,
Perfetto, speedscope): one track group per process instance with its lifetime, its threads' lifetimes
and a "CPU samples" counter from ``cpu_over_time``.
"""

from __future__ import annotations

import bisect
import html
import json
import re

from pipeline.report.flame import Writer, count, fmt_bytes, fmt_ms, table
from pipeline.report.timerange import Follow, Pool, binned, cpu_bins, total
from pipeline.stages import AGGREGATED, DECODED

AGG = AGGREGATED
ROW = 9
WIDTH = 1100
LABEL = 190

#: Bar colours by program kind (by image name); anything else is grey.
COLORS = {"rustc.exe": "#d9822b", "cargo.exe": "#4a90d9", "build-script-build.exe": "#8e6bbf",
          "link.exe": "#3aa676", "python.exe": "#c5b33a"}


def process_name(r: dict) -> str:
    """A process as the timeline, the tree and the Chrome trace name it: its image, and the crate for rustc."""
    return f"{r['image_name'] or '?'}{' ' + r['crate'] if r['crate'] else ''}"


def tree_order(rows: list[dict]) -> list[tuple[dict, int]]:
    """(row, depth) of every process, parents before their children, children (and roots) by start."""
    by_key = {r["process_key"]: r for r in rows}
    kids: dict[int | None, list[dict]] = {}
    for r in rows:
        kids.setdefault(r["parent_key"] if r["parent_key"] in by_key else None, []).append(r)
    start = lambda r: (r["start_ns"] if r["start_ns"] is not None else (r["first_seen_ns"] or 0), r["process_key"])
    out: list[tuple[dict, int]] = []
    todo = [(r, 0) for r in sorted(kids.get(None, []), key=start, reverse=True)]
    while todo:
        r, depth = todo.pop()
        out.append((r, depth))
        todo.extend((c, depth + 1) for c in sorted(kids.get(r["process_key"], []), key=start, reverse=True) if depth < 64)
    return out


def timeline_svg(rows: list[dict], critical: frozenset = frozenset()) -> str:
    """The build's processes on one time axis, as a tree (``static/timeline.js``: click a parent's name to fold its
    children, drag across the bars to zoom there and to draw the CPU flame graph of that time); those whose
    ``process_key`` is in ``critical`` (the build's critical path) are marked."""
    shown = [(r, d) for r, d in tree_order(rows) if r["first_seen_ns"] is not None]
    if not shown:
        return '<p class="empty">no process lifetimes</p>'
    t0 = min(min(r["start_ns"] if r["start_ns"] is not None else r["first_seen_ns"], r["first_seen_ns"]) for r, _ in shown)
    t1 = max(max(r["end_ns"] if r["end_ns"] is not None else r["last_seen_ns"], r["last_seen_ns"]) for r, _ in shown)
    span = max(t1 - t0, 1)
    scale = (WIDTH - LABEL) / span
    parents = {r["parent_key"] for r, _ in shown}
    out = []
    for i, (r, depth) in enumerate(shown):
        start = r["start_ns"] if r["start_ns"] is not None else t0
        end = r["end_ns"] if r["end_ns"] is not None else t1
        x = LABEL + (start - t0) * scale
        w = max((end - start) * scale, 1.0)
        y = 4 + i * ROW
        name = process_name(r)
        tip = (f"{name} (pid {r['pid']}): {fmt_ms(start - t0)} to {fmt_ms(end - t0)}"
               f"{' (running at trace start)' if r['start_ns'] is None else ''}"
               f"{' (running at trace end)' if r['end_ns'] is None else ''}, {r['samples']:,} samples\n"
               f"{r['command_line'] or ''}")
        color = COLORS.get((r["image_name"] or "").lower(), "#9aa5b1")
        fold = "\u25be " if r["process_key"] in parents else ""
        mark = ' critical' if r["process_key"] in critical else ''
        out.append(f'<g class="proc{mark}" data-key="{r["process_key"]}" data-parent="{r["parent_key"] if r["parent_key"] is not None else ""}" '
                   f'data-start="{start}" data-end="{end}" data-row="{i}" data-pid="{r["pid"]}"><title>{html.escape(tip)}</title>'
                   f'<text x="{4 + 8 * min(depth, 12)}" y="{y + ROW - 2}"{" class=fold" if fold else ""}>'
                   f'{html.escape(fold + name[:30 - min(depth, 12)])}</text>'
                   f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 2}" fill="{color}"></rect></g>')
    height = 4 + len(shown) * ROW + 18
    ticks = []
    for k in range(6):
        x = LABEL + k * (WIDTH - LABEL) / 5
        ticks.append(f'<g class="tick"><line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height - 16}" stroke="#e3e7eb"></line>'
                     f'<text x="{x:.1f}" y="{height - 4}" text-anchor="{"end" if k == 5 else "middle"}">'
                     f'{span * k / 5 / 1e9:.2f} s</text></g>')
    return (f'<div class="timeline-bar"><button class="timeline-reset">whole build</button> <span class="timeline-text">'
            f'Drag across the bars to zoom in (the flame graphs and the tables marked "follows range" follow); '
            f'click a name with \u25be to fold its children.</span></div>'
            f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" data-t0="{t0}" '
            f'data-t1="{t1}" data-label="{LABEL}" data-row="{ROW}" style="font: 9px system-ui, sans-serif">'
            f'{"".join(ticks)}<rect class="pick" x="0" y="0" width="0" height="{height - 16}"></rect>{"".join(out)}</svg>')


#: What a rustc command line says about what it builds: the crate type, the target, and the bootstrap stage of
#: the compiler that runs (``build\\<host>\\stage1\\bin\\rustc``) and of the build dir (``stage1-std``).
CRATE_TYPE = re.compile(r'--crate-type[ =]"?([\w-]+)')
TARGET = re.compile(r'--target[ =]"?([\w.-]+)')
STAGE = re.compile(r'[\\/](stage\d+)(?:-[\w-]+)?[\\/]')


def said(rx: re.Pattern, command_line: str | None) -> str | None:
    """What a command line says for one of ``CRATE_TYPE``, ``TARGET``, ``STAGE`` (None: nothing)."""
    m = rx.search(command_line or "")
    return m.group(1) if m else None


def build_processes(rows: list[dict], peaks: dict[int, int]) -> list[dict]:
    """One row per rustc process (a process with a ``--crate-name``): crate, crate type, stage, target, wall time,
    CPU samples, peak commit and command line, as WPA's "rustc Build Processes" table shows them."""
    out = []
    for r in rows:
        if not r.get("crate"):
            continue
        cmd = r.get("command_line")
        out.append({**r, "crate_type": said(CRATE_TYPE, cmd), "target": said(TARGET, cmd), "stage": said(STAGE, cmd),
                    "peak_commit_bytes": peaks.get(r["process_key"])})
    return sorted(out, key=lambda r: -(r["duration_ns"] or 0))


#: Name of the ETL run's Chrome trace (a self-profile run writes ``chrome_trace.json`` beside it).
CHROME_TRACE = "processes.chrome_trace.json"


def _us(ns: int) -> float:
    """Trace Event Format time: microseconds, with the nanoseconds kept as 3 decimals."""
    return round(ns / 1000, 3)


def chrome_trace(rows: list[dict], threads: list[dict], cpu: list[dict]) -> dict:
    """The processes of ``process_tree`` as a Trace Event Format document: Chrome "pid" is the process instance
    (``process_key``: Windows reuses pids), named ``image crate (pid N)``; track 0 holds the process's lifetime
    (open ends drawn to the trace's edges, and said in its args), one track per thread its lifetime, and a
    counter its CPU samples per time bin. Times are microseconds since the trace start."""
    ends = [v for r in rows for v in (r["end_ns"], r["last_seen_ns"]) if v is not None]
    ends += [t["end_ns"] or t["last_seen_ns"] or 0 for t in threads]
    ends += [c["t_ns"] + c["bin_ns"] for c in cpu]
    t_end = max(ends, default=0)
    events: list[dict] = []
    by_pid: dict[int, list[tuple[int, int]]] = {}
    order = sorted(rows, key=lambda r: (r["start_ns"] if r["start_ns"] is not None else -1, r["process_key"]))
    for i, r in enumerate(order):
        key = r["process_key"]
        start = r["start_ns"] if r["start_ns"] is not None else 0
        end = r["end_ns"] if r["end_ns"] is not None else t_end
        by_pid.setdefault(r["pid"], []).append((start if r["start_ns"] is not None else -(1 << 62), key))
        name = f"{process_name(r)} (pid {r['pid']})"
        events += [{"ph": "M", "name": "process_name", "pid": key, "tid": 0, "args": {"name": name}},
                   {"ph": "M", "name": "process_sort_index", "pid": key, "tid": 0, "args": {"sort_index": i}},
                   {"ph": "M", "name": "thread_name", "pid": key, "tid": 0, "args": {"name": "process"}},
                   {"ph": "X", "name": r["image_name"] or "?", "cat": "process", "pid": key, "tid": 0,
                    "ts": _us(start), "dur": _us(max(end - start, 0)),
                    "args": {"pid": r["pid"], "parent_pid": r["parent_pid"], "crate": r["crate"],
                             "command_line": r["command_line"], "exit_status": r["exit_status"],
                             "samples": r["samples"], "running_at_trace_start": r["start_ns"] is None,
                             "running_at_trace_end": r["end_ns"] is None}}]
    for starts in by_pid.values():
        starts.sort()
    for t in threads:
        starts = by_pid.get(t["pid"])
        first = t["start_ns"] if t["start_ns"] is not None else t["first_seen_ns"]
        if not starts or first is None:
            continue
        at = bisect.bisect_right(starts, (first, 1 << 62)) - 1
        key = starts[max(at, 0)][1]
        start = t["start_ns"] if t["start_ns"] is not None else 0
        end = t["end_ns"] if t["end_ns"] is not None else t_end
        events += [{"ph": "M", "name": "thread_name", "pid": key, "tid": t["tid"],
                    "args": {"name": t["thread_name"] or f"thread {t['tid']}"}},
                   {"ph": "X", "name": t["thread_name"] or "thread", "cat": "thread", "pid": key, "tid": t["tid"],
                    "ts": _us(start), "dur": _us(max(end - start, 0)),
                    "args": {"tid": t["tid"], "running_at_trace_start": t["start_ns"] is None,
                             "running_at_trace_end": t["end_ns"] is None}}]
    cpu = sorted((c for c in cpu if c["process_key"] is not None), key=lambda c: (c["process_key"], c["bin"]))
    label = f"CPU samples per {cpu[0]['bin_ns'] / 1e6:.3g} ms" if cpu else "CPU samples"
    for i, c in enumerate(cpu):
        events.append({"ph": "C", "name": label, "pid": c["process_key"], "tid": 0, "ts": _us(c["t_ns"]),
                       "args": {"samples": c["samples"]}})
        nxt = cpu[i + 1] if i + 1 < len(cpu) else None
        if nxt is None or nxt["process_key"] != c["process_key"] or nxt["bin"] != c["bin"] + 1:
            events.append({"ph": "C", "name": label, "pid": c["process_key"], "tid": 0,
                           "ts": _us(c["t_ns"] + c["bin_ns"]), "args": {"samples": 0}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "bootprof", "times": "microseconds since the trace start"}}


def section(ctx):
    if not ctx.has(AGG, "process_tree"):
        return None
    from pipeline.report import critical
    from pipeline.report.base import Section, page

    rows = ctx.read(AGG, "process_tree").to_pylist()
    w = Writer(ctx)
    w.csv(AGG, "process_tree")
    ordered = [{**r, "name": "\u2003" * depth + process_name(r)} for r, depth in tree_order(rows)]
    cols = [("name", "process", None), ("pid", "pid", None), ("duration_ns", "duration", fmt_ms),
            ("samples", "samples", count), ("tree_samples", "with children", count), ("threads", "threads", count),
            ("exit_status", "exit", None), ("command_line", "command line", None)]
    w.text("process_tree.html", page("process tree", f"<main><h2>Process tree</h2>{table(ordered, cols, 'tree')}</main>"))
    top = sorted(rows, key=lambda r: -(r["samples"] or 0))
    peaks = ({r["process_key"]: r["peak_commit_bytes"] for r in ctx.read(AGG, "commit_by_process").to_pylist()}
             if ctx.has(AGG, "commit_by_process") else {})
    builds = build_processes(rows, peaks)
    threads = (ctx.read(DECODED, "threads", ["pid", "tid", "start_ns", "end_ns", "thread_name", "first_seen_ns",
                                               "last_seen_ns"]).to_pylist() if ctx.has(DECODED, "threads") else [])
    cpu = ctx.read(AGG, "cpu_over_time").to_pylist() if ctx.has(AGG, "cpu_over_time") else []
    follow = _follows(ctx, rows, builds, top, cpu)
    w.text(CHROME_TRACE, json.dumps(chrome_trace(rows, threads, cpu), separators=(",", ":")))
    body = f"""<p>{len(rows)} processes, {sum(1 for r in rows if r['parent_key'] is None)} roots.</p>
{w.links()}
<h3>Build processes ({len(builds)} rustc, longest first)</h3>
{table(builds, [("crate", "crate", None), ("crate_type", "crate type", None), ("stage", "stage", None),
                ("target", "target", None), ("duration_ns", "wall time", fmt_ms), ("samples", "CPU samples", count),
                ("peak_commit_bytes", "peak commit", fmt_bytes), ("pid", "pid", None),
                ("command_line", "command line", None)], 'build-processes', follow.get("builds"))}
<h3 id="processes-timeline">Timeline</h3>
<div style="overflow-x:auto">{timeline_svg(rows, frozenset(p["process_key"] for p in critical.chain(
    [r for r in rows if r["crate"]])))}</div>
<script src="{ctx.copy_static("timeline.js")}"></script>
<h3>Processes with the most CPU samples</h3>
{table(top, [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
             ("duration_ns", "duration", fmt_ms), ("samples", "samples", count), ("tree_samples", "with children", count),
             ("command_line", "command line", None)], 'proc-top', follow.get("top"), ctx.config.report.top_n)}
{follow["top"].pool.script() if follow else ""}"""
    w.close()
    return Section("processes", f"Processes ({ctx.recorder()})", body, w.files, {"processes": len(rows)})


def _follows(ctx, rows: list[dict], builds: list[dict], top: list[dict], cpu: list[dict]) -> dict[str, Follow]:
    """The build processes and the top processes follow a picked time range: the processes alive in it, with their
    CPU samples in it (``cpu``: the rows of ``cpu_over_time``; for "with children", those of their subtrees)."""
    bins = cpu_bins(ctx)
    if not bins or not cpu:
        return {}
    own = binned(cpu, lambda r: r["process_key"], "samples")
    kids: dict = {}
    for r in rows:
        kids.setdefault(r["parent_key"], []).append(r["process_key"])
    tree: dict = {}
    for r, _ in reversed(tree_order(rows)):          # (children before their parents)
        tree[r["process_key"]] = total([own.get(r["process_key"], {}), *(tree.get(k, {}) for k in kids.get(r["process_key"], []))])
    alive = lambda rs: [(r["start_ns"], r["end_ns"]) for r in rs]  # noqa: E731
    pool = Pool("processes", bins)
    return {"builds": Follow(pool, "duration_ns", series={"samples": [own.get(r["process_key"], {}) for r in builds]},
                             alive=alive(builds)),
            "top": Follow(pool, "samples", series={"samples": [own.get(r["process_key"], {}) for r in top],
                                                          "tree_samples": [tree.get(r["process_key"], {}) for r in top]},
                          alive=alive(top))}
