"""Coverage section of the report: what the trace holds and what it lacks, and how to record or resolve the
rest. A view with no data says why instead of showing an empty flame graph and empty tables.

Applies to ETL runs (``decoded/`` has ``trace``) and perf runs (``perf_file``: what names their processes). Each missing kind of data names the WPR profile or the xperf
flags that record it; frames that resolved poorly name the symbol path (``--symbol-path``,
``_NT_SYMBOL_PATH``) and list the images without symbols, with their reasons.
"""

from __future__ import annotations

import html

from pipeline.runs import has_table, read_manifest
from pipeline.stages import DECODED, SYMBOLIZED

#: What to record for each kind of data (WPR's built-in profiles; xperf's kernel flags and stack walks).
RECORD = {
    "samples": "CPU samples: WPR's <code>CPU usage</code> profile (<code>wpr -start CPU</code>), or "
               "<code>xperf -on PROC_THREAD+LOADER+PROFILE -stackwalk Profile</code>",
    "virtual_allocs": "VirtualAlloc commits: WPR's <code>VirtualAlloc usage</code> profile (<code>wpr -start "
                      "VirtualAllocation</code>), or <code>xperf -on PROC_THREAD+LOADER+VIRT_ALLOC -stackwalk "
                      "VirtualAlloc</code>",
    "heap_snapshots": "heap snapshots: <code>wpr -snapshotconfig heap -pid PID enable</code>, <code>wpr -start "
                      "heapsnapshot -filemode</code>, <code>wpr -singlesnapshot heap PID</code>, <code>wpr -stop "
                      "out.etl</code>",
}
#: Below this share of resolved frames the report says how to give symbols.
POOR_RESOLUTION = 0.5


def perf_notes(decoded: dict) -> list[str]:
    """What a perf run's processes are named by: perf records no command lines, the self-profiles give rustc's."""
    perf = decoded.get("perf") or {}
    named = perf.get("command_lines_from_profiles") or 0
    if not named:
        return ["<li><b>No command lines</b>: perf records none, so processes are named by their <code>comm</code> "
                "only (<code>rustc</code>, <code>cargo</code>) and CPU by crate, the critical path and CPU by query "
                "are left out. To have them: <code>bootprof capture --perf --self-profile -- BUILD</code> (each "
                "rustc's self-profile carries its command line).</li>"]
    return [f"<li><b>Command lines from self-profiles</b>: {named:,} rustc processes are named by their "
            "self-profile's command line; the other processes (cargo, the linker, build scripts) by their "
            "<code>comm</code> only, as perf records no command lines.</li>"]


def section(ctx):
    perf = has_table(ctx.run_dir, DECODED, "perf_file")
    if not has_table(ctx.run_dir, DECODED, "trace") and not perf:
        return None
    from pipeline.report.base import Section

    decoded = read_manifest(ctx.run_dir, DECODED)
    rows = decoded.get("tables", {})
    notes = perf_notes(decoded) if perf else []
    for table, how in RECORD.items() if not perf else ():
        if not rows.get(table):
            notes.append(f"<li><b>No {how.split(':')[0]}</b> in this trace: the views of them are left out. "
                         f"To record them: {how.split(':', 1)[1].strip()}.</li>")
    symbolized = ctx.run_dir / SYMBOLIZED / "_manifest.json"
    if symbolized.exists():
        m = read_manifest(ctx.run_dir, SYMBOLIZED)
        rate = m.get("resolution_rate")
        if m.get("symbolic_missing") and m.get("frames"):
            what = "Frames are unresolved" if not m.get("resolved_frames") else "Function names only, no lines"
            notes.append(f"<li><b>{what}: {html.escape(m['symbolic_missing'])}</b>; then run "
                         "<code>bootprof symbolize --run RUN_DIR</code> again.</li>")
        elif rate is not None and m.get("frames") and rate < POOR_RESOLUTION:
            missing = sorted(m.get("images_without_symbols", []), key=lambda e: -e.get("frames", 0))[:10]
            items = "".join(f"<li><code>{html.escape(e['module'])}</code> ({e['frames']:,} frames): "
                            f"{html.escape(e['reason'])}</li>" for e in missing)
            notes.append(f"""<li><b>Only {100 * rate:.1f}% of {m['frames']:,} frames resolved to functions</b>; the
others show as <code>module+0x…</code>. Give the symbols: <code>bootprof run JOB --symbol-path P</code>,
<code>bootprof symbolize --run RUN_DIR --symbol-path P</code>, <code>symbolize.symbol_path</code> in the config or
the <code>_NT_SYMBOL_PATH</code> variable, with P in its syntax: <code>DIR;srv*CACHE*URL</code> (a symbol store or
server; rustc's PDBs come with a build that has <code>debuginfo-level = 1</code>). Searched:
<code>{html.escape(m.get('symbol_path') or '(nothing)')}</code>. Images without symbols, most frames first:
<ul>{items}</ul></li>""")
    if not notes:
        return None
    body = f'<div class="banner"><ul>{"".join(notes)}</ul></div>'
    return Section("coverage", "What this trace holds", body, [], {"notes": len(notes)})
