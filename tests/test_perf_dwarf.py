"""``capture --perf --perf-call-graph dwarf``: user stacks unwound by the decoder from each sample's register and
stack copy with the images' call frame information, held against ``perf script``'s own DWARF unwinding of the same
file (stack depths, and the frames themselves) on real cargo builds, debug and release; the rows read from Breakpad
STACK CFI text; the unwinder as plain Python (NUMBA_DISABLE_JIT=1) gives the same tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    proc = subprocess.run([sys.executable, "-m", "pipeline", "decode", str(data), "--run", str(run)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
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


def test_dwarf_stacks_are_perf_scripts(each_dwarf_run):
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
    # perf's unwinder gives up at the leaf in some of libc's assembly functions (memmove, strlen, sysmalloc), whose
    # CFI this unwinder follows to their callers (memmove <- codegen_crate, sysmalloc <- malloc <- operator new):
    # the depths are compared where perf got past the leaf, and most of ours are perf's stack or go on from it
    def user(frames):
        return sum(1 for x in frames if x < 1 << 63)

    # Where perf got past the leaf it still skips a frame the CFI gives now and then (ld.so's _dl_start between
    # _dl_sysdep_start and _start; cargo's WorkspaceRootConfig::members_paths under Workspace::new), which moves
    # the deepest tenth more than the middle: the median within one frame, the 90th percentile within two.
    past = [i for i, t in enumerate(theirs) if user(t) >= 2]
    assert len(past) >= 0.6 * len(theirs)
    depth = np.array([len(ours[i]) for i in past]), np.array([len(theirs[i]) for i in past])
    for stat, within in ((np.median, 1), (lambda a: np.percentile(a, 90), 2)):
        assert abs(stat(depth[0]) - stat(depth[1])) <= within, (stat(depth[0]), stat(depth[1]))
    same = sum(a == b for a, b in zip(ours, theirs))
    deeper = sum(len(a) > len(b) and a[:len(b)] == b for a, b in zip(ours, theirs))
    # (the rest: mostly stacks through ld.so where perf's frames skip one that the CFI gives, or end where no FDE is)
    assert same >= 0.5 * len(ours) and same + deeper >= 0.85 * len(ours), (same, deeper, len(ours))
    assert np.median([len(s) for s in ours]) >= np.median([len(s) for s in theirs])


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
