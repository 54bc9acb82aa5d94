"""CPU section of the report: flame graph, top functions/processes/crates/modules and their exports.

Applies when ``aggregated/`` has ``cpu_folded`` (the aggregate stage's cpu section). Writes
``flamegraph_cpu.html`` (self-contained, interactive), ``cpu_folded.txt`` (flamegraph.pl/inferno
input), ``cpu.speedscope.json`` and one CSV per cpu table.
"""

from __future__ import annotations

import json

from pipeline.report.flame import Writer, binned_tree, count, flame_page, pct, speedscope, table
from pipeline.runs import read_manifest

AGG = "aggregated"
TABLES = ["cpu_by_process", "cpu_by_crate", "cpu_by_module", "cpu_by_function", "cpu_by_code_crate"]


def section(ctx):
    if not ctx.has(AGG, "cpu_folded"):
        return None
    from pipeline.report import Section

    top_n = ctx.config.report.top_n
    folded = [(r["stack"], r["samples"]) for r in ctx.read(AGG, "cpu_folded", ["stack", "samples"]).to_pylist()]
    total = sum(v for _, v in folded)
    if total == 0:
        return None     # (a trace recorded without CPU samples: the coverage section says how to record them)
    w = Writer(ctx)
    tree = binned_tree(ctx, folded, "cpu_folded_over_time", "samples",
                       read_manifest(ctx.run_dir, AGG)["sections"]["cpu"].get("time_bins"))
    w.text("flamegraph_cpu.html", flame_page("CPU samples", folded, "samples",
                                             "Root frames are programs (rustc with the crate it compiles).", tree=tree))
    w.text("cpu_folded.txt", "".join(f"{s} {v}\n" for s, v in folded))
    w.text("cpu.speedscope.json", json.dumps(speedscope("CPU samples", folded, "none"), separators=(",", ":")))
    for t in TABLES:
        w.csv(AGG, t)

    procs = ctx.read(AGG, "cpu_by_process").to_pylist()
    crates = ctx.read(AGG, "cpu_by_crate").to_pylist()
    functions = ctx.read(AGG, "cpu_by_function").to_pylist()
    modules = ctx.read(AGG, "cpu_by_module").to_pylist()
    for r in functions:
        r["inclusive_pct"] = 100.0 * r["inclusive_samples"] / max(total, 1)
    by_inclusive = sorted(functions, key=lambda r: (-r["inclusive_samples"], r["module"] or "", r["function"]))
    fn_cols = [("module", "module", None), ("function", "function", None), ("self_samples", "self", count),
               ("pct", "self %", pct), ("inclusive_samples", "inclusive", count), ("inclusive_pct", "inclusive %", pct)]
    body = f"""<p><b>{total:,}</b> samples in {len(procs)} processes.
<a href="flamegraph_cpu.html"><b>Open the flame graph</b></a> (click to zoom, search by regex). A time range dragged on
its strip or on the process timeline redraws it, with its callers and callees and its top functions (scroll
inside it); the tables below are for the whole build.</p>
{w.links()}
<iframe class="flame" id="cpu-flame" src="flamegraph_cpu.html" title="CPU flame graph" style="width:100%;height:640px;border:1px solid #dde3e8"></iframe>
<h3>Top {min(top_n, len(functions))} functions by self samples</h3>
{table(functions[:top_n], fn_cols, 'cpu-functions')}
<h3>Top {min(top_n, len(functions))} functions by inclusive samples</h3>
{table(by_inclusive[:top_n], fn_cols, 'cpu-inclusive')}
<h3>Crates being compiled (rustc <code>--crate-name</code>)</h3>
{table(crates[:top_n], [("crate", "crate", None), ("processes", "rustc processes", count),
                        ("samples", "samples", count), ("pct", "%", pct)], 'cpu-crates')}
<h3>Top {min(top_n, len(procs))} processes</h3>
{table(procs[:top_n], [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
                       ("samples", "samples", count), ("pct", "%", pct), ("command_line", "command line", None)],
       'cpu-processes')}
<h3>Modules</h3>
{table(modules[:top_n], [("module", "module", None), ("self_samples", "self", count), ("pct", "self %", pct),
                         ("inclusive_samples", "inclusive", count)], 'cpu-modules')}"""
    w.close()
    return Section("cpu", "CPU samples (ETL)", body, w.files,
                   {"samples": total, "processes": len(procs), "functions": len(functions)})
