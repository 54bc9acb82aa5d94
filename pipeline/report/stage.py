"""The report stage's run: ``RUN_DIR/report/index.html`` plus one set of files per section.

Entry point: :func:`run`. Like the aggregate stage, the report is a list of sections
(``SECTIONS``); each is a function ``section(ctx) -> Section | None`` in a sibling module that
returns ``None`` when the run has nothing for it, and otherwise writes its own files into
``ctx.out.path`` and returns the HTML fragment that ``index.html`` shows for it. Adding CPU,
memory or process sections means adding a module and appending it to ``SECTIONS``.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from pipeline import __version__
from pipeline.report import coverage, cpu, memory, processes, queries, query_cpu, summary, sysconfig
from pipeline.report.base import Context, Section, page
from pipeline.runs import atomic_write_text, read_manifest, stage_dir, stage_output
from pipeline.stages import AGGREGATED, REPORTED

if TYPE_CHECKING:
    from pipeline.contracts import ReportSummary

STAGE = REPORTED


SECTIONS: list[Callable[["Context"], Section | None]] = [summary.section, coverage.section, queries.section,
                                                        cpu.section, query_cpu.section, memory.section, processes.section,
                                                        sysconfig.section]
#: Sections that run in processes of their own, beside the rest. They build their tables, trees and pages in
#: Python, so on threads they would only take turns on the GIL (slower than one after another); each process
#: reads its own inputs. The others (small, or users of the dask pool, which
#: belongs to this process) run here meanwhile.
IN_PROCESS = (cpu.section, query_cpu.section, memory.section)
#: Fewer cores than this, and every section runs in this process: on 2 cores (a job runs the warehouse's ingest
#: beside the report) the processes cost more than they gain: the 1 GB synth run's report took 2.55-2.78 s with
#: its sections apart and 1.68-2.00 s without (bench/HISTORY.md).
APART_MIN_CORES = 4


def run_sections(ctx: Context) -> list[Section | None]:
    """Every section of ``SECTIONS``, in that order: those of ``IN_PROCESS`` each in a process of its own
    (:func:`pipeline.cluster.processes`), the rest here meanwhile. The processes get the context without its
    pool. All run here on a machine of fewer than ``APART_MIN_CORES`` cores, and for a run whose inputs are small
    enough to decode in one process (``cluster.inline_below``): there the processes would cost more than the
    sections take."""
    import os

    from pipeline.cluster import processes, runs_inline
    from pipeline.runs import decoded_input_bytes

    apart = [fn for fn in SECTIONS if fn in IN_PROCESS]
    if not apart or (os.cpu_count() or 1) < APART_MIN_CORES or runs_inline(ctx.config.cluster, decoded_input_bytes(ctx.run_dir)):
        return [timed_section(fn, ctx) for fn in SECTIONS]
    lone = Context(ctx.run_dir, ctx.config, None, ctx.out)
    with processes(len(apart)) as procs:
        futures = {fn: procs.submit(timed_section, fn, lone) for fn in apart}
        here = {fn: timed_section(fn, ctx) for fn in SECTIONS if fn not in futures}
        return [futures[fn].result() if fn in futures else here[fn] for fn in SECTIONS]


def timed_section(fn, ctx: Context) -> Section | None:
    """``fn(ctx)``, its seconds in the section's ``seconds`` (for the manifest's ``timings``)."""
    t0 = time.perf_counter()
    section = fn(ctx)
    if section is not None:
        section.seconds = round(time.perf_counter() - t0, 3)
    return section


def render_index(title: str, run_dir: Path, sections: list[Section]) -> str:
    nav = "".join(f'<li><a href="#{s.id}">{html.escape(s.title)}</a></li>' for s in sections)
    # (each section folds: its title is the summary of a details element, open)
    parts = [f'<section id="{s.id}" class="report-section"><details open><summary><h2>{html.escape(s.title)}</h2>'
             f'</summary>\n{s.html}\n</details></section>' for s in sections]
    if not sections:
        parts = ['<p class="empty">This run has no aggregated data the report knows how to show.</p>']
    body = f"""<header><h1>{html.escape(title)}</h1>
<p class="meta">run <code>{html.escape(str(run_dir))}</code> &middot; bootprof {__version__} &middot;
generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>
<nav><ul>{nav}</ul></nav></header>
{_range_bar(sections)}
<main>
{chr(10).join(parts)}
</main>
<script src="static/tables.js"></script>
<script src="static/range.js"></script>"""
    return page(title, body)


def _range_bar(sections: list[Section]) -> str:
    """The bar at the top of the page that says which time range the page shows (``static/range.js``), for a run
    with a process timeline."""
    if not any(s.id == "processes" for s in sections):
        return ""
    return ('<div id="range-bar"><span class="range-text">The whole build. Drag across the '
            '<a href="#processes-timeline">process timeline</a> to show a part of it in the flame graphs and the '
            'tables marked "follows range".</span> <button hidden>whole build</button></div>')


def run(run_dir: Path, config, pool, inputs=None) -> ReportSummary:
    """Write ``RUN_DIR/report/``: every applicable section's files and ``index.html``."""
    run_dir = Path(run_dir)
    aggregated = read_manifest(run_dir, AGGREGATED)
    source = [{"stage": AGGREGATED, "path": str(stage_dir(run_dir, AGGREGATED)),
               "created_utc": aggregated.get("created_utc")}]
    with stage_output(run_dir, STAGE, inputs=source, config=config.resolved()) as out:
        ctx = Context(run_dir, config, pool, out)
        ctx.copy_static("report.css")
        ctx.copy_static("tables.js")
        ctx.copy_static("range.js")
        sections = [s for s in run_sections(ctx) if s is not None]
        atomic_write_text(out.path / "index.html", render_index(config.report.title, run_dir, sections))
        out.manifest["sections"] = {s.id: {"files": s.files, **s.summary} for s in sections}
        out.manifest["timings"] = {s.id: {"seconds": s.seconds} for s in sections}
    return {s.id: s.summary for s in sections}


def headline(summary: ReportSummary) -> str:
    """The stage's line in a job's output."""
    return f"{len(summary)} sections: {', '.join(summary)}" if summary else "no sections"
