"""The aggregate stage's run: decoded tables -> summaries in ``RUN_DIR/aggregated/``.

Entry point: :func:`run`. The stage is a list of sections (``SECTIONS``); each is a function
``section(ctx) -> dict | None`` in a sibling module that looks at the decoded output, returns
``None`` when the run has nothing for it (e.g. no self-profiles), and otherwise writes its tables
with ``ctx.out.write_table`` and returns its summary counts. A new kind of summary (CPU samples,
memory, processes) is a new module appended to ``SECTIONS``; existing sections stay untouched. Sections run
at once, on threads (but those in ``ON_CALLER``).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pipeline import steps, timings
from pipeline.aggregate import cpu, memory, processes, queries, query_cpu, resolve
from pipeline.aggregate.context import SOURCE, Context, FramesFinal
from pipeline.errors import is_interrupt, out_of_memory
from pipeline.runs import read_manifest, stage_dir, stage_output, upstream_hashes
from pipeline.stages import AGGREGATED, upstream_of

if TYPE_CHECKING:
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.contracts import AggregateSummary

STAGE = AGGREGATED

SECTIONS: list[Callable[[Context], Mapping[str, object] | None]] = [
    queries.aggregate, cpu.aggregate, memory.aggregate, processes.aggregate, query_cpu.aggregate]
#: Sections that run one after the other on the calling thread, in this order: those that use the dask pool (a
#: lazy pool starts its cluster in the thread that first uses it, and must close it there) and those that read
#: what one of them wrote. The others run beside them, each on a thread of its own with its own DuckDB
#: connection (DuckDB, numpy and numba let go of the GIL).
ON_CALLER = (queries.aggregate, query_cpu.aggregate)
#: What a section hands to others while it runs (key -> the section that offers it, beside the caller's
#: thread): the cpu section's resolved sample units, which query_cpu adopts for its samples instead of resolving
#: them again.
OFFERS = {resolve.SAMPLE_UNITS: cpu.aggregate}


def section_name(section: Callable) -> str:
    return section.__module__.rsplit(".", 1)[-1]


def run(run_dir: Path, config: Config, pool: Pool, inputs=None, after: Callable[[], Any] | None = None
        ) -> AggregateSummary:
    """Run every applicable section on ``RUN_DIR/decoded``; returns {section: summary}.

    ``after``: the stage starts while ``symbolize`` still writes ``symbolized/`` (its row in :mod:`pipeline.stages`
    says it may: what comes from ``decoded/`` alone is done meanwhile, on the cores symbolize leaves idle);
    ``after()`` returns once that is final (and raises if symbolize failed). The sections call it before they read frames, and the stage
    before it ends, so that its manifest names the ``symbolized/`` it was made from."""
    run_dir = Path(run_dir)
    decoded = read_manifest(run_dir, SOURCE)
    summary: AggregateSummary = {}
    source = [{"stage": SOURCE, "path": str(stage_dir(run_dir, SOURCE)), "created_utc": decoded.get("created_utc")}]
    frames_final = FramesFinal(run_dir, after)
    with stage_output(run_dir, STAGE, inputs=source, config=config.resolved()) as out:
        ctx = Context(run_dir, config, pool, out, decoded, frames_final=frames_final, at_once=parallel_sections())
        results = _run_sections(ctx)
        frames_final()
        summary = {section_name(s): results[s] for s in SECTIONS if results[s] is not None}
        out.manifest["sections"] = summary
        # (each section's seconds, and those of its largest statements and waits: where the stage's time went)
        out.manifest["timings"] = {name: ctx.timings[name] for name in summary if name in ctx.timings}
        out.manifest["upstream"] = upstream_hashes(run_dir, upstream_of(STAGE))
    return summary


def _run_sections(ctx: Context) -> dict[Callable, Mapping[str, object] | None]:
    """Every section: ``ON_CALLER`` in order on this thread, the others at once beside them; a section that fails
    fails the stage (the first in ``SECTIONS`` order), once every section has ended."""
    results: dict[Callable, Any] = {}
    errors: dict[Callable, BaseException] = {}
    beside = [s for s in SECTIONS if s not in ON_CALLER]
    ctx.offers = {key: Future() for key, section in OFFERS.items() if section in beside}
    futures: dict[Callable, Future] = {}
    try:
        futures = {section: steps.beside(functools.partial(_run_section, section, ctx),
                                         f"aggregate-{section_name(section)}") for section in beside}
        for future in futures.values():
            # (the stage fails: sections that wait for symbolize need not, and end)
            future.add_done_callback(lambda f: ctx.frames_final.cancel() if f.exception() is not None else None)
        for section in ON_CALLER:
            try:
                results[section] = _run_section(section, ctx)
            except Exception as exc:        # (reported below, once the sections beside have ended)
                if is_interrupt(exc):       # (Ctrl-C during a DuckDB query of this thread)
                    raise KeyboardInterrupt from None
                errors[section] = exc
                ctx.frames_final.cancel()
                break
    except BaseException:       # (Ctrl-C: the sections waiting for symbolize are let go, the threads end)
        ctx.frames_final.cancel()
        raise
    finally:
        steps.wait_for(futures.values())    # (a section writes into the stage's output: none outlives the stage)
    for section, future in futures.items():
        if future.exception() is not None:
            errors[section] = future.exception()
        else:
            results[section] = future.result()
    # (the first error in SECTIONS order; a section let go of because another failed says less than that one)
    for section in sorted(errors, key=lambda s: (isinstance(errors[s], FramesFinal.Cancelled), SECTIONS.index(s))):
        raise errors[section]
    return {section: results.get(section) for section in SECTIONS}


def parallel_sections() -> int:
    """How many sections run at once: they share ``aggregate.memory_limit`` (``resolve.section_memory``)."""
    return len(SECTIONS) - len(ON_CALLER) + 1


def _run_section(section: Callable[[Context], Mapping[str, object] | None], ctx: Context
                 ) -> Mapping[str, object] | None:
    """One section; DuckDB running out of memory (``aggregate.memory_limit``, even with spilling) ends the
    stage with the setting to change, not a traceback, and nothing of the stage is written."""
    import time

    import duckdb

    spent: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        with timings.recording(spent):
            return section(ctx)
    except duckdb.OutOfMemoryException as exc:
        error = out_of_memory(ctx.run_dir, f"the aggregate section '{section_name(section)}'", "aggregate.memory_limit",
                              ctx.config.aggregate.memory_limit, exc)
    finally:
        for key in (k for k, s in OFFERS.items() if s is section):
            ctx.offer(key, None)        # (what it did not offer: those that wait go on without it)
        ctx.timings[section_name(section)] = {"seconds": round(time.perf_counter() - t0, 3),
                                              "steps": timings.top(spent)}
    # (raised here, outside the handler: the error keeps no reference to the section's frames, whose DuckDB
    # connection then goes away with its spill directory)
    raise error


def headline(summary: AggregateSummary) -> str:
    """The stage's line in a job's output: the headline numbers of each section that ran."""
    parts = []
    if cpu := summary.get("cpu"):
        parts.append(f"{cpu.get('samples', 0):,} CPU samples, {cpu.get('processes', 0):,} processes")
    if memory := summary.get("memory"):
        parts.append(f"{memory.get('commit_bytes', 0) / 1e9:,.1f} GB committed, peak "
                     f"{memory.get('peak_commit_bytes', 0) / 1e9:,.1f} GB")
    if queries := summary.get("queries"):
        query_cpu = summary.get("query_cpu") or {}
        parts.append(f"{queries.get('files', 0):,} self-profiles" + (
            f", {100 * query_cpu.get('in_queries', 0) / query_cpu['samples']:.1f} % of their samples in queries"
            if query_cpu.get("samples") else ""))
    return "; ".join(parts) or "nothing to aggregate"
