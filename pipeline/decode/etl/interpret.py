"""Layer 3, interpretation: ONE dispatch table from (provider, opcode, version) to a payload extractor.

An extractor receives the partition's :class:`Batch` and the indices of the records it owns, reads
their payload fields column-wise and emits rows to one table. Records no extractor claims (and records
an extractor rejects as too short) go to the ``events`` table, so nothing is invisible. Tables whose
rows need information from other buffers (stacks, process of a sample, lifetimes) are emitted as raw
``_``-prefixed scratch tables and finished by :mod:`pipeline.decode.etl.joins`.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Callable

import numpy as np
import pyarrow as pa

from pipeline.decode.etl import heapsnap
from pipeline.decode.etl import kernels as K
from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch, list_array, unique_pairs

Extractor = Callable[[Batch, np.ndarray], None]


def _u32(b, idx, spec):
    return b.field(idx, spec[0], spec[1], 4)


def _possible(b: Batch, idx: np.ndarray, what: str, *regions: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Which records' regions ((start, size) arrays) can all be: each size at most a user address space
    (``L.USER_SPACE_END`` of the record's pointer size) and each end inside the address space. The others
    become errors (kind ``bad_value``, their first impossible region named); the caller leaves them to ``events``."""
    big = b.c["ptr"][idx] == 8
    limit = np.where(big, np.uint64(L.USER_SPACE_END[8]), np.uint64(L.USER_SPACE_END[4]))
    top = np.where(big, np.uint64(2**64 - 1), np.uint64(1 << 32))
    fits = [(size <= limit) & (start <= top - np.minimum(size, limit)) for start, size in regions]
    ok = np.logical_and.reduce(fits)
    for j in np.flatnonzero(~ok)[:100].tolist():
        start, size = next(r for r, f in zip(regions, fits) if not f[j])
        b.error(int(idx[j]), "bad_value", f"{what}: a region of {int(size[j])} bytes at 0x{int(start[j]):x} does "
                                          "not fit in the address space")
    return ok


# --- Process (§3.1) --------------------------------------------------------------------------------
PROCESS_KIND = {1: "start", 2: "end", 3: "dcstart", 4: "dcend", 39: "defunct"}


def process(b: Batch, idx: np.ndarray) -> None:
    S = L.PROCESS
    # UserSID position by version: v4+ after Flags, v3 after DirectoryTableBase, v1/v2 after ExitStatus.
    def sid_offset(idx):
        v = b.c["version"][idx].astype(np.int64)
        P = b.c["ptr"][idx].astype(np.int64)
        return np.where(v >= 4, S["sid"][0], np.where(v == 3, 0x18, 0x14)) + (P - 4) * np.where(v >= 3, 2, 1)

    idx = b.require(idx, sid_offset(idx) + 4, "Process")
    if len(idx) == 0:
        return
    v = b.c["version"][idx].astype(np.int64)
    P = b.c["ptr"][idx].astype(np.int64)
    plen = b.c["pay_len"][idx]
    sid_rel = sid_offset(idx)
    first = b.gather(b.c["pay_off"][idx] + sid_rel, 4)
    n_pos = np.minimum(sid_rel + 2 * P + 1, plen - 1)
    nsub = b.gather(b.c["pay_off"][idx] + n_pos, 1).astype(np.int64)
    sid_len = np.where(first == 0, 4, 2 * P + 8 + 4 * nsub)
    name_rel = np.minimum(sid_rel + sid_len, plen)
    names, used = b.strings(idx, name_rel, wide=False)
    cmd_rel = name_rel + used
    cmds, _ = b.strings(idx, cmd_rel, wide=True)
    cmds = [c if vv >= 2 else "" for c, vv in zip(cmds, v.tolist())]
    kinds = [PROCESS_KIND.get(int(o), str(int(o))) for o in b.c["opcode"][idx]]
    b.emit("_process_events", {
        **b.common(idx), "kind": kinds,
        "pid": _u32(b, idx, S["pid"]), "parent_pid": _u32(b, idx, S["parent_pid"]),
        "session": _u32(b, idx, S["session"]), "exit_status": _u32(b, idx, S["exit_status"]).view(np.int32),
        "unique_process_key": b.pointer(idx, *S["unique_key"]),
        "flags": np.where(v >= 4, _u32(b, idx, S["flags"]), 0).astype(np.uint32),
        "image_name": names, "command_line": cmds, "version": b.c["version"][idx],
    }, idx)


