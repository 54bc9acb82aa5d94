"""The perf.data decoder (``pipeline.decode.perf``) and ELF symbolization on real cargo builds recorded here with
``bootprof capture --perf`` (a workspace with crates from Debian's registry, ``tests/helpers/perfbuild.py``), held
against perf's own tools: samples per process and thread equal ``perf script``'s, the top user-space functions by
self samples equal ``perf report``'s, in the debug build and the release one; damaged copies give error rows and
the rest of the file; then the whole pipeline on the captured run."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import perfbuild

pytestmark = pytest.mark.skipif(not perfbuild.have_tools(), reason="needs perf and cargo on PATH")


@pytest.fixture(scope="session")
def perf_run(tmp_path_factory):
    """The debug build recorded with perf (once per test run), through every stage. Read it, never write into it."""
    return perfbuild.analyzed(tmp_path_factory)


@pytest.fixture(scope="session", params=perfbuild.PROFILES)
def each_profile(request, tmp_path_factory):
    """The debug build, then the release one (``cargo build --release``), each recorded once per test run
    (``perfbuild.CALL_GRAPH_OF``) and through every stage."""
    return perfbuild.analyzed(tmp_path_factory, request.param, perfbuild.CALL_GRAPH_OF[request.param])


def _decode(path: Path, run: Path):
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.config import Config

    config = Config()
    config.cluster.mode = "synchronous"
    return decode.run(run, config, Pool(None), inputs=[path])


def test_layouts_match_the_format_notes():
    from pipeline.decode.perf import layout as L

    assert L.FILE_HEADER.itemsize == L.FILE_HEADER_SIZE == 104
    assert L.SECTION.itemsize == 16
    assert L.MMAP2_FILENAME == 8 + 4 * 2 + 8 * 3 + 4 * 2 + 8 * 2 + 4 * 2     # pid tid, addr len pgoff, maj min, ino gen, prot flags
    assert L.TASK_SIZE == 8 + 4 * 4 + 8


def test_capture_manifest_names_the_recording(perf_run):
    rec = json.loads((perf_run / "capture" / "_manifest.json").read_text())["recording"]
    assert rec["tool"] == "perf" and rec["stopped"] and rec["perf_exit_code"] == 0
    assert Path(rec["path"]).parts[-2:] == ("input", "perf.data") and rec["bytes_per_s"] > 0
    assert rec["size"] == (perf_run / "input" / "perf.data").stat().st_size > 0
    assert any(b["kernel"] for b in rec["build_ids"]) and any(b["file"].endswith("libc.so.6") for b in rec["build_ids"])
    assert not (perf_run / "input" / "perf.partial.data").exists()


def test_samples_per_process_and_thread_equal_perf_script(each_profile):
    samples = pq.read_table(each_profile / "decoded" / "samples.parquet", columns=["pid", "tid"]).to_pylist()
    ours_tid = Counter((s["pid"], s["tid"]) for s in samples)
    ours_pid = Counter(s["pid"] for s in samples)
    per_pid, per_tid = perfbuild.perf_script_counts(each_profile / "input" / "perf.data")
    assert sum(per_pid.values()) > 200
    assert ours_pid == per_pid
    assert ours_tid == per_tid


def test_processes_have_lifetimes_and_names(perf_run):
    procs = pq.read_table(perf_run / "decoded" / "processes.parquet").to_pylist()
    rustc = [p for p in procs if p["image_name"] == "rustc"]
    assert len(rustc) >= 6      # (tiny, small, itoa, fnv, the build script, app; cargo's probes)
    for p in rustc:
        assert p["start_ns"] is not None and p["end_ns"] is not None and p["start_ns"] < p["end_ns"]
        assert p["parent_pid"] is not None
    samples = pq.read_table(perf_run / "decoded" / "samples.parquet", columns=["pid", "stack_id"])
    assert samples.column("stack_id").null_count == 0


def _our_self_samples(run: Path) -> tuple[Counter, Counter, int]:
    """Self samples per (module, function name) (the leaf frame's function, outermost of its inline chain: what perf
    reports without --inline), per (module, raw (mangled) name), and the kernel's together, from decoded/samples and
    symbolized/frames."""
    import duckdb

    con = duckdb.connect()
    rows = con.execute(f"""
        WITH f AS (SELECT pid, address, any_value(function) AS function, any_value(raw_name) AS raw_name,
                          any_value(module) AS module
                   FROM read_parquet('{run}/symbolized/frames.parquet') WHERE leaf AND inline_depth = 0
                   GROUP BY pid, address)
        SELECT f.module, f.function, f.raw_name, count(*) FROM read_parquet('{run}/decoded/samples.parquet') s
        LEFT JOIN f ON f.pid = s.pid AND f.address = s.ip GROUP BY ALL""").fetchall()
    user: Counter = Counter()
    raw: Counter = Counter()
    kernel = 0
    for module, function, raw_name, n in rows:
        if function == "[kernel]":
            kernel += n
        else:
            user[(module, function)] += n
            raw[(module, raw_name)] += n
    return user, raw, kernel


def _demangled_as_binutils(raw: Counter) -> Counter:
    """``raw``'s counts by the names binutils' demangler (``c++filt --no-params``) gives the mangled ones, as perf
    names C++ functions: bootprof's demangler writes an empty template parameter pack apart
    (``llvm::AnalysisManager<llvm::Function, >`` for perf's ``llvm::AnalysisManager<llvm::Function>``)."""
    keys = [k for k in raw if k[1] and k[1].startswith("_Z")]
    out = subprocess.run(["c++filt", "--no-params"], input="\n".join(k[1] for k in keys), capture_output=True,
                         text=True, errors="replace", check=True).stdout.splitlines()
    by: Counter = Counter()
    for (module, _), name in zip(keys, out):
        by[(module, name)] += raw[(module, _)]
    return by


def test_top_functions_equal_perf_report(each_profile):
    theirs, dsos, their_kernel = perfbuild.perf_report_self(each_profile / "input" / "perf.data")
    ours, raw, our_kernel = _our_self_samples(each_profile)
    assert our_kernel == their_kernel       # (perf names kernel functions from kallsyms; bootprof says [kernel])
    files = {Path(f).name: f for f in pq.read_table(each_profile / "decoded" / "images.parquet",
                                                    columns=["file_name"]).column(0).to_pylist()}
    # (the [vdso] has no path: symbolize read it from perf's build-id cache or this process's own)
    lookups = json.loads((each_profile / "symbolized" / "_manifest.json").read_text())["debug_ids"]
    files["[vdso]"] = next((d["source"] for d in lookups if "vdso" in (d.get("source") or "")), "[vdso]")
    # perf's top 20 named user-space functions (rows perf could not name, shown as addresses, left out)
    named = [(name, n) for name, n in theirs.most_common() if not name.startswith("0x")][:20]
    assert len(named) == 20
    binutils = _demangled_as_binutils(raw) if shutil.which("c++filt") else Counter()
    for name, n in named:
        def ours_of(names: set[str], counts: Counter = ours) -> int:
            return sum(counts.get((module, a), 0) for module in dsos[name] for a in names)

        def close(got: int) -> bool:
            return abs(got - n) <= max(1, 0.01 * n)

        got = ours_of({name})
        if not close(got):  # (a function with several names at its address: perf and the debug info choose apart)
            got = ours_of(set().union(*[perfbuild.aliases(files[d], name) for d in dsos[name] if d in files]))
        if not close(got):  # (a C++ name our demangler spells apart)
            got = ours_of({name}, binutils)
        assert close(got), (name, sorted(dsos[name]), n, got)


def test_the_vdso_is_read_from_this_process_without_perfs_cache(perf_run, tmp_path, monkeypatch):
    """Where perf's build-id cache is gone, the [vdso] of the kernel that was recorded is this process's own."""
    from symbolic import Archive

    from pipeline.symbolize.elf import VDSO, vdso_file

    images = pq.read_table(perf_run / "decoded" / "images.parquet", columns=["file_name", "build_id"]).to_pylist()
    bid = next(i["build_id"] for i in images if i["file_name"] == VDSO and i["build_id"])
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    path, reason = vdso_file(bid, tmp_path / "cache")
    assert reason is None and path.parent == tmp_path / "cache"
    assert next(iter(Archive.open(str(path)).iter_objects())).code_id == bid


def _damaged(perf_run: Path, tmp_path: Path, kind: str) -> Path:
    data = bytearray((perf_run / "input" / "perf.data").read_bytes())
    recs = perfbuild.record_offsets(bytes(data))
    samples = [r for r in recs if r[1] == 9]
    victim = samples[len(samples) // 2][0]
    if kind == "truncated":
        data = data[:victim + 20]
    elif kind == "zero_size":
        data[victim + 6:victim + 8] = b"\0\0"
    elif kind == "unknown_type":
        data[victim:victim + 4] = (200).to_bytes(4, "little")
    path = tmp_path / f"{kind}.data"
    path.write_bytes(bytes(data))
    return path


def _flipped(perf_run: Path, tmp_path: Path) -> tuple[Path, set[tuple[str, int]], int]:
    """A copy of the recording with 64 bytes flipped at random (a fixed seed) in the records' bodies and misc fields,
    and four samples damaged where the walk must meet an error whatever the recording holds: headers that cannot be
    a record's (size 0, an unknown type, a size not a multiple of 8), each an error and a resync at the next record,
    and a callchain longer than its sample. Returns the file, the (kind, byte offset) of the errors it must give,
    and how many samples the random flips can cost at most (each one its record's, as the sizes stay whole).

    (The type and size fields are left out of the random part: a flipped one there gives an error or none as the
    bytes happen to fall, and a size's high byte flipped makes a record up to 64 KB long that the walk follows, no
    error, over most of this ~90 KB recording: whether the file had errors and how many samples it kept would be
    chance, as each test run records a new build.)"""
    data = bytearray((perf_run / "input" / "perf.data").read_bytes())
    recs = perfbuild.record_offsets(bytes(data))
    samples = [r for r in recs if r[1] == 9]
    zero, unknown, unaligned, long_chain = (samples[len(samples) * k // 5] for k in range(1, 5))
    planted = {zero[0], unknown[0], unaligned[0], long_chain[0]}
    spots = [p for off, _t, size in recs if off not in planted for p in (off + 4, off + 5, *range(off + 8, off + size))]
    hit = set()
    for p in random.Random(57).sample(spots, 64):
        data[p] ^= 0xFF
        hit.add(next(off for off, _t, size in recs if off <= p < off + size))
    must = set()
    for (off, _t, size), rtype, new_size in ((zero, 9, 0), (unknown, 200, unknown[2]),
                                             (unaligned, 9, unaligned[2] + 4)):
        data[off:off + 4] = rtype.to_bytes(4, "little")
        data[off + 6:off + 8] = new_size.to_bytes(2, "little")
        must |= {("record", off), ("resync", off + size)}
    nr = long_chain[0] + perfbuild.callchain_at(bytes(data))
    data[nr:nr + 8] = (1 << 40).to_bytes(8, "little")
    must.add(("short_payload", long_chain[0]))
    path = tmp_path / "flipped.data"
    path.write_bytes(bytes(data))
    return path, must, len(hit & {s[0] for s in samples})


@pytest.mark.parametrize("kind", ["truncated", "zero_size", "unknown_type", "flipped"])
def test_damaged_files_give_error_rows_and_the_rest(perf_run, tmp_path, kind):
    intact = pq.read_table(perf_run / "decoded" / "samples.parquet").num_rows
    if kind == "flipped":
        path, must, spare = _flipped(perf_run, tmp_path)
    else:
        path = _damaged(perf_run, tmp_path, kind)
    summary = _decode(path, tmp_path / "run")["perf"]
    errors = pq.read_table(tmp_path / "run" / "decoded" / "errors.parquet").to_pylist()
    assert summary["errors"] == len(errors) > 0
    assert all(str(path) in e["message"] and e["file_offset"] >= 0 for e in errors)
    kinds = Counter(e["kind"] for e in errors)
    got = summary["samples"]
    if kind == "truncated":
        assert kinds["truncated"] >= 1 and intact // 2 - 5 <= got < intact
    elif kind in ("zero_size", "unknown_type"):
        # the record is lost, the walk finds the next one and decodes the rest
        assert kinds["record"] == 1 and kinds["resync"] == 1
        assert got == intact - 1
    else:
        # the four damaged samples lost, each with its errors; a random flip costs at most its record
        assert must <= {(e["kind"], e["file_offset"]) for e in errors}, sorted(must)
        assert kinds["record"] == kinds["resync"] == 3
        assert intact - 4 - spare <= got <= intact - 4


def test_refused_files_say_why(tmp_path):
    from pipeline.errors import InputError

    big = tmp_path / "big.data"
    big.write_bytes(b"2ELIFREP" + bytes(200))
    with pytest.raises(InputError, match="big-endian"):
        _decode(big, tmp_path / "r1")
    pipe = tmp_path / "pipe.data"
    pipe.write_bytes(b"PERFILE2" + (16).to_bytes(8, "little") + bytes(100))
    with pytest.raises(InputError, match="pipe-mode"):
        _decode(pipe, tmp_path / "r2")


def test_whole_pipeline_on_the_captured_run(tmp_path_factory):
    """``bootprof run`` on the captured run directory: every stage, the report with the build's processes."""
    run = perfbuild.analyzed(tmp_path_factory)
    assert (run / "report" / "index.html").is_file()
    by_process = pq.read_table(run / "aggregated" / "cpu_by_process.parquet").to_pylist()
    assert any("rustc" in (r.get("image_name") or r.get("process") or "") for r in by_process)
    functions = pq.read_table(run / "aggregated" / "cpu_by_function.parquet").to_pylist()
    assert any(f["function"] == "[kernel]" for f in functions)
    assert any((f["module"] or "").startswith("librustc_driver") for f in functions)


def test_decode_without_jit_equals_compiled(perf_run, tmp_path):
    """The perf walk once more as plain Python (NUMBA_DISABLE_JIT=1), on the recorded build and its self-profiles
    (and on a damaged copy, for the error and resync paths): the same tables as the compiled walk."""
    import os

    from tests.conftest import ROOT, assert_same_tables

    flipped, must, _ = _flipped(perf_run, tmp_path)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}}))
    for name, inputs in (("real", [perf_run / "input" / "perf.data", perf_run / "selfprofile"]), ("flipped", [flipped])):
        runs = {}
        for mode, extra in (("jit", {}), ("nojit", {"NUMBA_DISABLE_JIT": "1"})):
            env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"} | extra
            runs[mode] = tmp_path / f"{name}-{mode}"
            proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(cfg), "decode", *map(str, inputs),
                                   "--run", str(runs[mode])], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        assert assert_same_tables(runs["jit"] / "decoded", runs["nojit"] / "decoded") == (10 if name == "real" else 8)
        manifests = [json.loads((runs[m] / "decoded" / "_manifest.json").read_text())["perf"] for m in ("jit", "nojit")]
        keep = {k: v for k, v in manifests[0].items() if not k.endswith("_s") and k not in ("mb_per_s",)}
        assert keep == {k: v for k, v in manifests[1].items() if k in keep}
        assert manifests[0]["samples"] > 100 and (name == "real") == (manifests[0]["errors"] == 0)
        if name == "flipped":   # (the error and resync paths taken, whatever the recording holds)
            errors = pq.read_table(runs["jit"] / "decoded" / "errors.parquet").to_pylist()
            assert must <= {(e["kind"], e["file_offset"]) for e in errors}


