"""ETL per-event joins in time buckets (``pipeline/decode/etl/buckets.py``).

The answer must not depend on how the trace is cut: every synthesized variant (full stacks and stack
keys, both pointer sizes, compressed) is decoded with the default sizes and again with tiny partitions
and buckets (hundreds of each, so stack halves, key definitions and VirtualAlloc links fall in other
partitions), and every per-event table and the stacks must come out identical, row for row, in order.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from pipeline.decode.etl import buckets, joins
from pipeline.decode.etl import kernels as K
from pipeline.runs import read_manifest, read_table
from tests.synth_traces import synth_traces  # noqa: F401

TABLES = ("samples", "stacks", "virtual_allocs", "heap_events", "heap_snapshot_blocks", "event_stacks",
          "processes", "threads")


@pytest.mark.parametrize("name", ["plain64", "xpress32_cached", "plain64_cached"])
def test_tables_do_not_depend_on_partition_or_bucket_size(synth_traces, dask_pool, tmp_path, name):  # noqa: F811
    from pipeline import decode
    from pipeline.config import Config

    runs = {}
    for tag, sizes in (("default", {}), ("tiny", {"partition_bytes": 64 << 10, "bucket_rows": 1000})):
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
        assert a.equals(b), table
    _only_common_encodings(runs["default"])
    samples = read_table(runs["tiny"], "decoded", "samples")
    ts = samples.column("timestamp").to_numpy()
    assert (np.diff(ts) >= 0).all()                     # parts in name order are in time order
    assert samples.column("stack_id").null_count < samples.num_rows // 10
    for key in ("samples", "samples_with_stack", "stacks", "stack_keys", "stack_keys_unresolved"):
        assert etl["tiny"][key] == etl["default"][key], key
    assert etl["tiny"]["bucket_rows_lost"] == etl["default"]["bucket_rows_lost"] == 0


def test_buckets_cover_every_time_once(tmp_path):
    """Whatever the times (both int64 extremes included), every row lands in exactly one bucket."""
    rng = np.random.default_rng(5)
    ts = np.concatenate([rng.integers(-10**15, 10**15, 50_000), [np.iinfo(np.int64).min, np.iinfo(np.int64).max] * 3,
                         np.full(3000, 77)])
    paths, samples = [], []
    for i, part in enumerate(np.array_split(rng.permutation(ts), 7)):
        path = tmp_path / f"part-{i}.arrow"
        sample, source = buckets.write_scratch(pa.table({"timestamp": part, "row": np.arange(len(part))}), "timestamp", path)
        samples.append(sample)
        paths.append(source)
    plan = buckets.plan(samples, rows_per_bucket=4000, min_buckets=2)
    assert len(plan) > 5 and plan[-1][1] is None
    got = [buckets.read_bucket(buckets.overlapping(paths, lo, hi), "timestamp", lo, hi) for lo, hi in plan]
    seen = np.sort(np.concatenate([t.column("timestamp").to_numpy() for t in got if t is not None]))
    assert np.array_equal(seen, np.sort(ts))
    equal = [t for t in got if t is not None and 77 in t.column("timestamp").to_numpy()]
    assert len(equal) == 1                              # equal times never straddle buckets


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
    out = [np.empty(n, t) for t in (np.int64, np.int64, np.uint32, np.uint32, np.uint64, np.uint64, np.int64, np.int32)]
    # Stored shuffled, read in order through the permutation, as the buckets read their pieces.
    perm = np.random.default_rng(n).permutation(n)
    stored = [a[perm] for a in arrays.values()]
    assert buckets.group_pieces(np.argsort(perm), *stored, *out) == 1
    sid, check = np.empty(1, np.int64), np.empty(1, np.uint64)
    K.stack_ids(out[4][:1], out[5][:1], out[6][:1], sid, check)
    return int(sid[0])


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
    leaves an error row naming the id."""
    scratch = tmp_path
    con = duckdb.connect()
    for name in joins.SCRATCH_TABLES:
        con.execute(f"CREATE TABLE {name} ({joins.EMPTY[name]})")
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
    errors: list = []
    stats = joins._stacks(con, scratch, errors, "trace.etl")
    assert stats == {"stacks": 2, "stack_id_collisions": 1}
    rows = dict(con.execute("SELECT stack_id, frames FROM stacks").fetchall())
    assert rows == {42: [10, 11], 43: [10, 11]}         # the list with the lower check value is kept
    assert len(errors) == 1 and errors[0]["kind"] == "stack_hash" and "stack id 42" in errors[0]["message"]


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
    runs = []
    for estimate in ([], [1e9], [80.0]):        # count first; estimate far too small; a fair estimate
        batch._record_size[:] = estimate
        cols, status, pos = batch.walk(blob, starts, lens)
        runs.append((cols, status.copy(), pos.copy()))
    base = runs[0]
    assert len(base[0]["ts"]) > 10_000
    for cols, status, pos in runs[1:]:
        assert all(np.array_equal(cols[k], base[0][k]) for k in base[0])
        assert np.array_equal(status, base[1]) and np.array_equal(pos, base[2])


#: Parquet encodings every DuckDB 1.x and pyarrow reads (BYTE_STREAM_SPLIT on integers, for one, needs a
#: DuckDB from mid-2026).
COMMON_ENCODINGS = {"PLAIN", "RLE", "BIT_PACKED", "PLAIN_DICTIONARY", "RLE_DICTIONARY", "DELTA_BINARY_PACKED"}


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
