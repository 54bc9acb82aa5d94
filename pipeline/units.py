"""Sizes as a config writes them ("20MB", "64MiB"): the runtime's smallest module, imported by the config and by
what the config is about (clusters, run mirrors) without a cycle.

The config parses each size once, into a :class:`Size`: a number of bytes that remembers how it was written, so
that what uses it computes with an int and what shows it (messages, the resolved config) says it as the user did.
"""

from __future__ import annotations

from pipeline.errors import ConfigError


def parse_size(text: str) -> int:
    """'1GB' -> 1_000_000_000, '64MiB' -> 67_108_864, '1000' -> 1000."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9}
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise ConfigError(f"not a size: {text!r} (expected e.g. 20MB, 1GB, 64MiB)") from None
    if unit not in units or value < 0:
        raise ConfigError(f"not a size: {text!r} (expected e.g. 20MB, 1GB, 64MiB)")
    return int(value * units[unit])


class Size(int):
    """A number of bytes (an ``int`` in every use: arithmetic, comparisons, ``str``) with ``text``, how the config
    wrote it ("64MiB"), for messages and for the resolved config. ``Size("64MiB")`` parses (ConfigError when it
    is no size); ``Size(1000)`` is 1000 bytes, written "1000"."""

    text: str

    def __new__(cls, value: str | int) -> Size:
        size = super().__new__(cls, parse_size(value) if isinstance(value, str) else int(value))
        size.text = value if isinstance(value, str) else str(int(value))
        return size

    def __repr__(self) -> str:
        return f"Size({self.text!r})"

    __str__ = int.__repr__      # (the number: ``f"{size}B"`` is what DuckDB reads)

    def __reduce__(self):
        return Size, (self.text,)
