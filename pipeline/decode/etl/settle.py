"""Partition-side adoption and settling of the ETL decode: the tables read, the outputs allocated and the kernels
(:mod:`.settle_kernels`) called here.

A sample adopts the stack pieces that directly follow it in its buffer (``adopt_pieces``) and carries its stack
id; a sample (or heap event) whose adopted stack is complete and whose (time, thread) no other row of the
partition shares is written to its final table by the partition itself (``settle_samples``,
``settle_heap_events``); samples whose stack-key references the partition claimed are resolved by one task per
partition (``settle_keyed_samples``, ``keyed_samples_task``). The rest goes to the buckets (``buckets.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decode.etl.batch import to_ns, unique_pairs
from pipeline.decode.etl.kernels import stack_ids
from pipeline.decode.etl.scratch import ADOPTED_FIELDS, KEYED_SAMPLES, column_array, stack_column, mapped, write_final
from pipeline.decode.etl.stackkeys import defined_ids, first_at_or_after, load_defs
from pipeline.decode.etl.settle_kernels import (adopted_hashes, candidates, claim_adjacent, in_bitmap_kernel,
                                                 mark_keys, settled_rows)
from pipeline.decode.etl.stacks import Stacks
from pipeline.decode.etl.tables import THREAD_STACKED
from pipeline.decode.etl.tasks import BucketResult, KeyedSamplesTask
from pipeline.decode.etl.workerstate import reuse_freed_memory, write_stacks_once

#: At most this many stack pieces that directly follow a sample in its buffer are looked at.
ADOPT_WINDOW = 8


def adopt_pieces(samples: pa.Table, refs: pa.Table, rbuf: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """Give each sample the full stack pieces that directly follow it in its buffer (the usual layout: a
    sample, then its kernel stack, maybe its user stack), so those pieces need not go through scratch and
    the buckets' sort and grouping: most of the 6.7 M pieces per GB of the synth trace.

    A sample gets ``adopted``: an index into the partition's distinct adopted stacks (``ADOPTED_FIELDS``;
    null when it adopted nothing), ``k_dt``/``u_dt`` and ``k_d``/``u_d`` (its pieces' time after the
    sample and distance in records: with the sample's cpu and stream position, their exact place in the
    global order). Pieces not adopted stay in ``refs``. Exact: a
    bucket puts adopted pieces back among the others whenever another row of the bucket could share them
    (``Adopted.give_back``). ``samples`` and ``refs`` carry ``_rec``, their record index in the partition
    (``refs``: null for rows that are not StackWalk records)."""
    c = Claim(samples, refs, rbuf)
    codes = c.codes
    distinct = pa.StructArray.from_arrays([pa.array(c.d[f]) for f in ADOPTED_FIELDS], names=list(ADOPTED_FIELDS))
    samples = samples.append_column("adopted", pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0),
                                                                               distinct))
    for name in ("k_dt", "u_dt", "k_d", "u_d"):
        samples = samples.append_column(name, pa.array(getattr(c.claims, name)))
    return samples, c.left(c.claims.claimed)


def claimable(refs: pa.Table, full: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``refs`` that a row can claim, and every ref's record index (-1: none): StackWalk pieces
    (``full``) or stack-key references (StackKeyKernel/User records); a StackWalk piece carries its frames'
    hashes, a key reference only its key. Pieces of extended data items have no record of their own."""
    kind = refs.column("kind").to_numpy() if "kind" in refs.column_names else None
    if not full and (kind is None or not kind.any()):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)       # (no key reference: the usual full-stack trace)
    rec_col = refs.column("_rec")
    prec = rec_col.fill_null(-1).to_numpy() if rec_col.null_count else rec_col.to_numpy()
    has = prec >= 0
    if kind is not None:
        has &= (kind == 0) if full else (kind != 0)
    return np.flatnonzero(has), prec


class ClaimingRows(NamedTuple):
    """The rows that claim stack pieces (samples, heap events): per row, its record index in the partition, its
    time and its thread."""

    rec: np.ndarray
    timestamp: np.ndarray
    tid: np.ndarray