# --- Thread (§3.2) ---------------------------------------------------------------------------------
THREAD_KIND = {1: "start", 2: "end", 3: "dcstart", 4: "dcend"}


def thread(b: Batch, idx: np.ndarray) -> None:
    idx = b.require(idx, 8, "Thread")
    if len(idx) == 0:
        return
    T = L.THREAD
    P = b.c["ptr"][idx].astype(np.int64)
    full = b.c["pay_len"][idx] >= 0x2C + 7 * (P - 4)
    start = np.zeros(len(idx), np.uint64)
    if full.any():
        start[full] = b.pointer(idx[full], *T["win32_start_addr"])
    name_rel = b.offset_of(idx, *T["name"])
    names, _ = b.strings(idx, name_rel, wide=True)
    b.emit("_thread_events", {
        **b.common(idx), "kind": [THREAD_KIND.get(int(o), str(int(o))) for o in b.c["opcode"][idx]],
        "pid": _u32(b, idx, T["pid"]), "tid": _u32(b, idx, T["tid"]), "win32_start_addr": start,
        "thread_name": names,
    }, idx)


# --- Image (§3.3) ----------------------------------------------------------------------------------
IMAGE_KIND = {10: "load", 2: "unload", 3: "dcstart", 4: "dcend"}


def image(b: Batch, idx: np.ndarray) -> None:
    I = L.IMAGE
    v = b.c["version"][idx]
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, np.where(v >= 2, 0x2C + 3 * (P - 4), 0x0C + 2 * (P - 4)), "Image")
    base, size = b.pointer(idx, *I["base"]), b.pointer(idx, *I["size"])
    ok = _possible(b, idx, "Image", (base, size))
    if not ok.all():
        idx, base, size = idx[ok], base[ok], size[ok]
    if len(idx) == 0:
        return
    v = b.c["version"][idx]
    new = v >= 2
    name_rel = np.where(new, b.offset_of(idx, *I["file_name"]), b.offset_of(idx, 0x0C, 2))
    names, _ = b.strings(idx, name_rel, wide=True)
    pid = _u32(b, idx, I["pid"])
    zero = np.zeros(len(idx), np.uint32)
    b.emit("_image_events", {
        **b.common(idx), "kind": [IMAGE_KIND.get(int(o), str(int(o))) for o in b.c["opcode"][idx]],
        "pid": pid, "base": base, "size": size,
        "checksum": np.where(new, _u32(b, idx, I["checksum"]), zero),
        "time_date_stamp": np.where(new, _u32(b, idx, I["time_date_stamp"]), zero),
        "file_name": names,
    }, idx)


# --- KernelTraceControl ImageID / DbgID (§3.9) -----------------------------------------------------
def image_id(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, 2 * P + 8, "ImageID")
    if len(idx) == 0:
        return
    D = L.IMAGE_ID
    names, _ = b.strings(idx, b.offset_of(idx, *D["file_name"]), wide=True)
    b.emit("_image_id_info", {
        **b.common(idx), "base": b.pointer(idx, *D["base"]), "size": b.pointer(idx, *D["size"]),
        "pid": _u32(b, idx, D["pid"]), "time_date_stamp": _u32(b, idx, D["time_date_stamp"]),
        "original_file_name": names,
    }, idx)


