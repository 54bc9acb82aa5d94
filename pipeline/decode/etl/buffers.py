"""Layer 1, bytes: walk the buffer chain and read the logfile header.

One sequential pass reads the 0x48-byte header of every buffer and hops by its BufferSize (never
``i * BufferSize``: relogged files have a short header buffer and compressed buffers each have their own
on-disk size). The result is a table of buffer descriptors that later layers hand to dask tasks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.decode.etl import layout as L
from pipeline.errors import InputError

#: Descriptor of one buffer, as handed to partitions.
BUFFER_DESC = np.dtype(
    [
        ("index", "<i4"),          # position in the file's chain (0 = header buffer)
        ("file_offset", "<i8"),
        ("buffer_size", "<u4"),    # on-disk size
        ("data_len", "<u4"),       # bytes of event records once decompressed (0 when unusable)
        ("cpu", "<u2"),
        ("sequence", "<i8"),
        ("buffer_flag", "<u2"),
        ("buffer_type", "<u2"),
        ("compressed", "?"),
    ]
)

#: Largest buffer accepted (ETW caps buffers at 16 MiB; anything larger is corruption, not data).
MAX_BUFFER_SIZE = 1 << 26


@dataclass
class TraceHeader:
    """The logfile header (§1.3) plus the constants every partition needs."""

    path: str
    file_size: int
    pointer_size: int
    fields: dict[str, Any]
    header_ts: int          # raw timestamp of the header event = sync point for start_time_filetime
    perf_freq: int          # clock ticks per second (after ClockType)
    logger_name: str
    log_file_name: str
    walk_errors: list[dict[str, Any]] = field(default_factory=list)     # each ended the chain: a buffer skipped
    field_errors: list[dict[str, Any]] = field(default_factory=list)    # header fields that cannot be what they say


def _read_logfile_header(path: Path, head: bytes, file_size: int) -> TraceHeader:
    if len(head) < L.LOGFILE_PAYLOAD_FILE_OFFSET + L.LOGFILE_HEADER_SIZE[4]:
        raise InputError(f"{path}: {file_size} bytes: too short for an ETL logfile header (buffer 0, offset 0x68)")
    marker = int.from_bytes(head[0x48:0x4C], "little")
    header_type, flags = (marker >> 16) & 0xFF, marker >> 24
    if flags != L.MARKER_FLAGS or header_type not in (L.HT_SYSTEM32, L.HT_SYSTEM64):
        raise InputError(f"{path}: buffer 0, byte offset 0x48: no logfile header event (marker 0x{marker:08x})")
    P = 8 if header_type == L.HT_SYSTEM64 else 4
    col = 0 if P == 8 else 1
    base = L.LOGFILE_PAYLOAD_FILE_OFFSET
    fields = {
        name: int(np.frombuffer(head, dtype=spec[2], count=1, offset=base + spec[col])[0])
        for name, spec in L.LOGFILE.items()
    }
    header_ts = int(np.frombuffer(head, dtype="<i8", count=1, offset=L.LOGFILE_HEADER_EVENT_TS_FILE_OFFSET)[0])
    rec_size = int.from_bytes(head[0x4C:0x4E], "little")
    strings = head[base + L.LOGFILE_HEADER_SIZE[P]: 0x48 + rec_size]
    names = _utf16_strings(strings, 2)
    clock = fields["clock_type"]
    if clock == L.CLOCK_SYSTEM_TIME:
        freq = 10_000_000
    elif clock == L.CLOCK_CPU_CYCLES:
        freq = fields["cpu_speed_mhz"] * 1_000_000
    else:
        freq = fields["perf_freq"]
    if freq <= 0:
        raise InputError(f"{path}: buffer 0, byte offset 0x{base + L.LOGFILE['perf_freq'][col]:x}: "
                         f"clock frequency {freq} (ClockType {clock}) is not usable")
    header = TraceHeader(str(path), file_size, P, fields, header_ts, freq, names[0], names[1])
    for name in L.LOGFILE_TIMES:
        if not 0 <= fields[name] <= L.MAX_FILETIME:        # (0: not set; the UTC column is then empty too)
            header.field_errors.append(_err(path, 0, base + L.LOGFILE[name][col], "header",
                                           f"{name} {fields[name]} is not a time; its UTC column is left empty"))
    return header


def _utf16_strings(raw: bytes, n: int) -> list[str]:
    out = []
    pos = 0
    for _ in range(n):
        end = pos
        while end + 1 < len(raw) and raw[end:end + 2] != b"\0\0":
            end += 2
        out.append(raw[pos:end].decode("utf-16-le", errors="replace"))
        pos = end + 2
    return out


def walk(path: Path) -> tuple[TraceHeader, np.ndarray]:
    """Read the logfile header and every buffer header; returns (header, BUFFER_DESC array).

    A buffer whose header is absurd (size smaller than a header, larger than MAX_BUFFER_SIZE, past the
    end of the file) ends the walk: the chain cannot be followed past it. It is reported in
    ``header.walk_errors``; everything before it is decoded.

    The loop reads each header and its BufferSize only; numpy reads the other fields of all the headers
    at once. 1 GB (14,842 buffers): 19-28 ms alone and 48-76 ms in a decode, where a struct and a dict per
    buffer took 43-45 ms alone and ~130 ms in a decode (beside the cluster's start and the file's hash). A
    memory map read by numba instead took 50-90 ms alone: a page fault per buffer.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with f:
        file_size = f.seek(0, 2)
        f.seek(0)
        head = f.read(0x1000)
        header = _read_logfile_header(path, head, file_size)
        heads: list[bytes] = []
        offsets: list[int] = []
        offset = 0
        fd = f.fileno()
        while offset < file_size:
            if offset + L.BUFFER_HEADER_SIZE > file_size:
                header.walk_errors.append(_err(path, len(heads), offset, "truncated",
                                               f"{file_size - offset} trailing bytes: too short for a buffer header"))
                break
            # One 0x48-byte read per buffer: the walk touches headers only, never the event data.
            raw = os.pread(fd, L.BUFFER_HEADER_SIZE, offset)
            size = int.from_bytes(raw[:4], "little")
            if size < L.BUFFER_HEADER_SIZE or size > MAX_BUFFER_SIZE:
                header.walk_errors.append(_err(path, len(heads), offset, "bad_buffer_size",
                                               f"BufferSize {size} outside [0x48, {MAX_BUFFER_SIZE}]; chain ends here"))
                break
            if offset + size > file_size:
                header.walk_errors.append(_err(path, len(heads), offset, "truncated",
                                               f"BufferSize {size} runs past the end of the file ({file_size} bytes)"))
                break
            heads.append(raw)
            offsets.append(offset)
            offset += size
    hdr = np.frombuffer(b"".join(heads), L.BUFFER_HEADER)
    descs = np.empty(len(hdr), dtype=BUFFER_DESC)
    descs["index"] = np.arange(len(hdr))
    descs["file_offset"] = offsets
    descs["buffer_size"] = hdr["buffer_size"]
    flag = hdr["buffer_flag"]
    compressed = (flag & L.BUFFER_FLAG_COMPRESSED) != 0
    # Event bytes: up to SavedOffset (the inflated size) when compressed, else up to the fill mark.
    sizes = hdr["buffer_size"].astype(np.int64)
    end = np.where(compressed, hdr["saved_offset"].astype(np.int64), np.minimum(hdr["offset"].astype(np.int64), sizes))
    descs["data_len"] = np.maximum(end - L.BUFFER_HEADER_SIZE, 0)
    descs["cpu"] = hdr["processor_index"] & L.PROCESSOR_INDEX_MASK
    descs["sequence"] = hdr["sequence"]
    descs["buffer_flag"] = flag
    descs["buffer_type"] = hdr["buffer_type"]
    descs["compressed"] = compressed
    return header, descs


def _err(path: Path, buffer: int, offset: int, kind: str, message: str) -> dict[str, Any]:
    return {"file": str(path), "buffer_index": buffer, "file_offset": offset, "record_offset": -1,
            "kind": kind, "message": f"{path}: buffer {buffer} at byte offset 0x{offset:x}: {message}"}
