"""The decoded records of one partition as columns, with vectorized field readers for extractors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numba as nb
import numpy as np
import pyarrow as pa

from pipeline.decode.etl import kernels as K
from pipeline.decode.etl import layout as L

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow

RECORD_COLUMNS = [
    ("rbuf", np.int32), ("roff", np.int64), ("rsize", np.int32), ("htype", np.uint8), ("ptr", np.uint8),
    ("hook", np.uint16), ("opcode", np.uint8), ("event_id", np.uint16), ("version", np.uint16),
    ("tid", np.uint32), ("pid", np.uint32), ("ts", np.int64), ("guid_off", np.int64),
    ("pay_off", np.int64), ("pay_len", np.int32), ("ext_off", np.int64), ("ext_len", np.int32),
    # (the event kind's number in ``Kinds``, the buffer's cpu and the position in that cpu's stream)
    ("kind", np.int32), ("cpu", np.uint16), ("stream_pos", np.int64),
]


def record_columns(cols: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The record columns as ``kernels.walk_records`` takes them: one tuple, in ``RECORD_COLUMNS`` order.

    Kernels take plain tuples, never named ones: numba's cache index pickles a named tuple's class with the
    kernel's signatures, and loading it fails outright (not as a cache miss) once that class has moved."""
    return tuple(cols[name] for name, _ in RECORD_COLUMNS)


class Kinds:
    """The event kinds of a partition's records, as ``record_kinds`` numbers them after the walk: each kind once,
    in order of first appearance, with its number of records, and the provider GUIDs that the kinds name."""

    def __init__(self, kind_bits: int = 12, guid_bits: int = 10):
        self.k_slots, self.g_slots = np.full(1 << kind_bits, -1, np.int32), np.full(1 << guid_bits, -1, np.int32)
        self.key, self.count = np.empty(1 << (kind_bits - 1), np.uint64), np.zeros(1 << (kind_bits - 1), np.int64)
        self.g_lo, self.g_hi = np.empty(1 << (guid_bits - 1), np.uint64), np.empty(1 << (guid_bits - 1), np.uint64)
        self.g_off = np.empty(1 << (guid_bits - 1), np.int64)
        self.sizes = np.zeros(2, np.int64)

    @classmethod
    def for_records(cls, n: int) -> "Kinds":
        """Tables with room for ``n`` records of as many kinds and GUIDs (what a hostile partition may hold)."""
        bits = max(12, (2 * n).bit_length())
        return cls(bits, bits)

    def state(self) -> tuple[np.ndarray, ...]:
        return (self.k_slots, self.key, self.count, self.g_slots, self.g_lo, self.g_hi, self.g_off, self.sizes)

    @property
    def keys(self) -> np.ndarray:
        """Each kind: provider code << 48 | opcode << 40 | event id << 24 | version << 8 | header type."""
        return self.key[:self.sizes[0]]

    @property
    def counts(self) -> np.ndarray:
        return self.count[:self.sizes[0]]

    @property
    def guid_offsets(self) -> np.ndarray:
        """Where in the blob each GUID of provider code 257 + i was first met."""
        return self.g_off[:self.sizes[1]]


#: The record columns that ``record_kinds`` reads, and the one it writes (last).
KIND_COLUMNS = ("htype", "hook", "opcode", "event_id", "version", "guid_off", "kind")
#: ``record_kinds`` ran out of room in its event-kind or provider tables (``walk`` sizes them again).
KINDS_FULL = -2


