"""The command server (``bootprof server start|status|stop``): a process that has imported bootprof and loaded its
compiled kernels once, and runs each later ``bootprof`` command in a fork of itself.

A small input's command spends most of its time before its work: on this 2-core VM, a `bootprof decode` of the
4.9 MB real trace in a fresh process takes ~1.2 s, of which the interpreter and the imports take ~0.7 s and loading
38 numba kernels from their cache ~0.3 s; the decode itself ~0.3 s. Mercurial's ``chg`` and mypy's ``dmypy``
answer the same cost the same way.

How a command reaches it (the client's side is :mod:`pipeline.front`):

* The server listens on a Unix socket ``<key>.sock`` in ``BOOTPROF_SERVER_DIR`` (default
  ``~/.cache/bootprof/server``, made 0700; the socket 0600), and serves only its own user (the peer's
  credentials are checked). The key is that of :func:`pipeline.front.server_key`: the code and the environment
  that acts at import time, so a command of other code or settings never reaches it.
* For each connection it forks a *handler*, which receives the command (arguments, working directory,
  environment, umask, resource limits) and the client's standard input, output and error, and forks the *command*
  process: it takes the client's descriptors, directory, environment, umask and limits, and runs
  :func:`pipeline.cli.main` as a fresh process would; the handler reports its pid to the client (which passes
  signals on to it) and then its exit status. A client that goes away ends its command (SIGTERM); one stopped by
  Ctrl-Z stops its command too.
  A client whose hard limit (``front.RLIMITS``) the server cannot grant is answered ``refused`` and runs the
  command itself.
* The server itself runs no thread (checked before it serves: a fork of a process with threads may inherit a
  lock a thread held) and does no work of a command.

Its files, beside the socket: ``<key>.json`` (pid, key, start, commands served; written once warm, so a command
that finds it finds a warm server), ``<key>.log`` (its log), ``<key>.lock`` (held while a command starts it). It
ends after ``--idle`` seconds (default 3600) without a command, when its code changes on disk (``CODE_CHECK_S``), on
``bootprof server stop``, or on SIGTERM; commands that run then go on to their end.
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import logging
import os
import pkgutil
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline import __version__, front

log = logging.getLogger("bootprof.server")
#: The module a server runs as (``python -m``), which its command line names.
MODULE = "pipeline.server"

DEFAULT_IDLE_S = 3600.0
#: Seconds a handler waits for a command whose client went away to end after SIGTERM, before SIGKILL.
KILL_AFTER_S = 10.0
#: Seconds between two looks, while idle, at whether the server's code is still on disk as it was when it started.
#: Once a file changed, no client reaches it (their key names the new code): it ends, instead of idling for an hour.
CODE_CHECK_S = 5.0
#: Modules never imported by the server's warm-up: they act when imported.
NOT_WARMED = ("pipeline.__main__", "pipeline.prefork")


# -- the commands' side -------------------------------------------------------------------------------------


def directory() -> Path:
    return Path(front.server_dir())


def running() -> list[dict[str, Any]]:
    """The state of every server in the directory whose process lives, with ``current``: whether it serves this
    code and environment. Files of servers that are gone are removed."""
    from pipeline import resident

    d, mine = directory(), front.server_key()
    out = []
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        state = resident.alive_state(d, path.stem, MODULE)
        if state is None:
            Path(d / f"{path.stem}.sock").unlink(missing_ok=True)
        else:
            out.append({**state, "current": path.stem == mine})
    return out


def start(idle_s: float) -> tuple[dict[str, Any], bool]:
    """The state of the server of this code and environment, started now (and warm when this returns) if none
    runs; whether it was started now."""
    from pipeline import resident

    return resident.start_server(directory(), front.server_key(), MODULE, [str(idle_s)], "the command server",
                                 front.SERVER_DIR_ENV, "starting a command server (log %s)")


# -- the server ------------------------------------------------------------------------------------------


def serve(d: Path, k: str, idle_s: float) -> int:
    """Warm up, then serve commands on ``<k>.sock`` until idle for ``idle_s`` or ended by a signal."""
    from pipeline.resident import read_state
    from pipeline.runs import atomic_write_json

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False           # (the root logger stays as a fresh process has it: the commands configure it)
    for var, value in front.ENV_DEFAULTS.items():      # (as every command does, before numpy's import)
        os.environ.setdefault(var, value)
    t0 = time.perf_counter()
    modules, kernels = _warm_up()
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        log.error("the warm-up left threads running (%s): a fork would inherit their locks; not serving",
                  ", ".join(threads))
        return 1
    log.info("warm in %.2f s: %d modules, %d kernels", time.perf_counter() - t0, modules, kernels)

    ending: list[bool] = []

    def end(*_):            # (seen within a second: the loop's select wakes up every second)
        ending.append(True)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)
    sock_path, state_path = d / f"{k}.sock", d / f"{k}.json"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock_path.unlink(missing_ok=True)
    umask = os.umask(0o177)
    try:
        listener.bind(str(sock_path))
    finally:
        os.umask(umask)
    listener.listen(64)
    state = {"pid": os.getpid(), "key": k, "socket": str(sock_path), "version": __version__, "idle_s": idle_s,
             "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "log": str(d / f"{k}.log"),
             "served": 0}
    atomic_write_json(state_path, state)
    log.info("serving on %s", sock_path)
    children: set[int] = set()
    last = checked = time.monotonic()
    code = front.code_fingerprint()
    try:
        while not ending:
            ready, _, _ = select.select([listener], [], [], 1.0)
            if ready:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    ready = []
            while children:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
            if ready:
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    _handle(conn)       # (never returns)
                conn.close()
                children.add(pid)
                state["served"] += 1
                atomic_write_json(state_path, state)
            if children or ready:
                last = time.monotonic()
            elif time.monotonic() - last > idle_s:
                log.info("idle for %.0f s: ending", idle_s)
                break
            elif time.monotonic() - checked > CODE_CHECK_S:
                checked = time.monotonic()
                if front.code_fingerprint() != code:
                    log.info("its code changed on disk (no command can reach it now): ending")
                    break
    finally:
        # (the state and the socket go first: a command from now on runs in its own process)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if (read_state(state_path) or {}).get("pid") == os.getpid():
            state_path.unlink(missing_ok=True)
            sock_path.unlink(missing_ok=True)
        listener.close()
    log.info("ended: %d commands served, %d still running", state["served"], len(children))
    return 0


def _warm_up() -> tuple[int, int]:
    """Import every module of bootprof (but ``NOT_WARMED``) and load their numba kernels from the cache; the
    imports are then set aside from the collector (:func:`pipeline.warmup.warm_up`)."""
    import pipeline
    from pipeline import warmup

    names = [m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.", onerror=lambda _: None)
             if m.name not in NOT_WARMED]
    kernels = warmup.warm_up(names)
    return len(names), kernels


def _handle(conn: socket.socket) -> None:
    """In a fork of the server: receive one command, fork the process that runs it, report its pid and then how
    it ended. Never returns."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            log.warning("refused a command of uid %d", uid)
            os._exit(1)
        request, fds = _receive(conn)
        refused = _rlimits_refused(request.get("rlimits") or {})
        if refused:
            conn.sendall(json.dumps({"refused": refused}).encode() + b"\n")
            log.info("left a command to its client: %s", refused)
            code = 0
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run_command(request, fds)      # (never returns)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        pidfd = os.pidfd_open(pid)
        gone_at = None
        while True:
            ready, _, _ = select.select([conn, pidfd], [], [], 1.0)
            if pidfd in ready:
                break
            if conn in ready and gone_at is None and not conn.recv(1 << 12):
                gone_at = time.monotonic()              # (the client went away: so does its command)
                os.kill(pid, signal.SIGTERM)
            if gone_at is not None and time.monotonic() - gone_at > KILL_AFTER_S:
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        reply = {"signal": sig} if sig else {"exit": os.WEXITSTATUS(status)}
        try:
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        code = 0
    except BaseException:       # noqa: BLE001 - a handler must end here, never in the server's loop
        log.exception("a command's handler failed")
    finally:
        os._exit(code)


