"""Numba kernels for measureme event records: decode, intern string addresses, nest.

Both kernels take the caller's arrays and check every length before they read. ``decode_events``
reads the records as little-endian u32 words (a v9 record is 8 words, a v8 record 6) and turns the
two string ids of each record into string-data addresses, interned into dense codes so that
strings are resolved once per distinct address afterwards, in Python. ``nest_events`` rebuilds
the per-thread call tree the way analyzeme does (§3 of the format notes): events are written when
they end, so walking the file backwards visits a parent before its children.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.decode.measureme.layout import (
    FIRST_REGULAR_STRING_ID,
    INSTANT,
    INSTANT_MARKER,
    INTEGER,
    INTEGER_MARKER,
    INTERVAL,
    INVALID_STRING_ID,
    METADATA_STRING_ID,
)

# decode_events status codes (anything but OK names the failing event in ``bad_event``).
OK = 0
SHORT_BUFFER = 1         # the words array is shorter than n records
DANGLING_KIND = 2        # a concrete event_kind id points past the end of the string data
DANGLING_ID = 3          # the same for event_id (virtual ids resolve through the index)
BAD_INTERVAL = 4         # interval whose start lies after its end
TOO_MANY_THREADS = 5     # more distinct thread ids than the thread table holds
STATUS_TEXT = {
    SHORT_BUFFER: "event stream shorter than its record count",
    DANGLING_KIND: "event_kind string id points past the end of the string data",
    DANGLING_ID: "event_id string id points past the end of the string data",
    BAD_INTERVAL: "interval event with start > end",
    TOO_MANY_THREADS: "more than 32768 distinct thread ids",
}

UNKNOWN_ADDR = -1        # virtual id without index entry, or INVALID_STRING_ID: "<unknown>"
_EMPTY = -(1 << 62)      # free slot in the thread-id table
_MULT = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64 (Fibonacci hashing)
_THREAD_SLOTS = 1 << 16       # thread-id table: at most half of it used (32768 threads per file)


@njit(cache=True, nogil=True)
def id_to_addr(sid, virt_addr, sparse_ids, sparse_addrs):
    """String id -> string-data address; UNKNOWN_ADDR for unresolved virtual and invalid ids. Virtual ids
    below ``len(virt_addr)`` are looked up directly, larger ones in the sorted ``sparse_ids``."""
    if sid >= FIRST_REGULAR_STRING_ID:
        return sid - FIRST_REGULAR_STRING_ID
    if sid == INVALID_STRING_ID or sid == METADATA_STRING_ID or sid < 0:
        return UNKNOWN_ADDR
    if sid < virt_addr.shape[0]:
        return virt_addr[sid]
    k = np.searchsorted(sparse_ids, sid)
    if k < sparse_ids.shape[0] and sparse_ids[k] == sid:
        return sparse_addrs[k]
    return UNKNOWN_ADDR


@njit(cache=True, nogil=True)
def decode_events(words, first_word, n, rec_words, id_words, virt_addr, sparse_ids, sparse_addrs, string_data_len,
                  kind_code, id_code, string_id, thread, thread_slot, start, end, payload):
    """Decode ``n`` records starting at ``words[first_word]``.

    Fills the per-event output arrays (allocated by the caller, length ``n``) and returns
    ``(status, bad_event, addrs, n_addrs, n_threads)``: ``addrs[:n_addrs]`` are the distinct
    string-data addresses, ``kind_code``/``id_code`` index into them; ``string_id`` keeps the raw
    event_id (for virtual ids rustc's DepNodeIndex); ``thread_slot`` numbers the distinct thread ids
    densely from 0.

    Interning is a dense array over the string data (``code_of_addr[addr + 1]``, slot 0 for
    UNKNOWN_ADDR), so the loop never hashes and never reallocates.
    """
    n_addrs = 0
    n_threads = 0
    if n < 0 or first_word < 0 or first_word + n * rec_words > words.shape[0]:
        return SHORT_BUFFER, 0, np.empty(0, np.int64), 0, 0
    if (kind_code.shape[0] < n or id_code.shape[0] < n or string_id.shape[0] < n or thread.shape[0] < n
            or thread_slot.shape[0] < n or start.shape[0] < n or end.shape[0] < n or payload.shape[0] < n):
        return SHORT_BUFFER, 0, np.empty(0, np.int64), 0, 0
    code_of_addr = np.full(string_data_len + 1, -1, np.int32)
    addrs = np.empty(min(2 * n, string_data_len + 1) + 1, np.int64)
    tkeys = np.full(_THREAD_SLOTS, _EMPTY, np.int64)
    tvals = np.zeros(_THREAD_SLOTS, np.int32)
    last_tid = -1
    last_slot = 0
    status = OK
    bad = 0
    for i in range(n):
        w = first_word + i * rec_words
        if id_words == 2:
            kind = np.int64(words[w]) | (np.int64(words[w + 1]) << 32)
            sid = np.int64(words[w + 2]) | (np.int64(words[w + 3]) << 32)
        else:
            kind = np.int64(words[w])
            sid = np.int64(words[w + 1])
        f = w + 2 * id_words
        tid = np.int64(words[f])
        upper = np.int64(words[f + 3])
        v1 = np.int64(words[f + 1]) | ((upper >> 16) << 32)
        v2 = np.int64(words[f + 2]) | ((upper & 0xFFFF) << 32)

        a = id_to_addr(kind, virt_addr, sparse_ids, sparse_addrs)
        if a >= string_data_len or a < UNKNOWN_ADDR:
            status, bad = DANGLING_KIND, i
            break
        # Interning is written out twice (kind, then id) on purpose: a helper taking the arrays
        # made this loop 5x slower (19 vs 95 M events/s, measured with bench/bench_selfprofile.py),
        # inline="always" included.
        c = code_of_addr[a + 1]
        if c < 0:
            c = n_addrs
            code_of_addr[a + 1] = c
            addrs[n_addrs] = a
            n_addrs += 1
        kind_code[i] = c
        a = id_to_addr(sid, virt_addr, sparse_ids, sparse_addrs)
        if a >= string_data_len or a < UNKNOWN_ADDR:
            status, bad = DANGLING_ID, i
            break
        c = code_of_addr[a + 1]
        if c < 0:
            c = n_addrs
            code_of_addr[a + 1] = c
            addrs[n_addrs] = a
            n_addrs += 1
        id_code[i] = c
        string_id[i] = sid

        if tid != last_tid:
            mask = _THREAD_SLOTS - 1
            s = ((tid * _MULT) >> 20) & mask
            while tkeys[s] != tid and tkeys[s] != _EMPTY:
                s = (s + 1) & mask
            if tkeys[s] == _EMPTY:
                if 2 * (n_threads + 1) > _THREAD_SLOTS:
                    status, bad = TOO_MANY_THREADS, i
                    break
                tkeys[s] = tid
                tvals[s] = n_threads
                n_threads += 1
            last_tid = tid
            last_slot = tvals[s]
        thread[i] = tid
        thread_slot[i] = last_slot

        start[i] = v1
        end[i] = v2
        if v2 == INSTANT_MARKER:
            payload[i] = INSTANT
        elif v2 == INTEGER_MARKER:
            payload[i] = INTEGER
        elif v1 > v2:
            status, bad = BAD_INTERVAL, i
            break
        else:
            payload[i] = INTERVAL
    return status, bad, addrs, n_addrs, n_threads


@njit(cache=True, nogil=True)
def nest_events(n, n_threads, thread_slot, start, end, payload, parent, depth, self_ns):
    """Per-thread nesting, walking backwards as analyzeme does; returns the number of events nested.

    The stack of a thread is the chain ``top, parent[top], parent[parent[top]], ...``: popping moves
    the top to its parent, pushing links the new event to the current top. An interval ``c`` is a
    child of ``p`` when ``p.start <= c.start and c.end <= p.end`` (inclusive bounds); an instant
    is attached to the innermost open interval containing its time but is never pushed.
    ``self_ns`` is an interval's duration minus the durations of its direct children (0 for
    instants); ``parent`` is -1 for roots and integer events, ``depth`` -1 for integer events.
    """
    if (thread_slot.shape[0] < n or start.shape[0] < n or end.shape[0] < n or payload.shape[0] < n
            or parent.shape[0] < n or depth.shape[0] < n or self_ns.shape[0] < n):
        return 0
    top = np.full(max(n_threads, 1), -1, np.int64)
    for i in range(n - 1, -1, -1):
        p = payload[i]
        sl = thread_slot[i]
        if p == INTEGER or sl < 0 or sl >= top.shape[0]:
            parent[i] = -1
            depth[i] = -1
            self_ns[i] = 0
            continue
        s = start[i]
        e = end[i] if p == INTERVAL else s
        t = top[sl]
        while t >= 0 and not (start[t] <= s and e <= end[t]):
            t = parent[t]
        parent[i] = t
        depth[i] = depth[t] + 1 if t >= 0 else 0
        if p == INTERVAL:
            d = e - s
            self_ns[i] = d
            if t >= 0:
                self_ns[t] -= d
            top[sl] = i
        else:
            self_ns[i] = 0
    return n