def dbg_id(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, P + 24, "DbgID_RSDS")
    if len(idx) == 0:
        return
    D = L.DBG_ID
    g = b.c["pay_off"][idx] + b.offset_of(idx, *D["guid"])
    guids = guid_texts(b.blob[g.astype(np.int64)[:, None] + np.arange(16)])
    names, _ = b.strings(idx, b.offset_of(idx, *D["pdb_name"]), wide=False)
    b.emit("_image_id_dbg", {
        **b.common(idx), "base": b.pointer(idx, *D["base"]), "pid": _u32(b, idx, D["pid"]),
        "pdb_guid": guids, "pdb_age": _u32(b, idx, D["age"]), "pdb_name": names,
        "il": b.c["opcode"][idx] == 37,
    }, idx)


#: Byte order of a GUID's text form from its Windows memory layout (Data1..3 little-endian).
_GUID_TEXT_ORDER = np.array([3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15])


def guid_texts(raw: np.ndarray) -> list[str]:
    """Canonical lowercase text of (n, 16) GUIDs in memory order, without a Python object per byte."""
    h = np.ascontiguousarray(raw[:, _GUID_TEXT_ORDER]).tobytes().hex()
    return [f"{h[i:i + 8]}-{h[i + 8:i + 12]}-{h[i + 12:i + 16]}-{h[i + 16:i + 20]}-{h[i + 20:i + 32]}"
            for i in range(0, len(h), 32)]


# --- PerfInfo SampledProfile (§3.4) ----------------------------------------------------------------
def sampled_profile(b: Batch, idx: np.ndarray) -> None:
    S = L.SAMPLED_PROFILE
    n = len(idx)
    ip, tid, ok = np.empty(n, np.uint64), np.empty(n, np.uint32), np.empty(n, np.bool_)
    # The hottest kind (one record per sample): both fields and the length check in one pass.
    K.sampled_profile_records(b.blob, b.c["pay_off"], b.c["pay_len"], b.c["ptr"], idx, S["ip"][0], *S["tid"], 12,
                              ip, tid, ok)
    if not ok.all():
        b.require(idx[~ok], b.c["ptr"][idx[~ok]].astype(np.int64) + 8, "SampledProfile")   # reports them
        idx, ip, tid = idx[ok], ip[ok], tid[ok]
    # timestamp_ns is computed by the bucket that writes the sample: one column less to write and read back.
    # ``_rec`` (record index) lets the partition give each sample the stack pieces that follow it; not written.
    b.emit("_samples", {**b.common(idx, ns=False), "tid": tid, "ip": ip, "_rec": idx}, idx)


# --- StackWalk (§3.5) ------------------------------------------------------------------------------
def _frames(b: Batch, pos: np.ndarray, length: np.ndarray, width: np.ndarray) -> dict:
    """Hashes ``h1``, ``h2`` and frame count ``n`` of frame arrays at blob[pos : pos + length] (pointers
    of ``width`` bytes, leaf first; see ``kernels.hash_frames_at``), and ``user`` (leaf frame below the
    kernel-space boundary of that width)."""
    n = len(pos)
    h1, h2, leaf = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.uint64)
    count = np.empty(n, np.int32)
    K.hash_frames_at(b.blob, pos.astype(np.int64), length.astype(np.int64), width.astype(np.int64), h1, h2, leaf, count)
    return _distinct_frames(b, pos, length, width, h1, h2, leaf, count)


def _distinct_frames(b: Batch, pos, length, width, h1, h2, leaf, count) -> dict:
    """The frames themselves go to ``_stack_frames`` once per distinct (h1, h2) in the partition: events
    carry only the hashes, so the per-event tables stay small and the joins never move frame lists."""
    pos, length, width = pos.astype(np.int64), length.astype(np.int64), width.astype(np.int64)
    first, _ = unique_pairs(h1, h2)
    offs = np.zeros(len(first) + 1, np.int64)
    args = (b.blob, pos[first], length[first], width[first], np.zeros(len(first), np.int64), offs)
    frames = np.empty(K.gather_frames(*args, np.zeros(0, np.uint64), False), np.uint64)
    K.gather_frames(*args, frames, True)
    b.emit("_stack_frames", {"h1": h1[first], "h2": h2[first], "frames": list_array(offs, frames)})
    user = leaf < np.where(width == 8, L.KERNEL_SPACE_64, L.KERNEL_SPACE_32)
    return {"h1": h1, "h2": h2, "n": count, "user": user}


