"""Warehouse stage: every run's manifests and aggregated tables in one DuckDB file, for SQL across runs.

Entry point: :func:`run` (the job runner's stage) = :func:`ingest` of one run directory into
``config.warehouse.path``. A run is keyed by its ``run_id`` (the run directory's name); ingesting it
again replaces all of its rows in one transaction, so ingestion is idempotent and a crash leaves
the previous state. Each ``aggregated/<table>.parquet`` becomes rows of the warehouse table of the
same name with ``run_id`` in front (tables and columns are created as they first appear, so new
aggregate sections need no change here). ``runs`` holds one row per run, ``run_metrics`` the numbers runs are
compared by and ``verdicts`` each run's comparison with its baseline (:mod:`.comparison`, :mod:`.significance`),
kept current as runs come in; the views ``metrics``, ``run_baselines``, ``comparisons`` and ``regressions`` answer
"what changed". Every table, view and column is described in ``schema.md``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline import stages
from pipeline.errors import DONE, InputError, ManifestError, is_interrupt
from pipeline.mirror import location
from pipeline.runs import MANIFEST, parquet_glob, read_manifest, sql_path, stage_dir
from pipeline.warehouse import comparison, journal
from pipeline.warehouse.comparison import HEADLINE
from pipeline.stages import DECODED

if TYPE_CHECKING:
    from pipeline.contracts import Comparison, IngestSummary

#: The stage outputs a run's manifests are read from (the comparison's own is no part of the run it judges).
STAGES = tuple(o for o in stages.outputs() if o != stages.COMPARED)
AGGREGATED = stages.AGGREGATED
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
            if "lock" not in str(exc).lower():
                raise InputError(f"{path}: cannot open the warehouse: {' '.join(str(exc).split())[:300]}"
                                 f"{journal.damage_hint(path)}") from None
            if time.monotonic() >= deadline:
                raise InputError(f"{path}: the warehouse is locked by another process for more than "
                                 f"{lock_timeout_s:g} s (warehouse.lock_timeout_s): {' '.join(str(exc).split())}") from None
            if not waited:
                waited = True
                import logging

                logging.getLogger("bootprof").warning("%s: locked by another process; waiting for it (up to %g s, "
                                                      "warehouse.lock_timeout_s)", path, lock_timeout_s)
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
        _write_metrics(con, run_id)


def _write_metrics(con, run_id: str) -> None:
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


def job_of(run_dir: Path) -> str:
    """The job of a run directory named ``<job>-YYYYmmdd-HHMMSS`` (as ``bootprof run`` names them)."""
    m = re.fullmatch(r"(.+)-\d{8}-\d{6}(?:-\d+)?", run_dir.name)
    return m.group(1) if m else run_dir.name


def _manifests(run_dir: Path, stages: tuple[str, ...] = STAGES) -> dict[str, dict]:
    out = {}
    for stage in stages:
        if (stage_dir(run_dir, stage) / MANIFEST).exists():
            out[stage] = read_manifest(run_dir, stage)
    return out


#: Recording times before this (1990-01-01, µs since the Unix epoch) are a damaged header, not a build's time.
PLAUSIBLE_SINCE_US = 631_152_000_000_000


def recorded_us(con, run_dir: Path, trace_start_us: int | None) -> int | None:
    """When the run's build was recorded (µs since the Unix epoch): the ETL trace's start, else the earliest
    self-profile's start; None when neither is known (then the run's decode time stands for it). Runs of a
    job are ordered by it, so traces backfilled later still fall in place among the nights."""
    if trace_start_us is not None and trace_start_us >= PLAUSIBLE_SINCE_US:
        return int(trace_start_us)
    profiles = stage_dir(run_dir, DECODED) / "self_profiles.parquet"
    if profiles.exists():
        first = con.execute("SELECT min(start_time_ns) // 1000 FROM read_parquet($1) WHERE status = 'ok'",
                            [parquet_glob(profiles)]).fetchone()[0]
        if first is not None and first >= PLAUSIBLE_SINCE_US:
            return int(first)
    return None


def holds(db: Path, run_dir: Path, labels: dict[str, str], lock_timeout_s: float = 300.0) -> bool:
    """Whether the warehouse holds ``run_dir`` as it is now: the same directory, labels and stage manifests
    (what ``ingest`` would write again)."""
    run_dir = Path(run_dir).resolve()
    if not Path(db).expanduser().exists():
        return False
    try:
        manifests = _manifests(run_dir)
    except ManifestError:
        return False
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        row = con.execute("SELECT run_dir, labels FROM runs WHERE run_id = ?", [run_dir.name]).fetchone()
        stored = dict(con.execute("SELECT stage, manifest FROM stage_manifests WHERE run_id = ?",
                                  [run_dir.name]).fetchall())
    finally:
        con.close()
    if row is None or row[0] != location(run_dir) or dict(row[1] or {}) != {str(k): str(v) for k, v in labels.items()}:
        return False
    now = {stage: json.loads(json.dumps(m, sort_keys=True, default=str)) for stage, m in manifests.items()}
    return {stage: json.loads(m) for stage, m in stored.items()} == now


def ingest(db: Path, run_dir: Path, labels: dict[str, str] | None = None, job: str | None = None,
           lock_timeout_s: float = 300.0, after: Callable[[], Any] | None = None) -> IngestSummary:
    """Put one run into the warehouse (replacing an earlier ingestion of the same run_id).

    ``after``: the report stage still runs (a job started this beside it, ``stages``); the aggregated tables go
    in meanwhile, and ``after()`` returns once it has ended (or raises its error: nothing is then written), before
    the stages' manifests are read for the ``runs`` and ``stage_manifests`` rows."""
    run_dir = Path(run_dir).resolve()
    # (the report's manifest, when the report still runs, is read once it has ended: the one there now may be an
    # earlier run's, made from other upstream outputs)
    beside = stages.get(stages.get("warehouse").beside).output
    manifests = _manifests(run_dir, STAGES if after is None else tuple(s for s in STAGES if s != beside))
    if AGGREGATED not in manifests:
        raise ManifestError(f"{run_dir}: no finished '{AGGREGATED}' output (run the aggregate stage first)")
    run_id = run_dir.name
    decoded = manifests.get(DECODED, {})
    inputs = decoded.get("inputs") or manifests[AGGREGATED].get("inputs") or []
    # (a run decoded before schema 2 has the plain sha256 of each input)
    shas = sorted(h for i in inputs if (h := i.get("sha256_tree") or i.get("sha256")))
    trace_sha = shas[0] if len(shas) == 1 else (
        __import__("hashlib").sha256("".join(shas).encode()).hexdigest() if shas else None)
    run_time = (decoded or manifests[AGGREGATED])["created_utc"]
    tables = sorted(p for p in stage_dir(run_dir, AGGREGATED).iterdir()
                    if p.name.endswith(".parquet") and p.name[: -len(".parquet")] not in NOT_INGESTED)

    import duckdb

    con = connect(db, lock_timeout_s=lock_timeout_s)
    try:
        con.execute("BEGIN TRANSACTION")
        existing = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
        ).fetchall()}
        for table in existing:
            con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id])
        counts = {}
        for path in tables:
            name = path.name[: -len(".parquet")]
            src = f"read_parquet({sql_path(parquet_glob(path))})"
            if name not in existing:
                con.execute(f'CREATE TABLE "{name}" AS SELECT ?::VARCHAR AS run_id, * FROM {src} LIMIT 0', [run_id])
            have = {r[0] for r in con.execute(f"DESCRIBE \"{name}\"").fetchall()}
            for col, typ, *_ in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall():
                if col not in have:
                    con.execute(f'ALTER TABLE "{name}" ADD COLUMN "{col}" {typ}')
            con.execute(f'INSERT INTO "{name}" BY NAME SELECT ?::VARCHAR AS run_id, * FROM {src}', [run_id])
            counts[name] = con.execute(f'SELECT count(*) FROM "{name}" WHERE run_id = ?', [run_id]).fetchone()[0]
        trace_start = None
        if (stage_dir(run_dir, DECODED) / "trace.parquet").exists():
            trace = parquet_glob(stage_dir(run_dir, DECODED) / "trace.parquet")
            # epoch microseconds: a TIMESTAMPTZ would need pytz on the way through Python
            trace_start = con.execute("SELECT epoch_us(min(start_utc)) FROM read_parquet($1)", [trace]).fetchone()[0]
        recorded = recorded_us(con, run_dir, trace_start)
        if after is not None:
            after()
            manifests = _manifests(run_dir)
        sections = manifests[AGGREGATED].get("sections", {})
        query_total = con.execute("SELECT sum(total_ns) FROM query_totals WHERE run_id = ? AND scope = 'build'",
                                  [run_id]).fetchone()[0]
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        job = job or labels.get("job") or job_of(run_dir)
        con.execute("""INSERT INTO runs (run_id, job, workload, run_dir, run_time, trace_start_utc, trace_sha256, trace_files,
                                         trace_bytes, labels, stages, project_version, ingested_utc, cpu_samples,
                                         commit_bytes, query_total_ns, peak_commit_bytes)
                       VALUES (?, ?, ?, ?, coalesce(make_timestamp(?::BIGINT), ?::TIMESTAMP), make_timestamp(?::BIGINT), ?, ?, ?,
                               MAP(?::VARCHAR[], ?::VARCHAR[]),
                               ?, ?, ?::TIMESTAMP, ?, ?, ?, ?)""", [
            run_id, job,
            labels.get("workload") or workload_of(con, run_id, inputs, trace_sha),
            location(run_dir), recorded, run_time.replace("T", " ").rstrip("Z"), trace_start,
            trace_sha, len(inputs), sum(i.get("size") or 0 for i in inputs),
            list(labels), [labels[k] for k in labels], list(manifests), manifests[AGGREGATED].get("project_version"),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            sections.get("cpu", {}).get("samples"), sections.get("memory", {}).get("commit_bytes"), query_total,
            sections.get("memory", {}).get("peak_commit_bytes")])
        _write_metrics(con, run_id)
        _enough_data(con, run_id, run_dir)
        comparison.write_verdicts(con, [run_id, *comparison.later_runs(con, run_id)])
        for stage, m in manifests.items():
            con.execute("INSERT INTO stage_manifests VALUES (?, ?, ?::TIMESTAMP, ?, ?, ?, ?, ?)", [
                run_id, stage, m["created_utc"].replace("T", " ").rstrip("Z"), m.get("elapsed_s"),
                m.get("schema_version"), m.get("project_version"), m.get("config_hash"),
                json.dumps(m, sort_keys=True, default=str)])
            for table, n in (m.get("tables") or {}).items():
                con.execute("INSERT INTO table_rows VALUES (?, ?, ?, ?)", [run_id, stage, table, n])
        from pipeline.portable import signals_held

        with signals_held():    # (the run and its journal line: a Ctrl-C comes after both, or before both)
            con.execute("COMMIT")
            journal.record(db, run_id, location(run_dir), job, labels)
            DONE.append(f"run {run_id} was committed to {db}")
    except duckdb.Error as exc:
        _rollback(con)
        raise InputError(f"{db}: ingesting {run_dir} failed, nothing of it was written: "
                         f"{' '.join(str(exc).split())}") from None
    except BaseException:
        _rollback(con)
        raise
    finally:
        con.close()
    return {"run_id": run_id, "db": str(db), "tables": len(counts), "rows": sum(counts.values())}


