"""The process that local dask workers, and the report's process pools, are forked from.

It is started once per process (:func:`start`), imports what a worker runs and loads the stages' compiled kernels
(:mod:`pipeline.cluster.prefork`, its preload) while the process that started it goes on, and is ended and waited
for when that process exits (:func:`stop`). Where the platform has no fork server, workers are spawned instead.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import threading
import time
import weakref

from pipeline import ENV_DEFAULTS
from pipeline.cluster import warmup

log = logging.getLogger(__name__)


#: Environment of local workers. Arrow's allocator (mimalloc) gives freed memory back to the kernel 10 ms
#: after it is freed, so each task's tables landed on fresh pages again; on VMs whose host backs guest
#: memory lazily a fresh page is a fault into the host. Kept for a second, the next task reuses it, and a
#: worker touches far fewer fresh pages. (Never purging,
#: -1, did as well, but then ``release_unused`` could no longer empty the pool of an idle worker.)
WORKER_ENV = {"MIMALLOC_PURGE_DELAY": "1000"}
#: One thread for numpy's BLAS in the processes the workers are forked from, as dask sets for the workers
#: it spawns (and the CLI for itself): read when numpy is imported, which the fork server does.
FORK_SERVER_ENV = ENV_DEFAULTS

_fork_lock = threading.Lock()
_fork_servers: list[bool] = []


def start(warm_up: list[str]) -> bool:
    """Start the process that this process's local workers are forked from (once per process: clusters
    started later fork from the same one); whether it runs.

    It imports what a worker runs (distributed's worker, the ``warm_up`` modules) and loads their cached
    numba kernels once (:mod:`pipeline.cluster.prefork`), on the other core while this process imports distributed
    and starts the scheduler, so a worker is warm as soon as it is forked. A spawned worker (dask's default)
    is a fresh interpreter that does all of it again after the cluster is up, each worker its own copy,
    and the stage waits for it before its first task.
    Modules a later cluster names beyond the first one's are warmed up by each of its workers, as
    spawned ones were (:func:`pipeline.cluster.warmup.dask_setup`).

    Ended with this process (it waits for the server, whose children the workers were, so their CPU
    time is accounted to this process as a spawned worker's was). False (workers are spawned) where
    the platform has no fork server."""
    import multiprocessing
    from multiprocessing import forkserver

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    with _fork_lock:
        if not _fork_servers:
            env = {warmup.ENV: ",".join(warm_up), **WORKER_ENV, **FORK_SERVER_ENV}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)           # (the server inherits this process's environment as it starts)
            try:
                multiprocessing.get_context("forkserver").set_forkserver_preload(["pipeline.cluster.prefork"])
                forkserver.ensure_running()
            except OSError as exc:
                log.warning("cannot start a fork server for the workers (%s): spawning them", exc)
                return False
            finally:
                for k, v in saved.items():
                    if v is None:
                        del os.environ[k]
                    else:
                        os.environ[k] = v
            _fork_servers.append(True)
            atexit.register(stop)
    return True


def stop() -> None:
    """At exit: end the fork server and wait for it (multiprocessing's own stop, which its tests use), after the
    process pools forked from it."""
    from multiprocessing import forkserver

    for pool in list(_POOLS):
        pool.end()
    end = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if end is not None:
        try:
            end()
        except OSError:
            pass


def processes(n: int):
    """A ``concurrent.futures.ProcessPoolExecutor`` of ``n`` processes, for Python-bound work that threads would
    only run in turns (the report's sections). They are forked from the fork server of local dask workers
    (:func:`start`, started now when no cluster of this process started it), which has numpy, pyarrow
    and distributed loaded, so a process starts in milliseconds; not from this process, which may hold
    DuckDB's and dask's threads. Spawned where the platform has no fork server."""
    import multiprocessing

    method = "forkserver" if start([]) else "spawn"
    pool = _Processes(n, mp_context=multiprocessing.get_context(method), initializer=_die_with,
                      initargs=(os.getpid(),))
    _POOLS.add(pool)
    return pool


#: The process pools of this process, ended before the fork server is waited for at exit (their processes are its
#: children: it would wait for them, and they for this process).
_POOLS: "weakref.WeakSet[_Processes]" = weakref.WeakSet()


def _die_with(pid: int) -> None:
    """In a pool's process: end when the command that made the pool is gone, however it went (killed, or
    interrupted in a moment its ``with`` could not act on): the process is the fork server's child, so nothing
    else would end it."""
    from pipeline.portable import pid_alive

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="die-with-the-command", daemon=True).start()


class _Processes(concurrent.futures.ProcessPoolExecutor):
    """A process pool that ends its processes when its ``with`` is left by an error or an interrupt. (A worker
    forked from the fork server holds the write end of its own call queue, so it never sees its parent go: one left
    waiting after a Ctrl-C kept the fork server, and the pipes of the command's caller, open for good.)"""

    def __exit__(self, kind, exc, tb):
        if kind is None:
            try:
                return super().__exit__(kind, exc, tb)
            except BaseException:       # (interrupted while it waited for its processes: end them, as below)
                self.end()
                raise
        self.end()
        return False

    def end(self) -> None:
        """Kill its processes now and shut it down without waiting."""
        for proc in list((self._processes or {}).values()):
            proc.kill()
        self.shutdown(wait=False, cancel_futures=True)
