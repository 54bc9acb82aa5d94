"""Shared SQL for the ETL sections (cpu, memory, processes): process instances and resolved stacks.

Everything is DuckDB over the parquet of ``decoded/`` and ``symbolized/``; no per-row Python.

**Process instances.** Windows reuses pids, so a process is (pid, start): ``procs`` numbers every
row of ``decoded/processes`` as ``process_key``; an event at time t in pid p belongs to the
instance of p with the latest start at or before t. Processes running when the trace began (start
NULL) come before all others, in the order the rundown listed them (``first_seen_ns``): Windows
lists live processes in creation order, so a parent comes before its children there too.

**Units.** Events that share (pid, stack, ip) and see the same loaded images resolve to the same
frames, so resolution runs once per *unit*, not per event. "The same loaded images" is the
*image epoch*: the number of image loads/unloads of that pid at or before the event. Within one
epoch the set of images of a process cannot change, so any time of the unit picks the same image
for each address (symbolize keeps one frames row per (pid, address, image instance)).

**Frames of a unit.** The stack's frames (leaf first), or the ip alone when the event has no
stack. Each frame picks the frames-table row of its role (frame 0 the leaf row, the others the
return-address row) whose image was loaded at the unit's time (latest load wins); an inlined frame
expands into its inline chain. Order, root first::

    frame pos n-1 (root) ... frame pos 0 (leaf); inside one frame inline_depth 0 (the real
    function) ... deepest inlined call

so the *leaf function* of a unit is (pos 0, largest inline_depth).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pipeline import timings
from pipeline.runs import parquet_glob, sql_path
from pipeline.stages import SYMBOLIZED

if TYPE_CHECKING:
    import pyarrow as pa

FRAMES = "frames"

#: Smallest/largest BIGINT: open lifetime ends (NULL start = before the trace, NULL end = after it).
MIN_NS = -9223372036854775807
MAX_NS = 9223372036854775807

#: Crate of a function, from its demangled name: the first path segment of a Rust path
#: (``rustc_middle::ty::...``, ``<rustc_ast::Expr as core::Clone>::clone`` -> rustc_middle, rustc_ast,
#: a v0 ``crate[1a2b]::`` disambiguator dropped). MSVC-mangled (``?``) names and llvm:: are C++, not crates.
CRATE_SQL = """CASE WHEN coalesce(raw_name, '') LIKE '?%' THEN NULL
     ELSE nullif(nullif(regexp_extract(function, '^<*([a-z_][a-z0-9_]*)(\\[[0-9a-f]+\\])?::', 1), ''), 'llvm') END"""

#: ``--crate-name X`` (or ``--crate-name=X``, either part quoted) of a command line; NULL when absent.
CMD_CRATE_SQL = """nullif(regexp_extract(command_line, '--crate-name"?[ =]+"?([^ "]+)', 1), '')"""


def duckdb_for(ctx):
    """A DuckDB connection for one section: its share of ``aggregate.memory_limit`` (``section_memory``);
    beyond it joins and sorts spill into a hidden directory of the run, removed when the connection goes away.
    (A section that needs more even so fails: the stage names the setting, ``pipeline.aggregate.run``.)"""
    import os
    import shutil
    import tempfile
    import weakref

    import duckdb

    # (named with this process: the next stage run removes it if a kill left it behind, runs.clean_leftovers)
    spill = tempfile.mkdtemp(prefix=f".aggregate-spill-{os.getpid()}-", dir=ctx.run_dir)
    con = duckdb.connect(config={"preserve_insertion_order": False, "temp_directory": spill,
                                 "memory_limit": f"{section_memory(ctx.config.aggregate.memory_limit, ctx.at_once)}B"})
    weakref.finalize(con, shutil.rmtree, spill, True)
    return timings.timed(con)


def section_memory(limit: int, at_once: int) -> int:
    """One section's share of the stage's DuckDB memory: an even share among the ``at_once`` sections that run at
    once, at least the smallest limit the setting allows (or the whole limit, when it is smaller still)."""
    from pipeline.config import AGGREGATE_MEMORY_MIN

    return max(limit // max(at_once, 1), min(int(limit), AGGREGATE_MEMORY_MIN))


def connect(ctx, *tables: str):
    """A DuckDB connection with views of the named ``decoded/`` tables and the ``procs`` table."""
    con = duckdb_for(ctx)
    for table in tables:
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({sql_path(parquet_glob(ctx.source(table)))})")
    if "processes" in tables:
        con.execute(f"""
            CREATE TABLE procs AS
            SELECT (row_number() OVER (ORDER BY pid, start_ns NULLS FIRST, first_seen_ns) - 1)::BIGINT AS process_key,
                   pid::BIGINT AS pid, parent_pid::BIGINT AS parent_pid, image_name, command_line,
                   {CMD_CRATE_SQL} AS crate, start_ns, end_ns, exit_status,
                   coalesce(start_ns, {MIN_NS} + greatest(coalesce(first_seen_ns, 0), 0)) AS start_key
            FROM processes""")
    return con


def has_frames(ctx) -> bool:
    """Whether the run has a symbolized ``frames`` table (once ``symbolized/`` is final: ``Context.frames_final``)."""
    from pipeline.runs import has_table, stage_dir

    ctx.frames_final()
    return has_table(ctx.run_dir, SYMBOLIZED, FRAMES) and (stage_dir(ctx.run_dir, SYMBOLIZED) / "_manifest.json").exists()


#: The epochs of each pid, numbered in time order, with the process instance then current: they start at its
#: process starts and at the loads and unloads of images whose address range overlaps another image of the
#: same process instance (an image belongs to the instance current at its load; a rundown image, loaded
#: before the trace, to the pid's first). Only there can an address change image within an instance; an
#: image that overlaps only images of other instances (a reused pid: the same DLLs at the same bases) is
#: parted from them by the instance's start. Fewer bounds mean fewer units to resolve and a cheaper epoch
#: join: 16.8 -> 2.9 bounds a sample on PerfViewData.etl, 8.8 -> 1.1 on the 1 GB synth trace (same tables).
BOUNDS_SQL = """CREATE TABLE IF NOT EXISTS bounds AS
    WITH img AS (SELECT row_number() OVER () AS img, i.pid::BIGINT AS pid, i.base, i.size, i.load_ns, i.unload_ns,
                        coalesce(i.load_ns, f.first_key) AS at
                 FROM images i LEFT JOIN (SELECT pid, min(start_key) AS first_key FROM procs GROUP BY pid) f
                   ON f.pid = i.pid),
    inst AS (SELECT img.*, coalesce(p.process_key, -1) AS instance
             FROM img ASOF LEFT JOIN procs p ON img.pid = p.pid AND img.at >= p.start_key),
    shared AS (SELECT DISTINCT a.pid, a.load_ns, a.unload_ns FROM inst a JOIN inst b
                 ON a.pid = b.pid AND a.instance = b.instance AND a.img <> b.img
                AND a.base < b.base + b.size AND b.base < a.base + a.size),
    b AS (SELECT pid, load_ns AS t FROM shared WHERE load_ns IS NOT NULL
          UNION SELECT pid, unload_ns FROM shared WHERE unload_ns IS NOT NULL
          UNION SELECT pid, start_key FROM procs)
    SELECT b.pid, b.t, row_number() OVER (PARTITION BY b.pid ORDER BY b.t)::BIGINT AS epoch, p.process_key
    FROM b ASOF LEFT JOIN procs p ON b.pid = p.pid AND b.t >= p.start_key"""

#: A row's epoch (``bounds``) is found by a hash join on the pid and each epoch's time range while a row
#: meets at most this many bounds of its pid on average (``epoch_probes``); beyond, by an ASOF join, which
#: sorts every row. The hash join's work grows with the bounds, the ASOF join's does not; the limit lies below
#: where the two cost the same (bench/HISTORY.md has the measurements).
RANGE_JOIN_MAX_BOUNDS = 48


def epoch_probes(con, rows: str) -> float:
    """How many bounds of its pid a row of ``rows`` meets on average (the most bounds of one pid, when no pid
    has more than ``RANGE_JOIN_MAX_BOUNDS``: then the rows need not be read)."""
    most = con.execute("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM bounds GROUP BY pid)").fetchone()[0]
    if most <= RANGE_JOIN_MAX_BOUNDS:
        return float(most)
    return float(con.execute(f"""
        WITH n AS (SELECT pid, count(*) AS n FROM bounds GROUP BY pid)
        SELECT coalesce(sum(n.n) / count(*), 0) FROM {rows} s LEFT JOIN n ON n.pid = s.pid""").fetchone()[0])


def current_at(table: str, start: str, alias: str, by_hash: bool, left: bool = False, tie: str = "") -> str:
    """SQL that joins rows ``s`` (pid, timestamp_ns) to the row ``alias`` of ``table`` (pid, ``start``) current at
    each: the latest start of the row's pid at or before it. ``by_hash``: a hash join on the pid and each
    start's range up to the pid's next start (``tie`` orders equal starts), which sorts no row of ``s`` but
    meets every start of the pid; else an ASOF join, which sorts them all."""
    join = "LEFT JOIN" if left else "JOIN"
    if not by_hash:
        return f"ASOF {join} {table} {alias} ON s.pid = {alias}.pid AND s.timestamp_ns >= {alias}.{start}"
    order = f"{start}, {tie}" if tie else start
    return f"""{join} (SELECT *, lead({start}) OVER (PARTITION BY pid ORDER BY {order}) AS next_start FROM {table}) {alias}
        ON s.pid = {alias}.pid AND s.timestamp_ns >= {alias}.{start}
       AND ({alias}.next_start IS NULL OR s.timestamp_ns < {alias}.next_start)"""


def time_bins(con, rows: str, column: str, bins: int) -> tuple[str, dict[str, int]]:
    """``bins`` equal time bins across the span of ``rows``' ``timestamp_ns``: the SQL of the bin of ``column``, and
    where they lie (``count``, ``t0_ns``, ``span_ns``: bin k starts at t0_ns + k * span_ns / count), as the
    manifest stores it for the report."""
    lo, width = con.execute("SELECT min(timestamp_ns), greatest(max(timestamp_ns)::HUGEINT - min(timestamp_ns), 1) "
                            f"FROM {rows}").fetchone()
    lo, width = int(lo or 0), int(width or 1)
    # (in BIGINT where the product cannot overflow, as in any trace of less than 200 days: HUGEINT arithmetic
    # over 6 M samples was most of their group-by's time, 0.33-0.49 s against 0.14 s)
    wide = "::HUGEINT" if width * bins >= 1 << 63 else ""
    return (f"least({bins - 1}, ({column} - {lo}){wide} * {bins} // {width})::INTEGER",
            {"count": bins, "t0_ns": lo, "span_ns": width})


#: What the cpu section offers (``Context.offer``) as soon as its sample units are resolved, and query_cpu takes
#: (``Context.take``): its units are units of the same samples (:func:`adopt_units`).
SAMPLE_UNITS = "resolved sample units"


def assign_units(con, ctx, source: str, name: str, per_row: bool = True, bin_sql: str | None = None,
                 resolved: Callable[[], dict[str, pa.Table] | None] | None = None) -> None:
    """``{name}``: rows of ``source`` (pid, stack_id, ip, timestamp_ns, ...) plus process_key and unit_id;
    ``{name}_units``: one row per unit (unit_id, pid, stack_id, ip, epoch, t); their frames resolved
    (:func:`resolve_units`), or taken from ``resolved()`` where that holds every unit (:func:`adopt_units`).

    Without ``per_row`` (a section that only counts its rows, as the cpu section counts samples), ``{name}``
    has one row per unit instead (unit_id, pid, stack_id, ip, epoch, process_key, t) with ``n``, its number of rows:
    the rows are counted as they are joined to their epochs, never stored one by one (6 M samples of the 1 GB
    synth trace: 41,151 units). ``bin_sql`` (with ``per_row=False``), an expression over the source's columns,
    splits each unit's row further by its value, as column ``bin`` (a time bin): one row per unit and bin."""
    # One join gives both the process instance and the image epoch: the boundaries of a pid are its process
    # starts and the loads and unloads of images that overlap another of the same instance; at each, the
    # instance then current is looked up once (``BOUNDS_SQL``).
    con.execute(BOUNDS_SQL)
    rows = f"(SELECT * EXCLUDE (pid), coalesce(pid::BIGINT, -1) AS pid FROM {source})"
    epoch_join = current_at("bounds", "t", "e", epoch_probes(con, rows) <= RANGE_JOIN_MAX_BOUNDS, left=True)
    # (dense_rank: the rows of one unit, in several time bins, share its id)
    unit_id = "(dense_rank() OVER (ORDER BY pid, stack_id NULLS FIRST, ip NULLS FIRST, epoch) - 1)::BIGINT AS unit_id"
    if not per_row:
        # (an epoch has one process instance, so the process_key splits no unit)
        con.execute(f"""
            CREATE TABLE {name} AS
            SELECT {unit_id}, * FROM (
                SELECT s.pid, s.stack_id, s.ip, coalesce(e.epoch, 0) AS epoch, e.process_key,
                       {f"{bin_sql} AS bin," if bin_sql else ""}
                       min(s.timestamp_ns) AS t, count(*)::BIGINT AS n
                FROM {rows} s {epoch_join} GROUP BY ALL)""")
        con.execute(f"CREATE TABLE {name}_units AS SELECT unit_id, any_value(pid) AS pid, any_value(stack_id) AS stack_id, "
                    f"any_value(ip) AS ip, any_value(epoch) AS epoch, min(t) AS t FROM {name} GROUP BY unit_id")
        resolve_units(con, ctx, name)
        return
    con.execute(f"""
        CREATE TABLE {name}_raw AS
        SELECT s.*, e.process_key, coalesce(e.epoch, 0) AS epoch
        FROM {rows} s {epoch_join}""")
    con.execute(f"""
        CREATE TABLE {name}_units AS
        SELECT {unit_id}, pid, stack_id, ip, epoch, t
        FROM (SELECT pid, stack_id, ip, epoch, min(timestamp_ns) AS t
              FROM {name}_raw GROUP BY pid, stack_id, ip, epoch)""")
    con.execute(f"""
        CREATE TABLE {name} AS
        SELECT r.* EXCLUDE (epoch), u.unit_id FROM {name}_raw r JOIN {name}_units u
          ON r.pid = u.pid AND r.stack_id IS NOT DISTINCT FROM u.stack_id AND r.ip IS NOT DISTINCT FROM u.ip
         AND r.epoch = u.epoch""")
    con.execute(f"DROP TABLE {name}_raw")
    if resolved is None or not adopt_units(con, name, resolved()):
        resolve_units(con, ctx, name)


