"""Query section: rustc self-profile events -> measureme ``summarize`` tables, stacks, artifact sizes.

Applies when ``decoded/`` holds ``query_events`` (see ``pipeline/decode/measureme/schema.md``).
Semantics follow analyzeme's ``perform_analysis`` (format notes §3), computed per file and then
summed per crate and for the whole build:

* every number is keyed by **label**, whatever the event kind;
* ``self_ns`` of an interval is its duration minus its direct children (the decoder nested the
  events per thread, walking backwards, with inclusive containment), so self times of a file sum
  to the summed duration of its root intervals;
* ``time_ns`` adds every interval's duration except ``IncrementalResultHashing`` (already inside
  its query); ``invocations`` counts intervals except ``QueryBlocked``, ``IncrementalLoadResult`` and
  ``IncrementalResultHashing``; ``cache_misses`` counts ``Query`` and ``GenericActivity``;
* ``cache_hits`` adds ``QueryCacheHitCount`` values, plus ``QueryCacheHit`` instants that come
  after the last ``QueryCacheHitCount`` of their label in the file (summarize walks backwards and
  ignores instants of a label once it has seen a count for it);
* ``blocked_ns`` = durations of ``QueryBlocked``; ``incr_load_ns`` / ``incr_hashing_ns`` = self
  times of ``IncrementalLoadResult`` / ``IncrementalResultHashing`` events;
* ``total_ns`` of a file = sum over threads of (last interval end - first interval start), which
  summarize prints as "Total cpu time"; the difference to the summed self times is the time
  between root events (the ``<crate>`` root frame of the folded stacks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.aggregate.resolve import CMD_CRATE_SQL, duckdb_for
from pipeline.runs import parquet_glob, sql_path

if TYPE_CHECKING:
    from pipeline.aggregate.context import Context
    from pipeline.contracts import QueryCounts

EVENTS = "query_events"
FILES = "self_profiles"
ETL_PROCESSES = "processes"
ETL_TRACE = "trace"
PERF_FILE = "perf_file"     # a perf run's one-row table (pipeline/decode/perf/schema.md)
#: FILETIME (100 ns ticks since 1601-01-01) of the Unix epoch.
FILETIME_UNIX_EPOCH = 116_444_736_000_000_000

SUMMARY = "query_summary"
TOTALS = "query_totals"
ARTIFACTS = "artifact_sizes"
STACKS = "query_stacks"
PROCESSES = "self_profile_processes"

#: ``query_summary.category``: 'query' when the label has query events (Query, cache hits, incremental
#: loads, hashing, blocking), else 'activity' for GenericActivity (timed passes), else 'other'.
#: Measure columns of ``query_summary``, in summarize's order.
MEASURES = ["self_ns", "time_ns", "invocations", "cache_misses", "cache_hits", "blocked_ns",
            "incr_load_ns", "incr_hashing_ns"]

_PER_FILE = """
with iv as (
    select file_id, crate, label, kind, end_ns - start_ns as d, self_ns
    from ev where payload = 'interval'),
per_label as (
    select file_id, label,
        sum(self_ns)::BIGINT as self_ns,
        sum(case when kind <> 'IncrementalResultHashing' then d else 0 end)::BIGINT as time_ns,
        count(*) filter (where kind not in ('QueryBlocked', 'IncrementalLoadResult',
                                            'IncrementalResultHashing'))::BIGINT as invocations,
        count(*) filter (where kind in ('Query', 'GenericActivity'))::BIGINT as cache_misses,
        sum(case when kind = 'QueryBlocked' then d else 0 end)::BIGINT as blocked_ns,
        sum(case when kind = 'IncrementalLoadResult' then self_ns else 0 end)::BIGINT as incr_load_ns,
        sum(case when kind = 'IncrementalResultHashing' then self_ns else 0 end)::BIGINT as incr_hashing_ns
    from iv group by file_id, label),
