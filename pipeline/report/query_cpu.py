"""Query CPU section of the report: which rustc queries burn CPU in which functions.

Applies when ``aggregated/`` has ``cpu_by_query`` (a run with an ETL trace and the self-profiles of the same
build). Shows the queries by CPU samples and, for the top queries, their leaf functions; writes
``flamegraph_query_cpu.html`` (the query is the root frame, the call stack above it), its folded stacks,
a speedscope file and the tables as CSV.
"""

from __future__ import annotations

import json

from pipeline.report.flame import Writer, count, flame_page, pct, speedscope, table
from pipeline.report.timerange import Follow, Pool, binned, cpu_bins
from pipeline.stages import AGGREGATED

AGG = AGGREGATED
TABLES = ["cpu_by_query", "cpu_by_query_function"]
#: Queries whose leaf functions the page lists, and functions listed for each.
TOP_QUERIES, TOP_FUNCTIONS = 10, 8
SHOWN = {"outside": "(outside queries)", "unprofiled": "(thread not in the self-profile)"}


def section(ctx):
    if not ctx.has(AGG, "cpu_by_query"):
        return None
    from pipeline.report.base import Section

    top_n = ctx.config.report.top_n
    rows = ctx.read(AGG, "cpu_by_query").to_pylist()
    build = [r for r in rows if r["scope"] == "build"]
    total = sum(r["samples"] for r in build)
    if total == 0:
        return None
    for r in build:
        r["query"] = r["label"] if r["attribution"] == "query" else SHOWN[r["attribution"]]
    w = Writer(ctx)
    folded = [(r["stack"], r["samples"]) for r in ctx.read(AGG, "cpu_query_folded", ["stack", "samples"]).to_pylist()]
    w.text("flamegraph_query_cpu.html", flame_page(
        "CPU samples by rustc query", folded, "samples",
        "Root frames are the self-profile query (or activity) running on the sampled thread; above it, the call stack."))
    w.text("query_cpu_folded.txt", "".join(f"{s} {v}\n" for s, v in folded))
    w.text("query_cpu.speedscope.json", json.dumps(speedscope("CPU samples by rustc query", folded, "none"),
                                                    separators=(",", ":")))
    for t in TABLES:
        w.csv(AGG, t)
    functions = ctx.read(AGG, "cpu_by_query_function").to_pylist()
    by_query: dict[str | None, list[dict]] = {}
    for f in functions:
        if f["self_samples"]:
            by_query.setdefault(f["label"], []).append(f)
    of_query = {r["label"]: r["samples"] for r in build if r["attribution"] == "query"}
    leaf_rows = []
    for r in [r for r in build if r["attribution"] == "query"][:TOP_QUERIES]:
        for f in sorted(by_query.get(r["label"], []), key=lambda f: -f["self_samples"])[:TOP_FUNCTIONS]:
            leaf_rows.append({"query": r["label"], "module": f["module"], "function": f["function"],
                              "samples": f["self_samples"], "pct": 100.0 * f["self_samples"] / of_query[r["label"]]})
    processes = len({r["file_id"] for r in rows if r["scope"] == "process"})
    follow = _follow(ctx, build)
    inside = sum(r["samples"] for r in build if r["attribution"] == "query")
    body = f"""<p><b>{total:,}</b> CPU samples of {processes} rustc processes that have a self-profile;
<b>{100.0 * inside / total:.1f}%</b> of them ran inside a query or activity. Each sample is attributed to the
innermost self-profile interval running on its thread at its time.
<a href="flamegraph_query_cpu.html"><b>Open the flame graph by query</b></a>.</p>
{w.links()}
<h3>Queries by CPU samples</h3>
{table(build, [("query", "query / activity", None), ("kind", "kind", None),
                                            ("samples", "samples", count), ("pct", "%", pct)], 'query-cpu', follow, top_n)}
{follow.pool.script() if follow else ""}
<h3>Where the top {min(TOP_QUERIES, len(of_query))} queries of the whole build spend their CPU (leaf functions)</h3>
{table(leaf_rows, [("query", "query", None), ("module", "module", None), ("function", "function", None),
                   ("samples", "self samples", count), ("pct", "% of the query", pct)], 'query-cpu-functions')}"""
    w.close()
    return Section("query-cpu", f"CPU by rustc query ({ctx.recorder()} + self-profile)", body, w.files,
                   {"samples": total, "processes": processes, "queries": len(of_query),
                    "top": build[0]["query"]})


def _follow(ctx, build: list[dict]) -> Follow | None:
    """The queries table follows a picked time range through ``cpu_by_query_over_time`` (the cpu section's bins)."""
    bins = cpu_bins(ctx)
    if not bins or not ctx.has(AGG, "cpu_by_query_over_time"):
        return None
    key = lambda r: (r["kind"], r["label"], r["attribution"])  # noqa: E731
    series = binned(ctx.read(AGG, "cpu_by_query_over_time").to_pylist(), key, "samples")
    return Follow(Pool("query-cpu", bins), "samples", series={"samples": [series.get(key(r), {}) for r in build]},
                  pct={"pct": ("samples", None)})
