"""The synthesizer's own byte layouts against the sizes in ../shared/docs/etl-format.md and heap-snapshot.md."""

import pytest

from pipeline.synth import layout as L
from pipeline.synth.records import record_dtype


def test_header_sizes():
    assert L.BUFFER_HEADER.itemsize == L.BUFFER_HEADER_SIZE == 0x48
    assert L.SYSTEM_HEADER.itemsize == 0x20
    assert L.PERFINFO_HEADER.itemsize == 0x10
    assert L.FULL_HEADER.itemsize == 0x30
    assert L.EVENT_HEADER.itemsize == 0x50


def test_buffer_header_offsets():
    f = L.BUFFER_HEADER.fields
    assert [f[k][1] for k in ("BufferSize", "SavedOffset", "TimeStamp", "SequenceNumber", "ProcessorIndex",
                               "State", "Offset", "BufferFlag", "BufferType")] == \
        [0x00, 0x04, 0x10, 0x18, 0x28, 0x2C, 0x30, 0x34, 0x36]


@pytest.mark.parametrize("p, size, offsets", [
    (8, 0x118, {"PointerSize": 0x2C, "LoggerName": 0x38, "Bias": 0x48, "BootTime": 0xF8, "PerfFreq": 0x100,
                "StartTime": 0x108, "ReservedFlags": 0x110, "BuffersLost": 0x114}),
    (4, 0x110, {"PointerSize": 0x2C, "LoggerName": 0x38, "Bias": 0x40, "BootTime": 0xF0, "PerfFreq": 0xF8,
                "StartTime": 0x100, "ReservedFlags": 0x108, "BuffersLost": 0x10C}),
])
def test_logfile_header(p, size, offsets):
    dt = L.logfile_header(p)
    assert dt.itemsize == size
    assert {k: dt.fields[k][1] for k in offsets} == offsets


@pytest.mark.parametrize("p", [4, 8])
def test_payload_sizes(p):
    # fixed parts from §3.1-3.10 (x64 / x86)
    assert L.process_fixed(p).itemsize == {8: 0x24, 4: 0x1C}[p]
    assert L.thread_fixed(p).itemsize == {8: 0x48, 4: 0x2C}[p]
    assert L.image_fixed(p).itemsize == {8: 0x38, 4: 0x2C}[p]
    assert L.sampled_profile(p).itemsize == {8: 16, 4: 12}[p]
    assert L.stack_key_ref(p).itemsize == {8: 24, 4: 20}[p]
    assert L.virtual_alloc(p).itemsize == {8: 24, 4: 16}[p]
    assert L.heap_alloc(p).itemsize == {8: 28, 4: 16}[p]
    assert L.heap_realloc(p).itemsize == {8: 44, 4: 24}[p]
    assert L.heap_free(p).itemsize == {8: 20, 4: 12}[p]
    assert L.image_id_fixed(p).itemsize == 2 * p + 8
    assert L.dbgid_rsds_fixed(p).itemsize == p + 24
    assert L.sysconfig_cpu(p).itemsize == {8: 828, 4: 820}[p]
    assert L.heap_section_header(p).itemsize == {8: 32, 4: 16}[p]
    assert L.STACK_WALK_PREFIX.itemsize == 16


def test_header_extension():
    assert L.HEADER_EXTENSION.itemsize == 36     # u32 GroupMask1..8 + u32 KernelEventVersion (§5.2)


def test_heap_snapshot_layouts():
    assert L.STACKDB_HEADER.itemsize == 12
    assert L.HEAP_SNAPSHOT_CHUNK_PREFIX.itemsize == 12
    assert L.HEAP_SNAPSHOT_END.itemsize == 8
    assert L.HEAP_SNAPSHOT_CHUNK_BYTES == 0x4000


def test_records_are_padded_to_eight_bytes():
    assert record_dtype(L.PERFINFO_HEADER, L.sampled_profile(4)).itemsize == 32     # 28 -> 32
    assert record_dtype(L.SYSTEM_HEADER, L.heap_alloc(8)).itemsize == 64           # 60 -> 64
    assert record_dtype(L.PERFINFO_HEADER, L.sampled_profile(8)).itemsize == 32