#: A run with fewer metrics than this share of its baseline's lost most of its data (unreadable inputs): it is no
#: night to compare, and is not ingested.
MIN_DATA_SHARE = 0.5


def _enough_data(con, run_id: str, run_dir: Path) -> None:
    """InputError when the run has far fewer crates than the previous run of its job and workload (a build's data is
    its crates; traces of no build are not weighed; inputs that decode to nothing at all stop at the decode)."""
    def counted(run: str) -> tuple[int, int]:
        return con.execute("""SELECT count(DISTINCT key) FILTER (WHERE kind IN ('crate_wall_ns', 'query_crate_ns',
                              'cpu_crate')), count(*) FROM run_metrics WHERE run_id = ?""", [run]).fetchone()

    crates = counted(run_id)[0]
    _, _, before = comparison.history_of(con, run_id)
    if before:
        had = counted(before[-1])[0]
        if crates < MIN_DATA_SHARE * had:
            raise InputError(f"{run_dir}: {crates:,} crates against {had:,} in the run before it ({before[-1]}): most "
                             "of its data is missing (unreadable inputs?); not ingested nor compared")


def _rollback(con) -> None:
    """Roll the transaction back; one that cannot be (the failure that ended it, a full disk, ended it too) is left
    to DuckDB, which drops it with the connection: the first error is the one to tell."""
    import duckdb

    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def compare(db: Path, run: str, baseline: str | None = None, lock_timeout_s: float = 300.0) -> Comparison:
    """``run`` against ``baseline`` (default: the previous run of its job and workload), judged as
    :mod:`.significance` says. Returns ``{run_id, job, workload, baseline_run_id (None: nothing to compare with),
    reason, verdict, headline, families, changes, explanations}``: ``verdict`` the comparison's (``regression``,
    ``suspect``, ``improvement``, ``no change``); ``headline`` the build's metrics; ``families`` one verdict per
    build and crate family, worst first; ``changes`` every other metric, regressions first, then by impact (its
    change as a share of its kind's baseline total); ``explanations``: for each crate family that regressed or is
    suspect, the queries of the crate that grew most. A baseline of another workload is compared (it was asked
    for) and ``reason`` says so."""
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        run_id = _run_id(con, run)
        job, workload, before = comparison.history_of(con, run_id)
        out: Comparison = {"run_id": run_id, "job": job, "workload": workload, "baseline_run_id": None,
                               "reason": None, "verdict": "no change", "headline": [], "families": [], "changes": [],
                               "explanations": {}}
        if baseline is None:
            if not before:
                out["reason"] = f"no earlier run of job '{job}' and workload '{workload}' to compare with"
                return out
            base_id = before[-1]
        else:
            base_id = _run_id(con, baseline)
            other = con.execute("SELECT workload FROM runs WHERE run_id = ?", [base_id]).fetchone()[0]
            if other != workload:
                out["reason"] = f"the baseline is of another workload ('{other}'): differences include the workload's"
        out["baseline_run_id"] = base_id
        rows = comparison.judge(con, run_id, base_id, before)
        fams = comparison.families(rows)
        out["explanations"] = {f["key"]: comparison.explain(con, run_id, base_id, f["key"]) for f in fams
                               if f["family"] == "crate time" and f["verdict"] in ("regression", "suspect")
                               and (f["adjusted_change"] or 0) > 0}
    finally:
        con.close()
    totals: dict[str, float] = {}
    for r in rows:
        totals[r["kind"]] = totals.get(r["kind"], 0.0) + abs(r["baseline_value"])
    for r in rows:
        r["impact"] = abs(r["change"]) / totals[r["kind"]] if totals[r["kind"]] else float(abs(r["change"]) > 0)
    by_kind = {r["kind"]: r for r in rows if r["kind"] in HEADLINE}
    out["headline"] = [by_kind[k] for k in HEADLINE if k in by_kind]
    out["families"] = fams
    out["verdict"] = comparison.overall(fams)
    rank = {"regression": 0, "suspect": 1, "improvement": 2, "noise": 3}
    out["changes"] = sorted((r for r in rows if r["kind"] not in HEADLINE),
                            key=lambda r: (rank[r["verdict"]], -r["impact"], r["kind"], r["key"]))
    return out


