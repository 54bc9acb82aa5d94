"""The command line (``pipeline/cli.py``): help, one-line errors and exit codes, exit handlers, the status line on a
terminal, Ctrl-C and closed pipes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pipeline.errors import InputError
from pipeline.runs import read_manifest, sha256_tree
from tests.conftest import ROOT


def test_decode_sniff_rejects_unknown_and_short_files(tmp_path):
    from pipeline.decode import classify

    junk = tmp_path / "junk.etl"
    junk.write_bytes(b"\x00" * 4096)
    with pytest.raises(InputError, match=r"junk.etl: not an ETL trace .*0x48"):
        classify([junk])
    short = tmp_path / "short.etl"
    short.write_bytes(b"abc")
    with pytest.raises(InputError, match="short.etl: 3 bytes"):
        classify([short])


def test_cli_help_and_clean_error_exit(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "decode" in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("decode: {colour: 1}\n")
    out = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(bad), "decode", str(bad), "--run", str(tmp_path / "r")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert "bootprof: error:" in out.stderr and "decode.colour" in out.stderr and "Traceback" not in out.stderr


def test_cli_exit_runs_atexit_handlers_flushes_and_waits_for_threads():
    """The CLI ends without the interpreter's teardown (``exit_quickly``), but as the interpreter would
    otherwise: ``atexit`` handlers run, buffered output (stdout is a pipe here) is written, a thread that is
    not a daemon finishes first, and the exit code is the command's."""
    code = ("import atexit, threading, time\n"
            "from pipeline.cli import exit_quickly\n"
            "atexit.register(lambda: print('atexit handler ran'))\n"
            "print('buffered line')\n"
            "if {thread}:\n"
            "    threading.Thread(target=lambda: (time.sleep(0.3), print('thread ended'))).start()\n"
            "exit_quickly(3)\n")
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}      # (as a user's shell runs it)
    out = subprocess.run([sys.executable, "-c", code.format(thread=False)], capture_output=True, text=True, cwd=ROOT,
                         env=buffered)
    assert (out.returncode, out.stdout.split("\n")) == (3, ["buffered line", "atexit handler ran", ""])
    out = subprocess.run([sys.executable, "-c", code.format(thread=True)], capture_output=True, text=True, cwd=ROOT,
                         env=buffered)
    assert out.returncode == 3 and "thread ended" in out.stdout and "atexit handler ran" in out.stdout


def test_cli_decode_with_a_local_cluster_ends_cleanly(tmp_path):
    """A whole command on a real trace, with a local cluster (DuckDB loaded in the CLI process, numba in
    the worker): exit code 0, the complete summary on stdout, the manifest written, nothing on stderr
    (no traceback, no leak report from DuckDB's bindings, no warning from the worker's exit)."""
    from tests.conftest import fixture_path

    cfg = tmp_path / "local.yaml"
    cfg.write_text("cluster: {mode: local, n_workers: 1, memory_limit: 1GiB, inline_below: 0}\n")
    trace = fixture_path("etl/perfview-small/smallEtlFile.etl")
    out = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(cfg), "decode", str(trace), "--run",
                          str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["etl"]["records"] > 0
    manifest = read_manifest(tmp_path / "run", "decoded")
    assert manifest["etl"]["records"] == json.loads(out.stdout)["etl"]["records"]
    assert out.stderr == ""
    # where the wall time went: the decode is the walk, the wait for the cluster (started meanwhile: it takes
    # longer than the walk of this trace) and the partitions
    etl = manifest["etl"]
    assert etl["cluster_wait_s"] > 0 and 0 <= manifest["hash_wait_s"] <= manifest["elapsed_s"]
    assert abs(etl["walk_s"] + etl["cluster_wait_s"] + etl["partitions_s"] - etl["decode_s"]) < 0.003
    assert manifest["inputs"] == [{"path": str(trace.resolve()), "size": trace.stat().st_size,
                                   "sha256_tree": sha256_tree(trace)}]


def _on_a_terminal(args: list[str], stdout_too: bool = False) -> tuple[list[str], bytes]:
    """Run ``python -m pipeline ARGS`` with standard error (and with ``stdout_too`` standard output) on a
    pseudo-terminal; returns what the terminal showed, split at carriage returns, and standard output (else b"").
    The command must succeed."""
    import pty

    terminal, other_side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stderr=other_side, cwd=ROOT,
                            stdout=other_side if stdout_too else subprocess.PIPE)
    os.close(other_side)
    shown = b""
    while True:
        try:
            data = os.read(terminal, 4096)
        except OSError:             # (EIO: the command has ended and closed its side)
            break
        if not data:
            break
        shown += data
    os.close(terminal)
    out = b"" if stdout_too else proc.stdout.read()
    assert proc.wait() == 0, shown.decode()
    return shown.decode().split("\r"), out


