"""Memory section: VirtualAlloc commit per stack, function and process; heap snapshots per stack.

**Commit.** Applies when ``decoded/`` has ``virtual_allocs``. An alloc event whose flags hold
MEM_COMMIT commits ``size`` bytes at ``base``. A free event (MEM_DECOMMIT or MEM_RELEASE) at
(pid, base) matches the latest commit at the same (pid, base) at or before it (an ASOF join: bases
are reused once freed); it returns ``size`` bytes (the whole commit when the event's size is 0 or
larger), and the bytes returned by all frees of one commit never exceed it. Frees that match no
commit (the region was committed before the trace began) are counted, not attributed.
``outstanding_bytes`` = committed minus returned by the end of the trace. A process's commit over
time is the running sum of +commit / -returned in event order; ``peak_commit_bytes`` is its maximum.

**Heap snapshots.** Applies when ``decoded/`` has ``heap_snapshot_blocks`` (pid, instance,
timestamp_ns, heap, address, size, stack_id): every busy block at each snapshot; bytes and
blocks per (snapshot, stack), blocks without a stack kept as ``stack_id`` NULL. A snapshot is
(pid, instance, timestamp_ns): instance numbers restart in a new process that reuses the pid.
``heap_folded`` holds, per process, its largest snapshot as folded stacks (for a flame graph).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.aggregate import resolve
from pipeline.aggregate.cpu import PROCESS_FRAME_SQL
from pipeline.runs import sql_path

if TYPE_CHECKING:
    from pipeline.aggregate.context import Context
    from pipeline.contracts import MemoryCounts

VIRTUAL = "virtual_allocs"
SNAPSHOT_BLOCKS = "heap_snapshot_blocks"
SNAPSHOTS = "heap_snapshots"

MEM_COMMIT = 0x1000
MEM_DECOMMIT = 0x4000
MEM_RELEASE = 0x8000

COMMIT_BY_STACK = "commit_by_stack"
COMMIT_BY_FUNCTION = "commit_by_function"
COMMIT_BY_PROCESS = "commit_by_process"
COMMIT_BY_CRATE = "commit_by_crate"
COMMIT_BY_CODE_CRATE = "commit_by_code_crate"
COMMIT_OVER_TIME = "commit_over_time"
#: Time bins of commit_over_time across the trace, and the processes it follows one by one (largest peaks).
COMMIT_BINS, COMMIT_PROCESSES = 200, 20
COMMIT_FOLDED = "commit_folded"
COMMIT_FOLDED_OVER_TIME = "commit_folded_over_time"
HEAP_BY_STACK = "heap_snapshot_by_stack"
HEAP_BY_FUNCTION = "heap_snapshot_by_function"
HEAP_GROWTH = "heap_snapshot_growth"
HEAP_SNAPSHOTS = "heap_snapshots_summary"
HEAP_FOLDED = "heap_folded"

FUNCTION_KEY = ["module", "function", "raw_name"]
#: A heap snapshot: (pid, instance, timestamp_ns), with the process instance it was taken in.
SNAPSHOT_KEY = ("pid", "process_key", "instance", "timestamp_ns")

MEASURES = ["allocs", "commit_bytes", "outstanding_bytes"]


def aggregate(ctx: Context) -> MemoryCounts | None:
    summary: MemoryCounts = {}
    if _rows(ctx, VIRTUAL):
        summary.update(_commit(ctx))
    if ctx.has(SNAPSHOT_BLOCKS) and (_rows(ctx, SNAPSHOTS) or _rows(ctx, SNAPSHOT_BLOCKS)):
        summary.update(_snapshots(ctx))
    return summary or None


def _rows(ctx, table: str) -> int:
    """Rows of a decoded table (0 when absent): traces without memory events get no memory tables."""
    return int(ctx.decoded.get("tables", {}).get(table, 0)) if ctx.has(table) else 0


def _copy(ctx, con, table: str, sql: str, order: str) -> None:
    con.execute(f"COPY (SELECT * FROM ({sql}) ORDER BY {order}) TO {sql_path(ctx.out.table_path(table))} "
                f"(FORMAT parquet, COMPRESSION zstd)")


def _commit(ctx: Context) -> MemoryCounts:
    con = resolve.connect(ctx, VIRTUAL, "stacks", "processes", "images")
    con.execute(f"""
        CREATE TABLE va AS
        SELECT row_number() OVER (ORDER BY timestamp, cpu) - 1 AS event, timestamp_ns, pid::BIGINT AS pid,
               base, size::BIGINT AS size, flags, kind, stack_id, NULL::UBIGINT AS ip
        FROM {VIRTUAL}""")
    con.execute(f"""
        CREATE TABLE commits AS SELECT * FROM va WHERE kind = 'alloc' AND (flags & {MEM_COMMIT}) <> 0""")
    con.execute(f"""
        CREATE TABLE frees AS
        SELECT f.event, f.timestamp_ns, f.pid, f.base, f.size, c.event AS commit_event
        FROM (SELECT * FROM va WHERE kind = 'free' AND (flags & {MEM_DECOMMIT | MEM_RELEASE}) <> 0) f
        ASOF LEFT JOIN commits c ON f.pid = c.pid AND f.base = c.base AND f.timestamp_ns >= c.timestamp_ns""")
    # Bytes each free returns: its size, capped by what is left of its commit (frees in event order).
    con.execute("""
        CREATE TABLE returned AS
        SELECT f.event, f.timestamp_ns, f.pid, f.commit_event,
               greatest(0, least(c.size, sum(CASE WHEN f.size = 0 THEN c.size ELSE f.size END) OVER w)
                           - least(c.size, coalesce(sum(CASE WHEN f.size = 0 THEN c.size ELSE f.size END)
                                   OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)))::BIGINT AS bytes
        FROM frees f JOIN commits c ON c.event = f.commit_event
        WINDOW w AS (PARTITION BY f.commit_event ORDER BY f.event)""")
    resolve.assign_units(con, ctx, """(SELECT c.*, coalesce(r.bytes, 0) AS returned_bytes FROM commits c
        LEFT JOIN (SELECT commit_event, sum(bytes) AS bytes FROM returned GROUP BY 1) r ON r.commit_event = c.event)""",
                         "cm")
    weights = """SELECT unit_id, count(*)::BIGINT AS allocs, sum(size)::BIGINT AS commit_bytes,
                        sum(size - returned_bytes)::BIGINT AS outstanding_bytes FROM cm GROUP BY unit_id"""
    _copy(ctx, con, COMMIT_BY_STACK, """
        SELECT c.stack_id, st.folded, count(*)::BIGINT AS allocs, sum(c.size)::BIGINT AS commit_bytes,
               sum(c.returned_bytes)::BIGINT AS returned_bytes, sum(c.size - c.returned_bytes)::BIGINT AS outstanding_bytes
        FROM cm c LEFT JOIN cm_stacks st USING (unit_id) GROUP BY ALL""", "commit_bytes DESC, stack_id, folded")
    _copy(ctx, con, COMMIT_BY_FUNCTION, resolve.by_frames("cm", weights, FUNCTION_KEY, MEASURES, "crate"),
          "inclusive_commit_bytes DESC, module, function, raw_name")
    _copy(ctx, con, COMMIT_BY_CODE_CRATE, resolve.by_frames("cm", weights, ["crate"], MEASURES),
          "inclusive_commit_bytes DESC, crate")
    _copy(ctx, con, COMMIT_FOLDED, f"""
        SELECT {PROCESS_FRAME_SQL} || coalesce(';' || st.folded, '') AS stack, count(*)::BIGINT AS allocs,
               sum(c.size)::BIGINT AS commit_bytes, sum(c.size - c.returned_bytes)::BIGINT AS outstanding_bytes
        FROM cm c LEFT JOIN procs p USING (process_key) LEFT JOIN cm_stacks st USING (unit_id) GROUP BY 1""", "stack")
    # The same by time bin of the commit (what the flame graph of a picked range is drawn from).
    bin_sql, commit_bins = resolve.time_bins(con, "cm", "c.timestamp_ns", COMMIT_BINS)
    _copy(ctx, con, COMMIT_FOLDED_OVER_TIME, f"""
        SELECT {bin_sql} AS bin,
               {PROCESS_FRAME_SQL} || coalesce(';' || st.folded, '') AS stack, sum(c.size)::BIGINT AS commit_bytes
        FROM cm c LEFT JOIN procs p USING (process_key) LEFT JOIN cm_stacks st USING (unit_id) GROUP BY 1, 2""", "bin, stack")
    con.execute("""
        CREATE TABLE va_proc AS
        SELECT v.*, p.process_key FROM va v ASOF LEFT JOIN procs p ON v.pid = p.pid AND v.timestamp_ns >= p.start_key""")
    # Commit over time: +size at each commit, -bytes at each free that returns some, in event order.
    con.execute("""
        CREATE TABLE deltas AS
        SELECT v.process_key, v.event, v.timestamp_ns, v.size AS delta FROM va_proc v
        WHERE v.event IN (SELECT event FROM commits)
        UNION ALL
        SELECT v.process_key, r.event, r.timestamp_ns, -r.bytes FROM returned r JOIN va_proc v USING (event)""")
    con.execute("""
        CREATE TABLE by_process AS
        WITH running AS (SELECT process_key, timestamp_ns, sum(delta) OVER (PARTITION BY process_key ORDER BY event) AS level
                         FROM deltas),
        peaks AS (SELECT process_key, max(level)::BIGINT AS peak_commit_bytes, arg_max(timestamp_ns, level) AS peak_ns
                  FROM running GROUP BY 1),
        per AS (SELECT process_key, count(*) FILTER (event IN (SELECT event FROM commits))::BIGINT AS allocs,
                       count(*) FILTER (kind = 'free')::BIGINT AS frees,
                       coalesce(sum(size) FILTER (event IN (SELECT event FROM commits)), 0)::BIGINT AS commit_bytes
                FROM va_proc GROUP BY 1),
        ret AS (SELECT v.process_key, sum(r.bytes)::BIGINT AS returned_bytes FROM returned r JOIN va_proc v USING (event)
                GROUP BY 1)
        SELECT per.process_key, p.pid, p.image_name, p.crate, per.allocs, per.frees, per.commit_bytes,
               coalesce(ret.returned_bytes, 0)::BIGINT AS returned_bytes,
               (per.commit_bytes - coalesce(ret.returned_bytes, 0))::BIGINT AS outstanding_bytes,
               coalesce(peaks.peak_commit_bytes, 0)::BIGINT AS peak_commit_bytes, peaks.peak_ns
        FROM per LEFT JOIN procs p USING (process_key) LEFT JOIN ret USING (process_key)
             LEFT JOIN peaks USING (process_key)""")
    _copy(ctx, con, COMMIT_BY_PROCESS, "SELECT * FROM by_process", "peak_commit_bytes DESC, process_key")
    # Per compiled crate (rustc's --crate-name): its processes' commit added up, and the largest peak of one of them.
    _copy(ctx, con, COMMIT_BY_CRATE, """
        SELECT crate, count(*)::BIGINT AS processes, sum(allocs)::BIGINT AS allocs, sum(commit_bytes)::BIGINT AS commit_bytes,
               sum(returned_bytes)::BIGINT AS returned_bytes, sum(outstanding_bytes)::BIGINT AS outstanding_bytes,
               max(peak_commit_bytes)::BIGINT AS peak_commit_bytes
        FROM by_process WHERE crate IS NOT NULL GROUP BY crate""", "peak_commit_bytes DESC, crate")
    # A process that ends gives back what it still had committed: the commit of all processes together counts a
    # process only while it runs (its own tables keep what no VirtualFree returned during the trace).
    con.execute("""
        CREATE TABLE levels AS
        SELECT process_key, event, timestamp_ns, delta FROM deltas
        UNION ALL
        SELECT b.process_key, NULL, p.end_ns, -b.outstanding_bytes FROM by_process b JOIN procs p USING (process_key)
        WHERE p.end_ns IS NOT NULL AND b.outstanding_bytes > 0""")
    # Commit over time: per bin of the trace's span, the level at its end and the highest level inside it, for the
    # processes with the largest peaks one by one and for all of them together (process_key NULL).
    _copy(ctx, con, COMMIT_OVER_TIME, f"""
        WITH top AS (SELECT process_key FROM by_process ORDER BY peak_commit_bytes DESC, process_key
                     LIMIT {COMMIT_PROCESSES}),
        lv AS (SELECT process_key, row_number() OVER (ORDER BY timestamp_ns, event NULLS LAST) AS event, timestamp_ns,
                      sum(delta) OVER (PARTITION BY process_key ORDER BY timestamp_ns, event NULLS LAST) AS level
               FROM levels WHERE process_key IN (SELECT process_key FROM top)
               UNION ALL
               SELECT NULL, row_number() OVER (ORDER BY timestamp_ns, event NULLS LAST), timestamp_ns,
                      sum(delta) OVER (ORDER BY timestamp_ns, event NULLS LAST) FROM levels),
        span AS (SELECT min(timestamp_ns) AS lo, greatest(max(timestamp_ns)::HUGEINT - min(timestamp_ns), 1) AS width FROM deltas),
        b AS (SELECT lv.*, least({COMMIT_BINS - 1}, ((timestamp_ns - lo)::HUGEINT * {COMMIT_BINS} // width))::INTEGER AS bin
              FROM lv, span)
        SELECT b.process_key, p.pid, p.image_name, p.crate, b.bin,
               (any_value(span.lo) + (b.bin + 1) * any_value(span.width)::HUGEINT // {COMMIT_BINS})::BIGINT AS t_ns,
               max(b.level)::BIGINT AS peak_bytes, arg_max(b.level, b.event)::BIGINT AS end_bytes
        FROM b, span LEFT JOIN procs p ON p.process_key = b.process_key
        GROUP BY b.process_key, p.pid, p.image_name, p.crate, b.bin""", "process_key NULLS FIRST, bin")
    # The whole trace's commit level (every process together, each while it runs) and its peak.
    peak, peak_ns = con.execute("""
        SELECT coalesce(max(level), 0), arg_max(timestamp_ns, level)
        FROM (SELECT timestamp_ns, sum(delta) OVER (ORDER BY timestamp_ns, event NULLS LAST) AS level FROM levels)
        """).fetchone()
    commits, frees, unmatched, total, returned = con.execute("""
        SELECT (SELECT count(*) FROM commits), (SELECT count(*) FROM frees),
               (SELECT count(*) FROM frees WHERE commit_event IS NULL),
               (SELECT coalesce(sum(size), 0) FROM commits), (SELECT coalesce(sum(bytes), 0) FROM returned)""").fetchone()
    return {"commits": int(commits), "frees": int(frees), "frees_unmatched": int(unmatched),
            "commit_bytes": int(total), "returned_bytes": int(returned), "outstanding_bytes": int(total - returned),
            "peak_commit_bytes": int(peak), "peak_ns": None if peak_ns is None else int(peak_ns),
            "commit_frames_unresolved": _unresolved(con, "cm"),
            "commit_time_bins": commit_bins}


def _unresolved(con, name: str) -> int:
    """Frame rows of the units ``name`` that no symbol file resolved (no raw name): 0 when every symbol was found."""
    return int(con.execute(f"SELECT count(*) FROM {name}_funcs WHERE raw_name IS NULL").fetchone()[0])


def _snapshots(ctx: Context) -> MemoryCounts:
    con = resolve.connect(ctx, SNAPSHOT_BLOCKS, "stacks", "processes", "images", *([SNAPSHOTS] if ctx.has(SNAPSHOTS) else []))
    resolve.assign_units(con, ctx, f"(SELECT *, NULL::UBIGINT AS ip FROM {SNAPSHOT_BLOCKS})", "hb")
    _copy(ctx, con, HEAP_BY_STACK, """
        SELECT b.pid, b.process_key, b.instance, b.timestamp_ns, b.stack_id, st.folded,
               count(*)::BIGINT AS blocks, sum(b.size)::BIGINT AS bytes
        FROM hb b LEFT JOIN hb_stacks st USING (unit_id)
        GROUP BY b.pid, b.process_key, b.instance, b.timestamp_ns, b.stack_id, st.folded""",
          "pid, timestamp_ns, instance, bytes DESC, stack_id")
    # Every snapshot the decoder saw, with its status: incomplete ones have no blocks here.
    if ctx.has(SNAPSHOTS):
        con.execute(f"CREATE VIEW snaps AS SELECT pid::BIGINT AS pid, instance, timestamp_ns, status FROM {SNAPSHOTS}")
    else:
        con.execute("CREATE VIEW snaps AS SELECT DISTINCT pid, instance, timestamp_ns, 'ok' AS status FROM hb")
    _copy(ctx, con, HEAP_SNAPSHOTS, """
        WITH per AS (
            SELECT pid, instance, timestamp_ns, any_value(process_key) AS process_key, count(*)::BIGINT AS blocks,
                   sum(size)::BIGINT AS bytes, count(*) FILTER (stack_id IS NULL)::BIGINT AS untracked_blocks,
                   coalesce(sum(size) FILTER (stack_id IS NULL), 0)::BIGINT AS untracked_bytes
            FROM hb GROUP BY pid, instance, timestamp_ns),
        s AS (SELECT s.*, p.process_key FROM snaps s ASOF LEFT JOIN procs p
              ON s.pid = p.pid AND s.timestamp_ns >= p.start_key)
        SELECT s.pid, s.process_key, p.image_name, p.crate, s.instance, s.timestamp_ns, s.status,
               coalesce(per.blocks, 0)::BIGINT AS blocks, coalesce(per.bytes, 0)::BIGINT AS bytes,
               coalesce(per.untracked_blocks, 0)::BIGINT AS untracked_blocks,
               coalesce(per.untracked_bytes, 0)::BIGINT AS untracked_bytes
        FROM s LEFT JOIN per USING (pid, instance, timestamp_ns) LEFT JOIN procs p ON p.process_key = s.process_key""",
          "pid, timestamp_ns, instance")
    _copy(ctx, con, HEAP_FOLDED, f"""
        WITH per AS (SELECT pid, instance, timestamp_ns, process_key, sum(size) AS bytes FROM hb GROUP BY ALL),
        top AS (SELECT * FROM per QUALIFY row_number() OVER (PARTITION BY process_key ORDER BY bytes DESC,
                                                                timestamp_ns) = 1)
        SELECT {PROCESS_FRAME_SQL} || ';' || coalesce(st.folded, '[no stack recorded]') AS stack,
               count(*)::BIGINT AS blocks, sum(b.size)::BIGINT AS bytes
        FROM hb b JOIN top USING (pid, instance, timestamp_ns) LEFT JOIN procs p ON p.process_key = b.process_key
             LEFT JOIN hb_stacks st USING (unit_id) GROUP BY 1""", "stack")
    # Per function at each snapshot: bytes and blocks of the stacks whose leaf it is (self) or that hold it (inclusive).
    snapshot = ", ".join(SNAPSHOT_KEY)
    con.execute(f"""CREATE TABLE hbf AS {resolve.by_frames(
        "hb", f"SELECT unit_id, {snapshot}, count(*)::BIGINT AS blocks, sum(size)::BIGINT AS bytes FROM hb GROUP BY ALL",
        FUNCTION_KEY, ["bytes", "blocks"], "crate", by=SNAPSHOT_KEY)}""")
    _copy(ctx, con, HEAP_BY_FUNCTION, "SELECT * FROM hbf",
          "pid, timestamp_ns, instance, inclusive_bytes DESC, module, function, raw_name")
    _copy(ctx, con, HEAP_GROWTH, GROWTH_SQL,
          "pid, from_ns, from_instance, growth_bytes DESC, module, function, raw_name")
    n, bad = con.execute("SELECT count(*), count(*) FILTER (status <> 'ok') FROM snaps").fetchone()
    pairs = con.execute(f"SELECT count(*) FROM ({PAIRS_SQL})").fetchone()[0]
    return {"heap_snapshots": int(n), "heap_snapshots_not_ok": int(bad), "heap_snapshot_pairs": int(pairs),
            "heap_frames_unresolved": _unresolved(con, "hb")}


#: Each snapshot with blocks and the next one of the same process instance (by time, then instance number).
PAIRS_SQL = """
    SELECT pid, process_key, instance AS from_instance, timestamp_ns AS from_ns, to_instance, to_ns
    FROM (SELECT *, lead(instance) OVER w AS to_instance, lead(timestamp_ns) OVER w AS to_ns
          FROM (SELECT DISTINCT pid, process_key, instance, timestamp_ns FROM hb)
          WINDOW w AS (PARTITION BY pid, process_key ORDER BY timestamp_ns, instance))
    WHERE to_instance IS NOT NULL"""

#: Growth per function from each snapshot to the next of its process (``PAIRS_SQL``), from ``hbf``: a function
#: in one of the two only counts 0 in the other.
GROWTH_SQL = f"""
    WITH pairs AS ({PAIRS_SQL}),
    sides AS (
        SELECT p.*, 0 AS side, f.module, f.function, f.raw_name, f.crate, f.inclusive_bytes, f.inclusive_blocks, f.self_bytes
        FROM pairs p JOIN hbf f ON f.pid = p.pid AND f.process_key IS NOT DISTINCT FROM p.process_key
         AND f.instance = p.from_instance AND f.timestamp_ns = p.from_ns
        UNION ALL
        SELECT p.*, 1, f.module, f.function, f.raw_name, f.crate, f.inclusive_bytes, f.inclusive_blocks, f.self_bytes
        FROM pairs p JOIN hbf f ON f.pid = p.pid AND f.process_key IS NOT DISTINCT FROM p.process_key
         AND f.instance = p.to_instance AND f.timestamp_ns = p.to_ns),
    g AS (
        SELECT pid, process_key, from_instance, from_ns, to_instance, to_ns, module, function, raw_name,
               any_value(crate) AS crate,
               coalesce(sum(inclusive_bytes) FILTER (side = 0), 0)::BIGINT AS bytes_before,
               coalesce(sum(inclusive_bytes) FILTER (side = 1), 0)::BIGINT AS bytes_after,
               coalesce(sum(inclusive_blocks) FILTER (side = 0), 0)::BIGINT AS blocks_before,
               coalesce(sum(inclusive_blocks) FILTER (side = 1), 0)::BIGINT AS blocks_after,
               (coalesce(sum(self_bytes) FILTER (side = 1), 0) - coalesce(sum(self_bytes) FILTER (side = 0), 0))::BIGINT
                   AS self_growth_bytes
        FROM sides GROUP BY pid, process_key, from_instance, from_ns, to_instance, to_ns, module, function, raw_name)
    SELECT pid, process_key, from_instance, from_ns, to_instance, to_ns, module, function, raw_name, crate,
           bytes_before, bytes_after, (bytes_after - bytes_before)::BIGINT AS growth_bytes,
           blocks_before, blocks_after, (blocks_after - blocks_before)::BIGINT AS growth_blocks, self_growth_bytes
    FROM g"""
