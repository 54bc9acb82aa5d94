"""A comparison (:func:`pipeline.warehouse.compare`) as people read it: a headline, then the changes by impact,
as text for a terminal or markdown for a CI job summary; and the exit status a nightly job fails on.

Values are written in their unit (``12.34 s``, ``1.2 GiB``, ``1,234 samples``, ``3.21 %``), names in full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pipeline.escape import md_cell, md_code, md_text, terminal

if TYPE_CHECKING:
    from pipeline.contracts import Comparison, ComparisonRow, Family

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


def fmt_change(r: ComparisonRow, key: str = "relative_change") -> str:
    rel = r[key]
    return "new" if rel is None and r["value"] else ("gone" if rel is None else f"{100 * rel:+.1f}%")


def fmt_noise(r: ComparisonRow) -> str:
    """The noise a change is judged against, and what it was learned from."""
    if r["noise"] == 0:                                # (a count that never moved: any change is real)
        return f"none ({r['confidence']})"
    if r["z"] is None or r["noise"] is None:          # (new or gone: nothing to judge it against)
        return "-"
    noise = f"±{100 * r['noise']:.1f}%"
    return f"{noise} ({r['confidence']})"


#: What a family's name is called in a report.
FAMILY_TITLES = {"build time": "build time", "build memory": "build memory", "crate time": "crate compile time",
                 "crate memory": "crate memory"}


#: What moved every crate at once is, by the ``everything`` row's key.
EVERYTHING = {"machine": "every crate at once (the same work: the machine)",
              "compiler": "every crate at once (more work: the compiler)"}


def family_name(f: Family, quote: Callable[[object], str] = md_code) -> str:
    """A family's title and its key, the key quoted for where it goes (a markdown code span by default)."""
    if f["family"] == "everything":
        return EVERYTHING.get(f["key"], "every crate at once")
    return FAMILY_TITLES[f["family"]] if f["key"] == "build" else f"{FAMILY_TITLES[f['family']]} {quote(f['key'])}"


def exceeds_budget(c: Comparison, budget_pct: float) -> list[Family]:
    """The families whose confident regression fails a nightly job: at least ``budget_pct`` percent against the
    other items (a new one always). Suspects, improvements and the metrics that explain never do."""
    return [f for f in c.get("families", []) if f["verdict"] == "regression"
            and (f["adjusted_change"] is None or 100 * f["adjusted_change"] >= budget_pct)]


def _counts(c: Comparison) -> str:
    fams = c.get("families", [])
    n = {v: sum(f["verdict"] == v for f in fams) for v in ("regression", "suspect", "improvement")}
    return (f"{n['regression']} regressions, {n['suspect']} suspects and {n['improvement']} improvements among "
            f"{len(fams)} build and crate families ({len(c['headline']) + len(c['changes'])} metrics)")


#: How the sentence that opens a comparison begins, by its verdict.
LEADS = {"regression": "Regression", "improvement": "Improvement",
         "suspect": "Suspect (not past the noise with confidence: the next runs will tell)"}


def headline_sentence(c: Comparison, quote: Callable[[object], str] = md_code) -> str:
    """The comparison's verdict in one sentence: what regressed (or may have), else that nothing did."""
    from pipeline.warehouse.comparison import named

    verdict = c.get("verdict", "no change")
    if verdict not in LEADS:
        return "No change past the noise."
    shown = named(c.get("families", []), verdict)[:5]
    return f"{LEADS[verdict]}: " + "; ".join(f"{family_name(f, quote)} {fmt_change(f, 'adjusted_change')}"
                                             for f in shown) + "."


def _family_line(f: Family, quote: Callable[[object], str] = md_cell) -> tuple[str, ...]:
    z = "-" if f["z"] is None else f"{f['z']:.1f}"
    return (f["verdict"], family_name(f, quote), fmt_value(f["test"], f["baseline_value"]), fmt_value(f["test"], f["value"]),
            fmt_change(f), fmt_change(f, "adjusted_change"), fmt_noise(f), z, TITLES[f["kind"]])


FAMILY_HEAD = ("verdict", "family", "baseline", "this run", "change", "against the others", "noise", "z",
               "judged by")


def text(c: Comparison, limit: int = 40, everything: bool = False) -> str:
    """The comparison for a terminal."""
    t = terminal
    head = f"run {t(c['run_id'])} (job {t(c['job'])}, workload {t(c['workload'])})"
    if c["baseline_run_id"] is None:
        return f"{head}: {t(c['reason'])}; nothing compared"
    lines = [f"{head} vs baseline {t(c['baseline_run_id'])}: {c['verdict']}", headline_sentence(c, t)]
    if c["reason"]:
        lines.append(f"note: {t(c['reason'])}")
    width = max([len(TITLES[r["kind"]]) for r in c["headline"]] + [10])
    for r in c["headline"]:
        lines.append(f"  {TITLES[r['kind']].ljust(width)}  {fmt_value(r['test'], r['baseline_value']):>14} -> "
                     f"{fmt_value(r['test'], r['value']):>14}  {fmt_change(r):>7}  {r['verdict']}")
    lines.append(_counts(c))
    for f in [f for f in c["families"] if everything or f["verdict"] != "noise"][:limit]:
        lines.append("  " + "  ".join(_family_line(f, t)))
    for crate, queries in c.get("explanations", {}).items():
        lines.append(f"  queries of {t(crate)} that grew: " + ", ".join(
            f"{t(q['label'])} {fmt_value('time', q['baseline_ns'])} -> {fmt_value('time', q['ns'])}" for q in queries))
    listed = [r for r in c["changes"] if everything or (r["verdict"] != "noise" and r["role"] == "explain")]
    shown = listed[:limit]
    if shown:
        lines.append("metrics:" if everything else "queries and functions that moved (they explain; they never fail a job):")
    for r in shown:
        z = f"  z {r['z']:.1f}" if r["z"] is not None else ""
        lines.append(f"{r['verdict']:>11}  {fmt_change(r):>7}  {TITLES[r['kind']]}: {t(r['key'])}  "
                     f"({fmt_value(r['test'], r['baseline_value'])} -> {fmt_value(r['test'], r['value'])}, noise "
                     f"{fmt_noise(r)}{z})")
    rest = len(listed) - len(shown)
    if rest > 0:
        lines.append(f"... and {rest} more (--limit N, or --format markdown for a file)")
    return "\n".join(lines)


