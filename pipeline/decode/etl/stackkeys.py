"""Stack keys (StackKeyKernel/User references and their KeyDelete/KeyRundown definitions) and thread owners.

A reference takes the first definition of its key at or after it (``resolve_keys``; definitions are indexed
once per worker: ``load_defs``, ``index_defs``). ``thread_pids`` / ``owners`` give the process that owned a
thread at a time (the instances of a tid are back-to-back slots).
"""

from __future__ import annotations

from pathlib import Path

import numba as nb
import numpy as np
import pyarrow as pa

from pipeline.decode.etl.batch import PairSet
from pipeline.decode.etl.kernels import JIT, POLY_B1, POLY_B2, hash_finish, pair_slot
from pipeline.decode.etl.scratch import column_array

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


def resolve_keys(refs: pa.Table, defs_path: str) -> tuple[pa.Table, int]:
    """Stack-key references as stack pieces: each takes the frames (hashes and count) of the first
    definition of its key at or after it (keys are reused after a KeyDelete, so "any definition" would be
    wrong); one without a definition is a piece without frames (``valid`` 0). ``defs_path``: the trace's
    definitions sorted by (key, time, cpu, stream position) (``joins._stack_key_defs``). Returns the
    pieces (``PIECE_COLUMNS``) and how many found no definition."""
    h1, h2, n, found = definitions(column_array(refs, "key"), column_array(refs, "timestamp"), load_defs(defs_path))
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
    (``index_defs``); kept for the next task of the same decode. (A compressed-archive copy cost every task a
    CRC and a copy of every array.)"""
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
        s = pair_slot(k, zero, mask)
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
            sid[i] = np.int64(hash_finish(h1, n, np.uint64(0x2545F4914F6CDD1D)) >> np.uint64(2))
            check[i] = hash_finish(h2, n, np.uint64(0x94D049BB133111EB))
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
