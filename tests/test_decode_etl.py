"""ETL decoder: golden counts against dissect.etl on every fixture, trace header facts, bad input.

dissect.etl (AGPL, test-only) is the independent decoder. Its quirks, normalized here: EVENT_HEADER
provider GUIDs come back byte-swapped (UUID(bytes=...) instead of bytes_le); for FULL_HEADER records its
``version`` is the whole Class dword (Type | Level << 8 | Version << 16).
"""

from __future__ import annotations

import collections
import shutil
import struct
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import Config, DecodeConfig
from pipeline.cluster import Pool
from pipeline.decode import run as decode_run
from pipeline.decode.etl import layout as L
from pipeline.errors import InputError
from pipeline.runs import read_manifest, read_table
from pipeline.units import Size
from tests.conftest import FIXTURES, fixture_path

ETL_FIXTURES = [
    "airbus/AMSITrace.etl", "airbus/ShutdownPerfDiagLogger.etl", "airbus/lxcore_kernel.etl",
    "msbuild/PerfViewData.etl", "perfview-net45-x86/PerfViewData.etl", "perfview-net452-x64/net.4.5.2.x64.etl",
    "perfview-small/SelfDescribingSingleEvent.etl", "perfview-small/gcevents.etl",
    "perfview-small/primitive-types.etl", "perfview-small/smallEtlFile.etl",
    "syzygy/image_data_32_v1.etl", "syzygy/image_data_64_v2.etl", "syzygy/process_data_32_v2.etl",
    "syzygy/process_data_64_v3.etl",
]
BIG = {"perfview-net45-x86/PerfViewData.etl", "perfview-net452-x64/net.4.5.2.x64.etl"}


def test_fixture_list_is_complete():
    on_disk = sorted(str(p.relative_to(FIXTURES / "etl")) for p in (FIXTURES / "etl").rglob("*.etl"))
    assert on_disk == sorted(ETL_FIXTURES)


def dissect_counts(path: Path) -> collections.Counter:
    from dissect.etl.etl import ETL

    counts: collections.Counter = collections.Counter()
    with open(path, "rb") as f:
        for buf in ETL(f).buffers():
            for rec in buf:
                h = rec.header
                ht = h._marker.header_type
                guid, opcode, version, event_id = h.provider_id, getattr(h, "opcode", None), h.version, 0
                if ht in (L.HT_EVENT32, L.HT_EVENT64):
                    guid = uuid.UUID(bytes_le=guid.bytes)
                    event_id = h.descriptor.id
                elif ht in (L.HT_FULL32, L.HT_FULL64, L.HT_INSTANCE32, L.HT_INSTANCE64):
                    opcode, version = version & 0xFF, version >> 16
                counts[(str(guid), opcode, event_id, version, ht)] += 1
    return counts


def decode_fixture(rel: str, run_dir: Path, pool: Pool, **decode) -> Path:
    cfg = Config(decode=DecodeConfig(**decode))
    decode_run(run_dir, cfg, pool, inputs=[fixture_path("etl/" + rel)])
    return run_dir


@pytest.fixture(scope="session")
def decoded(tmp_path_factory, dask_pool):
    """Every ETL fixture decoded once per session: the big two on the dask cluster, the rest inline."""
    runs = {}
    for rel in ETL_FIXTURES:
        run_dir = tmp_path_factory.mktemp("etl") / Path(rel).stem
        # A small partition size forces several partitions (and cross-partition joins) on the big traces.
        pool = dask_pool if rel in BIG else Pool(None)
        runs[rel] = decode_fixture(rel, run_dir, pool, partition_bytes=1 << 20)
    return runs


@pytest.mark.parametrize("rel", ETL_FIXTURES)
def test_event_counts_equal_dissect(decoded, rel):
    table = read_table(decoded[rel], "decoded", "event_counts").to_pylist()
    mine = collections.Counter({(r["provider_guid"], r["opcode"], r["event_id"], r["version"], r["header_type"]):
                                r["count"] for r in table})
    theirs = dissect_counts(fixture_path("etl/" + rel))
    assert sum(mine.values()) == sum(theirs.values())
    assert mine == theirs
    manifest = read_manifest(decoded[rel], "decoded")
    assert manifest["etl"]["records"] == sum(theirs.values())
    assert manifest["etl"]["buffers_skipped"] == 0
    assert read_table(decoded[rel], "decoded", "errors").num_rows == 0


def test_kernel_provider_guids(decoded):
    rows = read_table(decoded["perfview-net452-x64/net.4.5.2.x64.etl"], "decoded", "event_counts").to_pylist()
    by = {(r["provider_guid"], r["opcode"]): r["count"] for r in rows if r["header_type"] in L.SYSTEM_KINDS}
    assert by[("ce1dbfb4-137e-4da6-87b0-3f59aa102cbc", 46)] == 79_528           # SampledProfile
    assert by[("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3", 38)] == 7_046            # StackKeyUser
    assert ("2cb15d1d-5fc1-11d2-abe1-00a0c911f518", 10) in by                   # 0x030A = Image Load
    assert ("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", 10) not in by
    img = {(r["opcode"], r["version"]): r["count"] for r in rows if r["provider_guid"] == L.IMAGE_ID_GUID}
    assert img[(36, 2)] == 3_534                                                 # DbgID_RSDS


def test_trace_row(decoded):
    t = read_table(decoded["perfview-net452-x64/net.4.5.2.x64.etl"], "decoded", "trace").to_pylist()[0]
    assert (t["os_version"], t["os_build"], t["cpu_count"], t["pointer_size"]) == ("6.2", 9200, 8, 8)
    assert (t["buffers"], t["buffers_written"], t["compressed_buffers"]) == (360, 360, 359)
    assert (t["perf_freq"], t["clock_type"], t["log_format"]) == (10_000_000, 1, "2.0")
    assert t["logger_name"] == "Relogger" and t["events_lost"] == 0
    assert t["start_utc"] < t["end_utc"]
    amsi = read_table(decoded["airbus/AMSITrace.etl"], "decoded", "trace").to_pylist()[0]
    assert amsi["events_lost"] == 3 and amsi["os_build"] == 18362 and amsi["compressed_buffers"] == 0
    manifest = read_manifest(decoded["airbus/AMSITrace.etl"], "decoded")
    assert manifest["etl"]["events_lost"] == 3


def test_events_table_holds_the_rest(decoded):
    run = decoded["airbus/AMSITrace.etl"]
    events = read_table(run, "decoded", "events")
    assert events.num_rows == 21  # no typed table claims AMSI's TraceLogging events
    assert set(events.column("header_type").to_pylist()) == {L.HT_SYSTEM64, L.HT_EVENT64}


# --- layouts --------------------------------------------------------------------------------------
def test_layout_sizes_match_format_notes():
    assert L.BUFFER_HEADER.itemsize == L.BUFFER_HEADER_SIZE == 0x48
    offsets = {name: L.BUFFER_HEADER.fields[name][1] for name in L.BUFFER_HEADER.names}
    assert (offsets["saved_offset"], offsets["sequence"], offsets["processor_index"]) == (0x04, 0x18, 0x28)
    assert (offsets["offset"], offsets["buffer_flag"], offsets["buffer_type"]) == (0x30, 0x34, 0x36)
    assert {k: v[0] for k, v in L.HEADER_KINDS.items()} == {
        1: 0x20, 2: 0x20, 3: 0x18, 4: 0x18, 0x10: 0x10, 0x11: 0x10, 0x0A: 0x30, 0x14: 0x30,
        0x0B: 0x48, 0x15: 0x48, 0x12: 0x50, 0x13: 0x50}
    assert L.LOGFILE["buffers_lost"][:2] == (0x114, 0x10C) and L.LOGFILE["perf_freq"][:2] == (0x100, 0xF8)
    assert L.LOGFILE_HEADER_SIZE == {8: 0x118, 4: 0x110}
    # Payload layouts: x64 offsets from the notes, derived from (off32, pointers before the field).
    x64 = lambda spec: {k: L.host_offset(o, n, 8) for k, (o, n) in spec.items()}  # noqa: E731
    assert x64(L.IMAGE) == {"base": 0, "size": 8, "pid": 0x10, "checksum": 0x14, "time_date_stamp": 0x18,
                            "default_base": 0x20, "file_name": 0x38}
    assert x64(L.THREAD)["name"] == 0x48 and x64(L.THREAD)["win32_start_addr"] == 0x30
    assert x64(L.PROCESS)["sid"] == 0x24 and x64(L.PROCESS)["flags"] == 0x20
    assert x64(L.DBG_ID) == {"base": 0, "pid": 8, "guid": 0x0C, "age": 0x1C, "pdb_name": 0x20}
    assert x64(L.IMAGE_ID) == {"base": 0, "size": 8, "pid": 0x10, "time_date_stamp": 0x14, "file_name": 0x18}
    assert x64(L.VIRTUAL_ALLOC) == {"base": 0, "size": 8, "pid": 0x10, "flags": 0x14}
    assert max(x64(L.HEAP_ALLOC).values()) + 4 == 28 and max(x64(L.HEAP_REALLOC).values()) + 4 == 44
    assert max(x64(L.HEAP_FREE).values()) + 4 == 20


