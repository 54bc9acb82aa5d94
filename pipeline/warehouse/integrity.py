"""How to tell and mend damage to the warehouse file, with its journal (:mod:`.journal`).

* :func:`verify` reads every row of every table (DuckDB checks each block's checksum as it reads it) and checks the
  warehouse against the journal and against the stage manifests of the run directories still on disk.
* :func:`rebuild` ingests run directories (by default every run the journal names whose directory is still there)
  into a new file, then puts it in place of the old one, which is kept beside it as ``<warehouse>.damaged``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.checkpoints import checkpoint
from pipeline.errors import BootprofError, InputError
from pipeline.runs import MANIFEST, stage_dir
from pipeline.warehouse.journal import one_line, damage_hint, journal, journal_path


@dataclass
class Verified:
    """What :func:`verify` found: ``tables`` read whole (name -> rows), ``runs`` in the warehouse, ``problems`` one
    line each (none: the warehouse is sound as far as it can be checked)."""
    tables: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    checked_dirs: int = 0
    problems: list[str] = field(default_factory=list)


def verify(db: Path, lock_timeout_s: float = 300.0) -> Verified:
    """Read every table whole, then check it against the journal and the run directories' manifests. A file DuckDB
    cannot open or read is an InputError naming it and the first damage, with what the journal still knows."""
    import duckdb

    from pipeline.stages import AGGREGATED
    from pipeline.warehouse.store import NOT_INGESTED, connect

    db = Path(db).expanduser()
    out = Verified()
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)

    def read(sql: str, params=()) -> list[tuple] | None:
        try:
            return con.execute(sql, list(params)).fetchall()
        except duckdb.Error as exc:
            line = f"table {sql.split(' FROM ')[-1].split()[0].strip(chr(34))}: damaged: {one_line(exc)}"
            if line not in out.problems:
                out.problems.append(line)
            return None

    try:
        tables = read("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND "
                      "table_type = 'BASE TABLE' ORDER BY 1")
        if tables is None:
            raise InputError(f"{db}: damaged: {out.problems[0]}{damage_hint(db)}")
        for (table,) in tables:
            try:
                reader = con.sql(f'SELECT * FROM "{table}"').to_arrow_reader(1 << 16)
                out.tables[table] = sum(batch.num_rows for batch in reader)
            except (duckdb.Error, OSError) as exc:       # (Arrow's reader says DuckDB's error as an OSError)
                out.problems.append(f"table {table}: damaged: {one_line(exc)}")
        runs = read("SELECT run_id, run_dir FROM runs") or []
        stored: dict[str, dict] = {}
        for run_id, stage, manifest in read("SELECT run_id, stage, manifest FROM stage_manifests") or []:
            stored.setdefault(run_id, {})[stage] = json.loads(manifest)
        rows: dict[str, dict] = {}
        for run_id, table, n in read("SELECT run_id, table_name, row_count FROM table_rows WHERE stage = ?",
                                     [AGGREGATED]) or []:
            rows.setdefault(run_id, {})[table] = n
        held: dict[str, dict] = {}
        for table in sorted({t for r in rows.values() for t in r if t in out.tables and t not in NOT_INGESTED}):
            for run_id, n in read(f'SELECT run_id, count(*) FROM "{table}" GROUP BY 1') or []:
                held.setdefault(run_id, {})[table] = n
    finally:
        con.close()
    damaged = bool(out.problems)
    out.runs = len(runs)
    known = journal(db)
    ids = {r for r, _ in runs}
    if damaged:
        out.problems.append(f"{db}: damaged{damage_hint(db)}")
    elif known or journal_path(db).exists():
        for run_id in sorted(ids - set(known)):
            out.problems.append(f"run {run_id}: in the warehouse, not in the journal {journal_path(db).name}")
        for run_id in sorted(set(known) - ids):
            out.problems.append(f"run {run_id}: in the journal, not in the warehouse (ingest it again, or rebuild)")
        for run_id, run_dir in sorted(runs):
            if run_id in known and run_dir and known[run_id]["run_dir"] != run_dir:
                out.problems.append(f"run {run_id}: the journal names {known[run_id]['run_dir']} as its directory, "
                                    f"the warehouse {run_dir} (a rebuild would read the journal's)")
    for run_id, run_dir in sorted(runs):
        for table, n in sorted((rows.get(run_id) or {}).items()):
            if table in NOT_INGESTED or table not in out.tables:
                continue
            have = (held.get(run_id) or {}).get(table, 0)
            if have and have != n:      # (0: the run's detail was pruned, which keeps its summary only)
                out.problems.append(f"run {run_id}: {table} holds {have:,} rows, its manifest says {n:,}")
        local = Path(run_dir) if run_dir and "://" not in run_dir else None
        if local is None or not local.is_dir():
            continue
        out.checked_dirs += 1
        for stage, manifest in sorted((stored.get(run_id) or {}).items()):
            path = stage_dir(local, stage) / MANIFEST
            try:
                now = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                out.problems.append(f"run {run_id}: {path} is gone or unreadable (the warehouse keeps its copy)")
                continue
            if json.loads(json.dumps(now, sort_keys=True, default=str)) != manifest:
                out.problems.append(f"run {run_id}: {stage} in {local} was made again after it was ingested "
                                    "(ingest it again)")
    return out


def rebuild(db: Path, run_dirs: list[Path] | None = None, out: Path | None = None,
            lock_timeout_s: float = 300.0) -> dict:
    """Ingest ``run_dirs`` (default: the journal's runs whose directories are still there, in the journal's
    order) into a new file. With ``out``: that file (which must not exist yet). Without: the new file takes the
    warehouse's place and the old one is kept as ``<warehouse>.damaged``. Returns what was done."""
    from pipeline.warehouse.store import writing

    db = Path(db).expanduser()
    with writing(db, lock_timeout_s):       # (an ingest meanwhile would go into the file being replaced)
        return _rebuild(db, run_dirs, out, lock_timeout_s)


