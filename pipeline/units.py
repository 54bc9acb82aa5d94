"""Sizes as a config writes them ("20MB", "64MiB"): the runtime's smallest module, imported by the config and by
what the config is about (clusters, run mirrors) without a cycle."""

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