def _screen(shown: str) -> list[str]:
    """The rows a terminal shows once it has been sent ``shown``: a carriage return goes back to the start of its
    row, and what follows overwrites it."""
    rows, row, col = [], [], 0
    for ch in shown:
        if ch == "\n":
            rows.append("".join(row).rstrip())
            row, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            row[col:col + 1] = [ch]
            col += 1
    return rows + ["".join(row).rstrip()]


def test_cli_decode_shows_a_status_line_on_a_terminal_and_erases_it(tmp_path):
    """With standard error on a terminal, the decode rewrites one status line in place (bytes of the trace,
    percent, rate; then the joins) and erases it at the end; standard output is the summary alone. (Without
    a terminal standard error stays empty: the test above.)"""
    import re

    from tests.conftest import fixture_path

    cfg = tmp_path / "small-parts.yaml"
    cfg.write_text("cluster: {mode: synchronous}\ndecode: {partition_bytes: 2097152}\n")
    trace = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    lines, out = _on_a_terminal(["--config", str(cfg), "decode", str(trace), "--run", str(tmp_path / "run")])
    size = trace.stat().st_size / 1e9
    progress = [re.match(r"decode: (\d+\.\d\d) of (\d+\.\d\d) GB \((\d+) %\), \d+ MB/s", line) for line in lines]
    assert [float(m.group(2)) for m in progress if m] and all(abs(float(m.group(2)) - size) < 0.01 for m in progress if m)
    assert [m.group(3) for m in progress if m][-1] == "100"
    assert any(line.startswith("decode: ") and "joining" in line for line in lines)
    assert lines[-1] == "" and lines[-2].strip() == ""          # (erased: blanks over the longest line, back to its start)
    assert json.loads(out)["etl"]["records"] > 0


def test_a_job_on_a_terminal_shows_the_stage_that_runs(tmp_path):
    """``bootprof run`` on a terminal: the demo trace being written, then each stage's name while it runs
    (and the decode's bytes and symbolize's symbol files as they are done), all erased before each summary
    line."""
    import re

    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "symbolize": {"cache_dir": str(tmp_path / "c")},
                               "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    lines, out = _on_a_terminal(["--config", str(cfg), "run", str(ROOT / "jobs" / "single-trace.yaml"), "--demo", "--run",
                                 str(tmp_path / "run")])
    shown = [line.strip() for line in lines if line.strip()]
    stages = ["decode", "symbolize", "aggregate", "report", "warehouse"]
    # (aggregate starts beside symbolize, warehouse beside report: one line names both)
    running = ["decode", "symbolize, aggregate", "report, warehouse"]
    # (a stage's own status stands for its "running" while it is shown, which comes back when it closes)
    assert list(dict.fromkeys(line for line in shown if line.endswith(": running"))) == \
        [f"{stage}: running" for stage in running]
    assert any(line.startswith("synth: writing the demo trace") for line in shown)
    assert any(re.fullmatch(r"decode: \d+\.\d\d of \d+\.\d\d GB \(100 %\), \d+ MB/s", line) for line in shown)
    # (symbolize runs beside aggregate: its status is shown beside the job's)
    files = [re.fullmatch(r"symbolize, aggregate: running · symbolize: (\d+) of (\d+) symbol files \((\d+) %\)", line)
             for line in shown]
    assert [m.groups() for m in files if m][-1][2] == "100" and int([m for m in files if m][-1].group(2)) > 10
    assert lines[-1] == "" and lines[-2].strip() == ""
    assert [line.split()[0] for line in out.decode().splitlines()[1:-1]] == ["synth"] + stages


