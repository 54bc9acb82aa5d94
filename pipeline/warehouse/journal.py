"""The journal beside a warehouse file (``<warehouse>.journal.jsonl``): one JSON line per ingest that committed, with
the run, its run directory, job and labels, and one per prune, with the runs it took the detail of. A separate, append-only text file, so a damaged warehouse still says
which runs it held and where they are (:mod:`.integrity` verifies and rebuilds from it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def journal_path(db: Path) -> Path:
    db = Path(db).expanduser()
    return db.with_name(db.name + ".journal.jsonl")


def record(db: Path, run_id: str, run_dir: str, job: str, labels: dict[str, str]) -> None:
    """Append the line of an ingest that committed (flushed to disk before the command goes on)."""
    line = json.dumps({"run_id": run_id, "run_dir": run_dir, "job": job, "labels": labels,
                       "ingested_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, sort_keys=True)
    with open(journal_path(db), "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def record_prune(db: Path, run_ids: list[str]) -> None:
    """Append the line of a prune that committed: the runs whose detail it removed (a rebuild, which ingests them
    again from their directories, removes it again)."""
    line = json.dumps({"pruned": sorted(run_ids), "pruned_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                      sort_keys=True)
    with open(journal_path(db), "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def pruned(db: Path) -> set[str]:
    """The runs whose detail a prune removed after they were last ingested."""
    out: set[str] = set()
    for entry in _lines(db):
        if well_formed(entry):
            out.discard(entry["run_id"])
        elif isinstance(entry, dict) and isinstance(entry.get("pruned"), list):
            out.update(r for r in entry["pruned"] if isinstance(r, str))
    return out


def _lines(db: Path):
    path = journal_path(db)
    if not path.exists():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def well_formed(entry) -> bool:
    """A journal line as :func:`record` writes it: a run id, a run directory, a job and labels (text to text)."""
    return (isinstance(entry, dict) and isinstance(entry.get("run_id"), str) and isinstance(entry.get("run_dir"), str)
            and isinstance(entry.get("job"), (str, type(None))) and isinstance(entry.get("labels", {}), dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in entry.get("labels", {}).items()))


def journal(db: Path) -> dict[str, dict]:
    """run_id -> the newest journal line of it (lines that are not JSON or not of a journal's shape, a line cut by a
    crash or written by hand, are left out)."""
    out: dict[str, dict] = {}
    for entry in _lines(db):
        if well_formed(entry):
            out[entry["run_id"]] = entry
    return out


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def damage_hint(db: Path) -> str:
    """What to do about a warehouse file DuckDB cannot read: what its journal still knows."""
    known = journal(db)
    if not known:
        return ""
    there = sum(1 for e in known.values() if Path(str(e.get("run_dir"))).is_dir())
    return (f"; its journal names {len(known)} runs, {there} of whose directories are here: "
            f"`bootprof warehouse rebuild` ingests them into a new file")
