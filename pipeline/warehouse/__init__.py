"""Warehouse stage: every run's manifests and aggregated tables in one DuckDB file, for SQL across runs.

Entry point: :func:`run` (the job runner's stage) = :func:`ingest` of one run directory into
``config.warehouse.path``. A run is keyed by its ``run_id`` (the run directory's name); ingesting it
again replaces all of its rows in one transaction, so ingestion is idempotent and a crash leaves
the previous state. Each ``aggregated/<table>.parquet`` becomes rows of the warehouse table of the
same name with ``run_id`` in front (tables and columns are created as they first appear, so new
aggregate sections need no change here). ``runs`` holds one row per run; the views ``metrics``,
``run_baselines``, ``comparisons`` and ``regressions`` and the table macro ``compare_runs(run, baseline)``
answer "what changed" (significance: :mod:`.significance`). Every table, view and column is
described in ``schema.md``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from pipeline.errors import InputError, ManifestError
from pipeline.runs import MANIFEST, parquet_glob, read_manifest, sql_path, stage_dir
from pipeline.warehouse.significance import significant_sql, z_sql

STAGES = ("capture", "decoded", "symbolized", "aggregated", "report")
AGGREGATED = "aggregated"

RUNS_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, job VARCHAR, run_dir VARCHAR, run_time TIMESTAMP, trace_start_utc TIMESTAMP,
    trace_sha256 VARCHAR, trace_files INTEGER, trace_bytes BIGINT, labels MAP(VARCHAR, VARCHAR),
    stages VARCHAR[], project_version VARCHAR, ingested_utc TIMESTAMP,
    cpu_samples BIGINT, commit_bytes BIGINT, query_total_ns BIGINT);
CREATE TABLE IF NOT EXISTS stage_manifests (
    run_id VARCHAR, stage VARCHAR, created_utc TIMESTAMP, elapsed_s DOUBLE, schema_version INTEGER,
    project_version VARCHAR, config_hash VARCHAR, manifest JSON);
CREATE TABLE IF NOT EXISTS table_rows (run_id VARCHAR, stage VARCHAR, table_name VARCHAR, row_count BIGINT);
"""

#: Aggregated tables the views read, with the columns they need: created empty up front so the views
#: exist before the first run that has them (more columns are added as tables are ingested).
BASE_TABLES = {
    "cpu_by_function": "module VARCHAR, function VARCHAR, raw_name VARCHAR, crate VARCHAR, self_samples BIGINT, "
                       "inclusive_samples BIGINT",
    "cpu_by_process": "pid BIGINT, image_name VARCHAR, crate VARCHAR, samples BIGINT",
    "cpu_by_crate": "crate VARCHAR, processes BIGINT, samples BIGINT",
    "commit_by_function": "module VARCHAR, function VARCHAR, raw_name VARCHAR, inclusive_commit_bytes BIGINT",
    "commit_by_process": "pid BIGINT, image_name VARCHAR, crate VARCHAR, commit_bytes BIGINT, peak_commit_bytes BIGINT",
    "commit_by_stack": "stack_id BIGINT, folded VARCHAR, commit_bytes BIGINT, outstanding_bytes BIGINT",
    "query_summary": "scope VARCHAR, file_id INTEGER, crate VARCHAR, label VARCHAR, self_ns BIGINT, time_ns BIGINT",
    "query_totals": "scope VARCHAR, file_id INTEGER, crate VARCHAR, total_ns BIGINT",
}

#: kind -> (significance test, SQL giving run_id, key, value). One row per (run, kind, key).
METRICS = {
    "cpu_function_self": ("count", "SELECT run_id, coalesce(module || '!', '') || function, sum(self_samples) "
                                   "FROM cpu_by_function GROUP BY ALL"),
    "cpu_function_inclusive": ("count", "SELECT run_id, coalesce(module || '!', '') || function, "
                                        "sum(inclusive_samples) FROM cpu_by_function GROUP BY ALL"),
    "cpu_crate": ("count", "SELECT run_id, crate, sum(samples) FROM cpu_by_crate GROUP BY ALL"),
    "cpu_program": ("count", "SELECT run_id, coalesce(image_name, '?'), sum(samples) FROM cpu_by_process GROUP BY ALL"),
    "query_self_ns": ("time", "SELECT run_id, label, sum(self_ns) FROM query_summary WHERE scope = 'build' GROUP BY ALL"),
    "query_crate_ns": ("time", "SELECT run_id, crate, sum(total_ns) FROM query_totals WHERE scope = 'crate' GROUP BY ALL"),
    "commit_function": ("bytes", "SELECT run_id, coalesce(module || '!', '') || function, sum(inclusive_commit_bytes) "
                                 "FROM commit_by_function GROUP BY ALL"),
    "peak_commit": ("bytes", "SELECT run_id, coalesce(crate, image_name, '?'), max(peak_commit_bytes) "
                             "FROM commit_by_process GROUP BY ALL"),
}


