"""Layer 1, bytes: walk the buffer chain and read the logfile header.

One sequential pass reads the 0x48-byte header of every buffer and hops by its BufferSize (never
``i * BufferSize``: relogged files have a short header buffer and compressed buffers each have their own
on-disk size). The result is a table of buffer descriptors that later layers hand to dask tasks.

Damage never ends the walk silently (every case is an ``errors`` row with the buffer index and byte offset):

* A header that cannot start a buffer (``plausible``: size, type, flags, fill marks, CPU), or whose
  BufferSize does not lead to another such header or to the end of the file, is where the chain breaks.
  The walk *resynchronizes*: the bytes after it are searched for the next offset where a plausible header
  is followed by another one (or by the end of the file), and the chain goes on from there; every intact
  buffer after the damage is decoded.
* A buffer whose size and chain are sound but whose fill marks or CPU index cannot be is skipped alone.
* A buffer that repeats an earlier one byte for byte (header and data: a copy over another) is skipped.
* Fewer buffers than the logfile header's BuffersWritten (a file cut short, even exactly at a buffer
  boundary) is reported with the number missing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline import sources
from pipeline.decode.etl import layout as L
from pipeline.errors import InputError

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow

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
    walk_errors: list[ErrorRow] = field(default_factory=list)     # each a buffer (or damaged range) skipped
    field_errors: list[ErrorRow] = field(default_factory=list)    # header fields that cannot be what they say
    missing_buffers: int = 0            # BuffersWritten minus the buffers found (0 when not fewer)
    resync_bytes: int = 0               # bytes passed over to find the chain again after damage
    walk_reads: str = "file"            # how the walk read the headers: "file", or from a URL "headers" or "blocks"


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


#: Buffer fields that a resynchronizing scan and the chain check read, by offset in the 0x48-byte header.
_SIZE, _SAVED, _PROC, _LOGGER, _FILL, _FLAG, _TYPE = 0x00, 0x04, 0x28, 0x2A, 0x30, 0x34, 0x36
#: BufferFlag bits that exist (FLUSH_MARKER .. COMPRESSED) and the largest BufferType (DBG_INFO).
KNOWN_FLAGS, MAX_BUFFER_TYPE = 0x7F, 7
#: Bytes searched at a time when resynchronizing (plus one header of overlap).
SCAN_CHUNK = 1 << 24
#: Headers after a resynchronizing candidate that must chain on from it (or reach the end of the file): bytes
#: of event data that happen to look like one header rarely lead to three more.
RESYNC_LOOKAHEAD = 3


@dataclass
class _Limits:
    """What a data buffer's header may say in this file."""

    file_size: int
    capacity: int           # the session's BufferSize: the largest inflated fill of a compressed buffer
    cpus: int               # NumberOfProcessors (0: unknown, CPU not checked)
    logger_id: int = -1     # LoggerId of the data buffers met so far (-1: none yet, not checked)