@nb.njit(**K.JIT)
def record_kinds(blob, cols, n, kinds):
    """The event kind of each of the first ``n`` records of ``cols`` (``kernels.walk_records``' columns htype,
    hook, opcode, event_id, version, guid_off, and kind, which it writes: ``KIND_COLUMNS``), entered in ``kinds``
    when new; returns ``n``, or ``KINDS_FULL`` when a table would grow past half full.

    ``kinds`` is the tuple (kind slots, kind keys, kind counts, GUID slots, GUID low and high halves, GUID
    offsets, sizes): open-addressing tables of -1 or an index into the keys, in order of first appearance,
    and ``sizes`` the number of kinds and GUIDs in use. A kind is one integer, provider code << 48 | opcode
    << 40 | event id << 24 | version << 8 | header type. The provider code is the kernel group (HookId >> 8;
    0x14 for the Image Load hook) for SYSTEM/COMPACT/PERFINFO headers, 257 + the number of the record's GUID
    for one that carries a GUID, 256 for one with neither (``partition.interpret`` turns them into text).

    One loop over plain local arrays, with the two table probes written out: a helper that took the tables (or
    a tuple of them) per record cost 50-90 ns a record in reference counting, and one shared probe taking three
    arrays, inlined, 14.7 ns, against 3.4 ns as it is."""
    htype, hook, opcode, event_id, version, guid_off, kind = cols
    k_slots, k_key, k_count, g_slots, g_lo, g_hi, g_off, sizes = kinds
    k_mask, g_mask = np.uint64(k_slots.shape[0] - 1), np.uint64(g_slots.shape[0] - 1)
    nk, ng = sizes[0], sizes[1]
    last_key, last_kind = np.uint64(0), -1
    for i in range(n):
        ht = htype[i]
        if (ht == L.HT_SYSTEM32 or ht == L.HT_SYSTEM64 or ht == L.HT_COMPACT32 or ht == L.HT_COMPACT64
                or ht == L.HT_PERFINFO32 or ht == L.HT_PERFINFO64):
            code = np.uint64(0x14) if hook[i] == L.IMAGE_LOAD_HOOK else np.uint64(hook[i] >> 8)
        elif guid_off[i] >= 0:
            lo, hi = K.read_u64(blob, guid_off[i]), K.read_u64(blob, guid_off[i] + 8)
            s = K.pair_slot(lo, hi, g_mask)
            while True:
                g = g_slots[s]
                if g < 0:
                    if 2 * (ng + 1) > g_slots.shape[0]:
                        sizes[0], sizes[1] = nk, ng
                        return KINDS_FULL
                    g = ng
                    g_slots[s] = g
                    g_lo[g], g_hi[g], g_off[g] = lo, hi, guid_off[i]
                    ng += 1
                    break
                if g_lo[g] == lo and g_hi[g] == hi:
                    break
                s = (s + np.uint64(1)) & g_mask
            code = np.uint64(257 + g)
        else:
            code = np.uint64(256)
        key = ((code << np.uint64(48)) | (np.uint64(opcode[i]) << np.uint64(40)) | (np.uint64(event_id[i]) << np.uint64(24))
               | (np.uint64(version[i]) << np.uint64(8)) | np.uint64(ht))
        if key != last_key or last_kind < 0:
            # (the high half hashed apart: the product's low bits see only the key's low bits)
            s = K.pair_slot(key, key >> np.uint64(32), k_mask)
            while True:
                j = k_slots[s]
                if j < 0:
                    if 2 * (nk + 1) > k_slots.shape[0]:
                        sizes[0], sizes[1] = nk, ng
                        return KINDS_FULL
                    j = nk
                    k_slots[s] = j
                    k_key[j] = key
                    nk += 1
                    break
                if k_key[j] == key:
                    break
                s = (s + np.uint64(1)) & k_mask
            last_key, last_kind = key, j
        kind[i] = last_kind
        k_count[last_kind] += 1
    sizes[0], sizes[1] = nk, ng
    return n


#: Mean record size of the partitions this process decoded last (None: count before filling).
_record_size: list[float] = []


def walk(blob: np.ndarray, starts: np.ndarray, lens: np.ndarray, bufs: np.ndarray | None = None
         ) -> tuple[dict[str, np.ndarray], Kinds, np.ndarray, np.ndarray]:
    """Run the record walk over the buffers whose event data lie at ``starts``, ``lens`` in ``blob`` (``bufs``:
    their descriptors, for the cpu and the stream rank of each; None: 0 for both); returns (columns, event
    kinds, status per buffer, status offset).

    The columns are sized from the mean record size of the previous partitions with a margin, and
    filled in one pass; when they turn out too short (or for a process's first partition), a counting
    pass sizes them exactly and the walk runs again. Sized that way the arrays stay small enough to be
    reused from the heap (arrays sized for the smallest possible record would be 8x larger mmaps). The
    kind tables start small (a trace has tens of kinds) and are sized for every record when they fill."""
    nbuf = len(starts)
    status = np.zeros(nbuf, np.int32), np.zeros(nbuf, np.int64)
    if bufs is None:
        bufs = np.zeros(nbuf, [("cpu", "<u2"), ("stream_rank", "<i8")])
    buffers = (starts, lens, np.ascontiguousarray(bufs["cpu"], np.uint16), np.ascontiguousarray(bufs["stream_rank"], np.int64))
    total = int(lens.sum())

    def fill(cols: dict[str, np.ndarray]) -> tuple[int, Kinds]:
        kinds = Kinds()
        for _ in range(2):
            for a in status:
                a[:] = 0
            n = K.walk_records(blob, buffers, True, record_columns(cols), status)
            if n >= 0:
                n = record_kinds(blob, tuple(cols[c] for c in KIND_COLUMNS), n, kinds.state())
            if n != KINDS_FULL:
                break
            kinds = Kinds.for_records(len(cols["ts"]))     # (then no table can fill)
        return n, kinds

    n = -1
    if _record_size:
        cols = {name: np.empty(int(total / _record_size[-1] * 2) + 1024, t) for name, t in RECORD_COLUMNS}
        n, kinds = fill(cols)
    if n == -1:
        empty = tuple(np.zeros(0, t) for _, t in RECORD_COLUMNS)
        count = K.walk_records(blob, buffers, False, empty, status)
        cols = {name: np.empty(count, t) for name, t in RECORD_COLUMNS}
        n, kinds = fill(cols)
    if n:
        _record_size[:] = [max(total / n, 8.0)]
    # Shrunk in place (realloc gives the unused tail back to the heap): the margin would otherwise stay
    # allocated through the whole task, and the task's peak is during the interpretation.
    for a in cols.values():
        a.resize(n, refcheck=False)
    return cols, kinds, *status


