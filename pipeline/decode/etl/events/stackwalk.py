"""Stacks (§3.5): StackWalk records, stack-key references and definitions, and the stacks that EVENT_HEADER
records carry inline. Each becomes a stack piece (``_stack_refs``: hashes, never frame lists) and each
distinct frame list goes to ``_stack_frames`` once per partition."""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from pipeline.decode.etl import kernels as K
from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch, list_array, unique_pairs


# --- StackWalk (§3.5) ------------------------------------------------------------------------------
def _frames(b: Batch, pos: np.ndarray, length: np.ndarray, width: np.ndarray) -> dict:
    """Hashes ``h1``, ``h2`` and frame count ``n`` of frame arrays at blob[pos : pos + length] (pointers
    of ``width`` bytes, leaf first; see ``kernels.hash_frames_at``), and ``user`` (``kernels.user_leaf``)."""
    n = len(pos)
    pos, length, width = pos.astype(np.int64), length.astype(np.int64), width.astype(np.int64)
    h1, h2, user = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.bool_)
    count = np.empty(n, np.int32)
    K.hash_frames_at(b.blob, pos, length, width, h1, h2, user, count)
    _distinct_frames(b, h1, h2, lambda first: (pos[first], length[first], width[first]))
    return {"h1": h1, "h2": h2, "n": count, "user": user}


def _distinct_frames(b: Batch, h1: np.ndarray, h2: np.ndarray, rows_at) -> None:
    """The frames themselves go to ``_stack_frames`` once per distinct (h1, h2) in the partition: events
    carry only the hashes, so the per-event tables stay small and the joins never move frame lists.
    ``rows_at(first)`` gives where the frames of those rows lie: (blob position, bytes, pointer width);
    only the first row of each distinct stack is asked for."""
    first, _ = unique_pairs(h1, h2)
    pos, length, width = (np.asarray(a, np.int64) for a in rows_at(first))
    offs = np.zeros(len(first) + 1, np.int64)
    args = (b.blob, pos, length, width, np.zeros(len(first), np.int64), offs)
    frames = np.empty(K.gather_frames(*args, np.zeros(0, np.uint64), False), np.uint64)
    K.gather_frames(*args, frames, True)
    b.emit("_stack_frames", {"h1": h1[first], "h2": h2[first], "frames": list_array(offs, frames)})


class StackWalkOut(namedtuple("StackWalkOut", ["ev", "pid", "tid", "h1", "h2", "user", "count", "ts", "cpu", "stream_pos"])):
    """What ``kernels.stack_walk_records`` writes per StackWalk record (the last three: ``Batch.common``'s)."""

    DTYPES = (np.int64, np.uint32, np.uint32, np.uint64, np.uint64, np.bool_, np.int32, np.int64, np.uint16, np.int64)


def stack_walk(b: Batch, idx: np.ndarray) -> None:
    idx = b.require(idx, 16, "StackWalk")
    W = L.STACK_WALK
    n = len(idx)
    out = StackWalkOut(*(np.empty(n, t) for t in StackWalkOut.DTYPES))
    # One pass per record: the header fields, the hashes of the frames that follow them, the common columns.
    K.stack_walk_records(b.blob, b.of_records(), idx, (W["event_ts"], W["pid"], W["tid"], W["frames"]), tuple(out))
    c = b.c
    _distinct_frames(b, out.h1, out.h2, lambda first: (c["pay_off"][idx[first]] + W["frames"],
                                                       c["pay_len"][idx[first]] - W["frames"], c["ptr"][idx[first]]))
    b.emit("_stack_refs", {
        "timestamp": out.ts, "cpu": out.cpu, "stream_pos": out.stream_pos, "event_ts": out.ev, "pid": out.pid,
        "tid": out.tid, "kind": np.zeros(n, np.uint8), "key": np.zeros(n, np.uint64), "_rec": idx,
        "h1": out.h1, "h2": out.h2, "n": out.count, "user": out.user,
    }, idx)


def stack_key_ref(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, 16 + P, "StackKey")
    W = L.STACK_WALK
    n = len(idx)
    out = tuple(np.empty(n, t) for t in (np.int64, np.uint32, np.uint32, np.uint64, np.int64, b.c["cpu"].dtype, np.int64))
    # One pass per record (half the records of a trace with stack keys): its four fields and the common columns.
    K.stack_key_records(b.blob, b.of_records(), idx, (W["event_ts"], W["pid"], W["tid"], 0x10), out)
    ev, pid, tid, key, ts, cpu, stream_pos = out
    zero = np.zeros(n, np.uint64)
    opcode = b.c["opcode"][idx]
    b.emit("_stack_refs", {
        "timestamp": ts, "cpu": cpu, "stream_pos": stream_pos, "event_ts": ev, "pid": pid, "tid": tid,
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
