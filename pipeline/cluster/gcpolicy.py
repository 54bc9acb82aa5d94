"""What the garbage collector scans in the processes of a command and its cluster: the whole policy.

A full collection scans every object that is not set aside (``gc.freeze``). The imports of numpy, pyarrow,
duckdb, numba and dask are about a million objects in the process that runs a command and ~150,000 in a worker;
they live as long as the process, and full collections scanned them again and again while the scheduler and the
tasks allocated. So what exists at these moments is set aside:

* the command's process, while its cluster runs (:func:`set_aside_while`, in :func:`pipeline.cluster.connect`),
  and again once a stage has made its own imports (:func:`set_aside_now`, ``Pool.set_aside``); given back when
  the cluster closes, so the shutdown finalizes them as usual;
* a worker, for good: once its warm-up has imported the stages' modules (:func:`set_aside_for_good`), and again
  at its first task (:func:`set_aside_at_first_task`). Thawed after each task instead, they were scanned again by
  the worker's event loop between tasks (perf: ~3 % of a decode's samples). Only what exists then is frozen, so
  later garbage is collected as usual;
* at exit (:func:`keep_aside_at_exit`): see :func:`_at_exit`.

Imported by workers as they start: it imports nothing of the package.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys
from typing import Iterator


@contextlib.contextmanager
def set_aside_while() -> Iterator[None]:
    """While inside: the objects that exist now stay out of full collections (about 4 % of a decode's CPU in the
    command's process, which runs the scheduler). Given back at the end."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def set_aside_now() -> None:
    """Inside :func:`set_aside_while`: the objects made since it began (a stage's own imports, made after its
    cluster started: DuckDB, the numba kernels the command runs) stay out too, until it ends."""
    gc.freeze()


def set_aside_for_good() -> None:
    """Every object that exists now stays out of full collections for the rest of the process (a worker's
    imports); at exit, see :func:`_at_exit`."""
    gc.freeze()
    keep_aside_at_exit()


_first_task: list[bool] = []


def set_aside_at_first_task() -> None:
    """At a worker's first task, once per process: what its warm-up did not import (2.5 % of a decode's CPU was
    full collections over them in a profile) stays out for good too."""
    if not _first_task:
        set_aside_for_good()
        _first_task.append(True)


_exit_registered: list[bool] = []


def keep_aside_at_exit() -> None:
    """As the process exits, :func:`_at_exit` decides what stays set aside (registered once)."""
    if not _exit_registered:
        atexit.register(_at_exit)
        _exit_registered.append(True)


def _at_exit() -> None:
    """What a worker, or a process that set objects aside, does with them as it exits.

    Without DuckDB (a worker): everything is set aside, so the interpreter's teardown has no object to
    scan in its full collections, which scanned the worker's imports several times over while the cluster's
    close waited for the worker process to end.
    Objects in reference cycles are then never finalized; nothing a worker keeps needs it.

    With DuckDB (a process that ran a stage in-process): everything is thawed, so teardown runs as
    usual. DuckDB's bindings report every one of their objects that teardown did not finalize as leaked,
    on stderr."""
    if "_duckdb" in sys.modules:
        gc.unfreeze()
    else:
        gc.freeze()
