"""Cross-buffer joins on the global event order, run after all partitions are on disk.

The global order of events is (raw timestamp, cpu, stream_pos): §1.5/§5.3 of the format notes. What is
small or needs the whole trace is SQL in DuckDB over the partitions' scratch parquet (which may spill
to disk): process, thread and image lifetimes, ImageID/DbgID, the stack-key definitions (sorted once, for
the buckets) and the ``stacks`` table. The per-event joins (samples, VirtualAlloc, heap events, event
stacks, stack-key references: millions of rows) run in time buckets on the workers, in ``buckets``.

Stacks (§3.5, §3.6)::

    event @ts, thread T ──► StackWalk   {event_ts=ts, T, frames}     full stacks, possibly two records
                            StackKeyKernel/User {event_ts=ts, T, key} (kernel half, later user half,
                                                                      maybe on another CPU's buffer)
    key ──► first KeyDelete/KeyRundown/Create definition of that key at or after the reference
            (keys are reused, so "any definition" is wrong; ``stackkeys.resolve_keys`` picks the right one)

All pieces of one (event_ts, thread) are concatenated, kernel pieces before user pieces (a piece is a
user half when its leaf frame is a user address, or a StackKeyUser), each kind in stream order, and the
resulting frame lists are deduplicated into ``stacks``. Samples and heap events find their stack by
(timestamp, thread); VirtualAlloc events have no thread and match by timestamp and a piece logged on the
event's CPU.
"""

from __future__ import annotations

import concurrent.futures

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from pipeline.decode.etl.tables import OUTPUT, SCRATCH
from pipeline.decode.etl.tasks import BucketResult, BucketTask, KeyedSamplesTask, PartitionResult
from pipeline.runs import parquet_glob, sql_path

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow

SCRATCH_TABLES = ("_process_events", "_thread_events", "_image_events", "_image_id_info", "_image_id_dbg",
                  "_stack_defs", "_stack_frames", "_heapsnap_stacks")

# Lifetime tables: one row per instance. An instance starts at a start/load event; rundown events
# (DCStart/DCEnd) belong to the instance current at their time. NULL start = existed before the trace,
# NULL end = still alive when it stopped.
LIFETIMES = {
    "processes": ("_process_events", "pid, unique_process_key", "'start'", "'end', 'defunct'", """
        pid, any_value(parent_pid ORDER BY (kind = 'start') DESC, timestamp) AS parent_pid,
        any_value(image_name ORDER BY (image_name = '') , (kind = 'start') DESC, timestamp) AS image_name,
        any_value(command_line ORDER BY (command_line = ''), (kind = 'start') DESC, timestamp) AS command_line,
        min(timestamp_ns) FILTER (kind = 'start') AS start_ns,
        min(timestamp_ns) FILTER (kind IN ('end', 'defunct')) AS end_ns,
        any_value(session ORDER BY timestamp) AS session,
        any_value(exit_status ORDER BY timestamp DESC) FILTER (kind IN ('end', 'dcend', 'defunct')) AS exit_status,
        unique_process_key, any_value(flags ORDER BY timestamp) AS flags,
        min(timestamp) FILTER (kind = 'start') AS start_timestamp,
        min(timestamp) FILTER (kind IN ('end', 'defunct')) AS end_timestamp,
        min(timestamp_ns) AS first_seen_ns, max(timestamp_ns) AS last_seen_ns"""),
    "threads": ("_thread_events", "pid, tid", "'start'", "'end'", """
        pid, tid,
        min(timestamp_ns) FILTER (kind = 'start') AS start_ns,
        min(timestamp_ns) FILTER (kind = 'end') AS end_ns,
        any_value(win32_start_addr ORDER BY timestamp) AS win32_start_addr,
        any_value(thread_name ORDER BY (thread_name = ''), timestamp) AS thread_name,
        min(timestamp) FILTER (kind = 'start') AS start_timestamp,
        min(timestamp) FILTER (kind = 'end') AS end_timestamp,
        min(timestamp_ns) AS first_seen_ns, max(timestamp_ns) AS last_seen_ns"""),
    "images": ("_image_events", "pid, base", "'load'", "'unload'", """
        pid, base, any_value(size ORDER BY timestamp) AS size,
        any_value(file_name ORDER BY (file_name = ''), timestamp) AS file_name,
        min(timestamp_ns) FILTER (kind = 'load') AS load_ns,
        min(timestamp_ns) FILTER (kind = 'unload') AS unload_ns,
        any_value(checksum ORDER BY (checksum = 0), timestamp) AS checksum,
        any_value(time_date_stamp ORDER BY (time_date_stamp = 0), timestamp) AS time_date_stamp,
        min(timestamp) FILTER (kind = 'load') AS load_timestamp,
        min(timestamp) FILTER (kind = 'unload') AS unload_timestamp,
        min(timestamp_ns) AS first_seen_ns, max(timestamp_ns) AS last_seen_ns"""),
}


