"""Query CPU section: which rustc queries burn CPU in which functions.

Applies when one run holds an ETL trace with samples and self-profiles of the same build, and the query
section matched self-profiles to ETL processes (``self_profile_processes.etl_pid``). Each CPU sample of a
matched rustc process is attributed to the self-profile interval (query or activity) that was running on
the sampled thread at the sample's time: the innermost one, as a flame graph of the self-profile would
show it.

Clocks: a sample's time is ``trace start (FILETIME) + timestamp_ns``, a self-profile event's is
``start_time_ns + start_ns``; both are the machine's wall clock, so the sample's profile time is
``timestamp_ns + trace start - start_time_ns``.

Threads: measureme thread ids are Rust's ``ThreadId``, not the OS thread id. Each OS thread of the process
that has samples is paired with at most one measureme thread, and each measureme thread with at most one OS
thread, greedily by how many of the OS thread's samples fall inside the measureme thread's intervals (most
first; ties to the lower ids). A rustc thread spends its life inside its intervals, so its own samples
score highest; threads whose intervals cover the same times (codegen workers) cannot be told apart, and a
sample on them is attributed as if their timelines were one.

``cpu_by_query`` rows have an ``attribution``: ``query`` (inside an interval of ``kind`` and ``label``),
``outside`` (a profiled thread between intervals: rustc's own work outside any query) or ``unprofiled``
(a thread paired with no measureme thread). ``scope`` is ``process`` (per self-profile) or ``build``
(summed over the processes). ``cpu_by_query_function`` gives, per label, the leaf functions (self samples)
and every function on the stacks (inclusive samples). ``cpu_query_folded`` holds folded stacks with the query
as root frame (``label;module!function;...``), for a flame graph of the queries' CPU.
``cpu_by_query_over_time`` splits the build's rows by the cpu section's time bins (``cpu_over_time``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.aggregate import cpu, queries, resolve
from pipeline.runs import parquet_glob, sql_path

if TYPE_CHECKING:
    from pipeline.aggregate.context import Context
    from pipeline.contracts import QueryCpuCounts

BY_QUERY = "cpu_by_query"
BY_QUERY_FUNCTION = "cpu_by_query_function"
FOLDED = "cpu_query_folded"
BY_QUERY_OVER_TIME = "cpu_by_query_over_time"
#: Root frame of a sample in ``cpu_query_folded`` that no query holds.
OUTSIDE = {"outside": "(outside queries)", "unprofiled": "(thread not in the self-profile)"}
UNITS = "qs"


def aggregate(ctx: Context) -> QueryCpuCounts | None:
    import pyarrow as pa

    matches = ctx.out.table_path(queries.PROCESSES)
    if not (ctx.has("samples") and ctx.has(queries.EVENTS) and matches.exists()):
        return None
    con = resolve.connect(ctx, "samples", "stacks", "processes", "images")
    base = queries.trace_start_unix_ns(ctx, con)
    if base is None:
        return None
    con.execute(f"CREATE VIEW sp AS SELECT * FROM read_parquet({sql_path(matches)}) WHERE etl_pid IS NOT NULL")
    con.execute(f"""CREATE TABLE m AS
        SELECT sp.file_id, sp.crate, sp.etl_pid AS pid, sp.start_time_ns, p.process_key
        FROM sp JOIN procs p ON p.pid = sp.etl_pid AND p.start_ns + {base} = sp.etl_start_ns""")
    if not con.execute("SELECT count(*) FROM m").fetchone()[0]:
        return None
    # (the units of these samples are units of the cpu section too: resolved there once)
    resolve.assign_units(con, ctx, "(SELECT pid, stack_id, ip, timestamp_ns, tid FROM samples "
                                   "WHERE pid IN (SELECT pid FROM m))", UNITS, per_row=True,
                         resolved=lambda: ctx.take(resolve.SAMPLE_UNITS))
    # (the cpu section's time bins: the same span of the same samples)
    bin_sql, _ = resolve.time_bins(con, "samples", "s.timestamp_ns", cpu.CPU_BINS)
    samples = con.execute(f"""
        SELECT m.file_id, s.tid::BIGINT AS tid, s.timestamp_ns + {base} - m.start_time_ns AS t, s.unit_id,
               {bin_sql} AS bin
        FROM {UNITS} s JOIN m USING (process_key) ORDER BY m.file_id, tid, t""").fetchnumpy()
    events = con.sql(f"""
        SELECT file_id, thread::BIGINT AS thread, event_index, parent, start_ns, end_ns, kind, label
        FROM read_parquet({sql_path(parquet_glob(ctx.source(queries.EVENTS)))})
        WHERE payload = 'interval' AND file_id IN (SELECT file_id FROM m)
        ORDER BY file_id, thread, start_ns, end_ns DESC, event_index""").to_arrow_table()
    ev = {c: events.column(c).to_numpy() for c in ("file_id", "thread", "event_index", "parent", "start_ns", "end_ns")}
    con.register("ev_arrow", events.select(["kind", "label"]).append_column("row", pa.array(np.arange(len(events)))))
    con.execute("CREATE TABLE ev_names AS SELECT row, kind, label FROM ev_arrow")
    con.unregister("ev_arrow")

    # Per sample: the row of its innermost interval (-1: none) and whether its thread is profiled; then counted
    # per (unit, file, row, profiled), so that no per-sample row and no string goes through Python.
    parts, pairs_total = [], 0
    s_file = samples["file_id"]
    for f in np.unique(s_file):
        sel = np.nonzero(s_file == f)[0]
        rows = np.nonzero(ev["file_id"] == f)[0]
        event, thread, pairs = attribute(samples["tid"][sel], samples["t"][sel], ev["thread"][rows],
                                         ev["event_index"][rows], ev["parent"][rows], ev["start_ns"][rows],
                                         ev["end_ns"][rows])
        pairs_total += pairs
        parts.append(np.stack([samples["unit_id"][sel], np.full(len(sel), f, np.int64),
                               np.where(event >= 0, rows[np.maximum(event, 0)], -1), (thread >= 0).astype(np.int64),
                               samples["bin"][sel].astype(np.int64)]))
    keys = np.concatenate(parts, axis=1) if parts else np.zeros((5, 0), np.int64)
    con.register("attributed_arrow", pa.table({"unit_id": keys[0], "file_id": keys[1], "row": keys[2], "profiled": keys[3],
                                               "bin": keys[4].astype(np.int32)}))
    con.execute("""CREATE TABLE attributed AS
        SELECT a.unit_id, a.file_id::INTEGER AS file_id, a.bin, e.kind, e.label,
               CASE WHEN a.row >= 0 THEN 'query' WHEN a.profiled = 1 THEN 'outside' ELSE 'unprofiled' END AS attribution, a.n
        FROM (SELECT unit_id, file_id, row, profiled, bin, count(*)::BIGINT AS n FROM attributed_arrow GROUP BY ALL) a
        LEFT JOIN ev_names e ON e.row = a.row""")
    con.unregister("attributed_arrow")

    con.execute(f"""COPY (
        WITH per AS (SELECT a.file_id, m.crate, m.pid, a.kind, a.label, a.attribution, sum(a.n)::BIGINT AS samples
                     FROM attributed a JOIN m USING (file_id) GROUP BY ALL),
        rows AS (SELECT 'process' AS scope, file_id, crate, pid, kind, label, attribution, samples,
                        round(100.0 * samples / sum(samples) OVER (PARTITION BY file_id), 3) AS pct FROM per
                 UNION ALL
                 SELECT 'build', NULL, NULL, NULL, kind, label, attribution, sum(samples)::BIGINT,
                        round(100.0 * sum(samples) / (SELECT sum(samples) FROM per), 3) FROM per GROUP BY ALL)
        SELECT scope, file_id::INTEGER AS file_id, crate, pid::BIGINT AS pid, kind, label, attribution, samples, pct
        FROM rows ORDER BY scope, file_id NULLS FIRST, samples DESC, label NULLS LAST, kind, attribution
        ) TO {sql_path(ctx.out.table_path(BY_QUERY))} (FORMAT parquet, COMPRESSION zstd)""")
    con.execute(f"""COPY (
        SELECT bin, kind, label, attribution, sum(n)::BIGINT AS samples FROM attributed GROUP BY ALL
        ORDER BY bin, samples DESC, label NULLS LAST, kind, attribution
        ) TO {sql_path(ctx.out.table_path(BY_QUERY_OVER_TIME))} (FORMAT parquet, COMPRESSION zstd)""")
    weights = "SELECT unit_id, label, sum(n)::BIGINT AS samples FROM attributed GROUP BY ALL"
    con.execute(f"""COPY (SELECT * FROM ({resolve.by_frames(UNITS, weights, ['module', 'function', 'raw_name'],
                                                             ['samples'], 'crate', by=('label',))})
                          ORDER BY label NULLS LAST, self_samples DESC, inclusive_samples DESC, module, function, raw_name)
                   TO {sql_path(ctx.out.table_path(BY_QUERY_FUNCTION))} (FORMAT parquet, COMPRESSION zstd)""")
    # (summed per root frame and unit first, so that each unit's ~1 KB folded stack is joined and hashed once per
    # root, not once for every file, time bin and kind it has samples in)
    con.execute(f"""COPY (
        WITH per AS (
            SELECT CASE a.attribution WHEN 'query' THEN replace(a.label, ';', ':') WHEN 'outside' THEN '{OUTSIDE["outside"]}'
                        ELSE '{OUTSIDE["unprofiled"]}' END AS root, a.unit_id, sum(a.n) AS n
            FROM attributed a GROUP BY ALL)
        SELECT p.root || coalesce(';' || st.folded, '') AS stack, sum(p.n)::BIGINT AS samples
        FROM per p LEFT JOIN {UNITS}_stacks st USING (unit_id) GROUP BY 1 ORDER BY 1
        ) TO {sql_path(ctx.out.table_path(FOLDED))} (FORMAT parquet, COMPRESSION zstd)""")
    counts = dict(con.execute("SELECT attribution, sum(n)::BIGINT FROM attributed GROUP BY 1").fetchall())
    return {"processes": int(con.execute("SELECT count(*) FROM m").fetchone()[0]), "samples": int(sum(counts.values())),
            "in_queries": int(counts.get("query", 0)), "outside_queries": int(counts.get("outside", 0)),
            "unprofiled_threads": int(counts.get("unprofiled", 0)), "thread_pairs": int(pairs_total)}


def innermost(t: np.ndarray, starts: np.ndarray, ends: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Position of the innermost interval holding each time of ``t`` (bounds inclusive), -1 when none.

    ``starts`` ascending (ties: the outer interval first), ``parent`` the position of each interval's
    parent (-1 for roots). The last interval to start at or before t holds t unless it ended before t;
    then the innermost one holding t is its nearest ancestor that has not ended: one step up the tree per
    loop, as deep as the nesting at most."""
    pos = np.searchsorted(starts, t, side="right") - 1
    while True:
        ended = (pos >= 0) & (ends[np.maximum(pos, 0)] < t)
        if not ended.any():
            return pos
        pos[ended] = parent[pos[ended]]


