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

import mmap
import os
import uuid
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.decode.etl.batch import PairSet, to_ns, unique_pairs
from pipeline.decode.etl.kernels import JIT, POLY_B1, POLY_B2, _finish, _pair_slot, poly_pow, stack_ids

#: Scratch tables that partitions write for the bucket joins: table -> time column.
BUCKETED = {"_samples": "timestamp", "_pieces": "event_ts", "_keyed_refs": "event_ts", "_virtual_allocs": "timestamp",
            "_heap_events": "timestamp", "_event_stack_links": "timestamp"}
#: The scratch table of the samples settled by their stack keys (``settle_keyed_samples``): one file per
#: partition, each the source of one ``keyed_samples_task``, not of the buckets.
KEYED_SAMPLES = "_keyed_samples"
#: A stack-key reference as partitions write it for the buckets (``resolve_keys`` makes it a piece).
KEYED_REF_COLUMNS = ["event_ts", "tid", "pid", "cpu", "timestamp", "stream_pos", "user", "key"]
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


# --- stack pieces adopted by their sample (partition side) ---------------------------------------------
#: At most this many stack pieces that directly follow a sample in its buffer are looked at.
ADOPT_WINDOW = 8
#: What a sample carries for each adopted piece beside its hashes: the piece's time after the sample's
#: (ticks) and its distance in records, which give back its (timestamp, cpu, stream_pos) in the buckets.
ADOPT_MAX_DT = 0xFFFF


@nb.njit(**JIT)
def claim_adjacent(s_rec, s_ts, s_tid, rbuf, piece_at, p_ev, p_tid, p_user, p_pid, p_ts, p_h1, p_h2, p_n, window,
                   k_out, u_out, k_dt, u_dt, k_d, u_d, pid_out, key1, key2, claimed):
    """``_claim_adjacent`` with the powers of the hash bases up to the largest frame count at hand."""
    pw1 = np.ones(1, np.uint64)
    pw2 = np.ones(1, np.uint64)
    if p_n.shape[0]:
        top = max(0, p_n.max()) + 1
        pw1 = np.empty(top, np.uint64)
        pw2 = np.empty(top, np.uint64)
        pw1[0] = 1
        pw2[0] = 1
        for i in range(1, top):
            pw1[i] = pw1[i - 1] * POLY_B1
            pw2[i] = pw2[i - 1] * POLY_B2
    _claim_adjacent(s_rec, s_ts, s_tid, rbuf, piece_at, p_ev, p_tid, p_user, p_pid, p_ts, p_h1, p_h2, p_n, window,
                    k_out, u_out, k_dt, u_dt, k_d, u_d, pid_out, key1, key2, claimed, pw1, pw2)


@nb.njit(**JIT)
def _claim_adjacent(s_rec, s_ts, s_tid, rbuf, piece_at, p_ev, p_tid, p_user, p_pid, p_ts, p_h1, p_h2, p_n, window,
                    k_out, u_out, k_dt, u_dt, k_d, u_d, pid_out, key1, key2, claimed, pw1, pw2):
    """For each sample (record ``s_rec``), the stack pieces of its (time, thread) that directly follow it
    in its buffer (consecutive records, at most ``window``): at most one kernel piece (``k_out``) and one
    user piece (``u_out``), -1 for none, with their time after the sample and distance in records. A sample adopts nothing (both -1)
    when a side has two pieces there, a piece was adopted already, its time is too far, or the two
    pieces name different processes: its pieces then go through the buckets as before.

    ``key1``/``key2``: what tells adopted stacks apart: the hashes of the concatenated frames (as
    ``group_pieces`` computes them), with the frame count and the kernel piece's frame count folded in."""
    n = rbuf.shape[0]
    for s in range(s_rec.shape[0]):
        r = s_rec[s]
        k = -1
        u = -1
        kd = 0
        ud = 0
        ok = True
        q = r + 1
        end = min(r + window + 1, n)
        while q < end and rbuf[q] == rbuf[r]:
            p = piece_at[q]
            if p < 0 or p_ev[p] != s_ts[s] or p_tid[p] != s_tid[s]:
                break
            dt = p_ts[p] - s_ts[s]
            if claimed[p] or dt < 0 or dt > ADOPT_MAX_DT:
                ok = False
                break
            if p_user[p]:
                if u >= 0:
                    ok = False
                    break
                u = p
                ud = q - r
            else:
                if k >= 0:
                    ok = False
                    break
                k = p
                kd = q - r
            q += 1
        if ok and k >= 0 and u >= 0 and p_pid[k] != p_pid[u]:
            ok = False
        if not ok or (k < 0 and u < 0):
            continue                        # the outputs hold "nothing adopted" already
        k_out[s] = k
        u_out[s] = u
        h1 = np.uint64(0)
        h2 = np.uint64(0)
        kn = 0
        un = 0
        if k >= 0:
            h1 = p_h1[k]
            h2 = p_h2[k]
            kn = p_n[k]
        if u >= 0:
            un = p_n[u]
            h1 = h1 * pw1[un] + p_h1[u]
            h2 = h2 * pw2[un] + p_h2[u]
        key1[s] = h1 ^ (np.uint64(kn + un) * np.uint64(0x9E3779B97F4A7C15)) ^ (np.uint64(kn) * np.uint64(0xD6E8FEB86659FD93))
        pid_out[s] = p_pid[k] if k >= 0 else p_pid[u]
        key2[s] = h2 ^ (np.uint64(pid_out[s]) * np.uint64(0xBF58476D1CE4E5B9))
        k_dt[s] = p_ts[k] - s_ts[s] if k >= 0 else 0
        u_dt[s] = p_ts[u] - s_ts[s] if u >= 0 else 0
        k_d[s] = kd
        u_d[s] = ud
        if k >= 0:
            claimed[k] = True
        if u >= 0:
            claimed[u] = True


