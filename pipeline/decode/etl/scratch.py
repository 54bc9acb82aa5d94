"""Scratch files of the ETL decode: what partitions write for the bucket joins and the final parts.

The event-like scratch tables (``BUCKETED``) are Arrow IPC files with their time range (``write_scratch``),
read back by time range through a memory map (``read_bucket``, ``read_samples``); stack pieces carry their
frame hashes as a dictionary column (``pack_hashes``). Final parts are parquet (``write_final``,
``write_part``) with the schemas of ``tables.OUTPUT``. ``sort_order`` is the stable multi-key sort both
sides use.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numba as nb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import portable
from pipeline.decode.etl.batch import unique_pairs
from pipeline.decode.etl.kernels import JIT
from pipeline.decode.etl.tables import OUTPUT, THREAD_STACKED

#: Scratch tables that partitions write for the bucket joins: table -> time column.
BUCKETED = {"_samples": "timestamp", "_pieces": "event_ts", "_keyed_refs": "event_ts", "_virtual_allocs": "timestamp",
            **{t.scratch: "timestamp" for t in THREAD_STACKED}}


#: The scratch table of the samples settled by their stack keys (``settle_keyed_samples``): one file per
#: partition, each the source of one ``keyed_samples_task``, not of the buckets.
KEYED_SAMPLES = "_keyed_samples"


#: A stack-key reference as partitions write it for the buckets (``resolve_keys`` makes it a piece).
KEYED_REF_COLUMNS = ["event_ts", "tid", "pid", "cpu", "timestamp", "stream_pos", "user", "key"]


#: Every STRIDE-th time of a scratch file (record order) is returned to the planner.
STRIDE = 1024


I64_MIN = int(np.iinfo(np.int64).min)


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


def mapped(path: str) -> pa.Buffer:
    """A file, memory-mapped read-only (on Linux in one call: a bucket reads most of each scratch file it opens,
    and mapping it at once costs a third less than faulting it in page by page)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return pa.py_buffer(b"")
        return pa.py_buffer(portable.map_read(f.fileno(), size))


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


#: Fields of a distinct adopted stack (the dictionary of a sample's ``adopted`` column): its id and check,
#: the hashes and frame count of its kernel piece and its user piece (0 for none), and the process the
#: pieces name.
ADOPTED_FIELDS = ("stack_id", "id_check", "k_h1", "k_h2", "k_n", "u_h1", "u_h2", "u_n", "pid")


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
    order = sort_order(column_array(t, "timestamp"), column_array(t, "cpu", np.int64), column_array(t, "stream_pos"))
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


def file_rows(path: str) -> int:
    """Rows of a scratch file, from its footer."""
    reader = pa.ipc.open_file(pa.memory_map(path))
    return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def column_array(t: pa.Table, name: str, dtype=None) -> np.ndarray:
    a = t.column(name).to_numpy()
    return a if dtype is None else a.astype(dtype, copy=False)


def sorted_rows(paths: list[str], lo: int, hi: int) -> pa.Table | None:
    """The bucket's rows in (time, cpu, stream position) order: the sort keys are copied out of the
    memory-mapped files, the other columns only once, by the final take."""
    t = read_bucket(paths, "timestamp", lo, hi, combine=False)
    if t is None:
        return None
    order = sort_order(column_array(t, "timestamp"), column_array(t, "cpu", np.int64), column_array(t, "stream_pos"))
    return t.take(order)


def write_final(table: pa.Table, directory: Path, k: int, prefix: str = "part-", extra_delta: tuple[str, ...] = ()) -> str:
    """One part of the output table that ``directory`` holds (``<table>.parquet``), cast to that table's schema
    (``tables.OUTPUT``: its NOT NULL columns, and text for the dictionary columns of scratch, e.g. heap
    events' ``kind``); returns its path."""
    table = table.cast(OUTPUT[directory.name.removesuffix(".parquet")].schema)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{prefix}{k:05d}.parquet"
    # Dictionary pages for text, and for stack ids and instruction pointers (few distinct values per
    # part; parquet falls back to plain pages when a dictionary grows past 1 MB). Time columns are
    # sorted: delta encoding. On the samples of the 1 GB synth trace both together: 47 -> 14 MB, and
    # a 25 % faster write.
    text = text_columns(table.schema) + [c for c in ("stack_id", "ip") if c in table.column_names]
    # stream_pos too, in the parts that partitions write (record order: it grows within each buffer), which
    # writes them faster and smaller. In time order (the buckets' parts) it is not sorted, and plain pages were
    # smaller.
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
        portable.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def stack_column(ids: np.ndarray) -> pa.Array:
    return pa.array(ids, pa.int64(), mask=ids < 0)
