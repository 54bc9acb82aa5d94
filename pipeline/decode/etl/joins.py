"""Cross-buffer joins on the global event order, run after all partitions are on disk.

Partitions write raw ``_``-prefixed scratch tables (parquet parts). Everything here is SQL in DuckDB
over those parts, so nothing holds the trace in Python objects and DuckDB may spill to disk for big
traces. The global order of events is (raw timestamp, cpu, stream_pos): §1.5/§5.3 of the format notes.

Stacks (§3.5, §3.6)::

    event @ts, thread T ──► StackWalk   {event_ts=ts, T, frames}     full stacks, possibly two records
                            StackKeyKernel/User {event_ts=ts, T, key} (kernel half, later user half,
                                                                      maybe on another CPU's buffer)
    key ──► first KeyDelete/KeyRundown/Create definition of that key at or after the reference
            (keys are reused, so "any definition" is wrong; an ASOF join picks the right one)

All pieces of one (event_ts, thread) are concatenated, kernel pieces before user pieces (a piece is a
user half when its leaf frame is a user address, or a StackKeyUser), each kind in stream order, and the
resulting frame lists are deduplicated into ``stacks``. Samples and heap events find their stack by
(timestamp, thread); VirtualAlloc events have no thread and match by timestamp and a piece logged on the
event's CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCRATCH_TABLES = ("_process_events", "_thread_events", "_image_events", "_image_id_info", "_image_id_dbg",
                  "_samples", "_stack_refs", "_stack_defs", "_stack_frames", "_event_stack_links", "_virtual_allocs", "_heap_events",
                  "_heapsnap_stacks", "_heapsnap_blocks")

#: Empty shapes of scratch tables, so the SQL below runs on traces that lack some event kinds.
EMPTY = {
    "_process_events": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, kind VARCHAR, "
                       "pid UINTEGER, parent_pid UINTEGER, session UINTEGER, exit_status INTEGER, "
                       "unique_process_key UBIGINT, flags UINTEGER, image_name VARCHAR, command_line VARCHAR, "
                       "version USMALLINT",
    "_thread_events": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, kind VARCHAR, "
                      "pid UINTEGER, tid UINTEGER, win32_start_addr UBIGINT, thread_name VARCHAR",
    "_image_events": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, kind VARCHAR, "
                     "pid UINTEGER, base UBIGINT, size UBIGINT, checksum UINTEGER, time_date_stamp UINTEGER, "
                     "file_name VARCHAR",
    "_image_id_info": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, base UBIGINT, "
                      "size UBIGINT, pid UINTEGER, time_date_stamp UINTEGER, original_file_name VARCHAR",
    "_image_id_dbg": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, base UBIGINT, "
                     "pid UINTEGER, pdb_guid VARCHAR, pdb_age UINTEGER, pdb_name VARCHAR, il BOOLEAN",
    "_samples": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, tid UINTEGER, ip UBIGINT",
    "_stack_refs": "timestamp BIGINT, cpu USMALLINT, stream_pos BIGINT, event_ts BIGINT, "
                   "pid UINTEGER, tid UINTEGER, kind UTINYINT, user BOOLEAN, key UBIGINT, h1 UBIGINT, h2 UBIGINT",
    "_stack_defs": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, key UBIGINT, "
                   "opcode UTINYINT, h1 UBIGINT, h2 UBIGINT",
    "_stack_frames": "h1 UBIGINT, h2 UBIGINT, frames UBIGINT[]",
    "_event_stack_links": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, tid UINTEGER",
    "_virtual_allocs": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, pid UINTEGER, "
                       "base UBIGINT, size UBIGINT, flags UINTEGER, is_free BOOLEAN",
    "_heapsnap_stacks": "snapshot_id BIGINT, stack_ref UBIGINT, frames UBIGINT[]",
    "_heapsnap_blocks": "snapshot_id BIGINT, pid UINTEGER, instance UINTEGER, timestamp_ns BIGINT, heap UBIGINT, address UBIGINT, "
                        "size UBIGINT, stack_ref UBIGINT",
    "_heap_events": "timestamp BIGINT, timestamp_ns BIGINT, cpu USMALLINT, stream_pos BIGINT, pid UINTEGER, "
                    "tid UINTEGER, kind VARCHAR, heap UBIGINT, address UBIGINT, size UBIGINT, old_address UBIGINT, "
                    "old_size UBIGINT, flags UINTEGER, source UINTEGER",
}

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


def finish(out, scratch: Path, header, memory_limit: str = "1GB") -> dict[str, Any]:
    """Build the joined tables from the scratch parts; returns counts for the manifest."""
    import duckdb

    con = duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": str(scratch / "duckdb.tmp"),
                                 "preserve_insertion_order": False})
    try:
        for name in SCRATCH_TABLES:
            parts = scratch / f"{name}.parquet"
            if parts.is_dir():
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{parts}/*.parquet')")
            elif parts.exists():
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{parts}')")
            else:
                con.execute(f"CREATE TABLE {name} ({EMPTY[name]})")
        for table, spec in LIFETIMES.items():
            _lifetime(con, table, *spec)
        _image_ids(con)
        stats = _stacks(con)
        _samples(con)
        _virtual_allocs(con)
        _heap_events(con)
        _heap_snapshot_blocks(con)
        _event_stacks(con)
        for table in ("processes", "threads", "images", "image_ids", "stacks", "samples",
                      "virtual_allocs", "heap_events", "heap_snapshot_blocks", "event_stacks"):
            _copy(con, table, out.table_path(table), ORDER.get(table))
        stats.update(_summary(con, out.table_path("samples")))
        return stats
    finally:
        con.close()


#: Row order of the written tables. The per-event tables are views, computed once by the COPY that
#: writes them: a table in between is one more pass over every sample, and once the samples no longer
#: fit in ``join_memory_limit`` it is a spill to disk and back. ``_``-prefixed columns are sort keys
#: that are not written.
ORDER = {
    "stacks": "stack_id",
    "samples": "timestamp, cpu, stream_pos",
    "virtual_allocs": "timestamp, cpu, _stream_pos",
    "heap_events": "timestamp, cpu, _stream_pos",
    "heap_snapshot_blocks": "snapshot_id, heap, address",
    "event_stacks": "timestamp, cpu, stream_pos",
}


def _copy(con, table: str, path: Path, order: str | None = None) -> None:
    """Write ``table`` (in ``order``) without its internal ``_``-prefixed columns."""
    cols = [c for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall() if not c.startswith("_")]
    select = ", ".join(f'"{c}"' for c in cols)
    order_by = f" ORDER BY {order}" if order else ""
    # zstd level 1: 20 % faster than the default level for 7 % more bytes (samples of the 1 GB synth trace)
    con.execute(f"COPY (SELECT {select} FROM {table}{order_by}) TO '{path}' "
                "(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)")


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


def _stacks(con) -> dict[str, Any]:
    """Stack pieces -> one frame list per (event_ts, thread) -> deduplicated ``stacks`` + ``stack_index``.

    Per-event work only touches the pieces' 128-bit frame hashes (h1, h2, computed by the partitions).
    A group is normally at most one kernel piece and one user piece, so its identity is the pair of
    piece hashes (a = kernel, b = user; 0 = none) found with plain aggregates; the rare groups with more
    pieces of one kind get an ordered hash of all their pieces instead (``multi``). Frame lists are
    concatenated and compared once per distinct stack.
    """
    # Only the key references are resolved into a table (the ASOF join is not repeated at every use);
    # full StackWalk pieces are read from the scratch parts each time, which costs less than holding
    # (and, on big traces, spilling) a copy of them.
    con.execute("""
        CREATE TABLE keyed_pieces AS
        SELECT r.timestamp, r.cpu, r.stream_pos, r.event_ts, r.pid, r.tid, r.kind, r.user, d.h1, d.h2
        FROM (SELECT * EXCLUDE (h1, h2) FROM _stack_refs WHERE kind > 0) r
        ASOF LEFT JOIN (SELECT key, timestamp, h1, h2 FROM _stack_defs) d
            ON r.key = d.key AND d.timestamp >= r.timestamp""")
    con.execute("""
        CREATE VIEW stack_pieces AS
        SELECT timestamp, cpu, stream_pos, event_ts, pid, tid, kind, user, h1, h2
        FROM _stack_refs WHERE kind = 0
        UNION ALL SELECT * FROM keyed_pieces""")
    con.execute("""
        CREATE TABLE piece_frames AS
        SELECT h1, h2, any_value(frames) AS frames FROM _stack_frames GROUP BY h1, h2""")
    con.execute("""
        CREATE TABLE piece_groups AS
        SELECT event_ts, tid, any_value(pid) AS pid,
               count(*) FILTER (NOT user AND h1 IS NOT NULL) AS nk, count(*) FILTER (user AND h1 IS NOT NULL) AS nu,
               coalesce(max(h1) FILTER (NOT user), 0) AS a1, coalesce(max(h2) FILTER (NOT user), 0) AS a2,
               coalesce(max(h1) FILTER (user), 0) AS b1, coalesce(max(h2) FILTER (user), 0) AS b2
        FROM stack_pieces GROUP BY event_ts, tid""")
    # A group of several pieces of one kind needs its pieces again; without such groups (the usual
    # case) that pass over every piece is skipped.
    multi_groups = con.execute("SELECT count(*) FROM piece_groups WHERE nk > 1 OR nu > 1").fetchone()[0]
    con.execute("""
        CREATE TABLE stack_groups AS
        WITH multi AS (
            SELECT p.event_ts, p.tid, hash(list(p.h1 ORDER BY p.user, p.timestamp, p.cpu, p.stream_pos)) AS m1,
                   hash(list(p.h2 ORDER BY p.user, p.timestamp, p.cpu, p.stream_pos)) AS m2
            FROM stack_pieces p SEMI JOIN (SELECT event_ts, tid FROM piece_groups WHERE nk > 1 OR nu > 1) x
                ON p.event_ts = x.event_ts AND p.tid = x.tid
            WHERE p.h1 IS NOT NULL AND """ + ("true" if multi_groups else "false") + """ GROUP BY p.event_ts, p.tid)
        SELECT g.event_ts, g.tid, g.pid, m.m1 IS NOT NULL AS multi,
               coalesce(m.m1, g.a1) AS a1, coalesce(m.m2, g.a2) AS a2,
               CASE WHEN m.m1 IS NULL THEN g.b1 ELSE 0 END AS b1, CASE WHEN m.m1 IS NULL THEN g.b2 ELSE 0 END AS b2
        FROM piece_groups g LEFT JOIN multi m USING (event_ts, tid)""")
    con.execute("DROP TABLE piece_groups")
    con.execute("""
        CREATE TABLE group_keys AS
        SELECT multi, a1, a2, b1, b2, min(event_ts) AS first_ts, arg_min(tid, event_ts) AS first_tid
        FROM stack_groups WHERE a1 <> 0 OR b1 <> 0 GROUP BY multi, a1, a2, b1, b2""")
    con.execute("""
        CREATE TABLE group_stacks AS
        WITH single AS (
            SELECT k.*, coalesce(fa.frames, []) || coalesce(fb.frames, []) AS frames FROM group_keys k
            LEFT JOIN piece_frames fa ON fa.h1 = k.a1 AND fa.h2 = k.a2
            LEFT JOIN piece_frames fb ON fb.h1 = k.b1 AND fb.h2 = k.b2
            WHERE NOT k.multi),
        several AS (
            SELECT k.multi, k.a1, k.a2, k.b1, k.b2, any_value(k.first_ts) AS first_ts,
                   any_value(k.first_tid) AS first_tid,
                   flatten(list(f.frames ORDER BY p.user, p.timestamp, p.cpu, p.stream_pos)) AS frames
            FROM group_keys k JOIN stack_pieces p ON p.event_ts = k.first_ts AND p.tid = k.first_tid
            JOIN piece_frames f ON f.h1 = p.h1 AND f.h2 = p.h2
            WHERE k.multi GROUP BY k.multi, k.a1, k.a2, k.b1, k.b2)
        SELECT * FROM single UNION ALL SELECT * FROM several""")
    con.execute("""
        CREATE TABLE stacks AS
        SELECT (row_number() OVER (ORDER BY first_ts, first_tid) - 1)::BIGINT AS stack_id, frames,
               len(frames)::INTEGER AS depth
        FROM (SELECT frames, min(first_ts) AS first_ts, arg_min(first_tid, first_ts) AS first_tid FROM (
                  SELECT frames, first_ts, first_tid FROM group_stacks WHERE len(frames) > 0
                  UNION ALL  -- heap snapshot stacks share the table; they sort after the event stacks
                  SELECT frames, 9223372036854775807, snapshot_id FROM _heapsnap_stacks WHERE len(frames) > 0)
              GROUP BY frames)""")
    # Every (event_ts, thread) with stack records; stack_id is NULL when none of its keys resolved.
    con.execute("""
        CREATE TABLE stack_index AS
        SELECT g.event_ts, g.tid, g.pid, s.stack_id
        FROM stack_groups g
        LEFT JOIN (SELECT e.multi, e.a1, e.a2, e.b1, e.b2, s.stack_id FROM group_stacks e JOIN stacks s ON s.frames = e.frames) s
            USING (multi, a1, a2, b1, b2)""")
    unresolved, refs = con.execute(
        "SELECT count(*) FILTER (h1 IS NULL AND kind > 0), count(*) FILTER (kind > 0) FROM stack_pieces").fetchone()
    # VirtualAlloc events find their piece by (timestamp, cpu): keep just those pieces. Then every
    # per-piece and per-group table goes, so the joins over all samples have DuckDB's memory to themselves.
    con.execute("""
        CREATE TABLE virtual_alloc_pieces AS
        SELECT DISTINCT p.event_ts, p.cpu, p.tid FROM stack_pieces p
        SEMI JOIN _virtual_allocs a ON p.event_ts = a.timestamp""")
    con.execute("DROP VIEW stack_pieces")
    for table in ("keyed_pieces", "stack_groups", "group_keys", "group_stacks", "piece_frames"):
        con.execute(f"DROP TABLE {table}")
    return {"stack_keys": int(refs), "stack_keys_unresolved": int(unresolved)}


def _samples(con) -> None:
    """Samples with their stack and the process owning the thread at that time: the thread instance with
    the latest start at or before the sample, if it had not ended; else the stack's pid.

    The instances of one tid are turned into back-to-back intervals [start, next start), so "latest start
    at or before" is a hash join on tid with a range check: the same answer as an ASOF join, without the
    ASOF join's sort of every sample by (tid, timestamp). A tid has few instances, so the join fans out
    little before the range check."""
    con.execute("""
        CREATE VIEW samples AS
        WITH iv AS (SELECT tid, pid, coalesce(start_timestamp, -9223372036854775807) AS t0,
                           coalesce(end_timestamp, 9223372036854775807) AS t1 FROM threads),
        slots AS (SELECT *, lead(t0) OVER (PARTITION BY tid ORDER BY t0) AS t_next FROM iv),
        owned AS (SELECT s.*, CASE WHEN s.timestamp <= iv.t1 THEN iv.pid END AS thread_pid
                  FROM _samples s LEFT JOIN slots iv
                  ON s.tid = iv.tid AND s.timestamp >= iv.t0 AND (iv.t_next IS NULL OR s.timestamp < iv.t_next))
        SELECT s.timestamp, s.timestamp_ns, s.cpu, s.tid, coalesce(s.thread_pid, k.pid)::UINTEGER AS pid,
               s.ip, k.stack_id, s.stream_pos
        FROM owned s LEFT JOIN stack_index k ON k.event_ts = s.timestamp AND k.tid = s.tid""")


def _virtual_allocs(con) -> None:
    con.execute("""
        CREATE VIEW virtual_allocs AS
        SELECT v.timestamp, v.timestamp_ns, v.cpu, v.pid, k.tid, v.base, v.size, v.flags,
               CASE WHEN v.is_free THEN 'free' ELSE 'alloc' END AS kind, k.stack_id, v.stream_pos AS _stream_pos
        FROM _virtual_allocs v
        LEFT JOIN virtual_alloc_pieces p ON p.event_ts = v.timestamp AND p.cpu = v.cpu
        LEFT JOIN stack_index k ON k.event_ts = p.event_ts AND k.tid = p.tid""")


def _heap_events(con) -> None:
    con.execute("""
        CREATE VIEW heap_events AS
        SELECT h.timestamp, h.timestamp_ns, h.cpu, h.pid, h.tid, h.kind, h.heap, h.address, h.size,
               h.old_address, h.old_size, h.flags, h.source, k.stack_id, h.stream_pos AS _stream_pos
        FROM _heap_events h LEFT JOIN stack_index k ON k.event_ts = h.timestamp AND k.tid = h.tid""")


def _heap_snapshot_blocks(con) -> None:
    """Busy blocks of complete heap snapshots; stack_id is NULL for StackRef 0 (allocated before the
    process enabled stack tracking)."""
    con.execute("""
        CREATE VIEW heap_snapshot_blocks AS
        SELECT b.snapshot_id, b.pid, b.instance, b.timestamp_ns, b.heap, b.address, b.size, b.stack_ref, s.stack_id
        FROM _heapsnap_blocks b
        LEFT JOIN _heapsnap_stacks h ON h.snapshot_id = b.snapshot_id AND h.stack_ref = b.stack_ref
        LEFT JOIN stacks s ON s.frames = h.frames""")


def _event_stacks(con) -> None:
    """Stacks of EVENT_HEADER events that carry them inline; join to ``events`` on
    (timestamp, cpu, stream_pos)."""
    con.execute("""
        CREATE VIEW event_stacks AS
        SELECT l.timestamp, l.timestamp_ns, l.cpu, l.stream_pos, l.tid, k.stack_id
        FROM (SELECT DISTINCT * FROM _event_stack_links) l
        LEFT JOIN stack_index k ON k.event_ts = l.timestamp AND k.tid = l.tid""")


def _summary(con, samples_path: Path) -> dict[str, Any]:
    """Counts for the manifest, from the written ``samples`` file (the view would redo the joins). A sample
    has stack records when its (timestamp, thread) is in ``stack_index``: it has a stack, or its group's
    keys did not resolve (few groups, so that is a small join)."""
    samples, with_stack = con.execute(
        f"SELECT count(*), count(stack_id) FROM read_parquet('{samples_path}')").fetchone()
    unresolved = con.execute("""
        SELECT count(*) FROM _samples s
        SEMI JOIN (SELECT event_ts, tid FROM stack_index WHERE stack_id IS NULL) k
            ON k.event_ts = s.timestamp AND k.tid = s.tid""").fetchone()[0]
    stacks = con.execute("SELECT count(*) FROM stacks").fetchone()[0]
    return {"samples": int(samples), "samples_with_stack": int(with_stack),
            "samples_with_stack_records": int(with_stack + unresolved), "stacks": int(stacks)}
