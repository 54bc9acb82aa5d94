"""Per-event joins in time buckets, run on the workers.

Every per-event join of the decoder is an equality on the raw timestamp: a sample and its stack pieces
share (timestamp, thread), a VirtualAlloc event and its pieces share (timestamp, cpu), a heap event and
its pieces share (timestamp, thread). So the events can be cut into time ranges (buckets) and every
bucket joined on its own, in parallel, in memory bounded by the bucket's size:

1. Partitions write the event-like scratch tables (``BUCKETED``) as Arrow IPC files with their time
   range, and return a sample of their times. ``plan`` cuts the merged sample into buckets of about
   ``rows_per_bucket`` rows; a bucket task reads its time range of every partition's file that overlaps
   it, through a memory map.
2. ``bucket_task`` (one per bucket, on the workers): stack pieces sorted by (event time, thread, user,
   time, cpu, stream position) become one group per (event time, thread). A piece carries polynomial
   hashes of its frames (``kernels.hash_frames_at``), so the group's stack id, a content hash of the
   concatenated frames, follows from its pieces' hashes without the frames: equal frame lists get equal
   ids however they were cut into pieces, and no global id map is needed. Then the samples,
   VirtualAlloc, heap and stack-link rows of the bucket, sorted by (time, cpu, stream position), find
   their group by a merge join in numba, get the owning thread's pid, and are written as the bucket's
   part of the final table. Parts are named by bucket, so each table's dataset is in global time order.
   The task also writes its distinct stacks with the pieces they are made of.
3. ``joins`` builds the ``stacks`` table once per distinct stack from those pieces' frames, and reports
   any two different frame lists that share an id (a hash collision).
"""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.decode.etl.batch import to_ns, unique_pairs
from pipeline.decode.etl.kernels import JIT, POLY_B1, POLY_B2, dedupe_pairs, poly_pow, stack_ids

#: Scratch tables that partitions write for the bucket joins: table -> time column.
BUCKETED = {"_samples": "timestamp", "_pieces": "event_ts", "_virtual_allocs": "timestamp",
            "_heap_events": "timestamp", "_event_stack_links": "timestamp"}
#: Every STRIDE-th time of a scratch file (record order) is returned to the planner.
STRIDE = 1024

I64_MIN = int(np.iinfo(np.int64).min)


# --- partition side ---------------------------------------------------------------------------------
def write_scratch(table: pa.Table, key: str, path: Path) -> tuple[np.ndarray, tuple[str, int, int]]:
    """Write ``table`` in record order as one Arrow IPC record batch, with its ``key`` range in the
    schema metadata. Returns every STRIDE-th key value (the planner's sample) and the file as a source
    ``(path, lo, hi)``: the planner gives a bucket only the files whose range meets it. Not sorted: the
    bucket tasks sort what they read anyway."""
    table = table.combine_chunks()
    ts = table.column(key).to_numpy()
    lo, hi = (int(ts.min()), int(ts.max())) if len(ts) else (0, -1)
    table = table.replace_schema_metadata({b"lo": str(lo).encode(), b"hi": str(hi).encode()})
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        if len(table):
            w.write_batch(table.to_batches(max_chunksize=len(table))[0])
    return ts[::STRIDE].copy(), (str(path), lo, hi)


def overlapping(sources: list[tuple[str, int, int]], lo: int, hi: int | None) -> list[str]:
    """The paths of the sources whose key range meets [lo, hi) (hi None: unbounded)."""
    return [p for p, first, last in sources if first <= last and last >= lo and (hi is None or first < hi)]


