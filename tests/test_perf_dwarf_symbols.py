"""A DWARF run that travels with its ELF files (``capture --perf --perf-call-graph dwarf --symbols``): the decode
unwinds with the run's copies of its images where their recorded paths are on no machine, and gives the stacks of
the decode that read the files where the recording saw them. The unwind rows on disk (``decode.cache_dir``): a
whole entry is read in place of the file's rows, a damaged one is made again.

The input is the test run's debug DWARF recording of a small real cargo build (``tests/helpers/perfbuild.py``)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT
from tests.helpers import perfbuild

perf_tools = pytest.mark.skipif(not perfbuild.have_tools(), reason="needs perf and cargo on PATH")
#: perf.data's record types with a file name (PERF_RECORD_MMAP, PERF_RECORD_MMAP2), and the HEADER_BUILD_ID bit.
MMAP, MMAP2, FEAT_BUILD_ID = 1, 10, 2


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return perfbuild.recorded(tmp_path_factory, "debug", "dwarf")     # (recorded with --symbols)


def _decode(data: Path, run: Path, cache: Path) -> dict:
    config = run.parent / f"{run.name}.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "decode": {"cache_dir": str(cache)}}),
                      encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "decode", str(data), "--run",
                           str(run)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run / "decoded" / "_manifest.json").read_text())["perf"]


def _stacks(run: Path) -> list[list[int]]:
    """Each sample's frames, in file order."""
    samples = pq.read_table(run / "decoded" / "samples.parquet", columns=["stream_pos", "stack_id"]).to_pydict()
    st = pq.read_table(run / "decoded" / "stacks.parquet").to_pydict()
    frames = dict(zip(st["stack_id"], st["frames"]))
    order = np.argsort(samples["stream_pos"], kind="stable")
    return [frames.get(samples["stack_id"][i]) or [] for i in order]


def _elsewhere(name: str) -> str:
    """``name`` moved to a directory on no machine: its first directory's name as as many '~' (the same length, so
    the records keep their sizes)."""
    first = name.split("/")[1]
    return "/" + "~" * len(first) + name[1 + len(first):]


def _hidden(data: bytes) -> tuple[bytes, dict[str, str]]:
    """The recording with the file names of its MMAP/MMAP2 records and of its build-id table (perf's
    ``build_id_event``: header, pid, 24 bytes of build id, the name) moved by :func:`_elsewhere`; and the names
    moved (old -> new)."""
    out = bytearray(data)
    moved: dict[str, str] = {}

    def move(at: int, end: int) -> None:
        stop = data.index(b"\0", at, end)
        name = data[at:stop].decode("utf-8", "replace")
        if name.startswith("/") and name.count("/") >= 2:
            moved[name] = _elsewhere(name)
            out[at:stop] = moved[name].encode()

    for off, rtype, size in perfbuild.record_offsets(data):
        if rtype in (MMAP, MMAP2):
            # (header, pid, tid, addr, len, pgoff; MMAP2 then maj, min, ino, ino_generation or the build id, prot,
            # flags)
            move(off + (40 if rtype == MMAP else 72), off + size)
    data_at, data_size = struct.unpack_from("<QQ", data, 40)
    features = int.from_bytes(data[72:104], "little")
    assert features >> FEAT_BUILD_ID & 1, "perf wrote no build-id table"
    section = data_at + data_size + 16 * bin(features & ((1 << FEAT_BUILD_ID) - 1)).count("1")
    at, size = struct.unpack_from("<QQ", data, section)
    end = at + size
    while at + 36 < end:
        ev_size = struct.unpack_from("<H", data, at + 6)[0]
        move(at + 36, at + ev_size)
        at += ev_size
    return bytes(out), moved


