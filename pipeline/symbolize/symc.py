"""Read symbolic's SymCache v9 file (``.symc``) into numpy arrays.

symbolic's Python binding looks addresses up one at a time (~7 µs each) and cannot list functions.
The file it writes is a flat, 8-byte-aligned layout, so we read it once, straight into arrays, and
turn it into a :class:`pipeline.symbolize.table.AddressTable`. Layout (symbolic-symcache, raw v9):

    offset  size
    0       80      header: magic b"SYMC", version u32, debug id (uuid 16 + appendix u32 + 12 pad),
                    arch u32, num_files, num_functions, num_source_locations, num_ranges,
                    string_bytes (u32 each), 16 reserved bytes
    80      24*nf   File[nf]:     comp_dir, directory, name, srcsrv name, srcsrv dir, revision
                                  (string offsets)
    ...     16*nfn  Function[nfn]: name (string offset), comp_dir, entry_pc, lang
    ...     16*nl   SourceLocation[nl]: file_idx, line, function_idx, inlined_into_idx
    ...     4*nr    Range[nr]: start RVA of each range, sorted; the last ``nr`` source locations
                    belong 1:1 to the ranges
    ...     sb      strings: each a ULEB128 length followed by UTF-8 bytes

Every section starts 8-byte aligned. ``u32::MAX`` means "none"; a source location whose four fields
are all ``u32::MAX`` ends the previous range (a gap). The reader checks the magic, the version and
that the sections exactly fill the file before it trusts any count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.errors import InputError

MAGIC = b"SYMC"
VERSION = 9
NONE = 0xFFFFFFFF

HEADER = np.dtype(
    [
        ("magic", "S4"),
        ("version", "<u4"),
        ("uuid", "V16"),
        ("appendix", "<u4"),
        ("_pad", "V12"),
        ("arch", "<u4"),
        ("num_files", "<u4"),
        ("num_functions", "<u4"),
        ("num_source_locations", "<u4"),
        ("num_ranges", "<u4"),
        ("string_bytes", "<u4"),
        ("_reserved", "V16"),
    ]
)
FILE = np.dtype(
    [
        ("comp_dir", "<u4"),
        ("directory", "<u4"),
        ("name", "<u4"),
        ("srcsrv_name", "<u4"),
        ("srcsrv_dir", "<u4"),
        ("revision", "<u4"),
    ]
)
FUNCTION = np.dtype([("name", "<u4"), ("comp_dir", "<u4"), ("entry_pc", "<u4"), ("lang", "<u4")])
SOURCE_LOCATION = np.dtype([("file", "<u4"), ("line", "<u4"), ("function", "<u4"), ("inlined_into", "<u4")])
RANGE = np.dtype("<u4")


def _align8(n: int) -> int:
    return (n + 7) & ~7


class SymcFile:
    """The sections of one ``.symc`` file as numpy views over its bytes."""

    def __init__(self, data: bytes | memoryview, where: str = "<symc>"):
        self.where = where
        buf = memoryview(data)
        if len(buf) < HEADER.itemsize:
            raise InputError(f"{where}: {len(buf)} bytes, too short for a SymCache header ({HEADER.itemsize})")
        head = np.frombuffer(buf, HEADER, 1, 0)[0]
        if bytes(head["magic"]) != MAGIC:
            raise InputError(f"{where}: offset 0: magic {bytes(head['magic'])!r}, expected {MAGIC!r}")
        if int(head["version"]) != VERSION:
            raise InputError(f"{where}: offset 4: SymCache version {int(head['version'])}, this reader knows {VERSION}")
        counts = [
            (FILE, int(head["num_files"])),
            (FUNCTION, int(head["num_functions"])),
            (SOURCE_LOCATION, int(head["num_source_locations"])),
            (RANGE, int(head["num_ranges"])),
        ]
        offset = HEADER.itemsize
        sections = []
        for dtype, n in counts:
            offset = _align8(offset)
            sections.append((offset, n, dtype))
            offset += n * dtype.itemsize
        strings_at = _align8(offset)
        end = strings_at + int(head["string_bytes"])
        if end > len(buf):
            raise InputError(f"{where}: sections need {end} bytes, file has {len(buf)} (truncated or not v9)")
        self.files, self.functions, self.locations, self.ranges = (
            np.frombuffer(buf, dtype, n, off) for off, n, dtype in sections
        )
        if len(self.ranges) > len(self.locations):
            raise InputError(f"{where}: {len(self.ranges)} ranges but only {len(self.locations)} source locations")
        self.strings = buf[strings_at:end]

    def string(self, offset: int) -> str | None:
        """The string at ``offset`` of the string section (ULEB128 length + UTF-8), None for NONE."""
        if offset == NONE:
            return None
        s = self.strings
        length = shift = 0
        pos = offset
        while True:
            if pos >= len(s):
                raise InputError(f"{self.where}: string offset {offset}: length runs past the string section")
            byte = s[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if pos + length > len(s):
            raise InputError(f"{self.where}: string offset {offset}: {length} bytes run past the string section")
        return bytes(s[pos : pos + length]).decode("utf-8", "replace")

    def strings_at(self, offsets: np.ndarray) -> list[str | None]:
        """:meth:`string` for many offsets. Strings with a one-byte length (< 128 bytes: nearly all
        names) are gathered with numpy into one Arrow array; the rest are read one by one."""
        import pyarrow as pa

        offsets = np.asarray(offsets, dtype=np.int64)
        raw = np.frombuffer(self.strings, np.uint8)
        valid = (offsets != NONE) & (offsets >= 0) & (offsets < len(raw))
        length = np.zeros(len(offsets), dtype=np.int64)
        length[valid] = raw[offsets[valid]]
        short = valid & (length < 0x80) & (offsets + 1 + length <= len(raw))
        length[~short] = 0
        ends = np.cumsum(length)
        gather = np.repeat(offsets + 1 - (ends - length), length) + np.arange(int(ends[-1]) if len(ends) else 0)
        data = raw[gather] if len(gather) else np.zeros(0, np.uint8)
        arrow_offsets = np.concatenate([[0], ends]).astype(np.int32)
        binary = pa.BinaryArray.from_buffers(pa.binary(), len(offsets), [None, pa.py_buffer(arrow_offsets),
                                                                          pa.py_buffer(data.tobytes())])
        try:
            out = binary.cast(pa.string()).to_pylist()
        except pa.ArrowInvalid:  # invalid UTF-8 somewhere: decode with replacement characters
            out = [b.decode("utf-8", "replace") for b in binary.to_pylist()]
        for i in np.flatnonzero(~short).tolist():
            out[i] = self.string(int(offsets[i])) if valid[i] else None
        return out

    def function_names(self) -> list[str]:
        return [name or "?" for name in self.strings_at(self.functions["name"])]

    def file_paths(self) -> list[str | None]:
        """Full path of each file: comp_dir / directory / name joined like symbolic's ``full_path``."""
        out: list[str | None] = []
        for rec in self.files:
            parts = [self.string(int(rec[k])) for k in ("comp_dir", "directory", "name")]
            name = parts[2]
            if not name:
                out.append(None)
                continue
            path = name
            for prefix in (parts[1], parts[0]):
                if prefix and not _is_absolute(path):
                    path = _join(prefix, path)
            out.append(path)
        return out


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "\\")) or (len(path) > 2 and path[1] == ":" and path[2] in "\\/")


def _join(prefix: str, path: str) -> str:
    sep = "\\" if ("\\" in prefix and "/" not in prefix) else "/"
    return prefix.rstrip("/\\") + sep + path


def read_symc(path: Path) -> SymcFile:
    return SymcFile(Path(path).read_bytes(), where=str(path))
