"""Damage to the buffer chain (issue: silent loss): each case decodes through the real stage, is an ``errors``
row with the file, buffer index and byte offset, is counted in the trace row, and every record of every intact
buffer is decoded whatever happened before it. Records per buffer are counted on the intact file by the
decoder's own record walk, buffer by buffer; the cases cover a synthesized trace (64 KiB buffers, as the
kernel writes them) and an XPRESS-compressed one (buffers of their own sizes: the resync scans bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.cluster import Pool
from pipeline.config import Config, SynthConfig
from pipeline.decode import run as decode_run
from pipeline.decode.etl import buffers as B
from pipeline.runs import read_table


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """name -> (path, buffer descriptors, records per buffer) of an intact plain and XPRESS trace."""
    from pipeline import synth
    from pipeline.decode.etl.partition import read_buffers, walk as record_walk

    out = {}
    for name, cfg in {"plain": SynthConfig(seed=3, size="3MB", cpus=4),
                      "xpress": SynthConfig(seed=5, size="3MB", cpus=5, compress=True)}.items():
        path = tmp_path_factory.mktemp(f"chain-{name}") / "trace.etl"
        synth.run(path, cfg)
        header, descs = B.walk(path)
        assert not header.walk_errors and not header.field_errors and len(descs) == header.fields["buffers_written"]
        records = []
        for i in range(len(descs)):
            blob, starts, lens, errors, skipped = read_buffers(str(path), descs[i:i + 1])
            _, _, status, _ = record_walk(blob, starts, lens)
            assert not errors and not skipped and not status.any()
            records.append(_records(blob, starts, lens))
        out[name] = (path, descs, np.array(records))
    return out


def _records(blob, starts, lens) -> int:
    from pipeline.decode.etl.partition import walk as record_walk

    cols, _, _, _ = record_walk(blob, starts, lens)
    return len(cols["rbuf"])


def decode(data: bytes, tmp_path, name: str):
    path = tmp_path / f"{name}.etl"
    path.write_bytes(data)
    run = tmp_path / f"run-{name}"
    decode_run(run, Config(), Pool(None), inputs=[path])
    trace = read_table(run, "decoded", "trace").to_pylist()[0]
    errors = read_table(run, "decoded", "errors").to_pylist()
    assert all(str(path) in e["message"] for e in errors)
    return trace, errors


def damaged(traces, name, edit):
    path, descs, records = traces[name]
    data = bytearray(path.read_bytes())
    lost = edit(data, descs.copy())
    return bytes(data), int(records.sum() - records[list(lost)].sum())


def zero_header(data, d):
    at = int(d["file_offset"][10])
    data[at:at + 0x48] = bytes(0x48)
    return [10]


def zero_range(data, d):
    a, b = int(d["file_offset"][10]), int(d["file_offset"][20])
    data[a:b] = bytes(b - a)
    return range(10, 20)


def size_too_large(data, d):
    at = int(d["file_offset"][10])
    data[at:at + 4] = (int(d["buffer_size"][10]) + 0x100).to_bytes(4, "little")
    return [10]


def bad_fill_mark(data, d):
    at = int(d["file_offset"][10])
    field = 0x04 if d["compressed"][10] else 0x30          # SavedOffset (inflated) / Offset (fill)
    data[at + field:at + field + 4] = (0x7FFFFFFF).to_bytes(4, "little")
    return [10]


def bad_cpu(data, d):
    at = int(d["file_offset"][10])
    data[at + 0x28:at + 0x2A] = (999).to_bytes(2, "little")
    return [10]


def copied_over(data, d):
    a, b = int(d["file_offset"][11]), int(d["file_offset"][12])
    size = int(d["buffer_size"][11])
    assert int(d["buffer_size"][12]) == size                # (64 KiB buffers: the chain stays as it was)
    data[b:b + size] = data[a:a + size]
    return [12]


CASES = {  # case -> (kinds of the error rows, buffers missing)
    "zero_header": (zero_header, ["resync", "missing_buffers"], 1),
    "zero_range": (zero_range, ["resync", "missing_buffers"], 10),
    "size_too_large": (size_too_large, ["resync", "missing_buffers"], 1),
    "bad_fill_mark": (bad_fill_mark, ["bad_buffer_field"], 0),
    "bad_cpu": (bad_cpu, ["bad_buffer_field"], 0),
}


@pytest.mark.parametrize("name", ["plain", "xpress"])
@pytest.mark.parametrize("case", list(CASES))
def test_damage_in_the_chain_loses_only_the_damaged_buffers(traces, tmp_path, name, case):
    edit, kinds, missing = CASES[case]
    data, want = damaged(traces, name, edit)
    trace, errors = decode(data, tmp_path, case)
    # (a heap snapshot whose chunks were in the lost buffers is reported incomplete: a consequence, not the cause)
    errors = [e for e in errors if e["kind"] != "heap_snapshot"]
    assert [e["kind"] for e in errors] == kinds
    first = errors[0]
    assert first["buffer_index"] == 10 and first["file_offset"] == int(traces[name][1]["file_offset"][10])
    assert f"buffer 10 at byte offset 0x{first['file_offset']:x}" in first["message"]
    assert trace["records"] == want
    assert trace["buffers_missing"] == missing and trace["buffers_skipped"] == 1
    assert (trace["bytes_resynced"] > 0) == (kinds[0] == "resync")


def test_a_file_cut_at_a_buffer_boundary_says_how_many_are_missing(traces, tmp_path):
    path, descs, records = traces["plain"]
    cut = int(descs["file_offset"][29])
    trace, errors = decode(path.read_bytes()[:cut], tmp_path, "cut")
    assert [(e["kind"], e["buffer_index"], e["file_offset"]) for e in errors] == [("missing_buffers", 29, cut)]
    assert f"holds 29 buffers but the logfile header says {len(descs)} were written" in errors[0]["message"]
    assert trace["buffers_missing"] == len(descs) - 29 and trace["records"] == int(records[:29].sum())


def test_a_buffer_copied_over_another_is_not_decoded_twice(traces, tmp_path):
    data, want = damaged(traces, "plain", copied_over)
    trace, errors = decode(data, tmp_path, "copy")
    assert [(e["kind"], e["buffer_index"]) for e in errors] == [("duplicate_buffer", 12)]
    assert "repeats buffer 11" in errors[0]["message"]
    assert trace["records"] == want and trace["buffers_missing"] == 0


def test_buffer_checks_agree():
    """The walk's plain-Python header check and the resync scan's numpy check give the same answers, on real
    headers and on headers with each checked field set to edge and random values."""
    rng = np.random.default_rng(7)
    lim = B._Limits(file_size=1 << 22, capacity=0x10000, cpus=8, logger_id=3)
    base = bytearray(0x48)
    base[0:4] = (0x10000).to_bytes(4, "little")
    base[4:8] = base[0x30:0x34] = (0x8000).to_bytes(4, "little")
    base[0x28:0x2A], base[0x2A:0x2C], base[0x34:0x36] = (2).to_bytes(2, "little"), (3).to_bytes(2, "little"), b"\x20\x00"
    fields = {0x00: 4, 0x04: 4, 0x28: 2, 0x2A: 2, 0x30: 4, 0x34: 2, 0x36: 2}
    heads = [bytes(base)]
    for off, width in fields.items():
        for v in [0, 1, 0x47, 0x48, 0x7, 0x8, 0x40, 0x60, 0x7F, 0x80, 0xFFFF, 0x10000, 0x10001, 1 << 26, (1 << 26) + 1,
                  *rng.integers(0, 1 << (8 * width), 8).tolist()]:
            h = bytearray(base)
            h[off:off + width] = (int(v) & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
            heads.append(bytes(h))
    heads += [rng.integers(0, 256, 0x48, dtype=np.uint8).tobytes() for _ in range(200)]
    at = rng.integers(0, 1 << 22, len(heads))
    for strict in (True, False):
        one = [B.plausible_one(h, int(a), lim, strict) for h, a in zip(heads, at)]
        many = [bool(B._plausible(B._fields(np.frombuffer(h, np.uint8), 1), np.array([a]), lim, strict)[0])
                for h, a in zip(heads, at)]
        assert one == many and any(one) and not all(one)
