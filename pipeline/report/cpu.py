"""CPU section of the report: flame graph, top functions/processes/crates/modules and their exports.

Applies when ``aggregated/`` has ``cpu_folded`` (the aggregate stage's cpu section). Writes
``flamegraph_cpu.html`` (self-contained, interactive), ``cpu_folded.txt`` (flamegraph.pl/inferno
input), ``cpu.speedscope.json`` and one CSV per cpu table.
"""

from __future__ import annotations

import json

from pipeline.report.processes import STAGE, TARGET, said
from pipeline.report.flame import Writer, binned_tree, count, flame_page, pct, speedscope, table
from pipeline.report.timerange import Follow, Pool, binned, cpu_bins, total as total_of
from pipeline.stages import AGGREGATED

AGG = AGGREGATED
TABLES = ["cpu_by_process", "cpu_by_crate", "cpu_by_module", "cpu_by_function", "cpu_by_code_crate"]


def section(ctx):
    if not ctx.has(AGG, "cpu_folded"):
        return None
    from pipeline.report.base import Section

    top_n = ctx.config.report.top_n
    folded = [(r["stack"], r["samples"]) for r in ctx.read(AGG, "cpu_folded", ["stack", "samples"]).to_pylist()]
    total = sum(v for _, v in folded)
    if total == 0:
        return None     # (a trace recorded without CPU samples: the coverage section says how to record them)
    w = Writer(ctx)
    tree = binned_tree(ctx, folded, "cpu_folded_over_time", "samples", cpu_bins(ctx))
    w.text("flamegraph_cpu.html", flame_page("CPU samples", folded, "samples",
                                             "Root frames are programs (rustc with the crate it compiles).", tree=tree))
    w.text("cpu_folded.txt", "".join(f"{s} {v}\n" for s, v in folded))
    w.text("cpu.speedscope.json", json.dumps(speedscope("CPU samples", folded, "none"), separators=(",", ":")))
    for t in TABLES:
        w.csv(AGG, t)

    procs = ctx.read(AGG, "cpu_by_process").to_pylist()
    crates = crates_by_stage(procs, total)
    functions = ctx.read(AGG, "cpu_by_function").to_pylist()
    modules = ctx.read(AGG, "cpu_by_module").to_pylist()
    for r in functions:
        r["inclusive_pct"] = 100.0 * r["inclusive_samples"] / max(total, 1)
    by_inclusive = sorted(functions, key=lambda r: (-r["inclusive_samples"], r["module"] or "", r["function"]))
    fn_cols = [("module", "module", None), ("function", "function", None), ("self_samples", "self", count),
               ("pct", "self %", pct), ("inclusive_samples", "inclusive", count), ("inclusive_pct", "inclusive %", pct)]
    follow = _follows(ctx, procs, crates, functions, by_inclusive, modules)
    body = f"""<p><b>{total:,}</b> samples in {len(procs)} processes.
<a href="flamegraph_cpu.html" data-range><b>Open the flame graph</b></a> (click to zoom, search by regex). A time range dragged on
its strip or on the process timeline redraws it, with its callers and callees and its top functions (scroll
inside it). A range picked on the process timeline also recounts the tables marked "follows range" below; otherwise they are
for the whole build.</p>
{w.links()}
<iframe class="flame" id="cpu-flame" src="flamegraph_cpu.html" title="CPU flame graph" style="width:100%;height:640px;border:1px solid #dde3e8"></iframe>
<h3>Top {min(top_n, len(functions))} functions by self samples</h3>
{table(functions, fn_cols, 'cpu-functions', follow.get('functions'), top_n)}
<h3>Top {min(top_n, len(functions))} functions by inclusive samples</h3>
{table(by_inclusive, fn_cols, 'cpu-inclusive', follow.get('inclusive'), top_n)}
<h3>Crates being compiled (rustc <code>--crate-name</code>)</h3>
{table(crates, [("crate", "crate", None), ("stage", "stage", None), ("target", "target", None),
                ("processes", "rustc processes", count), ("samples", "samples", count), ("pct", "%", pct)],
       'cpu-crates', follow.get('crates'), top_n)}
<h3>Top {min(top_n, len(procs))} processes</h3>
{table(procs, [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
                       ("samples", "samples", count), ("pct", "%", pct), ("command_line", "command line", None)],
       'cpu-processes', follow.get('processes'), top_n)}
<h3>Modules</h3>
{table(modules, [("module", "module", None), ("self_samples", "self", count),
                         ("pct", "self %", pct), ("inclusive_samples", "inclusive", count)], 'cpu-modules',
       follow.get('modules'), top_n)}
{follow["functions"].pool.script() if follow else ""}"""
    w.close()
    return Section("cpu", f"CPU samples ({ctx.recorder()})", body, w.files,
                   {"samples": total, "processes": len(procs), "functions": len(functions)})