def _rebuild(db: Path, run_dirs: list[Path] | None, out: Path | None, lock_timeout_s: float) -> dict:
    from pipeline import warehouse
    from pipeline.portable import rename
    from pipeline.warehouse.store import lock_path

    known = {**journal(db), **_unjournaled(db, lock_timeout_s)}
    labels_of = {Path(str(e.get("run_dir"))): e.get("labels") or {} for e in known.values()}
    jobs_of = {Path(str(e.get("run_dir"))): e.get("job") for e in known.values()}
    missing: list[str] = []
    if run_dirs is None:
        run_dirs = []
        for entry in known.values():
            path = Path(str(entry.get("run_dir")))
            (run_dirs.append(path) if path.is_dir() else missing.append(str(path)))
        if not run_dirs:
            raise InputError(f"{journal_path(db)}: no run directory to rebuild from "
                             f"({len(known)} runs in the journal, none of their directories here)")
    target = Path(out).expanduser() if out else db.with_name(db.name + f".rebuild-{os.getpid()}")
    if target.exists():
        raise InputError(f"{target}: exists; name a new file")
    ingested, failed = [], []
    try:
        for run_dir in run_dirs:
            run_dir = Path(run_dir).resolve()
            try:
                warehouse.ingest(target, run_dir, labels=labels_of.get(run_dir), job=jobs_of.get(run_dir),
                                 lock_timeout_s=lock_timeout_s)
                ingested.append(run_dir.name)
            except BootprofError as exc:       # (a directory that is not the run, or not whole: listed, the rest go on)
                failed.append(f"{run_dir}: {exc}")
        if not ingested:
            raise InputError(f"{db}: no run could be ingested again; first: {failed[0] if failed else '?'}")
        pruned_again = _prune_again(db, target, ingested, lock_timeout_s)
        checkpoint("rebuild.ingested")
        if not out:
            damaged = kept_name(db)
            if db.exists():
                rename(db, damaged)
            if journal_path(db).exists():       # (the old journal stays with the old file: runs whose directory is gone)
                rename(journal_path(db), journal_path(damaged))
            rename(target, db)
            new_journal = journal_path(target)
            if new_journal.exists():
                rename(new_journal, journal_path(db))
    except BaseException:
        if not out:
            for leftover in (target, journal_path(target), target.with_name(target.name + ".wal")):
                leftover.unlink(missing_ok=True)
        raise
    finally:
        lock_path(target).unlink(missing_ok=True)        # (the new file's writers' lock, under its first name)
    return {"db": str(out or db), "ingested": ingested, "failed": failed, "missing": missing,
            "pruned_again": pruned_again, "damaged": None if out else str(damaged)}


def _unjournaled(db: Path, lock_timeout_s: float) -> dict[str, dict]:
    """The runs the warehouse holds that its journal does not name (a command killed between an ingest's COMMIT and
    its journal line), as journal lines, where the file can still be read; none where it cannot."""
    import duckdb

    from pipeline.warehouse.store import connect

    if not db.exists():
        return {}
    try:
        con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    except (BootprofError, duckdb.Error):
        return {}
    try:
        rows = con.execute("SELECT run_id, run_dir, job, labels FROM runs ORDER BY ingested_utc, run_id").fetchall()
    except duckdb.Error:
        return {}
    finally:
        con.close()
    known = journal(db)
    return {run_id: {"run_id": run_id, "run_dir": run_dir, "job": job, "labels": dict(labels or {})}
            for run_id, run_dir, job, labels in rows if run_id not in known and isinstance(run_dir, str)}


def _prune_again(db: Path, target: Path, ingested: list[str], lock_timeout_s: float) -> list[str]:
    """Take again from ``target`` the detail that a prune of ``db`` had taken (a rebuild re-ingests runs whole from
    their directories), and say so in the new journal."""
    from pipeline.warehouse.journal import pruned, record_prune
    from pipeline.warehouse.store import connect, drop_detail

    again = sorted(pruned(db) & set(ingested))
    if not again:
        return []
    con = connect(target, lock_timeout_s=lock_timeout_s)
    try:
        drop_detail(con, again)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    record_prune(target, again)
    return again


def kept_name(db: Path) -> Path:
    """Where a rebuild keeps the file it replaces: ``<warehouse>.damaged``, or ``.damaged-2``, ``-3``... when an
    earlier rebuild kept one there (it may hold the only copy of a run whose directory is gone)."""
    k, path = 1, db.with_name(db.name + ".damaged")
    while path.exists() or journal_path(path).exists():
        k += 1
        path = db.with_name(f"{db.name}.damaged-{k}")
    return path
