"""What the decode stage is given, told apart by content, not by name: an ETL file starts with a buffer header whose
first record is the logfile header event; a measureme file starts with ``MMPD``; a directory is searched for
``*.mm_profdata`` files. One run holds at most one ETL trace and any number of self-profiles. An input may be an
fsspec URL (:mod:`pipeline.sources`)."""

from __future__ import annotations

import struct
from pathlib import Path

from pipeline import sources
from pipeline.errors import InputError

ETL = "etl"
SELF_PROFILE = "mm_profdata"
PERF = "perf"   # a Linux perf.data file (``pipeline.decode.perf``): the run's one trace, as an ETL trace would be


def sniff(path: sources.Input) -> str:
    """Which format a file is, by its first bytes; InputError naming the file otherwise."""
    head = sources.read_head(path, 0x50)
    if head[:4] == b"MMPD":
        return SELF_PROFILE
    if head[:8] in (b"PERFILE2", b"2ELIFREP"):     # (a big-endian one is refused by the perf decoder, by name)
        return PERF
    if len(head) >= 0x4C:
        buffer_type = struct.unpack_from("<H", head, 0x36)[0]
        header_type, marker_flags = head[0x4A], head[0x4B]
        if marker_flags == 0xC0 and header_type in (0x01, 0x02) and buffer_type in (4, 0):
            return ETL
    if len(head) < 0x4C:
        raise InputError(f"{path}: {len(head)} bytes: too short to be an ETL trace or a .mm_profdata file")
    raise InputError(
        f"{path}: not an ETL trace (no logfile header event at byte offset 0x48) "
        f"and not a .mm_profdata file (no 'MMPD' magic at offset 0)"
    )


def classify(inputs: list[sources.Input]) -> tuple[sources.Input | None, list[sources.Input]]:
    """Split inputs (paths or URLs, see :mod:`pipeline.sources`) into the one ETL trace and the self-profile
    files (directories expanded)."""
    etl: list[sources.Input] = []
    profiles: list[sources.Input] = []
    for raw in inputs:
        path = raw if sources.is_url(raw) else Path(raw)
        if not sources.exists(path):
            raise InputError(f"{path}: no such file or directory")
        if not sources.is_url(path):
            path = path.absolute()     # (the tasks may run in workers of another working directory)
        if not sources.is_url(path) and not (path.is_file() or path.is_dir()):
            raise InputError(f"{path}: not a regular file or directory (a pipe, FIFO or device): bootprof reads a "
                             "trace at offsets, so give the file itself")
        if sources.is_dir(path):
            found = sources.profiles_below(path)
            if not found:
                raise InputError(f"{path}: directory holds no .mm_profdata files")
            profiles.extend(found)
            continue
        kind = sniff(path)
        (etl if kind in (ETL, PERF) else profiles).append(path)
    if len(etl) > 1:
        raise InputError(f"one run holds one ETL trace, got {len(etl)}: {', '.join(map(str, etl))}")
    return (etl[0] if etl else None), profiles