def _crate_key(r: dict) -> tuple:
    cmd = r.get("command_line")
    return (r["crate"], r.get("stage") or said(STAGE, cmd) or "", r.get("target") or said(TARGET, cmd) or "")


def crates_by_stage(procs: list[dict], total: int) -> list[dict]:
    """The crates being compiled, apart by the stage of the compiler and the target (a crate built by stage0 and by
    stage1 is two rows): rustc processes and samples, most samples first."""
    rows: dict[tuple, dict] = {}
    for r in procs:
        if r["crate"] is None:
            continue
        key = _crate_key(r)
        row = rows.setdefault(key, {"crate": key[0], "stage": key[1], "target": key[2], "processes": 0, "samples": 0})
        row["processes"] += 1
        row["samples"] += r["samples"] or 0
    for row in rows.values():
        row["pct"] = 100.0 * row["samples"] / max(total, 1)
    return sorted(rows.values(), key=lambda r: (-r["samples"], r["crate"], r["stage"], r["target"]))


def _follows(ctx, procs, crates, functions, by_inclusive, modules) -> dict[str, Follow]:
    """How the CPU tables follow a picked time range: their rows' samples per time bin of the aggregate stage
    (``cpu_over_time``, ``cpu_functions_over_time``, ``cpu_modules_over_time``); none for a run aggregated
    without them."""
    bins = cpu_bins(ctx)
    if not bins or not all(ctx.has(AGG, t) for t in ("cpu_over_time", "cpu_functions_over_time", "cpu_modules_over_time")):
        return {}
    per_process = binned(ctx.read(AGG, "cpu_over_time", ["process_key", "bin", "samples"]).to_pylist(),
                         lambda r: r["process_key"], "samples")
    everything = total_of(per_process.values())
    fn = ctx.read(AGG, "cpu_functions_over_time").to_pylist()
    key = lambda r: (r["module"], r["function"], r["raw_name"])  # noqa: E731
    fn_self, fn_incl = binned(fn, key, "self_samples"), binned(fn, key, "inclusive_samples")
    mod = ctx.read(AGG, "cpu_modules_over_time").to_pylist()
    mod_self, mod_incl = binned(mod, lambda r: r["module"], "self_samples"), binned(mod, lambda r: r["module"], "inclusive_samples")
    by_crate: dict[tuple, list] = {}
    for r in procs:
        if r["crate"] is not None:
            by_crate.setdefault(_crate_key(r), []).append(per_process.get(r["process_key"], {}))
    empty: dict[int, int] = {}
    pool = Pool("cpu", bins)

    def functions_follow(rows, sort):
        return Follow(pool, sort, series={"self_samples": [fn_self.get(key(r), empty) for r in rows],
                                                  "inclusive_samples": [fn_incl.get(key(r), empty) for r in rows]},
                      pct={"pct": ("self_samples", everything), "inclusive_pct": ("inclusive_samples", everything)})
    return {
        "functions": functions_follow(functions, "self_samples"),
        "inclusive": functions_follow(by_inclusive, "inclusive_samples"),
        "crates": Follow(pool, "samples", series={"samples": [total_of(by_crate.get(_crate_key(r), [])) for r in crates]},
                         members={"processes": [by_crate.get(_crate_key(r), []) for r in crates]},
                         pct={"pct": ("samples", everything)}),
        "processes": Follow(pool, "samples", series={"samples": [per_process.get(r["process_key"], empty) for r in procs]},
                            pct={"pct": ("samples", everything)}),
        "modules": Follow(pool, "self_samples",
                          series={"self_samples": [mod_self.get(r["module"], empty) for r in modules],
                                  "inclusive_samples": [mod_incl.get(r["module"], empty) for r in modules]},
                          pct={"pct": ("self_samples", everything)}),
    }
