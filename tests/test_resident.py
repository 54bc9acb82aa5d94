"""The resident cluster (``cluster.mode: resident``, ``bootprof cluster``): a real server process with real dask
workers on loopback, started by the first command that needs it and used by the next ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import resident
from pipeline.cluster import connect
from pipeline.config import ClusterConfig
from pipeline.errors import ConfigError
from tests.conftest import ROOT, assert_same_tables


def _cfg(tmp_path: Path, **kw) -> ClusterConfig:
    return ClusterConfig(**{"mode": "resident", "n_workers": 1, "memory_limit": "2GiB",
                            "resident_dir": str(tmp_path / "clusters"), "resident_idle_s": 120.0, **kw})


def _gone(pid: int, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not resident.pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def _worker_pids(pool) -> set[int]:
    return set(pool.map(lambda _: os.getpid(), range(4)))


def _cli(cfg: ClusterConfig, tmp_path: Path, *args: str) -> str:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"cluster": cfg.model_dump()}))
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(path), "cluster", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_resident_cluster_outlives_the_command_and_serves_the_next(tmp_path):
    """The first connect starts the server (state file with its address and pid); the second finds it: the same
    scheduler, the same warm worker process. `bootprof cluster status` lists it, `stop` ends it and removes its
    state file."""
    cfg = _cfg(tmp_path)
    with connect(cfg, warm_up=["pipeline.decode.etl.kernels"]) as pool:
        first = pool.client.scheduler.address
        workers = _worker_pids(pool)
        # (the worker warmed up the decoder before its first task)
        assert all(pool.client.run(lambda: "pipeline.decode.etl.kernels" in sys.modules).values())
    state = json.loads((tmp_path / "clusters" / f"{resident.key(cfg)}.json").read_text())
    assert state["address"] == first and state["settings"]["n_workers"] == 1
    assert resident.pid_alive(state["pid"]) and state["pid"] != os.getpid()
    # (TLS with the cluster's own certificate, in a file only this user reads: no other local user gets in)
    assert first.startswith("tls://127.0.0.1:")
    assert (tmp_path / "clusters" / f"{resident.key(cfg)}.json").stat().st_mode & 0o077 == 0
    from distributed import Client
    from distributed.security import Security

    with pytest.raises(OSError):       # (a certificate of another authority: the scheduler refuses it)
        Client(first, timeout="3s", security=Security.temporary())
    with connect(cfg) as pool:
        assert pool.client.scheduler.address == first
        assert _worker_pids(pool) == workers
    out = _cli(cfg, tmp_path, "status")
    assert first in out and "this code and config" in out
    assert "stopped" in _cli(cfg, tmp_path, "stop")
    assert _gone(state["pid"])
    assert not (tmp_path / "clusters" / f"{resident.key(cfg)}.json").exists()
    assert "no resident cluster runs" in _cli(cfg, tmp_path, "status")
    # (the commands' connections left no warning in the server's log; the foreign certificate's refusal did)
    warnings = [line for line in Path(state["log"]).read_text().splitlines() if "WARNING" in line]
    assert warnings and all("unknown ca" in line for line in warnings), warnings


def test_an_idle_resident_cluster_ends_by_itself(tmp_path):
    cfg = _cfg(tmp_path, resident_idle_s=1.0)
    with connect(cfg) as pool:
        assert pool.map(abs, [-1]) == [1]
        # (busy while a command is connected, however long: here 3 idle seconds)
        time.sleep(3)
        pid = json.loads((tmp_path / "clusters" / f"{resident.key(cfg)}.json").read_text())["pid"]
        assert resident.pid_alive(pid)
        assert pool.map(abs, [-2]) == [2]
    assert _gone(pid)
    assert not (tmp_path / "clusters" / f"{resident.key(cfg)}.json").exists()


def test_a_stale_state_file_starts_a_new_cluster(tmp_path):
    """A state file whose server is gone (killed, the machine restarted) is replaced, and so is one whose pid is now
    another process's."""
    cfg = _cfg(tmp_path)
    d = tmp_path / "clusters"
    d.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    state = d / f"{resident.key(cfg)}.json"
    state.write_text(json.dumps({"address": "tcp://127.0.0.1:1", "pid": dead.pid}))
    with connect(cfg) as pool:
        assert pool.map(abs, [-3]) == [3]
        pid = json.loads(state.read_text())["pid"]
        assert pid != dead.pid
    resident.stop(json.loads(state.read_text()))
    assert _gone(pid)
    # alive but not a server (this test's own process): a new cluster starts
    state.write_text(json.dumps({"address": "tcp://127.0.0.1:1", "pid": os.getpid()}))
    with connect(cfg) as pool:
        assert pool.map(abs, [-4]) == [4]
        pid = json.loads(state.read_text())["pid"]
        assert pid != os.getpid()
        # (the log is this server's alone: the earlier starts of the key are not in it)
        assert (d / f"{resident.key(cfg)}.log").read_text().count(" at tls://") == 1
    for s in resident.running(cfg):
        resident.stop(s)
    assert _gone(pid)


