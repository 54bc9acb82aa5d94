"""Plain LZ77 ("XPRESS", [MS-XCA] §2.3) encoder, as used for compressed ETL buffers (etl-format §4.3).

A greedy encoder with a hash-chain match finder over 3-byte prefixes, bounded chain depth and the
8 KiB window the format allows. Matches of every length form are produced: the 3-bit inline length,
the shared nibble (low nibble first, high nibble on the next long match), the extra byte, the u16
and the u32 escape. Each buffer is an independent stream (fresh window), so buffers compress in
one batch call: ``compress_many(data, starts, ends)``.
"""

from __future__ import annotations

import numba
import numpy as np

WINDOW = 8192            # offsets 1..8192 (13 bits)
MIN_MATCH = 3
HASH_BITS = 14
CHAIN_DEPTH = 24


@numba.njit(cache=True, nogil=True, inline="always")
def _put_u16(out, pos, v):
    out[pos] = v & 0xFF
    out[pos + 1] = (v >> 8) & 0xFF


@numba.njit(cache=True, nogil=True, inline="always")
def _put_u32(out, pos, v):
    out[pos] = v & 0xFF
    out[pos + 1] = (v >> 8) & 0xFF
    out[pos + 2] = (v >> 16) & 0xFF
    out[pos + 3] = (v >> 24) & 0xFF


@numba.njit(cache=True, nogil=True)
def compress_into(src, s0, s1, out, o0, head, prev):
    """Compress ``src[s0:s1]`` into ``out[o0:]``; returns the end offset in ``out``.

    ``out`` must hold at least ``(s1 - s0) * 9 // 8 + 12`` bytes after ``o0`` (all literals).
    ``head`` (1 << HASH_BITS) and ``prev`` (>= s1 - s0) are scratch tables.
    """
    n = s1 - s0
    head[:] = -1
    flags = np.uint32(0)
    nflags = 0
    flag_pos = o0
    o = o0 + 4
    nibble_pos = -1
    i = 0
    while i < n:
        best_len = 0
        best_off = 0
        if i + MIN_MATCH <= n:
            h = ((np.uint32(src[s0 + i]) << 16) ^ (np.uint32(src[s0 + i + 1]) << 8) ^ np.uint32(src[s0 + i + 2]))
            h = ((h * np.uint32(2654435761)) >> np.uint32(32 - HASH_BITS)) & np.uint32((1 << HASH_BITS) - 1)
            cand = head[h]
            depth = 0
            while cand >= 0 and i - cand <= WINDOW and depth < CHAIN_DEPTH:
                length = 0
                limit = n - i
                while length < limit and src[s0 + cand + length] == src[s0 + i + length]:
                    length += 1
                if length > best_len:
                    best_len = length
                    best_off = i - cand
                    if length == limit:
                        break
                cand = prev[cand]
                depth += 1
            prev[i] = head[h]
            head[h] = i
        if best_len >= MIN_MATCH:
            flags = (flags << np.uint32(1)) | np.uint32(1)
            length = best_len - 3
            if length < 7:
                _put_u16(out, o, ((best_off - 1) << 3) | length)
                o += 2
            else:
                _put_u16(out, o, ((best_off - 1) << 3) | 7)
                o += 2
                length -= 7
                nib = length if length < 15 else 15
                if nibble_pos < 0:
                    out[o] = nib
                    nibble_pos = o
                    o += 1
                else:
                    out[nibble_pos] |= nib << 4
                    nibble_pos = -1
                if length >= 15:
                    length -= 15
                    if length < 255:
                        out[o] = length
                        o += 1
                    else:
                        out[o] = 255
                        o += 1
                        full = best_len - 3
                        if full < 65536:
                            _put_u16(out, o, full)
                            o += 2
                        else:
                            _put_u16(out, o, 0)
                            _put_u32(out, o + 2, full)
                            o += 6
            # index the skipped positions so later matches can refer to them
            end = i + best_len
            j = i + 1
            while j < end and j + MIN_MATCH <= n:
                h2 = ((np.uint32(src[s0 + j]) << 16) ^ (np.uint32(src[s0 + j + 1]) << 8) ^ np.uint32(src[s0 + j + 2]))
                h2 = ((h2 * np.uint32(2654435761)) >> np.uint32(32 - HASH_BITS)) & np.uint32((1 << HASH_BITS) - 1)
                prev[j] = head[h2]
                head[h2] = j
                j += 1
            i = end
        else:
            flags = flags << np.uint32(1)
            out[o] = src[s0 + i]
            o += 1
            i += 1
        nflags += 1
        if nflags == 32:
            _put_u32(out, flag_pos, flags)
            flags = np.uint32(0)
            nflags = 0
            flag_pos = o
            o += 4
    # unused flag bits are ones: a decoder stops at the first 1 bit with no input left
    rest = 32 - nflags
    if rest == 32:
        flags = np.uint32(0xFFFFFFFF)
    else:
        flags = (flags << np.uint32(rest)) | np.uint32((1 << rest) - 1)
    _put_u32(out, flag_pos, flags)
    return o


@numba.njit(cache=True, nogil=True)
def compress_many(src, starts, ends, out_offsets_capacity):
    """Compress each ``src[starts[k]:ends[k]]`` independently; returns (out, out_starts, out_ends)."""
    k = starts.shape[0]
    total = 0
    for b in range(k):
        total += (ends[b] - starts[b]) * 9 // 8 + 12
    out = np.empty(total, np.uint8)
    o_start = np.empty(k, np.int64)
    o_end = np.empty(k, np.int64)
    head = np.empty(1 << HASH_BITS, np.int64)
    prev = np.empty(out_offsets_capacity, np.int64)
    o = 0
    for b in range(k):
        o_start[b] = o
        o = compress_into(src, starts[b], ends[b], out, o, head, prev)
        o_end[b] = o
    return out, o_start, o_end


def compress(data: bytes) -> bytes:
    """One independent XPRESS stream for ``data`` (for tests and small inputs)."""
    src = np.frombuffer(data, np.uint8)
    out, s, e = compress_many(src, np.array([0], np.int64), np.array([len(src)], np.int64), max(1, len(src)))
    return out[s[0]:e[0]].tobytes()
