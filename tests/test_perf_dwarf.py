"""``capture --perf --perf-call-graph dwarf``: user stacks unwound by the decoder from each sample's register and
stack copy with the images' call frame information, held against ``perf script``'s own DWARF unwinding of the same
file (stack depths, and the frames themselves) on real cargo builds, debug and release, and every return address
they give checked against the image's code; the rows read from Breakpad STACK CFI text; the unwinder as plain Python
(NUMBA_DISABLE_JIT=1) gives the same tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, assert_same_tables
from tests.helpers import perfbuild

pytestmark = pytest.mark.skipif(not perfbuild.have_tools(), reason="needs perf and cargo on PATH")


def test_stack_cfi_rows():
    from pipeline.decode.perf import cfi as C

    text = b"\n".join([
        b"STACK CFI INIT 1000 20 .cfa: $rsp 8 + .ra: .cfa -8 + ^",
        b"STACK CFI 1001 .cfa: $rsp 16 + $rbp: .cfa -16 + ^",
        b"STACK CFI 1004 .cfa: $rbp 16 +",
        b"STACK CFI INIT 1020 10 .cfa: $rsp 8 + .ra: .cfa -8 + ^",
        b"STACK CFI 1030 .cfa: $rsp 32 +",          # (at its FDE's end: none of its addresses, left out)
        b"STACK CFI INIT 2000 10 .cfa: $rsp 8 + $rip 15 & 10 >= 8 * + .ra: .cfa -8 + ^",
        b"STACK CFI garbage"])
    rows = C.parse(text)
    got = [(int(r["start"]), int(r["cfa_reg"]), int(r["cfa_off"]), int(r["ra_off"]), int(r["bp_off"])) for r in rows]
    N, U = C.NO_OFFSET, C.UNSUPPORTED
    assert got == [(0x1000, C.RSP, 8, -8, N), (0x1001, C.RSP, 16, -8, -16), (0x1004, C.RBP, 16, -8, -16),
                   (0x1020, C.RSP, 8, -8, N), (0x1030, U, 0, N, N), (0x2000, U, 0, -8, N), (0x2010, U, 0, N, N)]
    # file offsets: a second segment loaded 0x1000 above its file offset
    moved = C.to_file_offsets(rows, [(0, 0, 0x1010), (0x1800, 0x2000, 0x100)])
    assert [int(s) for s in moved["start"]] == [0x1000, 0x1001, 0x1004, 0x1800, 0x1810]


@pytest.fixture(scope="module")
def dwarf_run(tmp_path_factory):
    """The debug build recorded with ``--perf-call-graph dwarf`` (once per test run). Read it, never write into it."""
    return perfbuild.recorded(tmp_path_factory, "debug", "dwarf")


@pytest.fixture(scope="module", params=perfbuild.PROFILES)
def each_dwarf_run(request, tmp_path_factory):
    """The debug build, then the release one, each recorded with ``--perf-call-graph dwarf`` and through every stage
    once per test run."""
    return perfbuild.analyzed(tmp_path_factory, request.param, "dwarf")


def _decode(data, run, nojit=False):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"} | ({"NUMBA_DISABLE_JIT": "1"} if nojit else {})
    config = Path(run).parent / f"{Path(run).name}-config.yaml"    # (unwind rows made here, not read from ~/.cache)
    config.write_text(f"decode:\n  cache_dir: '{Path(run).parent / (Path(run).name + '-cache')}'\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "decode", str(data), "--run",
                           str(run)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def _perf_script_stacks(data) -> list[list[int]]:
    """Each sample's frames as ``perf script`` unwinds them (no inline frames): kernel addresses, and user ones
    as perf shows them (file-relative; a return address minus one), perf's end marker left out. (Each sample's
    line of thread and time begins its frames: a sample with none prints no more.)"""
    out = subprocess.run(["perf", "script", "--no-inline", "-F", "tid,time,ip", "-i", str(data)], capture_output=True,
                         text=True, errors="replace", check=True).stdout
    stacks: list[list[int]] = []
    for line in out.splitlines():
        if line.rstrip().endswith(":"):
            stacks.append([])
        elif line.strip() and int(line.split()[0], 16) != (1 << 64) - 1:
            stacks[-1].append(int(line.split()[0], 16))
    return stacks


def _page_offsets(frames: list[int], ours: bool) -> list[int]:
    """Frames compared where a mapping cannot move them: kernel addresses whole, user ones by their offset in the
    page (a mapping starts at a page and maps from a page), ours as perf shows return addresses (minus one)."""
    out, user = [], 0
    for x in frames:
        if x >= 1 << 63:
            out.append(x)
        else:
            out.append((x - (1 if ours and user else 0)) & 0xFFF)
            user += 1
    return out


def _after_call(code: bytes) -> bool:
    """Whether ``code``, the bytes just before a return address, ends with an x86-64 call instruction: ``E8 rel32``,
    or ``FF /2`` (an indirect call through a register or memory: an optional REX prefix, ModRM, SIB, displacement).
    (Of 20,000 random offsets in librustc_driver's code, 1.6 % pass.)"""
    if len(code) >= 5 and code[-5] == 0xE8:
        return True
    for n in range(2, min(len(code), 8) + 1):
        p = len(code) - n
        p += 0x40 <= code[p] <= 0x4F
        if p + 1 >= len(code) or code[p] != 0xFF or (code[p + 1] >> 3) & 7 != 2:
            continue
        mod, rm = code[p + 1] >> 6, code[p + 1] & 7
        size = 2 + {0: 4 if rm == 5 else 0, 1: 1, 2: 4, 3: 0}[mod]
        if mod != 3 and rm == 4:        # (a SIB byte; with base 5 and mod 0, a 32-bit displacement too)
            size += 1 + (4 if mod == 0 and p + 2 < len(code) and code[p + 2] & 7 == 5 else 0)
        if p + size == len(code):
            return True
    return False


def _return_addresses(run) -> tuple[int, int, int]:
    """Of our user frames past each sample's leaf (return addresses): how many there are, how many follow a call
    instruction in the file of the mapping that held them at the sample's time, and how many lie in no file."""
    img = pq.read_table(run / "decoded" / "images.parquet", columns=[
        "pid", "base", "size", "pgoff", "file_name", "load_timestamp", "unload_timestamp"]).to_pylist()
    by_pid: dict[int, list[dict]] = {}
    for r in img:
        by_pid.setdefault(r["pid"], []).append(r)
    samples = pq.read_table(run / "decoded" / "samples.parquet", columns=["pid", "timestamp", "stack_id"]).to_pylist()
    st = pq.read_table(run / "decoded" / "stacks.parquet").to_pydict()
    by_id = dict(zip(st["stack_id"], st["frames"]))
    files: dict[str, BinaryIO] = {}
    total = follow = nowhere = 0
    with ExitStack() as stack:
        for s in samples:
            for a in [x for x in by_id.get(s["stack_id"]) or [] if x < 1 << 63][1:]:
                total += 1
                alive = [r for r in by_pid.get(s["pid"], []) if r["base"] <= a < r["base"] + r["size"]
                         and (r["load_timestamp"] or 0) <= s["timestamp"] < (r["unload_timestamp"] or 1 << 62)]
                r = max(alive, key=lambda r: r["load_timestamp"] or 0, default=None)
                if r is None or not r["file_name"].startswith("/"):
                    nowhere += 1
                    continue
                if r["file_name"] not in files:
                    files[r["file_name"]] = stack.enter_context(open(r["file_name"], "rb"))
                f = files[r["file_name"]]
                at = a - r["base"] + r["pgoff"]
                f.seek(max(at - 8, 0))
                follow += _after_call(f.read(at - max(at - 8, 0)))
    return total, follow, nowhere


def test_dwarf_stacks_are_perf_scripts(each_dwarf_run):
    """Our stacks are perf script's or go on from them, at least as deep (median and 90th percentile within one
    frame), and every frame past the leaf is a return address that follows a call instruction."""
    run = each_dwarf_run
    data = run / "input" / "perf.data"
    capture = json.loads((run / "capture" / "_manifest.json").read_text())["recording"]
    assert capture["call_graph"] == "dwarf"
    perf = json.loads((run / "decoded" / "_manifest.json").read_text())["perf"]
    unwound = perf["dwarf_unwind"]
    assert unwound["images_with_cfi"] >= 5 and unwound["samples_unwound"] >= 0.9 * perf["samples"]
    images = pq.read_table(run / "decoded" / "images.parquet", columns=["file_name"]).column(0).to_pylist()
    assert not any(n.endswith((".rlib", ".rmeta")) for n in images)     # (data mappings are no images)

    sids = pq.read_table(run / "decoded" / "samples.parquet").column("stack_id").to_pylist()
    st = pq.read_table(run / "decoded" / "stacks.parquet").to_pydict()
    by_id = dict(zip(st["stack_id"], st["frames"]))
    ours = [_page_offsets(by_id.get(s) or [], True) for s in sids]
    theirs = [_page_offsets(s, False) for s in _perf_script_stacks(data)]
    assert len(ours) == len(theirs) > 100
    # Where the two differ, perf's unwinding stopped early and ours is deeper; the extra frames are real (below).
    # perf 6.1 unwinds with libunwind, and its glue (util/unwind-libunwind-local.c, read_unwind_spec_eh_frame) takes
    # a file's load address to be the lowest start of any mapping of that file in the thread's maps. perf keeps maps
    # across exec and copies them at fork, so a rustc that cargo forked still holds the libc and ld.so of the rustup
    # proxy that cargo's pid exec'd from (and rust-lld maps libc.so.6 as a file to link against). Where such a
    # mapping lies below the live one, perf looks for libc's .eh_frame_hdr at the wrong address, libunwind finds no
    # unwind info, and its frame-pointer fallback ends at a zero $rbp or guesses. Replaying perf's maps from
    # `perf script --show-mmap-events` predicts it sample by sample: of 86 samples (a debug and a release build)
    # whose stacks reach start_thread, perf stopped there in the 84 whose process had a lower libc mapping and went
    # on to clone3 in the 2 that had none; `perf script -v` shows the libc lookup, then the fallback's read of the
    # saved $rbp (0). So perf's stacks end at start_thread (ours: then __clone3, whose CFI makes it the outermost
    # frame, as gdb has it), at __libc_start_call_main (ours: on to _start) and ld.so's call_init (ours: on to
    # _dl_init and ld.so's entry code), at the leaf in libc's syscall wrappers and memmove (ours: on to their
    # callers), and skip a frame through ld.so (_dl_start). perf also refuses to read the last 8 bytes of the stack
    # copy (`addr + 8 >= end`), a return address saved there included. Hence ours are deeper, at the 90th percentile
    # by up to two frames, and the target, stacks as deep as perf's unwinding gives, reads: ours not shallower at the
    # median and at the 90th percentile by more than one frame.
    depth = np.array([len(s) for s in ours]), np.array([len(s) for s in theirs])
    for name, stat in (("median", np.median), ("p90", lambda a: np.percentile(a, 90))):
        assert stat(depth[0]) >= stat(depth[1]) - 1, (name, stat(depth[0]), stat(depth[1]))
    same = sum(a == b for a, b in zip(ours, theirs))
    deeper = sum(len(a) > len(b) and a[:len(b)] == b for a, b in zip(ours, theirs))
    shallower = int((depth[0] < depth[1]).sum())
    # (the rest: perf's frame-pointer guesses past a libc or ld.so frame, which skip one or end elsewhere; how many
    # samples land where perf guesses varies with the recording: 84-97 % were perf's stack or a prefix of ours)
    assert same >= 0.5 * len(ours) and same + deeper >= 0.75 * len(ours), (same, deeper, len(ours))
    assert shallower <= 0.02 * len(ours), (shallower, len(ours))
    # our frames are real ones: each return address follows a call in its image's code (at random, 1.6 % would; a
    # signal handler's return to the kernel's trampoline would not, hence the thousandth)
    total, follow, nowhere = _return_addresses(run)
    assert total > 5 * len(ours) and nowhere <= 0.005 * total, (total, nowhere)
    assert follow >= 0.999 * (total - nowhere), (total, follow, nowhere)


def test_dwarf_in_tiny_parts_equals_one_part(dwarf_run, tmp_path):
    """The unwind runs in each part of the file (``decode.partition_bytes``), with the images of the whole file:
    about 20 parts give the tables of one."""
    from pipeline.cluster import Pool
    from tests.test_perf_parts import ONE_PART, _decode as decode_parts, tiny_parts

    data = dwarf_run / "input" / "perf.data"
    one = decode_parts(data, tmp_path / "one", Pool(None), ONE_PART)
    many = decode_parts(data, tmp_path / "many", Pool(None), tiny_parts(data))
    assert many["parts"] >= 15 and many["dwarf_unwind"] == one["dwarf_unwind"]
    assert one["dwarf_unwind"]["samples_unwound"] >= 0.9 * one["samples"]
    assert assert_same_tables(tmp_path / "one" / "decoded", tmp_path / "many" / "decoded") == 8


def test_dwarf_unwinding_without_jit_equals_compiled(tmp_path):
    """The CFI scan and the unwinder as plain Python give the compiled run's tables, on a real recording of a small
    program (gzip; its images' CFI is small enough to scan byte by byte in Python, rustc's 100 MB is not)."""
    perfbuild.require_recording()
    blob = tmp_path / "blob"
    blob.write_bytes(np.random.default_rng(57).integers(0, 16, 12 << 20, dtype=np.uint8).tobytes())
    run = tmp_path / "capture"
    subprocess.run([sys.executable, "-m", "pipeline", "capture", "--perf", "--perf-call-graph", "dwarf", "--run",
                    str(run), "--", "gzip", "-k", "-f", str(blob)], cwd=tmp_path, check=True, stdout=subprocess.DEVNULL)
    data = run / "input" / "perf.data"
    jit, nojit = _decode(data, tmp_path / "jit"), _decode(data, tmp_path / "nojit", nojit=True)
    assert assert_same_tables(jit / "decoded", nojit / "decoded") == 8
    perf = json.loads((jit / "decoded" / "_manifest.json").read_text())["perf"]
    assert perf["samples"] > 100 and perf["dwarf_unwind"]["samples_unwound"] > 0.5 * perf["samples"]


def test_the_pipeline_on_a_dwarf_run(each_dwarf_run):
    """Every stage on the DWARF capture: the unwound frames resolve to functions, and many user stacks reach the
    start of their thread (with frame pointers, rustc's end inside librustc_driver: 1 sample of 538 reaches main;
    an 8 KB stack copy still cuts the deepest short, the more so in a release build, whose LLVM passes nest deeper:
    there about a tenth of the samples reach it, in a debug build about a sixth)."""
    run = each_dwarf_run
    symbolized = json.loads((run / "symbolized" / "_manifest.json").read_text())
    assert symbolized["resolution_rate"] >= 0.9, symbolized["resolution_rate"]
    functions = pq.read_table(run / "aggregated" / "cpu_by_function.parquet").to_pylist()
    total = pq.read_table(run / "decoded" / "samples.parquet").num_rows
    roots = sum(r["inclusive_samples"] for r in functions
                if r["function"] in ("start_thread", "__libc_start_call_main") and r["module"] == "libc.so.6")
    assert roots >= 0.05 * total, (roots, total)
    assert (run / "report" / "index.html").is_file()