#: Tables that summarize a run and survive ``prune``: what compare and the history need, and the manifests.
SUMMARY_TABLES = ("runs", "run_metrics", "verdicts", "stage_manifests", "table_rows")


def prune(db: Path, keep: int, lock_timeout_s: float = 300.0) -> dict[str, int]:
    """Retention: of each job and workload, the newest ``keep`` runs keep their detail (the aggregated tables);
    older runs keep only their summary (``SUMMARY_TABLES``), so their metrics still count as history and
    compare as baselines. Returns the runs pruned and the rows deleted."""
    con = connect(db, lock_timeout_s=lock_timeout_s)
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute("""CREATE TEMP TABLE old AS SELECT run_id FROM (
            SELECT run_id, row_number() OVER (PARTITION BY job, workload ORDER BY run_time DESC, run_id DESC) AS k
            FROM runs) WHERE k > ?""", [keep])
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
        ).fetchall() if r[0] not in SUMMARY_TABLES]
        deleted = 0
        for table in tables:
            deleted += con.execute(f'DELETE FROM "{table}" WHERE run_id IN (SELECT run_id FROM old)').fetchone()[0]
        runs = con.execute("SELECT count(*) FROM old").fetchone()[0]
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
    except BaseException:
        _rollback(con)
        raise
    finally:
        con.close()
    return {"runs_pruned": int(runs), "rows_deleted": int(deleted)}


