"""The machine to one test for a while. pytest-xdist runs the suite in two processes; a test that measures real
run-to-run noise (``tests/test_nightly_real.py`` builds a workspace night after night) must not share the cores with
whatever the other process runs then, or its history holds that instead of the builds' own noise.

Every test holds a lock of the whole test run shared from its setup to its teardown (``tests/conftest.py``);
:func:`alone` turns the caller's into an exclusive one: it waits until the tests that other processes run have
ended, and their next ones wait until it is done. (``flock``: the suite runs on Linux.)"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

_fd: int | None = None


def open_lock(path: Path) -> None:
    global _fd
    _fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Held by every test (with other tests), from setup to teardown."""
    assert _fd is not None
    fcntl.flock(_fd, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(_fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Inside a test (or its fixture): no other test runs until this is left."""
    assert _fd is not None
    fcntl.flock(_fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(_fd, fcntl.LOCK_SH)
