"""Golden tests of the .mm_profdata decoder on the real rustc 1.95 fixtures, plus bad files and v8."""

from __future__ import annotations

import collections
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from pipeline.decode.measureme import layout
from pipeline.decode.measureme.reader import ProfileError, read_profile
from tests.conftest import ROOT, fixture_path

HELLO = "selfprofile/hello-default/hello-0006647.mm_profdata"
HELLO_ARGS = "selfprofile/hello-args/unknown-crate-0006345.mm_profdata"
PROBE = "selfprofile/workspace-clean/___-0009370.mm_profdata"


def kinds_of(prof) -> collections.Counter:
    return collections.Counter(prof.strings[c] for c in prof.kind_code)


def test_layout_sizes_match_format_notes():
    assert layout.EVENT_V9.itemsize == 32 and layout.EVENT_V8.itemsize == 24
    assert layout.INDEX_V9.itemsize == 16 and layout.INDEX_V8.itemsize == 8
    assert layout.PAGE_HEADER.itemsize == layout.PAGE_HEADER_SIZE == 5
    assert layout.LAYOUTS[9].ref_size == 1 + 8 and layout.LAYOUTS[8].ref_size == 1 + 4
    assert {v: lay.event_words for v, lay in layout.LAYOUTS.items()} == {8: 6, 9: 8}


def test_hello_default_counts_threads_and_first_event():
    prof = read_profile(fixture_path(HELLO))
    assert prof.version == 9 and prof.n_events == 24905
    assert kinds_of(prof) == {"Query": 12153, "GenericActivity": 10125, "QueryCacheHitCount": 2621, "ArtifactSize": 6}
    assert collections.Counter(prof.thread.tolist()) == {3: 24893, 6: 6, 7: 6}
    assert prof.strings[prof.id_code[0]] == "target_machine_factory"
    assert (prof.start[0], prof.end[0]) == (809608, 820635)
    assert prof.metadata["process_id"] == 6647 and prof.metadata["start_time"] == 1795358655573655816
    assert "--crate-name hello" in prof.metadata["cmd"]


def test_hello_args_query_key_and_nesting():
    prof = read_profile(fixture_path(HELLO_ARGS))
    text = prof.strings[prof.id_code[3]]
    assert text == "registered_tools\x1e()"
    assert prof.strings[prof.kind_code[3]] == "Query"
    assert (prof.start[3], prof.end[3]) == (2778035, 2806327)
    assert prof.string_id[3] == 4  # virtual id: rustc's DepNodeIndex of the invocation
    iv = prof.payload == layout.INTERVAL
    roots = iv & (prof.parent < 0)
    # Self times of a file sum to the summed durations of its root events.
    assert prof.self_ns[iv].sum() == (prof.end[roots] - prof.start[roots]).sum()
    assert (prof.self_ns[iv] >= 0).all()
    # A parent always comes later in the file (it ends later) and contains its child.
    kids = np.nonzero(iv & (prof.parent >= 0))[0]
    par = prof.parent[kids]
    assert (par > kids).all()
    assert (prof.start[par] <= prof.start[kids]).all() and (prof.end[kids] <= prof.end[par]).all()
    assert (prof.depth[kids] == prof.depth[par] + 1).all()


def test_probe_file_bytes():
    prof = read_profile(fixture_path(PROBE))
    assert prof.n_events == 3
    assert sorted(prof.strings[c] for c in prof.id_code) == ["drop_compiler", "target_machine_factory",
                                                            "target_machine_factory_inner"]
    assert prof.strings[prof.id_code[0]] == "target_machine_factory"
    assert (prof.start[0], prof.end[0]) == (1275954, 1287561)
    assert set(kinds_of(prof)) == {"GenericActivity"}


