"""The command server (``bootprof server``, :mod:`pipeline.server`, :mod:`pipeline.front`): a real server process
started by the CLI, real ``bootprof`` commands handed to it, their outputs against the same commands run in their
own process (``BOOTPROF_SERVER=off``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_same_tables, fixture_path

TRACE = fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BOOTPROF_SERVER"}
    return {**env, "BOOTPROF_SERVER_DIR": str(tmp_path / "servers"), **extra}


def _bootprof(env: dict[str, str], *args: str, cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, **kw)


def _state(tmp_path: Path) -> dict:
    states = [json.loads(p.read_text()) for p in (tmp_path / "servers").glob("*.json")]
    assert len(states) == 1, states
    return states[0]


def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _long_command(env: dict[str, str], state: dict, out: Path, **popen) -> tuple[subprocess.Popen, int]:
    """A long command (a 4 GB synth into ``out``) handed to the server of ``state``: its client and the command's
    pid, once the command runs (its output directory has a file: past its start)."""
    args = [sys.executable, "-m", "pipeline", "synth", "--out", str(out / "t.etl"), "--size", "4GB"]
    client = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              **popen)
    deadline = time.monotonic() + 60
    while not (out.exists() and any(out.iterdir())) or not _children(state["pid"]):
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.05)
    return client, _children(_children(state["pid"])[0])[0]


@pytest.fixture
def server(tmp_path):
    env = _env(tmp_path)
    proc = _bootprof(env, "server", "start", "--idle", "600")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("started: pid"), proc.stdout
    state = _state(tmp_path)
    yield env, state
    _bootprof(env, "server", "stop", "--all")
    assert _gone(state["pid"])


def _summary(stdout: str) -> dict:
    """A decode's printed summary without its timings."""
    etl = json.loads(stdout)["etl"]
    return {k: v for k, v in etl.items() if not k.endswith("_s") and k not in ("mb_per_s", "join_phases_s")}


def test_a_command_on_the_server_does_what_it_does_in_its_own_process(server, tmp_path):
    """The same tables, the same summary on stdout, the same errors and exit statuses; paths relative to the
    client's directory, the client's umask."""
    env, state = server
    work = tmp_path / "work"
    work.mkdir()
    old = os.umask(0o027)
    try:
        served = _bootprof(env, "decode", str(TRACE), "--run", "served", cwd=work)
    finally:
        os.umask(old)
    assert served.returncode == 0, served.stderr
    assert _state(tmp_path)["served"] == 1        # (it went through the server)
    local = _bootprof({**env, "BOOTPROF_SERVER": "off"}, "decode", str(TRACE), "--run", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    assert _state(tmp_path)["served"] == 1        # (and this one did not)
    assert assert_same_tables(work / "served" / "decoded", tmp_path / "local" / "decoded") > 5
    assert _summary(served.stdout) == _summary(local.stdout)
    assert (work / "served").stat().st_mode & 0o007 == 0

    for args in (["decode", str(tmp_path / "missing.etl"), "--run", str(tmp_path / "r")], ["decode"],
                 ["--version"]):
        on, off = _bootprof(env, *args), _bootprof({**env, "BOOTPROF_SERVER": "off"}, *args)
        assert (on.returncode, on.stdout, on.stderr) == (off.returncode, off.stdout, off.stderr), args
    assert _state(tmp_path)["served"] == 4
    # (other settings that act at import time: another server's, so this one does not run it)
    other = _bootprof({**env, "NUMBA_BOUNDSCHECK": "0"}, "--version")
    assert other.returncode == 0 and _state(tmp_path)["served"] == 4
    status = _bootprof(env, "server", "status")
    assert f"pid {state['pid']}" in status.stdout and "4 commands" in status.stdout
    assert "this code and environment" in status.stdout


def test_ctrl_c_reaches_the_command_and_a_vanished_client_ends_it(server, tmp_path):
    env, state = server
    client, _ = _long_command(env, state, tmp_path / "synth")
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=120)
    assert client.returncode == 130 and "bootprof: interrupted" in err, err
    assert not (tmp_path / "synth" / "t.etl").exists()

    client, command = _long_command(env, state, tmp_path / "again")
    handler = _children(state["pid"])[0]
    client.kill()
    client.wait()
    assert _gone(command) and _gone(handler)


def test_which_commands_go_to_a_server():
    from pipeline import front

    assert front._subcommand(["decode", "x.etl"]) == "decode"
    assert front._subcommand(["--config", "server", "-v", "server", "stop"]) == "server"   # (never served)
    assert front._subcommand(["-vv", "--config=c.yaml", "run", "jobs/x.yaml"]) == "run"
    assert front._subcommand(["--version"]) is None and front._subcommand([]) is None