def test_a_job_whose_output_shares_the_terminal_prints_its_lines_above_the_status(tmp_path):
    """Output and status on one terminal, as in an interactive shell: each stage's line is printed above the status
    line, also the line of a stage that ended while the one beside it runs, so that the screen holds the job's lines
    and nothing of a status once it has ended."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "symbolize": {"cache_dir": str(tmp_path / "c")},
                               "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    lines, _ = _on_a_terminal(["--config", str(cfg), "run", str(ROOT / "jobs" / "single-trace.yaml"), "--demo", "--run",
                               str(tmp_path / "run")], stdout_too=True)
    rows = [row for row in _screen("\r".join(lines)) if row]
    assert [row.split()[0] for row in rows] == ["run", "synth", "decode", "symbolize", "aggregate", "report",
                                                "warehouse", "report:"], rows
    assert not [row for row in rows if "running" in row or " · " in row or "symbol files" in row]
    assert "(started beside symbolize)" in rows[4] and "(started beside report)" in rows[6]


def test_set_aside_objects_stay_aside_at_exit_unless_duckdb_is_loaded():
    """A worker keeps its objects out of the collector as it exits (teardown has nothing to scan); a
    process with DuckDB gives them back first (its bindings report objects teardown never finalized)."""
    code = ("import gc, pipeline.cluster.gcpolicy as g\n"
            "g.set_aside_for_good(); gc.unfreeze(); g._at_exit(); print(gc.get_freeze_count() > 0)\n"
            "import duckdb\n"
            "g._at_exit(); print(gc.get_freeze_count())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["True", "0"]
    assert "leaked" not in out.stderr


def test_ctrl_c_during_a_duckdb_query_is_an_interrupt(tmp_path):
    """DuckDB turns a Ctrl-C during its query into its own exception (``RuntimeError('Query interrupted')``): the
    command says 'interrupted' and exits 130, as for any other Ctrl-C, not with a traceback."""
    import threading

    import duckdb

    from pipeline.errors import is_interrupt

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(BaseException) as caught:
            duckdb.connect().execute("SELECT count(*) FROM range(100000000000)").fetchall()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert is_interrupt(caught.value), repr(caught.value)
    assert not is_interrupt(RuntimeError("another error")) and not is_interrupt(ValueError("Query interrupted"))


def test_ctrl_c_while_a_class_is_made_is_an_interrupt():
    """A Ctrl-C or SIGTERM during an import that makes a class with descriptors (DuckDB's, which a stage imports as it
    starts) reaches Python 3.11 in ``__set_name__``, which raises ``RuntimeError`` from it: still an interrupt (the
    SIGTERM test once ended with that traceback and exit 1)."""
    from pipeline.errors import is_interrupt

    class Field:
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signal.SIGINT)     # (the signal arrives here, as it may during an import)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(BaseException) as caught:
            type("Made", (), {"field": Field()})
            signal.pthread_sigmask(signal.SIG_BLOCK, [])      # (a call into C: the handler has run by its return)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert is_interrupt(caught.value), repr(caught.value)
    assert not is_interrupt(RuntimeError("Error calling __set_name__"))


def test_output_to_a_reader_that_went_away_ends_quietly(tmp_path):
    """``bootprof ... | head``: the reader is gone before the command writes. The command ends with 141 (128 +
    SIGPIPE, as a shell reports it) and no traceback."""
    db = tmp_path / "wh.duckdb"
    from pipeline import warehouse

    warehouse.connect(db).close()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "warehouse", "--db", str(db), "query",
                             "SELECT * FROM range(1000)"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()         # (before the command writes: it imports for a while first)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err


def test_a_signal_dropped_inside_a_callback_still_ends_the_command():
    """A SIGTERM that lands while Python runs a callback of its own (here a ``__del__``; seen under load: an import
    lock's weak reference callback) raises there, where Python drops the exception with an "Exception ignored"
    traceback: the command went on, and a CI runner's cancel did nothing. The command's handlers deliver it again
    to the main thread: exit 143, no traceback, nothing after it runs."""
    code = (
        "import os, signal, sys, time\n"
        "from pipeline import cli\n"
        "signal.signal(signal.SIGTERM, cli._terminate)\n"
        "sys.unraisablehook = cli._interrupt_again\n"
        "class Victim:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        sum(range(100_000))          # (the handler runs here, inside __del__)\n"
        "try:\n"
        "    Victim()\n"
        "    for _ in range(500):\n"
        "        time.sleep(0.01)\n"
        "    print('went on')\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(cli._interrupted(''))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143 and "went on" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "bootprof: terminated" in proc.stderr, proc.stderr


def test_output_in_a_code_page_without_the_characters_is_escaped_not_a_crash(tmp_path):
    """A pipe on Windows takes the ANSI code page: a path or a name it cannot write (here Ω in cp1252) once ended the
    command with a UnicodeEncodeError traceback, in the middle of its error line."""
    run = tmp_path / "Ωrun"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "run", "jobs/single-trace.yaml", "--run", str(run)],
                          cwd=ROOT, capture_output=True, env=dict(os.environ, PYTHONIOENCODING="cp1252"), timeout=120)
    err = proc.stderr.decode("cp1252")
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert f"{str(run).replace('Ω', chr(92) + 'u03a9')}: nothing to analyse" in err