@pytest.mark.parametrize("name,ilr,queries,hits", [
    ("mathx-0009537", 429, 1485, 8927),
    ("app-0009552", 576, 3578, 9329),
])
def test_incremental_files(name, ilr, queries, hits):
    prof = read_profile(fixture_path(f"selfprofile/workspace-incremental/{name}.mm_profdata"))
    kinds = kinds_of(prof)
    assert kinds["IncrementalLoadResult"] == ilr and kinds["Query"] == queries
    counts = np.array([prof.strings[c] == "QueryCacheHitCount" for c in range(len(prof.strings))])
    assert prof.start[counts[prof.kind_code]].sum() == hits


def test_decode_stage_on_workspace_dir(tmp_path, dask_pool):
    """A directory of a cargo build: one file per crate, the probe skipped, crate names from cmd."""
    from pipeline import decode
    from pipeline.config import Config
    from pipeline.runs import read_manifest, read_table

    summary = decode.run(tmp_path, Config(), dask_pool, inputs=[fixture_path("selfprofile/workspace-clean")])
    assert summary["self_profile"]["decoded"] == 3 and summary["self_profile"]["skipped"] == 1
    files = read_table(tmp_path, "decoded", "self_profiles").to_pylist()
    got = {f["crate"]: (f["events"], f["pid"]) for f in files if f["status"] == "ok"}
    assert got == {"util": (103770, 9378), "mathx": (50076, 9384), "app": (104342, 9460)}
    manifest = read_manifest(tmp_path, "decoded")
    assert manifest["tables"]["query_events"] == 103770 + 50076 + 104342
    assert manifest["self_profile"]["errors"] == 0


# ------------------------------------------------------------------------------------------------
# Bad files: each gets a clear error row, the good file of the same run is still decoded.


def pages(raw: bytes):
    """(tag, payload offset, size) of each page."""
    pos = 8
    while pos < len(raw):
        tag, size = raw[pos], struct.unpack_from("<I", raw, pos + 1)[0]
        yield tag, pos + 5, size
        pos += 5 + size


def make_bad_files(directory: Path) -> dict[str, str]:
    """Write broken variants of the hello profile; returns file name -> expected error fragment."""
    raw = fixture_path(HELLO).read_bytes()
    first_events = next(off for tag, off, _ in pages(raw) if tag == 0)
    event0 = first_events + 8
    dangling = bytearray(raw)
    struct.pack_into("<Q", dangling, event0 + 8, layout.FIRST_REGULAR_STRING_ID + 10**9)
    cases = {
        "truncated-0000001.mm_profdata": (raw[:500_000], "truncated"),
        "magic-0000002.mm_profdata": (b"MMPX" + raw[4:], "magic b'MMPX'"),
        "newer-0000003.mm_profdata": (raw[:4] + struct.pack("<I", 10) + raw[8:], "format version 10 is not supported"),
        "dangling-0000004.mm_profdata": (bytes(dangling), "event stream offset 8 (event 0): event_id"),
        "empty-0000005.mm_profdata": (raw[:8], "no events stream"),
    }
    for name, (data, _) in cases.items():
        (directory / name).write_bytes(data)
    return {name: frag for name, (_, frag) in cases.items()}


def test_dangling_reference_inside_string_data(tmp_path):
    """A reference component (0xFE + id) in the string data that points past its end."""
    raw = bytearray(fixture_path(HELLO_ARGS).read_bytes())
    first_data = next(off for tag, off, _ in pages(bytes(raw)) if tag == 1)
    ref = first_data + 592  # "pre_AST_expansion_lint_checks\x1Ehello": Ref + "\x1E" + Ref (format notes §2.3)
    assert raw[ref] == 0xFE and raw[ref + 9] == 0x1E
    struct.pack_into("<Q", raw, ref + 1, layout.FIRST_REGULAR_STRING_ID + 10**8)
    path = tmp_path / "unknown-crate-0006345.mm_profdata"
    path.write_bytes(bytes(raw))
    with pytest.raises(ProfileError, match=r"string data offset 592: dangling reference to string id 200000003"):
        read_profile(path)