def _decode_apart(path: Path, run: Path) -> subprocess.CompletedProcess:
    """``bootprof decode`` in a process of its own: a crash of the walk is its exit status, not the test's."""
    from tests.conftest import ROOT

    return subprocess.run([sys.executable, "-m", "pipeline", "decode", str(path), "--run", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_hostile_headers_and_records_are_errors_not_crashes(perf_run, tmp_path):
    """Fields a damaged or made-up file can hold: a sample_type that says each sample has a RAW part it lacks
    (the callchain's frames were written before the sample was found short: a write past the frames array and an
    abort), and a data size of 2^63 (a column of int64 could not hold it: a traceback)."""
    import struct

    data = bytearray((perf_run / "input" / "perf.data").read_bytes())
    attrs_at, = struct.unpack_from("<Q", data, 24)
    raw_bit = bytearray(data)
    struct.pack_into("<Q", raw_bit, attrs_at + 24, struct.unpack_from("<Q", data, attrs_at + 24)[0] | 0x400)
    huge = bytearray(data)
    struct.pack_into("<Q", huge, 48, 1 << 63)
    for name, content in (("raw_bit", raw_bit), ("data_size_2p63", huge)):
        path = tmp_path / f"{name}.data"
        path.write_bytes(bytes(content))
        proc = _decode_apart(path, tmp_path / name)
        assert proc.returncode == 0, (name, proc.returncode, proc.stderr[-2000:])
        summary = json.loads((tmp_path / name / "decoded" / "_manifest.json").read_text())["perf"]
        assert summary["errors"] > 0, name
    assert pq.read_table(tmp_path / "data_size_2p63" / "decoded" / "perf_file.parquet").column("data_size")[0].as_py() \
        == 1 << 63


def test_forks_that_exec_at_once_copy_no_mappings(perf_run, tmp_path):
    """A child that execs before it forks needs none of its parent's mappings: 300 mappings and 300 such forks (a few
    tens of KB) gave 90,000 image rows, and 2,000 of each 1.4 GB of memory."""
    import struct

    data = (perf_run / "input" / "perf.data").read_bytes()
    attrs_at, attrs_size = struct.unpack_from("<QQ", data, 24)
    head = bytearray(data[:attrs_at + attrs_size])
    n = 300
    records = bytearray()
    for i in range(n):      # MMAP of pid 100 (header, pid, tid, addr, len, pgoff, name)
        records += struct.pack("<IHH", 1, 2, 56) + struct.pack("<IIQQQ", 100, 100, 0x400000 + i * 0x1000, 0x1000, 0)
        records += b"/x\0\0\0\0\0\0"
    for k in range(n):      # FORK of 100 (header, pid, ppid, tid, ptid, time), then the child's exec (a COMM)
        records += struct.pack("<IHH", 7, 0, 32) + struct.pack("<IIIIQ", 2000 + k, 100, 2000 + k, 100, 1000 + k)
        records += struct.pack("<IHH", 3, 0x2000, 24) + struct.pack("<II", 2000 + k, 2000 + k) + b"rustc\0\0\0"
    struct.pack_into("<QQ", head, 40, len(head), len(records))
    struct.pack_into("<4Q", head, 72, 0, 0, 0, 0)        # (no feature sections)
    path = tmp_path / "forks.data"
    path.write_bytes(bytes(head + records))
    proc = _decode_apart(path, tmp_path / "forks")
    assert proc.returncode == 0, proc.stderr[-2000:]
    images = pq.read_table(tmp_path / "forks" / "decoded" / "images.parquet")
    assert images.num_rows <= n + 1 and not any(images.column("inherited").to_pylist())