class StackWalkOut(namedtuple("StackWalkOut", ["ev", "pid", "tid", "h1", "h2", "leaf", "count"])):
    """What ``kernels.stack_walk_records`` writes per StackWalk record."""

    DTYPES = (np.int64, np.uint32, np.uint32, np.uint64, np.uint64, np.uint64, np.int32)


def stack_walk(b: Batch, idx: np.ndarray) -> None:
    idx = b.require(idx, 16, "StackWalk")
    W = L.STACK_WALK
    n = len(idx)
    out = StackWalkOut(*(np.empty(n, t) for t in StackWalkOut.DTYPES))
    # One pass per record: the header fields and the hashes of the frames that follow them.
    K.stack_walk_records(b.blob, b.c["pay_off"], b.c["pay_len"], b.c["ptr"], idx,
                         (W["event_ts"], W["pid"], W["tid"], W["frames"]), out)
    ev, pid, tid, h1, h2, leaf, count = out
    # A record whose leaf frame is a user address is the user half of a stack (or a user-only stack).
    b.emit("_stack_refs", {
        **b.common(idx, ns=False), "event_ts": ev, "pid": pid, "tid": tid,
        "kind": np.zeros(n, np.uint8), "key": np.zeros(n, np.uint64), "_rec": idx,
        **_distinct_frames(b, b.c["pay_off"][idx] + W["frames"], b.c["pay_len"][idx] - W["frames"], b.c["ptr"][idx],
                           h1, h2, leaf, count),
    }, idx)


def stack_key_ref(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, 16 + P, "StackKey")
    W = L.STACK_WALK
    n = len(idx)
    ev, pid, tid, key = np.empty(n, np.int64), np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.uint64)
    # One pass per record (half the records of a trace with stack keys): its four fields.
    K.stack_key_records(b.blob, b.c["pay_off"], b.c["ptr"], idx, W["event_ts"], W["pid"], W["tid"], 0x10, ev, pid, tid, key)
    zero = np.zeros(n, np.uint64)
    opcode = b.c["opcode"][idx]
    b.emit("_stack_refs", {
        **b.common(idx, ns=False), "event_ts": ev, "pid": pid, "tid": tid,
        "kind": np.where(opcode == 37, 1, 2).astype(np.uint8), "user": opcode == 38,
        "key": key, "h1": zero, "h2": zero, "n": np.zeros(n, np.int32), "_rec": idx,
    }, idx)


def stack_key_def(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, P, "StackKey definition")
    P = b.c["ptr"][idx].astype(np.int64)
    frames = _frames(b, b.c["pay_off"][idx] + P, b.c["pay_len"][idx] - P, P)
    b.emit("_stack_defs", {
        **b.common(idx), "key": b.pointer(idx, 0, 0), "opcode": b.c["opcode"][idx],
        "h1": frames["h1"], "h2": frames["h2"], "n": frames["n"],
    }, idx)