# --- bad input ------------------------------------------------------------------------------------
def _copy(rel: str, tmp_path: Path) -> Path:
    dst = tmp_path / Path(rel).name
    shutil.copyfile(fixture_path("etl/" + rel), dst)
    dst.chmod(0o644)
    return dst


def _run(path: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    decode_run(run_dir, Config(), Pool(None), inputs=[path])
    return run_dir


def test_not_an_etl_is_a_clear_error(tmp_path):
    bogus = tmp_path / "notes.etl"
    bogus.write_bytes(b"hello world, this is not a trace" * 10)
    with pytest.raises(InputError, match="notes.etl.*not an ETL trace"):
        _run(bogus, tmp_path)
    assert not (tmp_path / "run" / "decoded").exists()


def test_joins_out_of_memory_name_the_setting_and_write_nothing(tmp_path):
    """DuckDB out of memory in the joins (a limit below the validated minimum, set past the check as a
    too-large trace would hit the default): a clear error naming the trace and the setting, no output."""
    from pipeline.errors import ConfigError

    trace = fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl")
    cfg = Config(decode=DecodeConfig.model_construct(join_memory_limit=Size("8MB")))
    with pytest.raises(ConfigError, match=r"net\.4\.5\.2\.x64\.etl: .*decode\.join_memory_limit \(8MB\).*raise it"):
        decode_run(tmp_path / "run", cfg, Pool(None), inputs=[trace])
    assert not (tmp_path / "run" / "decoded").exists()


def test_truncated_file_decodes_what_is_there(tmp_path):
    src = _copy("airbus/ShutdownPerfDiagLogger.etl", tmp_path)
    data = src.read_bytes()
    cut = 10 * 0x10000 + 1234
    src.write_bytes(data[:cut])
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert [e["kind"] for e in errors] == ["truncated", "missing_buffers"]
    assert errors[0]["buffer_index"] == 10 and errors[0]["file_offset"] == 10 * 0x10000
    assert "buffer 10 at byte offset 0xa0000" in errors[0]["message"] and str(src) in errors[0]["message"]
    trace = read_table(run_dir, "decoded", "trace").to_pylist()[0]
    assert trace["buffers"] == 10 and trace["buffers_skipped"] == 1
    assert read_manifest(run_dir, "decoded")["etl"]["records"] > 0


def test_header_times_that_cannot_be_times_are_errors_not_crashes(tmp_path):
    """A logfile header whose StartTime and BootTime are beyond any date (a fuzzed header crashed the stage
    after every table was decoded): their UTC columns are empty, an error row names each field's offset,
    and the events decode as from the clean file. A zero EndTime is "not set", not an error."""
    clean = _run(fixture_path("etl/airbus/AMSITrace.etl"), tmp_path / "clean")
    src = _copy("airbus/AMSITrace.etl", tmp_path)
    data = bytearray(src.read_bytes())
    at = {name: L.LOGFILE_PAYLOAD_FILE_OFFSET + L.LOGFILE[name][0] for name in L.LOGFILE_TIMES}
    data[at["start_time_filetime"]:at["start_time_filetime"] + 8] = (L.MAX_FILETIME + 1).to_bytes(8, "little")
    data[at["boot_time_filetime"]:at["boot_time_filetime"] + 8] = (-5).to_bytes(8, "little", signed=True)
    data[at["end_time_filetime"]:at["end_time_filetime"] + 8] = bytes(8)
    src.write_bytes(bytes(data))
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert [(e["kind"], e["buffer_index"], e["file_offset"]) for e in errors] == [
        ("header", 0, at["start_time_filetime"]), ("header", 0, at["boot_time_filetime"])]
    assert all(str(src) in e["message"] and "is not a time" in e["message"] for e in errors)
    trace = read_table(run_dir, "decoded", "trace").to_pylist()[0]
    assert (trace["start_utc"], trace["end_utc"], trace["boot_utc"]) == (None, None, None)
    assert trace["start_filetime"] == L.MAX_FILETIME + 1 and trace["buffers_skipped"] == 0
    counts = lambda r: sorted(read_table(r, "decoded", "event_counts").to_pylist(), key=str)  # noqa: E731
    assert counts(run_dir) == counts(clean)


def test_corrupt_records_and_compressed_buffers_are_skipped_and_counted(tmp_path):
    src = _copy("perfview-net452-x64/net.4.5.2.x64.etl", tmp_path)
    data = bytearray(src.read_bytes())
    # Walk the chain to find buffers 5 and 9; garble the compressed stream of one, the sizes of the other.
    offs, off = [], 0
    while off < len(data):
        offs.append(off)
        off += int.from_bytes(data[off:off + 4], "little")
    b5, b9 = offs[5], offs[9]
    data[b5 + 0x48: b5 + 0x48 + 64] = b"\xff" * 64  # flags word 0xffffffff: all matches, bad offsets
    data[b9 + 0x04: b9 + 0x08] = (0x7FFFFFFF).to_bytes(4, "little")  # SavedOffset: absurd inflated size
    src.write_bytes(bytes(data))
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert {e["buffer_index"] for e in errors} == {5, 9}
    for e in errors:
        assert str(src) in e["message"] and f"buffer {e['buffer_index']} at byte offset" in e["message"]
        assert e["file_offset"] == offs[e["buffer_index"]]
    trace = read_table(run_dir, "decoded", "trace").to_pylist()[0]
    assert trace["buffers_skipped"] == 2 and trace["buffers"] == 360
    total = read_table(run_dir, "decoded", "event_counts").column("count").to_numpy().sum()
    assert 170_000 < total < 179_474


def test_garbage_inside_an_uncompressed_buffer(tmp_path):
    src = _copy("airbus/ShutdownPerfDiagLogger.etl", tmp_path)
    data = bytearray(src.read_bytes())
    # Buffer 3 (fixed 64 KB stride in this direct-session file): overwrite a record marker mid-buffer.
    pos = 3 * 0x10000 + 0x48
    for _ in range(20):  # step over 20 records
        size = int.from_bytes(data[pos + 4:pos + 6], "little")
        pos += (size + 7) & ~7
    data[pos:pos + 4] = b"\x01\x02\x03\x04"
    src.write_bytes(bytes(data))
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert len(errors) == 1 and errors[0]["kind"] == "record"
    assert errors[0]["file_offset"] == pos and errors[0]["buffer_index"] == 3
    assert f"0x{pos:x}" in errors[0]["message"]
    total = read_table(run_dir, "decoded", "event_counts").column("count").to_numpy().sum()
    assert 16_000 < total < 17_078


@pytest.mark.kernels
@pytest.mark.parametrize("seed", range(4))
def test_xpress_matches_of_every_distance_and_length_equal_an_independent_decoder(seed):
    """Streams from the synth encoder with matches at distances 1-40 and lengths 3-300 (the decoder copies
    words when a match is 8 or more bytes back, byte by byte when closer or near the end of the output),
    ending in a match: the output equals dissect.util's lzxpress, and no byte outside [d0, d1) of the
    destination changes."""
    from dissect.util.compression.lzxpress import decompress

    from pipeline.decode.etl import kernels as K
    from pipeline.decode.etl import xpress as X
    from pipeline.synth.xpress import compress

    rng = np.random.default_rng(seed)
    data = bytearray(rng.integers(0, 256, 64, dtype=np.uint8).tobytes())
    for _ in range(400):
        dist, length = int(rng.integers(1, 41)), int(rng.choice([3, 5, 7, 8, 9, 15, 16, 17, 31, 64, 300]))
        for _ in range(length):
            data.append(data[-dist])
        data.extend(rng.integers(0, 256, int(rng.integers(0, 3)), dtype=np.uint8).tobytes())
    for _ in range(int(rng.integers(8, 30))):       # a match 20 bytes back runs to the last byte
        data.append(data[-20])
    z = np.frombuffer(compress(bytes(data)), np.uint8)
    # (compiled and as plain Python; under NUMBA_DISABLE_JIT both are plain Python)
    for fn in dict.fromkeys((X.xpress_decompress, getattr(X.xpress_decompress, "py_func", X.xpress_decompress))):
        dst = np.full(len(data) + 64, 0xA5, np.uint8)
        assert fn(z, 0, len(z), dst, 32, 32 + len(data)) == (K.OK, len(data))
        assert dst[32:32 + len(data)].tobytes() == decompress(z.tobytes()) == bytes(data)
        assert (dst[:32] == 0xA5).all() and (dst[32 + len(data):] == 0xA5).all()


@pytest.mark.kernels
def test_random_bytes_never_crash_the_kernels():
    from pipeline.decode.etl import xpress as X
    from pipeline.decode.etl.batch import walk

    rng = np.random.default_rng(7)
    for trial in range(200):
        src = rng.integers(0, 256, size=int(rng.integers(1, 3000)), dtype=np.uint8)
        dst = np.zeros(int(rng.integers(1, 5000)), np.uint8)
        status, n = X.xpress_decompress(src, 0, len(src), dst, 0, len(dst))
        assert 0 <= n <= len(dst)
        blob = rng.integers(0, 256, size=4096, dtype=np.uint8)
        blob[2] = rng.choice([0x02, 0x11, 0x13, 0x14, 0x90])
        blob[3] = 0xC0
        cols, kinds, st, pos = walk(blob, np.array([0, 2048], np.int64), np.array([2048, 2048], np.int64))
        assert ((cols["roff"] >= 0) & (cols["roff"] + cols["rsize"] <= 4096)).all()
        assert ((cols["pay_off"] + cols["pay_len"]) <= cols["roff"] + cols["rsize"]).all()
        assert kinds.counts.sum() == len(cols["ts"]) and np.array_equal(np.bincount(cols["kind"], minlength=len(kinds.keys)), kinds.counts)


@pytest.mark.kernels
def test_a_partition_of_many_event_kinds_walks_into_larger_tables():
    """The walk numbers each record's event kind and provider GUID in small tables (a trace has tens of
    kinds); a partition with more (3,000 EVENT_HEADER records, each of its own provider and event id: what a
    hostile file may hold) is walked again into tables sized for every record, and numbers them in order."""
    from pipeline.decode.etl import layout as L
    from pipeline.decode.etl.batch import Kinds, walk

    n, size = 3000, 0x50
    recs = np.zeros((n, size), np.uint8)
    recs[:, 0:2] = np.frombuffer(np.uint16(size).tobytes(), np.uint8)
    recs[:, 2], recs[:, 3] = L.HT_EVENT64, 0xC0
    ids = np.arange(n, dtype=np.uint16)
    recs[:, L.EH_ID:L.EH_ID + 2] = ids.view(np.uint8).reshape(n, 2)
    recs[:, L.EH_GUID:L.EH_GUID + 8] = (ids.astype(np.uint64) * 7919).view(np.uint8).reshape(n, 8)
    blob = recs.reshape(-1)
    assert 2 * n > len(Kinds().key) + len(Kinds().g_lo)
    cols, kinds, status, _ = walk(blob, np.zeros(1, np.int64), np.array([len(blob)], np.int64))
    assert (status == 0).all() and len(cols["ts"]) == n
    assert np.array_equal(cols["kind"], np.arange(n)) and (kinds.counts == 1).all()
    assert np.array_equal((kinds.keys >> np.uint64(24)) & np.uint64(0xFFFF), ids)
    assert np.array_equal(kinds.keys >> np.uint64(48), 257 + np.arange(n))
    assert np.array_equal(kinds.guid_offsets, np.arange(n) * size + L.EH_GUID)


# --- stacks ---------------------------------------------------------------------------------------
KERNEL_SPACE = 0xFFFF_8000_0000_0000
USER_LIMIT = 0x0000_8000_0000_0000


def dissect_stack_facts(path: Path) -> tuple[set, list]:
    """(event_ts, tid) of every StackWalk record and (ts, tid) of every SampledProfile, from raw payload
    bytes as dissect.etl frames them (its StackWalk struct decoding is broken, the bytes are fine)."""
    import struct

    from dissect.etl.etl import ETL

    stacks, samples = set(), []
    with open(path, "rb") as f:
        for buf in ETL(f).buffers():
            for rec in buf:
                h = rec.header
                if h._marker.header_type not in (L.HT_PERFINFO64, L.HT_PERFINFO32):
                    continue
                hook = h.hook_id
                raw = bytes(h.payload)
                if hook == 0x1820:
                    stacks.add(struct.unpack_from("<qII", raw, 0)[::2])
                elif hook == 0x0F2E:
                    P = 8 if h._marker.header_type == L.HT_PERFINFO64 else 4
                    samples.append((h.time_delta, struct.unpack_from("<I", raw, P)[0]))
    return stacks, samples


def test_every_sample_with_stackwalk_records_gets_its_stack(decoded):
    rel = "perfview-net45-x86/PerfViewData.etl"
    stacks, samples = dissect_stack_facts(fixture_path("etl/" + rel))
    expected = {s for s in samples if s in stacks}
    assert len(samples) == 16_865 and len(expected) > 16_000
    table = read_table(decoded[rel], "decoded", "samples").to_pydict()
    got = {(t, tid) for t, tid, sid in zip(table["timestamp"], table["tid"], table["stack_id"]) if sid is not None}
    assert got == expected
    etl = read_manifest(decoded[rel], "decoded")["etl"]
    rows = sum(1 for s in samples if s in stacks)  # (time, thread) repeats across CPUs for the idle threads
    assert etl["samples_with_stack"] == etl["samples_with_stack_records"] == rows


def test_stack_keys_resolve_on_the_compressed_trace(decoded):
    rel = "perfview-net452-x64/net.4.5.2.x64.etl"
    etl = read_manifest(decoded[rel], "decoded")["etl"]
    assert etl["stack_keys"] == 2_061 + 7_046 and etl["stack_keys_unresolved"] == 0
    assert etl["samples_with_stack"] == etl["samples_with_stack_records"] > 6_000


@pytest.mark.parametrize("rel", sorted(BIG))
def test_stacks_are_deduplicated_kernel_frames_first(decoded, rel):
    stacks = read_table(decoded[rel], "decoded", "stacks").to_pydict()
    frames = [tuple(f) for f in stacks["frames"]]
    assert len(set(frames)) == len(frames) and all(frames)
    assert stacks["stack_id"] == sorted(set(stacks["stack_id"])) and min(stacks["stack_id"]) >= 0
    by_id = dict(zip(stacks["stack_id"], frames))
    # Leaf first, the kernel half before the user half: once a user frame appears, no kernel frame
    # follows -- except in user-mode callbacks (win32k calling back into user mode), a handful.
    used = set(read_table(decoded[rel], "decoded", "samples").column("stack_id").drop_null().to_pylist())
    sampled = [by_id[i] for i in sorted(used)]
    nested = sum(1 for f in sampled if [a >= KERNEL_SPACE for a in f] != sorted((a >= KERNEL_SPACE for a in f),
                                                                                reverse=True))
    assert nested < 0.01 * len(sampled)
    assert sum(1 for f in sampled if f[0] >= KERNEL_SPACE and f[-1] < USER_LIMIT) > 250  # halves joined


def user_frame_fraction(run_dir: Path) -> tuple[float, int, dict[int, int]]:
    """Fraction of user-mode sample frames inside an image of the sample's process loaded at that time,
    and {pid: frames outside every image of that process}."""
    import duckdb

    d = run_dir / "decoded"
    con = duckdb.connect()
    inside, total = con.execute(f"""
        WITH f AS (SELECT s.timestamp_ns AS t, s.pid, unnest(k.frames) AS addr
                   FROM '{d}/samples.parquet' s JOIN '{d}/stacks.parquet' k USING (stack_id)),
        u AS (SELECT * FROM f WHERE addr < {USER_LIMIT}),
        m AS (SELECT u.*, EXISTS (SELECT 1 FROM '{d}/images.parquet' i WHERE i.pid = u.pid
                                  AND u.addr >= i.base AND u.addr < i.base + i.size
                                  AND coalesce(i.load_ns, -1) <= u.t AND u.t <= coalesce(i.unload_ns, 1e18)) AS hit
              FROM u)
        SELECT count(*) FILTER (hit), count(*) FROM m""").fetchone()
    outside = dict(con.execute(f"""
        WITH f AS (SELECT s.pid, unnest(k.frames) AS addr
                   FROM '{d}/samples.parquet' s JOIN '{d}/stacks.parquet' k USING (stack_id))
        SELECT pid, count(*) FROM f WHERE addr < {USER_LIMIT} AND NOT EXISTS (
            SELECT 1 FROM '{d}/images.parquet' i WHERE i.pid = f.pid AND f.addr >= i.base AND f.addr < i.base + i.size)
        GROUP BY pid""").fetchall())
    return inside / total, total, outside


DOTNET_PROVIDERS = ("e13c0d23-ccbc-4e12-931b-d9cc2eee27e4", "a669021c-c450-4609-a035-5af59af4df18")


@pytest.mark.parametrize("rel,floor", [("perfview-net45-x86/PerfViewData.etl", 0.95),
                                       ("perfview-net452-x64/net.4.5.2.x64.etl", 0.70)])
def test_user_frames_fall_inside_images_except_jit_code(decoded, rel, floor):
    fraction, total, outside = user_frame_fraction(decoded[rel])
    print(f"{rel}: {fraction:.4f} of {total} user-mode frames inside a loaded image of the sample's process")
    assert fraction >= floor
    # Frames outside every image come from .NET processes (JIT-compiled code); native processes may
    # only have a trace of runtime-generated code (dwm.exe's WARP shader JIT: 15 frames in the x64 trace).
    events = read_table(decoded[rel], "decoded", "events", columns=["pid", "provider_guid"]).to_pydict()
    managed = {p for p, g in zip(events["pid"], events["provider_guid"]) if g in DOTNET_PROVIDERS}
    native_outside = sum(n for pid, n in outside.items() if pid not in managed)
    assert set(outside) & managed and native_outside <= 0.001 * total


# --- TraceEvent baseline ----------------------------------------------------------------------------
def baseline_events(name: str) -> list[tuple[int, str, dict[str, str]]]:
    rows = []
    for line in fixture_path(name).read_text().splitlines():
        if not line.startswith("EVENT "):
            continue
        head, _, rest = line[6:].partition(": ")
        kind, _, fields = rest.partition(" PID=")
        fields = "PID=" + fields
        values = dict(kv.split("=", 1) for kv in fields.split("; ") if "=" in kv)
        rows.append((int(head.replace(",", "").replace(".", "")), kind, values))  # microseconds
    return rows


def _int(text: str) -> int:
    return int(text.replace(",", ""), 0)


def _ms(ns: int | None) -> int | None:
    """Nanoseconds as TraceEvent prints milliseconds (3 decimals, half up), in integer microseconds."""
    return None if ns is None else (ns + 500) // 1000


def test_baseline_processes_threads_images_samples(decoded):
    rel = "perfview-net452-x64/net.4.5.2.x64.etl"
    run = decoded[rel]
    base = baseline_events("etl/perfview-net452-x64/net.4.5.2.x64.baseline.txt")
    procs = read_table(run, "decoded", "processes").to_pylist()
    threads = read_table(run, "decoded", "threads").to_pylist()
    images = read_table(run, "decoded", "images").to_pylist()
    samples = {(_ms(r["timestamp_ns"]), r["tid"]): r for r in read_table(run, "decoded", "samples").to_pylist()}
    names = {p["pid"]: p["image_name"] for p in procs}
    checked = collections.Counter()
    for ms, kind, v in base:
        if kind in ("Windows Kernel/Process/Start", "Windows Kernel/Process/DCStart"):
            col = "start_ns" if kind.endswith("/Start") else "first_seen_ns"
            (p,) = [p for p in procs if p["pid"] == _int(v["ProcessID"]) and _ms(p[col]) == ms]
            assert p["parent_pid"] == _int(v["ParentID"]) and p["image_name"] == v["ImageFileName"]
            if "CommandLine" in v and not v["CommandLine"].endswith("..."):
                assert p["command_line"] == v["CommandLine"]
            assert p["unique_process_key"] == _int(v["UniqueProcessKey"])
        elif kind in ("Windows Kernel/Thread/Start", "Windows Kernel/Thread/Stop"):
            col = "start_ns" if kind.endswith("/Start") else "end_ns"
            assert [t for t in threads if t["tid"] == _int(v["TID"]) and t["pid"] == _int(v["PID"])
                    and _ms(t[col]) == ms]
        elif kind in ("Windows Kernel/Image/Load", "Windows Kernel/Image/Unload", "Windows Kernel/Image/DCStart"):
            col = {"Load": "load_ns", "Unload": "unload_ns", "DCStart": "first_seen_ns"}[kind.rsplit("/", 1)[1]]
            (i,) = [i for i in images if i["base"] == _int(v["ImageBase"]) and _ms(i[col]) == ms]
            assert i["size"] == _int(v["ImageSize"]) and i["checksum"] == _int(v["ImageChecksum"])
            fname = v["FileName"]
            stem = fname[2:-3] if fname.endswith("...") else fname[2:]
            ours = i["file_name"].lower().replace("\\systemroot\\", "\\windows\\")  # TraceEvent maps NT paths
            assert stem.lower() in ours or fname.startswith("\\\\")
        elif kind == "Windows Kernel/PerfInfo/Sample":
            s = samples[(ms, _int(v["TID"]))]
            assert s["pid"] == _int(v["PID"]) and s["ip"] == _int(v["InstructionPointer"])
            assert names[s["pid"]].removesuffix(".exe") == v["PName"]
            assert s["cpu"] == _int(v["ProceNum"])
        else:
            continue
        checked[kind.rsplit("/", 1)[1]] += 1
    assert checked["Sample"] == 5 and checked["Load"] >= 4 and checked["DCStart"] >= 5
    assert checked["Start"] >= 4 and checked["Stop"] >= 4


def test_baseline_counts_of_kernel_events(decoded):
    """TraceEvent's COUNT lines for kernel events we type: image loads/unloads, process starts, image ids.

    (Its PerfInfo/Sample count, 6,320, is not the number of SampledProfile records, 79,528, which dissect
    and we both count: TraceEvent's baseline leaves out most idle-thread samples.)"""
    counts = {}
    text = fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.baseline.txt").read_text()
    for line in text.splitlines():
        if line.startswith("COUNT "):
            name, _, n = line[6:].rpartition(":")
            counts[name] = int(n)
    run = decoded["perfview-net452-x64/net.4.5.2.x64.etl"]
    images = read_table(run, "decoded", "images").to_pydict()
    assert sum(x is not None for x in images["load_ns"]) == counts["Windows Kernel/Image/Load"]
    assert sum(x is not None for x in images["unload_ns"]) == counts["Windows Kernel/Image/Unload"]
    procs = read_table(run, "decoded", "processes").to_pydict()
    assert sum(x is not None for x in procs["start_ns"]) == counts["Windows Kernel/Process/Start"]
    threads = read_table(run, "decoded", "threads").to_pydict()
    assert sum(x is not None for x in threads["start_ns"]) == counts["Windows Kernel/Thread/Start"]
    assert sum(x is not None for x in threads["end_ns"]) == counts["Windows Kernel/Thread/Stop"]
    dbg = read_table(run, "decoded", "event_counts").to_pylist()
    by = {(r["provider_guid"], r["opcode"]): r["count"] for r in dbg}
    assert by[(L.IMAGE_ID_GUID, 36)] == counts["KernelTraceControl/ImageID/DbgID_RSDS"]
    assert by[(L.IMAGE_ID_GUID, 0)] == counts["KernelTraceControl/ImageID"]
    ids = read_table(run, "decoded", "image_ids").to_pylist()
    ntdll = [r for r in ids if r["base"] == 0x7F9D02F0000 and r["pdb_name"] == "ntdll.pdb"]
    assert ntdll and ntdll[0]["pdb_guid"].startswith("6048fdb6-2dcd-41c1-8") and ntdll[0]["pdb_age"] == 2
    assert ntdll[0]["original_file_name"] == "ntdll.dll" and ntdll[0]["size"] == 1_826_816


def test_x86_image_ids_match_the_symbol_store(decoded):
    """The three PDBs shipped with the x86 fixture are named by DbgID_RSDS records of the trace."""
    ids = read_table(decoded["perfview-net45-x86/PerfViewData.etl"], "decoded", "image_ids").to_pylist()
    have = {(r["pdb_name"].rsplit("\\", 1)[-1].lower(), r["pdb_guid"].replace("-", "").upper() + str(r["pdb_age"]))
            for r in ids if r["pdb_name"]}
    store = fixture_path("etl/perfview-net45-x86/symbols")
    wanted = {(p.parent.parent.name.lower(), p.parent.name.upper()) for p in store.rglob("*.pdb") if p.is_file()}
    assert len(wanted) == 3 and wanted <= have


# --- VirtualAlloc and classic heap events: no fixture holds them, so build a tiny ETL byte by byte ----
# Offsets below are written from docs/etl-format.md (§1.2, §1.3, §2.2, §2.3, §3.2, §3.5, §3.7, §3.8),
# not taken from the decoder's layout module, so the test checks the decoder against the notes.


def _record(kind: str, hook: int, ts: int, payload: bytes, *, P: int = 8, tid: int = 0, pid: int = 0,
            version: int = 2) -> bytes:
    if kind == "system":   # SYSTEM_TRACE_HEADER, 0x20 bytes
        head_type = 0x02 if P == 8 else 0x01
        size = 0x20 + len(payload)
        head = struct.pack("<HBBHHIIqII", version, head_type, 0xC0, size, hook, tid, pid, ts, 0, 0)
    else:                  # PERFINFO_TRACE_HEADER, 0x10 bytes
        head_type = 0x11 if P == 8 else 0x10
        size = 0x10 + len(payload)
        head = struct.pack("<HBBHHq", version, head_type, 0xC0, size, hook, ts)
    rec = head + payload
    return rec + b"\0" * (-len(rec) % 8)


def _buffer(records: list[bytes], *, size: int, cpu: int, seq: int, buffer_type: int = 0) -> bytes:
    body = b"".join(records)
    fill = 0x48 + len(body)
    head = struct.pack("<IIIiqqQHHIIHH16s", size, fill, fill, 0, 0, seq, 0, cpu, 0, 3, fill,
                       0x20 | 0x01, buffer_type, b"")
    assert len(head) == 0x48
    return (head + body).ljust(size, b"\xff")


def tiny_etl(path: Path, more0: tuple = (), more1: tuple = ()) -> Path:
    """Header buffer + one buffer per CPU with thread rundown, VirtualAlloc/Free, heap events and stacks
    (and the records ``more0`` and ``more1`` at the end of CPU 0's and CPU 1's buffer)."""
    size, start_ft = 0x1000, 133_000_000_000_000_000
    logfile = bytearray(0x118)
    struct.pack_into("<I4BII", logfile, 0x00, size, 10, 0, 1, 5, 19041, 2)
    struct.pack_into("<q", logfile, 0x10, start_ft + 10_000)           # EndTime
    struct.pack_into("<I", logfile, 0x24, 3)                           # BuffersWritten
    struct.pack_into("<III", logfile, 0x2C, 8, 0, 3000)                # PointerSize, EventsLost, MHz
    struct.pack_into("<qq", logfile, 0x100, 10_000_000, start_ft)       # PerfFreq, StartTime
    struct.pack_into("<I", logfile, 0x110, 1)                          # ClockType QPC
    names = "tiny\0".encode("utf-16-le") + "tiny.etl\0".encode("utf-16-le")
    header = _record("system", 0x0000, 1000, bytes(logfile) + names)
    ptr = lambda v, P=8: struct.pack("<Q" if P == 8 else "<I", v)  # noqa: E731
    thread = struct.pack("<II", 100, 200) + bytes(0x40)                 # Thread v3 payload: pid, tid, ...
    cpu0 = [
        _record("system", 0x0503, 2000, thread, tid=0, pid=0, version=3),           # Thread DCStart
        _record("perfinfo", 0x0262, 3000, ptr(0x10000) + ptr(0x2000) + struct.pack("<II", 100, 0x3000)),
        _record("perfinfo", 0x1820, 3001, struct.pack("<qII", 3000, 100, 200)
                + ptr(0xFFFFF80000001000) + ptr(0x7FF600001000)),
        _record("system", 0x1020, 3500, ptr(0x500000) + struct.pack("<I", 2), tid=200, pid=100),  # Create
        _record("system", 0x1021, 4000, ptr(0x500000) + ptr(64) + ptr(0x500100) + struct.pack("<I", 0),
                tid=200, pid=100),                                                   # Alloc
        _record("perfinfo", 0x1820, 4001, struct.pack("<qII", 4000, 100, 200) + ptr(0xFFFFF80000002000)),
        _record("system", 0x1022, 5000, ptr(0x500000) + ptr(0x500200) + ptr(0x500100) + ptr(128) + ptr(64)
                + struct.pack("<I", 1), tid=200, pid=100),                           # ReAlloc
        _record("system", 0x1024, 6000, ptr(0x500000) + ptr(0x500200) + struct.pack("<I", 2),
                tid=200, pid=100),                                                   # Free
        _record("system", 0x1023, 6500, ptr(0x500000), tid=200, pid=100),            # Destroy
        _record("perfinfo", 0x0263, 7000, ptr(0x10000) + ptr(0x2000) + struct.pack("<II", 100, 0x8000)),
        *more0,
    ]
    cpu1 = [  # a 32-bit record layout (pointer size from the header type) and a user half on another CPU
        _record("perfinfo", 0x0262, 3500, ptr(0x20000, 4) + ptr(0x1000, 4) + struct.pack("<II", 300, 0x1000), P=4),
        _record("perfinfo", 0x1820, 3501, struct.pack("<qII", 3500, 300, 301) + ptr(0x401000, 4), P=4),
        _record("perfinfo", 0x1820, 4500, struct.pack("<qII", 4000, 100, 200) + ptr(0x7FF600002000)
                + ptr(0x7FF600001000)),
        *more1,
    ]
    data = (_buffer([header], size=0x400, cpu=0, seq=0, buffer_type=4)
            + _buffer(cpu0, size=size, cpu=0, seq=1) + _buffer(cpu1, size=size, cpu=1, seq=2))
    path.write_bytes(data)
    return path


def test_virtual_allocs_and_heap_events_from_documented_layouts(tmp_path):
    src = tiny_etl(tmp_path / "tiny.etl")
    run_dir = _run(src, tmp_path)
    assert read_table(run_dir, "decoded", "errors").num_rows == 0
    rows = read_table(run_dir, "decoded", "event_counts").to_pylist()
    assert collections.Counter({(r["provider_guid"], r["opcode"], r["event_id"], r["version"], r["header_type"]):
                                r["count"] for r in rows}) == dissect_counts(src)  # dissect reads our bytes alike
    counts = collections.Counter()
    for r in rows:
        counts[(r["provider_guid"], r["opcode"])] += r["count"]
    assert counts[("3d6fa8d3-fe05-11d0-9dda-00c04fd7ba7c", 98)] == 2
    stacks = {r["stack_id"]: r["frames"] for r in read_table(run_dir, "decoded", "stacks").to_pylist()}
    va = read_table(run_dir, "decoded", "virtual_allocs").to_pylist()
    assert [(v["timestamp"], v["pid"], v["tid"], v["base"], v["size"], v["flags"], v["kind"]) for v in va] == [
        (3000, 100, 200, 0x10000, 0x2000, 0x3000, "alloc"), (3500, 300, 301, 0x20000, 0x1000, 0x1000, "alloc"),
        (7000, 100, None, 0x10000, 0x2000, 0x8000, "free")]
    assert stacks[va[0]["stack_id"]] == [0xFFFFF80000001000, 0x7FF600001000]
    assert stacks[va[1]["stack_id"]] == [0x401000] and va[2]["stack_id"] is None
    assert [v["timestamp_ns"] for v in va] == [200_000, 250_000, 600_000]  # (ts - 1000) * 1e9 / 1e7
    heap = read_table(run_dir, "decoded", "heap_events").to_pylist()
    assert [(h["kind"], h["pid"], h["tid"], h["heap"], h["address"], h["size"], h["old_address"], h["old_size"],
             h["source"]) for h in heap] == [
        ("create", 100, 200, 0x500000, 0, 0, 0, 0, 0), ("alloc", 100, 200, 0x500000, 0x500100, 64, 0, 0, 0),
        ("realloc", 100, 200, 0x500000, 0x500200, 128, 0x500100, 64, 1),
        ("free", 100, 200, 0x500000, 0x500200, 0, 0, 0, 2), ("destroy", 100, 200, 0x500000, 0, 0, 0, 0, 0)]
    assert heap[0]["flags"] == 2
    # kernel half on CPU 0, user half on CPU 1: joined, kernel frames first
    assert stacks[heap[1]["stack_id"]] == [0xFFFFF80000002000, 0x7FF600002000, 0x7FF600001000]
    threads = read_table(run_dir, "decoded", "threads").to_pylist()
    assert [(t["pid"], t["tid"], t["start_ns"]) for t in threads] == [(100, 200, None)]
    trace = read_table(run_dir, "decoded", "trace").to_pylist()[0]
    assert trace["logger_name"] == "tiny" and trace["cpu_count"] == 2 and trace["buffers"] == 3


def test_regions_that_do_not_fit_in_the_address_space_are_errors(tmp_path):
    """A VirtualAlloc, heap or image region larger than a user address space (2^56 bytes for 64-bit records, 4 GiB
    for 32-bit ones) or running past the end of the address space is an error row naming the file and byte
    offset; the record stays in ``events`` and every other row is decoded. (A fuzzed VirtualAlloc size of
    2^63 + 2^19 was decoded as data and crashed the aggregate, which sums sizes as BIGINT.)"""
    q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
    va = lambda ts, base, size, P=8: _record(  # noqa: E731
        "perfinfo", 0x0262, ts, struct.pack("<QQ" if P == 8 else "<II", base, size) + struct.pack("<II", 100, 0x1000), P=P)
    bad0 = (va(7100, 0x30000, (1 << 63) + (1 << 19)),                 # the fuzzed size
            va(7200, 0xFFFFFFFFFFFFF000, 0x2000),                     # wraps past 2^64
            _record("system", 0x1022, 7400, q(0x500000, 0x500200, 0x500100, 128, 1 << 60) + struct.pack("<I", 1),
                    tid=200, pid=100))                                # ReAlloc from an impossible old block
    image = lambda ts, base, size, name: _record(  # noqa: E731  (Image Load v3, 64-bit: the name at 0x38)
        "system", 0x140A, ts, q(base, size) + struct.pack("<IIIIQ", 100, 0, 0, 0, 0).ljust(0x28, b"\0")
        + f"{name}\0".encode("utf-16-le"), tid=200, pid=100, version=3)
    bad0 = (*bad0, image(7600, 0x7FF700000000, (1 << 64) - 1, "bad.dll"))  # (a fuzzed size; the aggregate's
    bad1 = va(7500, 0xFFFFF000, 0x2000, P=4)                               # base + size overflowed UBIGINT)
    src = tiny_etl(tmp_path / "tiny.etl", more0=(*bad0[:2], va(7300, 0, 1 << 56), *bad0[2:],
                                                 image(7700, 0x7FF600000000, 0x10000, "good.dll")), more1=(bad1,))
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert sorted((e["kind"], e["buffer_index"]) for e in errors) == [("bad_value", 1)] * 4 + [("bad_value", 2)]
    images = read_table(run_dir, "decoded", "images").to_pylist()
    assert [(i["file_name"], i["base"], i["size"]) for i in images] == [("good.dll", 0x7FF600000000, 0x10000)]
    data = src.read_bytes()
    assert sorted(e["file_offset"] for e in errors) == sorted(data.find(r) for r in (*bad0, bad1))  # each its record
    for e in errors:
        assert str(src) in e["message"] and "does not fit in the address space" in e["message"]
        assert f"byte offset 0x{e['file_offset']:x}" in e["message"]
    assert f"{1 << 60} bytes at 0x500100" in " ".join(e["message"] for e in errors)      # the old block
    va_rows = read_table(run_dir, "decoded", "virtual_allocs").to_pylist()
    assert [(v["timestamp"], v["size"]) for v in va_rows] == [(3000, 0x2000), (3500, 0x1000), (7000, 0x2000),
                                                              (7300, 1 << 56)]
    heap = read_table(run_dir, "decoded", "heap_events").to_pylist()
    assert [h["kind"] for h in heap] == ["create", "alloc", "realloc", "free", "destroy"]
    events = read_table(run_dir, "decoded", "events", columns=["timestamp"]).column("timestamp").to_pylist()
    assert {7100, 7200, 7400, 7500, 7600} <= set(events)


# --- WPR heap snapshots (docs/heap-snapshot.md), built byte by byte ------------------------------------
HEAP_SNAPSHOT_GUID = uuid.UUID("901d2afa-4ff6-46d7-8d0e-53645e1a47f5")


def _event_record(event_id: int, ts: int, pid: int, tid: int, payload: bytes, guid: uuid.UUID) -> bytes:
    """EVENT_HEADER64 record (§2.5): 0x50-byte header, no extended items."""
    size = 0x50 + len(payload)
    head = struct.pack("<HBBHHIIq16sHBBBBHQQ16s", size, 0x13, 0xC0, 0, 0, tid, pid, ts, guid.bytes_le,
                       event_id, 1, 0, 4, 0, 0, 0, 0, b"")
    rec = head + payload
    return rec + b"\0" * (-len(rec) % 8)


def snapshot_blob(blocks=((0x100100, 0x5100, 64), (0x100200, 0x5200, 128), (0x100300, 0, 32))) -> tuple[bytes, int]:
    """A blob per §3: 3 segments, 2 stacks, two heap sections (the first with ``blocks``: (address, stack
    ref, size)); returns (blob, stack-section length)."""
    seg = lambda sid, frames: struct.pack("<IQ", len(frames) << 24 | 1, sid) + struct.pack(f"<{len(frames)}Q", *frames)  # noqa: E731
    stk = lambda sid, n, refs: struct.pack("<IQ", n << 24 | 2, sid) + struct.pack(f"<{len(refs)}Q", *refs)  # noqa: E731
    db = (struct.pack("<IIHH", 3, 2, 1, 8)
          + seg(0xA000, list(range(0x7FF0, 0x7FF8))) + seg(0xB000, [0x7FF8, 0x7FF9]) + seg(0xC000, [1, 2, 3])
          + stk(0x5100, 10, [0xA000, 0xB000]) + stk(0x5200, 3, [0xC000]))
    sentinel = struct.pack("<QQQ", 0x1234CDEF, 0, 0xFFFFFFFF)
    heaps = (struct.pack("<HHIQQQ", 2, 8, 0, 0x100000, 0x10000, 0x20000)
             + b"".join(struct.pack("<QQQ", *block) for block in blocks) + sentinel
             + struct.pack("<HHIQQQ", 2, 8, 0, 0x200000, 0x1000, 0x2000)
             + struct.pack("<QQQ", 0x200040, 0x5100, 4096) + sentinel)
    return db + heaps, len(db)


def snapshot_events(pid: int, instance: int, ts: int, *, drop: int | None = None, end: bool = True,
                    blob: tuple[bytes, int] | None = None) -> list[bytes]:
    blob, db_len = blob or snapshot_blob()
    pieces = [blob[i:i + 40] for i in range(0, len(blob), 40)]  # chunk boundaries fall inside records
    recs = [_event_record(100, ts + i, pid, 7, struct.pack("<III", instance, i, len(p)) + p, HEAP_SNAPSHOT_GUID)
            for i, p in enumerate(pieces) if i != drop]
    if end:  # two end events: after the stack section, and at the very end (the last one counts)
        recs.append(_event_record(200, ts + 90, pid, 7, struct.pack("<II", instance, db_len), HEAP_SNAPSHOT_GUID))
        recs.append(_event_record(200, ts + 99, pid, 7, struct.pack("<II", instance, len(blob)), HEAP_SNAPSHOT_GUID))
    return recs


def heap_snapshot_etl(path: Path, recs: list[bytes] | None = None) -> Path:
    """The logfile header and one buffer of heap snapshot events: ``recs``, or three snapshots (one whole,
    one with a chunk missing, one without end events)."""
    logfile = bytearray(0x118)
    struct.pack_into("<I4BII", logfile, 0x00, 0x2000, 10, 0, 1, 5, 19041, 1)
    struct.pack_into("<I", logfile, 0x24, 2)                           # BuffersWritten
    struct.pack_into("<III", logfile, 0x2C, 8, 0, 3000)                # PointerSize, EventsLost, MHz
    struct.pack_into("<qq", logfile, 0x100, 10_000_000, 133_000_000_000_000_000)
    struct.pack_into("<I", logfile, 0x110, 1)
    header = _record("system", 0x0000, 1000, bytes(logfile) + "snap\0\0".encode("utf-16-le"))
    if recs is None:
        recs = (snapshot_events(500, 1, 10_000) + snapshot_events(500, 2, 20_000, drop=3)
                + snapshot_events(600, 1, 30_000, end=False))
    data = _buffer([header], size=0x400, cpu=0, seq=0, buffer_type=4) + _buffer(recs, size=0x2000, cpu=0, seq=1)
    path.write_bytes(data)
    return path


def test_heap_snapshots_assemble_parse_and_share_the_stack_table(tmp_path):
    src = heap_snapshot_etl(tmp_path / "snap.etl")
    run_dir = _run(src, tmp_path)
    rows = read_table(run_dir, "decoded", "event_counts").to_pylist()
    assert collections.Counter({(r["provider_guid"], r["opcode"], r["event_id"], r["version"], r["header_type"]):
                                r["count"] for r in rows}) == dissect_counts(src)
    snaps = {(r["pid"], r["instance"]): r for r in read_table(run_dir, "decoded", "heap_snapshots").to_pylist()}
    blob, _ = snapshot_blob()
    ok = snaps[(500, 1)]
    assert ok["complete"] and ok["status"] == "ok" and ok["bytes"] == ok["total_data"] == len(blob)
    assert (ok["heaps"], ok["blocks"], ok["block_bytes"], ok["stacks"]) == (2, 4, 64 + 128 + 32 + 4096, 2)
    assert ok["timestamp_ns"] == (10_000 - 1000) * 100 and ok["end_timestamp_ns"] == (10_099 - 1000) * 100
    assert not snaps[(500, 2)]["complete"] and "gaps" in snaps[(500, 2)]["status"]
    assert not snaps[(600, 1)]["complete"] and "no end event" in snaps[(600, 1)]["status"]
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert sorted(e["kind"] for e in errors) == ["heap_snapshot", "heap_snapshot"]
    assert all("kept as a marker" in e["message"] and str(src) in e["message"] for e in errors)
    stacks = {r["stack_id"]: r["frames"] for r in read_table(run_dir, "decoded", "stacks").to_pylist()}
    blocks = read_table(run_dir, "decoded", "heap_snapshot_blocks").to_pylist()
    assert [(b["pid"], b["instance"], b["heap"], b["address"], b["size"]) for b in blocks] == [
        (500, 1, 0x100000, 0x100100, 64), (500, 1, 0x100000, 0x100200, 128), (500, 1, 0x100000, 0x100300, 32),
        (500, 1, 0x200000, 0x200040, 4096)]
    assert stacks[blocks[0]["stack_id"]] == list(range(0x7FF0, 0x7FFA))     # two segments, 10 frames
    assert stacks[blocks[1]["stack_id"]] == [1, 2, 3]
    assert blocks[2]["stack_id"] is None and blocks[2]["stack_ref"] == 0    # allocated before tracking
    assert blocks[3]["stack_id"] == blocks[0]["stack_id"]


@pytest.mark.kernels
def test_heap_snapshot_parser_refuses_bad_blobs():
    from pipeline.decode.etl import heapsnap

    blob, db_len = snapshot_blob()
    for cut in range(0, len(blob) - 1, 7):  # every truncation is reported, none reads past the end
        status, pos, _ = heapsnap.parse(np.frombuffer(blob[:cut], np.uint8))
        assert status == heapsnap.PARSE_TRUNCATED and pos <= cut
    bad = bytearray(blob)
    bad[db_len:db_len + 2] = b"\x03\x00"  # heap section version 3
    assert heapsnap.parse(np.frombuffer(bytes(bad), np.uint8))[0] == heapsnap.PARSE_BAD_VERSION
    status, _, parts = heapsnap.parse(np.frombuffer(blob, np.uint8))
    assert status == heapsnap.PARSE_OK and heapsnap.stack_frames(parts)[1].as_py() == [1, 2, 3]


def test_heap_snapshots_with_impossible_blocks_are_markers(tmp_path):
    """Busy blocks are user memory: a block past the end of the user address space (2^56 on 64-bit) stops the
    parse at its offset, and blocks adding up to more than that space (they overlap) are refused too. Both
    snapshots are kept as markers with an error naming the file; the whole snapshot beside them is decoded.
    (A fuzzed size near 2^64 crashed the stage: the snapshot's block_bytes did not fit in an int64.)"""
    from pipeline.decode.etl import heapsnap

    beyond, db_len = snapshot_blob(((0x100100, 0x5100, 64), ((1 << 56) - 0x1000, 0x5200, 0x1001)))
    status, pos, _ = heapsnap.parse(np.frombuffer(beyond, np.uint8))
    assert (status, pos) == (heapsnap.PARSE_BAD_BLOCK, db_len + 32 + 24)
    half = 1 << 55                                   # each inside the space; three of them overlap
    overlapping = snapshot_blob(tuple((0x100000 + 16 * i, 0x5100, half) for i in range(3)))
    edge = snapshot_blob(((0, 0, half), (half, 0, half - 4096)))  # with the other heap's 4096: the whole space
    src = heap_snapshot_etl(tmp_path / "snap.etl", snapshot_events(500, 1, 10_000) + snapshot_events(
        500, 2, 20_000, blob=(beyond, db_len)) + snapshot_events(500, 3, 30_000, blob=overlapping)
        + snapshot_events(500, 4, 40_000, blob=edge))
    run_dir = _run(src, tmp_path)
    snaps = {r["instance"]: r for r in read_table(run_dir, "decoded", "heap_snapshots").to_pylist()}
    assert snaps[1]["complete"] and snaps[1]["block_bytes"] == 64 + 128 + 32 + 4096
    assert snaps[4]["complete"] and snaps[4]["block_bytes"] == 1 << 56
    assert not snaps[2]["complete"] and snaps[2]["status"] == (
        f"unparsed: busy block beyond the user address space at blob offset {db_len + 56}")
    assert not snaps[3]["complete"] and "add up to" in snaps[3]["status"] and snaps[3]["block_bytes"] == 0
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert len(errors) == 2 and all(str(src) in e["message"] and "kept as a marker" in e["message"] for e in errors)
    blocks = read_table(run_dir, "decoded", "heap_snapshot_blocks").to_pylist()
    assert {b["instance"] for b in blocks} == {1, 4} and len(blocks) == 4 + 3


@pytest.mark.kernels
def test_heap_snapshot_parser_32bit_layout():
    """PointerSize 4 (the notes' inference for 32-bit ntdll): 4-byte ids/frames/fields, 16-byte heap header."""
    from pipeline.decode.etl import heapsnap

    blob = (struct.pack("<IIHH", 1, 1, 1, 4) + struct.pack("<III", 2 << 24 | 1, 0xA0, 0x401000) + struct.pack("<I", 0x402000)
            + struct.pack("<III", 2 << 24 | 3, 0x50, 0xA0)
            + struct.pack("<HHIII", 2, 4, 0x300000, 0x1000, 0x2000)
            + struct.pack("<III", 0x300010, 0x50, 24) + struct.pack("<III", 0x1234CDEF, 0, 0xFFFFFFFF))
    status, pos, parts = heapsnap.parse(np.frombuffer(blob, np.uint8))
    assert (status, pos) == (heapsnap.PARSE_OK, len(blob))
    assert heapsnap.stack_frames(parts).to_pylist() == [[0x401000, 0x402000]] and parts["stk_ref"].tolist() == [3]
    assert parts["blocks"].tolist() == [[0x300010, 0x50, 24]] and parts["heaps"].tolist() == [[0x300000, 0x1000, 0x2000]]


def test_inline_stacks_of_manifest_events(decoded):
    """EVENT_HEADER records with STACK_TRACE64 extended items (655 in the merged x64 trace, §2.5)."""
    run = decoded["perfview-net452-x64/net.4.5.2.x64.etl"]
    links = read_table(run, "decoded", "event_stacks").to_pylist()
    assert len(links) == 655 and all(r["stack_id"] is not None for r in links)
    events = read_table(run, "decoded", "events", columns=["timestamp", "cpu", "stream_pos", "header_type"]).to_pylist()
    kinds = {(e["timestamp"], e["cpu"], e["stream_pos"]): e["header_type"] for e in events}
    assert {kinds[(r["timestamp"], r["cpu"], r["stream_pos"])] for r in links} == {L.HT_EVENT32, L.HT_EVENT64}
    depth = {r["stack_id"]: r["depth"] for r in read_table(run, "decoded", "stacks").to_pylist()}
    assert min(depth[r["stack_id"]] for r in links) > 1


def test_kernels_as_plain_python_equal_the_jit():
    """The numba kernels run as plain Python (``py_func``, as under NUMBA_DISABLE_JIT) give the same
    results on a real buffer: the compressed buffer of smallEtlFile.etl, inflated and walked."""
    from pipeline.decode.etl import kernels as K
    from pipeline.decode.etl import xpress as X
    from pipeline.decode.etl.buffers import walk as walk_chain

    path = fixture_path("etl/perfview-small/smallEtlFile.etl")
    _, bufs = walk_chain(path)
    raw = np.frombuffer(path.read_bytes(), np.uint8)
    (i,) = np.flatnonzero(bufs["compressed"])
    s0 = int(bufs["file_offset"][i]) + 0x48
    s1 = int(bufs["file_offset"][i]) + int(bufs["buffer_size"][i])
    n = int(bufs["data_len"][i])
    jit_out, py_out = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    assert X.xpress_decompress(raw, s0, s1, jit_out, 0, n) == (K.OK, n)
    assert X.xpress_decompress.py_func(raw, s0, s1, py_out, 0, n) == (K.OK, n)
    assert (jit_out == py_out).all()
    from pipeline.decode.etl.batch import KIND_COLUMNS, RECORD_COLUMNS, Kinds, record_kinds

    buffers = (np.array([0], np.int64), np.array([n], np.int64), np.array([1], np.uint16), np.array([5], np.int64))
    results = []
    for walk_fn, kinds_fn in ((K.walk_records, record_kinds), (K.walk_records.py_func, record_kinds.py_func)):
        status = (np.zeros(1, np.int32), np.zeros(1, np.int64))
        count = walk_fn(jit_out, buffers, False, tuple(np.zeros(0, t) for _, t in RECORD_COLUMNS), status)
        cols, kinds = tuple(np.zeros(count, t) for _, t in RECORD_COLUMNS), Kinds()
        assert walk_fn(jit_out, buffers, True, cols, status) == count
        named = dict(zip((name for name, _ in RECORD_COLUMNS), cols))
        assert kinds_fn(jit_out, tuple(named[c] for c in KIND_COLUMNS), count, kinds.state()) == count
        results.append(cols + (kinds.keys, kinds.counts))
    assert count >= 1 and all(len(a) == len(b) and (a == b).all() for a, b in zip(*results))


@pytest.mark.parametrize("rel,baseline", [
    ("perfview-small/gcevents.etl", "perfview-small/gcevents.baseline.txt"),
    ("perfview-small/primitive-types.etl", "perfview-small/primitive-types.baseline.txt"),
    ("perfview-net452-x64/net.4.5.2.x64.etl", "perfview-net452-x64/net.4.5.2.x64.baseline.txt"),
])
def test_baseline_events_time_pid_tid_cpu_length(decoded, rel, baseline):
    """Every user-provider event TraceEvent printed is in ``events`` with the same time (ms since trace
    start), PID, TID, processor and payload length."""
    events = read_table(decoded[rel], "decoded", "events",
                        columns=["timestamp_ns", "pid", "tid", "cpu", "payload_len"]).to_pydict()
    have = collections.Counter(zip((_ms(t) for t in events["timestamp_ns"]), events["pid"], events["tid"],
                                   events["cpu"], events["payload_len"]))
    checked = 0
    for ms, kind, v in baseline_events("etl/" + baseline):
        if kind.startswith(("Windows Kernel/", "KernelTraceControl/")):
            continue  # kernel events: their header PID/TID are rewritten by TraceEvent (checked above)
        key = (ms, _int(v["PID"]), _int(v["TID"]), _int(v["ProceNum"]), _int(v["DataLen"]))
        assert have[key] > 0, f"{kind} at {ms} ms not found: {key}"
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("rel,seed", [("perfview-net452-x64/net.4.5.2.x64.etl", 1), ("airbus/AMSITrace.etl", 2),
                                      ("perfview-net45-x86/PerfViewData.etl", 3)])
def test_random_corruption_never_crashes(tmp_path, rel, seed):
    """Flip 200 random bytes after the header buffer: the decode finishes, every problem is an error row
    naming the file, and what still parses is decoded."""
    src = _copy(rel, tmp_path)
    data = bytearray(src.read_bytes())
    rng = np.random.default_rng(seed)
    first = int.from_bytes(data[0:4], "little")
    for pos in rng.integers(first, len(data), 200):
        data[pos] ^= int(rng.integers(1, 256))
    src.write_bytes(bytes(data))
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert all(str(src) in e["message"] for e in errors)
    trace = read_table(run_dir, "decoded", "trace").to_pylist()[0]
    assert trace["records"] > 0 and trace["buffers_skipped"] <= trace["buffers"]
    assert read_manifest(run_dir, "decoded")["errors_total"] == len(errors)


def test_kernel_header_table_matches_layout():
    from pipeline.decode.etl import kernels as K

    for htype, (size, ptr) in L.HEADER_KINDS.items():
        assert K._header_kind(htype) == (size, ptr, htype in L.SYSTEM_KINDS)
    assert K._header_kind(0x0C)[0] == 0 and K._header_kind(0x90)[0] == 0
    assert (L.EH_TID, L.EH_PID, L.EH_TS, L.EH_GUID) == (L.FULL_TID, L.FULL_PID, L.FULL_TS, L.FULL_GUID)


@pytest.mark.kernels
@pytest.mark.parametrize("freq", [10_000_000, 1_000_000_000, 3_579_545, 2_648_441_000])
def test_to_ns_equals_the_general_formula(freq):
    """The one-multiply path for clocks with whole nanoseconds per tick gives the exact general result."""
    from pipeline.decode.etl.batch import to_ns

    rng = np.random.default_rng(7)
    raw = np.concatenate([rng.integers(-10**12, 10**14, 10_000), [0, 1, -1, freq - 1, freq, -freq]]).astype(np.int64)
    t0 = 123_456_789
    d = raw - t0
    q, r = np.divmod(d, freq)
    expected = q * 1_000_000_000 + (r * 1_000_000_000) // freq
    assert np.array_equal(to_ns(raw, t0, freq), expected)


@pytest.mark.kernels
def test_sampled_profile_reads_both_pointer_sizes_and_reports_short_payloads():
    """The fused SampledProfile reader: InstructionPointer by each record's pointer size, ThreadId after
    it; a payload too short for both (and the count) is an ``errors`` row naming buffer and offset, and
    the record is not a sample."""
    from pipeline.decode.etl.batch import RECORD_COLUMNS, Batch
    from pipeline.decode.etl.buffers import BUFFER_DESC
    from pipeline.decode.etl.events.sampling import sampled_profile

    payloads = [struct.pack("<QII", 0xFFFFF80012345678, 4242, 1),    # 64-bit: 16 bytes
                struct.pack("<III", 0x00401000, 77, 1),               # 32-bit: 12 bytes
                struct.pack("<QI", 0x7FF600001000, 9)]                # 64-bit, 12 bytes: too short
    ptrs = [8, 4, 8]
    blob = np.frombuffer(b"".join(payloads), np.uint8)
    n = len(payloads)
    cols = {name: np.zeros(n, t) for name, t in RECORD_COLUMNS}
    cols["pay_off"][:] = np.cumsum([0] + [len(p) for p in payloads[:-1]])
    cols["pay_len"][:] = [len(p) for p in payloads]
    cols["roff"][:] = cols["pay_off"]
    cols["ptr"][:] = ptrs
    cols["ts"][:] = [100, 200, 300]
    cols["cpu"][:] = 3          # (the walk gives each record its buffer's cpu)
    bufs = np.zeros(1, BUFFER_DESC.descr + [("stream_rank", "<i8")])
    bufs["index"], bufs["file_offset"], bufs["cpu"] = 7, 0x70000, 3
    b = Batch(blob, cols, bufs, {"header_ts": 0, "perf_freq": 10_000_000, "path": "t.etl",
                                 "starts": np.zeros(1, np.int64)})
    b.errors = []
    sampled_profile(b, np.arange(n))
    [samples] = b.out["_samples"]
    assert samples.column("ip").to_pylist() == [0xFFFFF80012345678, 0x00401000]
    assert samples.column("tid").to_pylist() == [4242, 77]
    assert samples.column("timestamp").to_pylist() == [100, 200] and samples.column("cpu").to_pylist() == [3, 3]
    assert b.consumed.tolist() == [True, True, False]
    [err] = b.errors
    assert err["kind"] == "short_payload" and err["buffer_index"] == 7 and "SampledProfile" in err["message"]
    assert err["record_offset"] == 28 and "buffer 7 at byte offset" in err["message"]


def test_no_module_constant_is_a_plain_int_beyond_int64():
    """numpy 2's promotion of plain Python ints (NEP 50) raises OverflowError where such an int meets int64
    (``np.where(width == 8, 0xFFFF8000_00000000, 0x80000000)`` failed every decode with a newer numpy): every
    constant of the decoder and symbolizer modules that does not fit an int64 is a numpy scalar of its type."""
    import importlib
    import pkgutil

    import pipeline

    def ints(value):
        if isinstance(value, bool):
            return
        if isinstance(value, int):
            yield value
        elif isinstance(value, (tuple, list, set, frozenset)):
            for v in value:
                yield from ints(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from ints(v)

    found, checked = [], 0
    for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        if not info.name.startswith(("pipeline.decode", "pipeline.symbolize", "pipeline.aggregate")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.isupper():
                checked += 1
                found += [(info.name, name, hex(v)) for v in ints(value) if not -(1 << 63) <= v < (1 << 63)]
    assert checked > 100 and found == []
    assert L.KERNEL_SPACE_64.dtype == np.uint64 and L.KERNEL_SPACE_32.dtype == np.uint64
