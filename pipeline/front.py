"""The ``bootprof`` command's first step: hand the command to a warm command server if one runs
(``bootprof server start``, :mod:`pipeline.server`), else run it in this process (:func:`pipeline.cli.entry`).

A command in a fresh process spends most of a small input's time before its work: the interpreter, the imports of
numpy, pyarrow, DuckDB, pydantic, dask and numba, and loading the compiled numba kernels. A command server has done
all of that once; this process only imports what this module imports (the standard library's ``os``, ``sys``,
``socket``, ``json`` and ``hashlib``), passes its arguments, working directory, environment, umask and its
standard input, output and error (the descriptors themselves) to the server, and waits for the exit status. The
server forks a copy of itself that runs the command as this process would have, writing straight to this process's
terminal or pipes. Signals that end a command (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) are passed on to it.

A server is used only when its *key* matches: this bootprof's code (version, interpreter, size and time of each
source file) and the environment variables that act when modules are imported (``IMPORT_TIME_ENV``). Anything
else (no server, a server gone, a standard stream closed) runs the command here, as without a server.
``BOOTPROF_SERVER=off`` in the environment runs every command here. Servers live in ``BOOTPROF_SERVER_DIR``
(default ``~/.cache/bootprof/server``).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import sys

#: The environment variable that turns the command server off (``off``) for the commands that see it.
SERVER_ENV = "BOOTPROF_SERVER"
#: The environment variable naming the servers' directory.
SERVER_DIR_ENV = "BOOTPROF_SERVER_DIR"
DEFAULT_SERVER_DIR = "~/.cache/bootprof/server"
#: Prefixes of the environment variables that take effect when a process starts or a module is imported (numba's
#: and dask's settings, the interpreter's, the locale, the allocators', the thread pools', bootprof's own): a server
#: that was started with other values (or without them) would run the command with the wrong ones, so it is not
#: used.
IMPORT_TIME_ENV = ("NUMBA_", "DASK_", "PYTHON", "LANG", "LC_", "OMP_", "OPENBLAS_", "MKL_", "MALLOC_", "MIMALLOC_",
                   "ARROW_", "LD_", "BOOTPROF_")
#: What every command sets in its environment, if unset, before numpy is first imported (:func:`pipeline.cli.main`):
#: one BLAS thread. Nothing here multiplies matrices, and OpenBLAS's idle threads spin on a core the stages need
#: (what dask already sets for its workers).
ENV_DEFAULTS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: The signals a client passes on to the command it waits for.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: Subcommands that always run in the client's process (they manage the servers).
LOCAL_COMMANDS = ("server",)
#: The resource limits (``ulimit``) a command takes from its client; a server that cannot grant one (a hard limit
#: above its own) leaves the command to run in its client's process.
RLIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_FSIZE",
           "RLIMIT_CORE", "RLIMIT_MEMLOCK")


def rlimits() -> dict[str, list[int]]:
    """This process's ``RLIMITS`` by name: [soft, hard]."""
    return {name: list(resource.getrlimit(getattr(resource, name))) for name in RLIMITS if hasattr(resource, name)}


def entry() -> None:
    """``bootprof`` and ``python -m pipeline``."""
    argv = sys.argv[1:]
    if _may_use_server(argv):
        code = run_on_server(argv)
        if code is not None:
            sys.stderr.flush()
            os._exit(code)
    from pipeline.cli import entry as cli_entry

    cli_entry()


def code_fingerprint() -> str:
    """This bootprof's code: version, interpreter, and the size and modification time of every source file of
    the package (a process that imported other code must not run this command)."""
    from pipeline import __version__

    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256(f"{__version__}\0{sys.executable}\0{sys.version}\n".encode())
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        files += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    for path in sorted(os.path.relpath(f, root) for f in files):
        st = os.stat(os.path.join(root, path))
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def server_key(environ: dict[str, str] | None = None) -> str:
    """The key of the command server that may run this process's commands: the code, and the environment
    variables that act at import time (``IMPORT_TIME_ENV``), those that choose the server left out."""
    environ = {**ENV_DEFAULTS, **(os.environ if environ is None else environ)}
    env = sorted((k, v) for k, v in environ.items()
                 if k.startswith(IMPORT_TIME_ENV) and k not in (SERVER_ENV, SERVER_DIR_ENV))
    return hashlib.sha256(json.dumps([code_fingerprint(), env]).encode()).hexdigest()[:16]


def server_dir() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get(SERVER_DIR_ENV) or DEFAULT_SERVER_DIR))


def socket_path(key: str) -> str:
    return os.path.join(server_dir(), f"{key}.sock")


def _may_use_server(argv: list[str]) -> bool:
    return (bool(argv) and _subcommand(argv) not in LOCAL_COMMANDS and os.environ.get(SERVER_ENV, "").lower() != "off"
            and hasattr(socket, "send_fds") and hasattr(os, "pidfd_open"))


def _subcommand(argv: list[str]) -> str | None:
    """The subcommand of a command line (its first word that is neither a global option nor ``--config``'s
    value), as :func:`pipeline.cli.build_parser` reads it; None when there is none."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def run_on_server(argv: list[str]) -> int | None:
    """Run ``argv`` on the command server of this code and environment; its exit status, or None where no server
    took the command (none runs, or it could not be reached: the caller runs it itself)."""
    path = socket_path(server_key())
    if not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        body = json.dumps({"argv": argv, "argv0": sys.argv[0], "cwd": os.getcwd(), "env": dict(os.environ),
                           "umask": umask, "rlimits": rlimits()}).encode()
        sock.connect(path)
        socket.send_fds(sock, [len(body).to_bytes(4, "big")], [0, 1, 2])
        sock.sendall(body)
        replies = sock.makefile("rb")
        started = replies.readline()
    except OSError:
        return None                 # (a server gone, a stream or the directory gone: the command runs here)
    reply = json.loads(started) if started else {}
    if "pid" not in reply:
        return None                 # (the server did not start the command, or cannot as this process would run it)
    pid = int(reply["pid"])

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    def suspend(_signum, _frame):
        # Ctrl-Z: the command stops with this process, as one job. (SIGSTOP: the command's process group has no
        # terminal, and the kernel drops a SIGTSTP sent to such a group.) The shell's `fg` or `bg` sends SIGCONT.
        forward(signal.SIGSTOP, None)
        os.kill(os.getpid(), signal.SIGSTOP)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGTSTP, suspend)
    signal.signal(signal.SIGCONT, lambda _s, _f: forward(signal.SIGCONT, None))
    try:
        ended = replies.readline()
    except OSError:
        ended = b""
    if not ended:
        print("bootprof: error: the command server ended before the command did (its log: "
              f"{path[:-len('.sock')]}.log)", file=sys.stderr)
        return 1
    status = json.loads(ended)
    if "signal" in status:          # (end as the command did, so that a shell sees the same)
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
        return 128 + status["signal"]
    return int(status["exit"])
