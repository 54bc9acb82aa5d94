"""The numba kernels of the partition-side settling (:mod:`.settle`, which reads the tables, allocates every output
and calls these): a sample's claim on the stack pieces that follow it (:func:`claim_adjacent`), the hashes of the
stacks it adopts (:func:`adopted_hashes`), and the test of which rows share their (time, thread) with another
(:func:`mark_keys`, :func:`candidates`, :func:`in_bitmap_kernel`, :func:`settled_rows`). They take arrays and
return through the arrays they are given; groups of arrays come as plain tuples in a fixed order (numba takes no
named tuples here, ``tests/test_decode_tables.py``), named as they are unpacked."""

from __future__ import annotations

import numba as nb
import numpy as np

from pipeline.decode.etl.kernels import JIT, POLY_B1, POLY_B2, poly_pow
from pipeline.decode.etl.stacks import run_has

#: What a sample carries for each adopted piece beside its hashes: the piece's time after the sample's
#: (ticks) and its distance in records, which give back its (timestamp, cpu, stream_pos) in the buckets.
ADOPT_MAX_DT = 0xFFFF


@nb.njit(**JIT)
def claim_adjacent(rows, rbuf, piece_at, pieces, window, out):
    """``_claim_adjacent`` with the powers of the hash bases up to the largest frame count at hand."""
    pw1 = np.ones(1, np.uint64)
    pw2 = np.ones(1, np.uint64)
    p_n = pieces[7]            # (the frame counts: ``settle.Pieces.n``, the last of the pieces' columns)
    if p_n.shape[0]:
        top = max(0, p_n.max()) + 1
        pw1 = np.empty(top, np.uint64)
        pw2 = np.empty(top, np.uint64)
        pw1[0] = 1
        pw2[0] = 1
        for i in range(1, top):
            pw1[i] = pw1[i - 1] * POLY_B1
            pw2[i] = pw2[i - 1] * POLY_B2
    _claim_adjacent(rows, rbuf, piece_at, pieces, window, out, pw1, pw2)


@nb.njit(**JIT)
def _claim_adjacent(rows, rbuf, piece_at, pieces, window, out, pw1, pw2):
    """For each sample (``rows``, a ``settle.ClaimingRows``: record, time, thread), the stack pieces (``pieces``, a
    ``settle.Pieces``) of its (time, thread) that directly follow it in its buffer (consecutive records, at most
    ``window``; ``piece_at``: the piece at each record, -1 none): at most one kernel piece (``out.kernel``, ``out``
    being a ``settle.Claims``) and one user piece (``out.user``), -1 for none, with their time after the sample and
    distance in records. A sample adopts nothing (both -1) when a side has two pieces there, a piece was adopted
    already, its time is too far, or the two pieces name different processes: its pieces then go through the
    buckets as before.

    ``out.key1``/``out.key2``: what tells adopted stacks apart: the hashes of the concatenated frames (as
    ``group_pieces`` computes them), with the frame count and the kernel piece's frame count folded in."""
    s_rec, s_ts, s_tid = rows
    p_ev, p_tid, p_user, p_pid, p_ts, p_h1, p_h2, p_n = pieces
    k_out, u_out, k_dt, u_dt, k_d, u_d, pid_out, key1, key2, claimed = out
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


@nb.njit(**JIT)
def adopted_hashes(kh1, kh2, kn, uh1, uh2, un, h1, h2, count):
    """Hashes and frame count of kernel pieces followed by user pieces (the order ``group_pieces`` gives
    them; a count of 0 is no piece)."""
    for i in range(kh1.shape[0]):
        h1[i] = kh1[i] * poly_pow(POLY_B1, un[i]) + uh1[i]
        h2[i] = kh2[i] * poly_pow(POLY_B2, un[i]) + uh2[i]
        count[i] = kn[i] + un[i]


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
def in_bitmap_kernel(ts, key, bitmap, out):
    bits = _log2(bitmap.shape[0] * 64)
    for i in range(ts.shape[0]):
        out[i] = _has_bit(bitmap, bits, ts[i], key[i])


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
            hit = run_has(va_ts, va_cpu, m, t, cpu[r]) or run_has(o_ts, o_tid, j, t, tid[r])
            c = i
            while not hit and c < e:
                hit = c != a and tid[order[c]] == tid[r]
                c += 1
            out[r] = not hit
        i = e
