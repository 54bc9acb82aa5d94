"""The PT_LOAD segments of an ELF file: what turns an address of the file's load image into a file offset (the
frames of a perf run are file offsets of their mappings). Read by the unwinder (``cfi.py``) and by symbolize
(``pipeline/symbolize/elf.py``)."""

from __future__ import annotations

import struct
from pathlib import Path

PT_LOAD = 1


def load_segments(path: Path) -> list[tuple[int, int, int]]:
    """(p_offset, p_vaddr, p_filesz) of each PT_LOAD of a 64-bit little-endian ELF file, in file order."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF":
            raise ValueError(f"{path} is not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: only 64-bit little-endian ELF files are read")
        phoff, = struct.unpack_from("<Q", ident, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
        if phentsize < 56 or phnum > 4096:
            raise ValueError(f"{path}: program headers of {phentsize} bytes x {phnum} cannot be")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    out = []
    for k in range(len(table) // phentsize):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", table, k * phentsize)
        if p_type == PT_LOAD:
            out.append((p_offset, p_vaddr, p_filesz))
    return out
