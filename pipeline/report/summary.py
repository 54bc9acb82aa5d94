"""The summary at the top of ``index.html``: the answers a contributor opens the report for, each a link to its
section. How long the build took and how busy the cores were over time (one chart: busy CPUs from the samples and
running rustc processes, per time bin; dragging across it picks the range the rest of the page shows); which
crates, in which stage, took the longest wall time and CPU; where the CPU went (functions, queries); the peak
commit (when, which process); and, when the run was compared, the comparison's verdict.

Everything comes from ``aggregated/`` (``process_tree``, ``cpu_over_time``, ``cpu_by_process``,
``cpu_by_function``, ``commit_by_process``, ``query_summary``, ``self_profile_processes``) and ``compare/``.
A process's stage is that of the compiler it ran, from its command line (:func:`stage_of`).
"""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, TypedDict

from pipeline.report import critical
from pipeline.report.flame import count, fmt_bytes
from pipeline.report.processes import STAGE, said
from pipeline.report.queries import fmt_duration
from pipeline.runs import has_table, read_manifest, stage_dir
from pipeline.stages import AGGREGATED, COMPARED, DECODED

if TYPE_CHECKING:
    from pipeline.contracts import BuildFacts

#: The SampledProfile interval the CPU time is counted in: WPR's and xperf's default, 1 kHz per CPU (the trace does
#: not say it; a recording at another rate scales the CPU times, not their shares).
SAMPLE_NS = 1_000_000
#: Rows of each top list.
TOP = 5
#: Time bins of the concurrency chart, and its size in pixels.
BINS, WIDTH, HEIGHT, LEFT, BOTTOM = 200, 1100, 180, 48, 22

def stage_of(command_line: str | None) -> str | None:
    """The stage of the compiler a process ran (``.../stage1/bin/rustc``: ``stage1``), as the build processes' table
    says it (:data:`pipeline.report.processes.STAGE`); None when the command line does not say."""
    return said(STAGE, command_line)


def _rows(ctx, table: str, columns: list[str] | None = None) -> list[dict]:
    return ctx.read(AGGREGATED, table, columns).to_pylist() if ctx.has(AGGREGATED, table) else []