#: The columns of a stack piece that ``claim_adjacent`` matches a row's with.
PIECE_CLAIM_COLUMNS = ("event_ts", "tid", "user", "pid", "timestamp")


class Pieces(NamedTuple):
    """The stack pieces (or stack-key references) that rows may claim: the ``PIECE_CLAIM_COLUMNS``, then the two
    hashes of each piece's frames and its frame count (a key reference: its key, and zeros)."""

    event_ts: np.ndarray
    tid: np.ndarray
    user: np.ndarray
    pid: np.ndarray
    timestamp: np.ndarray
    h1: np.ndarray
    h2: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, refs: pa.Table, h1: np.ndarray, h2: np.ndarray, n: np.ndarray, at=lambda a: a) -> Pieces:
        """The pieces of ``refs`` (``at``: the rows taken) with these hashes and frame counts."""
        return cls(*(at(refs.column(c).to_numpy()) for c in PIECE_CLAIM_COLUMNS), h1, h2, n)


class Claims(NamedTuple):
    """What ``claim_adjacent`` finds (it fills these arrays, given as a plain tuple in this order): per row, the
    position of its ``kernel`` and ``user`` piece (-1: none), their time after the row (``k_dt``, ``u_dt``) and
    distance in records (``k_d``, ``u_d``), the ``pid`` they name and the ``key1``/``key2`` of the stack they make;
    per piece, whether a row ``claimed`` it."""

    kernel: np.ndarray
    user: np.ndarray
    k_dt: np.ndarray
    u_dt: np.ndarray
    k_d: np.ndarray
    u_d: np.ndarray
    pid: np.ndarray
    key1: np.ndarray
    key2: np.ndarray
    claimed: np.ndarray


def claim_pieces(rows: ClaimingRows, rbuf: np.ndarray, at: np.ndarray, recs: np.ndarray, pieces: Pieces) -> Claims:
    """``claim_adjacent`` with its outputs made: ``rows`` claim the pieces at positions ``at`` of ``pieces``, logged
    at records ``recs``."""
    n = len(rows.rec)
    claims = Claims(kernel=np.full(n, -1, np.int64), user=np.full(n, -1, np.int64), k_dt=np.zeros(n, np.uint16),
                    u_dt=np.zeros(n, np.uint16), k_d=np.zeros(n, np.uint8), u_d=np.zeros(n, np.uint8),
                    pid=np.zeros(n, np.uint32), key1=np.zeros(n, np.uint64), key2=np.zeros(n, np.uint64),
                    claimed=np.zeros(len(pieces.event_ts), np.bool_))
    if len(at):                             # (no pieces of the kind: nothing to claim)
        piece_at = np.full(len(rbuf), -1, np.int64)
        piece_at[recs] = at
        claim_adjacent(tuple(rows), rbuf, piece_at, tuple(pieces), ADOPT_WINDOW, tuple(claims))
    return claims