def _comparison_sql(pairs: str) -> str:
    """Every metric of each (run_id, baseline_run_id) pair in ``pairs``, with change and significance."""
    tests = " ".join(f"WHEN '{kind}' THEN '{test}'" for kind, (test, _) in METRICS.items())
    sig = " ".join(f"WHEN '{test}' THEN {significant_sql(test, 'v', 'b')}" for test in ("count", "time", "bytes"))
    return f"""
        SELECT m.run_id, m.baseline_run_id, m.kind, CASE m.kind {tests} END AS test, m.key,
               m.b AS baseline_value, m.v AS value, m.v - m.b AS change,
               CASE WHEN m.b <> 0 THEN (m.v - m.b) / m.b END AS relative_change,
               CASE WHEN CASE m.kind {tests} END = 'count' THEN {z_sql('count', 'm.v', 'm.b')} END AS z,
               CASE CASE m.kind {tests} END {sig} END AS significant,
               CASE WHEN m.v > m.b THEN 'regression' WHEN m.v < m.b THEN 'improvement' ELSE 'same' END AS direction
        FROM (SELECT p.run_id, p.baseline_run_id, m.kind, m.key,
                     sum(CASE WHEN m.run_id = p.run_id THEN m.value ELSE 0 END)::DOUBLE AS v,
                     sum(CASE WHEN m.run_id = p.baseline_run_id THEN m.value ELSE 0 END)::DOUBLE AS b
              FROM ({pairs}) p JOIN metrics m ON m.run_id = p.run_id OR m.run_id = p.baseline_run_id
              GROUP BY ALL) m"""


VIEWS = {
    "metrics": " UNION ALL ".join(f"SELECT run_id, '{kind}' AS kind, key, value::DOUBLE AS value "
                                  f"FROM ({sql}) AS t(run_id, key, value)" for kind, (_, sql) in METRICS.items()),
    "run_baselines": """SELECT run_id, job, run_time,
        lag(run_id) OVER (PARTITION BY job ORDER BY run_time, run_id) AS baseline_run_id FROM runs""",
    "comparisons": _comparison_sql("SELECT run_id, baseline_run_id FROM run_baselines WHERE baseline_run_id IS NOT NULL"),
    "regressions": "SELECT * FROM comparisons WHERE significant AND direction = 'regression'",
}
MACROS = {"compare_runs": _comparison_sql("SELECT run AS run_id, baseline AS baseline_run_id")}


def connect(path: Path, read_only: bool = False):
    """Open (creating if needed) the warehouse file with its tables, views and macros in place."""
    import duckdb

    path = Path(path).expanduser()
    if read_only:
        if not path.exists():
            raise InputError(f"{path}: no warehouse here (ingest a run first: bootprof warehouse ingest --run RUN_DIR)")
        return duckdb.connect(str(path), read_only=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    con.execute(RUNS_DDL)
    for table, cols in BASE_TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} (run_id VARCHAR, {cols})")
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
    for name, sql in MACROS.items():
        con.execute(f"CREATE OR REPLACE MACRO {name}(run, baseline) AS TABLE {sql}")
    return con


def job_of(run_dir: Path) -> str:
    """The job of a run directory named ``<job>-YYYYmmdd-HHMMSS`` (as ``bootprof run`` names them)."""
    m = re.fullmatch(r"(.+)-\d{8}-\d{6}", run_dir.name)
    return m.group(1) if m else run_dir.name


def _manifests(run_dir: Path) -> dict[str, dict]:
    out = {}
    for stage in STAGES:
        if (stage_dir(run_dir, stage) / MANIFEST).exists():
            out[stage] = read_manifest(run_dir, stage)
    return out