def export_units(con, name: str) -> dict[str, pa.Table]:
    """The resolved units ``name`` of this connection as Arrow tables, for :func:`adopt_units` in another."""
    return {"units": con.sql(f"SELECT unit_id, pid, stack_id, ip, epoch FROM {name}_units").to_arrow_table(),
            "funcs": con.sql(f"SELECT * FROM {name}_funcs").to_arrow_table(),
            "stacks": con.sql(f"SELECT * FROM {name}_stacks").to_arrow_table()}


def adopt_units(con, name: str, resolved: dict[str, pa.Table] | None) -> bool:
    """``{name}_funcs`` and ``{name}_stacks`` of the units in ``{name}_units`` from another section's resolved
    units (:func:`export_units`) of the same events, without resolving them again: a unit is (pid, stack, ip,
    epoch), and within an epoch any time of a unit resolves to the same frames, so a unit of some of the events
    resolves as the unit of all of them with the same key does. Whether every unit was found there (if not,
    nothing is made: the caller resolves them itself)."""
    if resolved is None:
        return False
    for part in ("units", "funcs", "stacks"):
        con.register(f"{name}_adopted_{part}", resolved[part])
    try:
        con.execute(f"""
            CREATE TEMP TABLE {name}_adopted AS
            SELECT u.unit_id, r.unit_id AS rid FROM {name}_units u LEFT JOIN {name}_adopted_units r
              ON r.pid = u.pid AND r.stack_id IS NOT DISTINCT FROM u.stack_id AND r.ip IS NOT DISTINCT FROM u.ip
             AND r.epoch = u.epoch""")
        if con.execute(f"SELECT count(*) FROM {name}_adopted WHERE rid IS NULL").fetchone()[0]:
            return False
        con.execute(f"""CREATE TABLE {name}_funcs AS SELECT a.unit_id, f.* EXCLUDE (unit_id)
                        FROM {name}_adopted a JOIN {name}_adopted_funcs f ON f.unit_id = a.rid""")
        con.execute(f"""CREATE TABLE {name}_stacks AS SELECT a.unit_id, s.* EXCLUDE (unit_id)
                        FROM {name}_adopted a JOIN {name}_adopted_stacks s ON s.unit_id = a.rid""")
        return True
    finally:
        con.execute(f"DROP TABLE IF EXISTS {name}_adopted")
        for part in ("units", "funcs", "stacks"):
            con.unregister(f"{name}_adopted_{part}")