def attribute(tid, t, thread, event_index, parent_index, starts, ends) -> tuple[np.ndarray, np.ndarray, int]:
    """For the samples (tid, t) of one process and its self-profile's intervals (sorted by thread, start):
    the row of the innermost interval of each sample (-1: none), the measureme thread its OS thread is
    paired with (-1: none), and how many threads were paired."""
    threads = np.unique(thread)
    spans = {}
    for th in threads.tolist():
        rows = np.nonzero(thread == th)[0]
        order = np.argsort(event_index[rows])
        by_index = event_index[rows][order]
        k = np.searchsorted(by_index, parent_index[rows])
        found = (parent_index[rows] >= 0) & (k < len(by_index)) & (by_index[np.minimum(k, len(by_index) - 1)] == parent_index[rows])
        parent = np.where(found, order[np.minimum(k, len(order) - 1)], -1)
        spans[th] = (rows, starts[rows], ends[rows], parent)
    tids = np.unique(tid)
    score = []
    for os_tid in tids.tolist():
        ts = t[tid == os_tid]
        for th, (rows, s, e, parent) in spans.items():
            n = int((innermost(ts, s, e, parent) >= 0).sum())
            if n:
                score.append((-n, os_tid, th))
    paired: dict[int, int] = {}
    used: set[int] = set()
    for _, os_tid, th in sorted(score):
        if os_tid not in paired and th not in used:
            paired[os_tid] = th
            used.add(th)
    event = np.full(len(t), -1, np.int64)
    thread_of = np.full(len(t), -1, np.int64)
    for os_tid, th in paired.items():
        sel = tid == os_tid
        rows, s, e, parent = spans[th]
        pos = innermost(t[sel], s, e, parent)
        event[sel] = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
        thread_of[sel] = th
    return event, thread_of, len(paired)
