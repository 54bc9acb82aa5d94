"""One way to run a step beside the caller and wait for it: :func:`beside` runs a function on a thread of its own
and gives a ``Future`` of what it returns (or raises); :func:`wait_for` waits for futures in steps that a Ctrl-C
reaches. A job's stage that starts beside the one before it, an aggregate section that runs beside the others,
and the aggregate's wait for ``symbolized/`` are each a ``beside``; what one step hands another while both run
(the cpu section's resolved units) is a ``Future`` too."""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")

#: Seconds between two looks of a thread that waits for others (:func:`wait_for`).
WAIT_STEP_S = 0.25


def beside(fn: Callable[[], T], name: str) -> Future[T]:
    """Run ``fn()`` on a daemon thread named ``name``; its result or its error (any, Ctrl-C's too) goes to the
    future. The thread ends with the process: a caller that must not leave it running waits for the future."""
    future: Future[T] = Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the step
            future.set_exception(exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def wait_for(futures: Iterable[Any], stop: threading.Event | None = None, step: float = WAIT_STEP_S) -> bool:
    """Return once every future of ``futures`` is done (True), or ``stop`` is set first (False), looking every
    ``step`` seconds: the kernel may hand a process's SIGINT to any of its threads, and a main thread waiting with
    no timeout never sees it, where one waiting in steps raises ``KeyboardInterrupt`` within one."""
    pending = set(futures)
    while pending:
        if stop is not None and stop.is_set():
            return False
        _, pending = concurrent.futures.wait(pending, timeout=step)
    return True
