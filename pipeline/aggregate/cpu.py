"""CPU section: sampled profile of an ETL trace -> where the CPU time went.

Applies when ``decoded/`` has ``samples``. Each sample counts once. Per process instance (pid and
start, see :mod:`.resolve`), per compiled crate (``--crate-name`` of the process's command line), per
module, per function and per function crate (first segment of the Rust path); functions, modules
and function crates have *self* samples (the leaf, innermost inlined frame) and *inclusive*
samples (every sample whose stack holds it, counted once per stack even when recursive).
``cpu_folded`` holds the folded stacks (``process;module!function;...``, root first) a flamegraph
is drawn from; the process frame is ``image_name`` or ``image_name crate`` so that instances of
the same program merge. ``cpu_over_time`` counts the samples of each process instance in ``CPU_BINS``
bins of one width across the samples' span (bins without samples have no row): the CPU lanes of the
Chrome trace export and the time bins a report view can be filtered by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.aggregate import queries, resolve
from pipeline.runs import sql_path

if TYPE_CHECKING:
    from pipeline.aggregate.context import Context
    from pipeline.contracts import CpuCounts

SAMPLES = "samples"
UNITS = "cs"   # name of the resolved sample units in the connection

BY_PROCESS = "cpu_by_process"
BY_CRATE = "cpu_by_crate"
BY_MODULE = "cpu_by_module"
BY_FUNCTION = "cpu_by_function"
BY_CODE_CRATE = "cpu_by_code_crate"
FOLDED = "cpu_folded"
OVER_TIME = "cpu_over_time"
FOLDED_OVER_TIME = "cpu_folded_over_time"
FUNCTIONS_OVER_TIME = "cpu_functions_over_time"
MODULES_OVER_TIME = "cpu_modules_over_time"
#: Time bins of cpu_over_time across the span of the samples (one width for every process).
CPU_BINS = 500

#: Frame at the root of each folded stack: the program, plus the compiled crate for rustc; events whose process
#: is not known (no process id, e.g. a sample without a stack in a damaged trace) go under one root of their own.
PROCESS_FRAME_SQL = ("coalesce(nullif(p.image_name, ''), 'pid ' || p.pid, '[unknown process]') "
                     "|| coalesce(' ' || p.crate, '')")


def aggregate(ctx: Context) -> CpuCounts | None:
    if not ctx.has(SAMPLES):
        return None
    con = resolve.connect(ctx, "samples", "stacks", "processes", "images")
    # (one row per unit and time bin with its samples, n: no query here needs the samples one by one)
    bin_sql, bins = resolve.time_bins(con, "samples", "s.timestamp_ns", CPU_BINS)
    resolve.assign_units(con, ctx, "(SELECT pid, stack_id, ip, timestamp_ns FROM samples)", UNITS, per_row=False,
                         bin_sql=bin_sql)
    if ctx.wants(resolve.SAMPLE_UNITS) and ctx.has(queries.EVENTS):     # (query_cpu's samples are among these)
        ctx.offer(resolve.SAMPLE_UNITS, resolve.export_units(con, UNITS))
    weights = f"SELECT unit_id, n AS samples FROM {UNITS}"
    total = con.execute(f"SELECT coalesce(sum(n), 0) FROM {UNITS}").fetchone()[0]

    write = _writer(ctx, con, total)
    write(BY_PROCESS, f"""
        SELECT s.process_key, s.pid, p.parent_pid, p.image_name, p.crate, p.command_line, p.start_ns, p.end_ns,
               sum(s.n)::BIGINT AS samples
        FROM {UNITS} s LEFT JOIN procs p USING (process_key)
        GROUP BY ALL""", "samples DESC, process_key")
    write(BY_CRATE, f"""
        SELECT p.crate, count(DISTINCT s.process_key)::BIGINT AS processes, sum(s.n)::BIGINT AS samples
        FROM {UNITS} s JOIN procs p USING (process_key) WHERE p.crate IS NOT NULL GROUP BY ALL""",
          "samples DESC, crate")
    write(BY_MODULE, resolve.by_frames(UNITS, weights, ["module"], ["samples"]), "self_samples DESC, module")
    write(BY_FUNCTION, resolve.by_frames(UNITS, weights, ["module", "function", "raw_name"], ["samples"], "crate"),
          "self_samples DESC, inclusive_samples DESC, module, function, raw_name")
    write(BY_CODE_CRATE, resolve.by_frames(UNITS, weights, ["crate"], ["samples"]), "self_samples DESC, crate")
    con.execute(_FOLDED_NAMES)
    write(FOLDED, f"SELECT n.stack, x.samples, x.sid FROM ({_folded_sql(binned=False)}) x JOIN ({_STACK_NAMES}) n USING (sid)",
          "sid", hidden=("sid",))
    _over_time(ctx, con, bins["t0_ns"], bins["span_ns"])
    _folded_over_time(ctx, con, total)
    binned = f"SELECT unit_id, bin, n AS samples FROM {UNITS}"
    write(FUNCTIONS_OVER_TIME, resolve.by_frames(UNITS, binned, ["module", "function", "raw_name"], ["samples"],
                                                 by=("bin",)), "bin, module, function, raw_name", with_pct=False)
    write(MODULES_OVER_TIME, resolve.by_frames(UNITS, binned, ["module"], ["samples"], by=("bin",)), "bin, module", with_pct=False)
    with_stack, resolved = con.execute(f"""
        SELECT coalesce(sum(n) FILTER (stack_id IS NOT NULL), 0),
               coalesce(sum(n) FILTER (unit_id IN (SELECT unit_id FROM {UNITS}_funcs WHERE module IS NOT NULL AND pos = 0)), 0)
        FROM {UNITS}""").fetchone()
    return {"samples": int(total), "samples_with_stack": int(with_stack), "samples_leaf_in_image": int(resolved),
            "processes": int(con.execute(f"SELECT count(DISTINCT process_key) FROM {UNITS}").fetchone()[0]),
            "units": int(con.execute(f"SELECT count(*) FROM {UNITS}_units").fetchone()[0]),
            "symbolized": resolve.has_frames(ctx),
            "time_bins": bins}


#: ``{UNITS}_folded``: the folded stack of each (process instance, unit) that has samples, once, with ``sid``, its
#: rank among the distinct folded stacks. The folded tables sum their rows by ``sid`` and are ordered by it: their
#: strings (~1 KB each on the 1 GB synth trace) are neither hashed nor compared per row of ``{UNITS}`` (565,580
#: rows there for ``cpu_folded_over_time``'s 540,895).
_FOLDED_NAMES = f"""
    CREATE TEMP TABLE {UNITS}_folded AS
    SELECT *, dense_rank() OVER (ORDER BY stack) AS sid FROM (
        SELECT k.process_key, k.unit_id, {PROCESS_FRAME_SQL} || coalesce(';' || st.folded, '') AS stack
        FROM (SELECT DISTINCT process_key, unit_id FROM {UNITS}) k
        LEFT JOIN procs p USING (process_key) LEFT JOIN {UNITS}_stacks st USING (unit_id))"""


#: Each ``sid``'s folded stack, once.
_STACK_NAMES = f"SELECT sid, any_value(stack) AS stack FROM {UNITS}_folded GROUP BY sid"


def _folded_sql(binned: bool) -> str:
    """Samples per folded stack (and time bin), by the stack's ``sid`` (``_FOLDED_NAMES``; its text:
    ``_STACK_NAMES``)."""
    b = "bin, " if binned else ""
    return f"""
        SELECT {b}f.sid, sum(s.n)::BIGINT AS samples
        FROM {UNITS} s JOIN {UNITS}_folded f ON f.unit_id = s.unit_id AND f.process_key IS NOT DISTINCT FROM s.process_key
        GROUP BY ALL"""


#: What parquet's dictionary page of ``cpu_folded_over_time``'s stacks may hold; beyond it (more distinct stacks
#: than the 1 GB synth trace's 38,919, ~39 MB), the writer falls back to plain pages for the rest.
FOLDED_DICTIONARY_BYTES = 64 << 20


def _folded_over_time(ctx, con, total: int) -> None:
    """``cpu_folded_over_time``: the rows of ``_folded_sql(binned=True)`` in (bin, stack) order with ``pct`` of the
    ``total`` samples, as ``_writer`` writes the other tables; the stacks written
    as parquet's dictionary straight from the distinct folded stacks (``{UNITS}_folded``), so that each stack's
    text is written once (DuckDB's COPY hashes it again for every row it is on); the same rows and values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = con.execute(f"SELECT bin, sid, samples, {_pct_sql('samples', total)} AS pct "
                       f"FROM ({_folded_sql(binned=True)})").fetchnumpy()
    names = con.sql(_STACK_NAMES).to_arrow_table()
    order = np.lexsort((rows["sid"], rows["bin"]))        # (a stack's sid is its rank by text)
    sid = names.column("sid").to_numpy()
    at = np.zeros(int(sid.max(initial=0)) + 1, np.int32)
    at[sid] = np.arange(len(sid), dtype=np.int32)
    schema = pa.schema([pa.field("bin", pa.int32(), nullable=False), ("stack", pa.dictionary(pa.int32(), pa.string())),
                        ("samples", pa.int64()), ("pct", pa.float64())])
    table = pa.table([rows["bin"][order].astype(np.int32),
                      pa.DictionaryArray.from_arrays(at[rows["sid"][order]], names.column("stack").combine_chunks()),
                      rows["samples"][order].astype(np.int64), rows["pct"][order].astype(np.float64)], schema=schema)
    pq.write_table(table, ctx.out.table_path(FOLDED_OVER_TIME), compression="zstd",
                   dictionary_pagesize_limit=FOLDED_DICTIONARY_BYTES, store_schema=False)


