"""Memory section of the report: VirtualAlloc commit flame graph and tables, heap snapshot summaries.

Applies when ``aggregated/`` has ``commit_folded`` or ``heap_snapshots_summary``. Writes
``flamegraph_commit.html`` (bytes committed per stack), ``commit_folded.txt`` and CSV exports.
"""

from __future__ import annotations

from pipeline.report.flame import Writer, count, flame_page, fmt_bytes, fmt_ms, table

AGG = "aggregated"
COMMIT_TABLES = ["commit_by_process", "commit_by_function", "commit_by_stack"]
HEAP_TABLES = ["heap_snapshots_summary", "heap_snapshot_by_stack"]


def section(ctx):
    has_commit = ctx.has(AGG, "commit_folded")
    has_heap = ctx.has(AGG, "heap_snapshots_summary")
    if not (has_commit or has_heap):
        return None
    from pipeline.report import Section

    top_n = ctx.config.report.top_n
    w = Writer(ctx)
    parts, summary = [], {}
    if has_commit:
        folded = [(r["stack"], r["commit_bytes"]) for r in ctx.read(AGG, "commit_folded").to_pylist()]
        w.text("flamegraph_commit.html", flame_page("VirtualAlloc commit", folded, "bytes",
                                                    "Width: bytes committed by each stack over the whole trace."))
        w.text("commit_folded.txt", "".join(f"{s} {v}\n" for s, v in folded))
        for t in COMMIT_TABLES:
            w.csv(AGG, t)
        procs = ctx.read(AGG, "commit_by_process").to_pylist()
        functions = ctx.read(AGG, "commit_by_function").to_pylist()
        by_outstanding = sorted(functions, key=lambda r: (-r["inclusive_outstanding_bytes"], r["module"] or "",
                                                          r["function"]))
        stacks = ctx.read(AGG, "commit_by_stack").to_pylist()
        total = sum(r["commit_bytes"] for r in procs)
        outstanding = sum(r["outstanding_bytes"] for r in procs)
        summary.update(commit_bytes=total, outstanding_bytes=outstanding)
        parts.append(f"""<p>{fmt_bytes(total)} committed by VirtualAlloc, {fmt_bytes(outstanding)} still committed at
the end of the trace. <a href="flamegraph_commit.html"><b>Commit flame graph</b></a></p>
<h3>Peak commit per process</h3>
{table(procs[:top_n], [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
                       ("peak_commit_bytes", "peak commit", fmt_bytes), ("peak_ns", "peak at", fmt_ms),
                       ("commit_bytes", "committed", fmt_bytes), ("outstanding_bytes", "outstanding at end", fmt_bytes),
                       ("allocs", "commits", count), ("frees", "frees", count)], 'commit-processes')}
<h3>Functions holding the most outstanding commit (inclusive)</h3>
{table(by_outstanding[:top_n], [("module", "module", None), ("function", "function", None),
                                 ("inclusive_outstanding_bytes", "outstanding", fmt_bytes),
                                 ("inclusive_commit_bytes", "committed", fmt_bytes),
                                 ("inclusive_allocs", "commits", count)], 'commit-functions')}
<h3>Stacks that committed the most</h3>
{table(stacks[:top_n], [("stack_id", "stack", None), ("commit_bytes", "committed", fmt_bytes),
                        ("outstanding_bytes", "outstanding", fmt_bytes), ("allocs", "commits", count),
                        ("folded", "frames (root first)", None)], 'commit-stacks')}""")
    if has_heap:
        for t in HEAP_TABLES:
            w.csv(AGG, t)
        snaps = ctx.read(AGG, "heap_snapshots_summary").to_pylist()
        summary["heap_snapshots"] = len(snaps)
        flame = ""
        if ctx.has(AGG, "heap_folded"):
            folded = [(r["stack"], r["bytes"]) for r in ctx.read(AGG, "heap_folded").to_pylist()]
            w.text("flamegraph_heap.html", flame_page("Heap bytes at each process's largest snapshot", folded, "bytes",
                                                      "Width: busy heap bytes by allocating stack."))
            w.text("heap_folded.txt", "".join(f"{s} {v}\n" for s, v in folded))
            flame = '<p><a href="flamegraph_heap.html"><b>Heap flame graph</b></a> (largest snapshot of each process)</p>'
        parts.append(f"""<h3>Heap snapshots</h3>{flame}
{table(snaps[:top_n], [("pid", "pid", None), ("image_name", "image", None), ("crate", "crate", None),
                       ("instance", "snapshot", None), ("timestamp_ns", "time", fmt_ms), ("bytes", "busy", fmt_bytes),
                       ("blocks", "blocks", count), ("untracked_bytes", "without stack", fmt_bytes)], 'heap-snapshots')}""")
    body = w.links() + "\n".join(parts)
    w.close()
    return Section("memory", "Memory (ETL)", body, w.files, summary)