def extended_stacks(b: Batch, idx: np.ndarray) -> None:
    """Stacks carried inline by EVENT_HEADER records (extended items STACK_TRACE32/64, STACK_KEY32/64).

    Not in the dispatch table: any manifest/TraceLogging event may carry them. They become stack pieces
    of (the record's timestamp, its thread), and ``_event_stack_links`` lets the joins give those events
    a ``stack_id`` (table ``event_stacks``). MatchId pairing of halves in separate events is not done.
    """
    eo, el = b.c["ext_off"][idx], b.c["ext_len"][idx].astype(np.int64)
    args = (b.blob, eo, el)
    n = K.extended_stacks(*args, False, *(np.zeros(0, t) for t in (np.int64, np.uint8, np.int64, np.int64, np.int64)))
    if n == 0:
        return
    rec, kind = np.empty(n, np.int64), np.empty(n, np.uint8)
    pos, count, width = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    K.extended_stacks(*args, True, rec, kind, pos, count, width)
    ridx = idx[rec]
    common = {**b.common(ridx, ns=False), "event_ts": b.c["ts"][ridx], "pid": b.c["pid"][ridx], "tid": b.c["tid"][ridx]}
    full = kind == 0
    pieces = _frames(b, pos, np.where(full, count * width, 0), width)
    key = np.where(width == 8, b.gather(pos, 8), b.gather(pos, 4).astype(np.uint64))
    b.emit("_stack_refs", {**common, "kind": np.where(full, 0, 1).astype(np.uint8), "user": pieces["user"] & full,
                           "key": np.where(full, 0, key).astype(np.uint64),
                           "h1": np.where(full, pieces["h1"], 0), "h2": np.where(full, pieces["h2"], 0),
                           "n": np.where(full, pieces["n"], 0).astype(np.int32)})
    b.emit("_event_stack_links", {**b.common(ridx), "tid": b.c["tid"][ridx]})


# --- PageFault VirtualAlloc / VirtualFree (§3.7) ---------------------------------------------------
def virtual_alloc(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, 16 + 2 * (P - 4), "VirtualAlloc")
    V = L.VIRTUAL_ALLOC
    base, size = b.pointer(idx, *V["base"]), b.pointer(idx, *V["size"])
    ok = _possible(b, idx, "VirtualAlloc", (base, size))
    if not ok.all():
        idx, base, size = idx[ok], base[ok], size[ok]
    b.emit("_virtual_allocs", {
        **b.common(idx), "pid": _u32(b, idx, V["pid"]), "base": base, "size": size,
        "flags": _u32(b, idx, V["flags"]), "is_free": b.c["opcode"][idx] == 99,
    }, idx)


# --- Heap (§3.8) -----------------------------------------------------------------------------------
HEAP_KIND = {32: "create", 33: "alloc", 34: "realloc", 35: "destroy", 36: "free"}
_HEAP_KIND_NAMES = pa.array([HEAP_KIND[k] for k in range(32, 37)])


def heap(b: Batch, idx: np.ndarray) -> None:
    """Classic heap events: one row layout for all five kinds; absent fields are 0."""
    op = b.c["opcode"][idx]
    P = b.c["ptr"][idx].astype(np.int64)
    need = np.select([op == 32, op == 33, op == 34, op == 35, op == 36],
                     [4 + P, 4 + 3 * P, 4 + 5 * P, P, 4 + 2 * P], P)
    idx = b.require(idx, need, "Heap")
    n = len(idx)
    op = b.c["opcode"][idx]
    cols = {k: np.zeros(n, np.uint64) for k in ("heap", "address", "size", "old_address", "old_size")}
    flags = np.zeros(n, np.uint32)
    source = np.zeros(n, np.uint32)
    cols["heap"] = b.pointer(idx, 0, 0)
    for code, layout in ((33, L.HEAP_ALLOC), (34, L.HEAP_REALLOC), (36, L.HEAP_FREE)):
        m = op == code
        if not m.any():
            continue
        for name, spec in layout.items():
            if name == "heap":
                continue
            if name == "source":
                source[m] = _u32(b, idx[m], spec)
            else:
                cols[name][m] = b.pointer(idx[m], *spec)
    m = op == 32
    if m.any():
        flags[m] = _u32(b, idx[m], L.HEAP_CREATE["flags"])
    ok = _possible(b, idx, "Heap", (cols["address"], cols["size"]), (cols["old_address"], cols["old_size"]))
    if not ok.all():
        idx, op, flags, source = idx[ok], op[ok], flags[ok], source[ok]
        cols = {k: v[ok] for k, v in cols.items()}
    b.emit("_heap_events", {
        **b.common(idx), "pid": b.c["pid"][idx], "tid": b.c["tid"][idx],
        "kind": pa.DictionaryArray.from_arrays(pa.array(op.astype(np.int8) - 32), _HEAP_KIND_NAMES),
        **cols, "flags": flags, "source": source, "_rec": idx,     # (as for samples: see _samples)
    }, idx)


