"""Byte layouts of measureme ``.mm_profdata`` files (format versions 8 and 9), declared once.

Facts: ``../shared/docs/measureme-format.md`` §2. A file is ``b"MMPD"`` + u32 version, then pages
``[tag u8][size u32][size bytes]``; concatenating the pages of one tag gives a stream, and each
stream starts with its own 8-byte header (magic + u32 version). Addresses inside a stream count
that header. Everything is little-endian.

The only difference between the versions is the width of string ids: v8 uses u32 ids (24-byte
events, 5-byte string references, 8-byte index entries), v9 u64 ids (32, 9 and 16 bytes).
``LAYOUTS`` is the single place where a version picks its layout; any other version is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FILE_MAGIC = b"MMPD"
FILE_HEADER_SIZE = 8
PAGE_HEADER = np.dtype([("tag", "u1"), ("size", "<u4")])  # packed: 5 bytes
PAGE_HEADER_SIZE = 5

TAG_EVENTS = 0
TAG_STRING_DATA = 1
TAG_STRING_INDEX = 2
STREAMS = {TAG_EVENTS: b"MMES", TAG_STRING_DATA: b"MMSD", TAG_STRING_INDEX: b"MMSI"}
STREAM_NAMES = {TAG_EVENTS: "events", TAG_STRING_DATA: "string data", TAG_STRING_INDEX: "string index"}
STREAM_HEADER_SIZE = 8

# String ids (§2.3).
MAX_VIRTUAL_STRING_ID = 100_000_000
METADATA_STRING_ID = 100_000_001
INVALID_STRING_ID = 100_000_002
FIRST_REGULAR_STRING_ID = 100_000_003

# String data components.
TERMINATOR = 0xFF
STRING_REF_TAG = 0xFE
ARG_SEPARATOR = "\x1e"

# Event payloads: value2 (48 bits) marks instants and integers.
MAX_INTERVAL_VALUE = 0xFFFF_FFFF_FFFD
INSTANT_MARKER = 0xFFFF_FFFF_FFFF
INTEGER_MARKER = 0xFFFF_FFFF_FFFE

# Payload codes written to ``query_events.payload`` (see schema.md).
INTERVAL, INSTANT, INTEGER = 1, 2, 3
PAYLOAD_NAMES = {INTERVAL: "interval", INSTANT: "instant", INTEGER: "integer"}

EVENT_V9 = np.dtype([
    ("event_kind", "<u8"), ("event_id", "<u8"), ("thread_id", "<u4"),
    ("payload1_lower", "<u4"), ("payload2_lower", "<u4"), ("payloads_upper", "<u4"),
])
EVENT_V8 = np.dtype([
    ("event_kind", "<u4"), ("event_id", "<u4"), ("thread_id", "<u4"),
    ("payload1_lower", "<u4"), ("payload2_lower", "<u4"), ("payloads_upper", "<u4"),
])
INDEX_V9 = np.dtype([("id", "<u8"), ("addr", "<u8")])
INDEX_V8 = np.dtype([("id", "<u4"), ("addr", "<u4")])


@dataclass(frozen=True)
class Layout:
    version: int
    event: np.dtype          # one event record
    index: np.dtype          # one string-index entry
    id_words: int            # u32 words per string id in an event record (1 or 2)
    ref_size: int            # bytes of a string reference in string data, tag included

    @property
    def event_words(self) -> int:
        return self.event.itemsize // 4


#: format version -> layout; the one dispatch point on the version.
LAYOUTS: dict[int, Layout] = {
    8: Layout(8, EVENT_V8, INDEX_V8, id_words=1, ref_size=5),
    9: Layout(9, EVENT_V9, INDEX_V9, id_words=2, ref_size=9),
}