counts as (
    select file_id, label, sum(value) as hits, max(event_index) as last_count
    from ev where kind = 'QueryCacheHitCount' and payload = 'integer' group by file_id, label),
instants as (
    select e.file_id, e.label, count(*) as hits
    from ev e left join counts c on e.file_id = c.file_id and e.label = c.label
    where e.kind = 'QueryCacheHit' and e.payload = 'instant'
      and (c.last_count is null or e.event_index > c.last_count)
    group by e.file_id, e.label),
categories as (
    select file_id, label, max(case when kind = 'GenericActivity' then 1
                                    when kind in ('Query', 'QueryBlocked', 'QueryCacheHit', 'QueryCacheHitCount',
                                                  'IncrementalLoadResult', 'IncrementalResultHashing') then 2
                                    else 0 end) as category
    from ev where kind <> 'ArtifactSize' group by file_id, label),
hits as (
    select file_id, label, sum(hits)::BIGINT as cache_hits
    from (select file_id, label, hits from counts union all select file_id, label, hits from instants)
    group by file_id, label)
select coalesce(p.file_id, h.file_id) as file_id, coalesce(p.label, h.label) as label, c.category,
    coalesce(self_ns, 0) as self_ns, coalesce(time_ns, 0) as time_ns,
    coalesce(invocations, 0) as invocations, coalesce(cache_misses, 0) as cache_misses,
    coalesce(cache_hits, 0) as cache_hits, coalesce(blocked_ns, 0) as blocked_ns,
    coalesce(incr_load_ns, 0) as incr_load_ns, coalesce(incr_hashing_ns, 0) as incr_hashing_ns
from per_label p full outer join hits h on p.file_id = h.file_id and p.label = h.label
join categories c on c.file_id = coalesce(p.file_id, h.file_id) and c.label = coalesce(p.label, h.label)
"""

_TOTALS_FILE = """
select file_id, sum(span)::BIGINT as total_ns, sum(span - roots)::BIGINT as gap_ns,
       min(first_start) as first_ns, max(last_end) as last_ns, count(*)::BIGINT as threads
from (select file_id, thread, max(end_ns) - min(start_ns) as span, min(start_ns) as first_start,
             max(end_ns) as last_end, sum(case when depth = 0 then end_ns - start_ns else 0 end) as roots
      from ev where payload = 'interval' group by file_id, thread)
