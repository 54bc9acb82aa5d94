"""WPR heap snapshots (Microsoft-Windows-Heap-Snapshot, docs/heap-snapshot.md).

Partition side: events 100 (chunk) and 200 (end) become raw scratch rows. Assembly side (after all
partitions): chunks of one (pid, instance) are joined in Sequence order, checked (no gaps, length equal
to the last end event's TotalData) and parsed by one numba kernel into the stack table (segments of 8
frames, stacks referring to segments) and the busy blocks of every heap. A snapshot that does not
assemble or parse is kept as a marker row with the reason; its blocks are not reported.

The blob layout is reconstructed from decompiled x64 ntdll (see the notes) and has not been checked
against a real trace. PointerSize 4 follows the notes' inference for 32-bit ntdll (4-byte ids, frames
and block fields, 16-byte heap header); other versions and pointer sizes are refused, not guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numba as nb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.decode.etl.batch import Batch, PairSet
from pipeline.decode.etl.layout import USER_SPACE_END
from pipeline.decode.etl.kernels import JIT, read_u16, read_u32, read_u64, hash_frame_lists, stack_ids
from pipeline.runs import parquet_glob, sql_path

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow

PROVIDER = "901d2afa-4ff6-46d7-8d0e-53645e1a47f5"
EVENT_CHUNK, EVENT_END = 100, 200
CHUNK = {"instance": 0, "sequence": 4, "length": 8, "data": 12}   # event 100 v1, packed
END = {"instance": 0, "total": 4}                                 # event 200 v1
MAX_CHUNK = 0x4000

# Blob layout (§3), W = the blob's PointerSize (8 on x64; 4 is the notes' inference for 32-bit ntdll):
# stack-database header, segment and stack records, heap section header, block record.
DB_HEADER_SIZE = 12          # u32 SegmentCount; u32 StackCount; u16 Version (1); u16 PointerSize (W)
DB_VERSION = 1
ENTRY_FIXED = 4              # u32 Info, then a W-byte SegmentId/StackId, then W-byte values:
                             #   segment: Frame[Info >> 24]; stack: SegmentRef[ceil((Info >> 24) / 8)]
SEGMENT_FRAMES = 8
# Heap section header: u16 Version (2); u16 PointerSize; then W=8: u32 pad, u64 Heap, TotalCommit,
# TotalReserve (32 bytes); W=4: u32 Heap, TotalCommit, TotalReserve (16 bytes).
HEAP_HEADER_SIZE = {8: 32, 4: 16}
HEAP_VERSION = 2
BLOCK_FIELDS = 3             # {Address; StackRef; Size}, W bytes each
SENTINEL_ADDRESS, SENTINEL_SIZE = 0x1234CDEF, 0xFFFFFFFF
# Busy blocks are user memory: each lies below the end of the user address space (constants of the kernel).
USER_END_8, USER_END_4 = np.uint64(USER_SPACE_END[8]), np.uint64(USER_SPACE_END[4])

# Parse status codes.
PARSE_OK, PARSE_TRUNCATED, PARSE_BAD_VERSION, PARSE_BAD_SEGMENT, PARSE_BAD_BLOCK = 0, 1, 2, 3, 4
PARSE_TEXT = {PARSE_TRUNCATED: "blob ends inside a record", PARSE_BAD_VERSION: "unknown version or pointer size",
              PARSE_BAD_SEGMENT: "stack refers to a segment that is not in the blob",
              PARSE_BAD_BLOCK: "busy block beyond the user address space"}


# --- partition side ---------------------------------------------------------------------------------
def chunk_events(b: Batch, idx: np.ndarray) -> None:
    idx = b.require(idx, CHUNK["data"], "HeapSnapshot chunk")
    po = b.c["pay_off"][idx]
    length = b.gather(po + CHUNK["length"], 4).astype(np.int64)
    fits = (length <= b.c["pay_len"][idx] - CHUNK["data"]) & (length <= MAX_CHUNK)
    for i in idx[~fits][:100].tolist():
        b.error(i, "heap_snapshot", "HeapSnapshot chunk: BufferLen larger than the payload or 0x4000")
    idx, po, length = idx[fits], po[fits], length[fits]
    data = [bytes(b.blob[p + CHUNK["data"]:p + CHUNK["data"] + n]) for p, n in zip(po.tolist(), length.tolist())]
    b.emit("_heapsnap_chunks", {
        **b.common(idx), "pid": b.c["pid"][idx], "instance": b.gather(po + CHUNK["instance"], 4),
        "sequence": b.gather(po + CHUNK["sequence"], 4), "data": pa.array(data, pa.binary()),
    }, idx)


def end_events(b: Batch, idx: np.ndarray) -> None:
    idx = b.require(idx, 8, "HeapSnapshot end")
    po = b.c["pay_off"][idx]
    b.emit("_heapsnap_ends", {
        **b.common(idx), "pid": b.c["pid"][idx], "instance": b.gather(po + END["instance"], 4),
        "total": b.gather(po + END["total"], 4),
    }, idx)


# --- blob parser --------------------------------------------------------------------------------------
@nb.njit(**JIT)
def _uw(blob, p, w):
    return read_u64(blob, p) if w == 8 else np.uint64(read_u32(blob, p))


@nb.njit(**JIT)
def _entry(blob, p, w, s, count, ids, offs, values, nv):
    """One segment or stack record at p: {u32 Info; W-byte Id; W-byte value[count]} -> ids[s] and
    values[offs[s]:]. Returns (ok, next position, values used)."""
    if p + ENTRY_FIXED + w * (count + 1) > blob.shape[0] or nv + count > values.shape[0]:
        return False, p, nv
    ids[s] = _uw(blob, p + ENTRY_FIXED, w)
    offs[s] = nv
    for j in range(count):
        values[nv + j] = _uw(blob, p + ENTRY_FIXED + w * (j + 1), w)
    offs[s + 1] = nv + count
    return True, p + ENTRY_FIXED + w * (count + 1), nv + count


@nb.njit(**JIT)
def parse_blob(blob, seg_id, seg_off, seg_frames, stk_id, stk_ref, stk_off, stk_segs,
               heap_of_block, blocks, heaps):
    """Parse one assembled snapshot blob into preallocated arrays; returns (status, position, counts).

    counts = (segments, frames, stacks, segment refs, heap sections, blocks). Every read is checked
    against the blob length and every write against the output arrays (sized by the caller).
    """
    n = blob.shape[0]
    counts = np.zeros(6, np.int64)
    if n < DB_HEADER_SIZE:
        return PARSE_TRUNCATED, 0, counts
    nseg = read_u32(blob, 0)
    nstk = read_u32(blob, 4)
    w = np.int64(read_u16(blob, 10))
    if read_u16(blob, 8) != DB_VERSION or (w != 8 and w != 4):
        return PARSE_BAD_VERSION, 8, counts
    p = np.int64(DB_HEADER_SIZE)
    nf = 0
    for s in range(nseg):
        if p + ENTRY_FIXED > n or s >= seg_id.shape[0]:
            return PARSE_TRUNCATED, p, counts
        ok, p, nf = _entry(blob, p, w, s, np.int64(read_u32(blob, p) >> 24), seg_id, seg_off, seg_frames, nf)
        if not ok:
            return PARSE_TRUNCATED, p, counts
        counts[0] = s + 1
    counts[1] = nf
    nr = 0
    for s in range(nstk):
        if p + ENTRY_FIXED > n or s >= stk_id.shape[0]:
            return PARSE_TRUNCATED, p, counts
        info = read_u32(blob, p)
        stk_ref[s] = info & 0xFFFFFF
        nref = (np.int64(info >> 24) + SEGMENT_FRAMES - 1) // SEGMENT_FRAMES
        ok, p, nr = _entry(blob, p, w, s, nref, stk_id, stk_off, stk_segs, nr)
        if not ok:
            return PARSE_TRUNCATED, p, counts
        counts[2] = s + 1
    counts[3] = nr
    hsize = 32 if w == 8 else 16   # HEAP_HEADER_SIZE[w]
    first = 8 if w == 8 else 4     # offset of the Heap field
    end = USER_END_8 if w == 8 else USER_END_4
    nb_ = 0
    nh = 0
    while p < n:
        if p + hsize > n or nh >= heaps.shape[0]:
            return PARSE_TRUNCATED, p, counts
        if read_u16(blob, p) != HEAP_VERSION or read_u16(blob, p + 2) != w:
            return PARSE_BAD_VERSION, p, counts
        for k in range(3):  # Heap, TotalCommit, TotalReserve
            heaps[nh, k] = _uw(blob, p + first + w * k, w)
        p += hsize
        while True:
            if p + BLOCK_FIELDS * w > n or nb_ >= blocks.shape[0]:
                return PARSE_TRUNCATED, p, counts
            addr = _uw(blob, p, w)
            ref = _uw(blob, p + w, w)
            size = _uw(blob, p + 2 * w, w)
            p += BLOCK_FIELDS * w
            if addr == SENTINEL_ADDRESS and ref == 0 and size == SENTINEL_SIZE:
                break
            if addr > end or size > end - addr:
                return PARSE_BAD_BLOCK, p - BLOCK_FIELDS * w, counts
            blocks[nb_, 0] = addr
            blocks[nb_, 1] = ref
            blocks[nb_, 2] = size
            heap_of_block[nb_] = nh
            nb_ += 1
        nh += 1
        counts[4] = nh
        counts[5] = nb_
    return PARSE_OK, p, counts


def parse(blob: np.ndarray) -> tuple[int, int, dict[str, np.ndarray]]:
    """Run :func:`parse_blob` with arrays sized from the blob; returns (status, position, parts)."""
    n = len(blob)
    cap_rec, cap_words = n // (ENTRY_FIXED + 4) + 1, n // 4 + 1     # smallest records: W = 4
    # (empty, not zeroed: about 12 bytes of arrays per blob byte, and parse_blob writes every entry it
    # counts; only the first offset of an empty list is never written)
    seg_id, seg_off, seg_frames = np.empty(cap_rec, np.uint64), np.empty(cap_rec + 1, np.int64), np.empty(cap_words, np.uint64)
    stk_id, stk_ref, stk_off = np.empty(cap_rec, np.uint64), np.empty(cap_rec, np.uint32), np.empty(cap_rec + 1, np.int64)
    seg_off[0] = stk_off[0] = 0
    stk_segs = np.empty(cap_words, np.uint64)
    cap_blocks = n // (BLOCK_FIELDS * 4) + 1
    heap_of_block = np.empty(cap_blocks, np.int64)
    blocks = np.empty((cap_blocks, 3), np.uint64)
    heaps = np.empty((n // HEAP_HEADER_SIZE[4] + 1, 3), np.uint64)
    status, pos, c = parse_blob(blob, seg_id, seg_off, seg_frames, stk_id, stk_ref, stk_off, stk_segs,
                                heap_of_block, blocks, heaps)
    nseg, nf, nstk, nr, nh, nblk = (int(x) for x in c)
    return int(status), int(pos), {
        "seg_id": seg_id[:nseg], "seg_off": seg_off[:nseg + 1], "seg_frames": seg_frames[:nf],
        "stk_id": stk_id[:nstk], "stk_ref": stk_ref[:nstk], "stk_off": stk_off[:nstk + 1], "stk_segs": stk_segs[:nr],
        "heaps": heaps[:nh], "blocks": blocks[:nblk], "heap_of_block": heap_of_block[:nblk],
    }


def stack_frames(parts: dict[str, np.ndarray]) -> pa.ListArray | None:
    """Frames of every stack (its segments' frames, concatenated), or None when a stack names a segment
    the blob does not define. A segment id defined twice means its last definition."""
    seg_id, off, frames = parts["seg_id"], parts["seg_off"], parts["seg_frames"]
    refs = parts["stk_segs"]
    order = np.argsort(seg_id, kind="stable")
    at = np.searchsorted(seg_id[order], refs, side="right") - 1
    if len(refs) and (at.min() < 0 or not np.array_equal(seg_id[order][np.maximum(at, 0)], refs)):
        return None
    seg = order[at]                                   # segment of each reference, in stack order
    length = off[seg + 1] - off[seg]
    ends = np.cumsum(length)
    starts = np.repeat(off[seg] - (ends - length), length)
    values = frames[starts + np.arange(int(ends[-1]) if len(ends) else 0)]
    stack_offsets = np.append(0, ends)[parts["stk_off"]]
    return pa.ListArray.from_arrays(pa.array(stack_offsets.astype(np.int32)), pa.array(values, pa.uint64()))


# --- assembly ---------------------------------------------------------------------------------------
def preload() -> None:
    """Load the assembly's kernels in this process (the client's first numba kernels, with the set-up of
    numba's code generator): called on a thread while the partitions run, once one of them has found
    snapshot chunks, so that the assembly after them starts at once."""
    from pipeline.decode.etl.kernels import add_pairs
    from pipeline.cluster.warmup import load_kernels

    load_kernels((parse_blob, hash_frame_lists, stack_ids, add_pairs))


SNAPSHOT_SCHEMA = pa.schema([
    ("snapshot_id", pa.int64()), ("pid", pa.uint32()), ("instance", pa.uint32()), ("timestamp", pa.int64()), ("timestamp_ns", pa.int64()),
    ("end_timestamp_ns", pa.int64()), ("chunks", pa.int64()), ("bytes", pa.int64()), ("total_data", pa.int64()),
    ("complete", pa.bool_()), ("status", pa.string()), ("heaps", pa.int64()), ("blocks", pa.int64()),
    ("block_bytes", pa.int64()), ("stacks", pa.int64()),
])


def assemble(scratch: Path, out, errors: list[ErrorRow], path: str, memory_limit: int = 256 * 10**6) -> dict[str, int]:
    """Write ``heap_snapshots``, ``heap_snapshot_blocks`` and the scratch table ``_heapsnap_stacks`` (frames
    with their stack ids, for the ``stacks`` table: each distinct stack once, from the first snapshot
    that has it).

    Chunks come from ordered queries, each over the snapshots of one batch (``_batches``: a share of
    ``memory_limit`` bytes each); in Python only the chunks of one (pid, instance) are in memory at a time, and
    blocks are written as each snapshot is parsed.
    """
    import duckdb

    chunks_dir, ends_dir = scratch / "_heapsnap_chunks.parquet", scratch / "_heapsnap_ends.parquet"
    con = duckdb.connect(config={"memory_limit": f"{memory_limit}B", "temp_directory": str(scratch / "duckdb.tmp"),
                                 "threads": 1})
    ends: dict[tuple, list] = {}
    if ends_dir.exists():
        for pid, instance, *rest in con.execute(f"""SELECT pid, instance, total, timestamp, timestamp_ns
                FROM read_parquet({sql_path(parquet_glob(ends_dir))}) ORDER BY pid, instance, timestamp, cpu, stream_pos""").fetchall():
            ends.setdefault((pid, instance), []).append(tuple(rest))
    rows: list[dict[str, Any]] = []
    stack_rows = BlockWriter(scratch / "_heapsnap_stacks.parquet")
    written = PairSet()
    blocks = BlockWriter(out.table_path("heap_snapshot_blocks"), BLOCKS_SCHEMA, compression_level=1)

    def finish(key, chunks):
        for group, group_ends in _split(chunks, ends.pop(key, [])):
            rows.append(_snapshot(len(rows), *key, group, group_ends, errors, path, stack_rows, blocks, written))

    if chunks_dir.exists():
        chunk_files = f"read_parquet({sql_path(parquet_glob(chunks_dir))})"
        budget = memory_limit // BATCH_SHARE
        # Usually everything fits in one query (None: no filter); the parquet footers tell without reading the chunks.
        batches = _batches(con, chunk_files, budget) if _data_bytes(chunks_dir) > budget else [None]
        for keys in batches:
            where = ""
            if keys is not None:
                con.register("batch_keys", pa.table({"pid": [k[0] for k in keys], "instance": [k[1] for k in keys]}))
                where = "WHERE (pid, instance) IN (SELECT pid, instance FROM batch_keys)"
            cur = con.execute(f"""SELECT pid, instance, sequence, data, timestamp, timestamp_ns FROM {chunk_files}
                                  {where} ORDER BY pid, instance, timestamp, cpu, stream_pos""")
            key, chunks = None, []
            while batch := cur.fetchmany(1024):
                for pid, instance, *chunk in batch:
                    if (pid, instance) != key:
                        if key is not None:
                            finish(key, chunks)
                        key, chunks = (pid, instance), []
                    chunks.append(tuple(chunk))
            if key is not None:
                finish(key, chunks)
    for key in sorted(ends):  # end events without any chunk
        finish(key, [])
    con.close()
    blocks.close()
    stack_rows.close()
    out.write_table("heap_snapshots", pa.Table.from_pylist(rows, schema=SNAPSHOT_SCHEMA))
    return {"heap_snapshots": len(rows), "heap_snapshots_incomplete": sum(not r["complete"] for r in rows)}


#: One ordered query takes the chunks of snapshots totalling at most this share of ``join_memory_limit``:
#: DuckDB held the whole ordered result (about the chunks' size again beyond it), and with all the chunks
#: of the trace in one query a trace with more snapshot data than the limit failed for lack of memory.
BATCH_SHARE = 4


def _data_bytes(chunks_dir: Path) -> int:
    """Uncompressed bytes of the chunks' ``data`` column, from the parquet footers."""
    total = 0
    for part in chunks_dir.glob("*.parquet"):
        meta = pq.read_metadata(part)
        column = meta.schema.names.index("data")
        total += sum(meta.row_group(g).column(column).total_uncompressed_size for g in range(meta.num_row_groups))
    return total


def _batches(con, chunk_files: str, budget: int) -> list[list[tuple[int, int]]]:
    """The (pid, instance) keys of the chunks in order, cut into runs whose chunks total at most
    ``budget`` bytes (a key larger than that alone): each run is one ordered query."""
    sizes = con.execute(f"""SELECT pid, instance, sum(octet_length(data)) FROM {chunk_files}
                            GROUP BY pid, instance ORDER BY pid, instance""").fetchall()
    batches: list[list[tuple[int, int]]] = []
    total = 0
    for pid, instance, size in sizes:
        if not batches or total + (size or 0) > budget:
            batches.append([])
            total = 0
        batches[-1].append((pid, instance))
        total += size or 0
    return batches


#: ``heap_snapshot_blocks`` (schema.md): busy blocks of the complete snapshots, by (snapshot, heap, address).
BLOCKS_SCHEMA = pa.schema([
    pa.field("snapshot_id", pa.int64(), False), pa.field("pid", pa.uint32(), False),
    pa.field("instance", pa.uint32(), False), pa.field("timestamp_ns", pa.int64(), False),
    pa.field("heap", pa.uint64(), False), pa.field("address", pa.uint64(), False), pa.field("size", pa.uint64(), False),
    pa.field("stack_ref", pa.uint64(), False), pa.field("stack_id", pa.int64())])


class BlockWriter:
    """Appends the blocks (or stacks) of each parsed snapshot to one parquet file, in row groups of about
    ``ROW_GROUP`` rows, so memory holds a row group at a time. With a ``schema``, the file is written even
    when no rows come (a table with no rows); without, only once rows come."""

    ROW_GROUP = 122_880

    def __init__(self, target: Path, schema: pa.Schema | None = None, **options):
        self.target, self.schema, self.options = target, schema, {"compression": "zstd", **options}
        self.writer = None
        self.pending: list[pa.Table] = []
        self.rows = 0

    def append(self, table: pa.Table) -> None:
        self.pending.append(table if self.schema is None else table.cast(self.schema))
        self.rows += table.num_rows
        if self.rows >= self.ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        data = pa.concat_tables(self.pending)
        self.pending, self.rows = [], 0
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.target, data.schema, **self.options)
        self.writer.write_table(data, row_group_size=self.ROW_GROUP)

    def close(self) -> None:
        if self.pending:
            self._flush()
        if self.writer is None and self.schema is not None:
            self.writer = pq.ParquetWriter(self.target, self.schema, **self.options)
        if self.writer is not None:
            self.writer.close()


