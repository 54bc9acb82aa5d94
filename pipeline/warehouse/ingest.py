"""The warehouse stage: one run directory's manifests and aggregated tables into the warehouse, in one transaction,
with its metrics and its comparison with its baseline kept current (:func:`ingest`)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline import stages
from pipeline.checkpoints import checkpoint
from pipeline.errors import DONE, InputError, ManifestError
from pipeline.mirror import location
from pipeline.runs import MANIFEST, parquet_glob, read_manifest, sql_path, stage_dir
from pipeline.stages import DECODED
from pipeline.warehouse import comparison, journal
from pipeline.warehouse.store import NOT_INGESTED, connect, rollback, workload_of, write_metrics, writing

if TYPE_CHECKING:
    from pipeline.contracts import IngestSummary


#: The stage outputs a run's manifests are read from (the comparison's own is no part of the run it judges).
STAGES = tuple(o for o in stages.outputs() if o != stages.COMPARED)


AGGREGATED = stages.AGGREGATED


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


#: The ``platform`` label of a run that has none given: what its decode read (an ETL trace: Windows; perf.data: Linux).
PLATFORMS = (("perf_file.parquet", "linux"), ("trace.parquet", "windows"))


def with_platform(run_dir: Path, labels: dict[str, str] | None) -> dict[str, str]:
    """``labels`` as text, with ``platform`` (``linux``, ``windows``) from the run's decode unless one is given; runs of
    both in one warehouse then tell apart (``labels['platform']``), and a comparison across them says so."""
    out = {str(k): str(v) for k, v in (labels or {}).items()}
    found = next((name for table, name in PLATFORMS if (stage_dir(run_dir, DECODED) / table).exists()), None)
    if found is not None:
        out.setdefault("platform", found)
    return out


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
    if row is None or row[0] != location(run_dir) or dict(row[1] or {}) != with_platform(run_dir, labels):
        return False
    now = {stage: json.loads(json.dumps(m, sort_keys=True, default=str)) for stage, m in manifests.items()}
    return {stage: json.loads(m) for stage, m in stored.items()} == now


def ingest(db: Path, run_dir: Path, labels: dict[str, str] | None = None, job: str | None = None,
           lock_timeout_s: float = 300.0, after: Callable[[], Any] | None = None, settings=None) -> IngestSummary:
    """Put one run into the warehouse (replacing an earlier ingestion of the same run_id), as its one writer
    (:func:`~pipeline.warehouse.store.writing`).

    ``after``: the report stage still runs (a job started this beside it, ``stages``); the aggregated tables, the
    run's metrics and verdicts go in meanwhile, and ``after()`` returns once it has ended (or raises its error:
    nothing is then written), before the stages' manifests are read for the ``runs`` row's ``stages`` and the
    ``stage_manifests`` rows. ``settings``: the verdict's
    (``warehouse.verdict``), for the ``verdicts`` rows of the run and of those after it."""
    with writing(db, lock_timeout_s):
        return _ingest(db, run_dir, labels, job, lock_timeout_s, after, settings)


def _ingest(db: Path, run_dir: Path, labels: dict[str, str] | None, job: str | None, lock_timeout_s: float,
            after: Callable[[], Any] | None, settings=None) -> IngestSummary:
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
        checkpoint("ingest.began")
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
        elif (stage_dir(run_dir, DECODED) / "perf_file.parquet").exists():     # (a perf run: its clock's Unix time)
            trace_start = con.execute("SELECT origin_unix_ns // 1000 FROM read_parquet($1)",
                                      [parquet_glob(stage_dir(run_dir, DECODED) / "perf_file.parquet")]).fetchone()[0]
        recorded = recorded_us(con, run_dir, trace_start)
        sections = manifests[AGGREGATED].get("sections", {})
        query_total = con.execute("SELECT sum(total_ns) FROM query_totals WHERE run_id = ? AND scope = 'build'",
                                  [run_id]).fetchone()[0]
        labels = with_platform(run_dir, labels)
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
        try:
            write_metrics(con, run_id)
            _enough_data(con, run_id, run_dir)
            comparison.write_verdicts(con, [run_id, *comparison.later_runs(con, run_id)], settings)
        except InputError:
            if after is not None:
                after()     # (the report beside it ends first, then the run is refused)
            raise
        if after is not None:
            # (what needs the report: its manifest; the rest went in while it ran)
            after()
            manifests = _manifests(run_dir)
            con.execute("UPDATE runs SET stages = ? WHERE run_id = ?", [list(manifests), run_id])
        for stage, m in manifests.items():
            con.execute("INSERT INTO stage_manifests VALUES (?, ?, ?::TIMESTAMP, ?, ?, ?, ?, ?)", [
                run_id, stage, m["created_utc"].replace("T", " ").rstrip("Z"), m.get("elapsed_s"),
                m.get("schema_version"), m.get("project_version"), m.get("config_hash"),
                json.dumps(m, sort_keys=True, default=str)])
            for table, n in (m.get("tables") or {}).items():
                con.execute("INSERT INTO table_rows VALUES (?, ?, ?, ?)", [run_id, stage, table, n])
        from pipeline.portable import signals_held

        checkpoint("ingest.before-commit")
        with signals_held():    # (the run and its journal line: a Ctrl-C comes after both, or before both)
            con.execute("COMMIT")
            checkpoint("ingest.committed")
            journal.record(db, run_id, location(run_dir), job, labels)
            DONE.append(f"run {run_id} was committed to {db}")
        checkpoint("ingest.journaled")
    except duckdb.Error as exc:
        rollback(con)
        raise InputError(f"{db}: ingesting {run_dir} failed, nothing of it was written: "
                         f"{' '.join(str(exc).split())}") from None
    except BaseException:
        rollback(con)
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


def stale_reason(run_dir: Path, config) -> str | None:
    """Why the job must ingest ``run_dir`` again (None: the warehouse holds this version of the run)."""
    same = holds(config.warehouse.path, run_dir, dict(config.warehouse.labels), config.warehouse.lock_timeout_s)
    return None if same else "the warehouse does not hold this version of the run"


def run(run_dir: Path, config, pool, inputs=None, after: Callable[[], Any] | None = None) -> IngestSummary:
    """Job stage: ingest ``run_dir`` into ``config.warehouse.path`` with ``config.warehouse.labels``."""
    return ingest(config.warehouse.path, run_dir, labels=dict(config.warehouse.labels),
                  lock_timeout_s=config.warehouse.lock_timeout_s, after=after,
                  settings=config.warehouse.verdict.model_dump())


def headline(summary: IngestSummary) -> str:
    """The stage's line in a job's output."""
    return f"run {summary['run_id']}: {summary['tables']} tables, {summary['rows']:,} rows in {summary['db']}"