#: Fields of a distinct adopted stack (the dictionary of a sample's ``adopted`` column): its id and check,
#: the hashes and frame count of its kernel piece and its user piece (0 for none), and the process the
#: pieces name.
ADOPTED_FIELDS = ("stack_id", "id_check", "k_h1", "k_h2", "k_n", "u_h1", "u_h2", "u_n", "pid")


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
    for name, values in (("k_dt", c.k_dt), ("u_dt", c.u_dt), ("k_d", c.k_d), ("u_d", c.u_d)):
        samples = samples.append_column(name, pa.array(values))
    return samples, c.left(c.claimed)


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


#: The columns of a stack piece that ``claim_adjacent`` matches a row's with.
PIECE_CLAIM_COLUMNS = ("event_ts", "tid", "user", "pid", "timestamp")


def claim_pieces(rows: list[np.ndarray], rbuf: np.ndarray, at: np.ndarray, recs: np.ndarray,
                 pieces: list[np.ndarray], h1: np.ndarray, h2: np.ndarray, cnt: np.ndarray) -> dict[str, np.ndarray]:
    """``claim_adjacent`` with its outputs made: ``rows`` (record index, time, thread of each row) claim
    the pieces at positions ``at`` of ``pieces`` (``PIECE_CLAIM_COLUMNS`` arrays; ``h1``, ``h2``, ``cnt``
    their hashes and frame count), logged at records ``recs``. Returns per row ``k`` and ``u`` (the
    position of its kernel and user piece, -1 for none), ``k_dt``, ``u_dt``, ``k_d``, ``u_d``, ``pid``,
    ``key1``, ``key2`` (see ``claim_adjacent``), and ``claimed``, per piece."""
    n = len(rows[0])
    c = {"k": np.full(n, -1, np.int64), "u": np.full(n, -1, np.int64), "k_dt": np.zeros(n, np.uint16),
         "u_dt": np.zeros(n, np.uint16), "k_d": np.zeros(n, np.uint8), "u_d": np.zeros(n, np.uint8),
         "pid": np.zeros(n, np.uint32), "key1": np.zeros(n, np.uint64), "key2": np.zeros(n, np.uint64),
         "claimed": np.zeros(len(pieces[0]), np.bool_)}
    if len(at):                             # (no pieces of the kind: nothing to claim)
        piece_at = np.full(len(rbuf), -1, np.int64)
        piece_at[recs] = at
        claim_adjacent(*rows, rbuf, piece_at, *pieces, h1, h2, cnt, ADOPT_WINDOW,
                       *(c[f] for f in ("k", "u", "k_dt", "u_dt", "k_d", "u_d", "pid", "key1", "key2", "claimed")))
    return c


class Claim:
    """The stack pieces of ``refs`` that directly follow each row of ``rows`` in its buffer
    (``claim_adjacent``: at most a kernel and a user piece of the row's time and thread), and the
    distinct stacks they make: ``codes`` (per row, -1 for none) index ``d`` (``ADOPTED_FIELDS`` arrays)."""

    def __init__(self, rows: pa.Table, refs: pa.Table, rbuf: np.ndarray):
        n = rows.num_rows
        self.refs = refs
        stackwalk, prec = claimable(refs, full=True)
        col = lambda t, c: t.column(c).to_numpy()  # noqa: E731
        h1, h2, cnt = col(refs, "h1"), col(refs, "h2"), col(refs, "n")
        c = claim_pieces([col(rows, f) for f in ("_rec", "timestamp", "tid")], rbuf, stackwalk, prec[stackwalk],
                         [col(refs, f) for f in PIECE_CLAIM_COLUMNS], h1, h2, cnt)
        k, u, pid, key1, key2 = c["k"], c["u"], c["pid"], c["key1"], c["key2"]
        self.k_dt, self.u_dt, self.k_d, self.u_d, self.claimed = c["k_dt"], c["u_dt"], c["k_d"], c["u_d"], c["claimed"]
        self.k, self.u = k, u
        # One dictionary entry per distinct adopted stack (and cut into kernel and user piece).
        some = np.flatnonzero((k >= 0) | (u >= 0))
        codes = np.full(n, -1, np.int32)
        first = np.zeros(0, np.int64)
        if len(some):
            first, codes[some] = unique_pairs(key1[some], key2[some])
            first = some[first]
        self.codes = codes
        kf, uf = k[first], u[first]
        h1, h2, cnt = np.append(h1, np.uint64(0)), np.append(h2, np.uint64(0)), np.append(cnt, 0).astype(np.int64)
        dh1, dh2, dn = np.empty(len(first), np.uint64), np.empty(len(first), np.uint64), np.empty(len(first), np.int64)
        adopted_hashes(h1[kf], h2[kf], cnt[kf], h1[uf], h2[uf], cnt[uf], dh1, dh2, dn)
        sid, check = np.empty(len(first), np.int64), np.empty(len(first), np.uint64)
        stack_ids(dh1, dh2, dn, sid, check)
        self.d = dict(zip(ADOPTED_FIELDS, (sid, check, h1[kf], h2[kf], cnt[kf].astype(np.int32), h1[uf], h2[uf],
                                           cnt[uf].astype(np.int32), pid[first])))

    def left(self, gone: np.ndarray) -> pa.Table:
        """``refs`` without the pieces marked in ``gone``."""
        # (take: the few pieces left are gathered; a filter would scan the mask once per column.)
        return self.refs.take(np.flatnonzero(~gone)) if gone.any() else self.refs

    def pieces_of(self, rows: np.ndarray) -> np.ndarray:
        """Mask over ``refs`` of the pieces that ``rows`` claimed."""
        gone = np.zeros(self.refs.num_rows, np.bool_)
        for side in (self.k[rows], self.u[rows]):
            gone[side[side >= 0]] = True
        return gone


