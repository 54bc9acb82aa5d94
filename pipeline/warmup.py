"""Worker warm-up: while a local cluster starts, each worker imports the modules the stages will run
and loads their numba kernels from the on-disk cache, on a background thread.

A fresh worker otherwise pays for both inside its first task: on the ETL decoder that is ~0.4 s of
imports and ~0.25 s of loading compiled kernels, 10-15 % of decoding a 1 GB trace with one worker.
Started at worker start, the work overlaps with the rest of the cluster's start and with the client's
own imports and buffer walk; a task that needs a module or kernel before the thread has it waits for
the same import lock or compiler lock it would have taken anyway.

Modules come from ``BOOTPROF_WARM_UP`` (comma-separated module names) in the worker's environment,
which :func:`pipeline.cluster.connect` sets from what the stages declare (``WARM_UP`` in a stage
package). Only overloads already compiled for this machine are loaded: warm-up never compiles.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import threading

ENV = "BOOTPROF_WARM_UP"
log = logging.getLogger(__name__)


def dask_setup(worker) -> None:
    """distributed's preload hook: start the warm-up and return at once."""
    names = [n for n in os.environ.get(ENV, "").split(",") if n]
    if names:
        threading.Thread(target=warm_up, args=(names,), name="bootprof-warm-up", daemon=True).start()


def warm_up(names: list[str]) -> int:
    """Import ``names`` and load every cached overload of the numba dispatchers they define; returns how
    many overloads were loaded. Failures are logged and skipped: warm-up only saves time. What was
    imported lives as long as the worker, so it is then set aside from the garbage collector's full
    collections (:func:`set_aside`)."""
    loaded = 0
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:       # noqa: BLE001 - the task that needs it will raise properly
            log.debug("warm-up: cannot import %s", name, exc_info=True)
            continue
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) == name:
                loaded += _load_cached(value)
    set_aside()
    return loaded


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
