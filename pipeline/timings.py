"""Where a stage's time went, for its manifest: the seconds of each DuckDB statement of its connections, by a short
label (``create cs_funcs``, ``copy cpu_by_function``), and of its waits (``wait symbolized``).

A stage records into a dict while it runs a step (:func:`recording`, one per thread: each aggregate section has its
own); :func:`timed` wraps a connection made meanwhile so that its ``execute`` adds to it; :func:`top` keeps the
largest for the manifest. A connection made outside a recording is left as it is.
"""

from __future__ import annotations

import contextvars
import re
import time
from contextlib import contextmanager
from typing import Any, Iterator

_CURRENT: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("timings", default=None)

#: How many labels a step keeps in the manifest (the rest are summed under ``other``).
KEEP = 12


@contextmanager
def recording(into: dict[str, float]) -> Iterator[dict[str, float]]:
    """Statements and waits of this thread add their seconds to ``into`` until the block ends."""
    token = _CURRENT.set(into)
    try:
        yield into
    finally:
        _CURRENT.reset(token)


def add(label: str, seconds: float) -> None:
    into = _CURRENT.get()
    if into is not None:
        into[label] = into.get(label, 0.0) + seconds


@contextmanager
def step(label: str) -> Iterator[None]:
    """The block's seconds under ``label``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        add(label, time.perf_counter() - t0)


_TARGET = re.compile(r"""^\s*(create\s+(?:or\s+replace\s+)?(?:temp\s+|temporary\s+)?(?:table|view)\s+(?:if\s+not\s+exists\s+)?|
                          insert\s+into\s+|delete\s+from\s+)"?([\w.]+)""", re.I | re.X)
_COPY_TO = re.compile(r"\bTO\s+'(?:[^']|'')*?([\w.-]+?)(?:\.parquet)?'\s*(?:\(|$)", re.I)


def label(sql: str) -> str:
    """A statement's label: its verb and the table it makes or writes (a COPY: the file's name), else its verb."""
    if m := _TARGET.match(sql):
        return f"{m.group(1).split()[0].lower()} {m.group(2)}"
    words = sql.split()
    verb = words[0].lower() if words else "?"
    if verb == "copy" and (m := _COPY_TO.search(sql)):
        return f"copy {m.group(1)}"
    return verb


class TimedConnection:
    """A DuckDB connection whose ``execute`` adds its seconds to ``into`` (everything else is the connection's
    own; ``execute`` returns the connection itself, as DuckDB's does, for its ``fetch*``)."""

    def __init__(self, con: Any, into: dict[str, float]):
        self._con = con
        self._into = into

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._con.execute(sql, *args, **kwargs)
        finally:
            key = label(sql)
            self._into[key] = self._into.get(key, 0.0) + time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def timed(con: Any) -> Any:
    """``con`` timed into the current recording (as it is, outside one)."""
    into = _CURRENT.get()
    return con if into is None else TimedConnection(con, into)


def top(into: dict[str, float], keep: int = KEEP) -> dict[str, float]:
    """The ``keep`` largest of ``into`` (seconds to 3 decimals, largest first) and the rest as ``other``."""
    ranked = sorted(into.items(), key=lambda kv: -kv[1])
    out = {k: round(v, 3) for k, v in ranked[:keep]}
    if len(ranked) > keep:
        out["other"] = round(sum(v for _, v in ranked[keep:]), 3)
    return out
