"""Event records as bytes: batches of fixed-size records filled vectorized from numpy dtypes,
StackWalk records written by one numba kernel, and the few structural records (processes, threads,
images, ImageID/DbgID, heap snapshot chunks, SysConfig) packed one by one.

A ``Batch`` is a run of records with per-record CPU, timestamp, tie-break rank and kind; the writer
merges batches per CPU in (timestamp, rank) order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from pipeline.synth import layout as L

# kind name -> (provider guid, opcode or event id, header family); the ground truth counts records by kind
KINDS: dict[str, tuple[str, int, str]] = {
    "EventTrace.Header": ("68fdd900-4a3e-11d1-84f4-0000f80464e3", 0, "system"),
    "EventTrace.HeaderExtension": ("68fdd900-4a3e-11d1-84f4-0000f80464e3", 5, "system"),
    "EventTrace.RundownComplete": ("68fdd900-4a3e-11d1-84f4-0000f80464e3", 8, "system"),
    "EventTrace.EndExtension": ("68fdd900-4a3e-11d1-84f4-0000f80464e3", 32, "system"),
    "Process.Start": ("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", 1, "system"),
    "Process.End": ("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", 2, "system"),
    "Process.DCStart": ("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", 3, "system"),
    "Process.DCEnd": ("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", 4, "system"),
    "Thread.Start": ("3d6fa8d1-fe05-11d0-9dda-00c04fd7ba7c", 1, "system"),
    "Thread.End": ("3d6fa8d1-fe05-11d0-9dda-00c04fd7ba7c", 2, "system"),
    "Thread.DCStart": ("3d6fa8d1-fe05-11d0-9dda-00c04fd7ba7c", 3, "system"),
    "Thread.DCEnd": ("3d6fa8d1-fe05-11d0-9dda-00c04fd7ba7c", 4, "system"),
    "Image.Load": ("2cb15d1d-5fc1-11d2-abe1-00a0c911f518", 10, "system"),
    "Image.UnLoad": ("2cb15d1d-5fc1-11d2-abe1-00a0c911f518", 2, "system"),
    "Image.DCStart": ("2cb15d1d-5fc1-11d2-abe1-00a0c911f518", 3, "system"),
    "Image.DCEnd": ("2cb15d1d-5fc1-11d2-abe1-00a0c911f518", 4, "system"),
    "ImageID.Info": (str(L.IMAGE_ID_GUID), 0, "full"),
    "ImageID.DbgID_RSDS": (str(L.IMAGE_ID_GUID), 36, "full"),
    "PerfInfo.SampledProfile": ("ce1dbfb4-137e-4da6-87b0-3f59aa102cbc", 46, "perfinfo"),
    "StackWalk.Stack": ("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3", 32, "perfinfo"),
    "StackWalk.KeyDelete": ("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3", 35, "perfinfo"),
    "StackWalk.KeyRundown": ("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3", 36, "perfinfo"),
    "StackWalk.KeyKernel": ("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3", 37, "perfinfo"),
    "StackWalk.KeyUser": ("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3", 38, "perfinfo"),
    "PageFault.VirtualAlloc": ("3d6fa8d3-fe05-11d0-9dda-00c04fd7ba7c", 98, "perfinfo"),
    "PageFault.VirtualFree": ("3d6fa8d3-fe05-11d0-9dda-00c04fd7ba7c", 99, "perfinfo"),
    "Heap.Alloc": ("222962ab-6180-4b88-a825-346b75f2a24a", 33, "system"),
    "Heap.ReAlloc": ("222962ab-6180-4b88-a825-346b75f2a24a", 34, "system"),
    "Heap.Free": ("222962ab-6180-4b88-a825-346b75f2a24a", 36, "system"),
    "HeapSnapshot.Chunk": (str(L.HEAP_SNAPSHOT_GUID), 100, "event"),
    "HeapSnapshot.End": (str(L.HEAP_SNAPSHOT_GUID), 200, "event"),
    "SysConfig.CPU": ("01853a65-418f-4f36-aefc-dc0f1d2fd235", 10, "system"),
}
KIND_INDEX = {name: i for i, name in enumerate(KINDS)}

# tie-break ranks for records that share a timestamp on one CPU
RANK_EVENT, RANK_IMAGE_ID, RANK_DBGID, RANK_STACK, RANK_KEY_DEF = 0, 1, 2, 3, 5


@dataclass
class Batch:
    blob: np.ndarray        # uint8, records back to back (each padded to 8 bytes)
    off: np.ndarray         # int64 offset of each record in blob
    length: np.ndarray      # int64 aligned length
    cpu: np.ndarray         # int32
    ts: np.ndarray          # int64 record timestamp
    rank: np.ndarray        # int8
    kind: np.ndarray        # int16 index into KINDS

    def __len__(self) -> int:
        return len(self.off)

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        batches = [b for b in batches if len(b)]
        if not batches:
            e = np.zeros(0, np.int64)
            return Batch(np.zeros(0, np.uint8), e, e, e.astype(np.int32), e, e.astype(np.int8), e.astype(np.int16))
        bases = np.cumsum([0] + [len(b.blob) for b in batches[:-1]])
        return Batch(np.concatenate([b.blob for b in batches]),
                     np.concatenate([b.off + base for b, base in zip(batches, bases)]),
                     *(np.concatenate([getattr(b, f) for b in batches]) for f in ("length", "cpu", "ts", "rank", "kind")))


def record_dtype(header: np.dtype, payload: np.dtype) -> np.dtype:
    """Header + payload as one structured dtype, padded to the 8-byte record alignment."""
    return np.dtype({"names": ["h", "p"], "formats": [header, payload], "offsets": [0, header.itemsize],
                     "itemsize": L.aligned(header.itemsize + payload.itemsize)})


def fixed_batch(kind: str, header: np.dtype, payload: np.dtype, n: int, cpu, ts, rank=RANK_EVENT):
    """An array of ``n`` zeroed records with the header's size/type filled; caller fills the rest."""
    dt = record_dtype(header, payload)
    arr = np.zeros(n, dtype=dt)
    arr["h"]["MarkerFlags"] = L.MARKER_FLAGS
    arr["h"]["Size"] = header.itemsize + payload.itemsize
    arr["h"]["SystemTime" if "SystemTime" in header.names else "TimeStamp"] = ts

    def done() -> Batch:
        return Batch(arr.view(np.uint8).reshape(-1), np.arange(n, dtype=np.int64) * dt.itemsize,
                     np.full(n, dt.itemsize, np.int64), np.asarray(cpu, np.int32) * np.ones(n, np.int32),
                     np.asarray(ts, np.int64), np.full(n, rank, np.int8), np.full(n, KIND_INDEX[kind], np.int16))
    return arr, done


