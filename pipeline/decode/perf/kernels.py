"""Layer 2 of the perf.data decoder, numba kernels: one walk over the records of the data section.

``walk`` runs twice over the same bytes: first with ``fill`` false, counting what the second run writes
(samples, callchain frames, task and mmap records, error rows), then into arrays of exactly that size that the
caller allocated. Each record is read as its header says, every field checked against the record's end before
it is read; what does not fit is an error (``errors``: byte offset, code, record type) and the walk goes on.

A header that cannot be a record's (size below 8 or not a multiple of 8, a type perf does not know, a size
running past the data) means the walk lost its way: it searches on, 8 bytes at a time, for a place where
``RESYNC_CHAIN`` headers in a row could be records (or lead exactly to the end of the data) and goes on from
there, counting the bytes it skipped. So a damaged stretch costs its records, not the rest of the file, and no
read leaves ``data`` whatever the bytes say.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from pipeline.decode.etl.kernels import read_u32, read_u64
from pipeline.decode.perf import layout as L

JIT = dict(nogil=True, cache=True)

# Error codes (``STATUS_TEXT`` turns them into messages; ``ERROR_KIND`` into the errors table's kind).
BAD_HEADER = 1          # size < 8, not a multiple of 8, or a type perf does not know: the walk resynchronizes
PAST_END = 2            # the record runs past the end of the data: the file ends inside it
SHORT_SAMPLE = 3        # the sample's fields (per sample_type) do not fit its size: sample skipped
BAD_CALLCHAIN = 4       # the callchain's nr does not fit the record: sample skipped
SHORT_RECORD = 5        # an MMAP/MMAP2/COMM/FORK/EXIT record shorter than its fields: skipped
UNSUPPORTED = 6         # a record the decoder cannot read (PERF_RECORD_COMPRESSED: recorded with -z)
RESYNC = 7              # where the walk found records again after a bad header (the offset), bytes skipped in ``type``
BAD_TIME = 8            # a time at or past 2^63 (a sample's, a FORK's or EXIT's, a sample-id trailer's): skipped
STATUS_TEXT = {
    BAD_HEADER: "record header cannot be a record's (size below 8 or not a multiple of 8, or unknown type)",
    PAST_END: "record runs past the end of the data",
    SHORT_SAMPLE: "sample's fields do not fit its size",
    BAD_CALLCHAIN: "callchain length does not fit the sample",
    SHORT_RECORD: "record shorter than its fields",
    UNSUPPORTED: "compressed records (perf record -z) are not decoded",
    RESYNC: "records found again",
    BAD_TIME: "time at or past 2^63, which no clock perf reads gives (an int64 time would be negative): skipped",
}
ERROR_KIND = {BAD_HEADER: "record", PAST_END: "truncated", SHORT_SAMPLE: "short_payload",
              BAD_CALLCHAIN: "short_payload", SHORT_RECORD: "short_payload", UNSUPPORTED: "unsupported",
              RESYNC: "resync", BAD_TIME: "bad_value"}

#: Headers in a row that must look like records for the walk to go on at a place after a bad header.
RESYNC_CHAIN = 4
#: Times are int64 nanoseconds in the tables: a record's time at or past this is damage, not a time.
TIME_LIMIT = np.uint64(1 << 63)

# Columns of the integer outputs (one row per record of that kind).
S_REC, S_TIME, S_PID, S_TID, S_CPU, S_PERIOD, S_MISC, S_FRAMES, S_REGS, S_STACK, S_STACK_SIZE, S_COLS = range(12)
T_REC, T_TYPE, T_MISC, T_TIME, T_PID, T_TID, T_PPID, T_PTID, T_NAME, T_NAME_END, T_COLS = range(11)
M_REC, M_TYPE, M_MISC, M_TIME, M_PID, M_TID, M_PROT, M_NAME, M_NAME_END, M_BUILD_ID, M_BUILD_ID_LEN, M_COLS = range(12)
M_ADDR, M_LEN, M_PGOFF, M_ADDR_COLS = range(4)
# ``totals``: what the walk counted.
N_RECORDS, N_SAMPLES, N_FRAMES, N_TASKS, N_MMAPS, N_ERRORS, N_LOST, N_LOST_SAMPLES, N_SKIPPED, N_RESYNCS, \
    N_TOTALS = range(11)


class SampleLayout:
    """Where the fields of a sample of one attr lie, as the walk needs them (plain ints, from ``sample_type``,
    ``read_format``, ``sample_regs_user`` and ``branch_sample_type``); and the sample-id trailer of the other
    records (``sample_id_all``)."""

    def __init__(self, sample_type: int, read_format: int, regs_user: int, branch_hw_index: bool, sample_id_all: bool):
        self.sample_type = sample_type
        if read_format & L.READ_GROUP:
            self.read_fixed = -1
            self.read_head = 8 * (1 + bool(read_format & L.READ_TOTAL_TIME_ENABLED)
                                  + bool(read_format & L.READ_TOTAL_TIME_RUNNING))
            self.read_per = 8 * (1 + bool(read_format & L.READ_ID) + bool(read_format & L.READ_LOST))
        else:
            self.read_fixed = 8 * (1 + bool(read_format & L.READ_TOTAL_TIME_ENABLED)
                                   + bool(read_format & L.READ_TOTAL_TIME_RUNNING) + bool(read_format & L.READ_ID)
                                   + bool(read_format & L.READ_LOST))
            self.read_head = self.read_per = 0
        self.regs_user = bin(regs_user).count("1")
        self.branch_hw = int(branch_hw_index)
        # trailer: TID, TIME, ID, STREAM_ID, CPU, IDENTIFIER, each 8 bytes when in sample_type
        slots = [bit for bit in (L.SAMPLE_TID, L.SAMPLE_TIME, L.SAMPLE_ID, L.SAMPLE_STREAM_ID, L.SAMPLE_CPU,
                                 L.SAMPLE_IDENTIFIER) if sample_type & bit] if sample_id_all else []
        self.trailer = 8 * len(slots)
        self.trailer_time = 8 * slots.index(L.SAMPLE_TIME) if L.SAMPLE_TIME in slots else -1

    def args(self) -> tuple[int, ...]:
        return (self.sample_type, self.read_fixed, self.read_head, self.read_per, self.regs_user, self.branch_hw,
                self.trailer, self.trailer_time)


@nb.njit(**JIT)
def _plausible(data, p, end):
    """Whether a record header at ``p`` could be a record's (known type, aligned size, inside the data)."""
    if p < 0 or p + L.RECORD_HEADER_SIZE > end:
        return False
    t = read_u32(data, p)
    size = read_u32(data, p + 4) >> np.uint32(16)
    return 1 <= t <= L.RECORD_TYPE_MAX and size >= L.RECORD_HEADER_SIZE and size % 8 == 0 and p + size <= end