# --- SysConfig CPU (§3.10) -------------------------------------------------------------------------
def sysconfig_cpu(b: Batch, idx: np.ndarray) -> None:
    C = L.SYSCONFIG_CPU
    idx = b.require(idx, C["computer_name"] + C["computer_name_bytes"], "SysConfig CPU")
    po = b.c["pay_off"][idx]
    names, _ = b.strings(idx, np.full(len(idx), C["computer_name"]), wide=True)
    b.emit("sysconfig", {
        **b.common(idx), "kind": ["cpu"] * len(idx),
        "cpu_mhz": b.gather(po + C["mhz"], 4), "cpu_count": b.gather(po + C["cpus"], 4),
        "memory_mb": b.gather(po + C["memory_mb"], 4), "page_size": b.gather(po + C["page_size"], 4),
        "allocation_granularity": b.gather(po + C["alloc_granularity"], 4), "computer_name": names,
    }, idx)


# --- THE dispatch table ----------------------------------------------------------------------------
#: (provider GUID, id, version or None for any) -> extractor. ``id`` is the opcode (Class.Type) of
#: kernel and classic events and the event id of manifest (EVENT_HEADER) events. Extractors bound every
#: read by the record's payload length, so later versions that append fields decode with the same code.
DISPATCH: dict[tuple[str, int, int | None], Extractor] = {
    **{(L.PROCESS_GUID, op, None): process for op in PROCESS_KIND},
    **{(L.THREAD_GUID, op, None): thread for op in THREAD_KIND},
    **{(L.IMAGE_GUID, op, None): image for op in IMAGE_KIND},
    (L.IMAGE_ID_GUID, 0, None): image_id,
    (L.IMAGE_ID_GUID, 36, None): dbg_id,
    (L.IMAGE_ID_GUID, 37, None): dbg_id,
    (L.PERFINFO_GUID, 46, None): sampled_profile,
    (L.STACKWALK_GUID, 32, None): stack_walk,
    (L.STACKWALK_GUID, 37, None): stack_key_ref,
    (L.STACKWALK_GUID, 38, None): stack_key_ref,
    **{(L.STACKWALK_GUID, op, None): stack_key_def for op in (34, 35, 36)},
    (L.PAGEFAULT_GUID, 98, None): virtual_alloc,
    (L.PAGEFAULT_GUID, 99, None): virtual_alloc,
    **{(L.HEAP_GUID, op, None): heap for op in HEAP_KIND},
    (L.SYSCONFIG_GUID, 10, None): sysconfig_cpu,
    (heapsnap.PROVIDER, heapsnap.EVENT_CHUNK, 1): heapsnap.chunk_events,
    (heapsnap.PROVIDER, heapsnap.EVENT_END, 1): heapsnap.end_events,
}

#: Header kinds whose records carry the payload layouts above: kernel/classic layouts for all
#: extractors except the manifest-event ones.
KERNEL_OR_CLASSIC = frozenset(L.SYSTEM_KINDS) | {L.HT_FULL32, L.HT_FULL64, L.HT_INSTANCE32, L.HT_INSTANCE64}
MANIFEST = frozenset({L.HT_EVENT32, L.HT_EVENT64})
HEADER_KINDS: dict[Extractor, frozenset] = {heapsnap.chunk_events: MANIFEST, heapsnap.end_events: MANIFEST}


def lookup(provider: str, opcode: int, event_id: int, version: int, header_type: int) -> Extractor | None:
    """The extractor of one event kind, or None (the records then go to ``events``)."""
    key_id = event_id if header_type in MANIFEST else opcode
    fn = DISPATCH.get((provider, key_id, version)) or DISPATCH.get((provider, key_id, None))
    if fn is None or header_type not in HEADER_KINDS.get(fn, KERNEL_OR_CLASSIC):
        return None
    return fn