def connect(scratch: Path, cfg):
    """The DuckDB connection of the joins (``cfg``: the decode section): its memory limit, spilling into
    ``scratch``. The decode opens it while the partitions run, so that its opening costs no wall time."""
    import duckdb

    return duckdb.connect(config={"memory_limit": f"{cfg.join_memory_limit}B",
                                  "temp_directory": str(scratch / "duckdb.tmp"), "preserve_insertion_order": False})


def finish(con, out, scratch: Path, header, cfg, pool, results: list[PartitionResult],
           errors: list[ErrorRow], before_stacks=dict) -> dict[str, int | float | dict[str, float]]:
    """Build the joined tables from the partitions' scratch files with ``con`` (``connect``; closed here);
    returns counts for the manifest. ``before_stacks()`` runs once the bucket joins are done, before the
    stacks table (the heap-snapshot assembly, which runs beside the buckets); its counts join the returned
    ones."""
    from pipeline.decode.etl.buckets import bucket_task, plan
    from pipeline.decode.etl.scratch import BUCKETED, KEYED_SAMPLES, overlapping
    from pipeline.decode.etl.settle import SAMPLE_COUNTS

    clock = [time.perf_counter()]
    lap = lambda: clock.append(time.perf_counter())  # noqa: E731
    beside = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        # The heap-snapshot tables are still being written (``before_stacks``): opened later.
        _open_scratch(con, scratch, [t for t in SCRATCH_TABLES if not t.startswith("_heapsnap")])
        # The buckets need the threads only; the other lifetimes are built beside them.
        _lifetime(con, "threads", *LIFETIMES["threads"])
        _copy(con, "threads", out.table_path("threads"))
        threads = _thread_slots(con, scratch / "threads.npz")
        others = beside.submit(_other_lifetimes, con.cursor(), out)
        lap()

        sources: dict[str, list[tuple[str, int, int]]] = {t: [] for t in (*BUCKETED, KEYED_SAMPLES)}
        keyed: list[tuple[str, int]] = []  # (file, partition) of the samples settled by their stack keys
        written: dict[str, int] = {}        # rows of each scratch file, as its partition wrote it
        times = []
        for r in results:
            for table, source in r.sources.items():
                sources[table].append(source)
                if table == KEYED_SAMPLES:
                    keyed.append((source[0], r.part))
            written.update(r.scratch_rows)
            times.append(r.times)
        stack_defs = _stack_key_defs(con, scratch / "stack_defs")
        stats = {"stack_keys": _rows(sources["_keyed_refs"], written)
                 + sum(r.settled.get("stack_keys_with_samples", 0) for r in results)}
        lap()

        bucketed = {t: files for t, files in sources.items() if t in BUCKETED}
        buckets = plan(times, cfg.bucket_rows, pool.n_workers, sum(_rows(files, written) for files in bucketed.values()))
        common = dict(scratch_dir=str(scratch), out_dir=str(out.path), stack_defs=stack_defs,
                      clock=(header.header_ts, header.perf_freq))
        # The samples that partitions settled by their stack keys: a task per partition, beside the buckets
        # (writers numbered after them, for the stacks they write).
        tasks: list[BucketTask | KeyedSamplesTask] = [
            KeyedSamplesTask(**common, keyed_samples=path, part=part, writer=len(buckets) + i)
            for i, (path, part) in enumerate(keyed)]
        tasks += [BucketTask(**common, sources={t: overlapping(s, lo, hi) for t, s in bucketed.items()}, threads=threads,
                             bucket=k, lo=lo, hi=hi) for k, (lo, hi) in enumerate(buckets)]
        done = pool.map(bucket_task, tasks)
        lap()
        # The buckets' stacks are put together while the heap-snapshot assembly may still run (on a varied
        # trace it ends after the buckets); the ``stacks`` table then adds the snapshots' stacks.
        _bucket_stack_lists(con, scratch)
        others.result()
        stats.update(before_stacks())
        _open_scratch(con, scratch, ["_heapsnap_stacks"])
        stats.update(_stacks(con, errors, str(out.path), out.table_path("stacks")))
        lap()
        for t in OUTPUT.values():
            if not out.table_path(t.name).exists():
                pq.write_table(t.empty(), out.table_path(t.name))
        stats["stack_keys_unresolved"] = sum(d.stack_keys_unresolved for d in done)
        for key in SAMPLE_COUNTS + ("adopted_stacks_rejoined",):
            stats[key] = sum(getattr(d, key) for d in done) + sum(r.settled.get(key, 0) for r in results)
        stats["samples_final_in_partitions"] = sum(r.settled.get("samples", 0) for r in results)
        stats["samples_settled_by_keys"] = sum(d.samples_settled_by_keys for d in done)
        stats["heap_events_final_in_partitions"] = sum(r.settled.get("heap_events_final_in_partitions", 0)
                                                       for r in results)
        stats["bucket_rows_lost"] = _check_rows(sources, written, done, errors, str(out.path))
        stats["join_buckets"] = len(buckets)
        stats["join_phases_s"] = dict(zip(("lifetimes", "stack_keys", "buckets", "stacks"),
                                          np.round(np.diff(clock), 3).tolist()))
        return stats
    finally:
        beside.shutdown(wait=True)
        con.close()