#: Map a whole file range at once (Linux), not page by page as it is first read.
MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def mapped(path: str) -> pa.Buffer:
    """A file, memory-mapped read-only with MAP_POPULATE: a bucket reads most of each scratch file it
    opens, and mapping it in one call costs a third less than faulting it in page by page."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return pa.py_buffer(b"")
        return pa.py_buffer(mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | MAP_POPULATE, prot=mmap.PROT_READ))


#: The hash columns of a stack piece, which partitions store as one dictionary column (``pack_hashes``).
HASH_FIELDS = ("h1", "h2", "n")


def pack_hashes(pieces: pa.Table) -> pa.Table:
    """Stack pieces with their frame hashes and count (``HASH_FIELDS``, 20 bytes a row) replaced by one
    dictionary column ``hash``: a 4-byte index into the partition's distinct (h1, h2, n), which are few
    (one per distinct piece). A quarter less scratch to write: on this VM writing into fresh page cache
    was the largest cost of the partitions (``read_range`` expands it back)."""
    h1, h2, n = (pieces.column(c).to_numpy() for c in HASH_FIELDS)
    first, inverse = unique_pairs(h1 ^ (n.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)), h2)
    distinct = pa.StructArray.from_arrays([pa.array(h1[first]), pa.array(h2[first]), pa.array(n[first])],
                                          names=list(HASH_FIELDS))
    return pieces.drop_columns(list(HASH_FIELDS)).append_column(
        "hash", pa.DictionaryArray.from_arrays(pa.array(inverse, pa.int32()), distinct))


def _unpack_hashes(batch: pa.RecordBatch) -> pa.RecordBatch:
    col = batch.column("hash")
    idx, distinct = col.indices.to_numpy(), col.dictionary
    arrays = [batch.column(i) for i, name in enumerate(batch.schema.names) if name != "hash"]
    names = [name for name in batch.schema.names if name != "hash"]
    for field in HASH_FIELDS:
        arrays.append(pa.array(distinct.field(field).to_numpy()[idx]))
        names.append(field)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def read_range(path: str, key: str, lo: int, hi: int | None, columns: list[str] | None = None) -> pa.Table | None:
    """Rows of a scratch file with lo <= key < hi (no upper bound when ``hi`` is None), read through a
    memory map; packed piece hashes (``pack_hashes``) come back as their plain columns."""
    reader = pa.ipc.open_file(mapped(path))
    meta = reader.schema.metadata or {}
    if not reader.num_record_batches:
        return None
    first, last = int(meta[b"lo"]), int(meta[b"hi"])
    if last < lo or (hi is not None and first >= hi):
        return None
    batch = reader.get_batch(0)
    packed = "hash" in batch.schema.names
    if columns is not None:
        wanted = [c for c in columns if not (packed and c in HASH_FIELDS)]
        batch = batch.select(wanted + (["hash"] if packed and len(wanted) < len(columns) else []))
        packed = "hash" in batch.schema.names
    if not (first >= lo and (hi is None or last < hi)):
        ts = batch.column(key).to_numpy()
        keep = ts >= lo
        if hi is not None:
            keep &= ts < hi
        if not keep.any():
            return None
        batch = batch.filter(pa.array(keep))
    return pa.Table.from_batches([_unpack_hashes(batch) if packed else batch])


def read_bucket(paths: list[str], key: str, lo: int, hi: int | None, columns: list[str] | None = None,
                combine: bool = True) -> pa.Table | None:
    """The bucket's rows of all ``paths``: one chunk per file, or one contiguous chunk (``combine``)."""
    parts = [t for t in (read_range(p, key, lo, hi, columns) for p in paths) if t is not None and t.num_rows]
    if not parts:
        return None
    t = pa.concat_tables(parts, promote_options="permissive")
    return t.combine_chunks() if combine else t