def folded(db: Path, run_id: str, lock_timeout_s: float = 300.0) -> list[tuple[str, int]]:
    """The folded CPU stacks of one run (``cpu_folded``; empty when the run has none or its detail was pruned)."""
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        if not con.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'cpu_folded'").fetchone():
            return []
        return [(s, int(n)) for s, n in con.execute(
            "SELECT stack, sum(samples) FROM cpu_folded WHERE run_id = ? GROUP BY stack", [run_id]).fetchall()]
    finally:
        con.close()


def _run_id(con, ref: str) -> str:
    """A run id, or a run directory's path -> its run id; must be in the warehouse."""
    name = Path(ref).name if "/" in ref else ref
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [name]).fetchone() is None:
        raise InputError(f"run '{name}' is not in the warehouse (ingest it: bootprof warehouse ingest --run RUN_DIR)")
    return name


def stale_reason(run_dir: Path, config) -> str | None:
    """Why the job must ingest ``run_dir`` again (None: the warehouse holds this version of the run)."""
    same = holds(config.warehouse.path, run_dir, dict(config.warehouse.labels), config.warehouse.lock_timeout_s)
    return None if same else "the warehouse does not hold this version of the run"


def run(run_dir: Path, config, pool, inputs=None, after: Callable[[], Any] | None = None) -> IngestSummary:
    """Job stage: ingest ``run_dir`` into ``config.warehouse.path`` with ``config.warehouse.labels``."""
    return ingest(config.warehouse.path, run_dir, labels=dict(config.warehouse.labels),
                  lock_timeout_s=config.warehouse.lock_timeout_s, after=after)


def headline(summary: IngestSummary) -> str:
    """The stage's line in a job's output."""
    return f"run {summary['run_id']}: {summary['tables']} tables, {summary['rows']:,} rows in {summary['db']}"