@perf_tools
def test_a_dwarf_run_unwinds_with_its_own_copies_where_the_recorded_paths_are_absent(captured, tmp_path):
    """The recording's file names moved to directories on no machine, and the run's copies of the files (``symbols/
    elf``) moved to the keys of those names, as a capture there would have made them: the decode unwinds with the
    copies and gives every sample the frames of the decode that read the files where the recording saw them. Without
    the copies the same file unwinds no user stack past its leaf."""
    from pipeline.decode.perf.elfload import path_key

    data = captured / "input" / "perf.data"
    base = _decode(data, tmp_path / "base", tmp_path / "cache-base")
    assert base["dwarf_unwind"]["images_from_run_symbols"] == 0
    assert base["dwarf_unwind"]["samples_unwound"] >= 0.8 * base["samples"]

    moved = tmp_path / "moved"
    shutil.copytree(captured, moved, ignore=shutil.ignore_patterns("decoded"))
    hidden, names = _hidden(data.read_bytes())
    assert names and not any(os.path.lexists(new) for new in names.values())
    (moved / "input" / "perf.data").write_bytes(hidden)
    copies = json.loads((captured / "capture" / "_manifest.json").read_text())["symbols"]
    for c in copies:
        key = c["debug_id"]
        if key.startswith("elf-path-") and c["source"] in names:     # (a file without a build id: by its path)
            new = path_key(names[c["source"]]) + "-" + "-".join(key.split("-")[3:])
            src, dest = moved / "symbols" / "elf" / key, moved / "symbols" / "elf" / new
            if src.is_dir():
                src.rename(dest)
    assert any(c["debug_id"].startswith("elf-path-") for c in copies)       # (librustc_driver, rustup's, has none)

    there = _decode(moved / "input" / "perf.data", moved, tmp_path / "cache-moved")
    assert _stacks(moved) == _stacks(tmp_path / "base")
    unwound = there["dwarf_unwind"]
    # (every copied image, but one that may have no call frame information at all)
    copied = {c["debug_id"] for c in copies if not c["name"].endswith(".debug")}
    assert len(copied) - 1 <= unwound["images_from_run_symbols"] <= len(copied)
    assert unwound["samples_unwound"] == base["dwarf_unwind"]["samples_unwound"]
    assert unwound["user_frames"] == base["dwarf_unwind"]["user_frames"]

    # the unwind rows on disk: those of this machine's files (the decode at the recorded paths) under the copies' keys
    # too, none from the copies themselves; read for the copies in a later decode, with the same stacks
    keys = {c["debug_id"] for c in copies if not c["name"].endswith(".debug")}
    # (every copied image's rows, but one that may have no call frame information at all)
    assert sum((tmp_path / "cache-base" / "cfi" / f"{k}.rows").is_file() for k in keys) >= len(keys) - 1
    assert not any((tmp_path / "cache-moved" / "cfi" / f"{k}.rows").exists() for k in keys)
    shutil.rmtree(moved / "decoded")
    again = _decode(moved / "input" / "perf.data", moved, tmp_path / "cache-base")
    assert again["dwarf_unwind"] == unwound and _stacks(moved) == _stacks(tmp_path / "base")

    bare = tmp_path / "bare"
    shutil.copytree(moved, bare, ignore=shutil.ignore_patterns("symbols", "decoded"))
    without = _decode(bare / "input" / "perf.data", bare, tmp_path / "cache-bare")["dwarf_unwind"]
    assert without["images_from_run_symbols"] == 0 and without["samples_unwound"] < 0.2 * base["samples"]
    assert any("not on this machine" in r for r in without["images_without_cfi"])


def test_unwind_rows_on_disk_are_read_when_whole_and_made_again_when_not(tmp_path):
    """``cfi.cached_rules`` on two real ELF files (the C and math libraries this process runs on): the rows written under a
    key; an entry that is whole is what a later call returns (here: another file's entry put under the key, its rows
    returned, not libm's); a byte changed, the entry cut short, or written by another version: the file's
    own rows made again and the entry written over with them. Rows of a run's copy are read, never written."""
    from pipeline.decode.perf import cfi as C

    with open("/proc/self/maps", encoding="utf-8") as f:
        mapped = {line.split()[-1] for line in f}
    libc, libm = (Path(next(p for p in sorted(mapped) if f"/{lib}.so" in p or f"/{lib}-" in p)) for lib in ("libc", "libm"))
    cache = tmp_path / "cache"
    own = {}
    for key, path in (("elf-path-aa", libm), ("elf-path-bb", libc)):
        own[key], why = C.image_rules(path)
        assert why is None and len(own[key]) > 100
        rows, why = C.cached_rules(path, key, None, cache)
        assert why is None and np.array_equal(rows, own[key])
    entry = {k: cache / "cfi" / f"{k}.rows" for k in own}
    assert all(e.is_file() for e in entry.values())

    # a whole entry is trusted: libc's rows under libm's key are what libm's key gives
    libc_entry = entry["elf-path-bb"].read_bytes()
    entry["elf-path-aa"].write_bytes(libc_entry)
    rows, _ = C.cached_rules(libm, "elf-path-aa", None, cache)
    assert np.array_equal(rows, own["elf-path-bb"])

    header = C._HEAD.size
    damaged = {
        "a row's byte": libc_entry[:header + 40] + bytes([libc_entry[header + 40] ^ 1]) + libc_entry[header + 41:],
        "cut short": libc_entry[:-24],
        "digest": libc_entry[:16] + bytes(16) + libc_entry[32:],
        "another version": libc_entry[:7] + bytes([C.CACHE_FORMAT + 1]) + libc_entry[8:],
        "another symbolic": libc_entry[:32] + b"0.0.0".ljust(32, b"\0") + libc_entry[64:],
        "empty": b"",
    }
    for what, content in damaged.items():
        entry["elf-path-aa"].write_bytes(content)
        rows, why = C.cached_rules(libm, "elf-path-aa", None, cache)
        assert why is None and np.array_equal(rows, own["elf-path-aa"]), what
        assert np.array_equal(C._read_entry(entry["elf-path-aa"]), own["elf-path-aa"]), what
    # a run's copy: its rows read from the cache, never written there
    rows, _ = C.cached_rules(libc, "elf-path-bb", None, cache, keep=False)
    assert np.array_equal(rows, own["elf-path-bb"])
    rows, _ = C.cached_rules(libc, "elf-path-cc", None, cache, keep=False)
    assert np.array_equal(rows, own["elf-path-bb"]) and not (cache / "cfi" / "elf-path-cc.rows").exists()
    # a key that is none of an image's (a made-up copy's directory) is not written
    rows, _ = C.cached_rules(libm, "../escape", None, cache)
    assert np.array_equal(rows, own["elf-path-aa"]) and sorted(p.name for p in (cache / "cfi").iterdir()) == \
        ["elf-path-aa.rows", "elf-path-bb.rows"]
    assert not (tmp_path / "escape.rows").exists()