def _other_lifetimes(cur, out) -> None:
    """``processes``, ``images`` and ``image_ids`` (on their own cursor: this runs on a thread)."""
    try:
        for table in ("processes", "images"):
            _lifetime(cur, table, *LIFETIMES[table])
        _image_ids(cur)
        for table in ("processes", "images", "image_ids"):
            _copy(cur, table, out.table_path(table))
    finally:
        cur.close()


def _check_rows(sources: dict[str, list[tuple[str, int, int]]], rows: dict[str, int], done: list[BucketResult],
                errors: list[ErrorRow], where: str) -> int:
    """Every scratch row must have been read by exactly one bucket (the buckets cover every time once);
    a difference would be a bug of the decoder, reported as such instead of passing silently. ``rows``:
    the rows of each file as its writer counted them (else read from the file's footer)."""
    lost = 0
    for table, paths in sources.items():
        written = _rows(paths, rows)
        read = sum(d.rows_in.get(table, 0) for d in done)
        if written != read:
            lost += abs(written - read)
            errors.append({"file": where, "buffer_index": -1, "file_offset": -1, "record_offset": -1,
                           "kind": "internal", "message": f"{where}: {table}: {written} rows decoded but {read} "
                                                          "joined by the time buckets (a decoder bug; please report)"})
    return lost


def _rows(files: list[tuple[str, int, int]], rows: dict[str, int]) -> int:
    """Rows of scratch ``files`` (sources: path, lo, hi) as their writers counted them (``rows``: path ->
    rows), else from each file's footer."""
    from pipeline.decode.etl.scratch import file_rows

    return sum(rows[p] if p in rows else file_rows(p) for p, _, _ in files)


def _open_scratch(con, scratch: Path, names: list[str]) -> None:
    """A view over each scratch table's parts (an empty table of its shape when no partition wrote it)."""
    for name in names:
        parts = scratch / f"{name}.parquet"
        if parts.is_dir():
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({sql_path(parquet_glob(parts))})")
        elif parts.exists():
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({sql_path(parts)})")
        else:
            con.execute(f"CREATE TABLE {name} ({SCRATCH[name].ddl})")      # (the SQL runs on traces that lack some event kinds)