def _split(chunks: list[tuple], ends: list[tuple]) -> list[tuple[list, list]]:
    """Separate the snapshots that share one (pid, instance): a reused PID restarts the instance counter.
    A new snapshot starts at every chunk with Sequence 0; end events go to the latest snapshot begun at or
    before them."""
    groups: list[list] = []
    for c in chunks:
        if not groups or c[0] == 0:
            groups.append([])
        groups[-1].append(c)
    if not groups:
        groups = [[]]
    starts = [g[0][2] if g else -(1 << 63) for g in groups]
    out = [(g, []) for g in groups]
    for e in ends:
        i = max((k for k, t in enumerate(starts) if t <= e[1]), default=0)
        out[i][1].append(e)
    return out


def _snapshot(snapshot_id, pid, instance, chunks, ends, errors, path, stack_rows, blocks, written: PairSet
              ) -> dict[str, Any]:
    """Check, assemble and parse one snapshot; returns its ``heap_snapshots`` row. Its stacks go to
    ``stack_rows`` unless ``written`` has their (stack id, id check) already."""
    times = [c[2] for c in chunks] + [e[1] for e in ends]
    times_ns = [c[3] for c in chunks] + [e[2] for e in ends]
    row = {"snapshot_id": snapshot_id, "pid": pid, "instance": instance, "timestamp": min(times),
           "timestamp_ns": min(times_ns), "end_timestamp_ns": max(times_ns), "chunks": len(chunks),
           "bytes": sum(len(c[1]) for c in chunks), "total_data": ends[-1][0] if ends else None,
           "complete": False, "status": "ok", "heaps": 0, "blocks": 0, "block_bytes": 0, "stacks": 0}
    if [c[0] for c in chunks] != list(range(len(chunks))):
        row["status"] = "incomplete: chunk sequence has gaps (lost events?)"
    elif not ends:
        row["status"] = "incomplete: no end event (200)"
    elif row["bytes"] != row["total_data"]:
        row["status"] = f"incomplete: {row['bytes']} chunk bytes but TotalData {row['total_data']}"
    if row["status"] != "ok":
        errors.append(_error(path, pid, instance, row["status"]))
        return row
    blob = np.frombuffer(b"".join(c[1] for c in chunks), np.uint8)
    status, pos, parts = parse(blob)
    frames = stack_frames(parts) if status == PARSE_OK else None
    if status != PARSE_OK or frames is None:
        row["status"] = f"unparsed: {PARSE_TEXT.get(status, PARSE_TEXT[PARSE_BAD_SEGMENT])} at blob offset {pos}"
        errors.append(_error(path, pid, instance, row["status"]))
        return row
    blk = parts["blocks"]
    # Summed exactly (halves of each size: uint64 sums would wrap): each block lies in the user address space,
    # so blocks that add up to more than it overlap.
    block_bytes = (int((blk[:, 2] >> np.uint64(32)).sum()) << 32) + int((blk[:, 2] & np.uint64(0xFFFFFFFF)).sum())
    space = USER_SPACE_END[int(blob[10]) | int(blob[11]) << 8]      # (parsed: PointerSize is 4 or 8)
    if block_bytes > space:
        row["status"] = f"unparsed: busy blocks add up to {block_bytes} bytes, more than the user address space ({space})"
        errors.append(_error(path, pid, instance, row["status"]))
        return row
    row.update(complete=True, heaps=len(parts["heaps"]), blocks=len(blk), block_bytes=block_bytes, stacks=len(frames))
    # Stack ids as the event stacks get them: the same content hash of the frame list.
    n = len(frames)
    h1, h2, count = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.int64)
    hash_frame_lists(frames.offsets.to_numpy().astype(np.int64), frames.values.to_numpy(zero_copy_only=False),
                     h1, h2, count)
    sid, check = np.empty(n, np.int64), np.empty(n, np.uint64)
    stack_ids(h1, h2, count, sid, check)
    # Each distinct stack's frames once per trace: the stack database of a process's next snapshot repeats
    # most of the previous one's (1 GB synth trace with 250,000 distinct stacks: 370,780 stack rows of 176
    # snapshots, 39,538 distinct).
    first = np.flatnonzero(written.add(sid.view(np.uint64), check) & (count > 0))
    if len(first):
        stack_rows.append(pa.table({
            "snapshot_id": pa.array(np.full(len(first), snapshot_id, np.int64)),
            "stack_ref": pa.array(parts["stk_id"][first], pa.uint64()), "stack_id": sid[first],
            "id_check": check[first], "frames": frames.take(pa.array(first))}))
    n = len(blk)
    heap = parts["heaps"][parts["heap_of_block"], 0]
    order = np.lexsort((blk[:, 0], heap))
    ref = blk[order, 1]
    # Each block's stack: the snapshot's stack of its StackRef (the first, should one repeat); none for
    # StackRef 0 (allocated before the process enabled stack tracking) or a ref the blob does not define.
    ids = parts["stk_id"]
    by_id = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids[by_id], ref), max(len(ids) - 1, 0))
    j = by_id[at] if len(ids) else np.zeros(n, np.int64)
    known = (ids[j] == ref) & (count[j] > 0) if len(ids) else np.zeros(n, np.bool_)
    blocks.append(pa.table({
        "snapshot_id": pa.array(np.full(n, snapshot_id, np.int64)), "pid": pa.array(np.full(n, pid, np.uint32)),
        "instance": pa.array(np.full(n, instance, np.uint32)),
        "timestamp_ns": pa.array(np.full(n, row["timestamp_ns"], np.int64)),
        "heap": heap[order], "address": blk[order, 0], "size": blk[order, 2], "stack_ref": ref,
        "stack_id": pa.array(sid[j] if len(ids) else np.zeros(n, np.int64), mask=~known),
    }))
    return row


def _error(path: str, pid: int, instance: int, status: str) -> ErrorRow:
    return {"file": path, "buffer_index": -1, "file_offset": -1, "record_offset": -1, "kind": "heap_snapshot",
            "message": f"{path}: heap snapshot of pid {pid}, instance {instance}: {status}; kept as a marker"}
