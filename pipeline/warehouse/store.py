"""The warehouse file: its tables, the metrics runs are compared by and the views over them (``schema.md``), a
connection that waits for another process's lock and upgrades an older file, and its upkeep (:func:`prune`)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

from pipeline.errors import InputError, is_interrupt
from pipeline.warehouse import comparison, journal


#: Aggregated tables that only the report draws from, kept out of the warehouse: the splits by time bin are up to
#: 500 (200) times the rows of the whole-build tables (``cpu_folded``, ``cpu_by_function``, ...), which it has.
NOT_INGESTED = {"cpu_folded_over_time", "commit_folded_over_time", "cpu_functions_over_time",
                "cpu_modules_over_time", "cpu_by_query_over_time"}


RUNS_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, job VARCHAR, workload VARCHAR, run_dir VARCHAR, run_time TIMESTAMP, trace_start_utc TIMESTAMP,
    trace_sha256 VARCHAR, trace_files INTEGER, trace_bytes BIGINT, labels MAP(VARCHAR, VARCHAR),
    stages VARCHAR[], project_version VARCHAR, ingested_utc TIMESTAMP,
    cpu_samples BIGINT, commit_bytes BIGINT, query_total_ns BIGINT, peak_commit_bytes BIGINT);
CREATE TABLE IF NOT EXISTS stage_manifests (
    run_id VARCHAR, stage VARCHAR, created_utc TIMESTAMP, elapsed_s DOUBLE, schema_version INTEGER,
    project_version VARCHAR, config_hash VARCHAR, manifest JSON);
CREATE TABLE IF NOT EXISTS table_rows (run_id VARCHAR, stage VARCHAR, table_name VARCHAR, row_count BIGINT);
CREATE TABLE IF NOT EXISTS run_metrics (run_id VARCHAR, kind VARCHAR, key VARCHAR, value DOUBLE, n DOUBLE);
"""


#: Aggregated tables the metrics read, with the columns they need: created empty up front so the metrics and
#: views work before the first run that has them (more columns are added as tables are ingested).
BASE_TABLES = {
    "cpu_by_function": "module VARCHAR, function VARCHAR, raw_name VARCHAR, crate VARCHAR, self_samples BIGINT, "
                       "inclusive_samples BIGINT",
    "cpu_by_process": "pid BIGINT, image_name VARCHAR, crate VARCHAR, samples BIGINT",
    "cpu_by_crate": "crate VARCHAR, processes BIGINT, samples BIGINT",
    "commit_by_function": "module VARCHAR, function VARCHAR, raw_name VARCHAR, inclusive_commit_bytes BIGINT",
    "commit_by_process": "pid BIGINT, image_name VARCHAR, crate VARCHAR, commit_bytes BIGINT, peak_commit_bytes BIGINT",
    "commit_by_crate": "crate VARCHAR, commit_bytes BIGINT, peak_commit_bytes BIGINT",
    "commit_by_stack": "stack_id BIGINT, folded VARCHAR, commit_bytes BIGINT, outstanding_bytes BIGINT",
    "process_tree": "pid BIGINT, crate VARCHAR, start_ns BIGINT, end_ns BIGINT, duration_ns BIGINT",
    "query_summary": "scope VARCHAR, file_id INTEGER, crate VARCHAR, label VARCHAR, self_ns BIGINT, time_ns BIGINT, "
                     "invocations BIGINT",
    "query_totals": "scope VARCHAR, file_id INTEGER, crate VARCHAR, total_ns BIGINT",
    "self_profile_processes": "crate VARCHAR, wall_start_ns BIGINT, wall_end_ns BIGINT",
}


_FN = "coalesce(module || '!', '') || function"


_BUILD_CPU = "(SELECT sum(samples) FROM cpu_by_process WHERE run_id = $1 AND coalesce(pid, -1) <> 0)"


_HAS_TREE = "EXISTS (SELECT 1 FROM process_tree WHERE run_id = $1 AND crate IS NOT NULL)"


