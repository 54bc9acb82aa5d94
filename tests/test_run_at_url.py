"""A run directory kept at a store's URL (``--run s3://...``, pipeline/mirror.py), against a real S3 API server on
loopback (moto's server, spoken to by s3fs over HTTP): a job run there writes what a local run writes, a second
machine (another working copy) finds every stage up to date and takes what the first one changes, and what a fetch
meets halfway (a push cut short, a stage rewritten while it is read) is never taken for an output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, S3_BUCKET as BUCKET, S3_CREDENTIALS as CREDENTIALS, assert_same_tables, s3_client as s3


def bootprof(endpoint: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FSSPEC_S3_ENDPOINT_URL=endpoint, **CREDENTIALS)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    from pipeline import synth
    from pipeline.config import SynthConfig

    trace = tmp_path_factory.mktemp("run-at-url") / "input" / "build.etl"
    synth.run(trace, SynthConfig(seed=11, size="4MB", cpus=2))
    return trace


def machine(tmp_path, name: str, **more) -> str:
    """A config as one machine has it: its own working copies; the symbol cache of every machine (a setting of the
    symbolize stage: another would make its output stale), the warehouse of the run at the URL (the local run has its
    own)."""
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(json.dumps({"runs": {"mirror_dir": str(tmp_path / f"copies-{name}")},
                               "symbolize": {"cache_dir": str(tmp_path / "symbols")},
                               "warehouse": {"path": str(tmp_path / ("warehouse-local.duckdb" if name == "local" else
                                                                     "warehouse.duckdb"))}, **more}))
    return str(cfg)


def test_a_run_kept_at_a_url_is_the_local_run_and_machines_share_it(s3_store, build, tmp_path):
    from pipeline.mirror import working_copy

    trace, url = build, f"s3://{BUCKET}/nightly/run-1"
    job = ["run", str(ROOT / "jobs" / "single-trace.yaml"), "--trace", str(trace),
           "--trace", str(trace.parent / "selfprofile"), "--symbol-path", str(trace.parent / "symbols")]
    local = bootprof(s3_store, "--config", machine(tmp_path, "local"), *job, "--run", str(tmp_path / "run-1"))
    assert local.returncode == 0, local.stderr

    first = bootprof(s3_store, "--config", machine(tmp_path, "a"), *job, "--run", url)
    assert first.returncode == 0, first.stderr
    assert f"run directory: {url}" in first.stdout
    assert "put back to" in first.stderr and "Traceback" not in first.stderr
    client = s3(s3_store)
    stages = {p.split("/")[-2] for p in client.glob(f"{BUCKET}/nightly/run-1/*/_manifest.json")}
    assert stages == {"decoded", "symbolized", "aggregated", "report"}
    assert client.exists(f"{BUCKET}/nightly/run-1/report/index.html")

    # Another machine (its own working copies) goes on with the run, naming no trace (it need not have the files):
    # every stage is up to date there, and its tables are the local run's.
    second = bootprof(s3_store, "--config", machine(tmp_path, "b"), *job[:2], *job[-2:], "--run", url)
    assert second.returncode == 0, second.stderr
    assert "inputs: those of the run's decode (" in second.stdout
    for stage in ("decode", "symbolize", "aggregate", "report", "warehouse"):
        assert re.search(rf"^  {stage} +skipped  \(up to date\)", second.stdout, re.M), second.stdout
    copy_b = working_copy(url, tmp_path / "copies-b")
    assert sum(assert_same_tables(tmp_path / "run-1" / stage, copy_b / stage)
               for stage in ("decoded", "symbolized", "aggregated")) >= 45
    import duckdb

    con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    assert con.execute("SELECT run_id, run_dir FROM runs").fetchall() == [("run-1", url)]
    con.close()

    # What one machine changes, the other fetches before its next command.
    again = bootprof(s3_store, "--config", machine(tmp_path, "b", aggregate={"top_n": 7}), "aggregate", "--run", url)
    assert again.returncode == 0, again.stderr
    assert "put back to" in again.stderr and "aggregated/" in again.stderr
    report = bootprof(s3_store, "--config", machine(tmp_path, "a"), "report", "--run", url)
    assert report.returncode == 0, report.stderr
    assert "fetched aggregated/" in report.stderr
    copy_a = working_copy(url, tmp_path / "copies-a")
    assert (copy_a / "aggregated" / "_manifest.json").read_bytes() == (copy_b / "aggregated" / "_manifest.json").read_bytes()
    assert json.loads((copy_a / "aggregated" / "_manifest.json").read_text())["config"]["aggregate"]["top_n"] == 7
    assert client.cat(f"{BUCKET}/nightly/run-1/report/_manifest.json") == (copy_a / "report" / "_manifest.json").read_bytes()


def test_a_fetch_takes_only_whole_outputs(s3_here, tmp_path, monkeypatch):
    """A push cut short (files, no manifest) is no output; a stage rewritten while it is fetched is fetched again,
    whole; a stage changed only in the copy is kept and put back; one removed there goes here too."""
    from pipeline.mirror import Mirror

    url, client = f"s3://{BUCKET}/halfway", s3(s3_here)

    def output(copy: Mirror, stage: str, text: str) -> None:
        d = copy.path / stage
        (d / "t.parquet").mkdir(parents=True, exist_ok=True)
        (d / "t.parquet" / "part-0.parquet").write_text(text)
        (d / "_manifest.json").write_text(json.dumps({"stage": stage, "text": text}))

    a, b = Mirror(url, tmp_path / "a"), Mirror(url, tmp_path / "b")
    output(a, "decoded", "one")
    assert a.push() == ["decoded"]
    assert b.pull() == ["decoded"] and (b.path / "decoded" / "t.parquet" / "part-0.parquet").read_text() == "one"

    # A push cut short: the new files are there, the manifest is not; nothing is fetched, the copy keeps the old.
    client.rm_file(f"{BUCKET}/halfway/decoded/_manifest.json")
    client.pipe_file(f"{BUCKET}/halfway/decoded/t.parquet/part-1.parquet", b"half")
    assert Mirror(url, tmp_path / "c").pull() == []
    assert not list((tmp_path / "c").rglob("*.parquet"))
    # (b synced "one", which is gone there: removed here too)
    assert b.pull() == [] and not (b.path / "decoded").exists()
    # The next push replaces it whole, the file of the cut push gone.
    output(a, "decoded", "two")
    assert a.push() == ["decoded"]
    assert sorted(client.find(f"{BUCKET}/halfway/decoded")) == [f"{BUCKET}/halfway/decoded/_manifest.json",
                                                               f"{BUCKET}/halfway/decoded/t.parquet/part-0.parquet"]

    # Rewritten while it is fetched: the files read belong to "two", the manifest by then to "three"; the fetch
    # reads again and takes "three" whole.
    reader = Mirror(url, tmp_path / "d")
    get = reader.fs.get

    def get_then_rewrite(*args, **kwargs):
        get(*args, **kwargs)
        reader.fs.get = get
        output(a, "decoded", "three")
        a.push()

    reader.fs.get = get_then_rewrite
    assert reader.pull() == ["decoded"]
    assert (reader.path / "decoded" / "t.parquet" / "part-0.parquet").read_text() == "three"
    assert json.loads((reader.path / "decoded" / "_manifest.json").read_text())["text"] == "three"

    # Caught between a push's removal of the old manifest and its writing of the new one: the fetch waits for it
    # (here up to 120 s, looking every 0.1 s: a push that took longer than the 2 s default under load once failed).
    import threading

    from pipeline import mirror

    monkeypatch.setattr(mirror, "PUSH_WAIT_S", 120.0)

    late = Mirror(url, tmp_path / "e")
    get_late = late.fs.get

    def get_then_push_slowly(*args, **kwargs):
        get_late(*args, **kwargs)
        late.fs.get = get_late
        client.rm_file(f"{BUCKET}/halfway/decoded/_manifest.json")
        output(a, "decoded", "five")
        threading.Timer(0.5, a.push).start()

    late.fs.get = get_then_push_slowly
    assert late.pull() == ["decoded"]
    assert (late.path / "decoded" / "t.parquet" / "part-0.parquet").read_text() == "five"

    # Changed only here (a command interrupted before its push): a pull keeps it, the next push puts it back.
    output(late, "decoded", "four")
    assert late.pull() == []
    assert (late.path / "decoded" / "t.parquet" / "part-0.parquet").read_text() == "four"
    assert Mirror(url, tmp_path / "e").push() == ["decoded"]
    assert client.cat(f"{BUCKET}/halfway/decoded/t.parquet/part-0.parquet") == b"four"
    assert a.pull() == ["decoded"] and (a.path / "decoded" / "t.parquet" / "part-0.parquet").read_text() == "four"


def test_working_copies_beyond_the_limit_go_least_recently_used_first(s3_here, tmp_path, capsys):
    """runs.mirror_max_bytes: once a command has put its run back, working copies beyond it are removed, the least
    recently used first; never the command's own, one used in the last hour, or one that holds what is not put
    back yet."""
    import time

    from pipeline.config import RunsConfig
    from pipeline.mirror import IN_USE_S, STATE, Mirror, mirrored
    from pipeline.runs import RunLocation

    copies, hours = {}, {"old": 3, "older": 5, "unsynced": 9, "recent": 0.2}
    for name, age in hours.items():
        copy = Mirror(f"s3://{BUCKET}/lru/{name}", tmp_path / "copies")
        (copy.path / "decoded").mkdir()
        (copy.path / "decoded" / "t.parquet").write_bytes(b"x" * 10_000)
        (copy.path / "decoded" / "_manifest.json").write_text(json.dumps({"stage": "decoded", "run": name}))
        assert copy.push() == ["decoded"]
        if name == "unsynced":          # (made after its last put back: only this copy holds it)
            (copy.path / "decoded" / "_manifest.json").write_text(json.dumps({"stage": "decoded", "run": "again"}))
        stamp = time.time() - age * 3600
        os.utime(copy.path / STATE, (stamp, stamp))
        copies[name] = copy.path
    assert hours["recent"] * 3600 < IN_USE_S < hours["old"] * 3600
    runs = RunsConfig(mirror_dir=str(tmp_path / "copies"), mirror_max_bytes="25KB")
    with mirrored(RunLocation(url=f"s3://{BUCKET}/lru/now"), runs) as here:
        (here / "report").mkdir()
        (here / "report" / "index.html").write_bytes(b"y" * 10_000)
        (here / "report" / "_manifest.json").write_text("{}")
    # 5 copies of ~10 KB: "older", then "old" go; "unsynced" and "recent" stay however old or over the limit
    assert [p.exists() for p in (copies["older"], copies["old"])] == [False, False]
    assert copies["unsynced"].exists() and copies["recent"].exists() and here.exists()
    assert not copies["older"].parent.exists()          # (the URL's whole directory)
    assert "bootprof: removed 2 working copies used least recently" in capsys.readouterr().err
    assert Mirror(f"s3://{BUCKET}/lru/unsynced", tmp_path / "copies").push() == ["decoded"]   # (still there to put back)


def test_a_store_that_cannot_be_reached_and_an_http_run_are_clear_errors(tmp_path):
    import socket

    with socket.socket() as s:          # (a port nothing listens on)
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    cfg = machine(tmp_path, "x")
    unreachable = bootprof(closed, "--config", cfg, "report", "--run", f"s3://{BUCKET}/r")
    assert unreachable.returncode == 2
    assert unreachable.stderr.strip().splitlines()[-1].startswith(f"bootprof: error: s3://{BUCKET}/r: cannot list: ")
    assert "Traceback" not in unreachable.stderr
    http = bootprof(closed, "report", "--run", "https://example.invalid/runs/r")
    assert http.returncode == 2 and "HTTP(S) is read-only here" in http.stderr


def test_a_backfill_keeps_its_runs_at_a_url(s3_here, tmp_path, capsys):
    """A job whose ``runs_dir`` is a store's URL keeps each run there: the trace that decodes lands whole, the
    damaged one is reported and leaves no output; a second machine finds every stage up to date."""
    import shutil

    from pipeline.cli import main as cli_main
    from tests.conftest import fixture_path

    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copyfile(fixture_path("etl/perfview-small/smallEtlFile.etl"), traces / "night1.etl")
    (traces / "damaged.etl").write_bytes(b"\0" * 100)
    job = tmp_path / "backfill.yaml"
    job.write_text((ROOT / "jobs" / "backfill.yaml").read_text().replace(
        "runs_dir: runs", f"runs_dir: s3://{BUCKET}/backfill/"))
    for name, expect in (("a", 1), ("b", 1)):
        cfg = machine(tmp_path, name, cluster={"mode": "synchronous"})
        assert cli_main(["--config", cfg, "run", str(job), "--trace", str(traces)]) == expect
        out = capsys.readouterr().out
        assert f"-> s3://{BUCKET}/backfill/backfill-night1" in out and "backfill: 1 of 2 traces" in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("  ") and "skipped" in line] == \
        ["skipped"] * 4
    client = s3(s3_here)
    assert {p.split("/")[-2] for p in client.glob(f"{BUCKET}/backfill/backfill-night1/*/_manifest.json")} == \
        {"decoded", "symbolized", "aggregated"}
    assert not client.glob(f"{BUCKET}/backfill/backfill-damaged/*/_manifest.json")


def test_a_job_names_its_runs_below_a_path_or_a_url(tmp_path):
    from pipeline.config import ConfigError, load_job
    from pipeline.runs import RunLocation

    job = tmp_path / "job.yaml"
    for runs_dir, expect in (("s3://b/runs/", RunLocation(url="s3://b/runs/j-1")),
                             ("runs", RunLocation(path=Path("runs") / "j-1"))):
        job.write_text(f"name: j\nstages: [decode]\nruns_dir: {runs_dir}\n")
        assert load_job(job).run_dir("j-1") == expect
    job.write_text("name: j\nstages: [decode]\nruns_dir: https://example.invalid/runs\n")
    with pytest.raises(ConfigError, match=r"job\.yaml:3: runs_dir: .*HTTP\(S\) is read-only"):
        load_job(job)