def facts(ctx) -> BuildFacts:
    """The numbers of the summary (also kept in the report's manifest, and what the tests check the page by)."""
    tree = _rows(ctx, "process_tree", ["process_key", "pid", "image_name", "crate", "command_line", "start_ns",
                                       "end_ns", "duration_ns"])
    profiles = _rows(ctx, "self_profile_processes", ["crate", "cmd", "wall_start_ns", "wall_end_ns", "total_ns"])
    rustc = [r for r in tree if r["crate"]]
    out: BuildFacts = {"wall_ns": None, "cpu_ns": None, "cpu_samples": None, "busy_cores": None, "processes": {},
                       "crates_wall": [], "crates_cpu": [], "functions": [], "queries": [], "peak": None, "critical": []}
    # (a process of the trace, or a self-profile's when the run has no trace)
    spans = [(r["crate"], stage_of(r["command_line"]), r["start_ns"], r["end_ns"], r.get("process_key"))
             for r in rustc if r["start_ns"] is not None and r["end_ns"] is not None]
    if not spans:
        spans = [(r["crate"], stage_of(r["cmd"]), r["wall_start_ns"], r["wall_end_ns"], None) for r in profiles
                 if r["crate"] and r["wall_start_ns"] is not None]
    if spans:
        out["wall_ns"] = max(s[3] for s in spans) - min(s[2] for s in spans)
        out["processes"] = dict(sorted(Counter(s[1] or "unknown stage" for s in spans).items()))
        wall: dict[tuple, int] = defaultdict(int)
        for crate, stage, a, b, _ in spans:
            wall[(crate, stage)] += b - a
        out["crates_wall"] = [{"crate": c, "stage": s or "", "wall_ns": v}
                              for (c, s), v in sorted(wall.items(), key=lambda kv: -kv[1])[:TOP]]
    # (the Idle process, pid 0, is the CPUs' idle time, not work)
    by_process = [r for r in _rows(ctx, "cpu_by_process", ["process_key", "pid", "crate", "samples"]) if r["pid"] != 0]
    if by_process:
        samples = sum(r["samples"] or 0 for r in by_process)
        out["cpu_samples"] = samples
        out["cpu_ns"] = samples * SAMPLE_NS
        if out["wall_ns"]:
            out["busy_cores"] = out["cpu_ns"] / out["wall_ns"]
        stage_by_key = {r["process_key"]: stage_of(r["command_line"]) for r in tree}
        cpu: dict[tuple, int] = defaultdict(int)
        for r in by_process:
            if r["crate"]:
                cpu[(r["crate"], stage_by_key.get(r["process_key"]))] += r["samples"] or 0
        out["crates_cpu"] = [{"crate": c, "stage": s or "", "cpu_ns": v * SAMPLE_NS}
                             for (c, s), v in sorted(cpu.items(), key=lambda kv: -kv[1])[:TOP]]
        fns = sorted(_rows(ctx, "cpu_by_function", ["module", "function", "self_samples"]),
                     key=lambda r: -(r["self_samples"] or 0))[:TOP]
        out["functions"] = [{"function": r["function"], "module": r["module"], "cpu_ns": r["self_samples"] * SAMPLE_NS,
                             "share": r["self_samples"] / samples if samples else None} for r in fns]
    elif profiles:
        out["cpu_ns"] = sum(r["total_ns"] or 0 for r in profiles)
        if out["wall_ns"]:
            out["busy_cores"] = out["cpu_ns"] / out["wall_ns"]
    # what bounded the wall time: the critical path through the rustc processes' --extern dependencies
    if rustc:
        candidates = [{**r, "stage": stage_of(r["command_line"])} for r in rustc]
    else:
        candidates = [{"crate": r["crate"], "command_line": r["cmd"], "start_ns": r["wall_start_ns"],
                       "end_ns": r["wall_end_ns"], "stage": stage_of(r["cmd"]), "pid": None} for r in profiles]
    t_first = min((c["start_ns"] for c in candidates if c["start_ns"] is not None), default=0)
    out["critical"] = [{"crate": c["crate"], "stage": c["stage"] or "", "pid": c.get("pid"),
                        "start_ns": c["start_ns"] - t_first, "wall_ns": c["end_ns"] - c["start_ns"],
                        "wait_ns": c["wait_ns"]} for c in critical.chain(candidates)]
    queries: dict[str, int] = defaultdict(int)
    for r in _rows(ctx, "query_summary", ["scope", "label", "self_ns"]):
        if r["scope"] == "build":
            queries[r["label"]] += r["self_ns"] or 0
    whole = sum(queries.values())
    out["queries"] = [{"label": k, "self_ns": v, "share": v / whole if whole else None}
                      for k, v in sorted(queries.items(), key=lambda kv: -kv[1])[:TOP]]
    commits = [r for r in _rows(ctx, "commit_by_process", ["pid", "image_name", "crate", "peak_commit_bytes", "peak_ns"])
               if r["peak_commit_bytes"]]
    memory = (read_manifest(ctx.run_dir, AGGREGATED).get("sections") or {}).get("memory") or {}
    if commits and memory.get("peak_commit_bytes"):
        top = max(commits, key=lambda r: r["peak_commit_bytes"])
        out["peak"] = {"bytes": memory["peak_commit_bytes"], "at_ns": memory.get("peak_ns"),
                       "process_bytes": top["peak_commit_bytes"], "process_at_ns": top["peak_ns"], "pid": top["pid"],
                       "process": top["crate"] or top["image_name"]}
    return out


class Concurrency(TypedDict):
    """Busy CPUs and running rustc processes per time bin, from ``t0`` to ``t1`` (ns)."""

    t0: int
    t1: int
    busy: list[float]
    running: list[float]