def test_a_server_gone_leaves_the_commands_to_their_own_process(tmp_path):
    """A server killed where it stood leaves its socket and state behind: commands run in their own process, and
    `server status` removes what it left."""
    env = _env(tmp_path)
    assert _bootprof(env, "server", "start", "--idle", "600").returncode == 0
    state = _state(tmp_path)
    os.kill(state["pid"], signal.SIGKILL)
    assert _gone(state["pid"])
    assert Path(state["socket"]).exists()
    proc = _bootprof(env, "decode", str(TRACE), "--run", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "decoded" / "samples.parquet").exists()
    assert "no command server runs" in _bootprof(env, "server", "status").stdout
    assert not Path(state["socket"]).exists()


def test_an_idle_server_ends_by_itself(tmp_path):
    env = _env(tmp_path)
    assert _bootprof(env, "server", "start", "--idle", "1").returncode == 0
    state = _state(tmp_path)
    assert _bootprof(env, "--version").returncode == 0
    assert _gone(state["pid"])
    assert not list((tmp_path / "servers").glob("*.json")) and not Path(state["socket"]).exists()
    assert "ended: 1 commands served" in Path(state["log"]).read_text()


def test_a_server_whose_code_changed_ends(tmp_path):
    """A server whose code changed on disk can serve no one (a client's key names the new code): it ends within
    seconds (``server.CODE_CHECK_S``) instead of idling for an hour. Here on a copy of the package, which the test
    may change."""
    import shutil

    from pipeline import server

    copy = tmp_path / "code"
    shutil.copytree(ROOT / "pipeline", copy / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**_env(tmp_path), "PYTHONPATH": str(copy)}
    proc = _bootprof(env, "server", "start", "--idle", "600", cwd=copy)
    assert proc.returncode == 0, proc.stderr
    state = _state(tmp_path)
    time.sleep(server.CODE_CHECK_S + 1)
    assert not _gone(state["pid"], within=0.1)         # (unchanged code: it stays)
    source = copy / "pipeline" / "errors.py"
    source.write_text(source.read_text() + "\n# changed\n")
    assert _gone(state["pid"], within=server.CODE_CHECK_S + 20)
    assert "its code changed on disk" in Path(state["log"]).read_text()
    assert not list((tmp_path / "servers").glob("*.json")) and not Path(state["socket"]).exists()


def test_ctrl_z_stops_the_command_with_its_client(server, tmp_path):
    """Ctrl-Z (SIGTSTP to the client) stops the command too, and SIGCONT (the shell's fg/bg) resumes both."""
    env, state = server
    client, command = _long_command(env, state, tmp_path / "synth")

    def run_state(pid: int) -> str:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def becomes(pid: int, states: str) -> bool:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if run_state(pid) in states:
                return True
            time.sleep(0.02)
        return False

    client.send_signal(signal.SIGTSTP)
    assert becomes(client.pid, "T") and becomes(command, "T")
    client.send_signal(signal.SIGCONT)
    assert becomes(client.pid, "RSD") and becomes(command, "RSD")
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=120)
    assert client.returncode == 130, err


def test_the_command_has_its_clients_resource_limits(tmp_path):
    """A command runs with its client's ``ulimit``s; one whose hard limit the server cannot grant (above its own)
    runs in its client's process instead."""
    import resource

    env = _env(tmp_path)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))  # noqa: E731
    server = subprocess.run([sys.executable, "-m", "pipeline", "server", "start", "--idle", "600"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600, preexec_fn=lowered)
    assert server.returncode == 0, server.stderr
    state = _state(tmp_path)
    try:
        low = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 300))  # noqa: E731
        client, command = _long_command(env, state, tmp_path / "synth", preexec_fn=low)
        deadline = time.monotonic() + 60
        while True:         # (the command sets them as it starts)
            with open(f"/proc/{command}/limits") as f:
                files = next(line for line in f if line.startswith("Max open files")).split()
            if files[3:5] == ["200", "300"] or time.monotonic() > deadline or client.poll() is not None:
                break
            time.sleep(0.05)
        client.send_signal(signal.SIGINT)
        client.communicate(timeout=120)
        assert files[3:5] == ["200", "300"], files
        served = _state(tmp_path)["served"]
        if hard > 512 or hard == resource.RLIM_INFINITY:     # (a client above the server's hard limit: not served)
            proc = _bootprof(env, "--version")
            assert proc.returncode == 0 and proc.stdout.startswith("bootprof")
            assert _state(tmp_path)["served"] == served + 1     # (it asked; the server left it to the client)
            assert "left a command to its client: RLIMIT_NOFILE" in Path(state["log"]).read_text()
    finally:
        _bootprof(env, "server", "stop", "--all")
    assert _gone(state["pid"])