class Claim:
    """The stack pieces of ``refs`` that directly follow each row of ``rows`` in its buffer
    (``claim_adjacent``: at most a kernel and a user piece of the row's time and thread), and the
    distinct stacks they make: ``codes`` (per row, -1 for none) index ``d`` (``ADOPTED_FIELDS`` arrays)."""

    def __init__(self, rows: pa.Table, refs: pa.Table, rbuf: np.ndarray):
        n = rows.num_rows
        self.refs = refs
        stackwalk, prec = claimable(refs, full=True)
        col = lambda t, c: t.column(c).to_numpy()  # noqa: E731
        h1, h2, frames = col(refs, "h1"), col(refs, "h2"), col(refs, "n")
        self.claims = c = claim_pieces(ClaimingRows(*(col(rows, f) for f in ("_rec", "timestamp", "tid"))), rbuf,
                                       stackwalk, prec[stackwalk], Pieces.of(refs, h1, h2, frames))
        # One dictionary entry per distinct adopted stack (and cut into kernel and user piece).
        some = np.flatnonzero((c.kernel >= 0) | (c.user >= 0))
        codes = np.full(n, -1, np.int32)
        first = np.zeros(0, np.int64)       # (the first row of each distinct stack)
        if len(some):
            first, codes[some] = unique_pairs(c.key1[some], c.key2[some])
            first = some[first]
        self.codes = codes
        # (the pieces of each distinct stack; -1, no piece, takes the appended zeros)
        kernel_piece, user_piece = c.kernel[first], c.user[first]
        h1, h2 = np.append(h1, np.uint64(0)), np.append(h2, np.uint64(0))
        frames = np.append(frames, 0).astype(np.int64)
        stack_h1, stack_h2 = np.empty(len(first), np.uint64), np.empty(len(first), np.uint64)
        stack_frames = np.empty(len(first), np.int64)
        adopted_hashes(h1[kernel_piece], h2[kernel_piece], frames[kernel_piece], h1[user_piece], h2[user_piece],
                       frames[user_piece], stack_h1, stack_h2, stack_frames)
        sid, check = np.empty(len(first), np.int64), np.empty(len(first), np.uint64)
        stack_ids(stack_h1, stack_h2, stack_frames, sid, check)
        self.d = dict(zip(ADOPTED_FIELDS, (sid, check, h1[kernel_piece], h2[kernel_piece],
                                           frames[kernel_piece].astype(np.int32), h1[user_piece], h2[user_piece],
                                           frames[user_piece].astype(np.int32), c.pid[first])))

    def left(self, gone: np.ndarray) -> pa.Table:
        """``refs`` without the pieces marked in ``gone``."""
        # (take: the few pieces left are gathered; a filter would scan the mask once per column.)
        return self.refs.take(np.flatnonzero(~gone)) if gone.any() else self.refs

    def pieces_of(self, rows: np.ndarray) -> np.ndarray:
        """Mask over ``refs`` of the pieces that ``rows`` claimed."""
        gone = np.zeros(self.refs.num_rows, np.bool_)
        for side in (self.claims.kernel[rows], self.claims.user[rows]):
            gone[side[side >= 0]] = True
        return gone




#: Processes whose threads never run in user mode (Idle, System): a kernel piece is their whole stack.
KERNEL_ONLY_PIDS = (0, 4)


def kernel_only(pid: np.ndarray) -> np.ndarray:
    """Whether each pid is one of ``KERNEL_ONLY_PIDS`` (two comparisons: ``np.isin`` sorts)."""
    out = np.zeros(len(pid), np.bool_)
    for p in KERNEL_ONLY_PIDS:
        out |= pid == p
    return out


#: What ``settle_samples`` counts, summed with the buckets' counts in the manifest.
SAMPLE_COUNTS = ("samples", "samples_with_stack", "samples_with_stack_records", "samples_adopted_stacks")


def settle_samples(samples: pa.Table, others: list[tuple[np.ndarray, np.ndarray]], vallocs: pa.Table | None,
                   clock: tuple[int, int]) -> tuple[pa.Table | None, pa.Table, Stacks, dict[str, int]]:
    """The samples of a partition (after ``adopt_pieces``) whose stack is already complete, as final
    ``samples`` rows, so they never go through scratch and the buckets.

    A sample is complete when it adopted its user piece: a stack's user piece is its last (the kernel piece,
    when there is one, is logged first, with the sample), so no piece of another buffer can belong to it.
    So is a sample of the Idle or System process that adopted its kernel piece (``KERNEL_ONLY_PIDS``: their
    threads have no user stack). Other samples with a kernel piece only may still get a user piece logged
    later, on another cpu.
    It must also share its (time, thread) with no other row of the partition (another sample, a piece it
    did not adopt, a stack-key reference, a heap event, a stack link) and its (time, cpu) with no
    VirtualAlloc event (``settled_rows``): such a sample stays for the buckets, which decide as before.
    ``others``: the (time, thread) of those rows. Its pid is its stack record's (the process that the
    StackWalk event names).

    Returns the final rows in the partition's record order (None when there are none; not sorted by time:
    the part is written as it is, which compresses better and skips a sort), the other samples
    (for scratch), the distinct stacks of the final rows (for the ``stacks`` table) and counts."""
    if not samples.num_rows:
        return None, samples, Stacks.empty(), {}
    col = samples.column("adopted").combine_chunks()
    idx = col.indices.fill_null(-1).to_numpy()
    d = {f: col.dictionary.field(f).to_numpy() for f in ADOPTED_FIELDS}
    whole = (d["u_n"] > 0) | ((d["k_n"] > 0) & kernel_only(d["pid"]))
    complete = np.append(whole, False)[idx]
    if not complete.any():
        return None, samples, Stacks.empty(), {}
    final = unshared(samples, complete, others, vallocs)
    done = np.flatnonzero(final)
    if not len(done):
        return None, samples, Stacks.empty(), {}
    a = idx[done]
    keep = pa.array(final)
    s = samples.select(["timestamp", "cpu", "tid", "ip", "stream_pos"]).filter(keep)      # (arrow: 5x numpy's take)
    out = pa.table({
        "timestamp": s.column("timestamp"), "timestamp_ns": to_ns(column_array(s, "timestamp"), *clock), "cpu": s.column("cpu"),
        "tid": s.column("tid"), "pid": d["pid"][a], "ip": s.column("ip"), "stack_id": stack_column(d["stack_id"][a]),
        "stream_pos": s.column("stream_pos")})
    counts = dict.fromkeys(SAMPLE_COUNTS, len(done))
    return out, samples.filter(pc.invert(keep)), adopted_stacks(d, a), counts