#: kind -> SQL of one run ($1) giving (key, value, n): n is the total a share is of (NULL for the others). Written
#: into ``run_metrics`` when a run is ingested; what each kind is (its test, family, vote) is in
#: ``significance.KINDS``.
METRICS = {
    "build_wall_ns": f"""SELECT 'build', CASE WHEN {_HAS_TREE}
        THEN (SELECT max(end_ns) - min(start_ns) FROM process_tree WHERE run_id = $1 AND crate IS NOT NULL)
        ELSE (SELECT max(wall_end_ns) - min(wall_start_ns) FROM self_profile_processes WHERE run_id = $1) END, NULL""",
    "cpu_build": f"SELECT 'build', {_BUILD_CPU}, NULL",
    "peak_commit_build": "SELECT 'build', peak_commit_bytes, NULL FROM runs WHERE run_id = $1",
    "commit_build": "SELECT 'build', commit_bytes, NULL FROM runs WHERE run_id = $1",
    "query_build_ns": "SELECT 'build', query_total_ns, NULL FROM runs WHERE run_id = $1",
    "crate_wall_ns": f"""SELECT crate, sum(duration_ns), NULL FROM process_tree
                      WHERE run_id = $1 AND crate IS NOT NULL GROUP BY crate
                      UNION ALL SELECT crate, sum(wall_end_ns - wall_start_ns), NULL FROM self_profile_processes
                      WHERE run_id = $1 AND crate IS NOT NULL AND NOT {_HAS_TREE} GROUP BY crate""",
    "cpu_crate": "SELECT crate, sum(samples), NULL FROM cpu_by_crate WHERE run_id = $1 GROUP BY ALL",
    "cpu_function_self": f"SELECT {_FN}, sum(self_samples), NULL FROM cpu_by_function WHERE run_id = $1 "
        "GROUP BY ALL",
    "cpu_function_inclusive": f"SELECT {_FN}, sum(inclusive_samples), NULL FROM cpu_by_function "
        "WHERE run_id = $1 GROUP BY ALL",
    "cpu_function_self_share": f"""SELECT k, v / n, n FROM (SELECT {_FN} AS k, sum(self_samples) AS v
        FROM cpu_by_function WHERE run_id = $1 GROUP BY ALL), (SELECT {_BUILD_CPU} AS n) WHERE n > 0""",
    "cpu_function_inclusive_share": f"""SELECT k, v / n, n FROM (SELECT {_FN} AS k, sum(inclusive_samples)
        AS v FROM cpu_by_function WHERE run_id = $1 GROUP BY ALL), (SELECT {_BUILD_CPU} AS n) WHERE n > 0""",
    "query_self_ns": "SELECT label, sum(self_ns), NULL FROM query_summary WHERE run_id = $1 AND scope = 'build' "
        "GROUP BY ALL",
    "query_count": "SELECT label, sum(invocations), NULL FROM query_summary WHERE run_id = $1 "
        "AND scope = 'build' GROUP BY ALL",
    "query_crate_ns": "SELECT crate, sum(total_ns), NULL FROM query_totals WHERE run_id = $1 AND scope = 'crate' "
        "GROUP BY ALL",
    "commit_function": f"SELECT {_FN}, sum(inclusive_commit_bytes), NULL FROM commit_by_function "
        "WHERE run_id = $1 GROUP BY ALL",
    "commit_crate": "SELECT crate, sum(commit_bytes), NULL FROM commit_by_crate WHERE run_id = $1 GROUP BY ALL",
    "peak_commit": "SELECT coalesce(crate, image_name, '?'), max(peak_commit_bytes), NULL FROM commit_by_process "
        "WHERE run_id = $1 GROUP BY ALL",
}


VIEWS = {
    "metrics": "SELECT run_id, kind, key, value FROM run_metrics",
    "run_baselines": """SELECT run_id, job, workload, run_time,
        lag(run_id) OVER (PARTITION BY job, workload ORDER BY run_time, run_id) AS baseline_run_id FROM runs""",
    "comparisons": "SELECT v.*, r.run_time, r.job, r.workload FROM verdicts v JOIN runs r USING (run_id)",
    "regressions": "SELECT * FROM comparisons WHERE verdict = 'regression'",
}


#: DuckDB storage format the warehouse file is written in: readable by every DuckDB from 1.0 on (the newest
#: CLI on PyPI, 1.5, could not open a file written by DuckDB 2.0's default format).
STORAGE_COMPATIBILITY = "v1.0.0"


#: How often a connection blocked by another process's lock is tried again.
LOCK_RETRY_S = 0.2


def lock_path(db: Path) -> Path:
    """The writers' lock beside a warehouse file (:func:`writing`)."""
    return Path(str(Path(db).expanduser()) + ".lock")


def _waiting(path: Path, lock_timeout_s: float) -> None:
    import logging

    logging.getLogger("bootprof").warning("%s: locked by another process; waiting for it (up to %g s, "
                                          "warehouse.lock_timeout_s)", path, lock_timeout_s)


def _locked(path: Path, lock_timeout_s: float, holder: str) -> InputError:
    return InputError(f"{path}: the warehouse is locked by another process for more than {lock_timeout_s:g} s "
                      f"(warehouse.lock_timeout_s): {holder}")