@nb.njit(**JIT)
def adopted_hashes(kh1, kh2, kn, uh1, uh2, un, h1, h2, count):
    """Hashes and frame count of kernel pieces followed by user pieces (the order ``group_pieces`` gives
    them; a count of 0 is no piece)."""
    for i in range(kh1.shape[0]):
        h1[i] = kh1[i] * poly_pow(POLY_B1, un[i]) + uh1[i]
        h2[i] = kh2[i] * poly_pow(POLY_B2, un[i]) + uh2[i]
        count[i] = kn[i] + un[i]


# --- samples and heap events whose stack is complete in their partition (partition side) --------------
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
        "timestamp": s.column("timestamp"), "timestamp_ns": to_ns(_np(s, "timestamp"), *clock), "cpu": s.column("cpu"),
        "tid": s.column("tid"), "pid": d["pid"][a], "ip": s.column("ip"), "stack_id": _stack_column(d["stack_id"][a]),
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
    rows whose (time, cpu) bit is set are sorted and compared exactly (``settled_rows``). Sorting every row
    and every other by time, as before, took ~2.8 ms of a 24 MiB partition's samples, this ~1.9 ms."""
    ts, tid, cpu = _np(rows, "timestamp"), _np(rows, "tid"), _np(rows, "cpu")
    va_ts, va_cpu = np.zeros(0, np.int64), np.zeros(0, np.uint16)
    if vallocs is not None and vallocs.num_rows:
        va_ts, va_cpu = _np(vallocs, "timestamp"), _np(vallocs, "cpu")
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


@nb.njit(**JIT)
def _log2(n):
    b = 0
    while (1 << (b + 1)) <= n:
        b += 1
    return b


@nb.njit(**JIT)
def _key_bit(t, k, bits):
    """The bit of the key (t, k) in a bitmap of 2**bits bits."""
    h = (np.uint64(t) * np.uint64(0x9E3779B97F4A7C15)) ^ (np.uint64(k) * np.uint64(0xC2B2AE3D27D4EB4F))
    h ^= h >> np.uint64(31)
    return (h * np.uint64(0xBF58476D1CE4E5B9)) >> np.uint64(64 - bits)


@nb.njit(**JIT)
def _has_bit(bitmap, bits, t, k):
    b = _key_bit(t, k, bits)
    return (bitmap[b >> np.uint64(6)] >> (b & np.uint64(63))) & np.uint64(1) != 0


@nb.njit(**JIT)
def mark_keys(ts, key, once, twice):
    """Set the bit of each key (ts, key) in ``once``, and in ``twice`` when it was set already (``twice``
    empty: not kept)."""
    bits = _log2(once.shape[0] * 64)
    for i in range(ts.shape[0]):
        b = _key_bit(ts[i], key[i], bits)
        w, m = b >> np.uint64(6), np.uint64(1) << (b & np.uint64(63))
        if once[w] & m:
            if twice.shape[0]:
                twice[w] |= m
        else:
            once[w] |= m


@nb.njit(**JIT)
def candidates(ts, tid, cpu, whole, twice, va, final, check):
    """Per row: ``check`` when the bit of its (time, thread) is set in ``twice`` or, for a whole row, the bit of
    its (time, cpu) in ``va``; ``final`` for the other whole rows."""
    bits, va_bits = _log2(twice.shape[0] * 64), _log2(va.shape[0] * 64)
    for i in range(ts.shape[0]):
        c = _has_bit(twice, bits, ts[i], tid[i]) or (whole[i] and _has_bit(va, va_bits, ts[i], cpu[i]))
        check[i] = c
        final[i] = whole[i] and not c


@nb.njit(**JIT)
def _in_bitmap(ts, key, bitmap, out):
    bits = _log2(bitmap.shape[0] * 64)
    for i in range(ts.shape[0]):
        out[i] = _has_bit(bitmap, bits, ts[i], key[i])


def in_bitmap(ts: np.ndarray, key: np.ndarray, bitmap: np.ndarray) -> np.ndarray:
    """Whether the bit of each key (ts, key) is set in ``bitmap``."""
    out = np.empty(len(ts), np.bool_)
    _in_bitmap(ts, key, bitmap, out)
    return out


#: The columns of ``heap_events`` that come from the event itself.
HEAP_COLUMNS = ["timestamp", "timestamp_ns", "cpu", "pid", "tid", "kind", "heap", "address", "size", "old_address",
                "old_size", "flags", "source"]


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
    mine = c.left(c.claimed)
    final = unshared(heap, whole, others + [(_np(mine, "event_ts"), _np(mine, "tid"))], vallocs)
    done = np.flatnonzero(final)
    if not len(done):
        return None, heap, refs, Stacks.empty()
    a = c.codes[done]
    keep = pa.array(final)
    out = heap.select(HEAP_COLUMNS).filter(keep).append_column("stack_id", _stack_column(c.d["stack_id"][a]))
    return (out, heap.filter(pc.invert(keep)), c.left(c.pieces_of(done)),
            adopted_stacks(c.d, a))