def unshared(rows: pa.Table, whole: np.ndarray, others: list[tuple[np.ndarray, np.ndarray]],
             vallocs: pa.Table | None) -> np.ndarray:
    """Mask of the ``whole`` rows whose (time, thread) no other row of ``rows`` and no row of ``others`` has,
    and whose (time, cpu) no VirtualAlloc event has.

    First each key sets its bit in a bitmap of ~32 bits per key (``mark_keys``): a row alone in its bit, and
    whose (time, cpu) bit no VirtualAlloc event set, is unshared (equal keys share a bit). Only the rows and
    others of bits set twice (a few percent: every shared key and the keys that merely collide) and the
    rows whose (time, cpu) bit is set are sorted and compared exactly (``settled_rows``), instead of sorting
    every row and every other by time."""
    ts, tid, cpu = column_array(rows, "timestamp"), column_array(rows, "tid"), column_array(rows, "cpu")
    va_ts, va_cpu = np.zeros(0, np.int64), np.zeros(0, np.uint16)
    if vallocs is not None and vallocs.num_rows:
        va_ts, va_cpu = column_array(vallocs, "timestamp"), column_array(vallocs, "cpu")
    once, twice = _bitmaps(len(ts) + sum(len(t) for t, _ in others), 32)
    mark_keys(ts, tid, once, twice)
    for o_ts, o_tid in others:
        mark_keys(o_ts, o_tid, once, twice)
    va, _ = _bitmaps(len(va_ts), 64)
    mark_keys(va_ts, va_cpu, va, va[:0])
    final, check = np.empty(len(ts), np.bool_), np.empty(len(ts), np.bool_)
    candidates(ts, tid, cpu, whole, twice, va, final, check)
    r = np.flatnonzero(check)
    if not len(r):
        return final
    near = [in_bitmap(t, k, twice) for t, k in others]
    o_ts = np.concatenate([t[m] for (t, _), m in zip(others, near)] + [np.zeros(0, np.int64)]).astype(np.int64, copy=False)
    o_tid = np.concatenate([k[m] for (_, k), m in zip(others, near)] + [np.zeros(0, np.uint32)]).astype(np.uint32, copy=False)
    by_ts, by_va, r_ts = np.argsort(o_ts, kind="stable"), np.argsort(va_ts, kind="stable"), ts[r]
    exact = np.zeros(len(r), np.bool_)
    settled_rows(np.argsort(r_ts, kind="stable"), r_ts, tid[r], cpu[r], whole[r], o_ts[by_ts], o_tid[by_ts],
                 va_ts[by_va], va_cpu[by_va], exact)
    final[r] = exact
    return final


def _bitmaps(keys: int, bits_per_key: int) -> tuple[np.ndarray, np.ndarray]:
    """Two empty bitmaps (uint64 words) of a power of two bits, at least ``bits_per_key`` per key."""
    words = (1 << max(10, (bits_per_key * keys).bit_length())) >> 6
    return np.zeros(words, np.uint64), np.zeros(words, np.uint64)














