"""What bounded the build's wall time: the chain of rustc processes on its critical path, from their command lines.

A rustc process writes ``lib<crate><extra-filename>.rlib`` (and ``.rmeta``, ``.so``, ...) into its ``--out-dir``
(``--crate-name``, ``-C extra-filename``); another reads it with ``--extern name=PATH``. So a process depends on
each earlier process whose output its ``--extern`` paths name. The chain starts at the process that ended last
and goes back, each time to the dependency that ended last: what it could not start without (cargo starts a
dependent once a library's metadata is written, so a link's wait may be negative: the two overlapped). Processes
whose command lines name no ``--extern`` (a build without cargo, a trace that cut them) give no chain.
"""

from __future__ import annotations

import re
from typing import Any

EXTERN = re.compile(r'--extern[= ]"?([A-Za-z0-9_]+)=("[^"]+"|\S+)')
CRATE = re.compile(r'--crate-name[= ]"?([A-Za-z0-9_]+)')
EXTRA = re.compile(r'extra-filename=([-\w]*)')


def _stem(path: str) -> str:
    """``lib<crate><extra>`` of an artifact's path (any of ``/`` or ``\\`` separators, the extension left out)."""
    name = re.split(r"[\\/]", path.strip('"'))[-1]
    return name.rsplit(".", 1)[0]


def output_stem(command_line: str) -> str | None:
    crate = CRATE.search(command_line or "")
    if not crate:
        return None
    extra = EXTRA.search(command_line)
    return f"lib{crate.group(1)}{extra.group(1) if extra else ''}"


def chain(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The critical path through ``procs`` (each with ``command_line``, ``start_ns``, ``end_ns`` and whatever else it
    carries), first to last, each with ``wait_ns``: its start less the end of the one before it (None for the first).
    Empty when no process names another's output."""
    procs = [p for p in procs if p.get("start_ns") is not None and p.get("end_ns") is not None]
    producers: dict[str, list[dict]] = {}
    for p in procs:
        stem = output_stem(p.get("command_line") or "")
        if stem:
            producers.setdefault(stem, []).append(p)

    def deps(p: dict) -> list[dict]:
        found = []
        for _, path in EXTERN.findall(p.get("command_line") or ""):
            found += [q for q in producers.get(_stem(path), []) if q is not p and q["start_ns"] < p["start_ns"]]
        return found

    if not procs or not any(deps(p) for p in procs):
        return []
    out = [max(procs, key=lambda p: p["end_ns"])]
    while True:
        before = deps(out[-1])
        if not before:
            break
        out.append(max(before, key=lambda q: q["end_ns"]))
    out.reverse()
    return [{**p, "wait_ns": None if k == 0 else p["start_ns"] - out[k - 1]["end_ns"]} for k, p in enumerate(out)]
