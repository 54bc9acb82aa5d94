"""What differs between Windows, macOS and Linux, in one place: every other module calls these instead of an
API that only some systems have (``tests/test_portable.py`` runs pyright's model of each system over the package
and fails on a platform API used elsewhere).

- Read-only maps of a file (``mmap.ACCESS_READ``: the one form every system has).
- Opens for reading that do not wait: a FIFO's open waits for a writer unless ``O_NONBLOCK`` is given, which
  Windows lacks (and has no FIFOs in its file system to wait on).
- Reads at an offset (``os.pread`` where it exists; elsewhere a seek and read under a lock per descriptor).
- Stopping a child as Ctrl-C would: SIGINT on POSIX; on Windows, where there is no SIGINT to send, a child
  started in a process group of its own is sent ``CTRL_BREAK_EVENT``; then the rest of its process tree, read with
  psutil, which no console signal may reach. Waits on a child in steps, which Ctrl-C can break on every system.
- Renames, replaces and removals: Windows refuses to rename a directory over another, and to rename, replace or
  remove a file (or a directory holding one) while another process holds it open (a virus scanner or an indexer may,
  for a moment): tried again for a while.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

WINDOWS = sys.platform == "win32"

#: Flags of ``os.open`` for reading a file's bytes as they are (Windows' C runtime opens in text mode otherwise).
READ_BINARY = os.O_RDONLY | getattr(os, "O_BINARY", 0)
#: The same, without waiting where an open would (a FIFO without a writer); reads of a regular file are unchanged.
READ_NOWAIT = READ_BINARY | getattr(os, "O_NONBLOCK", 0)
#: How long a rename or removal that Windows refuses (a file held open by another process) is tried again.
RETRY_S = 5.0


def map_read(fileno: int, length: int = 0, offset: int = 0) -> mmap.mmap:
    """A read-only map of ``length`` bytes (0: to the end) from ``offset`` (a multiple of
    ``mmap.ALLOCATIONGRANULARITY``) of an open file. On Linux the whole range is mapped in at once
    (``MAP_POPULATE``), instead of page by page as it is first read."""
    if sys.platform == "linux":
        return mmap.mmap(fileno, length, offset=offset, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                         prot=mmap.PROT_READ)
    return mmap.mmap(fileno, length, access=mmap.ACCESS_READ, offset=offset)


_seek_locks: dict[int, threading.Lock] = {}
_seek_locks_lock = threading.Lock()


def pread(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes at ``offset`` of ``fd``, without moving a position another thread relies on."""
    if sys.platform != "win32":
        return os.pread(fd, n, offset)
    return _seek_and_read(fd, n, offset)


def _seek_and_read(fd: int, n: int, offset: int) -> bytes:
    """``pread`` where there is none: a seek and a read under the descriptor's lock."""
    with _seek_locks_lock:
        lock = _seek_locks.setdefault(fd, threading.Lock())
    with lock:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, n)


def pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Read into ``buf`` from ``offset`` of ``fd``; the bytes read (0 at the end of the file)."""
    if sys.platform != "win32":
        return os.preadv(fd, [buf], offset)
    return _seek_and_read_into(fd, buf, offset)


def _seek_and_read_into(fd: int, buf: memoryview, offset: int) -> int:
    data = _seek_and_read(fd, len(buf), offset)
    buf[: len(data)] = data
    return len(data)


def child_group() -> dict:
    """``subprocess.Popen`` arguments for a child that :func:`interrupt` can stop: on Windows a process group of
    its own (``CTRL_BREAK_EVENT`` goes to a group); on POSIX none (it stays in the terminal's group, where
    Ctrl-C reaches it with this process)."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {}


def interrupt(proc: subprocess.Popen) -> None:
    """Ask a child started with :func:`child_group` to stop as Ctrl-C would: SIGINT on POSIX,
    ``CTRL_BREAK_EVENT`` to its group on Windows."""
    if proc.poll() is not None:
        return
    try:
        if sys.platform == "win32":
            proc.send_signal(signal.CTRL_BREAK_EVENT)
        else:
            proc.send_signal(signal.SIGINT)
    except OSError:             # (ended meanwhile)
        pass


#: What Windows refuses in a file name (NTFS, and every name through the Win32 API), besides control characters.
_NOT_IN_NAMES = re.compile(r'[<>:"/\\|?*\x00-\x1f]')


def file_name(text: str) -> str:
    """``text`` as a file name every system takes: what Windows refuses in one (``:`` of a time, ``?`` of a URL's
    query, ...) as ``_``, and no dot or space at its end (Windows drops them)."""
    return _NOT_IN_NAMES.sub("_", text).rstrip(". ") or "_"