def ingest(db: Path, run_dir: Path, labels: dict[str, str] | None = None, job: str | None = None) -> dict[str, Any]:
    """Put one run into the warehouse (replacing an earlier ingestion of the same run_id)."""
    run_dir = Path(run_dir).resolve()
    manifests = _manifests(run_dir)
    if AGGREGATED not in manifests:
        raise ManifestError(f"{run_dir}: no finished '{AGGREGATED}' output (run the aggregate stage first)")
    run_id = run_dir.name
    decoded = manifests.get("decoded", {})
    inputs = decoded.get("inputs") or manifests[AGGREGATED].get("inputs") or []
    shas = sorted(i["sha256"] for i in inputs if i.get("sha256"))
    trace_sha = shas[0] if len(shas) == 1 else (
        __import__("hashlib").sha256("".join(shas).encode()).hexdigest() if shas else None)
    run_time = (decoded or manifests[AGGREGATED])["created_utc"]
    tables = sorted(p for p in stage_dir(run_dir, AGGREGATED).iterdir() if p.name.endswith(".parquet"))

    con = connect(db)
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
        if (stage_dir(run_dir, "decoded") / "trace.parquet").exists():
            trace = parquet_glob(stage_dir(run_dir, "decoded") / "trace.parquet")
            # epoch microseconds: a TIMESTAMPTZ would need pytz on the way through Python
            trace_start = con.execute("SELECT epoch_us(min(start_utc)) FROM read_parquet($1)", [trace]).fetchone()[0]
        sections = manifests[AGGREGATED].get("sections", {})
        query_total = con.execute("SELECT sum(total_ns) FROM query_totals WHERE run_id = ? AND scope = 'build'",
                                  [run_id]).fetchone()[0]
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        con.execute("""INSERT INTO runs VALUES (?, ?, ?, ?::TIMESTAMP, make_timestamp(?::BIGINT), ?, ?, ?, MAP(?::VARCHAR[], ?::VARCHAR[]),
                                                ?, ?, ?::TIMESTAMP, ?, ?, ?)""", [
            run_id, job or labels.get("job") or job_of(run_dir), str(run_dir), run_time.replace("T", " ").rstrip("Z"),
            trace_start,
            trace_sha, len(inputs), sum(i.get("size") or 0 for i in inputs),
            list(labels), [labels[k] for k in labels], list(manifests), manifests[AGGREGATED].get("project_version"),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            sections.get("cpu", {}).get("samples"), sections.get("memory", {}).get("commit_bytes"), query_total])
        for stage, m in manifests.items():
            con.execute("INSERT INTO stage_manifests VALUES (?, ?, ?::TIMESTAMP, ?, ?, ?, ?, ?)", [
                run_id, stage, m["created_utc"].replace("T", " ").rstrip("Z"), m.get("elapsed_s"),
                m.get("schema_version"), m.get("project_version"), m.get("config_hash"),
                json.dumps(m, sort_keys=True, default=str)])
            for table, n in (m.get("tables") or {}).items():
                con.execute("INSERT INTO table_rows VALUES (?, ?, ?, ?)", [run_id, stage, table, n])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        con.close()
    return {"run_id": run_id, "db": str(db), "tables": len(counts), "rows": sum(counts.values())}


def compare(db: Path, run: str, baseline: str | None = None, everything: bool = False) -> list[dict]:
    """Metric differences of ``run`` against ``baseline`` (default: the previous run of its job);
    only significant ones unless ``everything``. Sorted: regressions first, largest |change| first."""
    con = connect(db, read_only=True)
    try:
        run_id = _run_id(con, run)
        if baseline is None:
            row = con.execute("SELECT baseline_run_id FROM run_baselines WHERE run_id = ?", [run_id]).fetchone()
            if not row or row[0] is None:
                raise InputError(f"run '{run_id}' has no earlier run of its job to compare with; pass --baseline")
            base_id = row[0]
        else:
            base_id = _run_id(con, baseline)
        where = "" if everything else "WHERE significant"
        cur = con.execute(f"""SELECT * FROM compare_runs(?, ?) {where}
                              ORDER BY direction = 'regression' DESC, significant DESC, kind,
                                       abs(coalesce(z, relative_change, change)) DESC, key""", [run_id, base_id])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def _run_id(con, ref: str) -> str:
    """A run id, or a run directory's path -> its run id; must be in the warehouse."""
    name = Path(ref).name if "/" in ref else ref
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [name]).fetchone() is None:
        raise InputError(f"run '{name}' is not in the warehouse (ingest it: bootprof warehouse ingest --run RUN_DIR)")
    return name


def run(run_dir: Path, config, pool, inputs=None) -> dict[str, Any]:
    """Job stage: ingest ``run_dir`` into ``config.warehouse.path`` with ``config.warehouse.labels``."""
    return ingest(config.warehouse.path, run_dir, labels=dict(config.warehouse.labels))