def in_bitmap(ts: np.ndarray, key: np.ndarray, bitmap: np.ndarray) -> np.ndarray:
    """Whether the bit of each key (ts, key) is set in ``bitmap``."""
    out = np.empty(len(ts), np.bool_)
    in_bitmap_kernel(ts, key, bitmap, out)
    return out


#: The columns of ``heap_events`` that come from the event itself.
HEAP_COLUMNS = next(t for t in THREAD_STACKED if t.table == "heap_events").columns


def settle_heap_events(heap: pa.Table, refs: pa.Table, rbuf: np.ndarray, others: list[tuple[np.ndarray, np.ndarray]],
                       vallocs: pa.Table | None) -> tuple[pa.Table | None, pa.Table, pa.Table, Stacks]:
    """Heap events whose stack is complete in their partition, as final ``heap_events`` rows, as
    ``settle_samples`` does for samples: the event claims the pieces that directly follow it in its
    buffer (``Claim``); it is complete when it claimed its user piece (a stack's last) and shares its
    (time, thread) with no other row of the partition (``others``: samples, stack links, the pieces it
    did not claim) and its (time, cpu) with no VirtualAlloc event. The others keep their pieces and go
    through the buckets as before.

    Returns the final rows in record order (None when there are none), the other heap events, the pieces
    left and the distinct stacks of the final rows."""
    c = Claim(heap, refs, rbuf)
    whole = np.append(c.d["u_n"] > 0, False)[c.codes]
    if not whole.any():
        return None, heap, refs, Stacks.empty()
    mine = c.left(c.claims.claimed)
    final = unshared(heap, whole, others + [(column_array(mine, "event_ts"), column_array(mine, "tid"))], vallocs)
    done = np.flatnonzero(final)
    if not len(done):
        return None, heap, refs, Stacks.empty()
    a = c.codes[done]
    keep = pa.array(final)
    out = heap.select(HEAP_COLUMNS).filter(keep).append_column("stack_id", stack_column(c.d["stack_id"][a]))
    return (out, heap.filter(pc.invert(keep)), c.left(c.pieces_of(done)),
            adopted_stacks(c.d, a))


