"""A status line for the long steps of a stage (the decode of a multi-GB trace runs for minutes).

Written to standard error only when that is a terminal, one line rewritten in place and erased at the
end, so that logs, pipes, CI output and the JSON a command prints see nothing of it.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Seconds between two updates of the line (the last one, at 100 %, is always shown).
INTERVAL_S = 0.25


class Status:
    """``Status(label, total)``; ``advance(n)`` as bytes (or, with ``unit``, things of that name) are done,
    ``say(text)`` for a step without a measure, ``close()`` (or the end of a ``with``) erases the line."""

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
        self.width = 0

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
        if self.on and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0

    def _write(self, text: str, now: float) -> None:
        line = f"{self.label}: {text}"
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width, self.shown = max(self.width, len(line)), now
