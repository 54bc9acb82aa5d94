"""Layer 2, numba kernels: the record walk and what reads records (XPRESS decompression: ``xpress.py``).

Every kernel takes arrays and offsets, checks each length before it reads and returns status codes
instead of raising: whatever the bytes say, no read leaves the buffer being decoded and every loop
advances, so a corrupt input cannot crash or hang the worker.
"""

from __future__ import annotations

import sys

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from pipeline.decode.etl import layout as L

JIT = dict(nogil=True, cache=True)

# Status codes (kernels return them; ``STATUS_TEXT`` turns them into messages).
OK = 0
XPRESS_TRUNCATED = 1       # the compressed stream ends inside a token
XPRESS_BAD_OFFSET = 2      # a match refers to bytes before the start of the buffer
XPRESS_OVERFLOW = 3        # output would exceed SavedOffset - 0x48
XPRESS_SHORT = 4           # stream ended before SavedOffset - 0x48 bytes were produced
XPRESS_BAD_LENGTH = 5      # an extended match length below its minimum
REC_BAD_MARKER = 10        # first u32 of a record is not a known header
REC_TOO_SMALL = 11         # record size smaller than its header
REC_PAST_END = 12          # record runs past the buffer's fill mark
REC_BAD_EXTENDED = 13      # EVENT_HEADER extended items or PERFINFO extensions do not fit the record
REC_TRUNCATED_HEADER = 14  # fewer bytes left in the buffer than a record header

STATUS_TEXT = {
    XPRESS_TRUNCATED: "XPRESS stream ends inside a token",
    XPRESS_BAD_OFFSET: "XPRESS match refers before the buffer start",
    XPRESS_OVERFLOW: "XPRESS output exceeds SavedOffset-0x48",
    XPRESS_SHORT: "XPRESS output shorter than SavedOffset-0x48",
    XPRESS_BAD_LENGTH: "XPRESS extended match length below its minimum",
    REC_BAD_MARKER: "record marker is not a known header type",
    REC_TOO_SMALL: "record size smaller than its header",
    REC_PAST_END: "record runs past the buffer's fill mark",
    REC_BAD_EXTENDED: "extended header items do not fit the record",
    REC_TRUNCATED_HEADER: "buffer ends inside a record header",
}


def read_u16(a, p):
    return np.uint32(a[p]) | (np.uint32(a[p + 1]) << 8)


def read_u32(a, p):
    return np.uint32(a[p]) | (np.uint32(a[p + 1]) << 8) | (np.uint32(a[p + 2]) << 16) | (np.uint32(a[p + 3]) << 24)


def read_u64(a, p):
    return np.uint64(read_u32(a, p)) | (np.uint64(read_u32(a, p + 4)) << np.uint64(32))


def _little_endian_load(fn, bits: int, result) -> None:
    """Compile ``fn`` (one of the readers above: the little-endian unsigned integer of ``bits`` at byte
    ``p`` of the 1-D uint8 array ``a``) as one unaligned load, widened to ``result``. The caller has
    checked 0 <= p and p + bits / 8 <= len(a): like ``a[p]`` with bounds checks off, nothing is checked
    here. Plain Python (``py_func``, NUMBA_DISABLE_JIT) runs the byte-wise reader.

    Assembled from byte reads (each with numba's negative-index wraparound), the reads were not merged
    by LLVM: StackWalk records took 45 ns each, 17 ns with these loads."""

    @intrinsic
    def load(typingctx, a, p):
        def codegen(context, builder, signature, args):
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            pos = context.cast(builder, args[1], signature.args[1], types.intp)
            if signature.args[0].layout == "C":
                addr = builder.gep(arr.data, [pos])
            else:
                stride = cgutils.unpack_tuple(builder, arr.strides, 1)[0]
                addr = builder.inttoptr(builder.add(builder.ptrtoint(arr.data, stride.type), builder.mul(pos, stride)),
                                        arr.data.type)
            value = builder.load(builder.bitcast(addr, ir.IntType(bits).as_pointer()), align=1)
            return builder.zext(value, context.get_value_type(result)) if bits < result.bitwidth else value
        return result(a, p), codegen

    @overload(fn, jit_options=JIT)
    def jitted(a, p):
        if isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.uint8 and isinstance(p, types.Integer):
            return lambda a, p: load(a, p)
        return None