# ------------------------------------------------------------------------------------------------
# StackWalk records (variable size): one kernel for Stack (0x1820) and key definitions (0x1823/24)
# ------------------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _put(out, pos, value, nbytes):
    v = np.uint64(value)
    for k in range(nbytes):
        out[pos + k] = np.uint8((v >> np.uint64(8 * k)) & np.uint64(0xFF))


@numba.njit(cache=True, nogil=True)
def stack_record_sizes(tmpl, fcount, p, with_event):
    n = tmpl.shape[0]
    size = np.empty(n, np.int64)
    for i in range(n):
        body = (16 if with_event else p) + p * fcount[tmpl[i]]
        size[i] = 16 + body
    return size


@numba.njit(cache=True, nogil=True)
def write_stack_records(out, offs, sizes, hook, header_type, ts, ev_ts, pid, tid, key, tmpl, frames, fstart,
                        fcount, p, with_event):
    """PERFINFO StackWalk records: with_event -> {i64 EventTimeStamp, u32 pid, u32 tid, ptr frames[]}
    (Stack), else {ptr key, ptr frames[]} (KeyDelete/KeyRundown)."""
    for i in range(offs.shape[0]):
        o = offs[i]
        _put(out, o, 2, 2)
        out[o + 2] = header_type
        out[o + 3] = 0xC0
        _put(out, o + 4, sizes[i], 2)
        _put(out, o + 6, hook, 2)
        _put(out, o + 8, ts[i], 8)
        q = o + 16
        if with_event:
            _put(out, q, ev_ts[i], 8)
            _put(out, q + 8, pid[i], 4)
            _put(out, q + 12, tid[i], 4)
            q += 16
        else:
            _put(out, q, key[i], p)
            q += p
        t = tmpl[i]
        for k in range(fcount[t]):
            _put(out, q, frames[fstart[t] + k], p)
            q += p


