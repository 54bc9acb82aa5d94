"""Command lines of a perf run's processes, from the self-profiles decoded beside it.

perf records no command lines, only each thread's ``comm`` (``rustc``, 15 bytes at most), so a perf run's
``processes.command_line`` would be NULL and CPU by crate, the critical path (``--crate-name``, ``--extern``) and
the join of samples to queries would have nothing to go on. A rustc self-profile carries its process's id and
argv (METADATA ``process_id`` and ``cmd``, ``decoded/self_profiles``): each profile names the process instance of
its pid, and that instance's ``command_line`` becomes the profile's argv. When a pid ran more than once in the
recording, the instance alive at the profile's start is taken (its times are put on the profile's wall clock with
``perf_file.origin_unix_ns``); a profile that names no instance, or one of several without that clock, is counted,
not guessed. Processes without a profile (cargo, the linker, build scripts) keep a NULL command line: their
``image_name`` (comm) is all the run knows of them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def match(processes: list[dict], profiles: list[dict], origin_unix_ns: int | None) -> tuple[dict[int, str], int]:
    """Row index in ``processes`` -> command line, and how many profiles matched no instance. ``processes`` rows
    have ``pid``, ``start_ns``, ``end_ns``; ``profiles`` rows ``pid``, ``cmd``, ``start_time_ns`` (Unix ns)."""
    by_pid: dict[int, list[int]] = {}
    for i, p in enumerate(processes):
        by_pid.setdefault(int(p["pid"]), []).append(i)
    named: dict[int, str] = {}
    unmatched = 0
    for sp in profiles:
        rows = by_pid.get(int(sp["pid"]), [])
        if len(rows) > 1:
            rows = [i for i in rows if _alive(processes[i], sp["start_time_ns"], origin_unix_ns)]
        if len(rows) != 1 or rows[0] in named:
            unmatched += 1
            continue
        named[rows[0]] = sp["cmd"].rstrip(" ")
    return named, unmatched


def _alive(p: dict, unix_ns: int | None, origin_unix_ns: int | None) -> bool:
    """Whether the instance ``p`` was alive at the Unix time ``unix_ns`` (False when it cannot be told)."""
    if unix_ns is None or origin_unix_ns is None:
        return False
    t = unix_ns - origin_unix_ns
    return (p["start_ns"] is None or p["start_ns"] <= t) and (p["end_ns"] is None or t <= p["end_ns"])


def name_from_profiles(out, summary: dict[str, Any]) -> None:
    """Fill ``command_line`` of ``out``'s perf ``processes`` table from its ``self_profiles`` (both written by this
    decode), rewriting the table; ``summary`` is the perf decode's (its ``origin_unix_ns``), and gets the counts."""
    procs = pq.read_table(out.table_path("processes"))
    profiles = pq.read_table(out.table_path("self_profiles"), columns=["pid", "cmd", "start_time_ns", "status"])
    profiles = profiles.filter(pc.and_(pc.equal(profiles.column("status"), "ok"),
                                       pc.invert(pc.is_null(profiles.column("cmd")))))
    named, unmatched = match(procs.select(["pid", "start_ns", "end_ns"]).to_pylist(), profiles.to_pylist(),
                             summary.get("origin_unix_ns"))
    lines = procs.column("command_line").to_pylist()
    for i, cmd in named.items():
        lines[i] = cmd
    at = procs.schema.get_field_index("command_line")
    out.write_table("processes", procs.set_column(at, procs.schema.field(at), pa.array(lines, pa.string())))
    summary.update(command_lines_from_profiles=len(named), profiles_unmatched=unmatched)
