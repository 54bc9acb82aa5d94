"""A comparison (:func:`pipeline.warehouse.compare`) as people read it: a headline, then the changes by impact,
as text for a terminal or markdown for a CI job summary; and the exit status a nightly job fails on.

Values are written in their unit (``12.34 s``, ``1.2 GiB``, ``1,234 samples``, ``3.21 %``), names in full.
"""

from __future__ import annotations

from typing import Any

#: What each kind is called in a report.
TITLES = {
    "build_wall_ns": "build wall time", "cpu_build": "build CPU (samples)", "peak_commit_build": "peak commit",
    "query_build_ns": "self-profile total", "commit_build": "bytes committed",
    "crate_wall_ns": "crate wall time", "cpu_crate": "crate CPU", "cpu_function_self": "function self CPU",
    "cpu_function_inclusive": "function inclusive CPU", "cpu_function_self_share": "function self share",
    "cpu_function_inclusive_share": "function inclusive share", "query_self_ns": "query self time",
    "query_count": "query count", "query_crate_ns": "crate self-profile time", "commit_function": "function commit",
    "commit_crate": "crate commit", "peak_commit": "peak commit",
}


def fmt_value(test: str, v: float | None) -> str:
    if v is None:
        return "-"
    if test == "time":
        for unit, div in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
            if abs(v) >= div:
                return f"{v / div:,.2f} {unit}"
        return f"{v:,.0f} ns"
    if test == "bytes":
        for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(v) >= div:
                return f"{v / div:,.2f} {unit}"
        return f"{v:,.0f} B"
    if test == "share":
        return f"{100 * v:.3f} %"
    return f"{v:,.0f}" + (" samples" if test == "count" else "")


def fmt_change(r: dict[str, Any]) -> str:
    rel = r["relative_change"]
    return "new" if rel is None and r["value"] else ("gone" if rel is None else f"{100 * rel:+.1f}%")


def exceeds_budget(c: dict[str, Any], budget_pct: float) -> list[dict[str, Any]]:
    """The regressions of a comparison that fail a nightly job: significant, and at least ``budget_pct`` percent
    (a new metric always)."""
    rows = c["headline"] + c["changes"]
    return [r for r in rows if r["verdict"] == "regression"
            and (r["relative_change"] is None or 100 * r["relative_change"] >= budget_pct)]


def _summary(c: dict[str, Any]) -> str:
    rows = c["headline"] + c["changes"]
    reg = sum(r["verdict"] == "regression" for r in rows)
    imp = sum(r["verdict"] == "improvement" for r in rows)
    fixed = sum(r["confidence"] == "fixed" for r in rows)
    note = f"; {fixed} of them need more runs (fixed thresholds)" if fixed else ""
    return f"{reg} regressions and {imp} improvements among {len(rows)} metrics{note}"