def stack_batch(kind: str, hook: int, p: int, cpu, ts, tmpl, frames_flat, fstart, fcount, *, ev_ts=None, pid=None,
                tid=None, key=None, rank=RANK_STACK) -> Batch:
    n = len(tmpl)
    with_event = ev_ts is not None
    sizes = stack_record_sizes(tmpl, fcount, p, with_event)
    lengths = (sizes + 7) & ~7
    offs = np.zeros(n, np.int64)
    if n:
        np.cumsum(lengths[:-1], out=offs[1:])
    out = np.zeros(int(lengths.sum()), np.uint8)
    z = np.zeros(n, np.int64)
    write_stack_records(out, offs, sizes, hook, L.HT_PERFINFO[p], np.asarray(ts, np.int64),
                        np.asarray(ev_ts if with_event else z, np.int64), np.asarray(pid if with_event else z, np.int64),
                        np.asarray(tid if with_event else z, np.int64),
                        np.asarray(key if key is not None else z, np.uint64),
                        np.asarray(tmpl, np.int64), frames_flat, fstart, fcount, p, with_event)
    return Batch(out, offs, lengths, np.broadcast_to(np.asarray(cpu, np.int32), (n,)).copy(),
                 np.asarray(ts, np.int64), np.full(n, rank, np.int8), np.full(n, KIND_INDEX[kind], np.int16))


# ------------------------------------------------------------------------------------------------
# One-off records (structural events)
# ------------------------------------------------------------------------------------------------
def utf16z(s: str) -> bytes:
    return s.encode("utf-16-le") + b"\0\0"


def ansiz(s: str) -> bytes:
    return s.encode("latin-1") + b"\0"


def _pack(dtype: np.dtype, **fields) -> bytes:
    a = np.zeros(1, dtype=dtype)
    for k, v in fields.items():
        a[k] = v
    return a.tobytes()


class OneOff:
    """Collects structural records; ``batch()`` returns them sorted into a Batch."""

    def __init__(self, p: int):
        self.p = p
        self.items: list[tuple[int, int, int, int, bytes]] = []   # (ts, cpu, rank, kind, bytes)

    def _add(self, kind, cpu, ts, rank, header: bytes, payload: bytes):
        rec = header + payload
        self.items.append((int(ts), int(cpu), rank, KIND_INDEX[kind], rec + b"\0" * (L.aligned(len(rec)) - len(rec))))

    def system(self, kind, hook, version, cpu, ts, tid, pid, payload: bytes, rank=RANK_EVENT):
        h = _pack(L.SYSTEM_HEADER, Version=version, HeaderType=L.HT_SYSTEM[self.p], MarkerFlags=L.MARKER_FLAGS,
                  Size=L.SYSTEM_HEADER.itemsize + len(payload), HookId=hook, ThreadId=tid, ProcessId=pid,
                  SystemTime=ts)
        self._add(kind, cpu, ts, rank, h, payload)

    def full(self, kind, guid, typ, version, cpu, ts, tid, pid, payload: bytes, rank):
        h = _pack(L.FULL_HEADER, Size=L.FULL_HEADER.itemsize + len(payload), HeaderType=L.HT_FULL[self.p],
                  MarkerFlags=L.MARKER_FLAGS, Type=typ, Version=version, ThreadId=tid, ProcessId=pid, TimeStamp=ts,
                  Guid=np.void(guid.bytes_le))
        self._add(kind, cpu, ts, rank, h, payload)

    def event(self, kind, provider, event_id, version, cpu, ts, tid, pid, payload: bytes):
        h = _pack(L.EVENT_HEADER, Size=L.EVENT_HEADER.itemsize + len(payload), HeaderType=L.HT_EVENT[self.p],
                  MarkerFlags=L.MARKER_FLAGS, ThreadId=tid, ProcessId=pid, TimeStamp=ts,
                  ProviderId=np.void(provider.bytes_le), Id=event_id, Version=version)
        self._add(kind, cpu, ts, RANK_EVENT, h, payload)

    def batch(self, lo: int, hi: int) -> Batch:
        """Records with lo <= ts < hi (items must be sorted by ts)."""
        import bisect

        i0 = bisect.bisect_left(self.items, (lo,))
        i1 = bisect.bisect_left(self.items, (hi,))
        sel = self.items[i0:i1]
        if not sel:
            return Batch.concat([])
        blobs = [it[4] for it in sel]
        lengths = np.array([len(b) for b in blobs], np.int64)
        offs = np.zeros(len(sel), np.int64)
        np.cumsum(lengths[:-1], out=offs[1:])
        return Batch(np.frombuffer(b"".join(blobs), np.uint8).copy(), offs, lengths,
                     np.array([it[1] for it in sel], np.int32), np.array([it[0] for it in sel], np.int64),
                     np.array([it[2] for it in sel], np.int8), np.array([it[3] for it in sel], np.int16))

    def sort(self):
        # stable: records added for one moment keep their order (image event before its ImageID/DbgID)
        order = sorted(range(len(self.items)), key=lambda i: (self.items[i][0], i))
        self.items = [self.items[i] for i in order]
