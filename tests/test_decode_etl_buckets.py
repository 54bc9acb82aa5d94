"""ETL per-event joins in time buckets (``pipeline/decode/etl/buckets.py``).

The answer must not depend on how the trace is cut: every synthesized variant (full stacks and stack
keys, both pointer sizes, compressed) is decoded with the default sizes and again with tiny partitions
and buckets (hundreds of each, so stack halves, key definitions and VirtualAlloc links fall in other
partitions), and every per-event table and the stacks must come out identical, row for row, in order.
"""

from __future__ import annotations

import collections
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.decode.etl import buckets, joins, scratch, settle, settle_kernels, stackkeys, tables
from pipeline.decode.etl import kernels as K
from pipeline.runs import read_manifest, read_table

#: The global order of per-event rows.
ORDER = [("timestamp", "ascending"), ("cpu", "ascending"), ("stream_pos", "ascending")]
TABLES = ("samples", "stacks", "virtual_allocs", "heap_events", "heap_snapshot_blocks", "event_stacks",
          "processes", "threads")


@pytest.mark.parametrize("name", ["plain64", "xpress32_cached", "plain64_cached"])
def test_tables_do_not_depend_on_partition_or_bucket_size(synth_traces, dask_pool, tmp_path, name):
    from pipeline import decode
    from pipeline.config import Config

    runs = {}
    for tag, sizes in (("default", {}), ("tiny", {"partition_bytes": 64 << 10, "bucket_rows": 50})):
        cfg = Config()
        for k, v in sizes.items():
            setattr(cfg.decode, k, v)
        run = tmp_path / tag
        decode.run(run, cfg, dask_pool, inputs=[synth_traces[name].path])
        runs[tag] = run
    etl = {tag: read_manifest(run, "decoded")["etl"] for tag, run in runs.items()}
    assert etl["tiny"]["join_buckets"] > 10 * etl["default"]["join_buckets"]
    assert etl["tiny"]["partitions"] > 10 * etl["default"]["partitions"]
    for table in TABLES:
        a = read_table(runs["default"], "decoded", table)
        b = read_table(runs["tiny"], "decoded", table)
        assert a.num_rows > 0 or table in ("event_stacks", "heap_snapshot_blocks"), table
        if table == "samples":      # parts written by partitions (record order) and by buckets (time order)
            for run in runs.values():
                for part in sorted((run / "decoded" / "samples.parquet").glob("part-*.parquet")):
                    t = pq.read_table(part)
                    assert t.equals(t.sort_by(ORDER)), part.name
            a, b = a.sort_by(ORDER), b.sort_by(ORDER)
        assert a.equals(b), table
    _only_common_encodings(runs["default"])
    for run in runs.values():
        _every_part_has_the_output_schema(run)
    samples = read_table(runs["tiny"], "decoded", "samples")
    assert samples.column("stack_id").null_count < samples.num_rows // 10
    for key in ("samples", "samples_with_stack", "stacks", "stack_keys", "stack_keys_unresolved"):
        assert etl["tiny"][key] == etl["default"][key], key
    assert etl["tiny"]["bucket_rows_lost"] == etl["default"]["bucket_rows_lost"] == 0
    if name == "plain64":
        # Most samples took their stack pieces in their partition and were written there; the stacks whose
        # user half was logged on another CPU were put back together in the buckets: both paths ran, and the
        # tables are equal.
        assert etl["default"]["samples_adopted_stacks"] > 0.9 * etl["default"]["samples_with_stack"]
        assert etl["default"]["samples_final_in_partitions"] > 0.9 * etl["default"]["samples"]
        assert etl["tiny"]["samples_final_in_partitions"] > 0.5 * etl["tiny"]["samples"]
        heap = read_table(runs["default"], "decoded", "heap_events")
        with_stack = heap.num_rows - heap.column("stack_id").null_count
        assert etl["default"]["heap_events_final_in_partitions"] > 0.9 * with_stack
        assert etl["default"]["heap_events_final_in_partitions"] < heap.num_rows       # frees without a stack
        assert etl["default"]["adopted_stacks_rejoined"] > 0 and etl["tiny"]["adopted_stacks_rejoined"] > 0
    else:
        # Stack keys: most samples claimed the key references that follow them, and one task per partition
        # resolved them (their definitions come later in the trace); the rest went through the buckets.
        assert etl["default"]["samples_final_in_partitions"] == 0
        assert etl["default"]["samples_settled_by_keys"] > 0.9 * etl["default"]["samples"]
        assert etl["tiny"]["samples_settled_by_keys"] > 0.5 * etl["tiny"]["samples"]
        assert etl["default"]["samples_settled_by_keys"] < etl["default"]["samples"]