def text(c: dict[str, Any], limit: int = 40, everything: bool = False) -> str:
    """The comparison for a terminal."""
    head = f"run {c['run_id']} (job {c['job']}, workload {c['workload']})"
    if c["baseline_run_id"] is None:
        return f"{head}: {c['reason']}; nothing compared"
    lines = [f"{head} vs baseline {c['baseline_run_id']}"]
    if c["reason"]:
        lines.append(f"note: {c['reason']}")
    width = max([len(TITLES[r["kind"]]) for r in c["headline"]] + [10])
    for r in c["headline"]:
        lines.append(f"  {TITLES[r['kind']].ljust(width)}  {fmt_value(r['test'], r['baseline_value']):>14} -> "
                     f"{fmt_value(r['test'], r['value']):>14}  {fmt_change(r):>7}  {r['verdict']}")
    lines.append(_summary(c))
    shown = [r for r in c["changes"] if everything or r["verdict"] != "noise"][:limit]
    for r in shown:
        z = f"  z {r['z']:.1f}" if r["z"] is not None else ""
        lines.append(f"{r['verdict']:>11}  {fmt_change(r):>7}  {TITLES[r['kind']]}: {r['key']}  "
                     f"({fmt_value(r['test'], r['baseline_value'])} -> {fmt_value(r['test'], r['value'])}, threshold "
                     f"{100 * r['threshold']:.1f}% from {r['confidence']}{z})")
    rest = len([r for r in c["changes"] if everything or r["verdict"] != "noise"]) - len(shown)
    if rest > 0:
        lines.append(f"... and {rest} more (--limit N, or --format markdown for a file)")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(c: dict[str, Any], limit: int = 100) -> str:
    """The comparison as markdown for a CI job summary."""
    title = f"### bootprof: `{_md(c['run_id'])}`"
    if c["baseline_run_id"] is None:
        return f"{title}\n\n{_md(c['reason'])}; nothing compared.\n"
    out = [f"{title} vs `{_md(c['baseline_run_id'])}`", "",
           f"job `{_md(c['job'])}`, workload `{_md(c['workload'])}`" + (f" — **{_md(c['reason'])}**" if c["reason"] else ""),
           "", "| | baseline | this run | change | verdict |", "|---|---:|---:|---:|---|"]
    for r in c["headline"]:
        out.append(f"| {TITLES[r['kind']]} | {fmt_value(r['test'], r['baseline_value'])} | "
                   f"{fmt_value(r['test'], r['value'])} | {fmt_change(r)} | {r['verdict']} |")
    out += ["", _summary(c) + ".", ""]
    shown = [r for r in c["changes"] if r["verdict"] != "noise"][:limit]
    if shown:
        out += ["| verdict | change | metric | name | baseline | this run | threshold |", "|---|---:|---|---|---:|---:|---:|"]
        for r in shown:
            out.append(f"| {r['verdict']} | {fmt_change(r)} | {TITLES[r['kind']]} | `{_md(r['key'])}` | "
                       f"{fmt_value(r['test'], r['baseline_value'])} | {fmt_value(r['test'], r['value'])} | "
                       f"{100 * r['threshold']:.1f}% ({r['confidence']}) |")
    return "\n".join(out) + "\n"


def html_page(c: dict[str, Any], baseline_folded: list[tuple[str, int]], run_folded: list[tuple[str, int]],
              limit: int = 100) -> str:
    """The comparison as one self-contained page: the headline and the changes as tables, above a differential
    flame graph of the two runs' CPU samples (``pipeline.report.flame.diff_tree``)."""
    import html

    from pipeline.report.flame import diff_tree, flame_page

    esc = html.escape

    def table(rows, head) -> str:
        body = "".join("<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in r) + "</tr>" for r in rows)
        return f"<table class='cmp'><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr>{body}</table>"

    intro = [f"<p>{esc(text(c).splitlines()[0])}</p>"]
    if c["baseline_run_id"] is not None:
        if c["reason"]:
            intro.append(f"<p><b>{esc(c['reason'])}</b></p>")
        intro.append(table([(TITLES[r["kind"]], fmt_value(r["test"], r["baseline_value"]), fmt_value(r["test"], r["value"]),
                             fmt_change(r), r["verdict"]) for r in c["headline"]],
                           ["", "baseline", "this run", "change", "verdict"]))
        intro.append(f"<p>{esc(_summary(c))}.</p>")
        shown = [r for r in c["changes"] if r["verdict"] != "noise"][:limit]
        if shown:
            intro.append(table([(r["verdict"], fmt_change(r), TITLES[r["kind"]], r["key"],
                                 fmt_value(r["test"], r["baseline_value"]), fmt_value(r["test"], r["value"]),
                                 f"{100 * r['threshold']:.1f}% ({r['confidence']})") for r in shown],
                               ["verdict", "change", "metric", "name", "baseline", "this run", "threshold"]))
    note = ("Differential flame graph of the CPU samples: each run normalized by its own samples; colour is the "
            "change of a frame's inclusive share (red grew, blue shrank; solid: only in one run); width is the "
            "larger of its two shares.") if run_folded or baseline_folded else "No folded CPU stacks in these runs."
    style = ("<style>table.cmp{border-collapse:collapse;margin:6px 12px;font:12px system-ui,sans-serif}"
             "table.cmp td,table.cmp th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style>")
    return flame_page(f"bootprof compare: {c['run_id']}", [], "ppm", note,
                      tree=diff_tree(baseline_folded, run_folded), intro_html=style + "\n".join(intro))
