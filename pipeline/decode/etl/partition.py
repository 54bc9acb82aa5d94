"""The dask task: decode one partition (a run of consecutive buffers) into parquet parts.

A task receives a descriptor (file path, buffer descriptors, trace constants, output directories),
reads its bytes itself with one read, inflates compressed buffers, walks the records, runs the
dispatch table and writes one parquet part per table. It returns the part paths and small counts.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline import portable, sources
from pipeline.decode.etl import kernels as K
from pipeline.decode.etl import layout as L
from pipeline.decode.etl import workerstate as W
from pipeline.decode.etl.batch import Batch, record_error, walk
from pipeline.decode.etl.buffers import MAX_BUFFER_SIZE
from pipeline.decode.etl.events.stackwalk import extended_stacks
from pipeline.decode.etl.interpret import lookup
from pipeline.decode.etl.scratch import (BUCKETED, KEYED_REF_COLUMNS, KEYED_SAMPLES, pack_hashes, text_columns,
                                        write_final, write_part, write_scratch)
from pipeline.decode.etl.settle import adopt_pieces, settle_heap_events, settle_keyed_samples, settle_samples
from pipeline.decode.etl.stacks import Stacks
from pipeline.decode.etl.tables import THREAD_STACKED
from pipeline.decode.etl.tasks import PartitionResult, PartitionTask, WrittenParts
from pipeline.decode.etl.xpress import decompress_buffers

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow

_GROUP_GUIDS = L.group_guid_table()
#: Provider text of codes 0-255 (kernel groups) and 256 (MESSAGE records without a GUID).
_GROUP_PROVIDERS = [str(uuid.UUID(bytes_le=bytes(g))) for g in _GROUP_GUIDS] + [L.NULL_GUID]
#: Stack pieces of a partition without StackWalk records (nothing for its samples to adopt).
EMPTY_REFS = pa.table({"event_ts": pa.array([], pa.int64()), "tid": pa.array([], pa.uint32()),
                       "user": pa.array([], pa.bool_()), "pid": pa.array([], pa.uint32()),
                       "timestamp": pa.array([], pa.int64()), "h1": pa.array([], pa.uint64()),
                       "h2": pa.array([], pa.uint64()), "n": pa.array([], pa.int32()), "_rec": pa.array([], pa.int64())})


#: Scratch tables of at most this many bytes go back to the client in the task's result (``write_parts``).
INLINE_BYTES = 1 << 20


class InlineScratch:
    """The small scratch tables that partitions hand back (``write_parts``), written as parquet parts of
    their tables in the scratch directory, a part whenever a table has gathered ``flush_bytes``: memory
    stays bounded however many partitions there are, and there are a few files instead of one per
    partition and table."""

    def __init__(self, scratch_dir: Path, flush_bytes: int = 16 << 20):
        self.dir, self.flush_bytes = scratch_dir, flush_bytes
        self.pending: dict[str, list[pa.Table]] = {}
        self.pending_bytes: dict[str, int] = {}
        self.parts = 0

    def take(self, result: PartitionResult) -> None:
        """Take the small tables out of a partition's result (called as each result arrives)."""
        inline, result.inline = result.inline, {}
        for table, data in inline.items():
            self.pending.setdefault(table, []).append(data)
            self.pending_bytes[table] = self.pending_bytes.get(table, 0) + data.get_total_buffer_size()
            if self.pending_bytes[table] >= self.flush_bytes:
                self._write(table)

    def close(self) -> None:
        """Write what is left, the tables side by side (the workers wait for this before the buckets; the
        writes release the GIL)."""
        tables = list(self.pending)
        numbers = range(self.parts, self.parts + len(tables))
        self.parts += len(tables)
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(self._write, tables, numbers))

    def _write(self, table: str, number: int | None = None) -> None:
        data = pa.concat_tables(self.pending.pop(table), promote_options="permissive")
        self.pending_bytes.pop(table, None)
        if number is None:
            number, self.parts = self.parts, self.parts + 1
        directory = self.dir / f"{table}.parquet"
        directory.mkdir(parents=True, exist_ok=True)
        # Row groups of about INLINE_BYTES, as the partitions' own parts were: DuckDB reads a row group's
        # column at once, and the heap-snapshot assembly needs the chunks' blobs to come in small groups
        # to stay within its memory limit.
        rows = max(1, data.num_rows * INLINE_BYTES // max(data.get_total_buffer_size(), 1))
        write_part(data, directory / f"inline-{number:05d}.parquet", compression="none",
                   use_dictionary=text_columns(data.schema), row_group_size=rows)


def decode_partition(task: PartitionTask) -> PartitionResult:
    with W.reuse_freed_memory():
        return _decode_partition(task)


def _decode_partition(task: PartitionTask) -> PartitionResult:
    path, bufs, part = task.path, task.buffers, task.part
    blob, starts, lens, errors, skipped = read_buffers(path, bufs)
    cols, kinds, rstatus, rpos = walk(blob, starts, lens, bufs)
    for i in np.flatnonzero(rstatus != 0):
        errors.append(record_error(path, bufs[i], int(rpos[i]), "record",
                                   f"{K.STATUS_TEXT[int(rstatus[i])]}; rest of the buffer skipped"))
    b = Batch(blob, cols, bufs, dict(task.consts, path=path, starts=starts), kinds)
    b.errors = errors
    counts = interpret(b)
    # The tables are built: the record columns (but each record's buffer) and the mapped bytes go before
    # the writes. (With the walk's margin given back too: peak RSS 483-492 -> 444 MB, 4 GB synth.)
    b.c, b.blob, b.consumed = {"rbuf": b.c["rbuf"]}, None, None
    del blob, cols
    written = write_parts(b, part, Path(task.out_dir), Path(task.scratch_dir))
    return PartitionResult(**vars(written), part=part, records=int(b.n), bytes=int(bufs["buffer_size"].sum()),
                           event_counts=counts, errors=b.errors, buffers_skipped=int(skipped + (rstatus != 0).sum()))


def read_buffers(path: str, bufs: np.ndarray):
    """Layer 1 for one partition: one read covering its buffers (contiguous in the file), XPRESS buffers
    inflated in numba. Returns (blob, start and length of each buffer's event data in it, errors,
    number of buffers skipped)."""
    errors: list[ErrorRow] = []
    lo = int(bufs["file_offset"][0])
    hi = int(bufs["file_offset"][-1]) + int(bufs["buffer_size"][-1])
    raw = map_range(path, lo, hi)
    data_len = bufs["data_len"].astype(np.int64)
    src_start = bufs["file_offset"].astype(np.int64) - lo + L.BUFFER_HEADER_SIZE
    src_end = bufs["file_offset"].astype(np.int64) - lo + bufs["buffer_size"].astype(np.int64)
    bad = (data_len > MAX_BUFFER_SIZE) | (src_end > len(raw))
    for i in np.flatnonzero(bad):
        errors.append(record_error(path, bufs[i], 0, "bad_buffer_size",
                                   f"{int(data_len[i])} bytes of event data is not plausible; buffer skipped"))
    data_len[bad] = 0
    comp = bufs["compressed"] & (data_len > 0)
    if not comp.any():
        # Nothing to inflate: records are walked where they were read.
        return raw, src_start, data_len, errors, int(bad.sum())
    # Inflated event data of every buffer side by side in one array (uncompressed ones copied).
    starts = np.zeros(len(bufs), np.int64)
    starts[1:] = np.cumsum(data_len)[:-1]
    blob = np.empty(int(data_len.sum()), np.uint8)
    for i in np.flatnonzero(~comp & (data_len > 0)):
        blob[starts[i]:starts[i] + data_len[i]] = raw[src_start[i]:src_start[i] + data_len[i]]
    status = np.zeros(len(bufs), np.int32)
    produced = np.zeros(len(bufs), np.int64)
    decompress_buffers(raw, np.where(comp, src_start, -1), src_end, blob, starts, data_len, status, produced)
    for i in np.flatnonzero(status != 0):
        errors.append(record_error(path, bufs[i], int(produced[i]), "decompress",
                                   f"{K.STATUS_TEXT[int(status[i])]} after {int(produced[i])} of "
                                   f"{int(data_len[i])} bytes; buffer skipped"))
    # Read-only, as the mapped bytes of an uncompressed partition are: numba compiles a kernel once per
    # signature, and a writable blob would double the kernels that read it (compile time on a fresh
    # machine, and what each worker's warm-up loads).
    blob.flags.writeable = False
    return blob, starts, np.where(status != 0, 0, data_len), errors, int(bad.sum() + (status != 0).sum())


def map_range(path: str, lo: int, hi: int) -> np.ndarray:
    """Bytes [lo, hi) of the file (fewer if it is shorter now), memory-mapped read-only.

    The trace is usually in the page cache already: mapping it costs no copy and no fresh memory. A
    read into a new array touched a fresh 32 MiB per partition, and on VMs whose host backs guest memory
    lazily each fresh page is a fault into the host.
    Records are walked where they lie; nothing that outlives the task points into the map. A URL
    (:mod:`pipeline.sources`) is read with one ranged request instead."""
    if sources.is_url(path):
        return np.frombuffer(sources.read_range(path, lo, hi), np.uint8)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        end = min(hi, size)
        if end <= lo:
            return np.zeros(0, np.uint8)
        base = lo - lo % mmap.ALLOCATIONGRANULARITY
        mm = portable.map_read(f.fileno(), end - base, offset=base)
    return np.frombuffer(mm, np.uint8, count=end - lo, offset=lo - base)


def interpret(b: Batch) -> list[tuple]:
    """Layer 3 for one partition: run the dispatch table, send the rest to ``events``; returns the
    partition's event counts [(provider_guid, opcode, event_id, version, header_type, count)]. The walk has
    given each record its event kind (``batch.Kinds``): the dispatch looks up each kind once."""
    kinds = b.kinds.keys
    providers = _GROUP_PROVIDERS + [str(uuid.UUID(bytes_le=bytes(b.blob[o:o + 16]))) for o in b.kinds.guid_offsets.tolist()]
    extractors: list = []
    ext_of_kind = np.full(len(kinds) + 1, -1, np.int32)
    for j, k in enumerate(kinds.tolist()):
        fn = lookup(providers[k >> 48], (k >> 40) & 0xFF, (k >> 24) & 0xFFFF, (k >> 8) & 0xFFFF, k & 0xFF)
        if fn is not None:
            if fn not in extractors:
                extractors.append(fn)
            ext_of_kind[j] = extractors.index(fn)
    # Records grouped by extractor with one counting sort; each extractor gets its records in record order.
    order, bounds = K.group_by_code(ext_of_kind[b.c["kind"]], len(extractors))
    for e, fn in enumerate(extractors):
        idx = order[bounds[e]:bounds[e + 1]]
        if len(idx):
            fn(b, idx)
    with_ext = np.flatnonzero(b.c["ext_len"] > 0)
    if len(with_ext):
        extended_stacks(b, with_ext)
    rest = np.flatnonzero(~b.consumed)
    if len(rest):
        code = (kinds >> np.uint64(48)).astype(np.int32)[b.c["kind"][rest]]
        b.emit("events", {
            **b.common(rest),
            "provider_guid": pa.DictionaryArray.from_arrays(pa.array(code, pa.int32()), pa.array(providers)),
            "opcode": b.c["opcode"][rest], "event_id": b.c["event_id"][rest], "version": b.c["version"][rest],
            "header_type": b.c["htype"][rest], "pid": b.c["pid"][rest].view(np.int32),
            "tid": b.c["tid"][rest].view(np.int32), "payload_len": b.c["pay_len"][rest],
            "buffer_index": np.ascontiguousarray(b.bufs["index"])[b.c["rbuf"][rest]],
        })
    return [(providers[k >> 48], (k >> 40) & 0xFF, (k >> 24) & 0xFFFF, (k >> 8) & 0xFFFF, k & 0xFF, n)
            for k, n in zip(kinds.tolist(), b.kinds.counts.tolist())]


def write_parts(b: Batch, part: int, out_dir: Path, scratch_dir: Path) -> WrittenParts:
    """One file per table: final tables into the stage directory (parquet, zstd); the event-like scratch
    tables of the bucket joins (``scratch.BUCKETED``) as Arrow IPC files; other ``_`` scratch
    tables into the scratch directory as uncompressed parquet (they live for seconds), or, when they are
    small (``INLINE_BYTES``: process, thread and image events, usually), handed back to the client in the
    result, which writes them together (``InlineScratch``): ten files less per partition. Dictionary pages
    only for text columns: numeric columns compress better and faster without. Samples and heap events
    whose stack is complete are written final here (``settle_samples``, ``settle_heap_events``); samples
    whose stack keys are (``settle_keyed_samples``) are left for one task of their own. Returns what was
    written, for the task's result (``tasks.WrittenParts``; among its ``scratch_rows`` the samples settled by
    their stack keys, ``KEYED_SAMPLES``)."""
    written: dict[str, str] = {}
    sources: dict[str, tuple[str, int, int]] = {}
    rows: dict[str, int] = {}
    inline: dict[str, pa.Table] = {}
    times = []
    tables = {table: pa.concat_tables(pieces, promote_options="permissive") for table, pieces in b.out.items()}
    settled: dict[str, int] = {}
    if "_samples" in tables:
        refs = tables.get("_stack_refs")
        usable = refs is not None and "_rec" in refs.column_names
        tables["_samples"], refs = adopt_pieces(tables["_samples"], refs if usable else EMPTY_REFS, b.c["rbuf"])
        if usable:
            tables["_stack_refs"] = refs
    # Samples and heap events with a complete stack are written final here; the rest go through the buckets.
    def keys(table: str, ts: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (time, thread) of a table's rows, as ``settle_*`` take the rows that could share a stack."""
        t = tables.get(table)
        return [(t.column(ts).to_numpy(), t.column("tid").to_numpy())] if t is not None and t.num_rows else []

    def stacked_keys(*but: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """``keys`` of every ``THREAD_STACKED`` scratch table but ``but``."""
        return [k for t in THREAD_STACKED if t.scratch not in but for k in keys(t.scratch, "timestamp")]

    stacks = Stacks.empty()
    heap_final = 0
    if "_heap_events" in tables and "_stack_refs" in tables and "_rec" in tables["_stack_refs"].column_names:
        final, tables["_heap_events"], tables["_stack_refs"], stacks = settle_heap_events(
            tables["_heap_events"], tables["_stack_refs"], b.c["rbuf"],
            keys("_samples", "timestamp") + stacked_keys("_heap_events"), tables.get("_virtual_allocs"))
        if final is not None:
            written["heap_events"] = write_final(final, out_dir / "heap_events.parquet", part, prefix="partition-")
            heap_final = final.num_rows
    if "_samples" in tables and "_stack_refs" in tables and "_rec" in tables["_stack_refs"].column_names:
        keyed, tables["_samples"], tables["_stack_refs"], claimed = settle_keyed_samples(
            tables["_samples"], tables["_stack_refs"], b.c["rbuf"], stacked_keys(), tables.get("_virtual_allocs"))
        if keyed is not None:       # (a source of its own task, not of the buckets: its times are not planned)
            _write_bucketed(keyed, KEYED_SAMPLES, part, scratch_dir, sources, rows)
            settled["stack_keys_with_samples"] = claimed
    if "_samples" in tables:
        final, tables["_samples"], sample_stacks, counts = settle_samples(
            tables["_samples"], keys("_stack_refs", "event_ts") + stacked_keys(),
            tables.get("_virtual_allocs"), (b.consts["header_ts"], b.consts["perf_freq"]))
        if final is not None:
            written["samples"] = write_final(final, out_dir / "samples.parquet", part, prefix="partition-",
                                             extra_delta=("stream_pos",))
            stacks = stacks.plus(sample_stacks)
        settled.update(counts)
    if len(stacks.sid):
        small = stacks.tables(-1 - part)
        if sum(t.get_total_buffer_size() for t in small.values()) <= INLINE_BYTES:
            tables.update(small)        # (back with the result, as other small scratch tables: not remembered)
        else:
            W.write_stack_rows(stacks, part, scratch_dir)
    if heap_final:
        settled["heap_events_final_in_partitions"] = heap_final
    for table, data in tables.items():
        if "_rec" in data.column_names:
            data = data.drop_columns(["_rec"])
        if table == "_stack_refs":
            # Full stacks (kind 0) are pieces as they are; key references wait for their definitions.
            kind = data.column("kind").to_numpy()
            full = kind == 0
            if full.any():
                stacks = data if full.all() else data.filter(pa.array(full))
                times.append(_write_bucketed(pack_hashes(stacks.drop_columns(["kind", "key"]).append_column(
                    "valid", pa.array(np.ones(stacks.num_rows, np.uint8)))), "_pieces", part, scratch_dir, sources, rows))
            if full.all():
                continue
            # Key references: resolved in the buckets, against every definition of the trace.
            keyed = data.filter(pa.array(~full)).select(KEYED_REF_COLUMNS)
            times.append(_write_bucketed(keyed, "_keyed_refs", part, scratch_dir, sources, rows))
            continue
        if table in BUCKETED:
            times.append(_write_bucketed(data, table, part, scratch_dir, sources, rows))
            continue
        if table == W.FRAMES and data.get_total_buffer_size() > INLINE_BYTES:
            W.write_frame_rows(data, part, scratch_dir)
            continue
        if table.startswith("_") and data.get_total_buffer_size() <= INLINE_BYTES:
            inline[table] = data
            continue
        directory = (scratch_dir if table.startswith("_") else out_dir) / f"{table}.parquet"
        directory.mkdir(parents=True, exist_ok=True)
        # (a partition's own name: buckets write part-<bucket> into some of these directories)
        target = directory / f"partition-{part:05d}.parquet"
        write_part(data, target, compression="none" if table.startswith("_") else "zstd",
                   use_dictionary=text_columns(data.schema))
        written[table] = str(target)
    return WrittenParts(tables=written, times=np.concatenate(times) if times else np.zeros(0, np.int64),
                        sources=sources, scratch_rows=rows, inline=inline, settled=settled)


def _write_bucketed(data: pa.Table, table: str, part: int, scratch_dir: Path, sources: dict, rows: dict) -> np.ndarray:
    """The partition's IPC scratch file of ``table`` (a bucket source, or ``KEYED_SAMPLES``), registered in
    ``sources`` and ``rows``; returns the sample of its times."""
    directory = scratch_dir / f"{table}.arrow"
    directory.mkdir(parents=True, exist_ok=True)
    times, sources[table] = write_scratch(data, BUCKETED.get(table, "timestamp"), directory / f"part-{part:05d}.arrow")
    rows[sources[table][0]] = data.num_rows
    return times
