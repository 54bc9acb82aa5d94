"""Per-event joins in time buckets, run on the workers.

Every per-event join of the decoder is an equality on the raw timestamp: a sample and its stack pieces
share (timestamp, thread), a VirtualAlloc event and its pieces share (timestamp, cpu), a heap event and
its pieces share (timestamp, thread). So the events can be cut into time ranges (buckets) and every
bucket joined on its own, in parallel, in memory bounded by the bucket's size:

1. Partitions write the event-like scratch tables (``BUCKETED``) as Arrow IPC files with their time
   range, and return a sample of their times. Most stack pieces never get there: a sample adopts the
   pieces that directly follow it in its buffer (``adopt_pieces``) and carries its stack id, computed
   once per distinct stack of the partition. ``plan`` cuts the merged sample into buckets of about
   ``rows_per_bucket`` rows; a bucket task reads its time range of every partition's file that overlaps
   it, through a memory map.
2. ``bucket_task`` (one per bucket, on the workers): stack pieces sorted by (event time, thread, user,
   time, cpu, stream position) become one group per (event time, thread). A piece carries polynomial
   hashes of its frames (``kernels.hash_frames_at``), so the group's stack id, a content hash of the
   concatenated frames, follows from its pieces' hashes without the frames: equal frame lists get equal
   ids however they were cut into pieces, and no global id map is needed. Then the samples,
   VirtualAlloc, heap and stack-link rows of the bucket, sorted by (time, cpu, stream position), find
   their group by a merge join in numba, get the owning thread's pid, and are written as the bucket's
   part of the final table. A sample that adopted its pieces keeps its stack, unless another row of the
   bucket could share them: then they rejoin the pieces at their exact place (``Adopted.give_back``),
   so the result is the one without adoption. Parts are named by bucket, so each table's dataset is in
   global time order. The task also writes its distinct stacks with the pieces they are made of.
3. ``joins`` builds the ``stacks`` table once per distinct stack from those pieces' frames, and reports
   any two different frame lists that share an id (a hash collision).
"""

from __future__ import annotations

from pathlib import Path

from collections import namedtuple

import numba as nb
import numpy as np
import pyarrow as pa

from pipeline.decode.etl.batch import to_ns, unique_pairs
from pipeline.decode.etl.kernels import JIT, POLY_B1, POLY_B2, poly_pow, stack_ids
from pipeline.decode.etl.scratch import (I64_MIN, KEYED_REF_COLUMNS, STRIDE, column_array, sorted_rows, stack_column, read_bucket,
                                        read_samples, sort_order, write_final)
from pipeline.decode.etl.settle import adopted_stacks, keyed_samples_task, unshared
from pipeline.decode.etl.stackkeys import resolve_keys, thread_pids, thread_slots
from pipeline.decode.etl.stacks import Stacks
from pipeline.decode.etl.tables import THREAD_STACKED
from pipeline.decode.etl.tasks import BucketResult, BucketTask, KeyedSamplesTask
from pipeline.decode.etl.workerstate import reuse_freed_memory

