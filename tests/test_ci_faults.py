"""A busy CI runner's faults, for real: two commands on one run directory, two jobs started in the same second, YAML
bombs and binary files as config or job, an unset variable as --trace, a FIFO where a trace should be. Each ends in
one line and exit 2, or waits its turn; none in exit 0 with wrong data, a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, fixture_path

BOMB = "".join(f"{k}: &{k} [{','.join(['*' + prev] * 9) if prev else ','.join(['lol'] * 9)}]\n"
               for prev, k in zip([""] + list("abcdefgh"), "abcdefghi"))


def bootprof(*args, cwd=ROOT, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, **kw)


def one_line_error(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("bootprof: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("where", ["config", "job", "title", "set"])
def test_yaml_bombs_end_in_one_line_at_once(tmp_path, where):
    """A 366-byte config of nested aliases once took 15 GB and 87 s; in report.title 17 GB; in a job file 5.5 GB."""
    job = ROOT / "jobs" / "single-trace.yaml"
    args = []
    if where == "config":
        (tmp_path / "c.yaml").write_text(BOMB)
        args = ["--config", str(tmp_path / "c.yaml"), "run", str(job)]
    elif where == "title":
        (tmp_path / "c.yaml").write_text(BOMB.replace("i: &i", "report:\n  title: &i"))
        args = ["--config", str(tmp_path / "c.yaml"), "run", str(job)]
    elif where == "job":
        (tmp_path / "j.yaml").write_text(BOMB)
        args = ["run", str(tmp_path / "j.yaml")]
    else:
        args = ["run", str(job), "--set", "report.title={" + ", ".join(BOMB.strip().splitlines()) + "}"]
    t0 = time.monotonic()
    proc = bootprof(*args, "--run", str(tmp_path / "run"), timeout=120)
    line = one_line_error(proc)
    assert time.monotonic() - t0 < 60 and len(line) < 400
    assert "aliases are expanded" in line or "not valid YAML" in line


def test_nesting_binary_and_huge_files_are_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested more than" in one_line_error(bootprof("--config", str(deep), "run", "jobs/single-trace.yaml"))
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"\xff\xfe\x00name: x\x00\x81")
    assert "not a text file" in one_line_error(bootprof("run", str(binary)))
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (2 << 20))
    assert "more than a config or job file holds" in one_line_error(bootprof("--config", str(huge), "run",
                                                                             "jobs/single-trace.yaml"))


def test_an_unset_variable_as_trace_and_a_fifo_are_refused(tmp_path):
    """``--trace ""`` once decoded the working directory and exited 0; a FIFO as the trace, or named like a
    self-profile in a directory, hung."""
    proc = bootprof("run", "jobs/single-trace.yaml", "--trace", "", "--run", str(tmp_path / "r1"))
    assert proc.returncode == 2 and "an empty path" in proc.stderr and "Traceback" not in proc.stderr
    # (the warehouse's file too: once a ValueError traceback, "PosixPath('.') has an empty name")
    proc = bootprof("warehouse", "--db", "", "compare", "--run", "x")
    assert proc.returncode == 2 and "an empty path" in proc.stderr and "Traceback" not in proc.stderr
    fifo = tmp_path / "t.etl"
    os.mkfifo(fifo)
    line = one_line_error(bootprof("decode", str(fifo), "--run", str(tmp_path / "r2"), timeout=60))
    assert str(fifo) in line and "not a regular file" in line
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for f in fixture_path("selfprofile/workspace-clean").glob("*.mm_profdata"):
        (profiles / f.name).write_bytes(f.read_bytes())
    os.mkfifo(profiles / "x-0001.mm_profdata")
    proc = bootprof("decode", str(profiles), "--run", str(tmp_path / "r3"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "left out 1 entries that are no regular files: x-0001.mm_profdata" in proc.stderr


def test_a_second_command_on_a_run_directory_waits_then_names_the_holder(tmp_path):
    """One command owns a run directory: another one waits for it (up to runs.lock_timeout_s), then fails in one
    line naming the holder; once the first is done, the second goes in."""
    from pipeline.runs import owned

    run = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"runs": {"lock_timeout_s": 1}, "cluster": {"mode": "synchronous"}}))
    held, release = threading.Event(), threading.Event()

    def hold():
        with owned(run, "bootprof run jobs/nightly.yaml (the test)"):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        t0 = time.monotonic()
        line = one_line_error(bootprof("--config", str(config), "decode",
                                       str(fixture_path("selfprofile/hello-default")), "--run", str(run)))
        assert time.monotonic() - t0 >= 1
        assert f"pid {os.getpid()}" in line and "bootprof run jobs/nightly.yaml (the test)" in line
        assert not (run / "decoded").exists()
    finally:
        release.set()
        holder.join()
    proc = bootprof("--config", str(config), "decode", str(fixture_path("selfprofile/hello-default")), "--run", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_capture_owns_its_run_directory_while_the_build_runs(tmp_path):
    """``capture`` took no lock (the build command, its positional argument, overwrote the subcommand's name): a
    ``decode`` on the same ``--run`` went ahead while it recorded, and ``capture --run`` wrote into a directory of
    other files. Now it owns the run as every command that writes one does. The build here waits for the test."""
    run, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    build = (f"import pathlib, time; m = pathlib.Path({str(marks)!r}); (m / 'started').touch()\n"
             "while not (m / 'go').exists(): time.sleep(0.01)")
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "capture", "--self-profile", "--run", str(run), "--",
                             sys.executable, "-c", build], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (marks / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.01)
        config = tmp_path / "c.yaml"
        config.write_text(json.dumps({"runs": {"lock_timeout_s": 0.5}, "cluster": {"mode": "synchronous"}}))
        line = one_line_error(bootprof("--config", str(config), "decode", str(fixture_path("selfprofile/hello-default")),
                                       "--run", str(run)))
        assert "another bootprof command works in this run directory" in line and "bootprof capture" in line, line
        (marks / "go").touch()
        out, err = proc.communicate(timeout=300)
    finally:
        (marks / "go").touch()        # (the build ends by itself, also when the test failed before)
        proc.kill()
    assert proc.returncode == 0 and "captured 0 self-profiles" in out, err[-2000:]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    line = one_line_error(bootprof("capture", "--self-profile", "--run", str(other), "--", sys.executable, "-c", "pass",
                                   env=env))
    assert "not a bootprof run directory" in line and sorted(p.name for p in other.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_two_jobs_on_one_run_directory_never_mix_their_data(tmp_path):
    """Two ``bootprof run`` into one ``--run``, of two different builds' self-profiles, the second started while the
    first runs: once mixed decoded/ of one with aggregated/ of the other and exited 0. Now the second waits, then
    makes every stage again from its own input: the run's manifests chain up to one input, and the warehouse's
    row for the run is of that input."""
    from pipeline import warehouse
    from pipeline.runs import read_manifest
    from tests.helpers import checkpoints

    run = tmp_path / "run"
    db = tmp_path / "wh.duckdb"
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {"path": str(db)}}))
    inputs = [fixture_path("selfprofile/workspace-clean"), fixture_path("selfprofile/workspace-incremental")]
    # The first job is held while it owns the run directory, during its decode and during its ingest; the second is
    # started then, and let go once it is about to wait for the run directory.
    for k, moment in enumerate(("decode.started", "ingest.began")):
        hold = tmp_path / f"hold-{k}"
        procs = []
        for trace, (at, env) in zip(inputs, ((moment, checkpoints.env(hold, moment)),
                                             ("runs.lock", checkpoints.env(hold / "second", "runs.lock")))):
            procs.append(subprocess.Popen([sys.executable, "-m", "pipeline", "--config", str(config), "run",
                                           "jobs/single-trace.yaml", "--trace", str(trace), "--run", str(run)],
                                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        try:
            checkpoints.reached(hold, moment, procs[0])
            checkpoints.reached(hold / "second", "runs.lock", procs[1])
            checkpoints.release(hold / "second", "runs.lock")
            checkpoints.release(hold, moment)
            for p in procs:
                out, err = p.communicate(timeout=600)
                assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
        finally:
            for p in procs:
                p.kill()
        decoded = read_manifest(run, "decoded")
        assert [os.path.basename(i["path"]) for i in decoded["inputs"]][0].endswith(".mm_profdata")
        # (the second job's input, the last to own the run directory; the manifest names it resolved)
        dirs = {os.path.realpath(os.path.dirname(i["path"])) for i in decoded["inputs"]}
        assert dirs == {os.path.realpath(inputs[1])}
        for stage in ("aggregated", "report"):
            read_manifest(run, stage)               # (raises if made from another decode than the one there now)
        con = warehouse.connect(db, read_only=True)
        try:
            (sha,) = con.execute("SELECT trace_sha256 FROM runs WHERE run_id = 'run'").fetchone()
        finally:
            con.close()
        shas = sorted(i["sha256_tree"] for i in decoded["inputs"])
        import hashlib

        assert sha == hashlib.sha256("".join(shas).encode()).hexdigest()


def test_jobs_started_in_the_same_second_get_a_run_each(tmp_path):
    """Without --run, a job's run is ``<job>-YYYYmmdd-HHMMSS``: two started in the same second once shared one."""
    from pipeline.runs import fresh_dir

    base = tmp_path / "runs" / "single-trace-20261128-010000"
    made = []
    threads = [threading.Thread(target=lambda: made.append(fresh_dir(base))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and base in made and all(p.is_dir() for p in made)
    from pipeline.warehouse import job_of

    assert {job_of(p) for p in made} == {"single-trace"}


def test_a_night_whose_inputs_are_all_unreadable_fails_and_is_not_ingested(tmp_path):
    """Every self-profile unreadable: the nightly once exited 0, ingested an empty run and reported "305
    improvements". Now exit 2 with the first reason, and the warehouse holds no such run."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for k in range(3):
        (profiles / f"crate{k}-000{k}.mm_profdata").write_bytes(os.urandom(5000))
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    line = one_line_error(bootprof("--config", str(config), "run", "jobs/nightly.yaml", "--trace", str(profiles),
                                   "--run", str(tmp_path / "run")))
    assert "nothing could be decoded (3 self-profiles, first error:" in line and "not a .mm_profdata file" in line
    assert not (tmp_path / "wh.duckdb").exists() and not (tmp_path / "run" / "decoded").exists()


def test_a_night_that_lost_most_of_its_data_is_not_compared(tmp_path):
    """A night of the same workload with one of the baseline's three crates left is missing data, not faster."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {
        "path": str(tmp_path / "wh.duckdb"), "labels": {"workload": "ws"}}}))
    whole = fixture_path("selfprofile/workspace-clean")
    proc = bootprof("--config", str(config), "run", "jobs/nightly.yaml", "--trace", str(whole), "--run",
                    str(tmp_path / "nightly-1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    part = tmp_path / "part"
    part.mkdir()
    one = sorted(whole.glob("*.mm_profdata"), key=lambda p: p.stat().st_size)[-1]     # (one crate of three)
    (part / one.name).write_bytes(one.read_bytes())
    line = one_line_error(bootprof("--config", str(config), "run", "jobs/nightly.yaml", "--trace", str(part), "--run",
                                   str(tmp_path / "nightly-2")))
    assert "most of its data is missing" in line and "nightly-1" in line


def test_a_full_disk_is_one_line_naming_the_place(tmp_path):
    """A run directory on a 1 MiB file system (a tmpfs mounted here, as root): the decode cannot write its tables.
    17 of 17 such cases ended in a traceback; now one line, exit 2, and no stage output that looks complete."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True,
                             text=True)
    assert mounted.returncode == 0, f"cannot mount a small tmpfs (the test needs root): {mounted.stderr}"
    try:
        proc = bootprof("--config", str(_sync(tmp_path)), "decode",
                        str(fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl")), "--run", str(small / "run"))
        line = one_line_error(proc)
        assert "no space left on the device" in line
        assert not (small / "run" / "decoded" / "_manifest.json").exists()
    finally:
        subprocess.run(["umount", str(small)], check=False)


def _sync(tmp_path):
    config = tmp_path / "sync.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}}))
    return config


def test_runs_go_where_they_belong(tmp_path):
    """``decode --run /`` once wrote ``/decoded``; a job named ``../../x`` escaped runs_dir."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    line = one_line_error(bootprof("decode", str(fixture_path("selfprofile/hello-default")), "--run", str(home)))
    assert "not a bootprof run directory (it holds notes.txt)" in line and not (home / "decoded").exists()
    assert "not a bootprof run directory" in one_line_error(
        bootprof("decode", str(fixture_path("selfprofile/hello-default")), "--run", "/"))
    job = tmp_path / "j.yaml"
    job.write_text(f"name: ../../x\nstages: [decode]\nruns_dir: {tmp_path / 'runs'}\n")
    proc = bootprof("run", str(job), "--trace", str(fixture_path("selfprofile/hello-default")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{job}:1: name: String should match pattern" in proc.stderr
    assert not (tmp_path.parent / "x").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "cannot make the run directory" in one_line_error(
        bootprof("decode", str(fixture_path("selfprofile/hello-default")), "--run", str(afile)))


def test_a_stage_whose_upstream_was_written_again_meanwhile_is_not_kept(tmp_path):
    """The upstream hashes a stage records are those of the manifests it read; one written again before the stage
    ends (another process, past the lock) makes the stage fail instead of pairing its output with the new one."""
    from pipeline.errors import ManifestError
    from pipeline.runs import atomic_write_json, read_manifest, stage_output

    run = tmp_path / "run"
    with stage_output(run, "decoded") as out:
        (out.path / "a.txt").write_text("first")
    with pytest.raises(ManifestError, match="decoded was written again while aggregated read it"):
        with stage_output(run, "aggregated", upstream=("decoded",)) as out:
            manifest = read_manifest(run, "decoded")
            manifest["again"] = True
            atomic_write_json(run / "decoded" / "_manifest.json", manifest)
    assert not (run / "aggregated").exists()


@pytest.mark.parametrize("how", ["copied over", "renamed over"])
def test_an_input_replaced_while_it_is_decoded_is_one_error(tmp_path, how, synth_traces):
    """A trace replaced during its decode (``cp`` over it, or an atomic ``mv``) once gave tables mixed from both
    files under the old file's sha256, exit 0. Each input is pinned (device, file id, size, mtime) as it is opened
    and checked as the stage ends. The decode is held at its start (checkpoint ``decode.started``, once the input is
    pinned) while the file is replaced, then goes on."""
    from tests.helpers import checkpoints

    a, b = synth_traces["plain64"].path, synth_traces["xpress64"].path
    trace, run = tmp_path / "t.etl", tmp_path / "run"
    trace.write_bytes(a.read_bytes())

    def replace(_proc):
        if how == "copied over":
            trace.write_bytes(b.read_bytes())
        else:
            (tmp_path / "b.etl").write_bytes(b.read_bytes())
            os.replace(tmp_path / "b.etl", trace)

    done = checkpoints.run_held([sys.executable, "-m", "pipeline", "--config", str(_sync(tmp_path)), "decode", str(trace),
                                 "--run", str(run)], tmp_path / "hold", "decode.started", replace, ROOT)
    line = one_line_error(done)
    assert f"{trace}: changed while it was decoded" in line
    assert not (run / "decoded").exists()


def test_a_self_profile_removed_while_it_is_decoded_is_one_error(tmp_path):
    """A ``.mm_profdata`` removed from the directory during its decode once ended in a FileNotFoundError traceback;
    now it is said as any other change to an input is (the decode held at its start while the file goes)."""
    import shutil

    from tests.helpers import checkpoints

    profiles, run = tmp_path / "profiles", tmp_path / "run"
    shutil.copytree(fixture_path("selfprofile/workspace-clean"), profiles, copy_function=shutil.copyfile)
    gone = next(profiles.glob("util-*.mm_profdata"))
    done = checkpoints.run_held([sys.executable, "-m", "pipeline", "--config", str(_sync(tmp_path)), "decode",
                                 str(profiles), "--run", str(run)], tmp_path / "hold", "decode.started",
                                lambda _proc: gone.unlink(), ROOT)
    line = one_line_error(done)
    assert f"{gone}: changed while it was decoded" in line
    assert not (run / "decoded").exists()


@pytest.fixture(scope="module")
def nightlies(tmp_path_factory) -> Path:
    """Two nightly runs of the real workspace self-profiles (``nightly-1``, ``nightly-2``) ingested into ``wh.duckdb``,
    made once for this module: tests work on a copy of the warehouse (:func:`_warehouse_copy`)."""
    base = tmp_path_factory.mktemp("nightlies")
    config = base / "w.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {"path": str(base / "wh.duckdb")}}))
    inputs = [fixture_path("selfprofile/workspace-clean"), fixture_path("selfprofile/workspace-incremental")]
    for k in range(2):
        proc = bootprof("--config", str(config), "run", "jobs/nightly.yaml", "--trace", str(inputs[k]),
                        "--run", str(base / f"nightly-{k + 1}"))
        assert proc.returncode == 0, proc.stderr[-2000:]
    return base


def _warehouse_copy(nightlies: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(a config whose warehouse is ``tmp_path/wh.duckdb``, that file): a copy of ``nightlies``' warehouse and
    journal, whose runs are still ``nightlies``' directories."""
    import shutil

    db = tmp_path / "wh.duckdb"
    for name in ("wh.duckdb", "wh.duckdb.journal.jsonl"):
        shutil.copyfile(nightlies / name, tmp_path / name)
    config = tmp_path / "w.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {"path": str(db)}}))
    return config, db


def _damage_block_of(db, table, copy):
    """A copy of the warehouse with 4 KB of garbage inside the first storage block of ``table``."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        (block,) = con.execute(f"SELECT min(block_id) FROM pragma_storage_info('{table}') WHERE block_id >= 0"
                               ).fetchone()
    finally:
        con.close()
    data = bytearray(db.read_bytes())
    at = 3 * 4096 + block * 262144 + 5000       # (3 header blocks of 4 KB, then 256 KB blocks)
    data[at:at + 4096] = os.urandom(4096)
    copy.write_bytes(bytes(data))
    journal = db.with_name(db.name + ".journal.jsonl")
    copy.with_name(copy.name + ".journal.jsonl").write_bytes(journal.read_bytes())
    return copy


def test_a_damaged_warehouse_is_one_line_and_rebuilt_from_its_journal(tmp_path, nightlies):
    """4 KB of garbage in the middle of the file once gave a ``duckdb.Error`` traceback, or stayed hidden (ingest,
    compare and prune exited 0 until a query touched the table); after header damage not even the list of runs
    was left. Now: every DuckDB error is one line; ``warehouse verify`` reads every table whole and names the
    damaged one; the journal beside the file names the runs and their directories; ``warehouse rebuild`` ingests
    them into a new file equal to the undamaged one."""
    import duckdb

    config, db = _warehouse_copy(nightlies, tmp_path)
    ok = bootprof("--config", str(config), "warehouse", "verify")
    assert ok.returncode == 0 and "no problem found" in ok.stdout and "2 runs" in ok.stdout, ok.stdout + ok.stderr

    def metrics(path):
        con = duckdb.connect(str(path), read_only=True)
        try:
            return con.execute("SELECT run_id, kind, key, value FROM run_metrics ORDER BY ALL").fetchall()
        finally:
            con.close()

    before = metrics(db)
    hidden = _damage_block_of(db, "query_stacks", tmp_path / "detail.duckdb")
    found = bootprof("--config", str(config), "warehouse", "--db", str(hidden), "verify")
    assert found.returncode == 1 and "table query_stacks: damaged: " in found.stdout, found.stdout + found.stderr
    assert "Traceback" not in found.stderr
    for table in ("runs", "query_summary"):
        damaged = _damage_block_of(db, table, tmp_path / f"{table}.duckdb")
        for args in (["query", f"SELECT * FROM {table}"], ["ingest", "--run", str(nightlies / "nightly-2")]):
            proc = bootprof("--config", str(config), "warehouse", "--db", str(damaged), *args)
            line = one_line_error(proc)
            assert "Corrupt database file" in line or "checksum" in line, line
    header = tmp_path / "header.duckdb"
    header.write_bytes(os.urandom(8192) + db.read_bytes()[8192:])
    header.with_name(header.name + ".journal.jsonl").write_bytes(db.with_name(db.name + ".journal.jsonl").read_bytes())
    line = one_line_error(bootprof("--config", str(config), "warehouse", "--db", str(header), "compare", "--run",
                                   "nightly-2"))
    assert str(header) in line and "its journal names 2 runs, 2 of whose directories are here" in line
    rebuilt = bootprof("--config", str(config), "warehouse", "--db", str(header), "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert "rebuilt" in rebuilt.stdout and (tmp_path / "header.duckdb.damaged").exists()
    assert metrics(header) == before
    again = bootprof("--config", str(config), "warehouse", "--db", str(header), "verify")
    assert again.returncode == 0 and "no problem found" in again.stdout


def test_signals_held_over_a_commit_are_delivered_after_it():
    """The mechanism the warehouse COMMIT and its journal line run under, with a real signal to this process."""
    import signal

    from pipeline.portable import signals_held

    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)        # (Python runs the handler between bytecodes: give it some)
            done.append("commit")
    assert done == ["commit"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


#: Moments of an ingest (``pipeline/warehouse/ingest.py``'s checkpoints) and whether a Ctrl-C there leaves the run in.
INGEST_MOMENTS = {"ingest.began": "out", "ingest.before-commit": "out", "ingest.committed": "in",
                  "ingest.journaled": "in"}


@pytest.mark.parametrize("moment", list(INGEST_MOMENTS))
def test_a_ctrl_c_at_any_moment_of_an_ingest_says_whether_the_run_went_in(tmp_path, nightlies, moment):
    """A Ctrl-C that landed on the COMMIT once gave a traceback, or exit 130 although the run had committed. Sent with
    the ingest held at each of its moments: after its transaction began and before its commit, the run is not in
    (exit 130, nothing in the warehouse or the journal); between the COMMIT and the journal line (where the signal
    is held until both are written) and after them, it is in, and the exit 130's line says it was committed. Never a
    traceback."""
    import shutil
    import signal

    import duckdb

    from tests.helpers import checkpoints

    config, db = _warehouse_copy(nightlies, tmp_path)
    run = tmp_path / "nightly-c"
    shutil.copytree(nightlies / "nightly-1", run)
    # (at "ingest.committed" the signal is held: it comes once the journal line is written, after the release)
    done = checkpoints.run_held([sys.executable, "-m", "pipeline", "--config", str(config), "warehouse", "ingest",
                                 "--run", str(run)], tmp_path / "hold", moment,
                                lambda proc: proc.send_signal(signal.SIGINT), ROOT, timeout=120)
    err = done.stderr
    assert "Traceback" not in err, err[-3000:]
    assert done.returncode == 130, (done.returncode, err)
    con = duckdb.connect(str(db), read_only=True)
    try:
        held = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run.name]).fetchone()[0]
    finally:
        con.close()
    journal = (db.with_name(db.name + ".journal.jsonl")).read_text()
    if INGEST_MOMENTS[moment] == "in":
        assert "was committed" in err and held == 1 and f'"run_id": "{run.name}"' in journal, err
    else:
        assert "was committed" not in err and held == 0 and f'"{run.name}"' not in journal, err


def test_odd_run_paths_and_a_closed_stdout_are_one_line(tmp_path):
    """A backslash in the run directory's name (DuckDB globbing) once ended in a traceback after the decode; so did a
    command whose stdout was closed; ``--run /proc/self`` is no run directory."""
    hello = str(fixture_path("selfprofile/hello-default"))
    proc = bootprof("--config", str(_sync(tmp_path)), "run", "jobs/single-trace.yaml", "--trace", hello, "--run",
                    str(tmp_path / "a\\b*c"))
    assert proc.returncode == 2 and "cannot hold a backslash" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "a\\b*c").exists()
    assert "not a bootprof run directory" in one_line_error(bootprof("decode", hello, "--run", "/proc/self"))
    closed = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(_sync(tmp_path)), "run",
                             "jobs/single-trace.yaml", "--trace", hello, "--run", str(tmp_path / "r")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300,
                            preexec_fn=lambda: os.close(1))
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr[-2000:]
    assert (tmp_path / "r" / "report" / "_manifest.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["decoded", "report"])
def test_sigterm_ends_the_command_with_its_workers(tmp_path, stage):
    """SIGTERM during the report once left the fork server and its workers alive (about 0.9 GB, until killed): Python
    died at once, no ``with`` ran. Now it ends as a Ctrl-C does, with exit 143, and every process it started ends
    with it. The cluster is a real local one (``inline_below`` 1 KB), the trace a synthesized 30 MB."""
    import signal

    import psutil

    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "jobs/single-trace.yaml", "--demo", "--run", str(run),
                             "--set", "synth.size=30MB", "--set", "cluster.inline_below=1KB"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(run.glob(f".{stage}.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    kids = []
    while not kids and proc.poll() is None and time.monotonic() < deadline:     # (the cluster's processes)
        kids = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.05)
    assert kids, "the stage started no worker"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "bootprof: terminated" in err and "Traceback" not in err, err[-3000:]
    gone, alive = psutil.wait_procs(kids, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline()[:4] for p in alive]
    # (its private directory went with it; a stage beside the one interrupted, the report beside the ingest, may
    # leave its own, marked with the dead pid: the next command in the run directory removes it)
    from pipeline.runs import clean_leftovers

    clean_leftovers(run)
    assert not list(run.glob(".*.tmp-*"))


def test_a_ctrl_c_during_the_reports_processes_leaves_none_behind():
    """``make fuzz`` found it: a Ctrl-C while the report's sections ran in their process pool left a worker forked
    from the fork server waiting for work forever (it holds its own queue's write end), and so the fork server and
    the caller's pipes. The pool now ends its processes when its ``with`` is left by an interrupt: the command's
    output pipes close when it exits (``communicate`` returns)."""
    code = ("import time\n"
            "from pipeline import cluster\n"
            "try:\n"
            "    with cluster.processes(2) as pool:\n"
            "        futures = [pool.submit(time.sleep, 60) for _ in range(2)]\n"
            "        time.sleep(1)\n"
            "        raise KeyboardInterrupt\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "interrupted", proc.stderr[-2000:]


def test_a_pools_processes_end_when_the_command_is_killed_outright():
    """However the command goes (here ``os._exit`` with a task running: no ``with`` acts), its pool's processes see
    it and end, and so does the fork server: the caller's pipes close. ``make fuzz`` found a SIGINT during the
    pool's shutdown leaving one for good."""
    code = ("import os, time\n"
            "from pipeline import cluster\n"
            "pool = cluster.processes(2)\n"
            "futures = [pool.submit(time.sleep, 120) for _ in range(2)]\n"
            "time.sleep(2)\n"
            "print('going', flush=True)\n"
            "os._exit(0)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "going" and time.monotonic() - t0 < 30, proc.stderr[-2000:]


def test_rebuild_keeps_every_damaged_file_and_survives_odd_journal_lines(tmp_path, nightlies):
    """A journal line whose labels are text once stopped rebuild with an AttributeError traceback; a journal naming
    another directory for a run passed verify, then stopped rebuild on that directory; a second rebuild overwrote
    ``.damaged``, the only file still holding a run whose directory is gone. Now: such a line is left out as a
    line that is not JSON is; verify names the two directories; rebuild lists the bad one and ingests the rest; each
    rebuild keeps the file it replaces under a name of its own."""
    import duckdb

    config, db = _warehouse_copy(nightlies, tmp_path)
    elsewhere = tmp_path / "not-the-run"
    elsewhere.mkdir()
    with open(db.with_name(db.name + ".journal.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"run_id": "nightly-2", "run_dir": str(nightlies / "nightly-2"), "job": "nightly",
                            "labels": "not a map"}) + "\n")
        f.write(json.dumps({"run_id": "nightly-1", "run_dir": str(elsewhere), "job": "nightly", "labels": {}}) + "\n")
    found = bootprof("--config", str(config), "warehouse", "verify")
    assert found.returncode == 1 and f"the journal names {elsewhere} as its directory" in found.stdout, found.stdout
    first = bootprof("--config", str(config), "warehouse", "rebuild")
    assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr[-2000:]
    assert f"not ingested: {elsewhere}" in first.stdout + first.stderr and "rebuilt" in first.stdout, first.stdout
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT list(run_id ORDER BY run_id) FROM runs").fetchone()[0] == ["nightly-2"]
    finally:
        con.close()
    second = bootprof("--config", str(config), "warehouse", "rebuild")
    assert second.returncode == 0, second.stderr[-2000:]
    kept = sorted(p.name for p in tmp_path.glob("wh.duckdb.damaged*") if not p.name.endswith(".jsonl"))
    assert kept == ["wh.duckdb.damaged", "wh.duckdb.damaged-2"], kept
    con = duckdb.connect(str(tmp_path / "wh.duckdb.damaged"), read_only=True)
    try:      # (the first kept file still holds both runs)
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    finally:
        con.close()


def test_an_ingest_during_a_rebuild_waits_for_it_and_lands_in_the_new_file(tmp_path, nightlies):
    """An ingest while ``warehouse rebuild`` ran once said "ingested run r4", exit 0, and r4 was in neither the
    rebuilt warehouse nor its journal (it went into the file the rebuild replaced); verify found nothing wrong. The
    rebuild now holds the warehouse's writers' lock: held after it ingested the runs, the ingest started then waits
    for it, and lands in the new file."""
    import shutil

    import duckdb

    from tests.helpers import checkpoints

    config, db = _warehouse_copy(nightlies, tmp_path)
    hold, late = tmp_path / "hold", tmp_path / "nightly-4"
    shutil.copytree(nightlies / "nightly-2", late)
    rebuild = subprocess.Popen([sys.executable, "-m", "pipeline", "--config", str(config), "warehouse", "rebuild"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=checkpoints.env(hold, "rebuild.ingested"))
    ingest = None
    try:
        checkpoints.reached(hold, "rebuild.ingested", rebuild)
        ingest = subprocess.Popen([sys.executable, "-m", "pipeline", "--config", str(config), "warehouse", "ingest",
                                   "--run", str(late)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        for line in ingest.stderr:           # (it waits for the rebuild: an event, not a time)
            if "locked by another process; waiting" in line:
                break
        checkpoints.release(hold, "rebuild.ingested")
        out, err = rebuild.communicate(timeout=300)
        assert rebuild.returncode == 0, err[-2000:]
        i_out, i_err = ingest.communicate(timeout=300)
        assert ingest.returncode == 0, i_err[-2000:]
    finally:
        rebuild.kill()
        if ingest is not None:
            ingest.kill()
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = con.execute("SELECT list(run_id ORDER BY run_id) FROM runs").fetchone()[0]
    finally:
        con.close()
    assert runs == ["nightly-1", "nightly-2", "nightly-4"], runs
    assert '"run_id": "nightly-4"' in db.with_name(db.name + ".journal.jsonl").read_text()
    assert not list(tmp_path.glob("*.rebuild-*"))
    verified = bootprof("--config", str(config), "warehouse", "verify")
    assert verified.returncode == 0 and "no problem found" in verified.stdout, verified.stdout


def test_rebuild_prunes_again_and_keeps_a_run_its_journal_missed(tmp_path, nightlies):
    """A rebuild re-ingests runs whole from their directories: it once brought back the detail a prune had taken,
    and dropped a run committed by an ingest killed (kill -9) before its journal line. Now a prune writes a journal
    line of the runs it took, which the rebuild prunes again, and the rebuild also takes the runs the old file holds
    that the journal does not name."""
    import shutil
    import signal

    import duckdb

    from tests.helpers import checkpoints

    config, db = _warehouse_copy(nightlies, tmp_path)
    late, hold = tmp_path / "nightly-5", tmp_path / "hold"
    shutil.copytree(nightlies / "nightly-2", late)
    ingest = subprocess.Popen([sys.executable, "-m", "pipeline", "--config", str(config), "warehouse", "ingest",
                               "--run", str(late), "--job", "nightly"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=checkpoints.env(hold, "ingest.committed"))
    try:
        checkpoints.reached(hold, "ingest.committed", ingest)
        ingest.send_signal(signal.SIGKILL)
        ingest.communicate(timeout=60)
    finally:
        ingest.kill()
    assert '"nightly-5"' not in db.with_name(db.name + ".journal.jsonl").read_text()
    # (nightly-5 is nightly-2's input again, so of that workload nightly-2 is the older run: its detail goes)
    pruned = bootprof("--config", str(config), "warehouse", "prune", "--keep", "1")
    assert pruned.returncode == 0 and "pruned the detail of 1 runs" in pruned.stdout, pruned.stdout + pruned.stderr

    def detail():
        con = duckdb.connect(str(db), read_only=True)
        try:
            return dict(con.execute("SELECT r.run_id, count(q.run_id) FROM runs r LEFT JOIN query_summary q "
                                    "USING (run_id) GROUP BY 1 ORDER BY 1").fetchall())
        finally:
            con.close()

    before = detail()
    assert sorted(before) == ["nightly-1", "nightly-2", "nightly-5"] and before["nightly-2"] == 0, before
    assert before["nightly-1"] > 0 and before["nightly-5"] > 0
    rebuilt = bootprof("--config", str(config), "warehouse", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert "pruned again (as the old file was): 1 runs" in rebuilt.stdout, rebuilt.stdout
    assert detail() == before
    assert '"nightly-5"' in db.with_name(db.name + ".journal.jsonl").read_text()
    again = bootprof("--config", str(config), "warehouse", "rebuild")      # (the new journal remembers the prune)
    assert again.returncode == 0 and "pruned again" in again.stdout and detail() == before, again.stdout