# --- samples whose stack keys directly follow them (partition side, then a task per partition) ---------
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
    ``u_dt``: ticks, at most ``ADOPT_MAX_DT``). ``keyed_samples_task`` resolves the keys once every
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
    zeros = np.zeros(len(which), np.uint64)
    # (the hash inputs are unused here: a reference's frames are not known yet)
    c = claim_pieces([at_free(col(samples, f)) for f in ("_rec", "timestamp", "tid")], rbuf, np.arange(len(which)),
                     prec[which], [at_which(col(refs, f)) for f in PIECE_CLAIM_COLUMNS], key, zeros,
                     np.zeros(len(which), np.int32))
    k, u, k_dt, u_dt, pid, claimed = c["k"], c["u"], c["k_dt"], c["u_dt"], c["pid"], c["claimed"]
    complete = (u >= 0) | ((k >= 0) & kernel_only(pid))
    if not complete.any():
        return None, samples, refs, 0
    whole = np.zeros(samples.num_rows, np.bool_)
    whole[free[complete]] = True
    mine = np.ones(refs.num_rows, np.bool_)          # the references no sample claimed
    mine[which[claimed]] = False
    final = unshared(samples, whole, others + [(r_ev[mine], r_tid[mine])], vallocs)
    done = np.flatnonzero(final[free])             # positions among ``free``
    if not len(done):
        return None, samples, refs, 0
    rows = free[done]
    kd, ud = k[done], u[done]
    keep = np.ones(samples.num_rows, np.bool_)
    keep[rows] = False
    # (filters, not takes: most rows are kept, and a take first joins a column's chunks into one)
    s = samples.select(["timestamp", "cpu", "tid", "ip", "stream_pos"]).filter(pa.array(~keep))
    out = pa.table({
        "timestamp": s.column("timestamp"), "cpu": s.column("cpu"), "tid": s.column("tid"), "pid": pid[done],
        "ip": s.column("ip"), "stream_pos": s.column("stream_pos"),
        "k_key": np.where(kd >= 0, key[kd], 0), "u_key": np.where(ud >= 0, key[ud], 0),
        "k_dt": k_dt[done], "u_dt": u_dt[done], "sides": ((kd >= 0) + 2 * (ud >= 0)).astype(np.uint8)})
    left = np.ones(refs.num_rows, np.bool_)
    left[which[kd[kd >= 0]]] = False
    left[which[ud[ud >= 0]]] = False
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


def keyed_samples_task(task: dict[str, Any]) -> dict[str, Any]:
    """The final ``samples`` rows of one partition's samples settled by their stack keys
    (``settle_keyed_samples``): each reference takes the first definition of its key at or after it, as
    ``resolve_keys`` does for the buckets, and the two pieces' hashes make the stack id as a group of those
    pieces would get it in a bucket (``defined_ids``); the rows are written in record order
    (``keyed-<partition>.parquet``) with their distinct stacks (writer ``task["writer"]``)."""
    from pipeline.decode.etl.partition import reuse_freed_memory, write_stacks_once

    with reuse_freed_memory("bucket"):
        reader = pa.ipc.open_file(mapped(task["keyed_samples"]))
        t = pa.Table.from_batches([reader.get_batch(i) for i in range(reader.num_record_batches)], reader.schema)
        n = t.num_rows
        defs = load_defs(task["stack_defs"])
        index = defs["index"]
        ts, sides = _np(t, "timestamp"), _np(t, "sides")
        at = {}
        for prefix, bit in (("k_", 1), ("u_", 2)):
            at[prefix] = np.full(n, -1, np.int64)
            first_at_or_after(_np(t, prefix + "key"), ts, _np(t, prefix + "dt"), sides, bit, defs["timestamp"],
                              index.slots, index.a, defs["run_lo"], defs["run_hi"], at[prefix])
        k_at, u_at = at["k_"], at["u_"]
        unresolved = int((((sides & 1) > 0) & (k_at < 0)).sum() + (((sides & 2) > 0) & (u_at < 0)).sum())
        sid, check = np.empty(n, np.int64), np.empty(n, np.uint64)
        defined_ids(k_at, u_at, defs["h1"], defs["h2"], defs["n"], defs["pow1"], defs["pow2"], sid, check)
        table = pa.table({
            "timestamp": t.column("timestamp"), "timestamp_ns": to_ns(ts, *task["clock"]), "cpu": t.column("cpu"),
            "tid": t.column("tid"), "pid": t.column("pid"), "ip": t.column("ip"), "stack_id": _stack_column(sid),
            "stream_pos": t.column("stream_pos")})
        path = write_final(table, Path(task["out_dir"]) / "samples.parquet", task["part"], prefix="keyed-",
                           extra_delta=("stream_pos",))
        # The distinct stacks, from one row per distinct pair of definitions (not from every row: ~300,000 rows
        # a task). Each distinct stack is written once per worker: the tasks of a trace with varied stacks
        # repeat most of them.
        write_stacks_once(defined_stacks(defs, k_at, u_at, sid, check), task["writer"],
                          f"keyed-{task['part']:05d}", Path(task["scratch_dir"]))
    with_stack = int((sid >= 0).sum())
    return {"bucket": task["writer"], "tables": {"samples": path}, "rows_in": {KEYED_SAMPLES: n}, "groups": 0,
            "samples": n, "samples_with_stack": with_stack, "samples_with_stack_records": n, "samples_adopted_stacks": n,
            "samples_settled_by_keys": n, "stack_keys_unresolved": unresolved, "adopted_stacks_rejoined": 0}


@nb.njit(**JIT)
def settled_rows(order, ts, tid, cpu, whole, o_ts, o_tid, va_ts, va_cpu, out):
    """``out[r]``: row ``r`` (a sample or a heap event) is ``whole`` and shares its (time, thread) with no
    other of these rows and no row of (``o_ts``, ``o_tid``) (sorted by time), and its (time, cpu) with no
    VirtualAlloc event (``va_ts``, ``va_cpu``, sorted by time). ``order`` sorts the rows by time."""
    n = order.shape[0]
    j = 0
    m = 0
    i = 0
    while i < n:
        t = ts[order[i]]
        e = i + 1
        while e < n and ts[order[e]] == t:
            e += 1
        while j < o_ts.shape[0] and o_ts[j] < t:
            j += 1
        while m < va_ts.shape[0] and va_ts[m] < t:
            m += 1
        for a in range(i, e):
            r = order[a]
            if not whole[r]:
                continue
            hit = _run_has(va_ts, va_cpu, m, t, cpu[r]) or _run_has(o_ts, o_tid, j, t, tid[r])
            c = i
            while not hit and c < e:
                hit = c != a and tid[order[c]] == tid[r]
                c += 1
            out[r] = not hit
        i = e


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