def test_bad_files_raise_clear_errors(tmp_path):
    for name, fragment in make_bad_files(tmp_path).items():
        with pytest.raises(ProfileError) as err:
            read_profile(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and fragment in str(err.value), str(err.value)


def test_bad_files_do_not_stop_the_run(tmp_path, dask_pool):
    from pipeline import decode
    from pipeline.config import Config
    from pipeline.runs import read_table

    inputs = tmp_path / "in"
    inputs.mkdir()
    expected = make_bad_files(inputs)
    (inputs / "hello-0006647.mm_profdata").write_bytes(fixture_path(HELLO).read_bytes())
    summary = decode.run(tmp_path / "run", Config(), dask_pool, inputs=[inputs])["self_profile"]
    assert summary["decoded"] == 1 and summary["errors"] == len(expected)
    files = {Path(f["path"]).name: f for f in read_table(tmp_path / "run", "decoded", "self_profiles").to_pylist()}
    assert files["hello-0006647.mm_profdata"]["events"] == 24905
    for name, fragment in expected.items():
        assert files[name]["status"] == "error" and fragment in files[name]["error"]
    events = read_table(tmp_path / "run", "decoded", "query_events")
    assert events.num_rows == 24905 and pc.unique(events["file_id"]).to_pylist() == [files["hello-0006647.mm_profdata"]["file_id"]]


# ------------------------------------------------------------------------------------------------
# Format version 8: the same profile re-encoded with 32-bit ids must decode to the same events.


def to_v8(raw: bytes) -> bytes:
    """Re-encode a v9 file as v8: u32 ids, 5-byte string references, 24-byte events, 8-byte index."""
    streams = {0: bytearray(), 1: bytearray(), 2: bytearray()}
    for tag, off, size in pages(raw):
        streams[tag] += raw[off: off + size]
    data = bytes(streams[1])
    moved: dict[int, int] = {}
    new = bytearray(b"MMSD" + struct.pack("<I", 8))
    refs: list[tuple[int, int]] = []  # (position in new data, old string id)
    pos = 8
    while pos < len(data):
        moved[pos] = len(new)
        while data[pos] != 0xFF:
            if data[pos] == 0xFE:
                refs.append((len(new) + 1, struct.unpack_from("<Q", data, pos + 1)[0]))
                new += b"\xfe\0\0\0\0"
                pos += 9
            else:
                q = pos
                while data[q] not in (0xFE, 0xFF):
                    q += 1
                new += data[pos:q]
                pos = q
        new += b"\xff"
        pos += 1

    def sid(old: int) -> int:
        first = layout.FIRST_REGULAR_STRING_ID
        return moved[old - first] + first if old >= first else old

    for at, old in refs:
        struct.pack_into("<I", new, at, sid(old))
    index = bytearray(b"MMSI" + struct.pack("<I", 8))
    for vid, addr in struct.iter_unpack("<QQ", bytes(streams[2][8:])):
        index += struct.pack("<II", vid, moved[addr])
    events = bytearray(b"MMES" + struct.pack("<I", 8))
    for kind, eid, *rest in struct.iter_unpack("<QQIIII", bytes(streams[0][8:])):
        events += struct.pack("<IIIIII", sid(kind), sid(eid), *rest)
    out = bytearray(b"MMPD" + struct.pack("<I", 8))
    for tag, stream in ((0, events), (2, index), (1, new)):
        for start in range(0, len(stream), 1 << 18):
            chunk = stream[start: start + (1 << 18)]
            out += bytes([tag]) + struct.pack("<I", len(chunk)) + chunk
    return bytes(out)


def test_v8_file_decodes_like_v9(tmp_path):
    v9 = read_profile(fixture_path(HELLO_ARGS))
    path = tmp_path / "unknown-crate-0006345.mm_profdata"
    path.write_bytes(to_v8(fixture_path(HELLO_ARGS).read_bytes()))
    v8 = read_profile(path)
    assert v8.version == 8 and v8.n_events == v9.n_events
    assert [v8.strings[c] for c in v8.id_code] == [v9.strings[c] for c in v9.id_code]
    assert [v8.strings[c] for c in v8.kind_code] == [v9.strings[c] for c in v9.kind_code]
    for col in ("thread", "start", "end", "payload", "parent", "depth", "self_ns"):
        assert np.array_equal(getattr(v8, col), getattr(v9, col)), col
    assert v8.metadata == v9.metadata


def test_kernels_without_jit_give_the_same_result():
    """The kernels run as plain Python (NUMBA_DISABLE_JIT=1) so Python-level errors show up."""
    script = (
        "import collections, sys\n"
        "from pipeline.decode.measureme.reader import read_profile\n"
        "p = read_profile(sys.argv[1])\n"
        "print(p.n_events, int(p.self_ns.sum()), int(p.parent.sum()), int(p.depth.sum()), len(p.strings))\n"
    )
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    path = str(fixture_path(PROBE).parent / "mathx-0009384.mm_profdata")
    out = subprocess.run([sys.executable, "-c", script, path], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    p = read_profile(path)
    assert out == [str(v) for v in (p.n_events, int(p.self_ns.sum()), int(p.parent.sum()), int(p.depth.sum()),
                                    len(p.strings))]


def test_a_huge_virtual_string_id_costs_no_memory(tmp_path):
    """An 887-byte profile whose string index maps virtual id 100,000,000 (the largest there is) made the
    decoder allocate a table of every id below it, ~800 MB. Ids beyond a bound that grows with the index are
    looked up by binary search instead: the file is refused (its metadata entry is gone) within a few MB, and
    the id still resolves."""
    import tracemalloc

    from pipeline.decode.measureme.reader import StringTable, split_streams

    raw = bytearray(fixture_path(PROBE).read_bytes())
    entry = struct.pack("<QQ", layout.METADATA_STRING_ID, 8)
    at = raw.index(entry)
    struct.pack_into("<Q", raw, at, layout.MAX_VIRTUAL_STRING_ID)
    path = tmp_path / "___-0000001.mm_profdata"
    path.write_bytes(bytes(raw))
    tracemalloc.start()
    try:
        with pytest.raises(ProfileError, match="string index has no METADATA entry"):   # (the entry it was)
            read_profile(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    lay, streams = split_streams(path, np.frombuffer(bytes(raw), np.uint8))
    strings = StringTable(path, lay, streams[layout.TAG_STRING_DATA], streams[layout.TAG_STRING_INDEX])
    assert strings.virt_addr.nbytes < 1 << 20 and strings.addr_of(layout.MAX_VIRTUAL_STRING_ID) == 8
    assert strings.addr_of(layout.MAX_VIRTUAL_STRING_ID - 1) == -1


def test_a_command_line_with_non_ascii_and_quotes_is_read(tmp_path):
    """rustc writes its METADATA's command line with Rust's escapes (``\\u{e9}``, ``\\'``), which JSON has not: every
    real profile of a crate under a path with an ``é`` or a ``'`` was refused ("METADATA is not JSON"). A real rustc
    here writes one such profile; its command line decodes whole."""
    from tests.helpers.selfprofile import rust_path

    where = tmp_path / "prof é'x"
    where.mkdir()
    source = where / "hello.rs"
    source.write_bytes(fixture_path("selfprofile/hello-default/hello.rs").read_bytes())
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", PATH=rust_path())
    subprocess.run(["rustc", "--crate-name", "hello", f"-Zself-profile={where / 'out'}", str(source), "-o",
                    str(where / "hello")], cwd=where, env=env, check=True, capture_output=True, timeout=300)
    from pipeline.decode.measureme.reader import rust_escapes_as_json

    assert rust_escapes_as_json(r'"a \u{e9}\'b \\u{e9} \u{1f600}"') == r'"a \u00e9' + "'" + r'b \\u{e9} \ud83d\ude00"'
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.runs import read_table

    decode.run(tmp_path / "run", Config(), Pool(None), inputs=[where / "out"])
    (row,) = read_table(tmp_path / "run", "decoded", "self_profiles").to_pylist()
    assert row["status"] == "ok" and f"-Zself-profile={where / 'out'}" in row["cmd"], row
