"""Worker warm-up: a local cluster's workers have imported the modules the stages will run and loaded
their numba kernels from the on-disk cache before their first task. They are forked from one server
process that did so while the cluster started (:func:`prepare_fork_server`, via :mod:`pipeline.cluster.prefork`);
what that server lacks (it serves every cluster of the process that started it, warmed up for the first)
a worker loads on a background thread as soon as it starts (:func:`dask_setup`), as every worker did
when workers were spawned.

A fresh worker otherwise pays for both inside its first tasks: on the ETL decoder that is ~0.4 s of
imports and ~0.25 s of loading compiled kernels (numba's code generator set-up included), 10-15 % of
decoding a 1 GB trace with one worker. It starts with the worker and overlaps with the rest of the
cluster's start and with the client's work up to its first tasks.

The first ``map`` of a pool (:class:`pipeline.cluster.pool.Pool`) waits until the warm-up of every worker
has ended (:func:`ready`) before it sends a task; the client's own work before it (a decode's input
checks, imports and buffer walk) goes on meanwhile. Tasks that ran beside an unfinished warm-up (it used
to pause while a task ran and go on in between) shared one interpreter with it: the first task reached
the worker ~0.12 s late (the warm-up held the interpreter), loaded kernels itself, and the partitions ran
with the collector still scanning the imports (``set_aside`` comes at the end). On the 1 GB synth trace
with one worker, run from the CLI as the bench does (6 interleaved pairs, the VM in a slow phase): decode
stage 3.99-5.23 s against 3.97-5.08 (mean 4.47 against 4.65), whole CLI run 6.16-7.74 s against
6.44-7.58 (mean 6.95 against 7.17). Waiting when the cluster starts instead took the warm-up out of
the stage but not out of the run, and lost the overlap: over 11 pairs the CLI run took 6.80 s on average
against 6.29 s for waiting at the first map, and the stage 4.05 s against 3.89.

Modules come from ``BOOTPROF_WARM_UP`` (comma-separated module names) in the worker's environment,
which :func:`pipeline.cluster.pool.connect` sets from what the stages declare (``WARM_UP`` in a stage
package). Only overloads already compiled for this machine are loaded: warm-up never compiles. Private
kernels (a leading ``_``: called only by other kernels, whose cached code contains them) are skipped.

A worker also ends quickly: its objects stay out of the collector as it exits (:mod:`pipeline.cluster.gcpolicy`).
Imported by workers as they start (dask's preload): it imports no configuration.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import threading
import time

from pipeline.cluster import gcpolicy

ENV = "BOOTPROF_WARM_UP"
#: How long :func:`ready` waits for a warm-up at most (one that hangs must not stop the stage: the tasks then
#: load what they need themselves).
READY_TIMEOUT_S = 60.0
log = logging.getLogger(__name__)
_finished = threading.Event()
_finished.set()          # (no warm-up in this process unless dask_setup starts one)
#: The modules this process has warmed up, with the pid of the process that did (a forked worker: its fork
#: server's, for those the server warmed up).
_warmed: dict[str, int] = {}


def dask_setup(worker) -> None:
    """distributed's preload hook: start the warm-up and return at once. Whatever it warms up, the worker
    ends as :func:`pipeline.cluster.gcpolicy.keep_aside_at_exit` says, keeps quiet about its scheduler closing
    (:class:`QuietClose`), and leaves a Ctrl-C to the command that started it."""
    gcpolicy.keep_aside_at_exit()
    logging.getLogger("distributed.worker").addFilter(QuietClose())
    if threading.current_thread() is threading.main_thread():
        # A Ctrl-C at the terminal reaches every process of the command's group, these local workers too: the
        # command ends and closes its cluster, and a worker that died of it printed a traceback beside it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    names = [n for n in os.environ.get(ENV, "").split(",") if n and n not in _warmed]
    if names:
        _finished.clear()
        threading.Thread(target=_warm_up_then_finish, args=(names,), name="bootprof-warm-up", daemon=True).start()


class QuietClose(logging.Filter):
    """Drops one record of a local worker: "Failed to communicate with scheduler during heartbeat", which
    distributed logs at ERROR with a traceback when a heartbeat is on its way as the scheduler closes. A
    local worker's scheduler lives in the process that started the cluster, so that only happens when the
    stage is done and the cluster closes (here: once in ~16 decodes of a 1 GB trace), and a command that
    succeeded ended with a traceback. Every other record passes."""

    MESSAGE = "Failed to communicate with scheduler during heartbeat"

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.MESSAGE)


def _warm_up_then_finish(names: list[str]) -> None:
    try:
        warm_up(names)
    finally:
        _finished.set()


async def ready(timeout: float = READY_TIMEOUT_S) -> bool:
    """On a worker (``Client.run`` awaits it on the worker's event loop, which it leaves free): return once
    the worker's warm-up has ended, or has run ``timeout`` seconds; whether it has ended."""
    deadline = time.monotonic() + timeout
    while not _finished.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    return _finished.is_set()


def warm_up(names: list[str]) -> int:
    """Import ``names`` and load every cached overload of the public numba dispatchers they define; returns
    how many overloads were loaded. Failures are logged and skipped: warm-up only saves time. What was imported
    lives as long as the worker, so it is then set aside from the garbage collector's full collections
    (:func:`pipeline.cluster.gcpolicy.set_aside_for_good`)."""
    loaded = 0
    # numba's first call with an array imports numpy.ma (its typeof looks for masked arrays), which a worker's
    # first partition paid otherwise.
    for name in ("numpy.ma", *names):
        try:
            module = importlib.import_module(name)
        except Exception:       # noqa: BLE001 - the task that needs it will raise properly
            log.debug("warm-up: cannot import %s", name, exc_info=True)
            continue
        _warmed[name] = os.getpid()
        for attr, value in list(vars(module).items()):
            if getattr(value, "__module__", None) == name and not attr.startswith("_"):
                loaded += _load_cached(value)
    gcpolicy.set_aside_for_good()
    return loaded


def prepare_fork_server() -> None:
    """In the process that local workers are forked from (:func:`pipeline.cluster.forkserver.start`): import what a
    worker runs (distributed's nanny and worker) and warm up the modules named in ``BOOTPROF_WARM_UP``,
    so that every worker forked from it starts warm. Failures are logged and skipped, as in
    :func:`warm_up`: a worker that misses something imports it itself."""
    try:
        import distributed.nanny  # noqa: F401
        import distributed.worker  # noqa: F401
    except Exception:           # noqa: BLE001 - the worker will raise properly
        log.debug("fork server: cannot import distributed", exc_info=True)
    warm_up([n for n in os.environ.get(ENV, "").split(",") if n])


def load_kernels(dispatchers) -> int:
    """Load the cached overloads of these numba dispatchers now (never compiling); returns how many. For a
    process that is not a worker: the first load in a process also sets up numba's code generator (~0.2 s
    here), which is better paid while the process waits than when it needs the kernels."""
    return sum(_load_cached(d) for d in dispatchers)


def _load_cached(dispatcher) -> int:
    """Load the overloads of a numba dispatcher whose machine code is in its cache for this CPU."""
    cache = getattr(dispatcher, "_cache", None)
    index_file = getattr(cache, "_cache_file", None)
    if index_file is None or not hasattr(dispatcher, "compile"):
        return 0
    try:
        # numba's cache index: {(signature, codegen magic tuple): file}; the magic tuple names the
        # target CPU and features the code was compiled for.
        magic = dispatcher.targetctx.codegen().magic_tuple()
        sigs = [key[0] for key in index_file._load_index() if key[1] == magic]
        for sig in sigs:
            dispatcher.compile(sig)
        return len(sigs)
    except Exception:           # noqa: BLE001 - private numba API: on any change, no warm-up
        log.debug("warm-up: cannot load the cache of %r", dispatcher, exc_info=True)
        return 0
