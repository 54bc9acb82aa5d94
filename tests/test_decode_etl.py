"""ETL decoder: golden counts against dissect.etl on every fixture, trace header facts, bad input.

dissect.etl (AGPL, test-only) is the independent decoder. Its quirks, normalized here: EVENT_HEADER
provider GUIDs come back byte-swapped (UUID(bytes=...) instead of bytes_le); for FULL_HEADER records its
``version`` is the whole Class dword (Type | Level << 8 | Version << 16).
"""

from __future__ import annotations

import collections
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.config import ClusterConfig, Config, DecodeConfig
from pipeline.cluster import Pool
from pipeline.decode import run as decode_run
from pipeline.decode.etl import layout as L
from pipeline.errors import InputError
from pipeline.runs import read_manifest, read_table
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


def test_truncated_file_decodes_what_is_there(tmp_path):
    src = _copy("airbus/ShutdownPerfDiagLogger.etl", tmp_path)
    data = src.read_bytes()
    cut = 10 * 0x10000 + 1234
    src.write_bytes(data[:cut])
    run_dir = _run(src, tmp_path)
    errors = read_table(run_dir, "decoded", "errors").to_pylist()
    assert [e["kind"] for e in errors] == ["truncated"]
    assert errors[0]["buffer_index"] == 10 and errors[0]["file_offset"] == 10 * 0x10000
    assert "buffer 10 at byte offset 0xa0000" in errors[0]["message"] and str(src) in errors[0]["message"]
    trace = read_table(run_dir, "decoded", "trace").to_pylist()[0]
    assert trace["buffers"] == 10 and trace["buffers_skipped"] == 1
    assert read_manifest(run_dir, "decoded")["etl"]["records"] > 0


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


def test_random_bytes_never_crash_the_kernels():
    from pipeline.decode.etl import kernels as K
    from pipeline.decode.etl.batch import walk

    rng = np.random.default_rng(7)
    for trial in range(200):
        src = rng.integers(0, 256, size=int(rng.integers(1, 3000)), dtype=np.uint8)
        dst = np.zeros(int(rng.integers(1, 5000)), np.uint8)
        status, n = K.xpress_decompress(src, 0, len(src), dst, 0, len(dst))
        assert 0 <= n <= len(dst)
        blob = rng.integers(0, 256, size=4096, dtype=np.uint8)
        blob[2] = rng.choice([0x02, 0x11, 0x13, 0x14, 0x90])
        blob[3] = 0xC0
        cols, st, pos = walk(blob, np.array([0, 2048], np.int64), np.array([2048, 2048], np.int64))
        assert ((cols["roff"] >= 0) & (cols["roff"] + cols["rsize"] <= 4096)).all()
        assert ((cols["pay_off"] + cols["pay_len"]) <= cols["roff"] + cols["rsize"]).all()