def resolve_units(con, ctx, name: str) -> None:
    """``{name}_funcs``: (unit_id, pos, inline_depth, module, function, raw_name, crate, label), one row per
    frame and inline level; ``{name}_stacks``: (unit_id, folded root-first 'module!function;...', leaf_*)."""
    # (the frame positions come from decoded/ alone: made before waiting for symbolize, ``has_frames``)
    con.execute(f"""
        CREATE TEMP TABLE {name}_pos AS
        WITH f AS (
            SELECT u.unit_id, u.pid, u.t,
                   coalesce(s.frames, CASE WHEN coalesce(u.ip, 0) = 0 THEN []::UBIGINT[] ELSE [u.ip::UBIGINT] END) AS frames
            FROM {name}_units u LEFT JOIN stacks s ON s.stack_id = u.stack_id)
        SELECT unit_id, pid, t, unnest(frames) AS address, unnest(range(len(frames)))::INTEGER AS pos FROM f""")
    if has_frames(ctx):
        from pipeline.runs import table_path

        con.execute(f"CREATE OR REPLACE VIEW frames AS SELECT * FROM "
                    f"read_parquet({sql_path(parquet_glob(table_path(ctx.run_dir, SYMBOLIZED, FRAMES)))})")
        if "leaf" not in {r[0] for r in con.execute("DESCRIBE frames").fetchall()}:
            # (a frames table of an older bootprof: one row per (pid, address), whatever its role)
            con.execute("CREATE OR REPLACE VIEW frames AS SELECT *, NULL::BOOLEAN AS leaf FROM "
                        f"read_parquet({sql_path(parquet_glob(table_path(ctx.run_dir, SYMBOLIZED, FRAMES)))})")
    else:  # not symbolized: every frame stays an address
        con.execute("""CREATE OR REPLACE VIEW frames AS SELECT NULL::UBIGINT AS address, NULL::UINTEGER AS pid,
            NULL::BOOLEAN AS leaf, NULL::VARCHAR AS module, NULL::VARCHAR AS function, NULL::VARCHAR AS raw_name,
            NULL::USMALLINT AS inline_depth, NULL::BIGINT AS image_load_ns, NULL::BIGINT AS image_unload_ns
            WHERE false""")
    # (a position whose (pid, address, role) has a frame of one image only, as most have, needs no choice: the
    # window that chooses among several sorts only the positions that have them)
    con.execute(f"""
        CREATE TEMP TABLE {name}_pick AS
        WITH j AS (
            SELECT p.unit_id, p.pos, p.pid, p.address, p.t, i.pid AS fpid, i.image_load_ns, i.image_unload_ns, i.n
            FROM {name}_pos p LEFT JOIN (
                SELECT *, count(*) OVER (PARTITION BY pid, address, leaf) AS n
                FROM (SELECT DISTINCT pid::BIGINT AS pid, address, leaf, image_load_ns, image_unload_ns FROM frames)) i
              ON i.pid = p.pid AND i.address = p.address AND coalesce(i.leaf, p.pos = 0) = (p.pos = 0))
        SELECT unit_id, pos, pid, address, t, fpid, image_load_ns FROM j WHERE coalesce(n, 1) = 1
        UNION ALL
        SELECT unit_id, pos, pid, address, t, fpid, image_load_ns FROM j WHERE n > 1
        QUALIFY row_number() OVER (PARTITION BY unit_id, pos ORDER BY
            (coalesce(image_load_ns, {MIN_NS}) <= t AND t <= coalesce(image_unload_ns, {MAX_NS})) DESC,
            image_load_ns DESC NULLS LAST) = 1""")
    # Addresses symbolize never saw (or every address, without a symbolized/ output) still get their
    # image: the image of the pid (or of the kernel, pid 0) whose range held the address at the unit's
    # time (else the latest loaded there), named module+0xrva.
    con.execute(f"""
        CREATE TEMP TABLE {name}_img AS
        WITH k AS (SELECT DISTINCT pid, address, t FROM {name}_pick WHERE fpid IS NULL),
             im AS (SELECT pid::BIGINT AS pid, base, size, regexp_extract(file_name, '[^\\\\/]+$') AS module,
                           coalesce(load_ns, {MIN_NS}) AS load_ns, coalesce(unload_ns, {MAX_NS}) AS unload_ns
                    FROM images),
             hits AS (SELECT k.*, im.module, k.address - im.base AS rva, im.load_ns, im.unload_ns, 1 AS own
                      FROM k JOIN im ON im.pid = k.pid AND k.address >= im.base AND k.address < im.base + im.size
                      UNION ALL
                      SELECT k.*, im.module, k.address - im.base, im.load_ns, im.unload_ns, 0
                      FROM k JOIN (SELECT * FROM im WHERE pid = 0) im
                        ON k.address >= im.base AND k.address < im.base + im.size)
        SELECT pid, address, t, module, rva FROM hits
        QUALIFY row_number() OVER (PARTITION BY pid, address, t ORDER BY (load_ns <= t AND t <= unload_ns) DESC,
                                   own DESC, load_ns DESC) = 1""")
    # Crate and label are worked out once per distinct name, not once per frame row (a regular expression per
    # row was most of this query's time).
    con.execute(f"""
        CREATE TABLE {name}_funcs AS
        WITH k AS (SELECT k.unit_id, k.pos, coalesce(f.inline_depth, 0) AS inline_depth, coalesce(f.module, g.module) AS module,
                     coalesce(f.function, CASE WHEN g.module IS NOT NULL THEN printf('%s+0x%x', g.module, g.rva)
                                               ELSE printf('0x%x', k.address) END) AS function, f.raw_name
              FROM {name}_pick k LEFT JOIN frames f
                ON f.pid = k.fpid AND f.address = k.address AND coalesce(f.leaf, k.pos = 0) = (k.pos = 0)
               AND f.image_load_ns IS NOT DISTINCT FROM k.image_load_ns
              LEFT JOIN {name}_img g ON k.fpid IS NULL AND g.pid = k.pid AND g.address = k.address AND g.t = k.t),
        names AS (SELECT module, function, raw_name, {CRATE_SQL} AS crate,
                         CASE WHEN module IS NULL OR function LIKE module || '+0x%' THEN function
                              ELSE module || '!' || function END AS label
                  FROM (SELECT DISTINCT module, function, raw_name FROM k))
        SELECT k.unit_id, k.pos, k.inline_depth, k.module, k.function, k.raw_name, n.crate, n.label
        FROM k JOIN names n ON n.module IS NOT DISTINCT FROM k.module AND n.function = k.function
         AND n.raw_name IS NOT DISTINCT FROM k.raw_name""")
    # Each unit's folded stack: its labels' numbers in order, then the text of each distinct sequence once (the 1 GB
    # synth's 41,151 units have 997 distinct folded stacks of ~1 KB: joining them unit by unit was most of the
    # statement). The leaf as a struct, because arg_max skips NULL arguments (unresolved leaves have no module).
    con.execute(f"""CREATE TEMP TABLE {name}_lid AS
                    SELECT label, (row_number() OVER ())::INTEGER AS lid FROM (SELECT DISTINCT label FROM {name}_funcs)""")
    con.execute(f"""
        CREATE TABLE {name}_stacks AS
        WITH u AS (SELECT f.unit_id, list(l.lid ORDER BY f.pos DESC, f.inline_depth) AS seq,
                          arg_max({{'m': f.module, 'f': f.function, 'r': f.raw_name, 'c': f.crate}},
                                  f.pos * -65536 + f.inline_depth) AS leaf
                   FROM {name}_funcs f JOIN {name}_lid l USING (label) GROUP BY f.unit_id),
        s AS (SELECT x.seq, string_agg(replace(l.label, ';', ':'), ';' ORDER BY x.i) AS folded
              FROM (SELECT seq, unnest(seq) AS lid, unnest(range(len(seq))) AS i FROM (SELECT DISTINCT seq FROM u)) x
              JOIN {name}_lid l USING (lid) GROUP BY x.seq)
        SELECT u.unit_id, s.folded, u.leaf.m AS leaf_module, u.leaf.f AS leaf_function, u.leaf.r AS leaf_raw_name,
               u.leaf.c AS leaf_crate
        FROM u JOIN s USING (seq)""")
    con.execute(f"DROP TABLE {name}_lid")
    con.execute(f"DROP TABLE {name}_pos")
    con.execute(f"DROP TABLE {name}_pick")
    con.execute(f"DROP TABLE {name}_img")