# --- planning -----------------------------------------------------------------------------------------
def plan(samples: list[np.ndarray], rows_per_bucket: int, min_buckets: int) -> list[tuple[int, int | None]]:
    """Time ranges [lo, hi) covering every int64 time (the last one has no upper bound: hi None), each
    with about ``rows_per_bucket`` rows (from the partitions' every-STRIDE-th-time samples); at least
    ``min_buckets`` when there are rows enough."""
    ts = np.sort(np.concatenate(samples)) if samples else np.zeros(0, np.int64)
    total = len(ts) * STRIDE
    n = max(1, -(-total // max(rows_per_bucket, 1)), min(min_buckets, len(ts)))
    cuts = np.unique(ts[(np.arange(1, n) * len(ts)) // n]) if n > 1 else np.zeros(0, np.int64)
    edges = [I64_MIN, *cuts.tolist(), None]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


# --- numba kernels ----------------------------------------------------------------------------------------
@nb.njit(**JIT)
def _less(a0, a1, a2, a3, a4, i, j):
    """(a0, a1, a2, a3, a4)[i] < (...)[j], lexicographically."""
    if a0[i] != a0[j]:
        return a0[i] < a0[j]
    if a1[i] != a1[j]:
        return a1[i] < a1[j]
    if a2[i] != a2[j]:
        return a2[i] < a2[j]
    if a3[i] != a3[j]:
        return a3[i] < a3[j]
    return a4[i] < a4[j]


@nb.njit(**JIT)
def fix_ties(order, ts, a0, a1, a2, a3, a4):
    """``order`` sorts by ``ts``; inside each run of equal times, re-sort (insertion sort: runs are a
    handful of rows) by (a0, a1, a2, a3, a4)."""
    n = order.shape[0]
    i = 0
    while i < n:
        j = i + 1
        t = ts[order[i]]
        while j < n and ts[order[j]] == t:
            j += 1
        if j - i > 1:
            for k in range(i + 1, j):
                v = order[k]
                m = k - 1
                while m >= i and _less(a0, a1, a2, a3, a4, v, order[m]):
                    order[m + 1] = order[m]
                    m -= 1
                order[m + 1] = v
        i = j


def sort_order(ts: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """Permutation sorting by (ts, *keys) (up to five keys): a stable sort on time, then the few rows
    that share a time put in order."""
    order = np.argsort(ts, kind="stable")
    keys = list(keys) + [np.zeros(len(ts), np.int64)] * (5 - len(keys))
    fix_ties(order, ts, *keys)
    return order


@nb.njit(**JIT)
def group_pieces(order, ev_ts, tid, pid, valid, h1, h2, count, g_start, g_ts, g_tid, g_pid, g_h1, g_h2, g_count, g_valid):
    """Pieces in ``order`` (sorting them by (event time, thread, user, time, cpu, stream position)) -> one
    group per (event time, thread): its first position in that order, pid (of its first piece), the hashes
    and frame count of the concatenation of its valid pieces (``kernels.hash_frames_at``) and its number
    of valid pieces. The pieces are read through ``order`` where they lie. Returns the group count."""
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


@nb.njit(**JIT)
def thread_pids(ts, tid, u_tid, u_start, s_t0, s_t1, s_next, s_pid, out, has):
    """Process owning thread ``tid`` at ``ts``: the instance with the latest start at or before ``ts``
    (instances of a tid are back-to-back slots [t0, next t0)), if it had not ended by then.
    u_tid: sorted distinct tids, u_start: their first slot (len + 1)."""
    last_tid = np.uint32(0)
    lo = 0
    hi = 0
    known = False
    for i in range(ts.shape[0]):
        t = tid[i]
        if not known or t != last_tid:
            known = True
            last_tid = t
            a = np.searchsorted(u_tid, t)
            if a < u_tid.shape[0] and u_tid[a] == t:
                lo, hi = u_start[a], u_start[a + 1]
            else:
                lo, hi = 0, 0
        has[i] = False
        for k in range(lo, hi):
            if s_t0[k] <= ts[i] and (k + 1 == hi or ts[i] < s_next[k]):
                if ts[i] <= s_t1[k]:
                    out[i] = s_pid[k]
                    has[i] = True
                break


#: The tables the event tasks write (an empty file when a trace has no such rows).
OUTPUT_SCHEMAS = {
    "samples": pa.schema([("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()),
                          ("tid", pa.uint32()), ("pid", pa.uint32()), ("ip", pa.uint64()), ("stack_id", pa.int64()),
                          ("stream_pos", pa.int64())]),
    "virtual_allocs": pa.schema([("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()),
                                 ("pid", pa.uint32()), ("tid", pa.uint32()), ("base", pa.uint64()), ("size", pa.uint64()),
                                 ("flags", pa.uint32()), ("kind", pa.string()), ("stack_id", pa.int64())]),
    "heap_events": pa.schema([("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()),
                              ("pid", pa.uint32()), ("tid", pa.uint32()), ("kind", pa.string()), ("heap", pa.uint64()),
                              ("address", pa.uint64()), ("size", pa.uint64()), ("old_address", pa.uint64()),
                              ("old_size", pa.uint64()), ("flags", pa.uint32()), ("source", pa.uint32()),
                              ("stack_id", pa.int64())]),
    "event_stacks": pa.schema([("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()),
                               ("stream_pos", pa.int64()), ("tid", pa.uint32()), ("stack_id", pa.int64())]),
}


# --- bucket tasks ----------------------------------------------------------------------------------------
def file_rows(path: str) -> int:
    """Rows of a scratch file, from its footer."""
    reader = pa.ipc.open_file(pa.memory_map(path))
    return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def _np(t: pa.Table, name: str, dtype=None) -> np.ndarray:
    a = t.column(name).to_numpy()
    return a if dtype is None else a.astype(dtype, copy=False)


def bucket_task(task: dict[str, Any]) -> dict[str, Any]:
    from pipeline.decode.etl.partition import reuse_freed_memory

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


def _groups(task: dict[str, Any], lo: int, hi: int, k: int, scratch: Path, result: dict[str, Any]):
    """Group the bucket's stack pieces; write its distinct stacks with the pieces they are made of (for
    the ``stacks`` table); returns the groups and the pieces' (event time, cpu, thread) with the order
    that sorts them."""
    empty = Groups(*(np.zeros(0, t) for t in (np.int64, np.uint32, np.uint32, np.int64)))
    pieces = read_bucket(task["sources"]["_pieces"], "event_ts", lo, hi, PIECE_COLUMNS)
    result["rows_in"]["_pieces"] = pieces.num_rows if pieces is not None else 0
    if pieces is None:
        return empty, None
    ev, tid, cpu = _np(pieces, "event_ts"), _np(pieces, "tid"), _np(pieces, "cpu")
    order = sort_order(ev, tid, _np(pieces, "user", np.uint8), _np(pieces, "timestamp"), cpu, _np(pieces, "stream_pos"))
    valid, h1, h2 = _np(pieces, "valid", np.uint8), _np(pieces, "h1"), _np(pieces, "h2")
    n = len(ev)
    g_start, g_ts = np.empty(n, np.int64), np.empty(n, np.int64)
    g_tid, g_pid = np.empty(n, np.uint32), np.empty(n, np.uint32)
    g_h1, g_h2, g_count, g_valid = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.int64), np.empty(n, np.int32)
    ng = group_pieces(order, ev, tid, _np(pieces, "pid"), valid, h1, h2, _np(pieces, "n"), g_start, g_ts, g_tid, g_pid,
                      g_h1, g_h2, g_count, g_valid)
    g_start, g_ts, g_tid, g_pid = g_start[:ng], g_ts[:ng], g_tid[:ng], g_pid[:ng]
    sid, check = np.empty(ng, np.int64), np.empty(ng, np.uint64)
    stack_ids(g_h1[:ng], g_h2[:ng], g_count[:ng], sid, check)
    has = np.flatnonzero(g_count[:ng] > 0)
    sid_out = np.full(ng, -1, np.int64)
    sid_out[has] = sid[has]
    # One group per distinct stack: its valid pieces in order build the stack's frames, once, globally.
    if len(has):
        # Distinct stacks are far fewer than groups: a small table first, four times larger while full.
        bits, nu = 15, -1
        while nu < 0:
            bits += 2
            first, _, nu = dedupe_pairs(sid[has].view(np.uint64), check[has], bits)
        gi = has[first]
        ends = np.append(g_start[1:], n)
        starts, counts = g_start[gi], ends[gi] - g_start[gi]
        rows = order[np.repeat(starts, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))]
        owner = np.repeat(np.arange(len(gi)), counts)
        keep = valid[rows] != 0
        rows, owner = rows[keep], owner[keep]
        ordinal = np.arange(len(rows)) - np.searchsorted(owner, owner, side="left")
        for name, table in (
                ("_bucket_stacks", {"stack_id": sid[gi], "id_check": check[gi], "bucket": np.full(len(gi), k, np.int32)}),
                ("_bucket_stack_pieces", {"stack_id": sid[gi][owner], "id_check": check[gi][owner],
                                          "bucket": np.full(len(rows), k, np.int32),
                                          "ord": ordinal.astype(np.int32), "h1": h1[rows], "h2": h2[rows]})):
            path = scratch / f"{name}.parquet" / f"part-{k:05d}.parquet"
            path.parent.mkdir(exist_ok=True)
            pq.write_table(pa.table(table), path, compression="none")
    result["groups"] = ng
    return Groups(g_ts, g_tid, g_pid, sid_out), (ev, cpu, tid, order)


def _bucket_task(task: dict[str, Any]) -> dict[str, Any]:
    lo, hi, k = task["lo"], task["hi"], task["bucket"]
    out_dir, src, scratch = Path(task["out_dir"]), task["sources"], Path(task["scratch_dir"])
    result: dict[str, Any] = {"bucket": k, "tables": {}, "rows_in": {}, "groups": 0, "samples": 0, "samples_with_stack": 0,
                              "samples_with_stack_records": 0}
    groups, piece_cpus = _groups(task, lo, hi, k, scratch, result)
    written = result["tables"]
    threads = thread_slots(task["threads"])

    s = _sorted_rows(src.get("_samples", []), lo, hi)
    result["rows_in"]["_samples"] = s.num_rows if s is not None else 0
    if s is not None:
        ts, tid = _np(s, "timestamp"), _np(s, "tid")
        gi = groups.match(ts, tid)
        stack = groups.stack[gi]
        tpid, has = np.zeros(len(ts), np.uint32), np.zeros(len(ts), np.bool_)
        thread_pids(ts, tid, *threads, tpid, has)
        pid = np.where(has, tpid, groups.pid[gi]).astype(np.uint32)
        table = pa.table({
            "timestamp": s.column("timestamp"), "timestamp_ns": to_ns(ts, *task["clock"]), "cpu": s.column("cpu"),
            "tid": s.column("tid"), "pid": pa.array(pid, pa.uint32(), mask=~has & (gi < 0)), "ip": s.column("ip"),
            "stack_id": _stack_column(stack), "stream_pos": s.column("stream_pos"),
        })
        written["samples"] = _write(table, out_dir / "samples.parquet", k)
        result["samples"] = len(ts)
        result["samples_with_stack"] = int((stack >= 0).sum())
        result["samples_with_stack_records"] = int((gi >= 0).sum())

    v = _sorted_rows(src.get("_virtual_allocs", []), lo, hi)
    result["rows_in"]["_virtual_allocs"] = v.num_rows if v is not None else 0
    if v is not None:
        ts, cpu = _np(v, "timestamp"), _np(v, "cpu")
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
        free = _np(v, "is_free", np.bool_)
        table = pa.table({
            "timestamp": v.column("timestamp"), "timestamp_ns": v.column("timestamp_ns"), "cpu": v.column("cpu"),
            "pid": v.column("pid"), "tid": pa.array(np.maximum(vtid, 0).astype(np.uint32), mask=vtid < 0),
            "base": v.column("base"), "size": v.column("size"), "flags": v.column("flags"),
            "kind": pa.array(np.where(free, "free", "alloc").astype(object), pa.string()),
            "stack_id": _stack_column(stack),
        })
        written["virtual_allocs"] = _write(table, out_dir / "virtual_allocs.parquet", k)

    h = _sorted_rows(src.get("_heap_events", []), lo, hi)
    result["rows_in"]["_heap_events"] = h.num_rows if h is not None else 0
    if h is not None:
        gi = groups.match(_np(h, "timestamp"), _np(h, "tid"))
        stack = groups.stack[gi]
        cols = ["timestamp", "timestamp_ns", "cpu", "pid", "tid", "kind", "heap", "address", "size",
                "old_address", "old_size", "flags", "source"]
        table = h.select(cols).append_column("stack_id", _stack_column(stack))
        table = table.cast(OUTPUT_SCHEMAS["heap_events"])      # kind: dictionary in scratch, text here
        written["heap_events"] = _write(table, out_dir / "heap_events.parquet", k)

    e = _sorted_rows(src.get("_event_stack_links", []), lo, hi)
    result["rows_in"]["_event_stack_links"] = e.num_rows if e is not None else 0
    if e is not None:
        ts, cpu, spos = _np(e, "timestamp"), _np(e, "cpu"), _np(e, "stream_pos")
        # One row per event: an event with several stack items has several identical links.
        dup = np.zeros(len(ts), np.bool_)
        dup[1:] = (ts[1:] == ts[:-1]) & (cpu[1:] == cpu[:-1]) & (spos[1:] == spos[:-1])
        e = e.filter(pa.array(~dup))
        gi = groups.match(_np(e, "timestamp"), _np(e, "tid"))
        stack = groups.stack[gi]
        table = e.select(["timestamp", "timestamp_ns", "cpu", "stream_pos", "tid"]).append_column(
            "stack_id", _stack_column(stack))
        written["event_stacks"] = _write(table, out_dir / "event_stacks.parquet", k)
    return result


def thread_slots(threads_path: str):
    t = np.load(threads_path)
    return (t["u_tid"], t["u_start"], t["t0"], t["t1"], t["next"], t["pid"])


def owners(threads_path: str, ts: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pid owning each (time, thread) per the saved thread slots, and whether one does."""
    out, has = np.zeros(len(ts), np.uint32), np.zeros(len(ts), np.bool_)
    thread_pids(ts, tid, *thread_slots(threads_path), out, has)
    return out, has


def _sorted_rows(paths: list[str], lo: int, hi: int) -> pa.Table | None:
    """The bucket's rows in (time, cpu, stream position) order: the sort keys are copied out of the
    memory-mapped files, the other columns only once, by the final take."""
    t = read_bucket(paths, "timestamp", lo, hi, combine=False)
    if t is None:
        return None
    order = sort_order(_np(t, "timestamp"), _np(t, "cpu", np.int64), _np(t, "stream_pos"))
    return t.take(order)


def _write(table: pa.Table, directory: Path, k: int) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"part-{k:05d}.parquet"
    # Dictionary pages for text, and for stack ids and instruction pointers (few distinct values per
    # part; parquet falls back to plain pages when a dictionary grows past 1 MB). Time columns are
    # sorted: delta encoding. On the samples of the 1 GB synth trace both together: 47 -> 14 MB, and
    # a 25 % faster write.
    text = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)
            or f.name in ("stack_id", "ip")]
    # (stream_pos is not sorted: plain pages, 10 ms and 0.39 MB per 362k samples against 11 ms and 0.48
    # MB delta-encoded. BYTE_STREAM_SPLIT would write the other integers 20-30 % faster, but DuckDB reads
    # it for integers only since mid-2026 (duckdb#24175): a user's older DuckDB could not open the tables.)
    delta = {c: "DELTA_BINARY_PACKED" for c in ("timestamp", "timestamp_ns") if c in table.column_names}
    write_part(table, target, compression="zstd", compression_level=1, use_dictionary=text, column_encoding=delta)
    return str(target)


def write_part(table: pa.Table, target: Path, **options) -> None:
    """Write one parquet part under its final name atomically: a task that dask runs again (its worker
    died) replaces the part instead of adding a second copy of its rows, and no half-written part is
    ever seen under the final name."""
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp, **options)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _stack_column(ids: np.ndarray) -> pa.Array:
    return pa.array(ids, pa.int64(), mask=ids < 0)