class Batch:
    """Records of one partition plus what extractors need to turn them into table rows."""

    def __init__(self, blob, cols, bufs, consts, kinds: Kinds | None = None):
        self.blob = blob
        self.c = cols
        self.n = len(cols["ts"])
        self.bufs = bufs                    # BUFFER_DESC rows of this partition (+ stream_rank)
        self.consts = consts
        self.kinds = kinds
        self.consumed = np.zeros(self.n, bool)
        self.out: dict[str, list[pa.Table]] = {}
        self.errors: list[ErrorRow] = []

    # --- time -------------------------------------------------------------------------------------
    def ns(self, raw: np.ndarray) -> np.ndarray:
        """Nanoseconds since the trace start (the header event's timestamp) for raw clock values."""
        return to_ns(raw, self.consts["header_ts"], self.consts["perf_freq"])

    # --- readers ----------------------------------------------------------------------------------
    def gather(self, pos: np.ndarray, nbytes: int) -> np.ndarray:
        """Little-endian unsigned ints of ``nbytes`` at blob positions ``pos`` (caller checked bounds)."""
        out = np.empty(len(pos), np.uint64)
        K.read_uints(self.blob, np.asarray(pos, np.int64), nbytes, out)
        return out.astype(f"<u{nbytes}")

    def field(self, idx, off32: int, nptr: int, nbytes: int) -> np.ndarray:
        """A fixed-size field at payload offset off32 + (P-4)*nptr of records ``idx``."""
        out = np.empty(len(idx), f"<u{nbytes}")
        K.read_fields(self.blob, self.c["pay_off"], self.c["ptr"], np.asarray(idx, np.int64), off32, nptr, nbytes, out)
        return out

    def pointer(self, idx, off32: int, nptr: int) -> np.ndarray:
        """A pointer-sized field (4 or 8 bytes by each record's header) as uint64."""
        out = np.empty(len(idx), np.uint64)
        K.read_fields(self.blob, self.c["pay_off"], self.c["ptr"], np.asarray(idx, np.int64), off32, nptr, 0, out)
        return out

    def offset_of(self, idx, off32: int, nptr: int) -> np.ndarray:
        return off32 + (self.c["ptr"][idx].astype(np.int64) - 4) * nptr

    def strings(self, idx, rel_start: np.ndarray, wide: bool) -> tuple[list[str], np.ndarray]:
        """NUL-terminated strings at payload offsets ``rel_start``; returns (texts, bytes consumed incl. NUL)."""
        start = self.c["pay_off"][idx] + rel_start
        limit = self.c["pay_off"][idx] + self.c["pay_len"][idx]
        lens = np.zeros(len(idx), np.int64)
        K.cstring_lengths(self.blob, start.astype(np.int64), limit.astype(np.int64), wide, lens)
        raw = self.blob
        enc = "utf-16-le" if wide else "latin-1"
        texts = [bytes(raw[s:s + k]).decode(enc, errors="replace") for s, k in zip(start.tolist(), lens.tolist())]
        term = 2 if wide else 1
        return texts, lens + np.where(start + lens < limit, term, 0)

    def require(self, idx, min_len, what: str) -> np.ndarray:
        """Records of ``idx`` whose payload holds ``min_len`` bytes (array or int); others become errors."""
        ok = self.c["pay_len"][idx] >= min_len
        if not ok.all():
            for i in idx[~ok][:100].tolist():
                self.error(i, "short_payload", f"{what}: payload of {int(self.c['pay_len'][i])} bytes is too short")
        return idx[ok]

    # --- outputs ----------------------------------------------------------------------------------
    def common(self, idx, ns: bool = True) -> dict[str, Any]:
        """Columns every event-like row carries: raw time, ns since start (unless ``ns`` is False: the
        row only orders or joins), cpu and stream position."""
        ts = self.c["ts"][idx]
        cols = {"timestamp": ts, "timestamp_ns": self.ns(ts)} if ns else {"timestamp": ts}
        return {**cols, "cpu": self.c["cpu"][idx], "stream_pos": self.c["stream_pos"][idx]}

    def of_records(self) -> tuple[np.ndarray, ...]:
        """The record columns that the per-kind kernels read (``kernels.stack_walk_records``): pay_off,
        pay_len, ptr, and for each row's ``common`` columns ts, cpu, stream_pos."""
        c = self.c
        return c["pay_off"], c["pay_len"], c["ptr"], c["ts"], c["cpu"], c["stream_pos"]

    def emit(self, table: str, columns: dict[str, Any], idx=None) -> None:
        """Add rows to ``table``; ``idx`` marks those records as consumed (they leave ``events``)."""
        arrays = {k: (v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v)) for k, v in columns.items()}
        self.out.setdefault(table, []).append(pa.table(arrays))
        if idx is not None:
            self.consumed[idx] = True

    def error(self, i: int, kind: str, message: str) -> None:
        b = int(self.c["rbuf"][i])
        buf = self.bufs[b]
        rel = int(self.c["roff"][i]) - int(self.consts["starts"][b])
        self.errors.append(record_error(self.consts["path"], buf, rel, kind, message))


