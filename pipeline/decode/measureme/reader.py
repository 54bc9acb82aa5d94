"""One ``.mm_profdata`` file: container and streams, string table, events (three layers).

``split_streams`` reads the container (pages -> three streams), ``StringTable`` expands string
ids, ``read_profile`` runs the kernels and resolves each distinct string once. Every error is a
:class:`ProfileError` that names the file, the stream and the byte offset.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline import sources
from pipeline.decode.measureme import kernels
from pipeline.decode.measureme.layout import (
    ARG_SEPARATOR,
    FILE_HEADER_SIZE,
    FILE_MAGIC,
    FIRST_REGULAR_STRING_ID,
    INVALID_STRING_ID,
    LAYOUTS,
    MAX_VIRTUAL_STRING_ID,
    METADATA_STRING_ID,
    PAGE_HEADER_SIZE,
    STREAM_HEADER_SIZE,
    STREAM_NAMES,
    STREAMS,
    STRING_REF_TAG,
    TAG_EVENTS,
    TAG_STRING_DATA,
    TAG_STRING_INDEX,
    TERMINATOR,
    Layout,
)
from pipeline.errors import InputError

UNKNOWN = "<unknown>"
PARSE_ERROR = "<parse error>"
_MAX_REF_DEPTH = 64
#: Virtual string ids looked up in a dense table: up to this many per index entry (plus DENSE_IDS_MIN); rustc's
#: virtual ids (DepNodeIndex) are about as many as the entries. Larger ids are found by binary search.
DENSE_IDS_PER_ENTRY, DENSE_IDS_MIN = 8, 1 << 16
_BAD_LABEL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class ProfileError(InputError):
    """A self-profile that cannot be decoded; the message says where."""


def split_streams(path: Path, data: np.ndarray) -> tuple[Layout, dict[int, np.ndarray]]:
    """Check the file header and concatenate the page payloads of each stream (headers checked)."""
    if len(data) < FILE_HEADER_SIZE:
        raise ProfileError(f"{path}: {len(data)} bytes: too short for the 8-byte MMPD file header")
    if bytes(data[:4]) != FILE_MAGIC:
        raise ProfileError(f"{path}: offset 0: magic {bytes(data[:4])!r} is not {FILE_MAGIC!r}: not a .mm_profdata file")
    version = int(data[4:8].view("<u4")[0])
    layout = LAYOUTS.get(version)
    if layout is None:
        raise ProfileError(
            f"{path}: offset 4: format version {version} is not supported "
            f"(this bootprof reads versions {', '.join(map(str, sorted(LAYOUTS)))})"
        )
    pieces: dict[int, list[np.ndarray]] = {tag: [] for tag in STREAMS}
    pos, size = FILE_HEADER_SIZE, len(data)
    while pos < size:
        if pos + PAGE_HEADER_SIZE > size:
            raise ProfileError(f"{path}: offset {pos}: truncated page header ({size - pos} bytes left)")
        tag = int(data[pos])
        length = int(data[pos + 1: pos + 5].view("<u4")[0])
        if tag not in pieces:
            raise ProfileError(f"{path}: offset {pos}: unknown page tag {tag} (expected 0, 1 or 2)")
        if pos + PAGE_HEADER_SIZE + length > size:
            raise ProfileError(
                f"{path}: offset {pos}: truncated {STREAM_NAMES[tag]} page: header says {length} bytes, "
                f"{size - pos - PAGE_HEADER_SIZE} left (file cut short?)"
            )
        pieces[tag].append(data[pos + PAGE_HEADER_SIZE: pos + PAGE_HEADER_SIZE + length])
        pos += PAGE_HEADER_SIZE + length
    streams = {}
    for tag, parts in pieces.items():
        stream = np.concatenate(parts) if parts else np.empty(0, np.uint8)
        if len(stream) < STREAM_HEADER_SIZE:
            raise ProfileError(f"{path}: no {STREAM_NAMES[tag]} stream (rustc killed before it flushed?)")
        magic, sversion = bytes(stream[:4]), int(stream[4:8].view("<u4")[0])
        if magic != STREAMS[tag] or sversion != version:
            raise ProfileError(
                f"{path}: {STREAM_NAMES[tag]} stream header is {magic!r} v{sversion}, "
                f"expected {STREAMS[tag]!r} v{version}"
            )
        streams[tag] = stream
    return layout, streams


class StringTable:
    """Expands string ids; each address is expanded once (memoized), references recursively."""

    def __init__(self, path: Path, layout: Layout, data: np.ndarray, index: np.ndarray):
        self.path = path
        self.layout = layout
        self.data = data.tobytes()
        self.ref_fmt = np.dtype("<u8") if layout.ref_size == 9 else np.dtype("<u4")
        n_entries, rest = divmod(len(index) - STREAM_HEADER_SIZE, layout.index.itemsize)
        if rest:
            raise ProfileError(f"{path}: string index stream: {rest} trailing bytes after {n_entries} entries")
        entries = np.frombuffer(index, dtype=layout.index, offset=STREAM_HEADER_SIZE, count=n_entries)
        ids = entries["id"].astype(np.uint64)
        addrs = np.minimum(entries["addr"].astype(np.uint64), np.uint64(len(self.data))).astype(np.int64)
        meta = np.nonzero(ids == METADATA_STRING_ID)[0]
        self.metadata_addr = int(addrs[meta[-1]]) if len(meta) else None
        virtual = ids <= MAX_VIRTUAL_STRING_ID
        vids, vaddrs = ids[virtual].astype(np.int64), addrs[virtual]
        # A later duplicate replaces an earlier one: keep the last entry of each id.
        rev_unique, rev_first = np.unique(vids[::-1], return_index=True)
        last = vaddrs[::-1][rev_first]
        # Ids up to a bound that grows with the index (DENSE_IDS_PER_ENTRY per entry) are looked up in a dense
        # table; larger ones (a damaged or hostile index: one id of 100,000,000 in an 888-byte file once made
        # this table 800 MB) by binary search. Memory stays within a multiple of the file's index.
        dense = int(min(int(rev_unique[-1]) + 1 if len(rev_unique) else 0, DENSE_IDS_PER_ENTRY * n_entries + DENSE_IDS_MIN))
        self.virt_addr = np.full(dense, kernels.UNKNOWN_ADDR, np.int64)
        small = rev_unique < dense
        self.virt_addr[rev_unique[small]] = last[small]
        self.sparse_ids, self.sparse_addrs = rev_unique[~small].astype(np.int64), last[~small].astype(np.int64)
        self.index_entries = n_entries
        self._cache: dict[int, str] = {}

    def addr_of(self, sid: int) -> int:
        if sid >= FIRST_REGULAR_STRING_ID:
            return sid - FIRST_REGULAR_STRING_ID
        if sid == METADATA_STRING_ID:
            return self.metadata_addr if self.metadata_addr is not None else kernels.UNKNOWN_ADDR
        if sid == INVALID_STRING_ID or sid < 0:
            return kernels.UNKNOWN_ADDR
        return int(kernels.id_to_addr(sid, self.virt_addr, self.sparse_ids, self.sparse_addrs))

    def expand(self, addr: int, _depth: int = 0) -> str:
        """The full string at ``addr`` (a string-data address, header included)."""
        if addr == kernels.UNKNOWN_ADDR:
            return UNKNOWN
        cached = self._cache.get(addr)
        if cached is not None:
            return cached
        if _depth > _MAX_REF_DEPTH:
            raise ProfileError(f"{self.path}: string data offset {addr}: references nested deeper than "
                               f"{_MAX_REF_DEPTH} (cycle?)")
        data, n = self.data, len(self.data)
        if not STREAM_HEADER_SIZE <= addr < n:
            raise ProfileError(f"{self.path}: string data offset {addr}: dangling string reference "
                               f"(string data is {n} bytes)")
        parts = []
        pos = addr
        while True:
            if pos >= n:
                raise ProfileError(f"{self.path}: string data offset {addr}: string runs past the end "
                                   f"of the string data ({n} bytes) without terminator")
            b = data[pos]
            if b == TERMINATOR:
                break
            if b == STRING_REF_TAG:
                end = pos + self.layout.ref_size
                if end > n:
                    raise ProfileError(f"{self.path}: string data offset {pos}: truncated string reference")
                sid = int(np.frombuffer(data, self.ref_fmt, 1, pos + 1)[0])
                target = self.addr_of(sid)
                if target != kernels.UNKNOWN_ADDR and not STREAM_HEADER_SIZE <= target < n:
                    raise ProfileError(f"{self.path}: string data offset {pos}: dangling reference to "
                                       f"string id {sid} (address {target}, string data is {n} bytes)")
                parts.append(self.expand(target, _depth + 1))
                pos = end
                continue
            stop = data.find(b"\xff", pos)
            ref = data.find(b"\xfe", pos, stop if stop >= 0 else n)
            stop = n if stop < 0 else stop
            if ref >= 0:
                stop = ref
            parts.append(data[pos:stop].decode("utf-8", errors="replace"))
            pos = stop
        text = "".join(parts)
        self._cache[addr] = text
        return text

    def metadata(self) -> dict:
        if self.metadata_addr is None:
            raise ProfileError(f"{self.path}: string index has no METADATA entry (id {METADATA_STRING_ID})")
        text = self.expand(self.metadata_addr)
        try:
            try:
                meta = json.loads(text)
            except ValueError:
                meta = json.loads(rust_escapes_as_json(text))
        except ValueError as exc:
            raise ProfileError(f"{self.path}: string data offset {self.metadata_addr}: METADATA is not JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise ProfileError(f"{self.path}: string data offset {self.metadata_addr}: METADATA is not a JSON object")
        return meta


#: A backslash escape in rustc's METADATA: its command line is written with Rust's ``escape_default``, which JSON
#: does not read where it differs (``\u{e9}`` for a non-ASCII character, ``\'`` for a quote).
_RUST_ESCAPE = re.compile(r"\\(?:u\{([0-9a-fA-F]{1,6})\}|(')|(.))", re.S)


def rust_escapes_as_json(text: str) -> str:
    """``text`` with Rust's escapes that JSON lacks written as JSON's (the others, ``\\n`` or ``\\\\``, as they are)."""
    def one(m: re.Match) -> str:
        if m.group(1) is not None:
            code = int(m.group(1), 16)
            return json.dumps(chr(code))[1:-1] if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\\ufffd"
        return "'" if m.group(2) else m.group(0)
    return _RUST_ESCAPE.sub(one, text)


def split_event_id(text: str) -> tuple[str, list[str] | None]:
    """``label ("\\x1E" arg)*`` -> (label, args or None); a label with control characters is a parse error."""
    label, *args = text.split(ARG_SEPARATOR)
    if _BAD_LABEL.search(label):
        label = PARSE_ERROR
    return label, (args or None)


@dataclass
class Profile:
    """The integer form of one file plus the strings of its distinct addresses."""

    path: Path
    version: int
    metadata: dict
    n_events: int
    n_threads: int
    kind_code: np.ndarray      # int32 per event: index into ``strings``
    id_code: np.ndarray        # int32 per event: index into ``strings``
    string_id: np.ndarray      # int64 per event: the raw event_id (virtual: rustc's DepNodeIndex)
    thread: np.ndarray         # uint32
    start: np.ndarray          # int64 (value for integer events)
    end: np.ndarray            # int64 (raw value2: markers for instants/integers)
    payload: np.ndarray        # int8: INTERVAL / INSTANT / INTEGER
    parent: np.ndarray         # int64: event index of the parent, -1 for roots
    depth: np.ndarray          # int32
    self_ns: np.ndarray        # int64
    strings: list[str] = field(default_factory=list)
    index_entries: int = 0


def read_profile(path: Path) -> Profile:
    """Decode and nest one file; ProfileError on anything that stops a faithful decode."""
    if sources.is_url(path):
        try:
            raw = np.frombuffer(sources.read_bytes(path), np.uint8)
        except InputError as exc:
            raise ProfileError(str(exc)) from exc
    else:
        path = Path(path)
        try:
            raw = np.fromfile(path, dtype=np.uint8)
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    layout, streams = split_streams(path, raw)
    del raw  # the streams are copies; keep one copy of a large file in memory, not two
    strings = StringTable(path, layout, streams[TAG_STRING_DATA], streams[TAG_STRING_INDEX])
    metadata = strings.metadata()
    events = streams[TAG_EVENTS]
    n, rest = divmod(len(events) - STREAM_HEADER_SIZE, layout.event.itemsize)
    if rest:
        raise ProfileError(f"{path}: event stream offset {STREAM_HEADER_SIZE + n * layout.event.itemsize}: "
                           f"{rest} trailing bytes after {n} {layout.event.itemsize}-byte events (truncated?)")
    words = events.view("<u4")  # stream length is 8 + k*24 or 8 + k*32: a multiple of 4
    kind_code = np.empty(n, np.int32)
    id_code = np.empty(n, np.int32)
    string_id = np.empty(n, np.int64)
    thread = np.empty(n, np.uint32)
    slot = np.empty(n, np.int32)
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    payload = np.empty(n, np.int8)
    status, bad, addrs, n_addrs, n_threads = kernels.decode_events(
        words, STREAM_HEADER_SIZE // 4, n, layout.event_words, layout.id_words, strings.virt_addr,
        strings.sparse_ids, strings.sparse_addrs, len(strings.data), kind_code, id_code, string_id, thread, slot, start, end, payload)
    if status != kernels.OK:
        offset = STREAM_HEADER_SIZE + bad * layout.event.itemsize
        raise ProfileError(f"{path}: event stream offset {offset} (event {bad}): {kernels.STATUS_TEXT[status]}")
    parent = np.empty(n, np.int64)
    depth = np.empty(n, np.int32)
    self_ns = np.empty(n, np.int64)
    kernels.nest_events(n, n_threads, slot, start, end, payload, parent, depth, self_ns)
    texts = [strings.expand(int(a)) for a in addrs[:n_addrs]]
    return Profile(path, layout.version, metadata, n, n_threads, kind_code, id_code, string_id, thread, start,
                   end, payload, parent, depth, self_ns, texts, strings.index_entries)
