"""The warehouse file as other programs meet it: two ingests at once from two real processes, a process that
holds the lock too long, read-only queries that can touch nothing but the warehouse, the newest DuckDB 1.x
reading the file (``make test`` installs it into .venv/duckdb1), and the README's example run verbatim."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from pipeline import warehouse
from tests.conftest import ROOT

DUCKDB1 = ROOT / ".venv" / "duckdb1"


def bootprof(*args, env_extra=None, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def hold_lock(db):
    """A real process that keeps the warehouse open for writing until its stdin is closed."""
    code = (f"import duckdb, sys; c = duckdb.connect({str(db)!r}); print('held', flush=True); "
            "sys.stdin.read(); c.close()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def waiting(proc) -> str:
    """Read ``proc``'s stderr up to the line that says it waits for the warehouse lock; the text read."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "locked by another process; waiting" in line:
            return "".join(seen)
    raise AssertionError("never waited for the lock: " + "".join(seen)[-2000:])


def test_two_ingests_at_once_both_land_and_a_long_lock_is_a_clear_error(etl_run, tmp_path):
    db = tmp_path / "wh.duckdb"
    warehouse.connect(db).close()
    runs = [shutil.copytree(etl_run, tmp_path / f"nightly-2026010{d}-010000") for d in (1, 2)]
    holder = hold_lock(db)
    procs = [bootprof("warehouse", "--db", str(db), "ingest", "--run", str(r)) for r in runs]
    # (the lock goes once both ingests wait for it: an event, not a time that might pass before they start)
    early = [waiting(p) for p in procs]
    holder.stdin.close()
    holder.wait(timeout=30)
    outs = [p.communicate(timeout=120) for p in procs]
    outs = [(out, e + err) for (out, err), e in zip(outs, early)]
    assert [p.returncode for p in procs] == [0, 0], outs
    con = warehouse.connect(db, read_only=True)
    assert sorted(r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()) == [r.name for r in runs]
    con.close()
    # a lock held past warehouse.lock_timeout_s: one line naming the file and the setting, exit 2
    config = tmp_path / "cfg.yaml"
    config.write_text(json.dumps({"warehouse": {"lock_timeout_s": 0.5}}))
    holder = hold_lock(db)
    try:
        p = bootprof("--config", str(config), "warehouse", "--db", str(db), "ingest", "--run", str(runs[0]))
        out, err = p.communicate(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 2 and "Traceback" not in err
    assert f"{db}: the warehouse is locked by another process for more than 0.5 s (warehouse.lock_timeout_s)" in err


def test_a_file_held_elsewhere_is_recognised_in_each_systems_words(tmp_path):
    """A reader (query, compare) that finds the file held waits for it. The wait was recognised by the word "lock"
    in DuckDB's message, which on Windows is the system's sharing violation, with no such word: a second command
    failed at once and suggested a rebuild. Here the message this system gives, and Windows' text."""
    import duckdb

    from pipeline.warehouse.store import held_elsewhere

    db = tmp_path / "wh.duckdb"
    warehouse.connect(db).close()
    holder = hold_lock(db)
    try:
        with pytest.raises(duckdb.IOException) as caught:
            duckdb.connect(str(db), read_only=True)
    finally:
        holder.kill()
        holder.wait()
    assert held_elsewhere(str(caught.value)), caught.value
    windows = ('IO Error: Cannot open file "C:\\runs\\warehouse.duckdb": The process cannot access the file '
               "because it is being used by another process.")
    assert held_elsewhere(windows)
    assert not held_elsewhere('IO Error: Cannot open file "x.duckdb": Permission denied')
    assert not held_elsewhere("IO Error: The file is not a valid DuckDB database file!")
    assert not held_elsewhere("IO Error: Corrupt database file: computed checksum 1 does not match stored checksum 2 "
                              "in block at location 262144")


def test_queries_are_read_only_and_touch_no_file(etl_run, tmp_path):
    db = tmp_path / "wh.duckdb"
    warehouse.ingest(db, shutil.copytree(etl_run, tmp_path / "nightly-20260101-010000"))
    secret = tmp_path / "secret.csv"
    secret.write_text("a,b\n1,2\n")
    target = tmp_path / "out.csv"
    for sql in (f"COPY runs TO '{target}'", f"SELECT * FROM read_csv('{secret}')", "DELETE FROM runs",
                "CREATE TABLE x (i INT)", "SET enable_external_access = true", f"ATTACH '{tmp_path / 'o.db'}' AS o"):
        p = bootprof("warehouse", "--db", str(db), "query", sql)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.startswith("bootprof: error: query failed:") and "Traceback" not in err, (sql, err)
    assert not target.exists() and not (tmp_path / "o.db").exists()
    p = bootprof("warehouse", "--db", str(db), "query", "SELECT count(*) AS n FROM runs")
    assert p.communicate(timeout=60)[0].split()[-1] == "1" and p.returncode == 0


def test_duckdb_1x_reads_the_file_and_the_readme_example_runs_verbatim(etl_run, tmp_path):
    if not (DUCKDB1 / "duckdb").is_dir():
        pytest.fail(f"{DUCKDB1}: DuckDB 1.x is not installed (make test installs it)")
    db = tmp_path / "runs" / "warehouse.duckdb"
    for d in (1, 2):
        warehouse.ingest(db, shutil.copytree(etl_run, tmp_path / f"nightly-2026010{d}-010000"))
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "operations.md").read_text()
    examples = re.findall(r'duckdb runs/warehouse\.duckdb "([^"`]+)"', readme)
    assert len(examples) >= 2, "the README and docs/operations.md show a duckdb example"
    code = ("import duckdb, json, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print(json.dumps([duckdb.__version__] + [len(c.execute(q).fetchall()) for q in sys.argv[2:]]))")
    out = subprocess.run([sys.executable, "-c", code, "runs/warehouse.duckdb", *examples], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(DUCKDB1)), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    version, *counts = json.loads(out.stdout)
    assert version.startswith("1.") and len(counts) == len(examples)