def _rlimits_refused(limits: dict[str, list[int]]) -> str | None:
    """Why the command could not have its client's resource limits here (a hard limit above the server's), or None."""
    import resource

    for name, (_, hard) in limits.items():
        if name not in front.RLIMITS:
            return f"unknown resource limit {name!r}"
        own = resource.getrlimit(getattr(resource, name))[1]
        if own != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > own):
            return f"{name} hard limit {hard} is above the server's {own}"
    return None


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 4, 3)
    if len(header) != 4 or len(fds) != 3:
        raise ValueError(f"a command without its header or streams ({len(header)} bytes, {len(fds)} descriptors)")
    size = int.from_bytes(header, "big")
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("a command cut short")
        body += chunk
    return json.loads(body), fds


def _run_command(request: dict[str, Any], fds: list[int]) -> None:
    """In the command's process: become the client's process (its streams, directory, environment and umask),
    run the command, and end as ``bootprof`` ends."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        encoding = sys.stdout.encoding
        sys.stdin = open(0, "r", encoding=encoding, closefd=False)
        sys.stdout = open(1, "w", encoding=encoding, closefd=False)        # (line-buffered on a terminal)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=encoding,
                                      errors="backslashreplace", line_buffering=True)
        logging.getLogger("bootprof.server").handlers.clear()
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        import resource

        for name, (soft, hard) in (request.get("rlimits") or {}).items():    # (``_rlimits_refused`` checked them)
            resource.setrlimit(getattr(resource, name), (soft, hard))
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None         # (what the server's environment chose is chosen again from this one)
        time.tzset()
        sys.argv = [request["argv0"], *request["argv"]]
        from pipeline import cli

        try:
            code = cli.main(request["argv"])
        except SystemExit as exc:   # (argparse: --help, --version, a wrong argument)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
        cli.exit_quickly(code)          # (no thread left that it would wait for: it ends the process)
    except BaseException:       # noqa: BLE001 - as an uncaught exception ends a fresh process
        traceback.print_exc()
        try:
            atexit._run_exitfuncs()
            sys.stderr.flush()
        finally:
            os._exit(code if code != 0 else 1)


# -- the command line ------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["start", "status", "stop"],
                   help="start: start the command server of this code and environment (if none runs) and wait "
                        "until it is warm; status: list the servers that run; stop: end this one (--all: every one)")
    p.add_argument("--idle", type=float, default=DEFAULT_IDLE_S, metavar="SECONDS",
                   help=f"start: end after this many seconds without a command (default {DEFAULT_IDLE_S:.0f})")
    p.add_argument("--all", action="store_true", help="stop: every command server in the directory")


def main(args, config) -> int:
    from pipeline import resident

    if args.action == "start":
        if not args.idle > 0:
            print("bootprof: error: --idle must be more than 0 seconds", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        state, started = start(args.idle)
        print(f"{'started' if started else 'already running'}: pid {state['pid']}, {state['socket']}"
              f"{f' (warm in {time.perf_counter() - t0:.1f} s)' if started else ''}; bootprof commands of this code "
              f"and environment run in it; ends after {state['idle_s']:.0f} s without one; log {state['log']}")
        return 0
    return resident.status_or_stop(
        args, running(), f"no command server runs ({directory()})", "no command server of this code and environment runs",
        lambda s: (f"pid {s['pid']}  started {s['started']}  {s['served']} commands  "
                   f"{'this code and environment' if s['current'] else 'other code or environment'}  {s['socket']}"),
        lambda s: f"stopped the command server pid {s['pid']}")


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