def read_samples(paths: list[str], lo: int, hi: int | None):
    """The bucket's samples in (time, cpu, stream position) order, their ``adopted`` column as an index
    into the bucket's adopted stacks (all files' dictionaries side by side, ``ADOPTED_FIELDS`` arrays),
    and the order that sorts the rows as read (for the columns only a few rows need)."""
    tables, dicts, offset = [], {f: [] for f in ADOPTED_FIELDS}, 0
    for p in paths:
        t = read_range(p, "timestamp", lo, hi)
        if t is None or not t.num_rows:
            continue
        col = t.column("adopted").combine_chunks()
        idx = col.indices.fill_null(-1).to_numpy().astype(np.int64)
        idx[idx >= 0] += offset
        for f in ADOPTED_FIELDS:
            dicts[f].append(col.dictionary.field(f).to_numpy())
        offset += len(col.dictionary)
        tables.append(t.drop_columns(["adopted"]).append_column("adopted", pa.array(idx)))
    if not tables:
        return None, None, None
    t = pa.concat_tables(tables, promote_options="permissive")
    order = sort_order(_np(t, "timestamp"), _np(t, "cpu", np.int64), _np(t, "stream_pos"))
    main = t.select(["timestamp", "cpu", "stream_pos", "tid", "ip", "adopted"]).take(order)
    return main, {f: np.concatenate(v) for f, v in dicts.items()}, (t, order)


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


#: The tables the event tasks write (an empty file when a trace has no such rows). Every column is NOT NULL
#: (a parquet REQUIRED column) but those named in ``NULLABLE``: a part need not encode definition levels for
#: them, which took ~10 % of writing a partition's ``samples`` (2.5 of 15 ms a part here), and a reader knows
#: that they have no nulls. Every part of a table is written with this schema (``write_final``).
NULLABLE = {"samples": ("pid", "stack_id"), "virtual_allocs": ("tid", "stack_id"), "heap_events": ("stack_id",),
            "event_stacks": ("stack_id",)}


