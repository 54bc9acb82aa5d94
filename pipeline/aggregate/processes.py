"""Processes section: the process tree of an ETL trace with lifetimes, command lines and CPU samples.

Applies when ``decoded/`` has ``processes``. One row per process instance (pid and start, see
:mod:`.resolve`). The parent instance is the instance of ``parent_pid`` that was alive when the child
started (latest start at or before it, not ended before it); a parent outside the trace leaves
``parent_key`` NULL and the process is a root. ``samples`` counts the process's own CPU samples,
``tree_samples`` those of its whole subtree (a cargo invocation with every rustc it spawned).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.aggregate import resolve
from pipeline.runs import sql_path

if TYPE_CHECKING:
    from pipeline.aggregate.context import Context
    from pipeline.contracts import ProcessCounts

TREE = "process_tree"

#: Up to this many instances of one pid, each sample finds its instance by a hash join on the pid and the
#: instance's time range, several times faster than an ASOF join, which sorts them all. The join's work grows
#: with the instances of a pid, so beyond this (a damaged or
#: hostile trace) the ASOF join is used instead (the same instance for every sample, unless two instances of a
#: pid start at the same time).
RANGE_JOIN_MAX_INSTANCES = 16


def aggregate(ctx: Context) -> ProcessCounts | None:
    if not ctx.has("processes"):
        return None
    tables = ["processes"] + [t for t in ("samples", "threads") if ctx.has(t)]
    con = resolve.connect(ctx, *tables)
    if "samples" not in tables:
        con.execute("CREATE VIEW samples AS SELECT NULL::BIGINT AS pid, NULL::BIGINT AS timestamp_ns WHERE false")
    if "threads" not in tables:
        con.execute("CREATE VIEW threads AS SELECT NULL::BIGINT AS pid, NULL::BIGINT AS first_seen_ns WHERE false")
    # A sample's process instance: the instance of its pid with the latest start at or before it.
    instances = con.execute("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM procs GROUP BY pid)").fetchone()[0]
    own_join = resolve.current_at("procs", "start_key", "p", instances <= RANGE_JOIN_MAX_INSTANCES, tie="process_key")
    con.execute(f"""
        CREATE TABLE tree AS
        WITH own AS (
            SELECT p.process_key, count(*)::BIGINT AS samples
            FROM (SELECT coalesce(pid::BIGINT, -1) AS pid, timestamp_ns FROM samples) s
            {own_join} GROUP BY 1),
        thr AS (
            SELECT p.process_key, count(*)::BIGINT AS threads
            FROM (SELECT pid::BIGINT AS pid, first_seen_ns FROM threads) t
            ASOF JOIN procs p ON t.pid = p.pid AND t.first_seen_ns >= p.start_key GROUP BY 1),
        parent AS (
            SELECT c.process_key, par.process_key AS parent_key
            FROM procs c ASOF LEFT JOIN procs par ON c.parent_pid = par.pid AND c.start_key >= par.start_key
            WHERE par.process_key IS NULL OR par.process_key <> c.process_key)
        SELECT p.process_key,
               CASE WHEN pr.end_ns IS NULL OR pr.end_ns >= p.start_key THEN parent.parent_key END AS parent_key,
               p.pid, p.parent_pid, p.image_name, p.crate, p.command_line, p.start_ns, p.end_ns,
               p.end_ns - p.start_ns AS duration_ns, p.exit_status, q.first_seen_ns, q.last_seen_ns,
               coalesce(thr.threads, 0)::BIGINT AS threads, coalesce(own.samples, 0)::BIGINT AS samples
        FROM procs p
        JOIN (SELECT (row_number() OVER (ORDER BY pid, start_ns NULLS FIRST, first_seen_ns) - 1)::BIGINT AS process_key,
                     first_seen_ns, last_seen_ns FROM processes) q USING (process_key)
        LEFT JOIN parent USING (process_key) LEFT JOIN procs pr ON pr.process_key = parent.parent_key
        LEFT JOIN own USING (process_key) LEFT JOIN thr USING (process_key)""")
    # Depth and subtree samples: walk down from every root. Processes the walk does not reach sit on
    # a parent cycle (rundown processes whose parent pids point at each other after pid reuse); they
    # become roots, and the walk runs again.
    walk = """
        CREATE OR REPLACE TABLE walk AS
        WITH RECURSIVE w(process_key, depth, root_key, path) AS (
            SELECT process_key, 0, process_key, [process_key] FROM tree WHERE parent_key IS NULL
            UNION ALL
            SELECT t.process_key, w.depth + 1, w.root_key, list_append(w.path, t.process_key)
            FROM tree t JOIN w ON t.parent_key = w.process_key WHERE w.depth < 64)
        SELECT * FROM w"""
    con.execute(walk)
    cycles = con.execute("SELECT count(*) FROM tree WHERE process_key NOT IN (SELECT process_key FROM walk)").fetchone()[0]
    if cycles:
        con.execute("UPDATE tree SET parent_key = NULL WHERE process_key NOT IN (SELECT process_key FROM walk)")
        con.execute(walk)
    con.execute(f"""
        COPY (
        WITH anc AS (SELECT unnest(path) AS ancestor, process_key FROM walk)
        SELECT t.*, w.depth::INTEGER AS depth, w.root_key,
               (SELECT sum(t2.samples) FROM anc JOIN tree t2 ON t2.process_key = anc.process_key
                WHERE anc.ancestor = t.process_key)::BIGINT AS tree_samples
        FROM tree t LEFT JOIN walk w USING (process_key)
        ORDER BY coalesce(t.start_ns, t.first_seen_ns), t.process_key)
        TO {sql_path(ctx.out.table_path(TREE))} (FORMAT parquet, COMPRESSION zstd)""")
    n, roots, ended = con.execute("SELECT count(*), count(*) FILTER (parent_key IS NULL), count(end_ns) FROM tree").fetchone()
    return {"processes": int(n), "roots": int(roots), "ended": int(ended), "parent_cycles_broken": int(cycles)}