def _over_time(ctx, con, lo: int, width: int) -> None:
    """``cpu_over_time``: samples per process instance and time bin (the bins of the units)."""
    con.execute(f"""COPY (
        SELECT s.process_key, p.pid, p.image_name, p.crate, s.bin,
               ({lo} + s.bin * {width}::HUGEINT // {CPU_BINS})::BIGINT AS t_ns, ({width} // {CPU_BINS})::BIGINT AS bin_ns,
               sum(s.n)::BIGINT AS samples
        FROM {UNITS} s LEFT JOIN procs p ON p.process_key = s.process_key
        GROUP BY s.process_key, p.pid, p.image_name, p.crate, s.bin
        ORDER BY process_key NULLS LAST, bin) TO {sql_path(ctx.out.table_path(OVER_TIME))} (FORMAT parquet, COMPRESSION zstd)""")


def _pct_sql(measure: str, total: int) -> str:
    """SQL: ``measure`` as a percentage of ``total``, to 3 decimals."""
    return f"round(100.0 * {measure} / {max(total, 1)}, 3)"


def _writer(ctx, con, total: int):
    """write(table, sql, order): the query's rows in ``order`` plus ``pct`` of all samples (unless not
    ``with_pct``), as parquet, without its ``hidden`` columns (which ``order`` may use)."""
    def write(table: str, sql: str, order: str, with_pct: bool = True, hidden: tuple[str, ...] = ()) -> None:
        columns = [d[0] for d in con.execute(f"SELECT * FROM ({sql}) LIMIT 0").description]
        measure = "self_samples" if "self_samples" in columns else "samples"
        pct = f", {_pct_sql(measure, total)} AS pct" if with_pct else ""
        exclude = f" EXCLUDE ({', '.join(hidden)})" if hidden else ""
        con.execute(f"""COPY (SELECT *{exclude}{pct} FROM ({sql})
                        ORDER BY {order}) TO {sql_path(ctx.out.table_path(table))} (FORMAT parquet, COMPRESSION zstd)""")
    return write