def _output_schema(table: str, columns: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema([pa.field(name, type, nullable=name in NULLABLE[table]) for name, type in columns])


OUTPUT_SCHEMAS = {
    "samples": _output_schema("samples", [
        ("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()), ("tid", pa.uint32()),
        ("pid", pa.uint32()), ("ip", pa.uint64()), ("stack_id", pa.int64()), ("stream_pos", pa.int64())]),
    "virtual_allocs": _output_schema("virtual_allocs", [
        ("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()), ("pid", pa.uint32()),
        ("tid", pa.uint32()), ("base", pa.uint64()), ("size", pa.uint64()), ("flags", pa.uint32()),
        ("kind", pa.string()), ("stack_id", pa.int64())]),
    "heap_events": _output_schema("heap_events", [
        ("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()), ("pid", pa.uint32()),
        ("tid", pa.uint32()), ("kind", pa.string()), ("heap", pa.uint64()), ("address", pa.uint64()),
        ("size", pa.uint64()), ("old_address", pa.uint64()), ("old_size", pa.uint64()), ("flags", pa.uint32()),
        ("source", pa.uint32()), ("stack_id", pa.int64())]),
    "event_stacks": _output_schema("event_stacks", [
        ("timestamp", pa.int64()), ("timestamp_ns", pa.int64()), ("cpu", pa.uint16()), ("stream_pos", pa.int64()),
        ("tid", pa.uint32()), ("stack_id", pa.int64())]),
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
    """One time bucket's joins, or (a task with ``keyed_samples``) one partition's samples settled by their
    stack keys: both run in one map, after the partitions."""
    from pipeline.decode.etl.partition import reuse_freed_memory

    if "keyed_samples" in task:
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


class Stacks:
    """Distinct stacks (id, check) and their pieces in order (``owner``: index of the stack, ``ordinal``,
    the piece's hashes), written per bucket for the ``stacks`` table."""

    def __init__(self, sid, check, owner, ordinal, h1, h2):
        self.sid, self.check, self.owner, self.ordinal, self.h1, self.h2 = sid, check, owner, ordinal, h1, h2

    @classmethod
    def empty(cls) -> Stacks:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros(0, np.uint64), np.zeros(0, np.uint64))

    def plus(self, other: Stacks) -> Stacks:
        """These stacks and those of ``other`` that are not among them."""
        if not len(other.sid):
            return self
        if not len(self.sid):
            return other
        first, _ = unique_pairs(np.concatenate([self.sid, other.sid]).view(np.uint64),
                                np.concatenate([self.check, other.check]))
        new = np.sort(first[first >= len(self.sid)] - len(self.sid))
        take = np.zeros(len(other.sid), np.int64)
        take[new] = np.arange(len(new)) + len(self.sid)
        rows = np.flatnonzero(np.isin(other.owner, new))
        return Stacks(np.concatenate([self.sid, other.sid[new]]), np.concatenate([self.check, other.check[new]]),
                      np.concatenate([self.owner, take[other.owner[rows]]]),
                      np.concatenate([self.ordinal, other.ordinal[rows]]),
                      np.concatenate([self.h1, other.h1[rows]]), np.concatenate([self.h2, other.h2[rows]]))

    def only(self, keep: np.ndarray) -> Stacks:
        """The stacks of mask ``keep``, with their pieces."""
        if keep.all():
            return self
        at = np.full(len(self.sid), -1, np.int64)
        at[keep] = np.arange(int(keep.sum()))
        rows = keep[self.owner]
        return Stacks(self.sid[keep], self.check[keep], at[self.owner[rows]], self.ordinal[rows], self.h1[rows],
                      self.h2[rows])

    def tables(self, k: int) -> dict[str, pa.Table]:
        """The stacks as the scratch tables ``_bucket_stacks`` and ``_bucket_stack_pieces``, under writer
        number ``k`` (a bucket, or a partition's negative number): ``joins`` takes each stack's pieces from
        one writer."""
        return {"_bucket_stacks": pa.table({"stack_id": self.sid, "id_check": self.check,
                                            "bucket": np.full(len(self.sid), k, np.int32)}),
                "_bucket_stack_pieces": pa.table({"stack_id": self.sid[self.owner], "id_check": self.check[self.owner],
                                                  "bucket": np.full(len(self.owner), k, np.int32),
                                                  "ord": self.ordinal.astype(np.int32), "h1": self.h1, "h2": self.h2})}

    def write(self, scratch: Path, k: int) -> None:
        if not len(self.sid):
            return
        for name, table in self.tables(k).items():
            path = scratch / f"{name}.parquet" / f"part-{k:05d}.parquet"
            path.parent.mkdir(exist_ok=True)
            pq.write_table(table, path, compression="none")


@nb.njit(**JIT)
def _run_has(ts, key, start, t, value):
    """Whether a row from ``start`` on with ``ts`` == ``t`` (sorted ``ts``) has ``key`` == ``value``."""
    q = start
    while q < ts.shape[0] and ts[q] == t:
        if key[q] == value:
            return True
        q += 1
    return False


class Adopted:
    """The stack pieces that a bucket's samples adopted in their partition (``adopt_pieces``): ``idx`` per
    sample into the distinct adopted stacks ``d`` (-1: none)."""

    def __init__(self, s: pa.Table, d: dict[str, np.ndarray], unsorted):
        self.idx = _np(s, "adopted")
        self.d, self.unsorted = d, unsorted
        self.mask = self.idx >= 0

    def shared(self, s: pa.Table, pieces, heap, links, vallocs) -> np.ndarray:
        """The adopted samples whose pieces another row of the bucket could need: a piece, heap event or
        stack link with the sample's (time, thread), another sample with it, or a VirtualAlloc event
        with its (time, cpu) (such an event finds its thread through a piece logged on its cpu for its
        time, and adopted pieces were logged on their sample's cpu)."""
        if not self.mask.any():
            return np.zeros(0, np.int64)
        others = [(_np(t, c), _np(t, "tid")) for t, c in ((pieces, "event_ts"), (heap, "timestamp"), (links, "timestamp"))
                  if t is not None]
        return np.flatnonzero(self.mask & ~unshared(s, self.mask, others, vallocs))

    def give_back(self, s: pa.Table, which: np.ndarray) -> pa.Table | None:
        """The adopted pieces of samples ``which`` as stack pieces, at their exact place in the order; those
        samples then find them as a group like any other row."""
        if not len(which):
            return None
        self.mask[which] = False
        t, order = self.unsorted
        rows = order[which]
        ts, tid, cpu, pos = _np(s, "timestamp")[which], _np(s, "tid")[which], _np(s, "cpu")[which], _np(s, "stream_pos")[which]
        a = self.idx[which]
        pid = self.d["pid"][a]
        parts = []
        for side, prefix in ((0, "k_"), (1, "u_")):
            cnt = self.d[prefix + "n"][a]
            w = np.flatnonzero(cnt > 0)
            dt, d = _np(t, prefix + "dt")[rows[w]].astype(np.int64), _np(t, prefix + "d")[rows[w]].astype(np.int64)
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


def _bucket_task(task: dict[str, Any]) -> dict[str, Any]:
    lo, hi, k = task["lo"], task["hi"], task["bucket"]
    out_dir, src, scratch = Path(task["out_dir"]), task["sources"], Path(task["scratch_dir"])
    result: dict[str, Any] = {"bucket": k, "tables": {}, "rows_in": {}, "groups": 0, "samples": 0, "samples_with_stack": 0,
                              "stack_keys_unresolved": 0,
                              "samples_with_stack_records": 0, "samples_adopted_stacks": 0, "adopted_stacks_rejoined": 0}
    written = result["tables"]
    threads = thread_slots(task["threads"])

    s, adopted_d, unsorted = read_samples(src.get("_samples", []), lo, hi)
    v, h, e = (_sorted_rows(src.get(t, []), lo, hi) for t in ("_virtual_allocs", "_heap_events", "_event_stack_links"))
    pieces = read_bucket(src.get("_pieces", []), "event_ts", lo, hi, PIECE_COLUMNS)
    keyed = read_bucket(src.get("_keyed_refs", []), "event_ts", lo, hi, KEYED_REF_COLUMNS)
    for table, t in (("_samples", s), ("_virtual_allocs", v), ("_heap_events", h), ("_event_stack_links", e),
                     ("_pieces", pieces), ("_keyed_refs", keyed)):
        result["rows_in"][table] = t.num_rows if t is not None else 0
    if keyed is not None:
        keyed, result["stack_keys_unresolved"] = resolve_keys(keyed, task["stack_defs"])
        pieces = keyed if pieces is None else pa.concat_tables([pieces, keyed.cast(pieces.schema)]).combine_chunks()
    if e is not None:
        ts, cpu, spos = _np(e, "timestamp"), _np(e, "cpu"), _np(e, "stream_pos")
        # One row per event: an event with several stack items has several identical links.
        dup = np.zeros(len(ts), np.bool_)
        dup[1:] = (ts[1:] == ts[:-1]) & (cpu[1:] == cpu[:-1]) & (spos[1:] == spos[:-1])
        e = e.filter(pa.array(~dup))

    adopted = Adopted(s, adopted_d, unsorted) if s is not None else None
    if adopted is not None:
        # Adopted pieces that another row of the bucket could share go back among the pieces.
        which = adopted.shared(s, pieces, h, e, v)
        result["adopted_stacks_rejoined"] = len(which)
        back = adopted.give_back(s, which)
        if back is not None:
            pieces = back if pieces is None else pa.concat_tables([pieces, back.cast(pieces.schema)]).combine_chunks()
    groups, piece_cpus, stacks = _groups(pieces)
    result["groups"] = len(groups.ts)

    if s is not None:
        ts, tid = _np(s, "timestamp"), _np(s, "tid")
        gi = groups.match(ts, tid)
        stack = groups.stack[gi]
        group_pid = groups.pid[gi]
        with_records = gi >= 0
        if adopted is not None:
            sid, adopted_stacks = adopted.stacks()
            stack = np.where(adopted.mask, sid, stack)
            group_pid = np.where(adopted.mask, np.append(adopted.d["pid"], np.uint32(0))[adopted.idx], group_pid)
            with_records |= adopted.mask
            result["samples_adopted_stacks"] = int(adopted.mask.sum())
            stacks = stacks.plus(adopted_stacks)
        # The process its stack record names (as for the samples settled in their partition), else the
        # thread's owner at that time.
        tpid, has = np.zeros(len(ts), np.uint32), np.zeros(len(ts), np.bool_)
        thread_pids(ts, tid, *threads, tpid, has)
        pid = np.where(with_records, group_pid, tpid).astype(np.uint32)
        table = pa.table({
            "timestamp": s.column("timestamp"), "timestamp_ns": to_ns(ts, *task["clock"]), "cpu": s.column("cpu"),
            "tid": s.column("tid"), "pid": pa.array(pid, pa.uint32(), mask=~has & ~with_records), "ip": s.column("ip"),
            "stack_id": _stack_column(stack), "stream_pos": s.column("stream_pos"),
        })
        written["samples"] = write_final(table, out_dir / "samples.parquet", k)
        result["samples"] = len(ts)
        result["samples_with_stack"] = int((stack >= 0).sum())
        result["samples_with_stack_records"] = int(with_records.sum())
    stacks.write(scratch, k)

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
        written["virtual_allocs"] = write_final(table, out_dir / "virtual_allocs.parquet", k)

    if h is not None:
        gi = groups.match(_np(h, "timestamp"), _np(h, "tid"))
        stack = groups.stack[gi]
        table = h.select(HEAP_COLUMNS).append_column("stack_id", _stack_column(stack))
        written["heap_events"] = write_final(table, out_dir / "heap_events.parquet", k)

    if e is not None:
        gi = groups.match(_np(e, "timestamp"), _np(e, "tid"))
        stack = groups.stack[gi]
        table = e.select(["timestamp", "timestamp_ns", "cpu", "stream_pos", "tid"]).append_column(
            "stack_id", _stack_column(stack))
        written["event_stacks"] = write_final(table, out_dir / "event_stacks.parquet", k)
    return result


def resolve_keys(refs: pa.Table, defs_path: str) -> tuple[pa.Table, int]:
    """Stack-key references as stack pieces: each takes the frames (hashes and count) of the first
    definition of its key at or after it (keys are reused after a KeyDelete, so "any definition" would be
    wrong); one without a definition is a piece without frames (``valid`` 0). ``defs_path``: the trace's
    definitions sorted by (key, time, cpu, stream position) (``joins._stack_key_defs``). Returns the
    pieces (``PIECE_COLUMNS``) and how many found no definition."""
    h1, h2, n, found = definitions(_np(refs, "key"), _np(refs, "timestamp"), load_defs(defs_path))
    return pa.table({
        "event_ts": refs.column("event_ts"), "tid": refs.column("tid"), "pid": refs.column("pid"), "cpu": refs.column("cpu"),
        "timestamp": refs.column("timestamp"), "stream_pos": refs.column("stream_pos"), "user": refs.column("user"),
        "valid": found.astype(np.uint8), "h1": h1, "h2": h2, "n": n.astype(np.int32)}), int(len(found) - found.sum())


#: The definitions this process loaded last: [(the key file's path, inode, mtime and size), arrays].
_defs_loaded: list = []


def forget_defs() -> None:
    """Drop the definitions kept by ``load_defs`` (maps of scratch files that the decode deletes at its end)."""
    _defs_loaded.clear()


def load_defs(path: str) -> dict:
    """The arrays ``joins._stack_key_defs`` saved, memory-mapped read-only, with their index
    (``index_defs``); kept for the next task of the same decode. Loading them as a compressed-archive
    copy cost ~20 ms a task (CRC and copy of every array; 61 keyed-sample tasks of a trace with 275,000
    distinct stacks: 1.2 s)."""
    st = (Path(path) / "key.npy").stat()
    stamp = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    cached = next(iter(_defs_loaded), None)     # (an idle worker's trim may empty the list meanwhile)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    defs = index_defs({name: np.asarray(np.load(Path(path) / f"{name}.npy", mmap_mode="r"))
                       for name in ("key", "timestamp", "h1", "h2", "n")})
    _defs_loaded[:] = [(stamp, defs)]
    return defs


def index_defs(defs: dict) -> dict:
    """``defs`` (sorted by key, then time) with the run of each key's definitions: ``run_lo``, ``run_hi``,
    and ``index``, a hash table from key to run (a PairSet of (key, 0)); and ``pow1``, ``pow2``: the hash
    bases to the power of each definition's frame count (``poly_pow``, for ``defined_ids``)."""
    k = defs["key"]
    lo = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(k) else np.zeros(0, np.int64)
    index = PairSet()
    index.add(k[lo], np.zeros(len(lo), np.uint64))
    counts = np.asarray(defs["n"], np.int64)
    top = int(counts.max()) + 1 if len(counts) else 1
    # (powers modulo 2**64, as poly_pow computes them: numpy's unsigned products wrap)
    power = {b: np.cumprod(np.r_[np.ones(1, np.uint64), np.full(top - 1, b, np.uint64)], dtype=np.uint64)
             for b in (POLY_B1, POLY_B2)}
    return {**defs, "run_lo": lo, "run_hi": np.r_[lo[1:], len(k)].astype(np.int64), "index": index,
            "pow1": power[POLY_B1][counts], "pow2": power[POLY_B2][counts]}


def positions(key: np.ndarray, ts: np.ndarray, defs: dict) -> np.ndarray:
    """Per reference to ``key`` at ``ts``: the position in ``defs`` (``index_defs``) of the first definition
    of its key at or after it; -1 when there is none."""
    at = np.full(len(key), -1, np.int64)
    index = defs["index"]
    first_at_or_after(key, ts, np.zeros(len(key), np.uint8), np.ones(len(key), np.uint8), 1, defs["timestamp"],
                      index.slots, index.a, defs["run_lo"], defs["run_hi"], at)
    return at


def definitions(key: np.ndarray, ts: np.ndarray, defs: dict):
    """For references to ``key`` at ``ts``: the hashes and frame count of the first definition of each key
    at or after its reference (``positions``; zeros where there is none) and whether there is one.
    ``defs``: the arrays ``joins._stack_key_defs`` saved (``load_defs``)."""
    at = positions(key, ts, defs)
    found = at >= 0
    h1, h2, n = np.zeros(len(key), np.uint64), np.zeros(len(key), np.uint64), np.zeros(len(key), np.int64)
    h1[found], h2[found], n[found] = defs["h1"][at[found]], defs["h2"][at[found]], defs["n"][at[found]]
    return h1, h2, n, found


@nb.njit(**JIT)
def first_at_or_after(key, ts, dt, sides, side, d_ts, slots, index_key, run_lo, run_hi, out):
    """``out[i]``: the first definition of ``key[i]`` with a time (``d_ts``) at or after ``ts[i] + dt[i]``,
    for the rows with bit ``side`` in ``sides``; left as it is for the others and when there is none. A
    key's definitions are the run [run_lo[j], run_hi[j]) of the definitions, sorted by time, where j is the
    key's entry in the hash table ``slots``/``index_key`` (``index_defs``). With a direct-mapped cache of
    4,096 recent keys and two binary searches on a miss, a trace with 275,000 distinct stack keys spent
    1.6 s here (13 M references). (One loop: with the search in a function of its own, called per row,
    the same lookups took 14x longer.)"""
    mask = np.uint64(slots.shape[0] - 1)
    zero = np.uint64(0)
    for i in range(key.shape[0]):
        if not sides[i] & side:
            continue
        k, t = key[i], ts[i] + np.int64(dt[i])
        s = _pair_slot(k, zero, mask)
        j = slots[s]
        while j >= 0 and index_key[j] != k:
            s = (s + np.uint64(1)) & mask
            j = slots[s]
        if j < 0:
            continue
        a, b = run_lo[j], run_hi[j]
        hi = b
        while a < b:                        # the key's first definition at or after t
            mid = (a + b) // 2
            if d_ts[mid] < t:
                a = mid + 1
            else:
                b = mid
        if a < hi:
            out[i] = a


@nb.njit(**JIT)
def defined_ids(k_at, u_at, d_h1, d_h2, d_n, d_pow1, d_pow2, sid, check):
    """Stack id and check (``stack_ids``; id -1 without frames) of the kernel piece followed by the user
    piece (``adopted_hashes``) given as positions in the definitions (``k_at``, ``u_at``; -1: none);
    ``d_pow1``, ``d_pow2``: each definition's ``poly_pow`` of its frame count (``index_defs``)."""
    for i in range(k_at.shape[0]):
        ka, ua = k_at[i], u_at[i]
        h1, h2, n = np.uint64(0), np.uint64(0), np.int64(0)
        if ka >= 0:
            h1, h2, n = d_h1[ka], d_h2[ka], np.int64(d_n[ka])
        if ua >= 0:
            h1 = h1 * d_pow1[ua] + d_h1[ua]
            h2 = h2 * d_pow2[ua] + d_h2[ua]
            n += np.int64(d_n[ua])
        if n > 0:
            sid[i] = np.int64(_finish(h1, n, np.uint64(0x2545F4914F6CDD1D)) >> np.uint64(2))
            check[i] = _finish(h2, n, np.uint64(0x94D049BB133111EB))
        else:
            sid[i], check[i] = -1, 0


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


def write_final(table: pa.Table, directory: Path, k: int, prefix: str = "part-", extra_delta: tuple[str, ...] = ()) -> str:
    """One part of the output table that ``directory`` holds (``<table>.parquet``), cast to that table's schema
    (``OUTPUT_SCHEMAS``: its NOT NULL columns, and text for the dictionary columns of scratch, e.g. heap
    events' ``kind``); returns its path."""
    table = table.cast(OUTPUT_SCHEMAS[directory.name.removesuffix(".parquet")])
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{prefix}{k:05d}.parquet"
    # Dictionary pages for text, and for stack ids and instruction pointers (few distinct values per
    # part; parquet falls back to plain pages when a dictionary grows past 1 MB). Time columns are
    # sorted: delta encoding. On the samples of the 1 GB synth trace both together: 47 -> 14 MB, and
    # a 25 % faster write.
    text = text_columns(table.schema) + [c for c in ("stack_id", "ip") if c in table.column_names]
    # stream_pos too, in the parts that partitions write (record order: it grows within each buffer): on
    # 316k samples 25.5 -> 21.9 ms and 761 -> 469 KB. In time order (the buckets' parts) it is not sorted,
    # and plain pages were smaller (10 ms and 0.39 MB per 362k samples against 11 ms and 0.48 MB).
    # BYTE_STREAM_SPLIT would write the other integers 20-30 % faster, but DuckDB reads it for integers
    # only since mid-2026 (duckdb#24175): a user's older DuckDB could not open the tables.
    delta = {c: "DELTA_BINARY_PACKED" for c in ("timestamp", "timestamp_ns") + extra_delta if c in table.column_names}
    write_part(table, target, compression="zstd", compression_level=1, use_dictionary=text, column_encoding=delta)
    return str(target)


def text_columns(schema: pa.Schema) -> list[str]:
    """The text columns (plain or dictionary): the ones parquet gets dictionary pages for."""
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)]


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