if sys.byteorder != "little":     # the loads read the host's byte order; ETL is little-endian
    raise ImportError("the ETL kernels need a little-endian host")
_little_endian_load(read_u16, 16, types.uint32)
_little_endian_load(read_u32, 32, types.uint32)
_little_endian_load(read_u64, 64, types.uint64)


def put_u64(a, p, v):
    """Store ``v`` as the little-endian u64 at byte ``p`` of the 1-D uint8 array ``a`` (plain Python: byte
    by byte). Compiled, one unaligned store into a writable C-contiguous array; the caller has checked
    0 <= p and p + 8 <= len(a)."""
    for k in range(8):
        a[p + k] = (v >> np.uint64(8 * k)) & np.uint64(0xFF)


@intrinsic
def _store_u64(typingctx, a, p, v):
    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        pos = context.cast(builder, args[1], signature.args[1], types.intp)
        value = context.cast(builder, args[2], signature.args[2], types.uint64)
        builder.store(value, builder.bitcast(builder.gep(arr.data, [pos]), ir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()
    return types.void(a, p, v), codegen


@overload(put_u64, jit_options=JIT)
def put_u64_jitted(a, p, v):
    if (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.mutable and a.dtype == types.uint8
            and isinstance(p, types.Integer) and isinstance(v, types.Integer)):
        return lambda a, p, v: _store_u64(a, p, v)
    return None


@nb.njit(**JIT)
def _header_kind(htype):
    """(header size, pointer size, size field at +4) of a 0xC0 header type; size 0 if unknown.
    A numba-side copy of ``layout.HEADER_KINDS`` (a test checks that they agree)."""
    if htype == 0x01:
        return 0x20, 4, True
    if htype == 0x02:
        return 0x20, 8, True
    if htype == 0x03:
        return 0x18, 4, True
    if htype == 0x04:
        return 0x18, 8, True
    if htype == 0x10:
        return 0x10, 4, True
    if htype == 0x11:
        return 0x10, 8, True
    if htype == 0x0A:
        return 0x30, 4, False
    if htype == 0x14:
        return 0x30, 8, False
    if htype == 0x0B:
        return 0x48, 4, False
    if htype == 0x15:
        return 0x48, 8, False
    if htype == 0x12:
        return 0x50, 4, False
    if htype == 0x13:
        return 0x50, 8, False
    return 0, 0, False


@nb.njit(**JIT)
def _record_frame(blob, p, end, marker):
    """(status, header type, header size, pointer size, record size) of the record at p < end."""
    mflags = marker >> np.uint32(24)
    ht = (marker >> np.uint32(16)) & np.uint32(0xFF)
    if mflags == np.uint32(0xC0):
        hsize, psize, size_at_4 = _header_kind(ht)
        if hsize == 0:
            return REC_BAD_MARKER, ht, 0, 0, np.int64(0)
    elif mflags == np.uint32(0x90):
        ht, hsize, psize, size_at_4 = np.uint32(0x90), 8, 8, False
    else:
        return REC_BAD_MARKER, ht, 0, 0, np.int64(0)
    if p + hsize > end:
        return REC_TRUNCATED_HEADER, ht, hsize, psize, np.int64(0)
    size = np.int64(read_u16(blob, p + 4)) if size_at_4 else np.int64(read_u16(blob, p))
    if size < hsize:
        return REC_TOO_SMALL, ht, hsize, psize, size
    if p + size > end:
        return REC_PAST_END, ht, hsize, psize, size
    return OK, ht, hsize, psize, size


@nb.njit(**JIT)
def walk_records(blob, buffers, fill, cols, status):
    """Walk the records of every buffer blob[starts[i]:starts[i]+lens[i]] (``buffers``: the tuple starts, lens,
    cpu and stream rank of each buffer).

    With ``fill`` False only counts (returns the number of records); with ``fill`` True writes one entry
    per record into the column arrays ``cols`` (``batch.record_columns``) and returns how many, or -1 when
    they are too short. A record that does not parse ends its buffer: ``status`` (the tuple code, offset of
    each buffer) gets the code and the offset of the record inside the buffer.

    The fill pass also gives each record its buffer's cpu and its position in that cpu's stream ((rank of the
    buffer in the stream) << 24 | index of the record in its buffer); ``batch.record_kinds`` numbers the
    records' event kinds after it.
    """
    (rbuf, roff, rsize, htype, ptr, hook, opcode, event_id, version, tid, pid, ts, guid_off, pay_off, pay_len,
     ext_off, ext_len, kind, cpu, stream_pos) = cols
    starts, lens, buf_cpu, buf_rank = buffers
    status_code, status_pos = status
    n = 0
    for b in range(starts.shape[0]):
        base = starts[b]
        end = base + lens[b]
        p = base
        k = 0
        while p < end:
            if p + 4 > end:
                break  # less than a marker of slack: end of data
            marker = read_u32(blob, p)
            if marker == np.uint32(0xFFFFFFFF):
                break
            err, ht, hsize, psize, size = _record_frame(blob, p, end, marker)
            if err != OK:
                status_code[b] = err
                status_pos[b] = p - base
                break
            # Where the payload starts: after the header and any extensions.
            po = p + hsize
            eo = np.int64(-1)
            el = 0
            if ht == L.HT_PERFINFO32 or ht == L.HT_PERFINFO64:
                v = read_u16(blob, p + L.SYS_VERSION)
                extra = 8 * ((v >> L.PERFINFO_PMC_SHIFT) & L.PERFINFO_PMC_MASK) + (8 if (v & L.PERFINFO_PEBS_FLAG) else 0)
                po += extra
            elif ht == L.HT_EVENT32 or ht == L.HT_EVENT64:
                if read_u16(blob, p + L.EH_FLAGS) & L.EH_FLAG_EXTENDED_INFO:
                    eo = po
                    q = po
                    ok = False
                    while q + L.EXT_ITEM_HEADER_SIZE <= p + size:
                        isz = read_u16(blob, q)
                        link = read_u16(blob, q + 4)
                        if isz < L.EXT_ITEM_HEADER_SIZE:
                            break
                        q += isz
                        if link & 1 == 0:
                            ok = q <= p + size
                            break
                    if not ok:
                        status_code[b] = REC_BAD_EXTENDED
                        status_pos[b] = p - base
                        break
                    el = q - eo
                    po = q
            elif ht == L.HT_MESSAGE:
                mf = read_u16(blob, p + L.MSG_FLAGS)
                extra = 0
                if mf & L.MSG_OPT_SEQUENCE:
                    extra += 4
                if mf & L.MSG_OPT_GUID:
                    extra += 16
                elif mf & L.MSG_OPT_COMPONENT:
                    extra += 4
                if mf & L.MSG_OPT_TIMESTAMP:
                    extra += 8
                if mf & L.MSG_OPT_SYSTEMINFO:
                    extra += 8
                po += extra
            if po > p + size:
                status_code[b] = REC_BAD_EXTENDED
                status_pos[b] = p - base
                break
            if fill:
                if n >= rbuf.shape[0]:
                    return -1  # the arrays are full: the caller counts first and walks again
                rbuf[n] = b
                roff[n] = p
                rsize[n] = size
                htype[n] = ht
                ptr[n] = psize
                pay_off[n] = po
                pay_len[n] = p + size - po
                ext_off[n] = eo
                ext_len[n] = el
                guid_off[n] = -1
                event_id[n] = 0
                if ht <= L.HT_COMPACT64 or ht == L.HT_PERFINFO32 or ht == L.HT_PERFINFO64:
                    hk = read_u16(blob, p + L.SYS_HOOK)
                    hook[n] = hk
                    opcode[n] = hk & 0xFF
                    version[n] = read_u16(blob, p + L.SYS_VERSION) & 0xFF
                    if ht <= L.HT_COMPACT64:
                        tid[n] = read_u32(blob, p + L.SYS_TID)
                        pid[n] = read_u32(blob, p + L.SYS_PID)
                        ts[n] = np.int64(read_u64(blob, p + L.SYS_TS))
                    else:  # PERFINFO: no thread/process in the header
                        tid[n] = np.uint32(0xFFFFFFFF)
                        pid[n] = np.uint32(0xFFFFFFFF)
                        ts[n] = np.int64(read_u64(blob, p + L.PERFINFO_TS))
                elif ht == L.HT_MESSAGE:
                    mf = read_u16(blob, p + L.MSG_FLAGS)
                    hook[n] = 0
                    opcode[n] = 0
                    version[n] = 0
                    event_id[n] = read_u16(blob, p + L.MSG_NUMBER)
                    q = p + L.MSG_HEADER_SIZE
                    if mf & L.MSG_OPT_SEQUENCE:
                        q += 4
                    if mf & L.MSG_OPT_GUID:
                        guid_off[n] = q
                        q += 16
                    elif mf & L.MSG_OPT_COMPONENT:
                        q += 4
                    ts[n] = 0
                    if mf & L.MSG_OPT_TIMESTAMP:
                        ts[n] = np.int64(read_u64(blob, q))
                        q += 8
                    tid[n] = np.uint32(0xFFFFFFFF)
                    pid[n] = np.uint32(0xFFFFFFFF)
                    if mf & L.MSG_OPT_SYSTEMINFO:
                        tid[n] = read_u32(blob, q)
                        pid[n] = read_u32(blob, q + 4)
                else:  # EVENT_HEADER, or FULL_HEADER/INSTANCE with Class {u8 Type; u8 Level; u16 Version} at +4
                    hook[n] = 0
                    if ht == L.HT_EVENT32 or ht == L.HT_EVENT64:
                        opcode[n] = blob[p + L.EH_OPCODE]
                        version[n] = blob[p + L.EH_VERSION]
                        event_id[n] = read_u16(blob, p + L.EH_ID)
                    else:
                        opcode[n] = blob[p + L.FULL_TYPE]
                        version[n] = read_u16(blob, p + L.FULL_VERSION)
                    tid[n] = read_u32(blob, p + L.FULL_TID)  # same offsets in EVENT_HEADER
                    pid[n] = read_u32(blob, p + L.FULL_PID)
                    ts[n] = np.int64(read_u64(blob, p + L.FULL_TS))
                    guid_off[n] = p + L.FULL_GUID
                cpu[n] = buf_cpu[b]
                stream_pos[n] = (np.int64(buf_rank[b]) << 24) | k
            n += 1
            k += 1
            p += (size + 7) & ~7
    return n


@nb.njit(**JIT)
def gather_frames(blob, pay_off, pay_len, ptr, skip, out_offsets, out_frames, fill):
    """Stack frames of each record: pointers from payload byte ``skip[i]`` to the payload end.

    Counting pass (``fill`` False) returns the total number of frames and writes out_offsets
    (CSR, len n+1); the fill pass writes the frames as uint64 (4-byte pointers zero-extended).
    """
    total = 0
    out_offsets[0] = 0
    for i in range(pay_off.shape[0]):
        P = ptr[i]
        avail = pay_len[i] - skip[i]
        k = avail // P if avail > 0 else 0
        if fill:
            q = pay_off[i] + skip[i]
            for j in range(k):
                if P == 8:
                    out_frames[total + j] = read_u64(blob, q + 8 * j)
                else:
                    out_frames[total + j] = np.uint64(read_u32(blob, q + 4 * j))
        total += k
        out_offsets[i + 1] = total
    return total


@nb.njit(**JIT)
def cstring_lengths(blob, start, limit, wide, out):
    """Length in bytes (without terminator) of the NUL-terminated string at start[i], bounded by limit[i]."""
    for i in range(start.shape[0]):
        p = start[i]
        e = limit[i]
        if p < 0 or p > e:
            out[i] = 0
            continue
        q = p
        if wide:
            while q + 1 < e and not (blob[q] == 0 and blob[q + 1] == 0):
                q += 2
        else:
            while q < e and blob[q] != 0:
                q += 1
        out[i] = q - p


@nb.njit(**JIT)
def pair_slot(a, b, mask):
    """First slot of the pair (a, b) in an open-addressing table of ``mask + 1`` slots."""
    h = (a * np.uint64(0x9E3779B97F4A7C15)) ^ (b * np.uint64(0xC2B2AE3D27D4EB4F))
    h ^= h >> np.uint64(29)
    return h & mask


@nb.njit(**JIT)
def dedupe_pairs(a, b, table_bits):
    """Unique (a[i], b[i]) pairs in order of first appearance, by open addressing.

    Returns (first index of each unique pair, inverse code of each element, number of uniques); the
    number is -1 when more than half of the 2**table_bits slots would fill (caller then sorts instead).
    Meant for the few distinct event kinds / provider GUIDs among millions of records; ``unique_pairs``
    retries with a table sized for its input.
    """
    size = 1 << table_bits
    mask = np.uint64(size - 1)
    slots = np.full(size, -1, np.int32)
    first = np.empty(size // 2, np.int64)
    inverse = np.empty(a.shape[0], np.int32)
    n = 0
    for i in range(a.shape[0]):
        s = pair_slot(a[i], b[i], mask)
        while True:
            j = slots[s]
            if j < 0:
                if n >= size // 2:
                    return first[:0], inverse, -1
                slots[s] = n
                first[n] = i
                inverse[i] = n
                n += 1
                break
            f = first[j]
            if a[f] == a[i] and b[f] == b[i]:
                inverse[i] = j
                break
            s = (s + np.uint64(1)) & mask
    return first[:n], inverse, n


@nb.njit(**JIT)
def add_pairs(slots, keys_a, keys_b, n, a, b, new):
    """Insert the pairs (a[i], b[i]) into the set held in ``slots`` (open addressing, -1 free, else an
    index into ``keys_a``/``keys_b``, whose first ``n`` entries are in use); ``new[i]``: the pair was not
    in the set before. The caller keeps the slots at most half full. Returns the new ``n``."""
    mask = np.uint64(slots.shape[0] - 1)
    for i in range(a.shape[0]):
        s = pair_slot(a[i], b[i], mask)
        while True:
            j = slots[s]
            if j < 0:
                slots[s] = n
                keys_a[n] = a[i]
                keys_b[n] = b[i]
                n += 1
                new[i] = True
                break
            if keys_a[j] == a[i] and keys_b[j] == b[i]:
                new[i] = False
                break
            s = (s + np.uint64(1)) & mask
    return n


@nb.njit(**JIT)
def group_by_code(code, ncodes):
    """Stable counting sort of indices by ``code`` (0 .. ncodes-1; negative codes are left out):
    returns (indices, bounds) with the indices of code c in indices[bounds[c]:bounds[c + 1]], ascending."""
    bounds = np.zeros(ncodes + 1, np.int64)
    for i in range(code.shape[0]):
        if code[i] >= 0:
            bounds[code[i] + 1] += 1
    for c in range(ncodes):
        bounds[c + 1] += bounds[c]
    fill = bounds[:-1].copy()
    out = np.empty(bounds[ncodes], np.int64)
    for i in range(code.shape[0]):
        c = code[i]
        if c >= 0:
            out[fill[c]] = i
            fill[c] += 1
    return out, bounds


@nb.njit(**JIT)
def read_fields(blob, pay_off, ptr, idx, off32, nptr, nbytes, out):
    """out[i] = the field of record idx[i] at payload offset off32 + (P - 4) * nptr, P being the record's
    pointer size; ``nbytes`` 1, 2, 4 or 8, or 0 for a pointer-sized field. 0 when it would not fit
    inside ``blob`` (callers bound reads by payload length; this keeps the kernel safe anyway)."""
    n = blob.shape[0]
    for i in range(idx.shape[0]):
        r = idx[i]
        P = np.int64(ptr[r])
        p = pay_off[r] + off32 + (P - 4) * nptr
        out[i] = _uint_at(blob, n, p, nbytes if nbytes > 0 else P)


@nb.njit(**JIT)
def read_uints(blob, pos, nbytes, out):
    """out[i] = little-endian unsigned integer of ``nbytes`` (1, 2, 4 or 8) at blob[pos[i]]; 0 if it would
    not fit inside ``blob`` (callers bound reads by payload length; this keeps the kernel safe anyway)."""
    n = blob.shape[0]
    for i in range(pos.shape[0]):
        out[i] = _uint_at(blob, n, pos[i], nbytes)


@nb.njit(**JIT)
def _uint_at(blob, n, p, w):
    """The little-endian unsigned integer of ``w`` (1, 2, 4 or 8) bytes at blob[p] (``n`` = its length),
    or 0 when it would not fit."""
    if p < 0 or p + w > n:
        return np.uint64(0)
    if w == 8:
        return read_u64(blob, p)
    if w == 4:
        return np.uint64(read_u32(blob, p))
    if w == 2:
        return np.uint64(read_u16(blob, p))
    return np.uint64(blob[p])


@nb.njit(**JIT)
def extended_stacks(blob, ext_off, ext_len, fill, rec, kind, data_pos, count, width):
    """Stack items among the extended data of EVENT_HEADER records (§2.5).

    For record i, items lie in blob[ext_off[i]:ext_off[i]+ext_len[i]] (bounds checked by the record
    walk). Each STACK_TRACE32/64 item gives kind 0 with ``count`` addresses of ``width`` bytes at
    ``data_pos`` (after the u64 MatchId); each STACK_KEY32/64 item gives kind 1 with the key at
    ``data_pos``. Counting pass with ``fill`` False; returns the number of items.
    """
    n = 0
    for i in range(ext_off.shape[0]):
        q = ext_off[i]
        end = q + ext_len[i]
        while q + 8 <= end:
            size = read_u16(blob, q)
            ext_type = read_u16(blob, q + 2)
            link = read_u16(blob, q + 4)
            dsize = read_u16(blob, q + 6)
            if size < 8 or q + 8 + dsize > end:
                break
            d = q + 8
            if (ext_type == 5 or ext_type == 6) and dsize >= 8:
                if fill:
                    w = 4 if ext_type == 5 else 8
                    rec[n] = i
                    kind[n] = 0
                    data_pos[n] = d + 8
                    count[n] = (dsize - 8) // w
                    width[n] = w
                n += 1
            elif (ext_type == 17 or ext_type == 18) and dsize >= 12:
                if fill:
                    rec[n] = i
                    kind[n] = 1
                    data_pos[n] = d + 8
                    count[n] = 1
                    width[n] = 4 if ext_type == 17 else 8
                n += 1
            q += size
            if link & 1 == 0:
                break
    return n


#: Bases of the two frame-list hashes (odd, so multiplication by them is invertible mod 2**64).
POLY_B1 = np.uint64(0x9E3779B97F4A7C15)
POLY_B2 = np.uint64(0xC2B2AE3D27D4EB4F)


@nb.njit(**JIT)
def frame_mix(v):
    """A bijective scramble of one frame address (0 does not map to 0)."""
    v ^= np.uint64(0x5851F42D4C957F2D)
    v ^= v >> np.uint64(32)
    v *= np.uint64(0xD6E8FEB86659FD93)
    v ^= v >> np.uint64(32)
    return v


@nb.njit(**JIT)
def _poly_hash(blob, p, k, w):
    """(h1, h2, leaf) of the k frames of width w at blob[p:] (in bounds: the caller checked)."""
    a = np.uint64(0)
    c = np.uint64(0)
    leaf = np.uint64(0)
    for j in range(k):
        v = read_u64(blob, p + 8 * j) if w == 8 else np.uint64(read_u32(blob, p + 4 * j))
        if j == 0:
            leaf = v
        m = frame_mix(v)
        a = a * POLY_B1 + m
        c = c * POLY_B2 + (m ^ (m >> np.uint64(29)))
    return a, c, leaf


@nb.njit(**JIT)
def user_leaf(leaf, width):
    """Whether a frame list whose leaf (first) frame is ``leaf`` (0: no frames) is a user stack: the leaf lies
    below the kernel-space boundary of its pointer ``width``. A StackWalk record of a user leaf is the user
    half of a stack, or a user-only stack."""
    return leaf < (L.KERNEL_SPACE_64 if width == 8 else L.KERNEL_SPACE_32)


@nb.njit(**JIT)
def hash_frames_at(blob, pos, nbytes, width, h1, h2, user, count):
    """Two 64-bit polynomial hashes of each record's frame list, read in place: record i has
    nbytes[i] // width[i] pointers of width[i] bytes at blob[pos[i]:] (``count``). Also tells whether the
    list is a user stack (``user_leaf``). A range outside ``blob`` hashes as empty (0, 0, count 0).

    h = sum of mix(frame j) * B**(count-1-j) mod 2**64, so the hash of a concatenation follows from the
    pieces' hashes and counts (h(A+B) = h(A) * B**count(B) + h(B)): a stack cut into kernel and user
    pieces, or into pieces of different sizes, gets the hash of its whole frame list without the frames
    being brought together (``buckets.group_pieces``). Lists are at most a few hundred frames, far below
    the 2**11 a structural collision of such hashes needs.
    """
    n = blob.shape[0]
    for i in range(pos.shape[0]):
        w = width[i]
        k = nbytes[i] // w if nbytes[i] > 0 and w > 0 else 0
        p = pos[i]
        if p < 0 or p + k * w > n:
            k = 0
        h1[i], h2[i], leaf = _poly_hash(blob, p, k, w)
        user[i] = user_leaf(leaf, w)
        count[i] = k


@nb.njit(**JIT)
def stack_walk_records(blob, recs, idx, offsets, out):
    """StackWalk records ``idx`` (payload at least ``o_frames`` bytes, checked by the caller) in one pass:
    EventTimeStamp, StackProcess, StackThread, and ``hash_frames_at`` of the frames after them, and the
    record's own time, cpu and stream position. ``recs``: the record columns pay_off, pay_len, ptr, ts, cpu,
    stream_pos (``batch.Batch.of_records``); ``offsets``: the payload offsets of the four fields
    (``layout.STACK_WALK``: event_ts, pid, tid, frames); ``out``: the arrays ev, pid, tid, h1, h2, user
    (``user_leaf``), count, ts, cpu, stream_pos, one entry per record of ``idx`` (a plain tuple of an
    ``events.stackwalk.StackWalkOut``: kernels take no named tuples, see ``batch.record_columns``)."""
    pay_off, pay_len, ptr, r_ts, r_cpu, r_pos = recs
    o_ts, o_pid, o_tid, o_frames = offsets
    ev, pid, tid, h1, h2, user, count, ts, cpu, pos = out
    n = blob.shape[0]
    for i in range(idx.shape[0]):
        r = idx[i]
        ts[i], cpu[i], pos[i] = r_ts[r], r_cpu[r], r_pos[r]
        p = pay_off[r]
        if p < 0 or p + o_frames > n:
            ev[i] = 0
            pid[i] = 0
            tid[i] = 0
            h1[i] = 0
            h2[i] = 0
            user[i] = True
            count[i] = 0
            continue
        ev[i] = np.int64(read_u64(blob, p + o_ts))
        pid[i] = read_u32(blob, p + o_pid)
        tid[i] = read_u32(blob, p + o_tid)
        w = np.int64(ptr[r])
        q = p + o_frames
        k = (np.int64(pay_len[r]) - o_frames) // w if w > 0 and pay_len[r] > o_frames else 0
        if q + k * w > n:
            k = 0
        h1[i], h2[i], leaf = _poly_hash(blob, q, k, w)
        user[i] = user_leaf(leaf, w)
        count[i] = k


@nb.njit(**JIT)
def stack_key_records(blob, recs, idx, offsets, out):
    """StackKeyKernel/User records ``idx`` in one pass: EventTimeStamp, StackProcess, StackThread and the
    pointer-sized StackKey (the payload length is checked by the caller; a field that would not fit inside
    ``blob`` reads 0, as ``read_fields`` does), and the record's own time, cpu and stream position. ``recs``:
    as ``stack_walk_records`` takes them; ``offsets``: the payload offsets of the four fields; ``out``: the
    arrays ev, pid, tid, key, ts, cpu, stream_pos."""
    pay_off, _, ptr, r_ts, r_cpu, r_pos = recs
    o_ts, o_pid, o_tid, o_key = offsets
    ev, pid, tid, key, ts, cpu, pos = out
    n = blob.shape[0]
    for i in range(idx.shape[0]):
        r = idx[i]
        ts[i], cpu[i], pos[i] = r_ts[r], r_cpu[r], r_pos[r]
        p = pay_off[r]
        ev[i] = np.int64(_uint_at(blob, n, p + o_ts, 8))
        pid[i] = _uint_at(blob, n, p + o_pid, 4)
        tid[i] = _uint_at(blob, n, p + o_tid, 4)
        key[i] = _uint_at(blob, n, p + o_key, np.int64(ptr[r]))


@nb.njit(**JIT)
def sampled_profile_records(blob, recs, idx, layout, out):
    """SampledProfile records ``idx`` in one pass: InstructionPointer (pointer-sized, at ``o_ip``) and
    ThreadId (at ``o_tid`` + (P - 4) * ``n_tid``), and the record's own time, cpu and stream position.
    ``recs``: as ``stack_walk_records`` takes them; ``layout``: (o_ip, o_tid, n_tid, min_len32); ``out``: the
    arrays ip, tid, ok, ts, cpu, stream_pos, one entry per record of ``idx``. ``ok`` False (and zeros) when
    the payload is shorter than ``min_len32`` + P - 4 bytes or lies outside ``blob``."""
    pay_off, pay_len, ptr, r_ts, r_cpu, r_pos = recs
    o_ip, o_tid, n_tid, min_len32 = layout
    ip, tid, ok, ts, cpu, pos = out
    n = blob.shape[0]
    for i in range(idx.shape[0]):
        r = idx[i]
        ts[i], cpu[i], pos[i] = r_ts[r], r_cpu[r], r_pos[r]
        P = np.int64(ptr[r])
        p = pay_off[r]
        if p < 0 or np.int64(pay_len[r]) < min_len32 + P - 4 or p + min_len32 + P - 4 > n:
            ip[i] = 0
            tid[i] = 0
            ok[i] = False
            continue
        ip[i] = read_u64(blob, p + o_ip) if P == 8 else np.uint64(read_u32(blob, p + o_ip))
        tid[i] = read_u32(blob, p + o_tid + (P - 4) * n_tid)
        ok[i] = True


@nb.njit(**JIT)
def poly_pow(base, e):
    r = np.uint64(1)
    while e > 0:
        if e & 1:
            r *= base
        base *= base
        e >>= 1
    return r


@nb.njit(**JIT)
def stack_ids(h1, h2, count, out_id, out_check):
    """Stack id (62 bits, never negative) and a second, independent check value of whole frame lists
    given their hashes and frame counts (as ``hash_frames_at`` computes them)."""
    for i in range(h1.shape[0]):
        out_id[i] = np.int64(hash_finish(h1[i], count[i], np.uint64(0x2545F4914F6CDD1D)) >> np.uint64(2))
        out_check[i] = hash_finish(h2[i], count[i], np.uint64(0x94D049BB133111EB))


@nb.njit(**JIT)
def hash_finish(h, k, salt):
    x = h ^ (np.uint64(k) * salt)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@nb.njit(**JIT)
def hash_frame_lists(offsets, values, h1, h2, count):
    """``hash_frames_at`` for lists given as CSR offsets and flat uint64 values."""
    for i in range(offsets.shape[0] - 1):
        a = np.uint64(0)
        c = np.uint64(0)
        for j in range(offsets[i], offsets[i + 1]):
            m = frame_mix(values[j])
            a = a * POLY_B1 + m
            c = c * POLY_B2 + (m ^ (m >> np.uint64(29)))
        h1[i] = a
        h2[i] = c
        count[i] = offsets[i + 1] - offsets[i]
