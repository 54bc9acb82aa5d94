"""Worker warm-up: each worker of a local cluster imports the modules the stages will run and loads
their numba kernels from the on-disk cache, on a background thread, while it has no task to run.

A fresh worker otherwise pays for both inside its first tasks: on the ETL decoder that is ~0.4 s of
imports and ~0.25 s of loading compiled kernels, 10-15 % of decoding a 1 GB trace with one worker.
Started at worker start, the work overlaps with the rest of the cluster's start and with the client's
own imports and buffer walk. It pauses while a task runs (``IdleGate``): the thread and the task share one
interpreter, and a warm-up that went on beside the first tasks slowed them more than it saved. A
task that needs a module or kernel the thread has not loaded yet loads it itself (or waits for the
import lock the thread holds), as it would without warm-up.

Modules come from ``BOOTPROF_WARM_UP`` (comma-separated module names) in the worker's environment,
which :func:`pipeline.cluster.connect` sets from what the stages declare (``WARM_UP`` in a stage
package). Only overloads already compiled for this machine are loaded: warm-up never compiles. Private
kernels (a leading ``_``: called only by other kernels, whose cached code contains them) are skipped.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import threading
import time
from typing import Callable

ENV = "BOOTPROF_WARM_UP"
#: How long a worker must have run no task before the warm-up goes on (tasks queued on a worker start
#: within a few milliseconds of each other: the warm-up must not slip in between).
QUIET_S = 0.03
log = logging.getLogger(__name__)


def dask_setup(worker) -> None:
    """distributed's preload hook: start the warm-up and return at once."""
    names = [n for n in os.environ.get(ENV, "").split(",") if n]
    if names:
        gate = IdleGate()
        # (a worker plugin: the worker's state machine tells it every task's transitions)
        worker.plugins["bootprof-warm-up"] = gate
        threading.Thread(target=warm_up, args=(names, gate.wait), name="bootprof-warm-up", daemon=True).start()


class IdleGate:
    """Open while the worker runs no task. On the 1 GB synth trace with one worker (eight interleaved
    pairs, dask's task stream), the first partition took 141-242 ms with the gate and 249-470 ms without
    it, faster in every pair; the partitions' sum was lower in six of the eight pairs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._since = time.monotonic()
        self._idle = threading.Event()
        self._idle.set()

    def transition(self, key, start, finish, **kwargs) -> None:
        """distributed's ``WorkerPlugin.transition``: counts the tasks in state ``executing``."""
        if (start == "executing") == (finish == "executing"):
            return
        with self._lock:
            self._running = max(0, self._running + (1 if finish == "executing" else -1))
            self._since = time.monotonic()
            if self._running:
                self._idle.clear()
            else:
                self._idle.set()

    def wait(self) -> None:
        """Return once the worker has run no task for ``QUIET_S``."""
        while True:
            self._idle.wait()
            with self._lock:
                quiet = time.monotonic() - self._since if not self._running else 0.0
            if quiet >= QUIET_S:
                return
            time.sleep(QUIET_S - quiet)


def warm_up(names: list[str], wait: Callable[[], None] = lambda: None) -> int:
    """Import ``names`` and load every cached overload of the public numba dispatchers they define; returns
    how many overloads were loaded. ``wait()`` is called before each import and each overload (the
    worker's ``IdleGate``). Failures are logged and skipped: warm-up only saves time. What was imported
    lives as long as the worker, so it is then set aside from the garbage collector's full collections
    (:func:`set_aside`)."""
    loaded = 0
    # numba's first call with an array imports numpy.ma (its typeof looks for masked arrays): 6-20 ms that a
    # worker's first partition paid (profiled in the worker).
    for name in ("numpy.ma", *names):
        wait()
        try:
            module = importlib.import_module(name)
        except Exception:       # noqa: BLE001 - the task that needs it will raise properly
            log.debug("warm-up: cannot import %s", name, exc_info=True)
            continue
        for attr, value in list(vars(module).items()):
            if getattr(value, "__module__", None) == name and not attr.startswith("_"):
                loaded += _load_cached(value, wait)
    set_aside()
    return loaded


def load_kernels(dispatchers) -> int:
    """Load the cached overloads of these numba dispatchers now (never compiling); returns how many. For a
    process that is not a worker: the first load in a process also sets up numba's code generator (~0.2 s
    here), which is better paid while the process waits than when it needs the kernels."""
    return sum(_load_cached(d, lambda: None) for d in dispatchers)


_thaw_at_exit: list[bool] = []


def set_aside() -> None:
    """Move every object that exists now out of the garbage collector's full collections, for the rest
    of the process (a worker's imports: ~150,000 objects the collector would otherwise scan again and
    again). They are thawed at exit, so finalization runs as usual: objects still frozen then are never
    finalized, and DuckDB's bindings print leak reports for them."""
    gc.freeze()
    if not _thaw_at_exit:
        atexit.register(gc.unfreeze)
        _thaw_at_exit.append(True)


def _load_cached(dispatcher, wait: Callable[[], None]) -> int:
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
            wait()
            dispatcher.compile(sig)
        return len(sigs)
    except Exception:           # noqa: BLE001 - private numba API: on any change, no warm-up
        log.debug("warm-up: cannot load the cache of %r", dispatcher, exc_info=True)
        return 0