def test_frames_and_stacks_written_once_per_process_give_the_same_tables(synth_traces, dask_pool, tmp_path,
                                                                        monkeypatch):
    """The trace whose samples mostly have stacks of their own, cut into many partitions in one process with
    every frames and stacks table going through the write-once path (``INLINE_BYTES`` 0): fewer rows are
    written than the partitions produced, and the tables equal those of the default run on the cluster."""
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.decode.etl import partition as P
    from pipeline.decode.etl import workerstate as W

    trace = synth_traces["plain64_varied"].path
    decode.run(tmp_path / "default", Config(), dask_pool, inputs=[trace])
    offered, written = collections.Counter(), collections.Counter()
    real_new, real_frames, real_stacks = W._write_new, W.write_frame_rows, W.write_stack_rows

    def write_new(data, table, name, scratch_dir):
        written[table] += data.num_rows
        return real_new(data, table, name, scratch_dir)

    def write_frames(data, part, scratch_dir):
        offered["_stack_frames"] += data.num_rows
        return real_frames(data, part, scratch_dir)

    def write_stacks(stacks, part, scratch_dir):
        offered["_bucket_stacks"] += len(stacks.sid)
        return real_stacks(stacks, part, scratch_dir)

    monkeypatch.setattr(P, "INLINE_BYTES", 0)
    for name, fn in (("_write_new", write_new), ("write_frame_rows", write_frames), ("write_stack_rows", write_stacks)):
        monkeypatch.setattr(W, name, fn)
    cfg = Config()
    cfg.decode.partition_bytes = 256 << 10
    decode.run(tmp_path / "once", cfg, Pool(None), inputs=[trace])
    assert read_manifest(tmp_path / "once", "decoded")["etl"]["partitions"] > 10
    for table in ("_stack_frames", "_bucket_stacks"):
        assert 0 < written[table] < 0.8 * offered[table], (table, written[table], offered[table])
    for table in TABLES:
        a, b = (read_table(tmp_path / tag, "decoded", table) for tag in ("default", "once"))
        if table == "samples":
            a, b = a.sort_by(ORDER), b.sort_by(ORDER)
        assert a.equals(b), table


def test_buckets_cover_every_time_once(tmp_path):
    """Whatever the times (both int64 extremes included), every row lands in exactly one bucket."""
    rng = np.random.default_rng(5)
    ts = np.concatenate([rng.integers(-10**15, 10**15, 50_000), [np.iinfo(np.int64).min, np.iinfo(np.int64).max] * 3,
                         np.full(3000, 77)])
    paths, samples = [], []
    for i, part in enumerate(np.array_split(rng.permutation(ts), 7)):
        path = tmp_path / f"part-{i}.arrow"
        sample, source = scratch.write_scratch(pa.table({"timestamp": part, "row": np.arange(len(part))}), "timestamp", path)
        samples.append(sample)
        paths.append(source)
    plan = buckets.plan(samples, rows_per_bucket=4000, min_buckets=2)
    assert len(plan) > 5 and plan[-1][1] is None
    got = [scratch.read_bucket(scratch.overlapping(paths, lo, hi), "timestamp", lo, hi) for lo, hi in plan]
    seen = np.sort(np.concatenate([t.column("timestamp").to_numpy() for t in got if t is not None]))
    assert np.array_equal(seen, np.sort(ts))
    equal = [t for t in got if t is not None and 77 in t.column("timestamp").to_numpy()]
    assert len(equal) == 1                              # equal times never straddle buckets
    # Sized by the rows as counted, not by the samples (STRIDE rows each, an overcount per file).
    assert len(buckets.plan(samples, rows_per_bucket=len(ts), min_buckets=1, rows=len(ts))) == 1
    assert len(buckets.plan(samples, rows_per_bucket=len(ts), min_buckets=1)) == 2