group by file_id
"""


def _scoped(sql_file_level: str, keys: list[str], measures: list[str]) -> str:
    """Rows per file, per crate and for the whole build from a per-file query (joined to the files).

    Measures are summed, except ``category`` (a rank: the largest wins)."""
    sums = ", ".join(f"max({m}) as {m}" if m == "category" else f"coalesce(sum({m}), 0)::BIGINT as {m}"
                     for m in measures)
    k = "".join(f"{key}, " for key in keys)
    group = "group by " + ", ".join(keys) if keys else ""
    return f"""
    with f as (select t.*, s.crate from ({sql_file_level}) t join sp s using (file_id))
    select 'file' as scope, file_id, crate, {k}{", ".join(measures)} from f
    union all
    select 'crate', null, crate, {k}{sums} from f group by crate{"".join(", " + key for key in keys)}
    union all
    select 'build', null, null, {k}{sums} from f {group}
    """


def aggregate(ctx: Context) -> QueryCounts | None:
    """Write query_summary, query_totals, artifact_sizes, query_stacks, self_profile_processes."""
    if not ctx.has(EVENTS):
        return None
    con = duckdb_for(ctx)
    con.execute("SET preserve_insertion_order = true")      # (as this section was written against)
    con.execute(f"create view ev as select * from read_parquet({sql_path(parquet_glob(ctx.source(EVENTS)))})")
    con.execute(f"create view sp as select * from read_parquet({sql_path(parquet_glob(ctx.source(FILES)))}) where status = 'ok'")

    con.execute(f"create table file_totals as {_TOTALS_FILE}")
    totals_sql = _scoped("select * from file_totals", [], ["total_ns", "gap_ns", "threads"])
    con.execute(f"create table totals as select scope, file_id, crate, total_ns, gap_ns, threads from ({totals_sql})")
    summary_sql = _scoped(_PER_FILE, ["label"], ["category"] + MEASURES)
    con.execute(f"create table summary as {summary_sql}")
    summary = con.sql("""
        select s.scope, s.file_id, s.crate, s.label,
               case s.category when 2 then 'query' when 1 then 'activity' else 'other' end as category, s.self_ns, s.time_ns, s.invocations, s.cache_misses,
               s.cache_hits, s.blocked_ns, s.incr_load_ns, s.incr_hashing_ns,
               round(100.0 * s.self_ns / nullif(t.total_ns, 0), 3) as pct_total
        from summary s join totals t on s.scope = t.scope
             and s.file_id is not distinct from t.file_id and s.crate is not distinct from t.crate
        order by s.scope, s.crate nulls first, s.file_id nulls first, s.self_ns desc, s.label
    """).to_arrow_table()
    ctx.out.write_table(SUMMARY, summary)

    totals = con.sql("""
        select scope, file_id, crate, total_ns, gap_ns, threads from totals
        order by scope, crate nulls first, file_id nulls first
    """).to_arrow_table()
    ctx.out.write_table(TOTALS, totals)

    artifacts_sql = _scoped("""select file_id, label, sum(value)::BIGINT as bytes from ev
                               where kind = 'ArtifactSize' and payload = 'integer' group by file_id, label""",
                            ["label"], ["bytes"])
    artifacts = con.sql(f"select * from ({artifacts_sql}) order by scope, crate nulls first, "
                        f"file_id nulls first, bytes desc, label").to_arrow_table()
    ctx.out.write_table(ARTIFACTS, artifacts)

    stacks = _stacks(ctx, con)
    ctx.out.write_table(STACKS, stacks)

    processes = _processes(ctx, con)
    ctx.out.write_table(PROCESSES, processes)
    matched = sum(1 for m in processes.column("etl_match").to_pylist() if m)
    return {
        "files": processes.num_rows,
        "labels": con.sql("select count(distinct label) from summary where scope = 'build'").fetchall()[0][0],
        "crates": con.sql("select count(*) from totals where scope = 'crate'").fetchall()[0][0],
        "stacks": stacks.num_rows,
        "etl_matched": matched if ctx.has(ETL_PROCESSES) else None,
    }


# ----------------------------------------------------------------------------------------------
# Folded stacks


def stacks_of_part(part: str) -> dict[str, list]:
    """Dask task: folded query stacks (crate root, labels) and their self time for one part file.

    The decoder stored each event's parent as an event index inside its file, and a parent always
    comes after its children in the file (it ends later). Walking depth by depth, a stack id is
    the pair (stack of the parent, label), numbered with ``np.unique``; depth 0 hangs below the
    crate's root frame.
    """
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(part, columns=["crate", "label", "payload", "self_ns", "depth", "parent", "event_index"])
    t = t.unify_dictionaries().combine_chunks()
    if t.num_rows == 0:
        return {"stack": [], "self_ns": []}
    crate, label, payload = (t.column(c).chunk(0) for c in ("crate", "label", "payload"))
    interval = (payload.indices.to_numpy() == payload.dictionary.to_pylist().index("interval"))
    crate_idx = crate.indices.to_numpy().astype(np.int64)
    label_idx = label.indices.to_numpy().astype(np.int64)
    depth = t.column("depth").to_numpy()
    parent = t.column("parent").to_numpy()
    row = np.arange(t.num_rows, dtype=np.int64)
    gparent = np.where(parent >= 0, row - t.column("event_index").to_numpy() + parent, -1)
    self_ns = t.column("self_ns").to_numpy(zero_copy_only=False)
    n_labels = max(1, len(label.dictionary))
    crates = crate.dictionary.to_pylist()
    labels = label.dictionary.to_pylist()

    # Stack table: ids [0, len(crates)) are the crate roots.
    st_parent = [np.full(len(crates), -1, np.int64)]
    st_label = [np.arange(len(crates), dtype=np.int64)]
    n_stacks = len(crates)
    stack = np.full(t.num_rows, -1, np.int64)
    iv = np.nonzero(interval)[0]
    order = iv[np.argsort(depth[iv], kind="stable")]
    bounds = np.searchsorted(depth[order], np.arange(int(depth[order].max()) + 2) if len(order) else [0])
    for d in range(len(bounds) - 1):
        idx = order[bounds[d]: bounds[d + 1]]
        if not len(idx):
            continue
        pstack = crate_idx[idx] if d == 0 else stack[gparent[idx]]
        keys = pstack * n_labels + label_idx[idx]
        uniq, inv = np.unique(keys, return_inverse=True)
        stack[idx] = n_stacks + inv
        st_parent.append(uniq // n_labels)
        st_label.append(uniq % n_labels)
        n_stacks += len(uniq)
    st_parent = np.concatenate(st_parent)
    st_label = np.concatenate(st_label)
    sums = np.zeros(n_stacks, np.int64)
    np.add.at(sums, stack[iv], self_ns[iv].astype(np.int64))
    names: list[str] = []
    for s in range(n_stacks):
        if s < len(crates):
            names.append(crates[s])
        else:
            names.append(names[st_parent[s]] + ";" + labels[st_label[s]])
    keep = np.arange(len(crates), n_stacks)  # root frames get the gaps, from the totals
    return {"stack": [names[s] for s in keep], "self_ns": sums[keep].tolist()}


def _stacks(ctx, con):
    import pyarrow as pa

    from pipeline.mirror import placed_by

    parts = sorted(str(p) for p in ctx.source(EVENTS).rglob("*.parquet"))
    ctx.pool.require_shared(ctx.run_dir, placed_by(ctx.run_dir))      # (the tasks read the parts there)
    results = ctx.pool.map(stacks_of_part, parts)
    stack = [s for r in results for s in r["stack"]]
    self_ns = [v for r in results for v in r["self_ns"]]
    gaps = con.sql("select crate, gap_ns from totals where scope = 'crate'").fetchall()
    stack += [c for c, _ in gaps]
    self_ns += [int(g) for _, g in gaps]
    con.register("raw_stacks", pa.table({"stack": pa.array(stack, pa.string()), "self_ns": pa.array(self_ns, pa.int64())}))
    return con.sql("""
        select split_part(stack, ';', 1) as crate, stack, sum(self_ns)::BIGINT as self_ns
        from raw_stacks group by stack having sum(self_ns) > 0 order by crate, stack
    """).to_arrow_table()


# ----------------------------------------------------------------------------------------------
# Processes, and the join with an ETL trace's processes


def join_etl(profiles: list[dict], etl: list[dict], tolerance_ns: int) -> list[dict]:
    """Match each self-profile to one ETL process by pid, command line (crate name) and start time.

    ETL rows carry ``crate``, read from their command line by ``resolve.CMD_CRATE_SQL``.

    A candidate must share the pid, or else the crate name and a start within ``tolerance_ns``.
    Among candidates, one that satisfies more of (pid, crate, time) wins, then the closest start.
    ``etl_match`` says which criteria held, e.g. ``"pid+cmd+time"``; None when nothing matched.
    """
    out = []
    for sp in profiles:
        best, best_key, best_how = None, None, None
        for p in etl:
            same_pid = p["pid"] == sp["pid"]
            same_cmd = sp["crate"] is not None and p.get("crate") == sp["crate"]
            dt = (abs(p["start_ns"] - sp["start_time_ns"])
                  if p.get("start_ns") is not None and sp.get("start_time_ns") is not None else None)
            close = dt is not None and dt <= tolerance_ns
            if not (same_pid or (same_cmd and close)):
                continue
            if same_pid and sp["crate"] is not None and p.get("crate") not in (None, sp["crate"]):
                continue  # a reused pid running another crate
            key = (-(same_pid + same_cmd + close), dt if dt is not None else float("inf"))
            if best_key is None or key < best_key:
                how = "+".join(n for n, ok in (("pid", same_pid), ("cmd", same_cmd), ("time", close)) if ok)
                best, best_key, best_how = p, key, how
        out.append({
            "etl_pid": best["pid"] if best else None,
            "etl_parent_pid": best.get("parent_pid") if best else None,
            "etl_image": best.get("image_name") if best else None,
            "etl_start_ns": best.get("start_ns") if best else None,   # ns since the Unix epoch
            "etl_end_ns": best.get("end_ns") if best else None,
            "etl_match": best_how,
        })
    return out


def trace_start_unix_ns(ctx, con) -> int | None:
    """The ETL trace's start (its header's FILETIME) in ns since the Unix epoch: what makes the trace's times, ns
    since its start, comparable with a self-profile's ``start_time``; for a perf run, the Unix time of its
    ``timestamp_ns`` 0 (``perf_file.origin_unix_ns``). None without a trace or a start time."""
    if ctx.has(PERF_FILE):      # (a perf run: the Unix time of its timestamp_ns 0, when perf wrote its clock's)
        row = con.execute("SELECT origin_unix_ns FROM read_parquet($1)", [parquet_glob(ctx.source(PERF_FILE))]).fetchall()
        return int(row[0][0]) if row and row[0][0] is not None else None
    if not ctx.has(ETL_TRACE):
        return None
    ft = con.execute("SELECT start_filetime FROM read_parquet($1)", [parquet_glob(ctx.source(ETL_TRACE))]).fetchall()
    return (int(ft[0][0]) - FILETIME_UNIX_EPOCH) * 100 if ft and ft[0][0] else None


def _processes(ctx, con):
    import pyarrow as pa

    rows = con.sql("""
        select s.file_id, s.crate, s.pid, s.cmd, s.start_time_ns, s.events, t.total_ns, t.threads,
               s.start_time_ns + t.first_ns as wall_start_ns, s.start_time_ns + t.last_ns as wall_end_ns
        from sp s left join file_totals t using (file_id)
        order by s.file_id
    """).to_arrow_table().to_pylist()
    etl: list[dict] = []
    if ctx.has(ETL_PROCESSES):
        # ETL times are ns since the trace start; the trace table's start FILETIME makes them absolute.
        base = trace_start_unix_ns(ctx, con) or 0
        etl = con.sql(f"select pid, parent_pid, image_name, command_line, {CMD_CRATE_SQL} as crate, "
                      f"start_ns + {int(base)} as start_ns, "
                      f"end_ns + {int(base)} as end_ns "
                      "from read_parquet($1)", params=[parquet_glob(ctx.source(ETL_PROCESSES))]).to_arrow_table().to_pylist()
    tolerance = int(ctx.config.aggregate.etl_join_tolerance_ms * 1_000_000)
    for row, match in zip(rows, join_etl(rows, etl, tolerance)):
        row.update(match)
    schema = pa.schema([
        ("file_id", pa.int32()), ("crate", pa.string()), ("pid", pa.int64()), ("cmd", pa.string()),
        ("start_time_ns", pa.int64()), ("events", pa.int64()), ("total_ns", pa.int64()), ("threads", pa.int64()),
        ("wall_start_ns", pa.int64()), ("wall_end_ns", pa.int64()),
        ("etl_pid", pa.int64()), ("etl_parent_pid", pa.int64()), ("etl_image", pa.string()),
        ("etl_start_ns", pa.int64()), ("etl_end_ns", pa.int64()), ("etl_match", pa.string()),
    ])
    return pa.Table.from_pylist(rows, schema=schema)