def _copy(con, table: str, path: Path, order: str | None = None) -> None:
    """Write ``table`` (in ``order``) without its internal ``_``-prefixed columns."""
    cols = [c for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall() if not c.startswith("_")]
    select = ", ".join(f'"{c}"' for c in cols)
    order_by = f" ORDER BY {order}" if order else ""
    con.execute(f"COPY (SELECT {select} FROM {table}{order_by}) TO {sql_path(path)} "
                "(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)")


def _thread_slots(con, path: Path) -> str:
    """Thread instances as back-to-back slots per tid, for the bucket tasks' pid lookup (see
    ``stackkeys.thread_pids``), saved as arrays."""
    t = con.execute("""
        SELECT tid, pid, coalesce(start_timestamp, -9223372036854775807) AS t0,
               coalesce(end_timestamp, 9223372036854775807) AS t1
        FROM threads ORDER BY tid, t0""").fetchnumpy()
    tid = np.asarray(t["tid"], np.uint32)
    u_tid, first = np.unique(tid, return_index=True)
    t0 = np.asarray(t["t0"], np.int64)
    nxt = np.append(t0[1:], 0)
    np.savez(path, u_tid=u_tid, u_start=np.append(first, len(tid)).astype(np.int64), t0=t0,
             t1=np.asarray(t["t1"], np.int64), next=nxt, pid=np.asarray(t["pid"], np.uint32))
    return str(path)


def _lifetime(con, table: str, source: str, key: str, starts: str, ends: str, select: str) -> None:
    con.execute(f"""
        CREATE TABLE {table} AS
        WITH numbered AS (
            SELECT *, sum(CASE WHEN kind IN ({starts}) THEN 1 ELSE 0 END)
                       OVER (PARTITION BY {key} ORDER BY timestamp, cpu, stream_pos
                             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS instance
            FROM {source})
        SELECT {select}
        FROM numbered GROUP BY {key}, instance
        ORDER BY {key}, instance""")


def _image_ids(con) -> None:
    """One row per distinct (image, debug id): DbgID_RSDS/ILRSDS joined with the ImageID record of the same
    image event (same raw timestamp and base); ImageID records without a DbgID still give a row."""
    con.execute("""
        CREATE TABLE image_ids AS
        WITH ev AS (SELECT timestamp, base, any_value(pid) AS pid FROM _image_events GROUP BY timestamp, base),
        j AS (
            SELECT coalesce(d.timestamp, i.timestamp) AS timestamp, coalesce(d.timestamp_ns, i.timestamp_ns) AS timestamp_ns,
                   coalesce(d.base, i.base) AS base,
                   coalesce(nullif(i.pid, 0), nullif(d.pid, 0), ev.pid, i.pid, d.pid) AS pid,
                   i.size, i.time_date_stamp, i.original_file_name,
                   d.pdb_guid, d.pdb_age, d.pdb_name,
                   CASE WHEN d.il THEN 'ILRSDS' WHEN d.il IS NOT NULL THEN 'RSDS' END AS debug_kind
            FROM _image_id_dbg d
            FULL OUTER JOIN _image_id_info i ON d.timestamp = i.timestamp AND d.base = i.base
            LEFT JOIN ev ON ev.timestamp = coalesce(d.timestamp, i.timestamp) AND ev.base = coalesce(d.base, i.base))
        SELECT pid, base, any_value(size) AS size, any_value(time_date_stamp) AS time_date_stamp,
               any_value(original_file_name) AS original_file_name, pdb_guid, pdb_age, pdb_name, debug_kind,
               min(timestamp) AS timestamp, min(timestamp_ns) AS timestamp_ns
        FROM j GROUP BY pid, base, pdb_guid, pdb_age, pdb_name, debug_kind
        ORDER BY pid, base, timestamp""")