@pytest.mark.kernels
def test_key_references_take_the_first_definition_at_or_after_them():
    """``positions`` (a hash table from key to its run of definitions, a search inside the run) against a
    brute-force search: keys defined several times, never, references before, between and after. And as
    the keyed-sample tasks call it: only the rows of one side, each at its time plus its offset."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        nd, nk = int(rng.integers(0, 2000)), int(rng.integers(1, 300))
        d_key = rng.integers(0, nk, nd).astype(np.uint64) * np.uint64(0xFFFF_F001)
        d_ts = rng.integers(0, 10**6, nd).astype(np.int64)
        o = np.lexsort((d_ts, d_key))
        d_key, d_ts = d_key[o], d_ts[o]
        key = rng.integers(0, nk + 5, 3000).astype(np.uint64) * np.uint64(0xFFFF_F001)
        ts = rng.integers(-10, 10**6 + 10, 3000).astype(np.int64)
        if nd:                                  # half of them exactly at a definition of their key
            at = rng.integers(0, nd, 1500)
            key[:1500], ts[:1500] = d_key[at], d_ts[at]
        defs = stackkeys.index_defs({"key": d_key, "timestamp": d_ts, "n": np.zeros(nd, np.int32)})
        got = stackkeys.positions(key, ts, defs)
        want = [next(iter(np.flatnonzero((d_key == k) & (d_ts >= t))), -1) for k, t in zip(key, ts)]
        assert got.tolist() == want
        sides = rng.integers(0, 4, 3000).astype(np.uint8)
        dt = rng.integers(0, 40, 3000).astype(np.uint16)
        got = np.full(3000, -1, np.int64)
        stackkeys.first_at_or_after(key, ts - dt, dt, sides, 2, d_ts, defs["index"].slots, defs["index"].a,
                                  defs["run_lo"], defs["run_hi"], got)
        assert got.tolist() == [w if s & 2 else -1 for w, s in zip(want, sides)]


def _piece_hash(frames: list[int]) -> tuple[int, int, int]:
    blob = np.array(frames, np.uint64).view(np.uint8)
    out = [np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.zeros(1, np.int32)]
    K.hash_frames_at(blob, np.zeros(1, np.int64), np.array([len(blob)], np.int64), np.array([8], np.int64), *out)
    return int(out[0][0]), int(out[1][0]), int(out[3][0])


def _group_id(pieces: list[list[int]]) -> int:
    """Stack id that ``group_pieces`` gives one group made of ``pieces`` in this order."""
    h = [_piece_hash(p) for p in pieces]
    n = len(pieces)
    arrays = dict(ev_ts=np.zeros(n, np.int64), tid=np.zeros(n, np.uint32), pid=np.zeros(n, np.uint32),
                  valid=np.ones(n, np.uint8), h1=np.array([x[0] for x in h], np.uint64),
                  h2=np.array([x[1] for x in h], np.uint64), count=np.array([x[2] for x in h], np.int64))
    out = buckets.PieceGroups(*(np.empty(n, t) for t in buckets.PieceGroups.DTYPES))
    # Stored shuffled, read in order through the permutation, as the buckets read their pieces.
    perm = np.random.default_rng(n).permutation(n)
    stored = tuple(a[perm] for a in arrays.values())
    assert buckets.group_pieces(np.argsort(perm), stored, tuple(out)) == 1
    sid, check = np.empty(1, np.int64), np.empty(1, np.uint64)
    K.stack_ids(out[4][:1], out[5][:1], out[6][:1], sid, check)
    return int(sid[0])


@pytest.mark.kernels
@pytest.mark.parametrize("distinct", [5, 40_000, 300_000])
def test_unique_pairs_in_order_of_first_appearance_for_few_and_many(distinct):
    """A partition of a trace with a few hundred thousand distinct stacks has that many distinct hash
    pairs: they are hashed in a table sized for them, with the same answer as the few-pairs case and as
    a brute-force pass."""
    from pipeline.decode.etl.batch import unique_pairs

    rng = np.random.default_rng(distinct)
    pool_a = rng.integers(0, 1 << 63, distinct, dtype=np.uint64)
    pool_b = rng.integers(0, 1 << 63, distinct, dtype=np.uint64)
    pool_b[1::2] = pool_b[0]          # pairs that share one half
    pick = rng.integers(0, distinct, 3 * distinct)
    a, b = pool_a[pick], pool_b[pick]
    first, code = unique_pairs(a, b)
    seen: dict[tuple[int, int], int] = {}
    want_first, want_code = [], []
    for i, pair in enumerate(zip(a.tolist(), b.tolist())):
        if pair not in seen:
            seen[pair] = len(want_first)
            want_first.append(i)
        want_code.append(seen[pair])
    assert first.tolist() == want_first and code.tolist() == want_code


@pytest.mark.kernels
def test_pair_set_tells_which_pairs_are_new_as_it_grows():
    from pipeline.decode.etl.batch import PairSet

    rng = np.random.default_rng(3)
    s, seen = PairSet(), set()
    for size in (10, 3000, 50_000, 7, 120_000):
        a = rng.integers(0, 5000, size, dtype=np.uint64)
        b = rng.integers(0, 40, size, dtype=np.uint64)
        new = s.add(a, b)
        want = []
        for pair in zip(a.tolist(), b.tolist()):
            want.append(pair not in seen)
            seen.add(pair)
        assert new.tolist() == want
    assert s.n == len(seen)


def test_a_process_writes_each_pieces_frames_once_per_decode_and_never_replaces_a_file(tmp_path):
    """``_stack_frames`` (and the partitions' stacks alike): a partition writes only the pieces this
    process has not written for the same scratch directory; a task run again writes a file beside the
    first (so what was remembered stays on disk); another decode, or the end of the partitions, starts
    over."""
    from pipeline.decode.etl import workerstate as W

    def frames(keys):
        return pa.table({"h1": pa.array([k for k, _ in keys], pa.uint64()), "h2": pa.array([k * 7 for k, _ in keys], pa.uint64()),
                         "frames": pa.array([[k, n] for k, n in keys], pa.list_(pa.uint64()))})

    def on_disk(scratch):
        parts = sorted((scratch / "_stack_frames.parquet").glob("*.parquet"))
        return parts, sorted(r["h1"] for part in parts for r in pq.read_table(part).to_pylist())

    one, two = tmp_path / "one", tmp_path / "two"
    W.release_freed_memory()
    W.write_frame_rows(frames([(1, 10), (2, 20), (3, 30)]), 0, one)
    W.write_frame_rows(frames([(2, 20), (3, 30), (4, 40)]), 1, one)
    W.write_frame_rows(frames([(1, 10), (4, 40)]), 2, one)              # nothing new: no file
    W.write_frame_rows(frames([(2, 20), (3, 30), (4, 40)]), 1, one)     # partition 1 again: nothing replaced
    parts, keys = on_disk(one)
    assert len(parts) == 2 and keys == [1, 2, 3, 4]
    W.write_frame_rows(frames([(1, 10), (5, 50)]), 0, two)              # another decode
    assert on_disk(two)[1] == [1, 5]
    W.release_freed_memory()
    W.write_frame_rows(frames([(5, 50), (6, 60)]), 3, two)              # after the partitions: starts over
    assert on_disk(two)[1] == [1, 5, 5, 6]


def test_a_process_writes_each_settled_stack_once_per_decode_with_its_pieces(tmp_path):
    from pipeline.decode.etl import workerstate as W
    from pipeline.decode.etl.stacks import Stacks

    def stacks(ids):         # stack i: pieces (i, 0) and, for odd i, (i, 1)
        owner = np.array([k for k, i in enumerate(ids) for _ in range(1 + i % 2)], np.int64)
        ordinal = np.array([o for i in ids for o in range(1 + i % 2)], np.int64)
        h1 = np.array([100 * i + o for i in ids for o in range(1 + i % 2)], np.uint64)
        return Stacks(np.array(ids, np.int64), np.array(ids, np.uint64) * 3, owner, ordinal, h1, h1 + 1)

    W.release_freed_memory()
    W.write_stack_rows(stacks([1, 2, 3]), 0, tmp_path)
    W.write_stack_rows(stacks([2, 3, 4, 5]), 1, tmp_path)
    W.release_freed_memory()
    rows = lambda t: sorted(tuple(r.values()) for p in (tmp_path / f"{t}.parquet").glob("*.parquet")  # noqa: E731
                            for r in pq.read_table(p).to_pylist())
    assert rows("_bucket_stacks") == [(1, 3, -1), (2, 6, -1), (3, 9, -1), (4, 12, -2), (5, 15, -2)]
    assert rows("_bucket_stack_pieces") == [
        (1, 3, -1, 0, 100, 101), (1, 3, -1, 1, 101, 102), (2, 6, -1, 0, 200, 201), (3, 9, -1, 0, 300, 301),
        (3, 9, -1, 1, 301, 302), (4, 12, -2, 0, 400, 401), (5, 15, -2, 0, 500, 501), (5, 15, -2, 1, 501, 502)]


@pytest.mark.kernels
def test_stack_id_is_a_hash_of_the_whole_frame_list():
    frames = [0xFFFFF80000001000 + 16 * i for i in range(7)] + [0x7FF600001000 + 32 * i for i in range(9)]
    whole = _group_id([frames])
    assert whole >= 0
    # However the list is cut into pieces, the id is the same...
    for cut in (1, 7, 8, 15):
        assert _group_id([frames[:cut], frames[cut:]]) == whole
    assert _group_id([frames[:3], frames[3:7], [], frames[7:]]) == whole
    # ...and any change of frames or order changes it.
    assert _group_id([frames[7:], frames[:7]]) != whole
    assert _group_id([frames[:-1]]) != whole
    assert _group_id([[0] + frames]) != whole
    assert _group_id([frames[:5] + [frames[6], frames[5]] + frames[7:]]) != whole
    # The same id as the heap-snapshot path, which hashes whole lists.
    lists = pa.array([frames, frames[:3]], pa.list_(pa.uint64()))
    h1, h2, count = np.empty(2, np.uint64), np.empty(2, np.uint64), np.empty(2, np.int64)
    K.hash_frame_lists(lists.offsets.to_numpy().astype(np.int64), lists.values.to_numpy(), h1, h2, count)
    sid, check = np.empty(2, np.int64), np.empty(2, np.uint64)
    K.stack_ids(h1, h2, count, sid, check)
    assert int(sid[0]) == whole and int(sid[1]) == _group_id([frames[:3]])


def test_two_frame_lists_with_one_id_are_reported(tmp_path):
    """A collision (forged here: the 62-bit id of one list given to another) keeps one list and
    leaves an error row naming the id, whether the lists come from the buckets or the heap snapshots."""
    scratch = tmp_path
    con = duckdb.connect()
    for name in joins.SCRATCH_TABLES:
        con.execute(f"CREATE TABLE {name} ({tables.SCRATCH[name].ddl})")
    con.execute("INSERT INTO _stack_frames VALUES (1, 1, [10, 11]), (2, 2, [20, 21, 22])")
    for k, (sid, check, h) in enumerate(((42, 7, 1), (42, 9, 2), (43, 5, 1))):
        d = scratch / "_bucket_stacks.parquet"
        d.mkdir(exist_ok=True)
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"stack_id": pa.array([sid], pa.int64()), "id_check": pa.array([check], pa.uint64()),
                                 "bucket": pa.array([k], pa.int32())}), d / f"part-{k}.parquet")
        d = scratch / "_bucket_stack_pieces.parquet"
        d.mkdir(exist_ok=True)
        pq.write_table(pa.table({"stack_id": pa.array([sid], pa.int64()), "id_check": pa.array([check], pa.uint64()),
                                 "bucket": pa.array([k], pa.int32()), "ord": pa.array([0], pa.int32()),
                                 "h1": pa.array([h], pa.uint64()), "h2": pa.array([h], pa.uint64())}),
                       d / f"part-{k}.parquet")
    # The heap snapshots' stacks: one the buckets have too (42, 7); one whose check is lower than the buckets'
    # list of that id (43): a second collision, which keeps the snapshot's list; and two lists of an id of
    # their own (44): a third.
    con.execute("INSERT INTO _heapsnap_stacks VALUES (0, 1, 42, 7, [10, 11]), (0, 2, 44, 1, [30]), "
                "(1, 3, 43, 3, [31, 32]), (1, 4, 44, 2, [33])")
    errors: list = []
    joins._bucket_stack_lists(con, scratch)
    stats = joins._stacks(con, errors, "trace.etl", tmp_path / "stacks.parquet")
    assert stats == {"stacks": 3, "stack_id_collisions": 3}
    rows = con.execute(f"SELECT stack_id, frames, depth FROM '{tmp_path / 'stacks.parquet'}'").fetchall()
    # one row per id, sorted by it, with the list of the lower check value
    assert rows == [(42, [10, 11], 2), (43, [31, 32], 2), (44, [30], 1)]
    assert [e["kind"] for e in errors] == ["stack_hash"] * 3
    assert "2 different frame lists share stack id 42" in errors[0]["message"] and "stack id 44" in errors[2]["message"]


def test_record_walk_sized_from_an_estimate_equals_the_counted_walk():
    """The one-pass walk (arrays sized from the previous partitions' mean record size) gives the counted
    walk's columns, also when the estimate is far too small and it has to count after all."""
    from pathlib import Path

    from pipeline.decode.etl import batch
    from pipeline.decode.etl.buffers import walk as walk_chain
    from pipeline.decode.etl.partition import read_buffers
    from tests.conftest import fixture_path

    path = fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl")
    _, bufs = walk_chain(Path(path))
    blob, starts, lens, _, _ = read_buffers(str(path), bufs)
    desc = np.zeros(len(bufs), [("cpu", "<u2"), ("stream_rank", "<i8")])
    desc["cpu"], desc["stream_rank"] = bufs["cpu"], np.arange(len(bufs))
    runs = []
    for estimate in ([], [1e9], [80.0]):        # count first; estimate far too small; a fair estimate
        batch._record_size[:] = estimate
        cols, kinds, status, pos = batch.walk(blob, starts, lens, desc)
        runs.append((cols, status.copy(), pos.copy(), kinds))
    base = runs[0]
    assert len(base[0]["ts"]) > 10_000 and len(base[3].keys) > 10
    for cols, status, pos, kinds in runs[1:]:
        assert all(np.array_equal(cols[k], base[0][k]) for k in base[0])
        assert np.array_equal(status, base[1]) and np.array_equal(pos, base[2])
        assert np.array_equal(kinds.keys, base[3].keys) and np.array_equal(kinds.counts, base[3].counts)


#: Parquet encodings every DuckDB 1.x and pyarrow reads (BYTE_STREAM_SPLIT on integers, for one, needs a
#: DuckDB from mid-2026).
COMMON_ENCODINGS = {"PLAIN", "RLE", "BIT_PACKED", "PLAIN_DICTIONARY", "RLE_DICTIONARY", "DELTA_BINARY_PACKED"}


def _every_part_has_the_output_schema(run):
    """Every part of the per-event tables, whoever wrote it (a partition, a keyed-sample task, a bucket, the
    empty table of a trace without such rows), has the table's schema, NOT NULL columns included, so that
    a reader of the whole directory sees one schema."""
    for table, schema in ((n, t.schema) for n, t in tables.OUTPUT.items()):
        target = run / "decoded" / f"{table}.parquet"
        parts = sorted(target.glob("*.parquet")) if target.is_dir() else [target]
        assert parts, table
        for part in parts:
            assert pq.read_schema(part).remove_metadata().equals(schema), part
    assert not tables.OUTPUT["samples"].schema.field("ip").nullable
    assert tables.OUTPUT["samples"].schema.field("stack_id").nullable


def _only_common_encodings(run):
    import pyarrow.parquet as pq

    seen = set()
    for path in sorted((run / "decoded").rglob("*.parquet")):
        if path.is_file():
            meta = pq.read_metadata(path)
            for rg in range(meta.num_row_groups):
                for c in range(meta.num_columns):
                    seen.update(meta.row_group(rg).column(c).encodings)
    assert seen and seen <= COMMON_ENCODINGS, seen - COMMON_ENCODINGS


KERNEL = [0xFFFFF80000001000 + 16 * i for i in range(5)]
USER = [0x7FF600001000 + 32 * i for i in range(4)]


def test_samples_adopt_only_the_pieces_that_directly_follow_them(tmp_path):
    """A sample adopts one kernel and one user piece of its (time, thread) from the next records of its
    buffer; anything less plain (two pieces of a side, another buffer, too late, two processes, out of
    reach, another thread) stays a piece for the buckets. Adopted pieces come back from scratch at their
    exact place in the order, and the sample's stack id is the one its pieces would give as a group."""
    rbuf = np.array([0] * 9 + [1] * 12 + [1] * 10, np.int32)
    sample_at = {0: (100, 1), 3: (200, 2), 6: (300, 3), 8: (400, 5), 10: (500, 6), 12: (600, 7), 15: (700, 8)}
    piece_rows = [  # record, event time, thread, user, pid, own time
        (1, 100, 1, False, 40, 101), (2, 100, 1, True, 40, 102),            # adopted: kernel + user
        (4, 200, 2, False, 40, 201), (5, 200, 2, False, 40, 202),           # two kernel pieces
        (7, 300, 4, False, 40, 301),                                        # another thread
        (9, 400, 5, False, 40, 401),                                        # next buffer
        (11, 500, 6, False, 40, 500 + settle_kernels.ADOPT_MAX_DT + 1),            # logged too late
        (13, 600, 7, False, 40, 601), (14, 600, 7, True, 41, 602),          # two processes
        (15 + settle.ADOPT_WINDOW + 1, 700, 8, False, 40, 701),            # out of reach
    ]
    recs = sorted(sample_at)
    samples = pa.table({"timestamp": np.array([sample_at[r][0] for r in recs], np.int64),
                        "cpu": np.full(len(recs), 3, np.uint16),
                        "stream_pos": (np.array(recs, np.int64) - np.where(rbuf[recs] == 1, 9, 0)) | (rbuf[recs].astype(np.int64) << 24),
                        "tid": np.array([sample_at[r][1] for r in recs], np.uint32),
                        "ip": np.arange(len(recs), dtype=np.uint64), "_rec": np.array(recs, np.int64)})
    hashes = [_piece_hash(USER if user else KERNEL) for _, _, _, user, _, _ in piece_rows]
    refs = pa.table({"event_ts": np.array([p[1] for p in piece_rows], np.int64),
                     "tid": np.array([p[2] for p in piece_rows], np.uint32), "user": [p[3] for p in piece_rows],
                     "pid": np.array([p[4] for p in piece_rows], np.uint32),
                     "timestamp": np.array([p[5] for p in piece_rows], np.int64),
                     "h1": np.array([h[0] for h in hashes], np.uint64), "h2": np.array([h[1] for h in hashes], np.uint64),
                     "n": np.array([h[2] for h in hashes], np.int32), "_rec": np.array([p[0] for p in piece_rows], np.int64)})
    out, left = settle.adopt_pieces(samples, refs, rbuf)
    adopted = out.column("adopted").combine_chunks()
    assert adopted.null_count == len(recs) - 1 and adopted.is_valid().to_pylist()[0]
    assert sorted(left.column("_rec").to_pylist()) == [p[0] for p in piece_rows[2:]]
    entry = adopted.dictionary[adopted.indices[0].as_py()].as_py()
    assert entry["stack_id"] == _group_id([KERNEL, USER]) and entry["pid"] == 40
    assert (entry["k_n"], entry["u_n"]) == (len(KERNEL), len(USER))

    # Through scratch: the sample's pieces come back exactly as they were logged.
    path = tmp_path / "part-00000.arrow"
    scratch.write_scratch(out.drop_columns(["_rec"]), "timestamp", path)
    s, d, unsorted = scratch.read_samples([str(path)], scratch.I64_MIN, None)
    a = buckets.Adopted(s, d, unsorted)
    sid, _ = a.stacks()
    assert sid.tolist() == [entry["stack_id"]] + [-1] * (len(recs) - 1)
    back = a.give_back(s, np.array([0]))
    assert back.column("timestamp").to_pylist() == [101, 102]
    assert back.column("stream_pos").to_pylist() == [1, 2] and back.column("cpu").to_pylist() == [3, 3]
    assert back.column("user").to_pylist() == [False, True] and back.column("pid").to_pylist() == [40, 40]
    assert back.column("h1").to_pylist() == [hashes[0][0], hashes[1][0]]
    assert not a.mask.any()


def test_small_scratch_tables_come_back_to_the_client_and_are_written_in_parts(tmp_path):
    """Partitions hand small scratch tables back in their results; the client writes each table as it
    gathers them, a part whenever ``flush_bytes`` have come together, and the rest at the end: all rows,
    none twice, and the results no longer carry them."""
    from pipeline.decode.etl.partition import InlineScratch
    from pipeline.decode.etl.tasks import PartitionResult

    sink = InlineScratch(tmp_path, flush_bytes=1000)          # ~400 bytes a table: a part every third
    results = [PartitionResult(tables={}, times=np.zeros(0, np.int64), sources={}, scratch_rows={}, settled={}, part=k,
                               inline={"_thread_events": pa.table({"tid": np.arange(k * 100, k * 100 + 100, dtype=np.uint32)}),
                                       "_process_events": pa.table({"pid": np.array([k], np.uint32)})})
               for k in range(7)]
    for r in results:
        sink.take(r)
    sink.close()
    assert all(r.inline == {} for r in results)
    threads = duckdb.sql(f"SELECT tid FROM read_parquet('{tmp_path}/_thread_events.parquet/*.parquet') ORDER BY tid")
    assert [t for (t,) in threads.fetchall()] == list(range(700))
    assert len(list((tmp_path / "_thread_events.parquet").glob("*.parquet"))) >= 3       # flushed on the way
    processes = duckdb.sql(f"SELECT pid FROM read_parquet('{tmp_path}/_process_events.parquet/*.parquet') ORDER BY pid")
    assert [p for (p,) in processes.fetchall()] == list(range(7))


def test_small_scratch_parts_keep_small_row_groups(tmp_path, monkeypatch):
    """The client's parts of small scratch tables keep row groups of about ``INLINE_BYTES``, the size of
    a partition's own part: DuckDB reads a row group's column at once, and the heap-snapshot assembly
    sorts the chunks' blobs within ``join_memory_limit`` (with 16 MB groups the 4 GB synth trace no
    longer fit in 64MB)."""
    import pyarrow.parquet as pq

    from pipeline.decode.etl import partition
    from pipeline.decode.etl.tasks import PartitionResult

    monkeypatch.setattr(partition, "INLINE_BYTES", 4000)
    sink = partition.InlineScratch(tmp_path)
    sink.take(PartitionResult(tables={}, times=np.zeros(0, np.int64), sources={}, scratch_rows={}, settled={},
                              inline={"_heapsnap_chunks": pa.table({"x": np.arange(10_000, dtype=np.uint32)})}))
    sink.close()
    (part,) = (tmp_path / "_heapsnap_chunks.parquet").glob("*.parquet")
    meta = pq.ParquetFile(part).metadata
    assert meta.num_rows == 10_000 and meta.num_row_groups == 10


def test_heap_snapshots_assembled_in_batches_equal_one_query(synth_traces, dask_pool, tmp_path, monkeypatch):
    """The chunks of heap snapshots are ordered by DuckDB in batches of snapshots that fit a share of
    ``join_memory_limit``; one snapshot per batch gives the same tables as one query for all (a trace
    with more snapshot data than the limit failed with DuckDB's out-of-memory error before)."""
    from pipeline import decode
    from pipeline.config import Config
    from pipeline.decode.etl import heapsnap

    runs = {}
    for tag, share in (("one query", heapsnap.BATCH_SHARE), ("per snapshot", 1 << 40)):
        monkeypatch.setattr(heapsnap, "BATCH_SHARE", share)
        runs[tag] = tmp_path / tag.replace(" ", "_")
        decode.run(runs[tag], Config(), dask_pool, inputs=[synth_traces["plain64"].path])
    for table in ("heap_snapshots", "heap_snapshot_blocks", "stacks"):
        a, b = (read_table(runs[tag], "decoded", table) for tag in runs)
        assert a.num_rows > 0 and a.equals(b), table
    assert read_manifest(runs["per snapshot"], "decoded")["etl"]["heap_snapshots"] > 1


def _refs(rows):
    """Stack pieces: (record, event time, thread, user, pid, own time)."""
    hashes = [_piece_hash(USER if user else KERNEL) for _, _, _, user, _, _ in rows]
    return pa.table({"event_ts": np.array([p[1] for p in rows], np.int64), "tid": np.array([p[2] for p in rows], np.uint32),
                     "user": [p[3] for p in rows], "pid": np.array([p[4] for p in rows], np.uint32),
                     "timestamp": np.array([p[5] for p in rows], np.int64),
                     "h1": np.array([h[0] for h in hashes], np.uint64), "h2": np.array([h[1] for h in hashes], np.uint64),
                     "n": np.array([h[2] for h in hashes], np.int32), "_rec": np.array([p[0] for p in rows], np.int64)})


@pytest.mark.kernels
def test_rows_with_a_complete_stack_are_settled_in_their_partition():
    """A sample or heap event whose stack is complete where it was logged (its user piece follows it; or,
    for the Idle and System processes, its kernel piece) is written by the partition; one that may still
    get a piece from elsewhere (a kernel piece only), or shares its (time, thread) with another row, is
    left for the buckets with its pieces."""
    rbuf = np.zeros(20, np.int32)
    # records: 0 sample (user process, k+u) | 3 sample (System, k only) | 5 sample (user process, k only)
    #          7 heap (k+u) | 10 heap (k only) | 12 heap (k+u, but a sample at 14 shares its time and thread)
    rows = [(1, 100, 1, False, 40, 101), (2, 100, 1, True, 40, 102), (4, 200, 2, False, 4, 201), (6, 300, 3, False, 40, 301),
            (8, 400, 5, False, 40, 401), (9, 400, 5, True, 40, 402), (11, 500, 6, False, 40, 501),
            (13, 600, 7, False, 40, 601), (17, 700, 8, False, 40, 701), (18, 700, 8, True, 40, 702)]
    # ... 14 sample (no piece follows) | 16 sample (k+u, but a stack link at 700 shares its time and thread)
    samples = pa.table({"timestamp": np.array([100, 200, 300, 600, 700], np.int64), "cpu": np.zeros(5, np.uint16),
                        "stream_pos": np.array([0, 3, 5, 14, 16], np.int64), "tid": np.array([1, 2, 3, 7, 8], np.uint32),
                        "ip": np.arange(5, dtype=np.uint64), "_rec": np.array([0, 3, 5, 14, 16], np.int64)})
    heap = pa.table({"timestamp": np.array([400, 500, 600], np.int64), "timestamp_ns": np.array([400, 500, 600], np.int64),
                     "cpu": np.zeros(3, np.uint16), "stream_pos": np.array([7, 10, 12], np.int64),
                     "pid": np.full(3, 40, np.uint32), "tid": np.array([5, 6, 7], np.uint32),
                     "kind": pa.DictionaryArray.from_arrays(pa.array([1, 1, 1], pa.int8()), pa.array(["create", "alloc"])),
                     **{c: np.zeros(3, np.uint64) for c in ("heap", "address", "size", "old_address", "old_size")},
                     "flags": np.zeros(3, np.uint32), "source": np.zeros(3, np.uint32), "_rec": np.array([7, 10, 12], np.int64)})
    samples, refs = settle.adopt_pieces(samples, _refs(rows), rbuf)
    assert samples.column("adopted").null_count == 1            # all but the last adopted what follows them
    sample_keys = [(samples.column("timestamp").to_numpy(), samples.column("tid").to_numpy())]
    final, rest, left, stacks = settle.settle_heap_events(heap, refs, rbuf, sample_keys, None)
    assert final.column("timestamp").to_pylist() == [400]
    assert final.column("stack_id").to_pylist() == [_group_id([KERNEL, USER])]
    assert rest.column("timestamp").to_pylist() == [500, 600]
    assert sorted(left.column("_rec").to_pylist()) == [11, 13]     # the pieces of the events left stay
    assert stacks.sid.tolist() == [_group_id([KERNEL, USER])]
    others = [(left.column("event_ts").to_numpy(), left.column("tid").to_numpy()),
              (rest.column("timestamp").to_numpy(), rest.column("tid").to_numpy()),
              (np.array([700], np.int64), np.array([8], np.uint32))]
    final, rest, stacks, counts = settle.settle_samples(samples, others, None, (0, 10_000_000))
    assert final.column("timestamp").to_pylist() == [100, 200]    # k+u; System with its kernel piece
    assert final.column("pid").to_pylist() == [40, 4]
    assert final.column("stack_id").to_pylist() == [_group_id([KERNEL, USER]), _group_id([KERNEL])]
    assert final.column("timestamp_ns").to_pylist() == [10_000, 20_000]
    assert rest.column("timestamp").to_pylist() == [300, 600, 700]  # kernel piece only; no piece; shared
    assert counts["samples"] == 2 and len(stacks.sid) == 2


@pytest.mark.kernels
@pytest.mark.parametrize("seed", range(4))
def test_unshared_rows_equal_a_pairwise_comparison(seed):
    """``unshared`` (bitmaps first, then an exact comparison of the rows whose bits are set twice) marks
    exactly the whole rows that share their (time, thread) with no other row and no row of the others, and
    their (time, cpu) with no VirtualAlloc event: rows drawn from few times, threads and cpus, so that every
    kind of sharing happens often, and enough of them that the bitmaps have thousands of collisions too."""
    rng = np.random.default_rng(seed)
    n, m, v = 60_000, 20_000, 3_000
    rows = pa.table({"timestamp": rng.integers(0, 40_000, n).astype(np.int64), "tid": rng.integers(0, 4, n).astype(np.uint32),
                     "cpu": rng.integers(0, 3, n).astype(np.uint16)})
    whole = rng.random(n) < 0.8
    others = [(rng.integers(0, 40_000, m).astype(np.int64), rng.integers(0, 4, m).astype(np.uint32)),
              (rng.integers(0, 40_000, m // 4).astype(np.int64), rng.integers(0, 4, m // 4).astype(np.uint32))]
    vallocs = pa.table({"timestamp": rng.integers(0, 40_000, v).astype(np.int64), "cpu": rng.integers(0, 3, v).astype(np.uint16)})
    ts, tid, cpu = (rows.column(c).to_numpy() for c in ("timestamp", "tid", "cpu"))
    keys = collections.Counter(zip(ts.tolist(), tid.tolist()))
    for o_ts, o_tid in others:
        keys.update(zip(o_ts.tolist(), o_tid.tolist()))
    va = set(zip(vallocs.column("timestamp").to_numpy().tolist(), vallocs.column("cpu").to_numpy().tolist()))
    expected = np.array([w and keys[(t, k)] == 1 and (t, c) not in va
                         for w, t, k, c in zip(whole.tolist(), ts.tolist(), tid.tolist(), cpu.tolist())])
    assert 0 < expected.sum() < whole.sum()
    assert np.array_equal(settle.unshared(rows, whole, others, vallocs), expected)
    assert np.array_equal(settle.unshared(rows, whole, others, None),
                          np.array([w and keys[(t, k)] == 1 for w, t, k in zip(whole.tolist(), ts.tolist(), tid.tolist())]))