def record_error(path: str, buf, rel_offset: int, kind: str, message: str) -> ErrorRow:
    """An errors-table row for a problem ``rel_offset`` bytes into the event data of buffer ``buf``."""
    file_offset = int(buf["file_offset"]) + L.BUFFER_HEADER_SIZE + rel_offset if not buf["compressed"] else int(buf["file_offset"])
    where = (f"byte offset 0x{file_offset:x}" if not buf["compressed"]
             else f"byte offset 0x{int(buf['file_offset']):x} (compressed; record at 0x{rel_offset:x} of the inflated data)")
    return {"file": path, "buffer_index": int(buf["index"]), "file_offset": file_offset,
            "record_offset": rel_offset, "kind": kind,
            "message": f"{path}: buffer {int(buf['index'])} at {where}: {message}"}


def to_ns(raw: np.ndarray, t0: int, freq: int) -> np.ndarray:
    d = raw.astype(np.int64) - np.int64(t0)
    if freq > 0 and 1_000_000_000 % freq == 0:
        # Whole nanoseconds per tick (10 MHz QPC, 100 ns system time): one multiply, the same result as
        # the general form below (q*f*k + r*k with k = 10^9/f), without two integer divisions per event.
        d *= np.int64(1_000_000_000 // freq)
        return d
    q, r = np.divmod(d, np.int64(freq))
    return q * np.int64(1_000_000_000) + (r * np.int64(1_000_000_000)) // np.int64(freq)


def list_array(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    """A list<uint64> column from CSR offsets and flat values."""
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, pa.uint64()))


def unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first index of each distinct (a, b) pair, pair code per element), in order of first appearance.

    Hashing in a table of 2**16 slots (most calls: event kinds, GUIDs, the few stacks of a partition);
    when more than half would fill, again in one sized for every element to be distinct. Sorting (numpy's
    row-wise unique) only beyond 2**27 distinct pairs, where the tables would be too large: sorting on every
    call made a trace with many distinct stacks decode far slower."""
    if len(a) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    a, b = a.astype(np.uint64, copy=False), b.astype(np.uint64, copy=False)
    first, inverse, n = K.dedupe_pairs(a, b, 16)
    if n < 0 and len(a) > 1 << 15:
        first, inverse, n = K.dedupe_pairs(a, b, min(len(a).bit_length() + 1, 28))
    if n >= 0:
        return first, inverse
    pairs = np.stack([a, b], axis=1)
    _, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel().astype(np.int32)


class PairSet:
    """A set of (a, b) uint64 pairs that grows as pairs come (``add``), for what must be written once per
    trace, not once per piece of it (the stacks of heap snapshots: each snapshot's stack database repeats
    most of the previous one's)."""

    def __init__(self) -> None:
        self.slots = np.full(1 << 12, -1, np.int32)
        self.a, self.b = np.empty(1 << 11, np.uint64), np.empty(1 << 11, np.uint64)
        self.n = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Insert the pairs; returns the mask of those not in the set before (the first of equal new ones)."""
        need = self.n + len(a)
        if 2 * need > len(self.slots):
            size = 1 << (2 * need).bit_length()
            old_a, old_b = self.a[:self.n], self.b[:self.n]
            self.slots = np.full(size, -1, np.int32)
            self.a, self.b = np.empty(size // 2, np.uint64), np.empty(size // 2, np.uint64)
            self.n = K.add_pairs(self.slots, self.a, self.b, 0, old_a, old_b, np.empty(len(old_a), np.bool_))
        new = np.empty(len(a), np.bool_)
        self.n = K.add_pairs(self.slots, self.a, self.b, self.n, a.astype(np.uint64, copy=False),
                             b.astype(np.uint64, copy=False), new)
        return new