def _stack_key_defs(con, path: Path) -> str:
    """The stack-key definitions of the whole trace (KeyDelete, KeyRundown), sorted by (key, time, cpu,
    stream position), saved as arrays for the buckets, which resolve their references against them
    (``stackkeys.resolve_keys``): a reference takes the first definition of its key at or after it. One
    ``.npy`` file per array in the directory ``path``, which every task maps instead of reading
    (``stackkeys.load_defs``)."""
    d = con.execute("SELECT key, timestamp, h1, h2, n FROM _stack_defs ORDER BY key, timestamp, cpu, stream_pos").fetchnumpy()
    path.mkdir(parents=True, exist_ok=True)
    for name, dtype in (("key", np.uint64), ("timestamp", np.int64), ("h1", np.uint64), ("h2", np.uint64), ("n", np.int32)):
        np.save(path / f"{name}.npy", np.asarray(d[name], dtype))
    return str(path)


def _bucket_stack_lists(con, scratch: Path) -> None:
    """``bucket_stacks``: the frames of each distinct stack (id, check) of the buckets, from the pieces of
    the first bucket that has it, kernel piece before user piece."""
    _open_scratch(con, scratch, ["_bucket_stacks", "_bucket_stack_pieces"])
    con.execute("""
        CREATE TABLE bucket_stacks AS
        WITH firsts AS (SELECT stack_id, id_check, min(bucket) AS bucket FROM _bucket_stacks GROUP BY ALL),
        frames AS (SELECT h1, h2, any_value(frames) AS frames FROM _stack_frames GROUP BY h1, h2)
        SELECT p.stack_id, p.id_check, flatten(list(f.frames ORDER BY p.ord)) AS frames
        FROM _bucket_stack_pieces p JOIN firsts USING (stack_id, id_check, bucket)
        JOIN frames f USING (h1, h2)
        GROUP BY p.stack_id, p.id_check""")


def _stacks(con, errors: list[ErrorRow], where: str, path: Path) -> dict[str, int]:
    """Write ``stacks`` to ``path``: one row per distinct stack id of the buckets (``bucket_stacks``) and of
    the heap snapshots (``heapsnap`` gives them ids by the same hash), sorted by id. Two different frame
    lists with one id (a 62-bit collision, or a hostile file) keep the list of the lower id check and are
    reported in ``errors``; their events cannot be told apart.

    Which list each id keeps is decided on the (id, check) pairs alone, and the frames are written straight
    from the two sources: grouping the frame lists themselves and writing the grouped table cost about twice
    as much, on the critical path after the heap-snapshot assembly."""
    pairs = """SELECT stack_id, id_check FROM bucket_stacks
               UNION SELECT stack_id, id_check FROM _heapsnap_stacks WHERE stack_id IS NOT NULL"""
    con.execute(f"CREATE TEMP TABLE stack_lists AS SELECT stack_id, min(id_check) AS id_check, count(*) AS lists "
                f"FROM ({pairs}) GROUP BY stack_id")
    for stack_id, lists in con.execute("SELECT stack_id, lists FROM stack_lists WHERE lists > 1 "
                                       "ORDER BY stack_id LIMIT 100").fetchall():
        errors.append({"file": where, "buffer_index": -1, "file_offset": -1, "record_offset": -1, "kind": "stack_hash",
                       "message": f"{where}: {lists} different frame lists share stack id {stack_id}; "
                                  "their events are attributed to the first"})
    stacks, collisions = con.execute("SELECT count(*), count(*) FILTER (lists > 1) FROM stack_lists").fetchone()
    # (each (id, check) pair once: the buckets' lists are distinct pairs, and so are the snapshots' own)
    con.execute(f"""
        COPY (SELECT stack_id, frames, len(frames)::INTEGER AS depth FROM (
                  SELECT stack_id, frames FROM bucket_stacks SEMI JOIN stack_lists USING (stack_id, id_check)
                  UNION ALL
                  SELECT stack_id, frames FROM _heapsnap_stacks SEMI JOIN stack_lists USING (stack_id, id_check)
                  ANTI JOIN bucket_stacks USING (stack_id, id_check))
              ORDER BY stack_id)
        TO {sql_path(path)} (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)""")
    con.execute("DROP TABLE bucket_stacks")
    con.execute("DROP TABLE stack_lists")
    return {"stacks": int(stacks), "stack_id_collisions": int(collisions)}