def plan(samples: list[np.ndarray], rows_per_bucket: int, min_buckets: int,
         rows: int | None = None) -> list[tuple[int, int | None]]:
    """Time ranges [lo, hi) covering every int64 time (the last one has no upper bound: hi None), each
    with about ``rows_per_bucket`` rows (cut at quantiles of the partitions' every-STRIDE-th-time
    samples); at least ``min_buckets`` when there are rows enough. ``rows``: how many rows there are, as
    the partitions counted them; without it, STRIDE per sample, which overcounts by up to STRIDE per file
    (on the 1 GB synth trace, ~160 files: 2 buckets where the ~460,000 rows make one)."""
    ts = np.sort(np.concatenate(samples)) if samples else np.zeros(0, np.int64)
    total = len(ts) * STRIDE if rows is None else rows
    n = max(1, -(-total // max(rows_per_bucket, 1)), min(min_buckets, len(ts)))
    cuts = np.unique(ts[(np.arange(1, n) * len(ts)) // n]) if n > 1 else np.zeros(0, np.int64)
    edges = [I64_MIN, *cuts.tolist(), None]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


class PieceGroups(namedtuple("PieceGroups", ["start", "ts", "tid", "pid", "h1", "h2", "count", "valid"])):
    """``group_pieces``'s output, one entry per group (arrays as long as the pieces: the first ``ng`` hold);
    the kernel takes it as a plain tuple (see ``batch.record_columns``)."""

    DTYPES = (np.int64, np.int64, np.uint32, np.uint32, np.uint64, np.uint64, np.int64, np.int32)


@nb.njit(**JIT)
def group_pieces(order, pieces, groups):
    """Pieces (``pieces``: event time, thread, pid, valid, h1, h2, frame count) in ``order`` (sorting them by
    (event time, thread, user, time, cpu, stream position)) -> one group per (event time, thread), written
    into ``groups`` (a ``PieceGroups``' arrays): its first
    position in that order, pid (of its first piece), the hashes and frame count of the concatenation of its
    valid pieces (``kernels.hash_frames_at``) and its number of valid pieces. The pieces are read through
    ``order`` where they lie. Returns the group count."""
    ev_ts, tid, pid, valid, h1, h2, count = pieces
    g_start, g_ts, g_tid, g_pid, g_h1, g_h2, g_count, g_valid = groups
    n = order.shape[0]
    g = -1
    for i in range(n):
        j = order[i]
        if i == 0 or ev_ts[j] != ev_ts[order[i - 1]] or tid[j] != tid[order[i - 1]]:
            g += 1
            g_start[g] = i
            g_ts[g] = ev_ts[j]
            g_tid[g] = tid[j]
            g_pid[g] = pid[j]
            g_h1[g] = 0
            g_h2[g] = 0
            g_count[g] = 0
            g_valid[g] = 0
        if valid[j]:
            k = count[j]
            g_h1[g] = g_h1[g] * poly_pow(POLY_B1, k) + h1[j]
            g_h2[g] = g_h2[g] * poly_pow(POLY_B2, k) + h2[j]
            g_count[g] += k
            g_valid[g] += 1
    return g + 1


@nb.njit(**JIT)
def match_groups(ts, tid, g_ts, g_tid):
    """For rows sorted by time: index of the first group (sorted by time) with the same (time, thread),
    or -1. Any second key works: VirtualAlloc rows find their link by (time, cpu)."""
    out = np.full(ts.shape[0], -1, np.int64)
    j = 0
    ng = g_ts.shape[0]
    for i in range(ts.shape[0]):
        t = ts[i]
        while j < ng and g_ts[j] < t:
            j += 1
        k = j
        while k < ng and g_ts[k] == t:
            if g_tid[k] == tid[i]:
                out[i] = k
                break
            k += 1
    return out


@nb.njit(**JIT)
def member(ts, keys):
    """ts sorted, keys sorted: whether each ts is among keys."""
    out = np.zeros(ts.shape[0], np.bool_)
    j = 0
    for i in range(ts.shape[0]):
        while j < keys.shape[0] and keys[j] < ts[i]:
            j += 1
        out[i] = j < keys.shape[0] and keys[j] == ts[i]
    return out


def bucket_task(task: BucketTask | KeyedSamplesTask) -> BucketResult:
    """One time bucket's joins, or one partition's samples settled by their stack keys: both run in one map,
    after the partitions."""

    if isinstance(task, KeyedSamplesTask):
        return keyed_samples_task(task)
    with reuse_freed_memory("bucket"):
        return _bucket_task(task)


PIECE_COLUMNS = ["event_ts", "tid", "pid", "cpu", "timestamp", "stream_pos", "user", "valid", "h1", "h2", "n"]


class Groups:
    """The stack groups of one bucket, sorted by (event time, thread). ``stack`` and ``pid`` end with one
    extra entry (-1 and 0), so indexing them with ``match``'s -1 (no group) gives "none"."""

    def __init__(self, ts, tid, pid, stack):
        self.ts, self.tid = ts, tid
        self.pid, self.stack = np.append(pid, np.uint32(0)), np.append(stack, np.int64(-1))

    def match(self, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
        return match_groups(ts, tid, self.ts, self.tid)


def _groups(pieces: pa.Table | None):
    """Group the bucket's stack pieces; returns the groups, the pieces' (event time, cpu, thread) with the
    order that sorts them, and the bucket's distinct stacks with the pieces they are made of
    (``Stacks``)."""
    empty = Groups(*(np.zeros(0, t) for t in (np.int64, np.uint32, np.uint32, np.int64)))
    if pieces is None or not pieces.num_rows:
        return empty, None, Stacks.empty()
    ev, tid, cpu = column_array(pieces, "event_ts"), column_array(pieces, "tid"), column_array(pieces, "cpu")
    order = sort_order(ev, tid, column_array(pieces, "user", np.uint8), column_array(pieces, "timestamp"), cpu, column_array(pieces, "stream_pos"))
    valid, h1, h2 = column_array(pieces, "valid", np.uint8), column_array(pieces, "h1"), column_array(pieces, "h2")
    n = len(ev)
    out = PieceGroups(*(np.empty(n, t) for t in PieceGroups.DTYPES))
    ng = group_pieces(order, (ev, tid, column_array(pieces, "pid"), valid, h1, h2, column_array(pieces, "n")), tuple(out))
    g_start, g_ts, g_tid, g_pid, g_h1, g_h2, g_count, g_valid = out
    g_start, g_ts, g_tid, g_pid = g_start[:ng], g_ts[:ng], g_tid[:ng], g_pid[:ng]
    sid, check = np.empty(ng, np.int64), np.empty(ng, np.uint64)
    stack_ids(g_h1[:ng], g_h2[:ng], g_count[:ng], sid, check)
    has = np.flatnonzero(g_count[:ng] > 0)
    sid_out = np.full(ng, -1, np.int64)
    sid_out[has] = sid[has]
    stacks = Stacks.empty()
    # One group per distinct stack: its valid pieces in order build the stack's frames, once, globally.
    if len(has):
        first, _ = unique_pairs(sid[has].view(np.uint64), check[has])
        gi = has[first]
        ends = np.append(g_start[1:], n)
        starts, counts = g_start[gi], ends[gi] - g_start[gi]
        rows = order[np.repeat(starts, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))]
        owner = np.repeat(np.arange(len(gi)), counts)
        keep = valid[rows] != 0
        rows, owner = rows[keep], owner[keep]
        ordinal = np.arange(len(rows)) - np.searchsorted(owner, owner, side="left")
        stacks = Stacks(sid[gi], check[gi], owner, ordinal, h1[rows], h2[rows])
    return Groups(g_ts, g_tid, g_pid, sid_out), (ev, cpu, tid, order), stacks


class Adopted:
    """The stack pieces that a bucket's samples adopted in their partition (``adopt_pieces``): ``idx`` per
    sample into the distinct adopted stacks ``d`` (-1: none)."""

    def __init__(self, s: pa.Table, d: dict[str, np.ndarray], unsorted):
        self.idx = column_array(s, "adopted")
        self.d, self.unsorted = d, unsorted
        self.mask = self.idx >= 0

    def shared(self, s: pa.Table, pieces, stacked: list[pa.Table], vallocs) -> np.ndarray:
        """The adopted samples whose pieces another row of the bucket could need: a piece or a row of a
        ``THREAD_STACKED`` table (``stacked``) with the sample's (time, thread), another sample with it, or a
        VirtualAlloc event with its (time, cpu) (such an event finds its thread through a piece logged on its
        cpu for its time, and adopted pieces were logged on their sample's cpu)."""
        if not self.mask.any():
            return np.zeros(0, np.int64)
        others = ([(column_array(pieces, "event_ts"), column_array(pieces, "tid"))] if pieces is not None else []) + [
            (column_array(t, "timestamp"), column_array(t, "tid")) for t in stacked]
        return np.flatnonzero(self.mask & ~unshared(s, self.mask, others, vallocs))

    def give_back(self, s: pa.Table, which: np.ndarray) -> pa.Table | None:
        """The adopted pieces of samples ``which`` as stack pieces, at their exact place in the order; those
        samples then find them as a group like any other row."""
        if not len(which):
            return None
        self.mask[which] = False
        t, order = self.unsorted
        rows = order[which]
        ts, tid, cpu, pos = column_array(s, "timestamp")[which], column_array(s, "tid")[which], column_array(s, "cpu")[which], column_array(s, "stream_pos")[which]
        a = self.idx[which]
        pid = self.d["pid"][a]
        parts = []
        for side, prefix in ((0, "k_"), (1, "u_")):
            cnt = self.d[prefix + "n"][a]
            w = np.flatnonzero(cnt > 0)
            dt, d = column_array(t, prefix + "dt")[rows[w]].astype(np.int64), column_array(t, prefix + "d")[rows[w]].astype(np.int64)
            parts.append(pa.table({
                "event_ts": ts[w], "tid": tid[w], "pid": pid[w], "cpu": cpu[w], "timestamp": ts[w] + dt,
                "stream_pos": pos[w] + d, "user": np.full(len(w), bool(side)), "valid": np.ones(len(w), np.uint8),
                "h1": self.d[prefix + "h1"][a[w]], "h2": self.d[prefix + "h2"][a[w]], "n": cnt[w].astype(np.int32)}))
        return pa.concat_tables(parts)

    def stacks(self) -> tuple[np.ndarray, Stacks]:
        """Stack id of every sample (-1 where it adopted nothing) and the distinct adopted stacks."""
        idx = np.where(self.mask, self.idx, -1)
        sid = np.append(self.d["stack_id"], np.int64(-1))[idx]
        return sid, adopted_stacks(self.d, idx)


def _bucket_task(task: BucketTask) -> BucketResult:
    lo, hi, k = task.lo, task.hi, task.bucket
    out_dir, src, scratch = Path(task.out_dir), task.sources, Path(task.scratch_dir)
    result = BucketResult(bucket=k)
    written = result.tables
    threads = thread_slots(task.threads)

    s, adopted_d, unsorted = read_samples(src.get("_samples", []), lo, hi)
    v = sorted_rows(src.get("_virtual_allocs", []), lo, hi)
    # The rows that take the stack of their (time, thread) (``tables.THREAD_STACKED``), by scratch table.
    stacked = {t.scratch: sorted_rows(src.get(t.scratch, []), lo, hi) for t in THREAD_STACKED}
    pieces = read_bucket(src.get("_pieces", []), "event_ts", lo, hi, PIECE_COLUMNS)
    keyed = read_bucket(src.get("_keyed_refs", []), "event_ts", lo, hi, KEYED_REF_COLUMNS)
    for table, t in (("_samples", s), ("_virtual_allocs", v), *stacked.items(), ("_pieces", pieces), ("_keyed_refs", keyed)):
        result.rows_in[table] = t.num_rows if t is not None else 0
    if keyed is not None:
        keyed, result.stack_keys_unresolved = resolve_keys(keyed, task.stack_defs)
        pieces = keyed if pieces is None else pa.concat_tables([pieces, keyed.cast(pieces.schema)]).combine_chunks()
    for t in THREAD_STACKED:
        rows = stacked[t.scratch]
        if t.one_per_event and rows is not None:
            ts, cpu, spos = column_array(rows, "timestamp"), column_array(rows, "cpu"), column_array(rows, "stream_pos")
            # (the rows are in (time, cpu, stream position) order: an event's rows are side by side)
            dup = np.zeros(len(ts), np.bool_)
            dup[1:] = (ts[1:] == ts[:-1]) & (cpu[1:] == cpu[:-1]) & (spos[1:] == spos[:-1])
            stacked[t.scratch] = rows.filter(pa.array(~dup))

    adopted = Adopted(s, adopted_d, unsorted) if s is not None else None
    if adopted is not None:
        # Adopted pieces that another row of the bucket could share go back among the pieces.
        which = adopted.shared(s, pieces, [r for r in stacked.values() if r is not None], v)
        result.adopted_stacks_rejoined = len(which)
        back = adopted.give_back(s, which)
        if back is not None:
            pieces = back if pieces is None else pa.concat_tables([pieces, back.cast(pieces.schema)]).combine_chunks()
    groups, piece_cpus, stacks = _groups(pieces)
    result.groups = len(groups.ts)

    if s is not None:
        ts, tid = column_array(s, "timestamp"), column_array(s, "tid")
        gi = groups.match(ts, tid)
        stack = groups.stack[gi]
        group_pid = groups.pid[gi]
        with_records = gi >= 0
        if adopted is not None:
            sid, adopted_stacks = adopted.stacks()
            stack = np.where(adopted.mask, sid, stack)
            group_pid = np.where(adopted.mask, np.append(adopted.d["pid"], np.uint32(0))[adopted.idx], group_pid)
            with_records |= adopted.mask
            result.samples_adopted_stacks = int(adopted.mask.sum())
            stacks = stacks.plus(adopted_stacks)
        # The process its stack record names (as for the samples settled in their partition), else the
        # thread's owner at that time.
        tpid, has = np.zeros(len(ts), np.uint32), np.zeros(len(ts), np.bool_)
        thread_pids(ts, tid, *threads, tpid, has)
        pid = np.where(with_records, group_pid, tpid).astype(np.uint32)
        table = pa.table({
            "timestamp": s.column("timestamp"), "timestamp_ns": to_ns(ts, *task.clock), "cpu": s.column("cpu"),
            "tid": s.column("tid"), "pid": pa.array(pid, pa.uint32(), mask=~has & ~with_records), "ip": s.column("ip"),
            "stack_id": stack_column(stack), "stream_pos": s.column("stream_pos"),
        })
        written["samples"] = write_final(table, out_dir / "samples.parquet", k)
        result.samples = len(ts)
        result.samples_with_stack = int((stack >= 0).sum())
        result.samples_with_stack_records = int(with_records.sum())
    stacks.write(scratch, k)

    if v is not None:
        ts, cpu = column_array(v, "timestamp"), column_array(v, "cpu")
        vtid = np.full(len(ts), -1, np.int64)
        if piece_cpus is not None:
            # The thread of a piece logged on the event's cpu for the event's time (several: the lowest).
            ev, pcpu, ptid, porder = piece_cpus
            ev = ev[porder]
            near = member(ev, np.unique(ts))                    # positions in the pieces' sorted order
            ev, wanted = ev[near], porder[near]
            o = sort_order(ev, pcpu[wanted].astype(np.int64), ptid[wanted].astype(np.int64))
            li = match_groups(ts, cpu, ev[o], pcpu[wanted][o])
            vtid = np.append(ptid[wanted][o].astype(np.int64), -1)[li]      # li -1 (no link) picks the -1
        gi = groups.match(ts, np.maximum(vtid, 0).astype(np.uint32))
        gi[vtid < 0] = -1
        stack = groups.stack[gi]
        free = column_array(v, "is_free", np.bool_)
        table = pa.table({
            "timestamp": v.column("timestamp"), "timestamp_ns": v.column("timestamp_ns"), "cpu": v.column("cpu"),
            "pid": v.column("pid"), "tid": pa.array(np.maximum(vtid, 0).astype(np.uint32), mask=vtid < 0),
            "base": v.column("base"), "size": v.column("size"), "flags": v.column("flags"),
            "kind": pa.array(np.where(free, "free", "alloc").astype(object), pa.string()),
            "stack_id": stack_column(stack),
        })
        written["virtual_allocs"] = write_final(table, out_dir / "virtual_allocs.parquet", k)

    for t in THREAD_STACKED:
        rows = stacked[t.scratch]
        if rows is not None:
            stack = groups.stack[groups.match(column_array(rows, "timestamp"), column_array(rows, "tid"))]
            table = rows.select(t.columns).append_column("stack_id", stack_column(stack))
            written[t.table] = write_final(table, out_dir / f"{t.table}.parquet", k)
    return result