def concurrency(ctx) -> Concurrency | None:
    """Busy CPUs (samples per bin, at ``SAMPLE_NS``) and running rustc processes per time bin; None without a
    process timeline."""
    tree = [r for r in _rows(ctx, "process_tree", ["crate", "start_ns", "end_ns"]) if r["start_ns"] is not None]
    if not tree:        # (self-profiles alone: their rustc processes, no samples)
        tree = [{"crate": r["crate"], "start_ns": r["wall_start_ns"], "end_ns": r["wall_end_ns"]}
                for r in _rows(ctx, "self_profile_processes", ["crate", "wall_start_ns", "wall_end_ns"])
                if r["crate"] and r["wall_start_ns"] is not None]
    if not tree:
        return None
    t0 = min(r["start_ns"] for r in tree)
    t1 = max(r["end_ns"] if r["end_ns"] is not None else r["start_ns"] for r in tree)
    if t1 <= t0:
        return None
    width = (t1 - t0) / BINS
    running = [0.0] * BINS
    for r in tree:
        if not r["crate"] or r["end_ns"] is None:
            continue
        a, b = r["start_ns"] - t0, r["end_ns"] - t0
        for k in range(max(int(a // width), 0), min(int(b // width) + 1, BINS)):
            lo, hi = k * width, (k + 1) * width
            running[k] += max(0.0, min(b, hi) - max(a, lo)) / width     # (a process alive half the bin counts 0.5)
    busy = [0.0] * BINS
    for r in _rows(ctx, "cpu_over_time", ["pid", "t_ns", "bin_ns", "samples"]):
        if r["t_ns"] is None or not r["samples"] or r["pid"] == 0:
            continue
        # (the samples of a bin of cpu_over_time spread over the chart's bins it overlaps: bins of two sizes alias)
        a, b = r["t_ns"] - t0, r["t_ns"] + max(r["bin_ns"] or 0, 1) - t0
        for k in range(max(int(a // width), 0), min(int(b // width) + 1, BINS)):
            part = max(0.0, min(b, (k + 1) * width) - max(a, k * width)) / (b - a)
            busy[k] += r["samples"] * part * SAMPLE_NS / width
    return {"t0": t0, "t1": t1, "busy": busy, "running": running}


def chart_svg(c: Concurrency, cpus: int | None, pickable: bool) -> str:
    """The concurrency chart: busy CPUs as an area, running rustc processes as a line, one time axis; ``pickable``:
    on the trace's time axis, so that dragging across it picks the range the rest of the page shows."""
    top = max(max(c["busy"]), max(c["running"]), (cpus or 0) + 0.6, 1.0)
    plot_w, plot_h = WIDTH - LEFT - 30, HEIGHT - BOTTOM - 8
    x = lambda k: LEFT + k * plot_w / BINS  # noqa: E731
    y = lambda v: 8 + plot_h - v * plot_h / top  # noqa: E731
    area = " ".join(f"{x(k):.1f},{y(v):.1f} {x(k + 1):.1f},{y(v):.1f}" for k, v in enumerate(c["busy"]))
    area = f"{x(0):.1f},{y(0):.1f} {area} {x(BINS):.1f},{y(0):.1f}"
    line = " ".join(f"{x(k):.1f},{y(v):.1f} {x(k + 1):.1f},{y(v):.1f}" for k, v in enumerate(c["running"]))
    ticks = []
    for k in range(6):
        t = (c["t1"] - c["t0"]) * k / 5
        ticks.append(f'<text x="{x(BINS * k / 5):.1f}" y="{HEIGHT - 6}" text-anchor="middle">{t / 1e9:.2f} s</text>')
    step = max(1, round(top / 4))
    for v in range(0, int(top) + 1, step):
        ticks.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>'
                     f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>')
    cap = (f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(cpus):.1f}" y2="{y(cpus):.1f}" class="cpus"/>'
           f'<text x="{LEFT + plot_w - 2}" y="{y(cpus) - 4:.1f}" text-anchor="end" class="cpus">{cpus} logical CPUs</text>'
           if cpus else "")
    sampled = max(c["busy"]) > 0
    busy = f'<polygon class="busy" points="{area}"/>' if sampled else ""
    busy_key = '<span class="key busy"></span> busy CPUs (samples per time bin) ' if sampled else ""
    return (f'<svg class="concurrency{" pickable" if pickable else ""}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'data-t0="{c["t0"]}" data-t1="{c["t1"]}" data-left="{LEFT}" data-plot="{plot_w}">'
            f'{"".join(ticks)}{busy}<polyline class="running" points="{line}"/>{cap}'
            f'<rect class="pick" x="0" y="8" width="0" height="{plot_h}"/></svg>'
            f'<p class="legend">{busy_key}<span class="key running"></span> rustc processes running.'
            + (' Drag across the chart to show that time in the flame graphs and the tables marked "follows range".'
               if pickable else "") + '</p>')


def _top_table(rows: list[dict], cols: list[tuple[str, str, Any]], cls: str) -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t, _ in cols)
    body = "".join("<tr>" + "".join(
        f'<td class="{"num" if fmt else "txt"}">{html.escape(fmt(r[k]) if fmt else str(r[k] or ""))}</td>'
        for k, _, fmt in cols) + "</tr>" for r in rows)
    return f'<table class="top {cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _at(ns) -> str:
    return f"{ns / 1e9:.2f} s"


def _wait(ns) -> str:
    return "" if ns is None else ("-" if ns < 0 else "") + fmt_duration(abs(ns))


def _share(v) -> str:
    return "" if v is None else f"{100 * v:.1f}%"


def _comparison(ctx) -> str:
    """The comparison's verdict and a link to its page, when the run has been compared."""
    path = stage_dir(ctx.run_dir, COMPARED) / "comparison.json"
    try:
        c = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    if not c.get("baseline_run_id"):
        return ""
    verdict = c.get("verdict") or "no change"
    return (f'<p class="compared verdict-{html.escape(verdict.replace(" ", "-"))}">Against '
            f'{html.escape(str(c["baseline_run_id"]))}: <b>{html.escape(verdict)}</b>. '
            f'<a href="../compare/compare.html">The comparison</a></p>')


def section(ctx):
    from pipeline.report.base import Section

    if not any(ctx.has(AGGREGATED, t) for t in ("process_tree", "self_profile_processes", "cpu_by_process")):
        return None
    f = facts(ctx)
    cpus = None
    if has_table(ctx.run_dir, DECODED, "sysconfig"):
        rows = ctx.read(DECODED, "sysconfig", ["cpu_count"]).to_pylist()
        cpus = rows[0]["cpu_count"] if rows else None
    cards = []
    if f["wall_ns"] is not None:
        cards.append(("wall time", fmt_duration(f["wall_ns"]), "first rustc start to last rustc end"))
    if f["cpu_ns"] is not None:
        cards.append(("CPU time", fmt_duration(f["cpu_ns"]), "samples at 1 kHz" if ctx.has(AGGREGATED, "cpu_by_process")
                      else "self-profiles, summed over threads"))
    if f["busy_cores"] is not None:
        cards.append(("busy cores", f"{f['busy_cores']:.1f}" + (f" of {cpus}" if cpus else ""), "on average"))
    if f["processes"]:
        known = {k: v for k, v in f["processes"].items() if k != "unknown stage"}
        cards.append(("rustc processes", count(sum(f["processes"].values())),
                      ", ".join(f"{k} {v}" for k, v in f["processes"].items()) if known else "no stage in their "
                      "command lines"))
    if f["peak"]:
        p = f["peak"]
        cards.append(("peak commit", fmt_bytes(p["bytes"]), f"at {(p['at_ns'] or 0) / 1e9:.2f} s; the most of one "
                      f"process: {p['process']} (pid {p['pid']}), {fmt_bytes(p['process_bytes'])} at "
                      f"{(p['process_at_ns'] or 0) / 1e9:.2f} s"))
    body = ['<div class="cards">' + "".join(
        f'<div class="card" data-key="{html.escape(k)}"><div class="k">{html.escape(k)}</div>'
        f'<div class="v">{html.escape(v)}</div><div class="n">{html.escape(n)}</div></div>' for k, v, n in cards)
        + "</div>", _comparison(ctx)]
    chart = concurrency(ctx)
    if chart is not None:
        pickable = ctx.has(AGGREGATED, "process_tree")
        body.append(chart_svg(chart, cpus, pickable)
                    + (f'<script src="{ctx.copy_static("concurrency.js")}"></script>' if pickable else ""))
    if len(f["critical"]) > 1:
        on = sum(c["wall_ns"] for c in f["critical"])
        body.append('<h3>What bounded the wall time</h3><p class="note">The chain of rustc processes on the build\'s '
                    'critical path (from their command lines\' <code>--extern</code>): each could not start before the '
                    f'one above it ended (a negative wait: it started on that one\'s metadata). They ran '
                    f'{fmt_duration(on)} of the {fmt_duration(f["wall_ns"] or 0)} wall time, from '
                    f'{_at(f["critical"][0]["start_ns"])} on (no command line before links to the first: an earlier '
                    'cargo invocation, or its first crate); marked on the <a href="#processes-timeline">process '
                    'timeline</a>.</p>'
                    + _top_table(f["critical"], [("crate", "crate", None), ("stage", "stage", None),
                                                 ("start_ns", "started at", _at), ("wall_ns", "wall", fmt_duration),
                                                 ("wait_ns", "waited", _wait)], "critical"))
    tops = []
    if f["crates_wall"]:
        tops.append(("Crates by wall time", "processes" if ctx.has(AGGREGATED, "process_tree") else "queries", _top_table(
            f["crates_wall"], [("crate", "crate", None), ("stage", "stage", None), ("wall_ns", "wall", fmt_duration)],
            "crates-wall")))
    if f["crates_cpu"]:
        tops.append(("Crates by CPU", "cpu", _top_table(
            f["crates_cpu"], [("crate", "crate", None), ("stage", "stage", None), ("cpu_ns", "CPU", fmt_duration)],
            "crates-cpu")))
    if f["functions"]:
        tops.append(("Functions by self CPU", "cpu", _top_table(
            f["functions"], [("function", "function", None), ("cpu_ns", "CPU", fmt_duration),
                             ("share", "share", _share)], "functions")))
    if f["queries"]:
        tops.append(("Queries by self time", "queries", _top_table(
            f["queries"], [("label", "query", None), ("self_ns", "self time", fmt_duration),
                           ("share", "share", _share)], "queries")))
    if tops:
        body.append('<div class="tops">' + "".join(
            f'<div><h3><a href="#{anchor}">{html.escape(title)}</a></h3>{t}</div>' for title, anchor, t in tops)
            + "</div>")
    return Section("summary", "Summary", "\n".join(body), [], {k: v for k, v in f.items()})