def by_frames(name: str, weights: str, keys: list[str], measures: list[str], carry: str | None = None,
              by: tuple[str, ...] = ()) -> str:
    """SQL: per distinct ``keys`` of the frames (e.g. module, function, raw_name) the ``measures`` of the
    leaf frame ("self_<m>") and of every unit that holds the key at least once ("inclusive_<m>": a
    recursive function counts once per stack). ``weights`` is SQL with unit_id, the measures and the
    columns ``by`` (e.g. a heap snapshot), which split the rows further and come first in them;
    ``carry`` is one more frames column kept with its any_value (e.g. the function's crate)."""
    k = ", ".join(keys)
    self_cols = ", ".join(f"sum(w.{m})::BIGINT AS self_{m}" for m in measures)
    leaf_keys = ", ".join([f"w.{c}" for c in by] + [f"s.leaf_{c} AS {c}" for c in keys])
    extra = f", any_value({carry}) AS {carry}" if carry else ""
    not_null = " AND ".join(f"{c} IS NOT NULL" for c in keys if c != "raw_name" and c != "module")
    on = " AND ".join(f"l.{c} IS NOT DISTINCT FROM i.{c}" for c in (*by, *keys))
    by_w = "".join(f"w.{c}, " for c in by)
    by_p = "".join(f"p.{c}, " for c in by)
    set_cols = ", ".join(f"sum(w.{m}) AS {m}" for m in measures)
    incl_cols = ", ".join(f"sum(p.{m})::BIGINT AS inclusive_{m}" for m in measures)
    # Each distinct key is numbered once (``kid``) and the units' rows are summed by that number: the key's text
    # (module, function, raw name) is not hashed again for every (unit, frame) row of the weights. Units that hold
    # the same keys are summed together first (``sets``: 41,151 units of the 1 GB synth run hold ~1,000 sets of
    # functions), so that a weight's row meets its set once, not each of its keys.
    return f"""
        WITH w AS ({weights}),
        keys AS (SELECT row_number() OVER () AS kid, * FROM (
                     SELECT {k}{extra} FROM {name}_funcs WHERE {not_null or "true"} GROUP BY {k})),
        unit_keys AS (SELECT DISTINCT f.unit_id, keys.kid FROM {name}_funcs f
                      JOIN keys ON {" AND ".join(f"f.{c} IS NOT DISTINCT FROM keys.{c}" for c in keys)}),
        unit_sets AS (SELECT unit_id, list(kid ORDER BY kid) AS ks FROM unit_keys GROUP BY unit_id),
        sets AS (SELECT ks, row_number() OVER () AS set_id FROM (SELECT DISTINCT ks FROM unit_sets)),
        unit_set AS (SELECT u.unit_id, s.set_id FROM unit_sets u JOIN sets s USING (ks)),
        per_set AS (SELECT {by_w}u.set_id, {set_cols} FROM w JOIN unit_set u USING (unit_id) GROUP BY {by_w}u.set_id),
        leaf AS (SELECT {leaf_keys}, {self_cols} FROM w JOIN {name}_stacks s USING (unit_id) GROUP BY ALL),
        incl AS (SELECT x.* EXCLUDE (kid), {", ".join("keys." + c for c in keys)}{", keys." + carry if carry else ""}
                 FROM (SELECT {by_p}k.kid, {incl_cols}
                       FROM per_set p JOIN (SELECT set_id, unnest(ks) AS kid FROM sets) k USING (set_id)
                       GROUP BY {by_p}k.kid) x JOIN keys USING (kid))
        SELECT {", ".join(["i." + c for c in by] + ["i." + c for c in keys])}{", i." + carry if carry else ""},
               {", ".join(f"coalesce(l.self_{m}, 0)::BIGINT AS self_{m}, i.inclusive_{m}" for m in measures)}
        FROM incl i LEFT JOIN leaf l ON {on}"""
