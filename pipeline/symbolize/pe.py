"""The CodeView record (PDB GUID, age, path) of a PE image, for images the trace gives no DbgID for.

When a trace has an image's name, TimeDateStamp and SizeOfImage but no DbgID_RSDS record, the
binary itself can be fetched from a symbol store (``name.dll/<TimeDateStamp %08X><SizeOfImage %X>/
name.dll``); its debug directory names the PDB. symbolic reports the PE's debug id but not the PDB
file name, so this reads the RSDS record directly. Layout (PE/COFF specification):

    0x3C            u32 e_lfanew: offset of b"PE\\0\\0"
    e_lfanew + 4    COFF header (20 bytes): machine, number_of_sections, time_date_stamp, ...,
                    size_of_optional_header
    + 20            optional header: magic 0x10B (PE32, data directories at +96) or 0x20B (PE32+,
                    at +112); directory 6 = debug (rva, size)
    after it        section headers (40 bytes each) to turn RVAs into file offsets
    debug dir       IMAGE_DEBUG_DIRECTORY[] (28 bytes each); type 2 = CodeView, whose data is
                    b"RSDS" + GUID (16, little-endian fields) + age (u32) + NUL-terminated path
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np

from pipeline.errors import InputError
from pipeline.symbolize.pdbpublics import IMAGE_SECTION_HEADER

COFF_HEADER = np.dtype(
    [
        ("machine", "<u2"),
        ("number_of_sections", "<u2"),
        ("time_date_stamp", "<u4"),
        ("pointer_to_symbol_table", "<u4"),
        ("number_of_symbols", "<u4"),
        ("size_of_optional_header", "<u2"),
        ("characteristics", "<u2"),
    ]
)
DEBUG_DIRECTORY = np.dtype(
    [
        ("characteristics", "<u4"),
        ("time_date_stamp", "<u4"),
        ("major_version", "<u2"),
        ("minor_version", "<u2"),
        ("type", "<u4"),
        ("size_of_data", "<u4"),
        ("address_of_raw_data", "<u4"),
        ("pointer_to_raw_data", "<u4"),
    ]
)
DATA_DIRECTORY_OFFSET = {0x10B: 96, 0x20B: 112}
DEBUG_DIRECTORY_INDEX = 6
DEBUG_TYPE_CODEVIEW = 2
RSDS = b"RSDS"


def code_key(time_date_stamp: int, size_of_image: int) -> str:
    """Symbol-store directory of a binary: ``<TimeDateStamp %08X><SizeOfImage %X>``."""
    return f"{int(time_date_stamp):08X}{int(size_of_image):X}"


def read_codeview(path: Path) -> dict | None:
    """``{"guid", "age", "pdb_name"}`` from the PE's RSDS record; None when it has none."""
    data = Path(path).read_bytes()
    where = str(path)

    def need(offset: int, size: int, what: str) -> None:
        if offset < 0 or offset + size > len(data):
            raise InputError(f"{where}: {what} at byte offset {offset} (+{size}) is past the end ({len(data)})")

    need(0x3C, 4, "e_lfanew")
    if data[:2] != b"MZ":
        raise InputError(f"{where}: offset 0: not a PE image (no MZ)")
    pe_at = int.from_bytes(data[0x3C:0x40], "little")
    need(pe_at, 4 + COFF_HEADER.itemsize + 2, "PE header")
    if data[pe_at : pe_at + 4] != b"PE\0\0":
        raise InputError(f"{where}: offset {pe_at}: no PE signature")
    coff = np.frombuffer(data, COFF_HEADER, 1, pe_at + 4)[0]
    opt_at = pe_at + 4 + COFF_HEADER.itemsize
    magic = int.from_bytes(data[opt_at : opt_at + 2], "little")
    if magic not in DATA_DIRECTORY_OFFSET:
        raise InputError(f"{where}: offset {opt_at}: optional header magic {magic:#x} is neither PE32 nor PE32+")
    dir_at = opt_at + DATA_DIRECTORY_OFFSET[magic] + 8 * DEBUG_DIRECTORY_INDEX
    if dir_at + 8 > opt_at + int(coff["size_of_optional_header"]):
        return None
    need(dir_at, 8, "debug data directory")
    debug_rva, debug_size = (int(x) for x in np.frombuffer(data, "<u4", 2, dir_at))
    sec_at = opt_at + int(coff["size_of_optional_header"])
    n_sec = int(coff["number_of_sections"])
    need(sec_at, n_sec * IMAGE_SECTION_HEADER.itemsize, "section table")
    sections = np.frombuffer(data, IMAGE_SECTION_HEADER, n_sec, sec_at)

    def file_offset(rva: int) -> int | None:
        for s in sections:
            start, size = int(s["virtual_address"]), max(int(s["virtual_size"]), int(s["size_of_raw_data"]))
            if start <= rva < start + size:
                return int(s["pointer_to_raw_data"]) + rva - start
        return None

    at = file_offset(debug_rva) if debug_rva else None
    if at is None:
        return None
    count = debug_size // DEBUG_DIRECTORY.itemsize
    need(at, count * DEBUG_DIRECTORY.itemsize, "debug directory")
    for entry in np.frombuffer(data, DEBUG_DIRECTORY, count, at):
        if int(entry["type"]) != DEBUG_TYPE_CODEVIEW:
            continue
        cv_at, cv_size = int(entry["pointer_to_raw_data"]), int(entry["size_of_data"])
        need(cv_at, max(cv_size, 24), "CodeView record")
        if data[cv_at : cv_at + 4] != RSDS:
            continue
        guid = uuid.UUID(bytes_le=data[cv_at + 4 : cv_at + 20])
        age = int.from_bytes(data[cv_at + 20 : cv_at + 24], "little")
        raw_path = data[cv_at + 24 : cv_at + cv_size].split(b"\0", 1)[0].decode("utf-8", "replace")
        name = raw_path.replace("/", "\\").rsplit("\\", 1)[-1]
        return {"guid": str(guid), "age": age, "pdb_name": name}
    return None