def settle_keyed_samples(samples: pa.Table, refs: pa.Table, rbuf: np.ndarray,
                         others: list[tuple[np.ndarray, np.ndarray]], vallocs: pa.Table | None
                         ) -> tuple[pa.Table | None, pa.Table, pa.Table, int]:
    """Samples whose stack was recorded as stack keys (StackKeyKernel/User records: what WPR records by
    default) that directly follow them in their buffer. As ``settle_samples`` does for StackWalk pieces: a
    sample claims the key references of its (time, thread) that follow it (``claim_adjacent``); it is
    complete when it claimed its user reference (or, in the Idle or System process, its kernel reference)
    and shares its (time, thread) with no other row of the partition (``others``, the references it did
    not claim, other samples) and its (time, cpu) with no VirtualAlloc event.

    Its stack needs the keys' definitions, which come later in the trace (when a key leaves the cache, or
    at the rundown at its end). So the rows go to a scratch file of the partition's own, in record order:
    their final columns but the stack, and the key of their kernel and user reference (``k_key``,
    ``u_key``; ``sides``: bit 0 kernel, bit 1 user) with the reference's time after the sample (``k_dt``,
    ``u_dt``: ticks, at most ``settle_kernels.ADOPT_MAX_DT``). ``keyed_samples_task`` resolves the keys once every
    definition is known, without the buckets' sort and grouping. Samples that adopted a StackWalk piece
    are not looked at.

    Returns those rows (None when there are none), the other samples, the references left and how many
    references went with the rows."""
    which, prec = claimable(refs, full=False)
    if not len(which) or "adopted" not in samples.column_names:
        return None, samples, refs, 0
    free = np.flatnonzero(samples.column("adopted").is_null().to_numpy(zero_copy_only=False))
    if not len(free):
        return None, samples, refs, 0
    col = lambda t, c: t.column(c).to_numpy()  # noqa: E731
    # (in a trace with stack keys every reference and every sample takes part: no gathers then)
    at_which = (lambda a: a) if len(which) == refs.num_rows else (lambda a: a[which])  # noqa: E731
    at_free = (lambda a: a) if len(free) == samples.num_rows else (lambda a: a[free])  # noqa: E731
    r_ev, r_tid = col(refs, "event_ts"), col(refs, "tid")
    key = at_which(col(refs, "key"))
    # (the hashes are the key, and no frames: a reference's frames are not known yet)
    c = claim_pieces(ClaimingRows(*(at_free(col(samples, f)) for f in ("_rec", "timestamp", "tid"))), rbuf,
                     np.arange(len(which)), prec[which],
                     Pieces.of(refs, key, np.zeros(len(which), np.uint64), np.zeros(len(which), np.int32), at_which))
    complete = (c.user >= 0) | ((c.kernel >= 0) & kernel_only(c.pid))
    if not complete.any():
        return None, samples, refs, 0
    whole = np.zeros(samples.num_rows, np.bool_)
    whole[free[complete]] = True
    mine = np.ones(refs.num_rows, np.bool_)          # the references no sample claimed
    mine[which[c.claimed]] = False
    final = unshared(samples, whole, others + [(r_ev[mine], r_tid[mine])], vallocs)
    done = np.flatnonzero(final[free])             # positions among ``free``
    if not len(done):
        return None, samples, refs, 0
    rows = free[done]
    kernel_ref, user_ref = c.kernel[done], c.user[done]        # (positions among ``which``; -1: none)
    keep = np.ones(samples.num_rows, np.bool_)
    keep[rows] = False
    # (filters, not takes: most rows are kept, and a take first joins a column's chunks into one)
    s = samples.select(["timestamp", "cpu", "tid", "ip", "stream_pos"]).filter(pa.array(~keep))
    out = pa.table({
        "timestamp": s.column("timestamp"), "cpu": s.column("cpu"), "tid": s.column("tid"), "pid": c.pid[done],
        "ip": s.column("ip"), "stream_pos": s.column("stream_pos"),
        "k_key": np.where(kernel_ref >= 0, key[kernel_ref], 0), "u_key": np.where(user_ref >= 0, key[user_ref], 0),
        "k_dt": c.k_dt[done], "u_dt": c.u_dt[done],
        "sides": ((kernel_ref >= 0) + 2 * (user_ref >= 0)).astype(np.uint8)})
    left = np.ones(refs.num_rows, np.bool_)
    left[which[kernel_ref[kernel_ref >= 0]]] = False
    left[which[user_ref[user_ref >= 0]]] = False
    rest = samples.filter(pa.array(keep)) if keep.any() else samples.slice(0, 0)    # (a filter to nothing has no chunks)
    return out, rest, refs.filter(pa.array(left)), int(refs.num_rows - left.sum())


def defined_stacks(defs: dict, k_at: np.ndarray, u_at: np.ndarray, sid: np.ndarray, check: np.ndarray) -> Stacks:
    """The distinct stacks of rows whose pieces are the definitions ``k_at`` and ``u_at`` (positions in
    ``defs``, -1 for none), with their pieces in order."""
    rows = np.flatnonzero(sid >= 0)
    if not len(rows):
        return Stacks.empty()
    first, _ = unique_pairs(k_at[rows].view(np.uint64), u_at[rows].view(np.uint64))
    r = rows[first]
    ka, ua = k_at[r], u_at[r]
    d = {"stack_id": sid[r], "id_check": check[r]}
    for prefix, at in (("k_", ka), ("u_", ua)):
        has = at >= 0
        for field, source in (("h1", defs["h1"]), ("h2", defs["h2"]), ("n", defs["n"])):
            d[prefix + field] = np.where(has, source[np.where(has, at, 0)], 0).astype(source.dtype)
    return adopted_stacks(d, np.arange(len(r)))


