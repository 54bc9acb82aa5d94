"""A local dask cluster that outlives the command that started it (``cluster.mode: resident``).

Starting a local cluster is most of what a big decode does not spend decoding: on 16 cores, the scheduler and
16 warm workers took 3.5-4 s of a 9.3 s `bootprof decode` of a 4 GB trace. A resident cluster pays that
once: the first command that needs it (or ``bootprof cluster start``) starts a server process of its own
session, which runs a ``LocalCluster`` (:func:`pipeline.cluster.local_cluster`: the same workers, forked warm
from a fork server) and writes its address to a state file; later commands connect to it. It ends after
``cluster.resident_idle_s`` with no client connected and no task running, on ``bootprof cluster stop``, or on
SIGTERM.

One resident cluster per *key*: the code it runs (this bootprof's version, interpreter and the size and time of
each of its source files) and its settings (workers, threads, memory limit). A command of other settings or of
changed code starts (and then uses) a cluster of its own key; the old one ends when idle. Its files, in
``cluster.resident_dir``: ``<key>.json`` (address, pid, settings, start time), ``<key>.log`` (the server's
log), ``<key>.lock`` (held while a command starts it: two commands at once start one cluster).

Tasks get absolute paths (run directories, symbol caches), as workers on other machines need: the server runs
in ``resident_dir``, not in the directory of the command that started it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.front import code_fingerprint
from pipeline.config import ClusterConfig
from pipeline.errors import BootprofError, ConfigError
from pipeline.runs import atomic_write_json, pid_alive

log = logging.getLogger(__name__)

#: Seconds a command waits for a server it started (a resident cluster, a command server) to serve.
START_TIMEOUT_S = 120.0
#: Seconds ``stop`` waits for a server to end after SIGTERM before it kills the server's process group.
STOP_TIMEOUT_S = 30.0


class ClusterError(BootprofError):
    """A resident cluster could not be started or reached; the message names its log file."""


def settings(cfg: ClusterConfig) -> dict[str, Any]:
    """What makes two resident clusters interchangeable for a command, besides the code."""
    return {"n_workers": cfg.n_workers or os.cpu_count() or 1, "threads_per_worker": cfg.threads_per_worker,
            "memory_limit": cfg.memory_limit}


def key(cfg: ClusterConfig) -> str:
    return hashlib.sha256(json.dumps([code_fingerprint(), settings(cfg)], sort_keys=True).encode()).hexdigest()[:16]


def directory(cfg: ClusterConfig) -> Path:
    return Path(cfg.resident_dir).expanduser().absolute()


def ensure(cfg: ClusterConfig, warm_up: list[str]) -> dict[str, Any]:
    """The state of the resident cluster for ``cfg`` (its ``address``, and what :func:`security` needs), started
    now (workers warming up ``warm_up``) when none runs."""
    payload = {"cluster": cfg.model_dump(), "warm_up": list(warm_up), "code": code_fingerprint(),
               "settings": settings(cfg)}
    return start_server(directory(cfg), key(cfg), "pipeline.resident", [json.dumps(payload)],
                        "the resident dask cluster", "cluster.resident_dir",
                        f"starting a resident dask cluster ({payload['settings']['n_workers']} workers; log %s)")[0]


def start_server(d: Path, k: str, module: str, args: list[str], what: str, setting: str,
                 announce: str) -> tuple[dict[str, Any], bool]:
    """The state of the server of key ``k`` in directory ``d`` (``python -m <module> d k *args``: a resident
    cluster, a command server), started now when none runs (``announce``, with its log's path, is logged), and
    whether it was; it is serving when this returns. Two commands at once start one server (``<k>.lock``).
    ``setting`` names where ``d`` comes from, for the error when it cannot be made."""
    state = alive_state(d, k, module)
    if state is not None:
        return state, False
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{setting} {str(d)!r}: cannot create it: {exc}") from None
    with locked(d / f"{k}.lock"):
        state = alive_state(d, k, module)       # (another command may have started it while this one waited)
        if state is not None:
            return state, False
        (d / f"{k}.json").unlink(missing_ok=True)
        log_path = d / f"{k}.log"
        # (a log per server's life: a new start of the key begins a new file; one still ending writes to its own)
        log_path.unlink(missing_ok=True)
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", module, str(d), k, *args], cwd=d, env=server_env(),
                                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        log.info(announce, log_path)
        return wait_for_state(proc, d / f"{k}.json", log_path, what), True


def security(state: dict[str, Any]):
    """The TLS settings a client of the cluster of ``state`` connects with (its own certificate, made when it
    started, which only the user who can read the state file has): a scheduler on loopback without them would
    run any local user's tasks as this user, for as long as it lives."""
    from distributed.security import Security

    tls = state.get("tls") or {}
    return Security(tls_ca_file=tls.get("ca"), tls_client_cert=tls.get("cert"), tls_client_key=tls.get("key"),
                    require_encryption=True)


def forget(cfg: ClusterConfig, stale_address: str) -> None:
    """The cluster at ``stale_address`` did not answer: drop its state file (if it is still that one's), so
    the next :func:`ensure` starts another."""
    path = directory(cfg) / f"{key(cfg)}.json"
    state = read_state(path)
    if state is not None and state.get("address") == stale_address:
        path.unlink(missing_ok=True)


def running(cfg: ClusterConfig) -> list[dict[str, Any]]:
    """The state of every resident cluster in ``cfg``'s directory whose server is alive, with ``current``: whether
    it is the one this code and these settings use. Files of servers that are gone are removed."""
    d = directory(cfg)
    mine = key(cfg)
    out = []
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        state = alive_state(d, path.stem)
        if state is not None:
            out.append({**state, "current": path.stem == mine})
    return out


def stop(state: dict[str, Any]) -> bool:
    """End the server of ``state`` (SIGTERM: it closes its workers and removes its state file); kill its process
    group if it has not ended after ``STOP_TIMEOUT_S``. Whether it was running."""
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return True


# -- the command's side ------------------------------------------------------------------------------


def server_env() -> dict[str, str]:
    """The environment of a server process started from this one: this one's, with this bootprof first on its
    ``PYTHONPATH`` (the server runs in its own directory, where ``python -m`` would not find a checkout)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).parents[1]),
                                                                    os.environ.get("PYTHONPATH", "")] if p)}


def wait_for_state(proc: subprocess.Popen, state_path: Path, log_path: Path, what: str) -> dict[str, Any]:
    """Wait until the server process ``proc`` has written its state file (once it serves), and return the state.
    A server that ends first, or is not serving within ``START_TIMEOUT_S`` (it is then stopped), is a
    :class:`ClusterError` that quotes its log."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        state = read_state(state_path)
        if state is not None and state.get("pid") == proc.pid:
            return state
        if proc.poll() is not None:
            raise ClusterError(f"{what} did not start (exit status {proc.returncode}); {log_path}: {_tail(log_path)}")
        if time.monotonic() > deadline:
            stop({"pid": proc.pid})
            raise ClusterError(f"{what} did not start within {START_TIMEOUT_S:.0f} s; {log_path}: {_tail(log_path)}")
        time.sleep(0.02)


def alive_state(d: Path, k: str, module: str = "pipeline.resident") -> dict[str, Any] | None:
    """The state file of key ``k`` in ``d`` if its server process (of ``python -m <module>``) lives; a file whose
    server is gone (or whose pid is now another process's) is removed."""
    path = d / f"{k}.json"
    state = read_state(path)
    if state is None:
        return None
    if _serves(int(state.get("pid", 0)), k, module):
        return state
    path.unlink(missing_ok=True)
    return None


def _serves(pid: int, k: str, module: str) -> bool:
    """Whether process ``pid`` is the server of key ``k`` (its command line names ``module`` and the key; where
    there is no ``/proc``, whether it runs)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return module.encode() in argv and k.encode() in argv


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "pid" in state else None


@contextlib.contextmanager
def locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


# -- the server ---------------------------------------------------------------------------------------


def serve(d: Path, k: str, payload: dict[str, Any]) -> int:
    """Run the resident cluster of key ``k`` until it has been idle ``resident_idle_s``, or a signal ends it."""
    from pipeline import cluster

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = ClusterConfig(**payload["cluster"])
    warm_up = list(payload["warm_up"])
    ending = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: ending.set())
    state_path = d / f"{k}.json"
    forked = cluster._fork_server(warm_up)
    from distributed.security import Security  # (distributed's import sets its loggers' levels: quieter after it)

    logging.getLogger("distributed").setLevel(logging.WARNING)
    tls = Security.temporary()
    with cluster.local_cluster(cfg, warm_up, forked, protocol="tls://", security=tls) as lc:
        scheduler = lc.scheduler
        state = {"address": scheduler.address, "pid": os.getpid(), "key": k, "code": payload["code"],
                 "settings": payload["settings"], "version": __version__, "idle_s": cfg.resident_idle_s,
                 "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "log": str(d / f"{k}.log"),
                 "tls": {"ca": tls.tls_ca_file, "cert": tls.tls_client_cert, "key": tls.tls_client_key}}
        # (readable by this user only, as mkstemp makes it: the certificate is what lets a client in)
        atomic_write_json(state_path, state)
        log.info("resident cluster %s at %s: %d workers", k, scheduler.address, len(scheduler.workers))
        idle_since = time.monotonic()
        while not ending.wait(min(1.0, cfg.resident_idle_s / 4)):
            if scheduler.status.name in ("closing", "closed"):
                break
            if _busy(scheduler):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > cfg.resident_idle_s:
                log.info("idle for %.0f s: ending", cfg.resident_idle_s)
                break
        # (the state file goes first: a command that reads it from now on starts another cluster)
        if (read_state(state_path) or {}).get("pid") == os.getpid():
            state_path.unlink(missing_ok=True)
    return 0


def _busy(scheduler) -> bool:
    """A client is connected, or a task is queued or running (read from this thread: a dict that changes while
    it is read counts as busy)."""
    try:
        clients = [c for c in scheduler.clients if c != "fire-and-forget"]
        return bool(clients or scheduler.queued or scheduler.unrunnable
                    or any(ws.processing for ws in list(scheduler.workers.values())))
    except RuntimeError:
        return True


# -- the command line -----------------------------------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("action", choices=["start", "status", "stop"],
                   help="start: start the resident cluster of this config (if none runs) and print its address; "
                        "status: list the resident clusters that run; stop: end this config's (with --all, every one)")
    p.add_argument("--all", action="store_true", help="stop: every resident cluster in cluster.resident_dir")


def main(args, config) -> int:
    cfg = config.cluster
    if args.action == "start":
        from pipeline import decode

        addr = ensure(cfg, list(decode.WARM_UP))["address"]
        print(f"{addr}  ({settings(cfg)['n_workers']} workers; used by commands with cluster.mode: resident; "
              f"ends after {cfg.resident_idle_s:.0f} s idle)")
        return 0
    return status_or_stop(
        args, running(cfg), f"no resident cluster runs ({directory(cfg)})", "no resident cluster of this config runs",
        lambda s: (f"{s['address']}  pid {s['pid']}  {s['settings']['n_workers']} workers  started {s['started']}  "
                   f"{'this code and config' if s['current'] else 'other code or settings'}  log {s['log']}"),
        lambda s: f"stopped {s['address']} (pid {s['pid']})")


def status_or_stop(args, states: list[dict[str, Any]], none: str, none_current: str, line, stopped) -> int:
    """``status`` (a ``line`` per running server's state, or ``none``) or ``stop`` (the server of this code and
    settings, with ``args.all`` every one: ``stopped`` for each, ``none_current`` when there was none) of the
    servers whose ``states`` are given (each with ``current``)."""
    if args.action == "status":
        print("\n".join(line(s) for s in states) if states else none)
        return 0
    chosen = states if args.all else [s for s in states if s["current"]]
    for s in chosen:
        if stop(s):
            print(stopped(s))
    if not chosen:
        print(none if args.all else none_current)
    return 0


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])))