@contextlib.contextmanager
def writing(path: Path, lock_timeout_s: float = 300.0) -> Iterator[None]:
    """One bootprof command writes a warehouse at a time: an ingest, a prune, or a rebuild for its whole length (an
    ingest that went into the file a rebuild was replacing was lost with it). A lock file beside the warehouse
    (:func:`lock_path`, filelock's: the same on every system), waited for up to ``lock_timeout_s``."""
    from filelock import FileLock, Timeout

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path(path)))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _waiting(path, lock_timeout_s)
        try:
            lock.acquire(timeout=lock_timeout_s)
        except Timeout:
            raise _locked(path, lock_timeout_s, "another bootprof command writes it") from None
    try:
        yield
    finally:
        lock.release()


def held_elsewhere(message: str) -> bool:
    """Whether DuckDB's error on opening a file says another process holds it: "Could not set lock on file ...
    Conflicting lock is held in ..." on POSIX; on Windows, which locks the whole file, the system's sharing violation,
    "The process cannot access the file because it is being used by another process"."""
    text = " ".join(message.split()).lower()
    # (not the word "lock" alone: a damaged file's "... in block at location ..." holds it)
    return any(words in text for words in ("could not set lock", "conflicting lock", "being used by another process"))


def connect(path: Path, read_only: bool = False, lock_timeout_s: float = 300.0):
    """Open (creating if needed) the warehouse file with its tables, views and macros in place.

    DuckDB lets one process write a file at a time: a connection that finds the file locked by another
    process (an ingest beside another) waits, trying again every LOCK_RETRY_S, up to ``lock_timeout_s``,
    then fails with a clear error. A read-only connection also has no access to files or the network, so a
    query cannot read or write anything but the warehouse (no COPY, no read_csv)."""
    import duckdb

    path = Path(path).expanduser()
    if read_only and not path.exists():
        raise InputError(f"{path}: no warehouse here (ingest a run first: bootprof warehouse ingest --run RUN_DIR)")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    config = ({"enable_external_access": False} if read_only
              else {"storage_compatibility_version": STORAGE_COMPATIBILITY})
    deadline = time.monotonic() + lock_timeout_s
    waited = False
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
            break
        except duckdb.IOException as exc:
            if not held_elsewhere(str(exc)):
                raise InputError(f"{path}: cannot open the warehouse: {' '.join(str(exc).split())[:300]}"
                                 f"{journal.damage_hint(path)}") from None
            if time.monotonic() >= deadline:
                raise _locked(path, lock_timeout_s, " ".join(str(exc).split())) from None
            if not waited:
                waited = True
                _waiting(path, lock_timeout_s)
            time.sleep(LOCK_RETRY_S)
        except duckdb.Error as exc:
            raise InputError(f"{path}: cannot open the warehouse: {' '.join(str(exc).split())[:300]}"
                             f"{journal.damage_hint(path)}") from None
    try:
        _prepare(con, read_only)
    except duckdb.Error as exc:
        con.close()
        if is_interrupt(exc):
            raise
        raise InputError(f"{path}: damaged: {' '.join(str(exc).split())[:300]}{journal.damage_hint(path)}") from None
    return con


def _prepare(con, read_only: bool) -> None:
    """Tables, views and macros in place (a read-only connection: only its settings locked)."""
    if read_only:
        con.execute("SET lock_configuration = true")
        return
    con.execute(RUNS_DDL)
    older = "workload" not in {r[0] for r in con.execute("DESCRIBE runs").fetchall()}
    for column in ("workload VARCHAR", "peak_commit_bytes BIGINT"):            # (warehouses of older versions)
        con.execute(f"ALTER TABLE runs ADD COLUMN IF NOT EXISTS {column}")
    for table, cols in BASE_TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} (run_id VARCHAR, {cols})")
        for column in cols.split(", "):           # (a table made by an older bootprof lacks newer columns)
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}")
    judged = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'verdicts'").fetchone()[0]
    con.execute(comparison.VERDICTS_DDL)
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
    con.execute("DROP MACRO TABLE IF EXISTS compare_runs")     # (an older bootprof's: verdicts are in the table now)
    if older:
        _upgrade(con)
    if not judged:
        comparison.write_verdicts(con, [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()])


