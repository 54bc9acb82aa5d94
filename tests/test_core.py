"""The core: config validation, run directories and atomic stage outputs, the dask pool, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pipeline.config import load_config, load_job, parse_size
from pipeline.errors import ConfigError, InputError, ManifestError
from pipeline.runs import SCHEMA_VERSION, read_manifest, read_table, sha256_tree, stage_output
from tests.conftest import ROOT


def test_default_config_file_matches_model_defaults():
    assert load_config(ROOT / "configs" / "default.yaml").resolved() == load_config(None).resolved()


def test_every_job_file_is_valid():
    jobs = sorted((ROOT / "jobs").glob("*.yaml"))
    assert jobs
    for job in jobs:
        load_job(job)


def test_config_error_names_file_key_line_and_expectation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  mode: local\ndecode:\n  partition_bytes: lots\n  colour: blue\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    msg = str(err.value)
    assert f"{bad}:4: decode.partition_bytes" in msg and "integer" in msg and "'lots'" in msg
    assert f"{bad}:5: decode.colour: Extra inputs are not permitted" in msg


def test_sizes_are_checked_when_the_config_is_loaded(tmp_path):
    """Size settings fail at load time with the file, line and key, not later inside DuckDB or dask."""
    bad = tmp_path / "sizes.yaml"
    bad.write_text("cluster:\n  memory_limit: lots\ndecode:\n  join_memory_limit: 300KB\nsynth:\n  size: 1 parsec\n"
                   "aggregate:\n  memory_limit: 1MB\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    msg = str(err.value)
    assert f"{bad}:2: cluster.memory_limit: not a size: 'lots'" in msg
    assert f"{bad}:4: decode.join_memory_limit: at least 32 MiB (got '300KB')" in msg
    assert f"{bad}:6: synth.size: not a size: '1 parsec'" in msg
    assert f"{bad}:8: aggregate.memory_limit: at least 32 MiB (got '1MB')" in msg
    good = tmp_path / "good.yaml"
    good.write_text("cluster:\n  memory_limit: auto\ndecode:\n  join_memory_limit: 1.5GB\nsynth:\n  size: 64MiB\n")
    assert load_config(good).decode.join_memory_limit == "1.5GB"


def test_address_mode_runs_tasks_on_a_running_scheduler(dask_pool):
    """cluster.mode 'address': the tasks go to the scheduler at that address (the session's cluster)."""
    import os

    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    address = dask_pool.client.scheduler.address
    with connect(ClusterConfig(mode="address", address=address)) as pool:
        assert pool.n_workers == 2
        pids = set(pool.map(_pid, range(8)))
    assert os.getpid() not in pids and pids <= set(dask_pool.client.run(os.getpid).values())


def _pid(_):
    import os

    return os.getpid()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:notaport", "scheduler-without-port", "udp://127.0.0.1:8786"])
def test_a_bad_scheduler_address_is_a_config_error(address):
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    with pytest.raises(ConfigError, match=f"cluster.address '{address}': cannot connect to a dask scheduler"):
        with connect(ClusterConfig(mode="address", address=address)):
            pass


def test_config_error_on_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("cluster: [\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="nope.yaml: cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_parse_size():
    assert parse_size("1GB") == 10**9
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1000") == 1000
    with pytest.raises(ConfigError):
        parse_size("big")


def _table():
    import pyarrow as pa

    return pa.table({"x": pa.array([1, 2, 3], pa.int64())})


def test_stage_output_is_atomic_and_keeps_previous_output_on_failure(tmp_path):
    with stage_output(tmp_path, "decoded", config={"a": 1}) as out:
        out.write_table("t", _table())
        out.manifest["note"] = "first"
        assert not (tmp_path / "decoded").exists()  # nothing visible until the stage finishes
    first = read_manifest(tmp_path, "decoded")
    assert first["tables"] == {"t": 3} and first["note"] == "first"
    assert first["schema_version"] == SCHEMA_VERSION and len(first["config_hash"]) == 64

    with pytest.raises(RuntimeError):
        with stage_output(tmp_path, "decoded") as out:
            out.write_table("t", _table().slice(0, 1))
            raise RuntimeError("interrupted")
    assert read_manifest(tmp_path, "decoded")["note"] == "first"
    assert read_table(tmp_path, "decoded", "t").num_rows == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_reader_refuses_newer_schema_and_missing_stage(tmp_path):
    with pytest.raises(ManifestError, match="no finished 'decoded' output"):
        read_manifest(tmp_path, "decoded")
    with stage_output(tmp_path, "decoded") as out:
        out.write_table("t", _table())
    path = tmp_path / "decoded" / "_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="newer than this bootprof"):
        read_manifest(tmp_path, "decoded")


def _square(x, offset=0):
    import os

    return x * x + offset, os.getpid()


def test_pool_runs_tasks_on_real_worker_processes(dask_pool):
    import os

    results = dask_pool.map(_square, range(8), offset=1)
    assert [r[0] for r in results] == [x * x + 1 for x in range(8)]
    assert os.getpid() not in {r[1] for r in results}
    assert dask_pool.n_workers == 2


def _size_of(x, shared):
    return x + sum(len(v["text"]) for v in shared.values())


def test_pool_passes_large_shared_arguments(dask_pool):
    """A keyword argument shared by every task may be large (the metadata of a build's self-profiles): 200 kB
    here, past the 64 kB where distributed would make it a task of its own and fail to send it."""
    shared = {i: {"text": "x" * 2000, "n": i} for i in range(100)}
    assert dask_pool.map(_size_of, [1, 2, 3], shared=shared) == [200_001, 200_002, 200_003]
    assert dask_pool.map(_square, [3], offset="y" * 10_000 and 2)[0][0] == 11


def test_a_lazy_pool_starts_its_cluster_when_a_task_needs_it():
    """``connect(lazy=True)``: no cluster until the first task (or the worker count) needs one; then a real
    one, closed with the context. A bad scheduler address fails at that first need, and again at the next:
    tasks never fall back to running in this process."""
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"), lazy=True) as pool:
        pool.set_aside()
        assert pool.map(_square, []) == [] and not pool.started
        results = pool.map(_square, [2, 3])
        assert pool.started and [r[0] for r in results] == [4, 9] and os.getpid() not in {r[1] for r in results}
        assert pool.n_workers == 1
        client = pool.client
    assert client.status == "closed"
    bad = "tcp://127.0.0.1:notaport"
    with connect(ClusterConfig(mode="address", address=bad), lazy=True) as pool:
        for _ in range(2):
            with pytest.raises(ConfigError, match="cannot connect to a dask scheduler"):
                pool.map(_square, [1])
        assert not pool.started


@pytest.mark.timeout(180)
def test_a_background_pool_starts_beside_the_caller_and_ends_with_the_context(dask_pool):
    """``connect(background=True)``: the context is entered before the cluster is up (a thread starts it); the
    first task, or ``ready()``, waits for it; results arrive as they finish while another client (the session's,
    ``dask_pool``) stays this thread's current one (``Pool.map`` tracks its futures on its own client's loop).
    The thread ends the cluster with the context."""
    import threading

    from distributed import default_client

    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    other = dask_pool.client
    with other.as_current():
        with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"), background=True) as pool:
            assert not pool.started and any(t.name == "bootprof-cluster" for t in threading.enumerate())
            pool.ready()
            assert pool.started and default_client() is other
            seen = []
            results = pool.map(_slow_square, range(4), on_result=lambda r: seen.append(r["x"]))
            assert [r["square"] for r in results] == [0, 1, 4, 9] and sorted(seen) == [0, 1, 2, 3]
            client = pool.client
        assert client.status == "closed"
        assert not any(t.name == "bootprof-cluster" for t in threading.enumerate())


def _slow_square(x):
    import time

    time.sleep(0.05 * (x % 3))
    return {"x": x, "square": x * x, "extra": [x] * 3}


@pytest.mark.parametrize("inline", [False, True])
def test_pool_hands_each_result_over_as_it_arrives(dask_pool, inline):
    """``on_result`` sees every result once, as it finishes (workers and inline), may take parts of it,
    and the list still comes back in the order of the items."""
    from pipeline.cluster import Pool

    pool = Pool(None) if inline else dask_pool
    seen = []
    results = pool.map(_slow_square, range(9), on_result=lambda r: seen.append((r["x"], r.pop("extra"))))
    assert [r["square"] for r in results] == [x * x for x in range(9)]
    assert sorted(seen) == [(x, [x] * 3) for x in range(9)]
    assert all("extra" not in r for r in results)


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


def test_the_content_hash_is_the_sha256_of_the_pieces_sha256s(tmp_path):
    """``sha256_tree`` against hashlib on the pieces, on one thread and on several, at piece edges; and
    against ``sha256sum`` of ``split``, as the docstring says to check it in a shell."""
    import hashlib

    data = os.urandom(1000)
    for n in (0, 1, 99, 100, 101, 1000):
        path = tmp_path / f"f{n}"
        path.write_bytes(data[:n])
        want = hashlib.sha256(b"".join(hashlib.sha256(data[i:min(i + 100, n)]).digest()
                                       for i in range(0, n, 100))).hexdigest()
        assert sha256_tree(path, piece=100, threads=1) == want
        assert sha256_tree(path, piece=100, threads=4) == want
    big = tmp_path / "big"
    big.write_bytes(os.urandom((64 << 20) + 12345))
    # (coreutils alone, always there: it once used xxd and skipped itself where xxd was missing)
    shell = subprocess.run(f"split -b 64M --filter='sha256sum | head -c64 | tr a-f A-F | basenc --base16 -d' {big} "
                           "| sha256sum", shell=True, capture_output=True, text=True, check=True).stdout.split()[0]
    assert sha256_tree(big) == shell


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
    lines, out = _on_a_terminal(["--config", str(cfg), "run", str(ROOT / "jobs" / "single-trace.yaml"), "--run",
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
    lines, _ = _on_a_terminal(["--config", str(cfg), "run", str(ROOT / "jobs" / "single-trace.yaml"), "--run",
                               str(tmp_path / "run")], stdout_too=True)
    rows = [row for row in _screen("\r".join(lines)) if row]
    assert [row.split()[0] for row in rows] == ["run", "synth", "decode", "symbolize", "aggregate", "report",
                                                "warehouse", "report:"], rows
    assert not [row for row in rows if "running" in row or " · " in row or "symbol files" in row]
    assert "(started beside symbolize)" in rows[4] and "(started beside report)" in rows[6]


def _log_as_distributed_worker(_item):
    """A task: log what distributed logs when a heartbeat meets a closing scheduler, and another error."""
    import logging

    log = logging.getLogger("distributed.worker")
    try:
        raise OSError("stream closed")
    except OSError:
        log.exception("Failed to communicate with scheduler during heartbeat.")
        log.exception("another worker error")
    return True


def test_local_workers_keep_quiet_about_a_closing_scheduler():
    """A local worker drops the heartbeat error that distributed logs (with a traceback) when the cluster
    closes during a heartbeat, and logs every other error as before: on stderr, which a worker shares
    with the command."""
    code = ("from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_core import _log_as_distributed_worker\n"
            "if __name__ == '__main__':\n"
            "    with connect(ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')) as pool:\n"
            "        print(pool.map(_log_as_distributed_worker, [None]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[True]", out.stderr
    assert "another worker error" in out.stderr
    assert "heartbeat" not in out.stderr


def _sigint_self(_item) -> int:
    """A task: send this worker a SIGINT (as a Ctrl-C at the terminal does), then say which process it is."""
    import time

    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    return os.getpid()


def test_local_workers_leave_ctrl_c_to_the_command():
    """A Ctrl-C reaches every process of the command's group: a local worker ignores it (the command ends and
    closes its cluster), instead of dying with a traceback beside the command's own 'interrupted'."""
    code = ("from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_core import _sigint_self\n"
            "if __name__ == '__main__':\n"
            "    with connect(ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')) as pool:\n"
            "        first = pool.map(_sigint_self, [None])\n"
            "        print(first == pool.map(_sigint_self, [None]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr       # (the same worker, twice)
    assert "KeyboardInterrupt" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_set_aside_objects_stay_aside_at_exit_unless_duckdb_is_loaded():
    """A worker keeps its objects out of the collector as it exits (teardown has nothing to scan); a
    process with DuckDB gives them back first (its bindings report objects teardown never finalized)."""
    code = ("import gc, pipeline.warmup as w\n"
            "w.set_aside(); gc.unfreeze(); w._at_exit(); print(gc.get_freeze_count() > 0)\n"
            "import duckdb\n"
            "w._at_exit(); print(gc.get_freeze_count())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["True", "0"]
    assert "leaked" not in out.stderr


def _warm_state(_item):
    """A task: whether this worker has loaded the kernels, and whether its warm-up thread still runs."""
    import sys
    import threading

    kernels = sys.modules.get("pipeline.decode.etl.kernels")
    loaded = len(kernels.group_by_code.overloads) if kernels is not None and hasattr(kernels, "group_by_code") else 0
    return loaded, any(t.name == "bootprof-warm-up" for t in threading.enumerate())


def test_workers_load_the_stages_kernels_before_the_first_task():
    """A local worker imports the warm-up modules and loads their cached numba kernels on its own, and the
    pool's first map sends its task only once it has: the task finds the warm-up ended."""
    import numpy as np

    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig
    from pipeline.decode.etl import kernels as K

    K.group_by_code(np.zeros(4, np.int32), 1)           # compiled and cached by this process at least once
    with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"),
                 warm_up=["pipeline.decode.etl.kernels"]) as pool:
        [(loaded, running)] = pool.map(_warm_state, [None])
    assert loaded >= 1, "the worker did not load the cached kernels"
    assert not running, "a task ran while the worker's warm-up still ran"


def test_warm_up_loads_only_cached_code_and_survives_bad_names(tmp_path):
    """In a fresh process: every overload loaded comes from the cache (nothing is compiled), and a module
    that does not exist is skipped."""
    import subprocess
    import sys

    code = ("import numba.core.dispatcher as d, pipeline.warmup as w\n"
            "compiled = []\n"
            "d._FunctionCompiler._compile_core = lambda self, *a: compiled.append(a) or (False, None)\n"
            "print(w.warm_up(['pipeline.no_such_module', 'pipeline.decode.etl.kernels']), len(compiled))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded, compiled = map(int, out.stdout.split())
    assert loaded >= 1 and compiled == 0


def test_kernels_that_python_calls_are_public():
    """Warm-up (workers) loads the kernels a module exports and skips the private ones, which only other kernels call
    and whose cached code holds them. A private kernel called from Python was loaded in every command instead:
    symbolize's image lookup, 0.09 s of each `bootprof symbolize`."""
    import ast

    def jitted(fn: ast.FunctionDef) -> bool:
        names = [(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]
        return any((n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")) in ("njit", "jit") for n in names)

    found = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        private = {f.name for f in functions if jitted(f) and f.name.startswith("_")}
        for f in functions:
            if not jitted(f):
                found += [f"{path.relative_to(ROOT)}: {f.name} calls {n.id}" for n in ast.walk(f)
                          if isinstance(n, ast.Name) and n.id in private]
    assert not found, found


def test_worker_modules_do_not_import_the_config():
    """What a decode worker imports (the stages' WARM_UP) stays free of the CLI's config layer (pydantic):
    a worker imports it as it starts, and a heavier import made its first tasks wait (0.2-0.4 s a run)."""
    from pipeline.decode import WARM_UP

    code = ("import sys\n" + "".join(f"import {m}\n" for m in WARM_UP)
            + "print(sorted(m for m in ('pipeline.config', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def _fork_state(_item):
    """A task: this worker's parent, the process that warmed each module up, and whether the kernels are loaded."""
    import os
    import sys

    from pipeline import warmup

    kernels = sys.modules.get("pipeline.decode.etl.kernels")
    loaded = len(kernels.group_by_code.overloads) if kernels is not None else 0
    return os.getppid(), os.getpid(), dict(warmup._warmed), loaded


def test_local_workers_are_forked_warm_from_one_server():
    """Local workers are forked from a server that imported the warm-up modules and loaded their kernels
    once: each worker (of two) has them before its first task without warming up itself, and both have the
    same parent, which is not the process that started the cluster."""
    code = ("import os\n"
            "from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_core import _fork_state\n"
            "if __name__ == '__main__':\n"
            "    import numpy as np\n"
            "    from pipeline.decode.etl import kernels as K\n"
            "    K.group_by_code(np.zeros(4, np.int32), 1)\n"     # (compiled and cached at least once)
            "    with connect(ClusterConfig(mode='local', n_workers=2, memory_limit='1GiB'),\n"
            "                 warm_up=['pipeline.decode.etl.kernels']) as pool:\n"
            "        print(repr((os.getpid(), pool.map(_fork_state, [0, 1, 2, 3]))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    client, states = eval(out.stdout)      # noqa: S307 - our own repr
    parents = {ppid for ppid, _, _, _ in states}
    assert len(parents) == 1 and client not in parents, states
    assert len({pid for _, pid, _, _ in states}) == 2, "expected the tasks on both workers"
    for ppid, pid, warmed, loaded in states:
        assert warmed.get("pipeline.decode.etl.kernels") == ppid, f"worker {pid} warmed the kernels itself: {warmed}"
        assert loaded >= 1


def _environment(_item):
    import os

    return os.environ.get("BOOTPROF_TEST_PROBE"), os.environ.get("MIMALLOC_PURGE_DELAY")


def test_forked_workers_see_the_environment_of_their_cluster_start():
    """A worker forked from a server started for an earlier cluster still gets this process's environment as
    it is when its own cluster starts (as a spawned worker would), and the workers' own settings."""
    code = ("import os\n"
            "from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_core import _environment\n"
            "if __name__ == '__main__':\n"
            "    cfg = ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')\n"
            "    with connect(cfg) as pool:\n"
            "        print(pool.map(_environment, [0]))\n"
            "    os.environ['BOOTPROF_TEST_PROBE'] = 'set later'\n"
            "    with connect(cfg) as pool:\n"
            "        print(pool.map(_environment, [0]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[(None, '1000')]", "[('set later', '1000')]"], out.stdout


def _burn_cpu(seconds):
    import time

    # (CPU time, not wall time: on a loaded machine a wall-clock second held 0.896 s of CPU, and the check below
    # failed although nothing was wrong)
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return True


def test_the_fork_server_and_its_workers_are_waited_for():
    """At exit the process waits for the fork server, which waited for its workers: their CPU time is the
    process's children's (what the benchmarks add up), and nothing is left running."""
    code = ("import resource\n"
            "from pipeline import cluster\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_core import _burn_cpu\n"
            "if __name__ == '__main__':\n"
            "    with cluster.connect(ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')) as pool:\n"
            "        pool.map(_burn_cpu, [1.0])\n"
            "    before = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "    cluster._stop_fork_server()\n"         # (what exiting does: an atexit handler)
            "    after = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "    print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) >= 0.9      # (the task's second, on a core of its own when the machine is idle)


def test_small_inputs_run_in_process_without_a_cluster(tmp_path):
    """Below cluster.inline_below (64MB) a local cluster is not started: the tasks run in this process; at or
    above it, or with inline_below 0, the cluster starts; other modes are as configured."""
    from pipeline.cluster import connect, runs_inline
    from pipeline.sources import input_bytes
    from pipeline.config import ClusterConfig
    from tests.conftest import fixture_path

    small = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    size = input_bytes([small, fixture_path("selfprofile/workspace-clean")])
    assert size == small.stat().st_size + sum(p.stat().st_size for p in
                                              fixture_path("selfprofile/workspace-clean").rglob("*.mm_profdata"))
    local = ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB")
    assert runs_inline(local, size) and not runs_inline(local, 64_000_000) and not runs_inline(local, None)
    assert not runs_inline(local.model_copy(update={"inline_below": "0"}), 1)
    assert not runs_inline(ClusterConfig(mode="address", address="tcp://127.0.0.1:1"), 1)
    with connect(local, size=size) as pool:
        assert pool.client is None and pool.map(abs, [-1, -2]) == [1, 2]
    with connect(local.model_copy(update={"inline_below": "0"}), size=size) as pool:
        assert pool.client is not None and pool.map(abs, [-3]) == [3]


def test_stages_size_their_workers_by_what_they_hand_them(tmp_path):
    """The aggregate and report stages hand workers only the self-profiles' sections (the ETL trace's run in
    DuckDB in the stage's process): their cluster is sized by the self-profiles' bytes, not by the trace's."""
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.runs import decoded_input_bytes, self_profile_bytes
    from tests.conftest import fixture_path

    trace = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    profiles = fixture_path("selfprofile/workspace-clean")
    assert self_profile_bytes(tmp_path / "none") is None
    decode.run(tmp_path / "both", Config(), Pool(None), inputs=[trace, profiles])
    profile_bytes = sum(p.stat().st_size for p in profiles.rglob("*.mm_profdata"))
    assert self_profile_bytes(tmp_path / "both") == profile_bytes
    assert decoded_input_bytes(tmp_path / "both") == profile_bytes + trace.stat().st_size
    decode.run(tmp_path / "etl", Config(), Pool(None), inputs=[trace])
    assert self_profile_bytes(tmp_path / "etl") == 0


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