@nb.njit(**JIT)
def resync(data, p, end):
    """The first offset after ``p`` (8-byte steps) where ``RESYNC_CHAIN`` plausible headers follow one another (or
    plausible headers lead exactly to ``end``); ``end`` when there is none."""
    q = p + 8
    while q + L.RECORD_HEADER_SIZE <= end:
        r = q
        k = 0
        while k < RESYNC_CHAIN and _plausible(data, r, end):
            r += read_u32(data, r + 4) >> np.uint32(16)
            k += 1
        if k == RESYNC_CHAIN or (k > 0 and r == end):
            return q
        q += 8
    return end


@nb.njit(**JIT)
def _error(errors, totals, fill, off, code, rtype):
    k = totals[N_ERRORS]
    if fill and k < errors.shape[0]:
        errors[k, 0] = off
        errors[k, 1] = code
        errors[k, 2] = rtype
    totals[N_ERRORS] = k + 1


@nb.njit(**JIT)
def _sample(data, off, rend, st, read_fixed, read_head, read_per, regs_user, branch_hw, fill, rec, misc,
            srow, sip, frames, totals):
    """Read one PERF_RECORD_SAMPLE at ``off`` (``rend``: its end); returns an error code or 0."""
    p = off + L.RECORD_HEADER_SIZE
    ip = np.uint64(0)
    pid = -1
    tid = -1
    time = 0
    cpu = -1
    period = 0
    # the fixed fields before the callchain, each 8 bytes
    need = 0
    for bit in (L.SAMPLE_IDENTIFIER, L.SAMPLE_IP, L.SAMPLE_TID, L.SAMPLE_TIME, L.SAMPLE_ADDR, L.SAMPLE_ID,
                L.SAMPLE_STREAM_ID, L.SAMPLE_CPU, L.SAMPLE_PERIOD):
        if st & bit:
            need += 8
    if p + need > rend:
        return SHORT_SAMPLE
    if st & L.SAMPLE_IDENTIFIER:
        p += 8
    if st & L.SAMPLE_IP:
        ip = read_u64(data, p)
        p += 8
    if st & L.SAMPLE_TID:
        pid = np.int64(read_u32(data, p))
        tid = np.int64(read_u32(data, p + 4))
        p += 8
    if st & L.SAMPLE_TIME:
        raw = read_u64(data, p)
        if raw >= TIME_LIMIT:
            return BAD_TIME
        time = np.int64(raw)
        p += 8
    if st & L.SAMPLE_ADDR:
        p += 8
    if st & L.SAMPLE_ID:
        p += 8
    if st & L.SAMPLE_STREAM_ID:
        p += 8
    if st & L.SAMPLE_CPU:
        cpu = np.int64(read_u32(data, p))
        p += 8
    if st & L.SAMPLE_PERIOD:
        period = np.int64(read_u64(data, p))
        p += 8
    if st & L.SAMPLE_READ:
        if read_fixed >= 0:
            p += read_fixed
        else:
            if p + 8 > rend:
                return SHORT_SAMPLE
            nr = read_u64(data, p)
            if nr > np.uint64((rend - p) // 8):
                return SHORT_SAMPLE
            p += read_head + np.int64(nr) * read_per
        if p > rend:
            return SHORT_SAMPLE
    first = totals[N_FRAMES]
    n = 0
    # (the callchain's frames are counted here and copied only once the whole sample has been found sound: a field
    # after it that does not fit makes the record an error, and the first walk reserved no room for its frames)
    chain_at = -1
    chain_nr = 0
    if st & L.SAMPLE_CALLCHAIN:
        if p + 8 > rend:
            return SHORT_SAMPLE
        nr = read_u64(data, p)
        p += 8
        if nr > np.uint64((rend - p) // 8):
            return BAD_CALLCHAIN
        chain_at = p
        chain_nr = np.int64(nr)
        for k in range(chain_nr):
            if read_u64(data, p + 8 * k) < np.uint64(L.CONTEXT_MAX):
                n += 1
        p += 8 * chain_nr
    # the variable fields after it, their sizes checked: RAW and BRANCH_STACK stepped over; of REGS_USER and
    # STACK_USER (``perf record --call-graph dwarf``) where the registers and the copied stack lie, for the unwinder
    regs_at = -1
    stack_at = -1
    stack_size = 0
    if st & L.SAMPLE_RAW:
        if p + 4 > rend:
            return SHORT_SAMPLE
        p += 4 + np.int64(read_u32(data, p))
    if st & L.SAMPLE_BRANCH_STACK:
        if p + 8 > rend:
            return SHORT_SAMPLE
        nr = read_u64(data, p)
        if nr > np.uint64((rend - p) // 24):
            return SHORT_SAMPLE
        p += 8 + 8 * branch_hw + 24 * np.int64(nr)
    if st & L.SAMPLE_REGS_USER:
        if p + 8 > rend:
            return SHORT_SAMPLE
        abi = read_u64(data, p)
        p += 8
        if abi != 0:
            regs_at = p
            p += 8 * regs_user
    if st & L.SAMPLE_STACK_USER:
        if p + 8 > rend:
            return SHORT_SAMPLE
        size = read_u64(data, p)
        if size > np.uint64(rend - p):
            return SHORT_SAMPLE
        stack_at = p + 8
        p += 8 + np.int64(size)
        if size != 0:
            if p + 8 > rend:
                return SHORT_SAMPLE
            # dyn_size: how much of the copy the kernel filled (the rest is zeros)
            dyn = read_u64(data, p)
            stack_size = np.int64(dyn) if dyn < size else np.int64(size)
            p += 8
        else:
            stack_at = -1
    if p > rend:
        return SHORT_SAMPLE
    k = totals[N_SAMPLES]
    if fill:
        at = first
        for j in range(chain_nr):
            v = read_u64(data, chain_at + 8 * j)
            if v < np.uint64(L.CONTEXT_MAX):
                frames[at] = v
                at += 1
        srow[k, S_REC] = rec
        srow[k, S_TIME] = time
        srow[k, S_PID] = pid
        srow[k, S_TID] = tid
        srow[k, S_CPU] = cpu
        srow[k, S_PERIOD] = period
        srow[k, S_MISC] = misc
        srow[k, S_FRAMES] = n
        srow[k, S_REGS] = regs_at if regs_at + 8 * regs_user <= rend else -1
        srow[k, S_STACK] = stack_at
        srow[k, S_STACK_SIZE] = stack_size
        sip[k] = ip
    totals[N_SAMPLES] = k + 1
    totals[N_FRAMES] = first + n
    return 0


@nb.njit(**JIT)
def _trailer_time(data, rend, body_end, trailer, trailer_time):
    """The sample-id trailer's time of a non-sample record as the file has it, unsigned (0 when there is none or it
    does not fit)."""
    if trailer_time < 0 or rend - trailer < body_end:
        return np.uint64(0)
    return read_u64(data, rend - trailer + trailer_time)


@nb.njit(**JIT)
def walk(data, start, stop, end, rec0, st, read_fixed, read_head, read_per, regs_user, branch_hw, trailer,
         trailer_time, fill, with_samples, srow, sip, frames, trow, mrow, maddr, errors, type_counts, totals):
    """Walk the records of ``data[start:end]`` that begin before ``stop`` (a part of the data section: ``start``
    and ``stop`` are places the walk of the whole section passes, as :func:`plan` finds them, and ``rec0`` the
    index of the record at ``start``; every check is against ``end``, so the part is walked as the whole section
    walks it); with ``fill``, write them into the outputs (sized by a first walk without ``fill``, whose
    ``totals`` say how many rows each gets). Without ``with_samples``, samples are counted, not read (the task
    and mmap records alone). ``type_counts[t]``: records of type ``t`` (types above 255 in the last slot)."""
    end = min(end, data.shape[0])
    stop = min(stop, end)
    off = max(start, 0)
    rec = rec0
    while off < stop:
        if off + L.RECORD_HEADER_SIZE > end:
            _error(errors, totals, fill, off, PAST_END, 0)
            break
        rtype = np.int64(read_u32(data, off))
        misc = np.int64(read_u32(data, off + 4) & np.uint32(0xFFFF))
        size = np.int64(read_u32(data, off + 4) >> np.uint32(16))
        if size < L.RECORD_HEADER_SIZE or size % 8 != 0 or rtype < 1 or rtype > L.RECORD_TYPE_MAX:
            _error(errors, totals, fill, off, BAD_HEADER, rtype)
            nxt = resync(data, off, end)
            totals[N_SKIPPED] += nxt - off
            totals[N_RESYNCS] += 1
            if nxt < end:
                _error(errors, totals, fill, nxt, RESYNC, nxt - off)
            off = nxt
            continue
        rend = off + size
        if rend > end:
            _error(errors, totals, fill, off, PAST_END, rtype)
            totals[N_SKIPPED] += end - off
            break
        type_counts[min(rtype, type_counts.shape[0] - 1)] += 1
        totals[N_RECORDS] += 1
        if rtype == L.RECORD_SAMPLE and with_samples:
            code = _sample(data, off, rend, st, read_fixed, read_head, read_per, regs_user, branch_hw, fill, rec,
                           misc, srow, sip, frames, totals)
            if code != 0:
                _error(errors, totals, fill, off, code, rtype)
        elif rtype == L.RECORD_SAMPLE:
            pass
        elif rtype == L.RECORD_FORK or rtype == L.RECORD_EXIT or rtype == L.RECORD_COMM:
            body = L.TASK_SIZE if rtype != L.RECORD_COMM else L.COMM_NAME
            raw = np.uint64(0)
            if rend >= off + body:
                raw = _trailer_time(data, rend, off + body, trailer, trailer_time) if rtype == L.RECORD_COMM \
                    else read_u64(data, off + 24)
            if rend < off + body:
                _error(errors, totals, fill, off, SHORT_RECORD, rtype)
            elif raw >= TIME_LIMIT:
                _error(errors, totals, fill, off, BAD_TIME, rtype)
            else:
                k = totals[N_TASKS]
                if fill:
                    trow[k, T_REC] = rec
                    trow[k, T_TYPE] = rtype
                    trow[k, T_MISC] = misc
                    trow[k, T_PID] = read_u32(data, off + 8)
                    trow[k, T_TIME] = np.int64(raw)
                    if rtype == L.RECORD_COMM:
                        trow[k, T_TID] = read_u32(data, off + 12)
                        trow[k, T_PPID] = -1
                        trow[k, T_PTID] = -1
                        trow[k, T_NAME] = off + body
                        trow[k, T_NAME_END] = max(rend - trailer, off + body)
                    else:
                        trow[k, T_PPID] = read_u32(data, off + 12)
                        trow[k, T_TID] = read_u32(data, off + 16)
                        trow[k, T_PTID] = read_u32(data, off + 20)
                        trow[k, T_NAME] = -1
                        trow[k, T_NAME_END] = -1
                totals[N_TASKS] = k + 1
        elif rtype == L.RECORD_MMAP or rtype == L.RECORD_MMAP2:
            body = L.MMAP_FILENAME if rtype == L.RECORD_MMAP else L.MMAP2_FILENAME
            raw = np.uint64(0)
            if rend >= off + body:
                raw = _trailer_time(data, rend, off + body, trailer, trailer_time)
            if rend < off + body:
                _error(errors, totals, fill, off, SHORT_RECORD, rtype)
            elif raw >= TIME_LIMIT:
                _error(errors, totals, fill, off, BAD_TIME, rtype)
            else:
                k = totals[N_MMAPS]
                if fill:
                    mrow[k, M_REC] = rec
                    mrow[k, M_TYPE] = rtype
                    mrow[k, M_MISC] = misc
                    mrow[k, M_TIME] = np.int64(raw)
                    mrow[k, M_PID] = read_u32(data, off + 8)
                    mrow[k, M_TID] = read_u32(data, off + 12)
                    maddr[k, M_ADDR] = read_u64(data, off + 16)
                    maddr[k, M_LEN] = read_u64(data, off + 24)
                    maddr[k, M_PGOFF] = read_u64(data, off + 32)
                    mrow[k, M_NAME] = off + body
                    mrow[k, M_NAME_END] = max(rend - trailer, off + body)
                    mrow[k, M_PROT] = -1
                    mrow[k, M_BUILD_ID] = -1
                    mrow[k, M_BUILD_ID_LEN] = 0
                    if rtype == L.RECORD_MMAP2:
                        mrow[k, M_PROT] = read_u32(data, off + L.MMAP2_PROT)
                        if misc & L.MISC_MMAP_BUILD_ID:
                            mrow[k, M_BUILD_ID] = off + L.MMAP2_BUILD_ID
                            mrow[k, M_BUILD_ID_LEN] = min(np.int64(data[off + L.MMAP2_BUILD_ID_SIZE]), 20)
                totals[N_MMAPS] = k + 1
        elif rtype == L.RECORD_LOST:
            if rend >= off + 24:
                totals[N_LOST] += np.int64(read_u64(data, off + 16))
        elif rtype == L.RECORD_LOST_SAMPLES:
            if rend >= off + 16:
                totals[N_LOST_SAMPLES] += np.int64(read_u64(data, off + 8))
        elif rtype == L.RECORD_COMPRESSED:
            _error(errors, totals, fill, off, UNSUPPORTED, rtype)
        rec += 1
        off = rend
    return totals


@nb.njit(**JIT)
def plan(data, start, end, part_bytes, bounds, recs):
    """Where to cut ``data[start:end]`` into parts of about ``part_bytes``: the first record boundary at or past
    each ``part_bytes`` since the last cut, found by the path :func:`walk` takes (headers only: sizes, types,
    the same resynchronization after a bad header). ``bounds[k]``, ``recs[k]``: the byte offset and record index
    where part ``k`` begins (``bounds[0]`` is ``start``); returns how many parts. ``bounds`` holds at least
    ``(end - start) // part_bytes + 1`` slots."""
    end = min(end, data.shape[0])
    off = max(start, 0)
    rec = 0
    n = 1
    bounds[0] = off
    recs[0] = 0
    while off < end:
        if off >= bounds[n - 1] + part_bytes and n < bounds.shape[0]:
            bounds[n] = off
            recs[n] = rec
            n += 1
        if off + L.RECORD_HEADER_SIZE > end:
            break
        rtype = np.int64(read_u32(data, off))
        size = np.int64(read_u32(data, off + 4) >> np.uint32(16))
        if size < L.RECORD_HEADER_SIZE or size % 8 != 0 or rtype < 1 or rtype > L.RECORD_TYPE_MAX:
            off = resync(data, off, end)
            continue
        if off + size > end:
            break
        rec += 1
        off += size
    return n