def _md_table(head: tuple[str, ...] | list[str], rows: list[tuple[str, ...]]) -> list[str]:
    """A markdown table of cells that are markdown already (names through :func:`md_code`)."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(c: Comparison, limit: int = 100) -> str:
    """The comparison as markdown for a CI job summary: the verdict first, then the families that changed and
    what explains them, then the build's numbers and the other metrics that moved."""
    title = f"### bootprof: {md_code(c['run_id'])}"
    if c["baseline_run_id"] is None:
        return f"{title}\n\n{md_text(c['reason'])}; nothing compared.\n"
    out = [f"{title} vs {md_code(c['baseline_run_id'])}: **{c['verdict']}**", "", f"**{headline_sentence(c)}**", "",
           f"job {md_code(c['job'])}, workload {md_code(c['workload'])}"
           + (f" — **{md_text(c['reason'])}**" if c["reason"] else ""), ""]
    changed = [f for f in c["families"] if f["verdict"] != "noise"][:limit]
    if changed:
        out += _md_table(FAMILY_HEAD, [_family_line(f) for f in changed]) + [""]
    for crate, queries in c.get("explanations", {}).items():
        if queries:
            out += [f"Queries of {md_code(crate)} that grew:", ""]
            out += _md_table(("query", "self time", "this run", "invocations", "this run"), [
                (md_cell(q["label"]), fmt_value("time", q["baseline_ns"]), fmt_value("time", q["ns"]),
                 "-" if q["baseline_invocations"] is None else f"{q['baseline_invocations']:,}",
                 "-" if q["invocations"] is None else f"{q['invocations']:,}") for q in queries]) + [""]
    out += _md_table(("", "baseline", "this run", "change", "verdict"), [
        (TITLES[r["kind"]], fmt_value(r["test"], r["baseline_value"]), fmt_value(r["test"], r["value"]), fmt_change(r),
         r["verdict"]) for r in c["headline"]])
    out += ["", _counts(c) + ".", ""]
    shown = [r for r in c["changes"] if r["verdict"] != "noise" and r["role"] == "explain"][:limit]
    if shown:
        out += ["Queries and functions that moved (they explain; they never fail a job on their own):", ""]
        out += _md_table(("verdict", "change", "metric", "name", "baseline", "this run", "noise"), [
            (r["verdict"], fmt_change(r), TITLES[r["kind"]], md_cell(r["key"]), fmt_value(r["test"], r["baseline_value"]),
             fmt_value(r["test"], r["value"]), fmt_noise(r)) for r in shown])
    return "\n".join(out) + "\n"


def html_page(c: Comparison, baseline_folded: list[tuple[str, int]], run_folded: list[tuple[str, int]],
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
        intro.append(f"<p><b>{esc(headline_sentence(c, str))}</b></p>")
        if c["reason"]:
            intro.append(f"<p><b>{esc(c['reason'])}</b></p>")
        changed = [f for f in c["families"] if f["verdict"] != "noise"][:limit]
        if changed:
            intro.append(table([_family_line(f, str) for f in changed], list(FAMILY_HEAD)))
        for crate, queries in c.get("explanations", {}).items():
            if queries:
                intro.append(f"<p>Queries of {esc(crate)} that grew:</p>" + table(
                    [(q["label"], fmt_value("time", q["baseline_ns"]), fmt_value("time", q["ns"]),
                      "-" if q["baseline_invocations"] is None else f"{q['baseline_invocations']:,}",
                      "-" if q["invocations"] is None else f"{q['invocations']:,}") for q in queries],
                    ["query", "self time", "this run", "invocations", "this run"]))
        intro.append(table([(TITLES[r["kind"]], fmt_value(r["test"], r["baseline_value"]), fmt_value(r["test"], r["value"]),
                             fmt_change(r), r["verdict"]) for r in c["headline"]],
                           ["", "baseline", "this run", "change", "verdict"]))
        intro.append(f"<p>{esc(_counts(c))}.</p>")
        shown = [r for r in c["changes"] if r["verdict"] != "noise" and r["role"] == "explain"][:limit]
        if shown:
            intro.append(table([(r["verdict"], fmt_change(r), TITLES[r["kind"]], r["key"],
                                 fmt_value(r["test"], r["baseline_value"]), fmt_value(r["test"], r["value"]),
                                 fmt_noise(r)) for r in shown],
                               ["verdict", "change", "metric", "name", "baseline", "this run", "noise"]))
    note = ("Differential flame graph of the CPU samples: each run normalized by its own samples; colour is the "
            "change of a frame's inclusive share (red grew, blue shrank; solid: only in one run); width is the "
            "larger of its two shares.") if run_folded or baseline_folded else "No folded CPU stacks in these runs."
    style = ("<style>table.cmp{border-collapse:collapse;margin:6px 12px;font:12px system-ui,sans-serif}"
             "table.cmp td,table.cmp th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style>")
    return flame_page(f"bootprof compare: {c['run_id']}", [], "ppm", note,
                      tree=diff_tree(baseline_folded, run_folded), intro_html=style + "\n".join(intro))