def test_other_settings_or_code_are_another_cluster(tmp_path, monkeypatch):
    one, two = _cfg(tmp_path), _cfg(tmp_path, n_workers=2)
    assert resident.key(one) != resident.key(two)
    assert resident.key(one) == resident.key(_cfg(tmp_path, resident_idle_s=5.0))    # (not a worker setting)
    before = resident.key(one)
    monkeypatch.setattr(resident, "code_fingerprint", lambda: "other code")
    assert resident.key(one) != before


def test_a_server_that_cannot_start_is_an_error_naming_its_log(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    monkeypatch.setattr(resident.sys, "executable", "/bin/false")
    with pytest.raises(resident.ClusterError, match=r"did not start \(exit status 1\); .*\.log"):
        with connect(cfg):
            pass


def test_the_pipeline_on_a_resident_cluster_equals_a_local_run(tmp_path):
    """`bootprof run` on a resident cluster, started from another working directory, with relative paths: every
    table it decodes, symbolizes and aggregates equals that of the same job run in this process; a second run
    finds the same cluster."""
    from pipeline import synth
    from pipeline.config import SynthConfig

    trace = tmp_path / "input" / "build.etl"
    synth.run(trace, SynthConfig(seed=9, size="6MB", cpus=3))
    cfg = _cfg(tmp_path, n_workers=2)
    (tmp_path / "elsewhere").mkdir()
    _cli(cfg, tmp_path / "elsewhere", "start")
    job = str(ROOT / "jobs" / "single-trace.yaml")
    runs = {}
    try:
        for mode in ("resident", "synchronous", "resident"):
            cluster = cfg.model_dump() if mode == "resident" else {"mode": mode}
            conf = tmp_path / f"{mode}.yaml"
            conf.write_text(json.dumps({"cluster": cluster, "symbolize": {"cache_dir": f"c-{mode}"},
                                        "warehouse": {"path": str(tmp_path / f"wh-{mode}.duckdb")}}))
            runs[mode] = tmp_path / mode
            proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(conf), "run", job, "--run", mode,
                                   "--force", "--trace", "input/build.etl", "--trace", "input/selfprofile",
                                   "--symbol-path", "input/symbols"],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=600,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
            assert proc.returncode == 0, proc.stderr[-3000:]
        states = resident.running(cfg)
        assert len(states) == 1 and states[0]["current"]
    finally:
        for s in resident.running(cfg):
            resident.stop(s)
    compared = sum(assert_same_tables(runs["synchronous"] / stage, runs["resident"] / stage, ignore=("path", "file"))
                   for stage in ("decoded", "symbolized", "aggregated"))
    assert compared >= 45
    assert (runs["resident"] / "report" / "index.html").exists()


def test_a_resident_dir_that_cannot_be_made_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    cfg = ClusterConfig(mode="resident", resident_dir=str(tmp_path / "file" / "clusters"))
    with pytest.raises(ConfigError, match=r"cluster.resident_dir '.*file/clusters': cannot create it"):
        with connect(cfg):
            pass
