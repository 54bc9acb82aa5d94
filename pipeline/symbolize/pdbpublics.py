"""Public symbols (S_PUB32) of a PDB that symbolic cannot place: the publics-only fallback.

symbolic turns a PDB's ``segment:offset`` addresses into RVAs with the PDB's copy of the image's
section headers (the DBI optional debug header's SectionHdr stream). PDBs written by ``ngen
createpdb`` for .NET native images (``mscorlib.ni.pdb`` ...) have no such stream, so symbolic's
SymCache comes out empty. They do have a DBI *section map* with the length of every section, and
the image's sections start at RVA 0x1000 and follow each other at 0x1000 alignment, so
``RVA(segment k) = 0x1000 + sum(align(len(i), 0x1000) for i < k)``. The same sum gives the image
size, which the stage compares with ``SizeOfImage`` from the trace (checked on the perfview
fixtures: 0x738000 for System.Xml.ni, 0xFBF000 for mscorlib.ni, both equal).

This is deliberately narrow: MSF container -> DBI header -> section headers or section map ->
symbol record stream, S_PUB32 records only. Everything else stays with symbolic.

MSF 7.00 layout (all little-endian):

    superblock (56 bytes at 0): magic[32], block_size, free_block_map, num_blocks,
                                num_directory_bytes, unknown, block_map_addr
    block map at block_map_addr * block_size: u32 block numbers of the stream directory
    directory: num_streams, stream_size[num_streams] (0xFFFFFFFF = absent), then each stream's
               u32 block numbers
    stream 3 (DBI): 64-byte header, then substreams in this order: module info, section
               contributions, section map, file info, type server map, EC names, optional debug
               header (u16 stream numbers; index 5 = section header stream)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.errors import InputError

MSF_MAGIC = b"Microsoft C/C++ MSF 7.00\r\n\x1aDS\x00\x00\x00"
DBI_STREAM = 3
DBG_SECTION_HEADERS = 5
S_PUB32 = 0x110E
PUB_FUNCTION = 0x2
SECTION_ALIGNMENT = 0x1000
FIRST_SECTION_RVA = 0x1000
NIL_STREAM = 0xFFFFFFFF

SUPERBLOCK = np.dtype(
    [
        ("magic", "S32"),
        ("block_size", "<u4"),
        ("free_block_map", "<u4"),
        ("num_blocks", "<u4"),
        ("num_directory_bytes", "<u4"),
        ("unknown", "<u4"),
        ("block_map_addr", "<u4"),
    ]
)
DBI_HEADER = np.dtype(
    [
        ("version_signature", "<i4"),
        ("version_header", "<u4"),
        ("age", "<u4"),
        ("global_stream", "<u2"),
        ("build_number", "<u2"),
        ("public_stream", "<u2"),
        ("pdb_dll_version", "<u2"),
        ("sym_record_stream", "<u2"),
        ("pdb_dll_rbld", "<u2"),
        ("mod_info_size", "<i4"),
        ("section_contribution_size", "<i4"),
        ("section_map_size", "<i4"),
        ("source_info_size", "<i4"),
        ("type_server_map_size", "<i4"),
        ("mfc_type_server_index", "<u4"),
        ("optional_dbg_header_size", "<i4"),
        ("ec_substream_size", "<i4"),
        ("flags", "<u2"),
        ("machine", "<u2"),
        ("padding", "<u4"),
    ]
)
SECTION_MAP_HEADER = np.dtype([("count", "<u2"), ("log_count", "<u2")])
SECTION_MAP_ENTRY = np.dtype(
    [
        ("flags", "<u2"),
        ("ovl", "<u2"),
        ("group", "<u2"),
        ("frame", "<u2"),
        ("section_name", "<u2"),
        ("class_name", "<u2"),
        ("offset", "<u4"),
        ("section_length", "<u4"),
    ]
)
IMAGE_SECTION_HEADER = np.dtype(
    [
        ("name", "S8"),
        ("virtual_size", "<u4"),
        ("virtual_address", "<u4"),
        ("size_of_raw_data", "<u4"),
        ("pointer_to_raw_data", "<u4"),
        ("pointer_to_relocations", "<u4"),
        ("pointer_to_linenumbers", "<u4"),
        ("number_of_relocations", "<u2"),
        ("number_of_linenumbers", "<u2"),
        ("characteristics", "<u4"),
    ]
)
#: record length (u2, excludes itself) and kind (u2); S_PUB32 continues with PUB32_BODY and a name.
RECORD_PREFIX = np.dtype([("reclen", "<u2"), ("kind", "<u2")])
PUB32_BODY = np.dtype([("flags", "<u4"), ("offset", "<u4"), ("segment", "<u2")])


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Msf:
    """Streams of an MSF 7.00 container, read through its block lists."""

    def __init__(self, data: bytes, where: str):
        self.data = data
        self.where = where
        if len(data) < SUPERBLOCK.itemsize:
            raise InputError(f"{where}: {len(data)} bytes, too short for an MSF superblock")
        if data[:32] != MSF_MAGIC:
            raise InputError(f"{where}: offset 0: not an MSF 7.00 PDB (magic {data[:24]!r})")
        sb = np.frombuffer(data, SUPERBLOCK, 1, 0)[0]
        self.block_size = int(sb["block_size"])
        if self.block_size not in (512, 1024, 2048, 4096):
            raise InputError(f"{where}: offset 32: block size {self.block_size} is not a valid MSF block size")
        n_dir = int(sb["num_directory_bytes"])
        n_dir_blocks = _align(n_dir, self.block_size) // self.block_size
        map_at = int(sb["block_map_addr"]) * self.block_size
        dir_blocks = self.read_u32(map_at, n_dir_blocks, "stream directory block map")
        directory = self._gather(dir_blocks, n_dir, "stream directory")
        n_streams = int(np.frombuffer(directory, "<u4", 1, 0)[0])
        if 4 + 4 * n_streams > len(directory):
            raise InputError(f"{where}: stream directory: {n_streams} streams do not fit in {len(directory)} bytes")
        self.sizes = np.frombuffer(directory, "<u4", n_streams, 4)
        self.blocks: list[np.ndarray] = []
        pos = 4 + 4 * n_streams
        for size in self.sizes:
            n = 0 if size == NIL_STREAM else _align(int(size), self.block_size) // self.block_size
            if pos + 4 * n > len(directory):
                raise InputError(f"{where}: stream directory: block list runs past {len(directory)} bytes")
            self.blocks.append(np.frombuffer(directory, "<u4", n, pos))
            pos += 4 * n

    def read_u32(self, offset: int, count: int, what: str) -> np.ndarray:
        if offset + 4 * count > len(self.data):
            raise InputError(f"{self.where}: {what} at byte offset {offset}: past end of file ({len(self.data)})")
        return np.frombuffer(self.data, "<u4", count, offset)

    def _gather(self, blocks: np.ndarray, size: int, what: str) -> bytes:
        bs = self.block_size
        if len(blocks) and int(blocks.max()) * bs >= len(self.data):
            raise InputError(f"{self.where}: {what}: block {int(blocks.max())} is past the end of the file")
        return b"".join(self.data[int(b) * bs : int(b) * bs + bs] for b in blocks)[:size]

    def stream(self, index: int) -> bytes:
        if index >= len(self.sizes) or self.sizes[index] == NIL_STREAM:
            raise InputError(f"{self.where}: stream {index} is absent")
        return self._gather(self.blocks[index], int(self.sizes[index]), f"stream {index}")


def section_rvas(msf: Msf, dbi: bytes, head) -> tuple[np.ndarray, int, str]:
    """RVA of each segment (index 0 = segment 1), the image size they imply, and where they came from."""
    where = msf.where
    sizes = [int(head[k]) for k in ("mod_info_size", "section_contribution_size", "section_map_size",
                                     "source_info_size", "type_server_map_size", "ec_substream_size")]
    map_at = DBI_HEADER.itemsize + sizes[0] + sizes[1]
    dbg_at = DBI_HEADER.itemsize + sum(sizes)
    n_dbg = int(head["optional_dbg_header_size"]) // 2
    if n_dbg > DBG_SECTION_HEADERS and dbg_at + 2 * n_dbg <= len(dbi):
        stream = int(np.frombuffer(dbi, "<u2", n_dbg, dbg_at)[DBG_SECTION_HEADERS])
        if stream != 0xFFFF:
            raw = msf.stream(stream)
            headers = np.frombuffer(raw, IMAGE_SECTION_HEADER, len(raw) // IMAGE_SECTION_HEADER.itemsize)
            rvas = headers["virtual_address"].astype(np.uint64)
            end = int((headers["virtual_address"].astype(np.uint64) + headers["virtual_size"]).max()) if len(headers) else 0
            return rvas, _align(end, SECTION_ALIGNMENT), "section headers"
    if sizes[2] < SECTION_MAP_HEADER.itemsize or map_at + sizes[2] > len(dbi):
        raise InputError(f"{where}: DBI stream: no section headers and no section map")
    count = int(np.frombuffer(dbi, SECTION_MAP_HEADER, 1, map_at)[0]["count"])
    if map_at + SECTION_MAP_HEADER.itemsize + count * SECTION_MAP_ENTRY.itemsize > len(dbi):
        raise InputError(f"{where}: DBI stream offset {map_at}: section map of {count} entries is truncated")
    entries = np.frombuffer(dbi, SECTION_MAP_ENTRY, count, map_at + SECTION_MAP_HEADER.itemsize)
    lengths = [int(x) for x in entries["section_length"]]
    rvas, rva = [], FIRST_SECTION_RVA
    for length in lengths:
        rvas.append(rva)
        rva += _align(length, SECTION_ALIGNMENT)
    return np.array(rvas, dtype=np.uint64), rva, "section map (0x1000-aligned layout)"


def pdb_guid(path: Path) -> str | None:
    """The GUID a PDB carries (its info stream: version, signature, age, GUID), as lowercase canonical text; None
    when it is not a PDB 7."""
    import os
    import uuid

    from pipeline import portable

    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            # (a compiler's PDB is GBs: only the blocks read are paged in; the map goes with its last view)
            info = bytes(Msf(portable.map_read(f.fileno()), str(path)).stream(1))
    except (InputError, OSError, IndexError, ValueError):
        return None
    if len(info) < 28:
        return None
    return str(uuid.UUID(bytes_le=info[12:28]))


def is_pdb(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MSF_MAGIC)) == MSF_MAGIC
    except OSError:
        return False


def read_publics(path: Path) -> tuple[np.ndarray, list[str], dict]:
    """Function publics of a PDB: sorted RVAs, their names, and facts about the layout used."""
    where = str(path)
    msf = Msf(Path(path).read_bytes(), where)
    dbi = msf.stream(DBI_STREAM)
    if len(dbi) < DBI_HEADER.itemsize:
        raise InputError(f"{where}: DBI stream is {len(dbi)} bytes, shorter than its header")
    head = np.frombuffer(dbi, DBI_HEADER, 1, 0)[0]
    rvas_of_segment, image_size, layout = section_rvas(msf, dbi, head)
    records = msf.stream(int(head["sym_record_stream"]))
    rvas: list[int] = []
    names: list[str] = []
    flags_seen: list[int] = []
    pos, end = 0, len(records)
    prefix, body = RECORD_PREFIX.itemsize, PUB32_BODY.itemsize
    while pos + prefix <= end:
        rec = np.frombuffer(records, RECORD_PREFIX, 1, pos)[0]
        reclen, kind = int(rec["reclen"]), int(rec["kind"])
        nxt = pos + 2 + reclen
        if reclen < 2 or nxt > end:
            raise InputError(f"{where}: symbol record stream offset {pos}: record length {reclen} runs past {end}")
        if kind == S_PUB32 and pos + prefix + body <= nxt:
            pub = np.frombuffer(records, PUB32_BODY, 1, pos + prefix)[0]
            seg = int(pub["segment"])
            if 1 <= seg <= len(rvas_of_segment):
                raw = records[pos + prefix + body : nxt]
                names.append(raw.split(b"\x00", 1)[0].decode("utf-8", "replace"))
                rvas.append(int(rvas_of_segment[seg - 1]) + int(pub["offset"]))
                flags_seen.append(int(pub["flags"]))
        pos = nxt
    addr = np.array(rvas, dtype=np.uint64)
    flags = np.array(flags_seen, dtype=np.uint32)
    if (flags & PUB_FUNCTION).any():
        keep = (flags & PUB_FUNCTION) != 0
        addr = addr[keep]
        names = [n for n, k in zip(names, keep) if k]
    order = np.argsort(addr, kind="stable")
    return addr[order], [names[i] for i in order], {"layout": layout, "image_size": image_size}