def _fields(a: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """The checked fields of a header starting at each of the first ``n`` byte positions of ``a``."""
    def u(off: int, width: int) -> np.ndarray:
        v = a[off:off + n].astype(np.uint32)
        for k in range(1, width):
            v |= a[off + k:off + k + n].astype(np.uint32) << (8 * k)
        return v
    return {"size": u(_SIZE, 4), "saved": u(_SAVED, 4), "proc": u(_PROC, 2), "fill": u(_FILL, 4),
            "flag": u(_FLAG, 2), "type": u(_TYPE, 2), "logger": u(_LOGGER, 2)}


def _plausible(f: dict[str, np.ndarray], at: np.ndarray, lim: _Limits, strict: bool = True) -> np.ndarray:
    """Which headers (fields ``f`` of headers at file offsets ``at``) can start a data buffer: a size from 0x48
    to MAX_BUFFER_SIZE that stays in the file, known type and flags; ``strict``, also fill marks inside the
    buffer (inflated: inside the session's BufferSize) and a CPU index below the CPU count when the index is
    flagged valid, and the LoggerId of the buffers before. The chain is followed through headers that pass
    without ``strict`` (their buffer alone is skipped when it fails the rest); resynchronizing takes only
    strict ones."""
    size, flag = f["size"].astype(np.int64), f["flag"]
    compressed = (flag & L.BUFFER_FLAG_COMPRESSED) != 0
    ok = (size >= L.BUFFER_HEADER_SIZE) & (size <= MAX_BUFFER_SIZE) & (at + size <= lim.file_size)
    ok &= (f["type"] <= MAX_BUFFER_TYPE) & ((flag & ~np.uint32(KNOWN_FLAGS)) == 0)
    if not strict:
        return ok
    ok &= _fills_ok(f, compressed, size, lim)
    if lim.cpus > 0:
        ok &= ((flag & L.BUFFER_FLAG_PROC_INDEX) == 0) | ((f["proc"] & L.PROCESSOR_INDEX_MASK) < lim.cpus)
    if lim.logger_id >= 0 and "logger" in f:
        ok &= f["logger"] == lim.logger_id
    return ok


def _fills_ok(f: dict[str, np.ndarray], compressed: np.ndarray, size: np.ndarray, lim: _Limits) -> np.ndarray:
    """Fill marks that can be: SavedOffset of a compressed buffer within [0x48, the session's BufferSize] (or
    its own size); Offset of a plain buffer within [0x48, its size]."""
    saved, fill = f["saved"].astype(np.int64), f["fill"].astype(np.int64)
    inflated_ok = (saved >= L.BUFFER_HEADER_SIZE) & (saved <= np.maximum(lim.capacity, size))
    plain_ok = (fill >= L.BUFFER_HEADER_SIZE) & (fill <= size)
    return np.where(compressed, inflated_ok, plain_ok)


_HEADER_FIELDS = struct.Struct("<II32xHH4xIHH")   # size, saved, proc, logger, fill, flag, type


def plausible_one(raw: bytes, offset: int, lim: _Limits, strict: bool = True) -> bool:
    """``_plausible`` for one header, in plain Python (the walk checks every buffer, and numpy's cost per call
    would be most of the walk); ``test_buffer_checks_agree`` holds the two equal."""
    if len(raw) < L.BUFFER_HEADER_SIZE:
        return False
    size, saved, proc, logger, fill, flag, btype = _HEADER_FIELDS.unpack_from(raw)
    if not (L.BUFFER_HEADER_SIZE <= size <= MAX_BUFFER_SIZE and offset + size <= lim.file_size
            and btype <= MAX_BUFFER_TYPE and not flag & ~KNOWN_FLAGS):
        return False
    if not strict:
        return True
    if flag & L.BUFFER_FLAG_COMPRESSED:
        fills = L.BUFFER_HEADER_SIZE <= saved <= max(lim.capacity, size)
    else:
        fills = L.BUFFER_HEADER_SIZE <= fill <= size
    cpu_ok = lim.cpus <= 0 or not flag & L.BUFFER_FLAG_PROC_INDEX or (proc & L.PROCESSOR_INDEX_MASK) < lim.cpus
    return fills and cpu_ok and (lim.logger_id < 0 or logger == lim.logger_id)


def _chains(pread, offset: int, raw: bytes, lim: _Limits, strict: bool = False) -> tuple[bool, bytes | None]:
    """Whether the header ``raw`` at ``offset`` is plausible (``strict``: see ``_plausible``) and its BufferSize
    leads to another plausible header or exactly to the end of the file; and the header it leads to (None at
    the end), for the walk's next step."""
    if not plausible_one(raw, offset, lim, strict):
        return False, None
    nxt = offset + int.from_bytes(raw[:4], "little")
    if nxt == lim.file_size:
        return True, None
    after = pread(L.BUFFER_HEADER_SIZE, nxt)
    return plausible_one(after, nxt, lim, False), after


def _leads_on(pread, offset: int, raw: bytes, lim: _Limits) -> bool:
    """A resynchronizing candidate: a strict header whose chain goes on for RESYNC_LOOKAHEAD more headers (or to
    the end of the file)."""
    ok, after = _chains(pread, offset, raw, lim, strict=True)
    for _ in range(RESYNC_LOOKAHEAD - 1):
        if not ok or after is None:
            return ok
        offset += int.from_bytes(raw[:4], "little")
        raw = after
        ok, after = _chains(pread, offset, raw, lim, strict=True)
    return ok


def _resync(pread, bad: int, lim: _Limits) -> int | None:
    """The first offset after the broken header at ``bad`` where the chain can go on (``_leads_on``), or None.

    First the offsets a whole number of session buffers after it (where an uncompressed file's next buffers
    are), then every byte before the first of those that leads on (compressed buffers have sizes of their
    own): candidates are found with numpy over SCAN_CHUNK bytes at a time and checked one by one."""
    limit = lim.file_size
    if lim.capacity >= L.BUFFER_HEADER_SIZE:
        for at in range(bad + lim.capacity, lim.file_size - L.BUFFER_HEADER_SIZE + 1, lim.capacity):
            if _leads_on(pread, at, pread(L.BUFFER_HEADER_SIZE, at), lim):
                limit = at
                break
    pos = bad + 1
    while pos + L.BUFFER_HEADER_SIZE <= min(limit, lim.file_size):
        data = pread(min(SCAN_CHUNK, limit - pos) + L.BUFFER_HEADER_SIZE - 1, pos)
        n = len(data) - L.BUFFER_HEADER_SIZE + 1
        if n <= 0:
            break
        a = np.frombuffer(data, np.uint8)
        for k in np.flatnonzero(_plausible(_fields(a, n), pos + np.arange(n, dtype=np.int64), lim)).tolist():
            if _leads_on(pread, pos + k, data[k:k + L.BUFFER_HEADER_SIZE], lim):
                return pos + k
        pos += n
    return limit if limit < lim.file_size else None


def walk(path: Path) -> tuple[TraceHeader, np.ndarray]:
    """Read the logfile header and every buffer header; returns (header, BUFFER_DESC array).

    Damage is reported in ``header.walk_errors`` (a buffer or damaged range skipped) and ``field_errors``
    (missing buffers), and the walk goes on past it (see the module doc). A buffer skipped for its fields
    keeps its descriptor with ``data_len`` 0; a duplicate is left out.

    The loop reads each header and its BufferSize only, plus the header its BufferSize leads to (from the page
    cache: the next read of the loop); numpy reads the other fields of all the headers at once (a struct and a
    dict per buffer took twice as long; a memory map read by numba, a page fault per buffer). ``path`` may be a
    URL (:mod:`pipeline.sources`): its
    headers are then fetched PREFETCH buffers at a time.
    """
    with sources.Reader(path) as f:
        file_size = f.size
        head = f.pread(min(0x1000, file_size), 0)
        header = _read_logfile_header(path, head, file_size)
        lim = _Limits(file_size, int(header.fields["buffer_size"]), int(header.fields["cpu_count"]))
        f.stride = lim.capacity if lim.capacity >= L.BUFFER_HEADER_SIZE else 0
        heads: list[bytes] = []
        offsets: list[int] = []
        offset = 0
        pread = f.pread
        found: dict[int, int | None] = {}   # broken header -> where the chain resumes after it (None: nowhere)
        ahead: bytes | None = None          # the header at ``offset`` when the chain check read it already
        while offset < file_size:
            if offset + L.BUFFER_HEADER_SIZE > file_size:
                header.walk_errors.append(_err(path, len(heads), offset, "truncated",
                                               f"{file_size - offset} trailing bytes: too short for a buffer header"))
                break
            # One 0x48-byte read per buffer: the walk touches headers only, never the event data.
            raw = ahead if ahead is not None else pread(L.BUFFER_HEADER_SIZE, offset)
            ahead = None
            size = int.from_bytes(raw[:4], "little")
            # A header whose BufferSize leads to another header (or the end) is taken; so is one that can be by
            # itself when the chain found after it starts no earlier than its end (the damage is after it: the next
            # step reports it). A header failing only its fill marks, CPU or logger is taken, its buffer skipped.
            chained, ahead = _chains(pread, offset, raw, lim) if heads else (True, None)
            if not chained:
                ahead = None
                resumed = found.pop(offset) if offset in found else _resync(pread, offset, lim)
                alone = plausible_one(raw, offset, lim)
                if alone and (resumed is None or resumed >= offset + size):
                    if resumed is None or resumed > offset + size:
                        found[offset + size] = resumed      # (the next step's search would find the same)
                else:
                    end = file_size if resumed is None else resumed
                    header.resync_bytes += end - offset
                    why = (f"BufferSize {size} runs past the end of the file ({file_size} bytes)"
                           if L.BUFFER_HEADER_SIZE <= size <= MAX_BUFFER_SIZE and offset + size > file_size
                           else "not a buffer header, or its BufferSize leads to none")
                    header.walk_errors.append(_err(
                        path, len(heads), offset,
                        "truncated" if resumed is None and offset + size > file_size else "resync",
                        f"{why}; {end - offset} bytes skipped, " + (
                            f"the chain resumes at byte offset 0x{resumed:x}" if resumed is not None
                            else "no buffer follows")))
                    if resumed is None:
                        break
                    offset = resumed
                    continue
            if not heads and not (L.BUFFER_HEADER_SIZE <= size <= MAX_BUFFER_SIZE and size <= file_size):
                header.walk_errors.append(_err(path, 0, 0, "bad_buffer_size",
                                               f"BufferSize {size} of the header buffer outside [0x48, "
                                               f"{min(MAX_BUFFER_SIZE, file_size)}]; chain ends here"))
                break
            if heads:
                lim.logger_id = int.from_bytes(raw[_LOGGER:_LOGGER + 2], "little")
            heads.append(raw)
            offsets.append(offset)
            offset += size
        header.walk_reads = f.mode if f.url else "file"
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
    _check_fields(path, header, hdr, descs, lim)
    descs = _drop_duplicates(path, header, heads, descs)
    written = int(header.fields["buffers_written"])
    found = len(descs) + sum(e["kind"] == "duplicate_buffer" for e in header.walk_errors)
    if written > found:
        header.missing_buffers = written - found
        header.field_errors.append(_err(
            path, found, offsets[-1] + int(sizes[-1]) if offsets else 0, "missing_buffers",
            f"the chain holds {found} buffers but the logfile header says {written} were written (BuffersWritten): "
            f"{written - found} missing (a file cut short, or damage the walk passed over)"))
    return header, descs


def _check_fields(path: Path, header: TraceHeader, hdr: np.ndarray, descs: np.ndarray, lim: _Limits) -> None:
    """Data buffers in a sound chain whose fill marks or CPU index cannot be: skipped (``data_len`` 0), one
    error each."""
    if len(hdr) < 2:
        return
    f = {"size": hdr["buffer_size"], "saved": hdr["saved_offset"], "proc": hdr["processor_index"].astype(np.uint32),
         "fill": hdr["offset"], "flag": hdr["buffer_flag"].astype(np.uint32), "type": hdr["buffer_type"].astype(np.uint32)}
    bad = ~_plausible(f, descs["file_offset"].astype(np.int64), lim)
    bad[0] = False                                   # (the header buffer's own checks are the logfile header's)
    for i in np.flatnonzero(bad).tolist():
        header.walk_errors.append(_err(
            path, i, int(descs["file_offset"][i]), "bad_buffer_field",
            f"SavedOffset 0x{int(hdr['saved_offset'][i]):x}, Offset 0x{int(hdr['offset'][i]):x}, BufferFlag "
            f"0x{int(hdr['buffer_flag'][i]):x}, BufferType {int(hdr['buffer_type'][i])} or ProcessorIndex "
            f"{int(hdr['processor_index'][i])} cannot be (BufferSize 0x{int(hdr['buffer_size'][i]):x}, {lim.cpus} CPUs); "
            "buffer skipped"))
        descs["data_len"][i] = 0


def _drop_duplicates(path: Path, header: TraceHeader, heads: list[bytes], descs: np.ndarray) -> np.ndarray:
    """Buffers that repeat an earlier buffer byte for byte (its header, with its flush time and sequence number,
    and its data) are left out, one error each; a header repeated over other data is only reported."""
    first: dict[bytes, int] = {}
    drop = []
    with sources.Reader(path) as f:
        for i, raw in enumerate(heads):
            if i == 0:
                continue
            j = first.setdefault(raw, i)
            if j == i:
                continue
            size = int(descs["buffer_size"][i])
            same = f.pread(size, int(descs["file_offset"][i])) == f.pread(size, int(descs["file_offset"][j]))
            (header.walk_errors if same else header.field_errors).append(_err(
                path, i, int(descs["file_offset"][i]), "duplicate_buffer" if same else "duplicate_header",
                f"repeats buffer {j} (byte offset 0x{int(descs['file_offset'][j]):x}) "
                + ("byte for byte; buffer skipped" if same else "in its header (CPU, sequence, flush time) over other "
                   "data; decoded")))
            if same:
                drop.append(i)
    return np.delete(descs, drop) if drop else descs


def _err(path: Path, buffer: int, offset: int, kind: str, message: str) -> ErrorRow:
    return {"file": str(path), "buffer_index": buffer, "file_offset": offset, "record_offset": -1,
            "kind": kind, "message": f"{path}: buffer {buffer} at byte offset 0x{offset:x}: {message}"}