def _upgrade(con) -> None:
    """Runs ingested by an older bootprof get what newer ones have: a workload, and their metrics (from their
    detail tables, while those are there)."""
    for (run_id, sha) in con.execute("SELECT run_id, trace_sha256 FROM runs WHERE workload IS NULL").fetchall():
        con.execute("UPDATE runs SET workload = ? WHERE run_id = ?", [workload_of(con, run_id, [], sha), run_id])
    for (run_id,) in con.execute("SELECT run_id FROM runs WHERE run_id NOT IN (SELECT DISTINCT run_id FROM run_metrics)"
                                 ).fetchall():
        write_metrics(con, run_id)


def write_metrics(con, run_id: str) -> None:
    for kind, sql in METRICS.items():
        con.execute(f"""INSERT INTO run_metrics SELECT $1, '{kind}', key, value, n
                        FROM ({sql}) AS t(key, value, n) WHERE value IS NOT NULL AND key IS NOT NULL""", [run_id])


def workload_of(con, run_id: str, inputs: list[dict], trace_sha: str | None) -> str:
    """What a run built, when no ``workload`` label says it: the crates its rustc processes compiled (ETL
    ``cpu_by_crate``, self-profile ``query_totals``), as ``build of N crates #<hash of their names>``; a run
    that compiled no crate is its trace, ``trace <file name> #<sha256>``. Runs compare only within a workload,
    so a .NET trace and a kernel trace filed under one job never meet."""
    import hashlib

    crates = [r[0] for r in con.execute("""
        SELECT DISTINCT crate FROM (SELECT crate FROM cpu_by_crate WHERE run_id = $1
                                    UNION ALL SELECT crate FROM query_totals WHERE run_id = $1 AND scope = 'crate')
        WHERE crate IS NOT NULL ORDER BY crate""", [run_id]).fetchall()]
    if crates:
        return f"build of {len(crates)} crates #{hashlib.sha256(chr(10).join(crates).encode()).hexdigest()[:10]}"
    name = Path(inputs[0]["path"]).name if len(inputs) == 1 and inputs[0].get("path") else f"{len(inputs)} files"
    return f"trace {name} #{(trace_sha or 'unknown')[:10]}"


def rollback(con) -> None:
    """Roll the transaction back; one that cannot be (the failure that ended it, a full disk, ended it too) is left
    to DuckDB, which drops it with the connection: the first error is the one to tell."""
    import duckdb

    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


#: Tables that summarize a run and survive ``prune``: what compare and the history need, and the manifests.
SUMMARY_TABLES = ("runs", "run_metrics", "verdicts", "stage_manifests", "table_rows")


def prune(db: Path, keep: int, lock_timeout_s: float = 300.0) -> dict[str, int]:
    """Retention: of each job and workload, the newest ``keep`` runs keep their detail (the aggregated tables);
    older runs keep only their summary (``SUMMARY_TABLES``), so their metrics still count as history and
    compare as baselines. Returns the runs pruned and the rows deleted."""
    with writing(db, lock_timeout_s):
        return _prune(db, keep, lock_timeout_s)


def _prune(db: Path, keep: int, lock_timeout_s: float) -> dict[str, int]:
    con = connect(db, lock_timeout_s=lock_timeout_s)
    try:
        con.execute("BEGIN TRANSACTION")
        old = [r[0] for r in con.execute("""SELECT run_id FROM (
            SELECT run_id, row_number() OVER (PARTITION BY job, workload ORDER BY run_time DESC, run_id DESC) AS k
            FROM runs) WHERE k > ? ORDER BY run_id""", [keep]).fetchall()]
        deleted = drop_detail(con, old)
        runs = len(old)
        from pipeline.portable import signals_held

        with signals_held():    # (the prune and its journal line, which a rebuild reads to prune again)
            con.execute("COMMIT")
            if old:
                journal.record_prune(db, old)
        con.execute("CHECKPOINT")
    except BaseException:
        rollback(con)
        raise
    finally:
        con.close()
    return {"runs_pruned": int(runs), "rows_deleted": int(deleted)}


def drop_detail(con, run_ids: list[str]) -> int:
    """Delete the detail (every table but ``SUMMARY_TABLES``) of ``run_ids``; the rows deleted."""
    if not run_ids:
        return 0
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
    ).fetchall() if r[0] not in SUMMARY_TABLES]
    return sum(con.execute(f'DELETE FROM "{table}" WHERE run_id IN (SELECT unnest(?::VARCHAR[]))', [run_ids]).fetchone()[0]
               for table in tables)


def run_id_of(con, ref: str) -> str:
    """A run id, or a run directory's path -> its run id; must be in the warehouse."""
    name = Path(ref).name if "/" in ref else ref
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [name]).fetchone() is None:
        raise InputError(f"run '{name}' is not in the warehouse (ingest it: bootprof warehouse ingest --run RUN_DIR)")
    return name