def shielded() -> dict:
    """``subprocess.Popen`` arguments for a helper that must finish even when the user presses Ctrl-C (a recording
    tool's stop and merge): outside the terminal's process group, so the console's Ctrl-C does not reach it (on
    Windows a process group of its own, which also ignores Ctrl-C; on POSIX a session of its own)."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


#: How often a wait on a child looks up: Ctrl-C reaches a wait with no timeout only when it ends (on Windows a
#: documented CPython limit), and a wait in steps raises ``KeyboardInterrupt`` within one.
WAIT_STEP_S = 0.25


def wait(proc: subprocess.Popen, timeout: float | None = None) -> int | None:
    """Wait for ``proc`` in steps of :data:`WAIT_STEP_S`, so that Ctrl-C and SIGTERM interrupt the wait on every
    system; its exit code, or None when ``timeout`` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = WAIT_STEP_S if deadline is None else min(WAIT_STEP_S, deadline - time.monotonic())
        if step <= 0:
            return proc.poll()
        try:
            return proc.wait(step)
        except subprocess.TimeoutExpired:
            continue


def end_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a child and every process it started, as a build's Ctrl-C would: first :func:`interrupt` (SIGINT, or
    ``CTRL_BREAK_EVENT`` to its group on Windows), then after ``grace_s`` ``terminate`` and then ``kill`` for
    whatever of the tree is left. The tree is read with psutil before the top is signalled and again before
    each step, so a build script that its cargo left behind (re-parented when cargo ended) is still ended, and
    so is a tree that no console signal reaches (a service, Task Scheduler, a CI runner without a console)."""
    import psutil

    def family(roots: list[psutil.Process]) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for root in roots:
            try:
                if root.is_running():
                    found.setdefault(root.pid, root)
                for child in root.children(recursive=True):
                    found.setdefault(child.pid, child)
            except psutil.Error:
                continue
        return list(found.values())

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    try:
        top = psutil.Process(proc.pid)
    except psutil.Error:
        return
    known = family([top])
    if proc.poll() is None:
        interrupt(proc)
        wait(proc, grace_s)
    for action in ("terminate", "kill"):
        # (the top through its Popen, which must reap it itself to keep its exit code; psutil would take it)
        known = [p for p in family(known) if running(p)]
        rest = [p for p in known if p.pid != proc.pid]
        if proc.poll() is None:
            getattr(proc, action)()
        elif not rest:
            break
        for p in rest:
            try:
                getattr(p, action)()
            except psutil.Error:
                pass
        psutil.wait_procs(rest, timeout=grace_s)
        if proc.poll() is None:
            wait(proc, grace_s)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one does; on Linux a zombie, ended but not waited for, does not)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    if WINDOWS:
        import psutil

        return psutil.pid_exists(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def same_terminal(a, b) -> bool:
    """Whether two open streams are the same terminal (False where that cannot be known)."""
    try:
        if not (a.isatty() and b.isatty()):
            return False
        if sys.platform == "win32":
            return True                 # (both are the console)
        return os.ttyname(a.fileno()) == os.ttyname(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def _retrying(action, *args) -> None:
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            action(*args)
            return
        except PermissionError as exc:
            if not WINDOWS or time.monotonic() >= deadline:
                raise
            if exc.errno not in (errno.EACCES, errno.EPERM, None) and getattr(exc, "winerror", 5) not in (5, 32):
                raise
            time.sleep(0.1)
        except OSError as exc:      # (a directory whose files a scanner still holds, deleted but pending: 145)
            if not WINDOWS or getattr(exc, "winerror", None) != 145 or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def replace(src, dst) -> None:
    """``os.replace``, tried again for a while where Windows refuses it because another process holds one of the
    files open (a virus scanner or an indexer, for a moment)."""
    _retrying(os.replace, src, dst)


def remove_tree(path, must: bool = False) -> None:
    """Remove a directory and all it holds, tried again for a while where Windows refuses (a file held open a
    moment); what is still there then stays, or with ``must`` is an error. Gone already is no error."""
    import shutil

    try:
        _retrying(shutil.rmtree, path)
    except FileNotFoundError:
        pass
    except OSError:
        if must:
            raise


def rename(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` (which must not exist, as Windows requires of a directory), tried again for a
    while where Windows refuses it because another process holds a file in it open."""
    _retrying(os.rename, src, dst)


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT and SIGTERM back while the block runs (a COMMIT and its journal line: the state a signal would cut
    in two), then deliver what arrived meanwhile through the handler that was in place. Outside the main thread,
    where Python delivers no signal, it holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    kinds = [signal.SIGINT, signal.SIGTERM]
    before = {k: signal.getsignal(k) for k in kinds}
    for k in kinds:
        signal.signal(k, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for k, handler in before.items():
            signal.signal(k, handler)
    for signum in held[:1]:
        handler = before[signum]
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)
