"""A status line for the long steps of a stage (the decode of a multi-GB trace runs for minutes).

Written to standard error only when that is a terminal, one line rewritten in place and erased at the
end, so that logs, pipes, CI output and the JSON a command prints see nothing of it.

Every :class:`Status` of the process shares that one line. A job shows ``decode: running`` and the decode
shows its bytes under the same label: the newer status of a label stands for it. Statuses of different labels
(a stage that runs beside another) are shown side by side, ``symbolize, aggregate: running · symbolize: 3 of 21
symbol files (14 %)``, cut to the terminal's width. :func:`print_line` prints a line of output above the status
line instead of into it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from pipeline import portable

#: Seconds between two updates of the line (the last one, at 100 %, is always shown).
INTERVAL_S = 0.25
#: Between the statuses shown side by side.
SEPARATOR = " · "


class _Line:
    """The one status line of a stream: the statuses shown on it, oldest first, and how wide it was drawn."""

    def __init__(self) -> None:
        self.shown: list[Status] = []
        self.width = 0

    def draw(self, stream: TextIO) -> None:
        newest = {s.label: s for s in self.shown}           # (a label's newest status stands for it)
        line = SEPARATOR.join(f"{s.label}: {s.text}" for s in self.shown if newest[s.label] is s)
        line = line[:_columns(stream)]
        if line:
            stream.write("\r" + line.ljust(self.width))
            self.width = max(self.width, len(line))
        else:
            self.erase(stream)
        stream.flush()

    def erase(self, stream: TextIO) -> None:
        if self.width:
            stream.write("\r" + " " * self.width + "\r")
            stream.flush()
            self.width = 0


_lock = threading.RLock()
_lines: dict[int, _Line] = {}


def _line_of(stream: TextIO) -> _Line:
    return _lines.setdefault(id(stream), _Line())


class Status:
    """``Status(label, total)``; ``advance(n)`` as bytes (or, with ``unit``, things of that name) are done,
    ``say(text)`` for a step without a measure, ``close()`` (or the end of a ``with``) takes it off the line."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, unit: str | None = None):
        self.label, self.total, self.unit = label, max(int(total), 0), unit
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.on = self.stream.isatty()
        except (AttributeError, ValueError):        # (no isatty, or a closed stream)
            self.on = False
        self.done = 0
        self.start = time.monotonic()
        self.shown = 0.0
        self.text = ""

    def __enter__(self) -> "Status":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int) -> None:
        self.done += int(n)
        if not self.on:
            return
        now = time.monotonic()
        if now - self.shown < INTERVAL_S and self.done < self.total:
            return
        elapsed = max(now - self.start, 1e-9)
        pct = 100 * self.done / self.total if self.total else 100.0
        if self.unit is None:
            text = f"{self.done / 1e9:.2f} of {self.total / 1e9:.2f} GB ({pct:.0f} %), {self.done / 1e6 / elapsed:.0f} MB/s"
        else:
            text = f"{self.done} of {self.total} {self.unit} ({pct:.0f} %)"
        if 0 < self.done < self.total:
            text += f", {(self.total - self.done) * elapsed / self.done:.0f} s to go"
        self._write(text, now)

    def say(self, text: str) -> None:
        if self.on:
            self._write(text, time.monotonic())

    def close(self) -> None:
        if not self.on:
            return
        with _lock:
            line = _line_of(self.stream)
            if self in line.shown:
                line.shown.remove(self)
                line.draw(self.stream)

    def _write(self, text: str, now: float) -> None:
        with _lock:
            self.text, self.shown = text, now
            line = _line_of(self.stream)
            if self not in line.shown:
                line.shown.append(self)
            line.draw(self.stream)


def print_line(text: str) -> None:
    """Print ``text`` to standard output as ``print`` does; when the status line is on the same terminal, above it:
    the line is erased first and drawn again below the text."""
    out = sys.stdout
    with _lock:
        line = _line_of(sys.stderr)
        if not (line.width and _same_terminal(out, sys.stderr)):
            print(text, file=out, flush=True)
            return
        line.erase(sys.stderr)
        print(text, file=out, flush=True)
        line.draw(sys.stderr)


def _columns(stream: TextIO) -> int | None:
    """How many characters fit on the terminal's line (None: unknown; a line that wraps would not be rewritten
    in place)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return None
    return columns - 1 if columns >= 20 else None


_same_terminal = portable.same_terminal
