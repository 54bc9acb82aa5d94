"""Layer 1 of the perf.data decoder: the file header, the attrs and the feature sections (plain Python; the records
of the data section are the kernels' work, :mod:`.kernels`).

Every problem that leaves the file undecodable is a :class:`PerfFileError` naming the file, the byte offset and
what was wrong; problems that leave the rest readable (a feature section past the end of the file, a damaged
build-id entry) are collected in ``PerfHeader.errors`` as rows of ``decoded/errors``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from pipeline.decode.perf import layout as L
from pipeline.errors import InputError


class PerfFileError(InputError):
    """A perf.data file that cannot be decoded; the message says where."""


@dataclass(frozen=True)
class Attr:
    """One ``perf_event_attr`` of the file, and where the sample ids that belong to it lie."""

    index: int
    type: int
    config: int
    size: int
    sample_period: int      # or the frequency in Hz when ``freq``
    freq: bool
    sample_type: int
    read_format: int
    flags: int
    sample_regs_user: int
    sample_stack_user: int
    clockid: int | None     # None: perf's default clock
    ids: tuple[int, int]    # (byte offset, size) of its sample ids in the file

    @property
    def sample_id_all(self) -> bool:
        return bool(self.flags & L.FLAG_SAMPLE_ID_ALL)

    def sample_type_names(self) -> str:
        return "|".join(n for bit, n in L.SAMPLE_NAMES.items() if self.sample_type & bit) or "0"


@dataclass
class BuildId:
    """An entry of the HEADER_BUILD_ID feature: the build id perf read from one file it saw."""

    pid: int
    kernel: bool
    build_id: str           # lowercase hex
    filename: str


@dataclass
class PerfHeader:
    file_size: int
    header_size: int
    attr_size: int
    attrs: list[Attr]
    data_offset: int
    data_size: int          # what the header says
    data_end: int           # where the walk stops: the end of the data section, or of the file when it is shorter
    features: list[int]
    hostname: str | None = None
    os_release: str | None = None
    perf_version: str | None = None
    arch: str | None = None
    nr_cpus_online: int | None = None
    nr_cpus_available: int | None = None
    cmdline: list[str] | None = None
    first_sample_time: int | None = None
    last_sample_time: int | None = None
    clock_wall_ns: int | None = None    # HEADER_CLOCK_DATA: Unix time (ns) ...
    clock_ref_ns: int | None = None     # ... and the sample clock's time at the same moment
    build_ids: list[BuildId] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)


def _u64(data, off: int) -> int:
    return struct.unpack_from("<Q", data, off)[0]


def _u32(data, off: int) -> int:
    return struct.unpack_from("<I", data, off)[0]


def _error(path, offset: int, kind: str, message: str) -> dict:
    return {"file": str(path), "buffer_index": -1, "file_offset": offset, "record_offset": -1, "kind": kind,
            "message": f"{path}: byte offset {offset}: {message}"}


def read_header(path, data: np.ndarray) -> PerfHeader:
    """The header, attrs and features of the perf.data file whose bytes are ``data``."""
    size = len(data)
    raw = memoryview(data)
    if size < 8 or bytes(raw[:8]) not in (L.MAGIC, L.MAGIC_SWAPPED):
        raise PerfFileError(f"{path}: byte offset 0: magic {bytes(raw[:8])!r} is not {L.MAGIC!r}: not a perf.data file")
    if bytes(raw[:8]) == L.MAGIC_SWAPPED:
        raise PerfFileError(f"{path}: byte offset 0: a big-endian perf.data file (magic {L.MAGIC_SWAPPED!r}); "
                            "only little-endian files (x86-64, arm64) are decoded")
    if size >= 16 and _u64(raw, 8) == L.PIPE_HEADER_SIZE:
        raise PerfFileError(f"{path}: byte offset 8: a pipe-mode perf.data (`perf record -o -`, header size 16), "
                            "whose attrs are records in the stream; record to a file instead (perf record -o FILE)")
    if size < L.FILE_HEADER_SIZE:
        raise PerfFileError(f"{path}: {size} bytes: too short for the {L.FILE_HEADER_SIZE}-byte perf.data header")
    h = np.frombuffer(data[:L.FILE_HEADER_SIZE].tobytes(), L.FILE_HEADER)[0]
    header_size, attr_size = int(h["size"]), int(h["attr_size"])
    if header_size < L.FILE_HEADER_SIZE:
        raise PerfFileError(f"{path}: byte offset 8: header size {header_size} is below {L.FILE_HEADER_SIZE}")
    data_offset, data_size = int(h["data"]["offset"]), int(h["data"]["size"])
    if header_size > size:
        raise PerfFileError(f"{path}: byte offset 8: header size {header_size} is past the end of the file "
                            f"({size} bytes)")
    if not header_size <= data_offset <= size:
        raise PerfFileError(f"{path}: byte offset 40: data section at {data_offset} lies outside the file "
                            f"({size} bytes)" + (f" or before the header's end ({header_size})"
                                                 if data_offset < header_size else ""))
    errors: list[dict] = []
    data_end = data_offset + data_size
    if data_end > size or data_size == 0:
        # (a recording that was cut short: perf writes the data size into the header only when it stops)
        errors.append(_error(path, 48, "truncated",
                             f"data section of {data_size} bytes at {data_offset} runs past the end of the file "
                             f"({size} bytes): the records up to the end of the file are decoded"
                             if data_size else "data size 0 (the recording was not stopped cleanly): the records up "
                             "to the end of the file are decoded"))
        data_end = size
    attrs = _read_attrs(path, raw, int(h["attrs"]["offset"]), int(h["attrs"]["size"]), attr_size, size)
    bits = [b for b in range(256) if int(h["features"][b // 64]) >> (b % 64) & 1]
    hdr = PerfHeader(file_size=size, header_size=header_size, attr_size=attr_size, attrs=attrs,
                     data_offset=data_offset, data_size=data_size, data_end=data_end, features=bits, errors=errors)
    # (the feature sections' table follows the data section: where that has no size, it cannot be found)
    if data_size and data_offset + data_size <= size:
        _read_features(path, raw, hdr, data_offset + data_size)
    return hdr


def _read_attrs(path, raw, offset: int, length: int, attr_size: int, size: int) -> list[Attr]:
    if attr_size < L.ATTR_SIZE_VER0 + 16 or length % attr_size or offset + length > size or length == 0:
        raise PerfFileError(f"{path}: byte offset 24: attrs section ({length} bytes at {offset}, {attr_size} bytes "
                            f"each) does not fit the file ({size} bytes) or holds no attr")
    attrs = []
    for i in range(length // attr_size):
        at = offset + i * attr_size
        asize = _u32(raw, at + L.ATTR_SIZE)
        if not L.ATTR_SIZE_VER0 <= asize <= attr_size - 16:
            raise PerfFileError(f"{path}: byte offset {at + L.ATTR_SIZE}: attr {i} says its size is {asize} bytes, "
                                f"not between {L.ATTR_SIZE_VER0} and {attr_size - 16}")
        flags = _u64(raw, at + L.ATTR_FLAGS)
        ids_off, ids_size = struct.unpack_from("<QQ", raw, at + attr_size - 16)
        # (where the attr's sample ids lie, not the ids themselves: nothing reads them, and a few hundred attrs that
        # each name the whole file as theirs made a file of 250 KB take 1 GB)
        ids = (ids_off, ids_size) if ids_size % 8 == 0 and ids_off + ids_size <= size else (0, 0)
        v3 = asize >= L.ATTR_SIZE_VER3
        attrs.append(Attr(
            index=i, type=_u32(raw, at + L.ATTR_TYPE), config=_u64(raw, at + L.ATTR_CONFIG), size=asize,
            sample_period=_u64(raw, at + L.ATTR_PERIOD), freq=bool(flags & L.FLAG_FREQ),
            sample_type=_u64(raw, at + L.ATTR_SAMPLE_TYPE), read_format=_u64(raw, at + L.ATTR_READ_FORMAT),
            flags=flags, sample_regs_user=_u64(raw, at + L.ATTR_SAMPLE_REGS_USER) if v3 else 0,
            sample_stack_user=_u32(raw, at + L.ATTR_SAMPLE_STACK_USER) if v3 else 0,
            clockid=struct.unpack_from("<i", raw, at + L.ATTR_CLOCKID)[0]
            if v3 and flags & L.FLAG_USE_CLOCKID else None,
            ids=ids))
    return attrs


def _string(raw, off: int, end: int) -> tuple[str, int]:
    """A ``perf_header_string`` (u32 len, then len bytes, NUL-padded) at ``off``: its text and the next offset."""
    if off + 4 > end:
        raise ValueError("string length past the section's end")
    n = _u32(raw, off)
    if off + 4 + n > end:
        raise ValueError(f"string of {n} bytes past the section's end")
    text = bytes(raw[off + 4:off + 4 + n]).split(b"\0", 1)[0].decode("utf-8", "replace")
    return text, off + 4 + n


def _read_features(path, raw, hdr: PerfHeader, table: int) -> None:
    """The feature sections whose contents the decoder keeps; a damaged one is an error row, the others go on."""
    size = hdr.file_size
    if table + 16 * len(hdr.features) > size:
        hdr.errors.append(_error(path, table, "feature", f"the table of {len(hdr.features)} feature sections runs "
                                 f"past the end of the file ({size} bytes): features not read"))
        return
    for k, bit in enumerate(hdr.features):
        off, length = struct.unpack_from("<QQ", raw, table + 16 * k)
        end = off + length
        name = L.FEATURE_NAMES.get(bit, str(bit))
        if end > size:
            hdr.errors.append(_error(path, table + 16 * k, "feature", f"feature {name}: section of {length} bytes "
                                     f"at {off} runs past the end of the file ({size} bytes)"))
            continue
        try:
            if bit == L.FEAT_HOSTNAME:
                hdr.hostname = _string(raw, off, end)[0]
            elif bit == L.FEAT_OSRELEASE:
                hdr.os_release = _string(raw, off, end)[0]
            elif bit == L.FEAT_VERSION:
                hdr.perf_version = _string(raw, off, end)[0]
            elif bit == L.FEAT_ARCH:
                hdr.arch = _string(raw, off, end)[0]
            elif bit == L.FEAT_NRCPUS and length >= 8:
                hdr.nr_cpus_available, hdr.nr_cpus_online = struct.unpack_from("<II", raw, off)
            elif bit == L.FEAT_CMDLINE:
                n, at, args = _u32(raw, off), off + 4, []
                for _ in range(min(n, length // 4)):
                    text, at = _string(raw, at, end)
                    args.append(text)
                hdr.cmdline = args
            elif bit == L.FEAT_SAMPLE_TIME and length >= 16:
                hdr.first_sample_time, hdr.last_sample_time = struct.unpack_from("<QQ", raw, off)
            elif bit == L.FEAT_CLOCK_DATA and length >= L.CLOCK_DATA_SIZE:
                version, _clockid, wall, ref = struct.unpack_from("<IIQQ", raw, off)
                if version >= 1 and wall and ref:
                    hdr.clock_wall_ns, hdr.clock_ref_ns = wall, ref
            elif bit == L.FEAT_BUILD_ID:
                _read_build_ids(path, raw, hdr, off, end)
        except ValueError as exc:
            hdr.errors.append(_error(path, off, "feature", f"feature {name}: {exc}"))


def _read_build_ids(path, raw, hdr: PerfHeader, off: int, end: int) -> None:
    while off + L.BUILD_ID_FILENAME <= end:
        _type, misc, size = struct.unpack_from("<IHH", raw, off)
        if size < L.BUILD_ID_FILENAME or off + size > end:
            hdr.errors.append(_error(path, off, "feature", f"feature BUILD_ID: entry of {size} bytes does not fit "
                                     f"between {L.BUILD_ID_FILENAME} bytes and the section's end ({end}); "
                                     "the later entries are not read"))
            return
        n = raw[off + L.BUILD_ID_SIZE_BYTE] if misc & L.MISC_BUILD_ID_SIZE else L.BUILD_ID_DEFAULT_SIZE
        n = min(int(n), L.BUILD_ID_DEFAULT_SIZE)
        bid = bytes(raw[off + L.BUILD_ID_BYTES:off + L.BUILD_ID_BYTES + n]).hex()
        name = bytes(raw[off + L.BUILD_ID_FILENAME:off + size]).split(b"\0", 1)[0].decode("utf-8", "replace")
        pid = struct.unpack_from("<i", raw, off + L.BUILD_ID_PID)[0]
        hdr.build_ids.append(BuildId(pid=pid, kernel=(misc & L.MISC_CPUMODE_MASK) == L.MISC_KERNEL, build_id=bid,
                                     filename=name))
        off += size