def keyed_samples_task(task: KeyedSamplesTask) -> BucketResult:
    """The final ``samples`` rows of one partition's samples settled by their stack keys
    (``settle_keyed_samples``): each reference takes the first definition of its key at or after it, as
    ``resolve_keys`` does for the buckets, and the two pieces' hashes make the stack id as a group of those
    pieces would get it in a bucket (``defined_ids``); the rows are written in record order
    (``keyed-<partition>.parquet``) with their distinct stacks (writer ``task.writer``)."""

    with reuse_freed_memory("bucket"):
        reader = pa.ipc.open_file(mapped(task.keyed_samples))
        t = pa.Table.from_batches([reader.get_batch(i) for i in range(reader.num_record_batches)], reader.schema)
        n = t.num_rows
        defs = load_defs(task.stack_defs)
        index = defs["index"]
        ts, sides = column_array(t, "timestamp"), column_array(t, "sides")
        at = {}
        for prefix, bit in (("k_", 1), ("u_", 2)):
            at[prefix] = np.full(n, -1, np.int64)
            first_at_or_after(column_array(t, prefix + "key"), ts, column_array(t, prefix + "dt"), sides, bit, defs["timestamp"],
                              index.slots, index.a, defs["run_lo"], defs["run_hi"], at[prefix])
        k_at, u_at = at["k_"], at["u_"]
        unresolved = int((((sides & 1) > 0) & (k_at < 0)).sum() + (((sides & 2) > 0) & (u_at < 0)).sum())
        sid, check = np.empty(n, np.int64), np.empty(n, np.uint64)
        defined_ids(k_at, u_at, defs["h1"], defs["h2"], defs["n"], defs["pow1"], defs["pow2"], sid, check)
        table = pa.table({
            "timestamp": t.column("timestamp"), "timestamp_ns": to_ns(ts, *task.clock), "cpu": t.column("cpu"),
            "tid": t.column("tid"), "pid": t.column("pid"), "ip": t.column("ip"), "stack_id": stack_column(sid),
            "stream_pos": t.column("stream_pos")})
        path = write_final(table, Path(task.out_dir) / "samples.parquet", task.part, prefix="keyed-",
                           extra_delta=("stream_pos",))
        # The distinct stacks, from one row per distinct pair of definitions (not from every row: ~300,000 rows
        # a task). Each distinct stack is written once per worker: the tasks of a trace with varied stacks
        # repeat most of them.
        write_stacks_once(defined_stacks(defs, k_at, u_at, sid, check), task.writer,
                          f"keyed-{task.part:05d}", Path(task.scratch_dir))
    with_stack = int((sid >= 0).sum())
    return BucketResult(bucket=task.writer, tables={"samples": path}, rows_in={KEYED_SAMPLES: n}, samples=n,
                        samples_with_stack=with_stack, samples_with_stack_records=n, samples_adopted_stacks=n,
                        samples_settled_by_keys=n, stack_keys_unresolved=unresolved)




def adopted_stacks(d: dict[str, np.ndarray], codes: np.ndarray) -> Stacks:
    """The distinct stacks among the adopted stacks ``codes`` (indexes into ``d``, ``ADOPTED_FIELDS``
    arrays; -1 is none), with their pieces in order."""
    seen = np.zeros(len(d["stack_id"]) + 1, np.bool_)
    seen[codes] = True
    used = np.flatnonzero(seen[:-1])
    if not len(used):
        return Stacks.empty()
    first, _ = unique_pairs(d["stack_id"][used].view(np.uint64), d["id_check"][used])
    u = used[first]
    kn, un = d["k_n"][u], d["u_n"][u]
    kd, ud = np.flatnonzero(kn > 0), np.flatnonzero(un > 0)
    owner = np.concatenate([kd, ud])
    ordinal = np.concatenate([np.zeros(len(kd), np.int64), (kn[ud] > 0).astype(np.int64)])
    ph1 = np.concatenate([d["k_h1"][u][kd], d["u_h1"][u][ud]])
    ph2 = np.concatenate([d["k_h2"][u][kd], d["u_h2"][u][ud]])
    o = np.lexsort((ordinal, owner))
    return Stacks(d["stack_id"][u], d["id_check"][u], owner[o], ordinal[o], ph1[o], ph2[o])
