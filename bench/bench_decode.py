"""ETL decode throughput and memory: ``bootprof decode`` on a synthesized 1 GB trace, beside dissect.etl.

Input: a trace from ``bootprof synth`` (seed 1, 16 simulated CPUs, uncompressed, 8-byte pointers, full
stacks), written once to ``bench/out/synth-<size>/trace.etl`` and reused while its truth file says it
was made with the same settings; plus a slice of it (the header buffer and the first data buffers,
``--slice`` bytes, with BuffersWritten patched) for dissect.etl, whose speed is per byte.

Measured, each run in its own subprocess, with the peak memory of the whole process tree (PSS and RSS,
psutil, summed over the CLI process, the dask scheduler side, the workers' fork server and every worker,
sampled every 50 ms):

* ``bootprof decode`` on the full trace with one dask worker and with one worker per core
  (end to end: process start, cluster start, decode into parquet, joins, manifest), and in one process
  without dask (``cluster.mode: synchronous``: no cluster to start);
* ``bootprof decode`` (one worker) and dissect.etl (record headers only: its fastest mode) on the slice;
* dissect.etl parsing every record's fields (the work the decoder does: 3x slower) on the same slice;
* ``bootprof decode`` (one worker) on an XPRESS-compressed trace of 512 MB of event data (~120 MB file);
* ``bootprof decode`` (one worker) on a trace of the main size with stack keys instead of full stacks
  (what WPR records by default: StackKeyKernel/User references, KeyDelete/KeyRundown definitions);
* ``bootprof decode`` (one worker) on a trace of the main size whose stacks vary as a real build's do
  (``stack_variety`` 2000: ~250,000 distinct stacks per GB instead of ~1,100).

Every run starts with its input in the page cache (read through once just before). Each decode runs
three times and the median run is reported (by stage time; the CLI's wall time is the median too), with the
best stage rate and the first run's wall time beside it: this VM's speed moves by 10-15 % between runs and
between hours, and a best-of-N headline would report its luckiest run. Targets are judged on the median. Per core is
the decode stage's own time with one worker (bytes in, every parquet table out: the manifest's
``decode_s + join_s``); the whole CLI run adds the interpreter, the imports and the dask cluster start and close (1.2-1.5 s here).
Also reported: user and system CPU seconds of the process tree, MB per CPU-second, and a probe of the
machine's speed before and after (``PROBE``: this VM's speed moves by 2-3x between hours; ``PAIR_PROBE``:
how much one core slows the other). The ratio
compares the per-core MB/s with dissect's MB/s on the slice: headers only (the strict ratio, judged against
the target) and with fields (the same work, reported beside it). Targets (reported, not asserted): >= 300 MB/s
per core, >= 100x dissect.etl per core, peak memory < 1.5 GB (PSS: see ``measure``; RSS beside it).

Defaults (``make bench``): 1 GB trace, 64 MB slice. ``--big`` (or ``BENCH_DECODE_BIG=1``) adds the same
measurements on a 4 GB trace to show that memory stays flat. ``--size`` / ``BENCH_DECODE_SIZE`` change the
main size. ``--instructions`` (or ``BENCH_DECODE_INSTRUCTIONS=1``) adds the one measure that does not move
with this VM's speed: the instructions the decode retires per MB, counted by valgrind's callgrind, and the
peer decoder's on the same slices beside it (see ``instructions``; ~5 minutes, ~15 the first time). Writes
``bench/out/decode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

LAST_CPU = [0.0, 0.0]
SEED = 1
SIM_CPUS = 16
#: stack_variety of the varied-stacks case (synth: call-stack templates as a multiple of the smallest set)
VARIETY = 2000
LOGFILE_BUFFERS_WRITTEN = 0x48 + 0x20 + 0x24     # buffer header + SYSTEM header + TRACE_LOGFILE_HEADER field

DISSECT = """
import sys, time
from dissect.etl import ETL
t = time.perf_counter()
n = 0
with open(sys.argv[1], "rb") as fh:
    for rec in ETL(fh):
        rec.header.size
        n += 1
print(n, time.perf_counter() - t)
"""

#: dissect.etl doing the work the decoder does: every record's fields parsed (``rec.event._struct``, as the
#: golden tests read them). Its StackWalk parsing fails (EOFError), so those records' frames are unpacked
#: from the payload bytes with ``struct``, as the stack test does.
DISSECT_FIELDS = """
import struct, sys, time
from dissect.etl import ETL
t = time.perf_counter()
n = 0
with open(sys.argv[1], "rb") as fh:
    for rec in ETL(fh):
        h = rec.header
        h.size
        try:
            vars(rec.event._struct)
        except Exception:
            raw = bytes(h.payload)
            if getattr(h, "hook_id", None) == 0x1820:
                struct.unpack_from("<qII%dQ" % ((len(raw) - 16) // 8), raw)
        n += 1
print(n, time.perf_counter() - t)
"""


#: How fast this machine is right now, beside the decode: the same code and trace decoded at 123-141 MB/s in
#: 2026-11-25 (`a38bbe7`) and 296-350 MB/s in 2026-11-23 (`dece141` to `d150856`), and dissect.etl moved by as much (2.4-3.4 against 7.9 MB/s
#: reading headers). Three probes, each the median of three in a fresh process: the interpreter (5 M turns of
#: a plain Python loop: dissect.etl and the Python around the kernels), memory (16 M random reads from
#: 512 MiB), and the host (a first write of 1 GiB of fresh memory: this VM's host backs guest memory lazily,
#: and every page of fresh heap or page cache a decode touches pays it).
PROBE = """
import statistics, time
import numpy as np
table = np.arange(1 << 26, dtype=np.int64)
where = np.random.default_rng(0).integers(0, len(table), 1 << 24)
loops, reads, touches = [], [], []
for _ in range(3):
    t = time.perf_counter(); s = 0
    for i in range(5_000_000):
        s += i & 7
    loops.append(time.perf_counter() - t)
    t = time.perf_counter(); table.take(where).sum(); reads.append(time.perf_counter() - t)
    t = time.perf_counter(); fresh = np.empty(1 << 30, np.uint8); fresh.fill(1); touches.append(time.perf_counter() - t)
    del fresh
    time.sleep(2)
print(statistics.median(loops), statistics.median(reads), statistics.median(touches))
"""


#: The same loop in two processes at once, one per core of this 2-core VM: how much one core slows the other
#: (2026-11-26 (`3cbe0de`): 10 M turns 1.0 s alone, 1.17 and 1.57 s side by side). Two workers, or one worker beside the client's
#: sha256, run in that state.
PAIR_PROBE = """
import time
t = time.perf_counter(); s = 0
for i in range(5_000_000):
    s += i & 7
print(time.perf_counter() - t)
"""


def machine_probe() -> dict:
    """The machine's speed at the time of the bench (``PROBE``), in seconds: a Python loop of 5 M turns,
    16 M random reads from 512 MiB, a first write of 1 GiB; and the loop's time when one process per core
    runs it at once (``PAIR_PROBE``: the slower of them, median of three)."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    loop, reads, touch = (round(float(x), 3) for x in out.split())
    pairs = []
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-c", PAIR_PROBE], stdout=subprocess.PIPE, text=True)
                 for _ in range(os.cpu_count() or 1)]
        pairs.append(max(float(p.communicate()[0]) for p in procs))
    return {"python_loop_s": loop, "python_loop_all_cores_s": round(statistics.median(pairs), 3),
            "random_reads_s": reads, "fresh_GiB_s": touch}


def synthesize(size: str, compress: bool = False, stack_caching: bool = False, stack_variety: int | None = None) -> Path:
    from pipeline import synth
    from pipeline.config import SynthConfig

    cfg = SynthConfig(seed=SEED, size=size, cpus=SIM_CPUS, compress=compress, stack_caching=stack_caching,
                      stack_variety=stack_variety)
    trace = OUT / (f"synth-{size}{'-xpress' if compress else ''}{'-keys' if stack_caching else ''}"
                   f"{f'-variety{stack_variety}' if stack_variety else ''}") / "trace.etl"
    truth = trace.with_name("trace.truth.json")
    if trace.exists() and truth.exists():
        t = json.loads(truth.read_text())
        from pipeline.synth.truth import GENERATOR_VERSION

        if (t.get("config") == cfg.model_dump(mode="json") and t.get("generator_version") == GENERATOR_VERSION
                and t["trace"]["bytes"] == trace.stat().st_size):
            print(f"reusing {trace} ({trace.stat().st_size / 1e6:,.0f} MB)")
            return trace
    print(f"synthesizing {trace} ({size}) ...", flush=True)
    summary = synth.run(trace, cfg)
    print(f"  {summary['bytes'] / 1e6:,.0f} MB in {summary['seconds']} s "
          f"({summary['bytes'] / 1e6 / summary['seconds']:,.0f} MB/s)")
    return trace


def make_slice(trace: Path, nbytes: int) -> Path:
    """Header buffer + whole data buffers up to ``nbytes``, as a valid trace of its own."""
    dst = trace.with_name(f"slice-{nbytes >> 20}MB.etl")
    with open(trace, "rb") as f, open(dst, "wb") as g:
        buffers, off = 0, 0
        while off < nbytes:
            f.seek(off)
            head = f.read(4)
            if len(head) < 4:
                break
            size = struct.unpack("<I", head)[0]
            f.seek(off)
            g.write(f.read(size))
            off += size
            buffers += 1
        g.seek(LOGFILE_BUFFERS_WRITTEN)
        g.write(struct.pack("<I", buffers))
    return dst


def page_in(path: Path) -> None:
    """Read ``path`` through once, so a run starts with it in the page cache (as after copying a trace
    over). This VM's DAMON pageout evicts cold page cache: a trace left alone for minutes was partly
    back on the 1 GB/s disk, and runs measured that instead of the decoder."""
    buf = bytearray(1 << 24)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def measure(cmd: list[str], env=None) -> tuple[float, int, int, str]:
    """Wall seconds, peak RSS and peak PSS (bytes) of the process tree, stdout; ``LAST_CPU`` gets the user
    and system CPU seconds of the whole tree (every process it waited for).

    RSS counts a page once per process that maps it; PSS divides it among them. Local workers are forked
    from one server process and share its pages (imports, compiled kernels) until they write them, so the
    sum of their RSS counts those pages once per worker and once for the server: the sum of PSS is what
    the tree holds (for spawned processes the two differ by their shared libraries only)."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = peak_pss = 0
    while proc.poll() is None:
        rss = pss = 0
        try:
            procs = [proc] + proc.children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                m = p.memory_full_info()
                rss, pss = rss + m.rss, pss + m.pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        peak, peak_pss = max(peak, rss), max(peak_pss, pss)
        time.sleep(0.05)
    out, err = proc.communicate()
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU[:] = [after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return secs, peak, peak_pss, out


def cluster_config(mode: str, workers: int) -> Path:
    """A config file for ``bootprof decode`` with that cluster (the rest at its defaults)."""
    cfg = OUT / f"decode-{mode}-{workers}w.yaml"
    cfg.write_text(f"cluster:\n  mode: {mode}\n  n_workers: {workers}\n  memory_limit: 4GiB\n")
    return cfg


def decode(trace: Path, workers: int, tag: str, runs: int = 3, mode: str = "local") -> dict:
    """``bootprof decode`` ``runs`` times. Reported: the median run (by the decode stage's own time, the
    manifest's ``decode_s + join_s``) with the median wall time of the whole CLI run, and beside them the
    best stage time and the first run's wall time (this VM backs guest memory lazily, so a process's first
    touch of memory it got back from the host costs up to 2.7 s per GB: runs differ by that). Peak RSS and PSS are
    the highest of the runs. A failure is recorded (last error line) instead of ending the benchmark."""
    cfg = cluster_config(mode, workers)
    done = []
    for _ in range(runs):
        run = OUT / f"run-{tag}"
        page_in(trace)
        try:
            secs, rss, pss, out = measure([sys.executable, "-m", "pipeline", "--config", str(cfg), "decode", str(trace),
                                      "--run", str(run)])
        except RuntimeError as exc:
            lines = [ln for ln in str(exc).splitlines() if "Error" in ln or "error" in ln]
            print(f"decode {tag} failed: {lines[-1] if lines else exc}", file=sys.stderr)
            return {"seconds": float("nan"), "rss": 0, "pss": 0, "records": 0, "error": (lines[-1] if lines else str(exc))[:300]}
        summary = json.loads(out[out.index("{"):])["etl"]
        done.append({"seconds": secs, "rss": rss, "pss": pss, "records": summary["records"], "decode_s": summary.get("decode_s"),
                     "join_s": summary.get("join_s"), "user_s": LAST_CPU[0], "sys_s": LAST_CPU[1]})
    stage = lambda r: (r["decode_s"] or 0) + (r["join_s"] or 0)  # noqa: E731
    by_stage = sorted(done, key=stage)
    median = dict(by_stage[len(by_stage) // 2])
    median["seconds"] = statistics.median(r["seconds"] for r in done)
    median["rss"] = max(r["rss"] for r in done)
    median["pss"] = max(r["pss"] for r in done)
    median["best_stage_s"] = stage(by_stage[0])
    median["first_seconds"] = done[0]["seconds"]
    return median


#: The peer decoder (snail-server's tools; ``run.sh`` installs their runtime libraries and runs one) and the
#: command closest to ``bootprof decode``: the trace read into its samples-with-stacks model.
PEER = ROOT.parent / "shared" / "peers" / "snail" / "run.sh"
PEER_TOOL = ("snail-tool-analysis", "--no-progress", "--no-analysis")
#: Slices of the main trace whose instructions ``instructions`` counts: the difference of the two is the cost
#: of the MBs between them, without the process start, the imports and the stage's fixed steps.
INSTRUCTION_SLICES = (32 << 20, 96 << 20)
#: Shared objects by the part of the work they do, for the breakdown of the count (callgrind names JIT code,
#: here numba's kernels, ``???``).
OBJECT_FAMILIES = (("libcrypto", "sha256"), ("???", "numba kernels"), ("_multiarray_umath", "numpy"),
                   ("libparquet", "parquet writer"), ("libarrow", "arrow (zstd, compute, ipc)"), ("libc.so", "libc"),
                   ("libpython", "python"))


def _instructions_by_family(out: Path) -> dict[str, int]:
    """Instructions of a callgrind output file per ``OBJECT_FAMILIES`` entry (others: ``other``)."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)], capture_output=True,
                          text=True, check=True).stdout
    families: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        obj = m.group(2).rsplit("[", 1)[-1] if "[" in m.group(2) else "???"
        family = next((name for key, name in OBJECT_FAMILIES if key in obj), "other")
        families[family] = families.get(family, 0) + int(m.group(1).replace(",", ""))
    return families


def instructions(trace: Path) -> dict:
    """Instructions retired per MB by ``bootprof decode`` in one process (``cluster.mode: synchronous``),
    counted by callgrind: the same count for the same code and input on any x86-64 machine and in any phase of
    this VM (two runs of the 32 MB slice: 6,189.4 and 6,189.7 M; the marginal count of two benches 24.2 and
    24.6 M per MB: threads interleave, hash seeds and file names differ), where seconds moved by 2-3x between
    hours. The marginal count of the MBs between two slices (``INSTRUCTION_SLICES``) leaves out the
    process start, the imports and the fixed steps. Divided into a rate it says what a core must retire for
    that rate: 300 MB/s needs ``300 * M`` instructions a second; times the in-process stage rate of this
    bench, what this VM's core retired while it ran.

    The input's sha256 is counted apart and left out of the decode's count: valgrind's CPU has no SHA
    instructions, so OpenSSL runs its software rounds there (~28 M instructions a MB), not what the stage
    runs. ``--fair-sched=yes``: with valgrind's default lock, DuckDB's threads waiting for a task spun for
    minutes (88 % of a run's instructions). numba keys its cache on the CPU it sees, and valgrind's is not
    the host's: the first run (of the larger slice; discarded) compiles the kernels for it once (~15
    minutes), and later benches find them in the cache."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {"error": "valgrind is not installed (Debian package valgrind)"}
    cfg = cluster_config("synchronous", 1)
    slices = [make_slice(trace, n) for n in INSTRUCTION_SLICES]
    mb = [sl.stat().st_size / 1e6 for sl in slices]
    if mb[1] - mb[0] < 16:
        return {"error": f"{trace.name} is too small for two slices {INSTRUCTION_SLICES} bytes apart"}
    try:
        counted = [_callgrind(valgrind, [sys.executable, "-m", "pipeline", "--config", str(cfg), "decode", str(sl),
                                         "--run", str(OUT / f"run-callgrind-{sl.stem}")], sl, f"callgrind-{k}")
                   for k, sl in enumerate([slices[-1], *slices])]
    except RuntimeError as e:
        return {"error": str(e)}
    small, big = counted[1], counted[2]
    per_mb = {f: (big.get(f, 0) - small.get(f, 0)) / (mb[1] - mb[0]) / 1e6 for f in big}
    sha = per_mb.pop("sha256", 0.0)
    ours = round(sum(per_mb.values()), 2)
    result = {"slices_MB": [round(m, 1) for m in mb], "M_instructions_per_MB": ours,
              "M_instructions_per_MB_by_part": {f: round(v, 2) for f, v in sorted(per_mb.items(), key=lambda x: -x[1])},
              "sha256_software_M_instructions_per_MB": round(sha, 2)}
    if PEER.exists():
        try:
            peer = peer_instructions(valgrind, slices, mb)
            result.update(peer_M_instructions_per_MB=round(peer, 2), ratio_vs_peer=round(ours / peer, 2))
        except RuntimeError as e:
            result["peer_error"] = str(e)
    return result


def _callgrind(valgrind: str, cmd: list[str], trace: Path, name: str) -> dict[str, int]:
    """``cmd`` run under callgrind, its instructions per ``OBJECT_FAMILIES`` entry; RuntimeError naming ``trace``
    if it fails."""
    out = OUT / f"{name}.out"
    try:
        proc = subprocess.run([valgrind, "--tool=callgrind", "--fair-sched=yes", f"--callgrind-out-file={out}", *cmd],
                              cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"callgrind run of {Path(cmd[0]).name} on {trace.name} failed ({proc.returncode}): "
                               f"{proc.stderr[-300:]}")
        return _instructions_by_family(out)
    finally:
        out.unlink(missing_ok=True)


def peer_instructions(valgrind: str, slices: list[Path], mb: list[float]) -> float:
    """The peer's instructions per MB on the same two slices, counted the same way (the marginal MBs): the
    side-by-side form of the count. The peer reads each trace into its samples-with-stacks model and writes no
    tables, so its count has no part for an output writer."""
    binary = str(PEER.parent / PEER_TOOL[0])
    subprocess.run([str(PEER), *PEER_TOOL, str(slices[0])], capture_output=True)    # installs its libraries
    totals = [sum(_callgrind(valgrind, [binary, *PEER_TOOL[1:], str(sl)], sl, f"callgrind-peer-{sl.stem}").values())
              for sl in slices]
    return (totals[1] - totals[0]) / (mb[1] - mb[0]) / 1e6


def dissect(trace: Path, script: str = DISSECT) -> dict:
    page_in(trace)
    secs, rss, pss, out = measure([sys.executable, "-c", script, str(trace)])
    n, inner = out.split()
    return {"seconds": float(inner), "wall": secs, "rss": rss, "pss": pss, "records": int(n)}


def row(measure_name: str, path: Path, r: dict, seconds: float) -> dict:
    mb = path.stat().st_size / 1e6
    if "error" in r:
        return {"measure": measure_name, "MB": round(mb, 1), "records": 0, "seconds": 0.0, "MB_per_s": 0.0,
                "events_per_s": 0, "peak_rss_MB": 0, "peak_pss_MB": 0, "error": r["error"]}
    out = {"measure": measure_name, "MB": round(mb, 1), "records": r["records"], "seconds": round(seconds, 2),
           "MB_per_s": round(mb / seconds, 1), "events_per_s": int(r["records"] / seconds),
           "peak_rss_MB": round(r["rss"] / 1e6), "peak_pss_MB": round(r["pss"] / 1e6)}
    if r.get("decode_s") is not None:     # the decoder's own timing: buffer decode and join passes
        out["decode_s"], out["join_s"] = r["decode_s"], r["join_s"]
        stage = r["decode_s"] + r["join_s"]
        out["stage_s"] = round(stage, 2)
        out["stage_MB_per_s"] = round(mb / stage, 1)
        out["best_stage_MB_per_s"] = round(mb / r["best_stage_s"], 1)
        out["user_s"], out["sys_s"] = round(r["user_s"], 2), round(r["sys_s"], 2)
        out["first_run_s"] = round(r["first_seconds"], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default=os.environ.get("BENCH_DECODE_SIZE", "1GB"), help="main trace size (1GB)")
    ap.add_argument("--slice", default="64MB", help="slice decoded by dissect.etl (64MB)")
    ap.add_argument("--big", action="store_true", default=os.environ.get("BENCH_DECODE_BIG") == "1",
                    help="also measure a 4 GB trace (memory must stay flat)")
    ap.add_argument("--instructions", action="store_true", default=os.environ.get("BENCH_DECODE_INSTRUCTIONS") == "1",
                    help="also count the decode's instructions per MB with callgrind (phase-independent; ~5 min)")
    args = ap.parse_args()
    from pipeline.units import parse_size

    OUT.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    rows = []
    trace = synthesize(args.size)
    probe_before = machine_probe()
    sl = make_slice(trace, parse_size(args.slice))
    d = dissect(sl)
    rows.append(row("dissect.etl, slice (headers only)", sl, d, d["seconds"]))
    df = dissect(sl, DISSECT_FIELDS)
    fields_row = row("dissect.etl, slice (every record's fields)", sl, df, df["seconds"])
    s1 = decode(sl, 1, "slice-1w")
    rows.append(row("bootprof decode, slice, 1 worker", sl, s1, s1["seconds"]))
    one = decode(trace, 1, f"{args.size}-1w")
    rows.append(row(f"bootprof decode, {args.size}, 1 worker", trace, one, one["seconds"]))
    allc = decode(trace, cores, f"{args.size}-{cores}w")
    rows.append(row(f"bootprof decode, {args.size}, {cores} workers", trace, allc, allc["seconds"]))
    inproc = decode(trace, 1, f"{args.size}-sync", mode="synchronous")
    rows.append(row(f"bootprof decode, {args.size}, in-process", trace, inproc, inproc["seconds"]))
    # XPRESS-compressed buffers, as WPR/xperf -compress write them (sized by the inflated data).
    packed = synthesize("512MB", compress=True)
    c1 = decode(packed, 1, "512MB-xpress-1w")
    rows.append(row("bootprof decode, 512MB XPRESS, 1 worker", packed, c1, c1["seconds"]))
    # Stack keys instead of full stacks (WPR's default: references resolved against the trace's definitions).
    keyed = synthesize(args.size, stack_caching=True)
    k1 = decode(keyed, 1, f"{args.size}-keys-1w")
    rows.append(row(f"bootprof decode, {args.size} stack keys, 1 worker", keyed, k1, k1["seconds"]))
    # Stacks as varied as a real build's: the synth's default draws ~1,100 distinct stacks per GB from its
    # templates; a rustc build has hundreds of thousands (this one: ~250,000).
    varied = synthesize(args.size, stack_variety=VARIETY)
    v1 = decode(varied, 1, f"{args.size}-varied-1w")
    rows.append(row(f"bootprof decode, {args.size} varied stacks, 1 worker", varied, v1, v1["seconds"]))
    sizes = [args.size]
    if args.big:
        big = synthesize("4GB")
        b1 = decode(big, 1, "4GB-1w")
        rows.append(row("bootprof decode, 4GB, 1 worker", big, b1, b1["seconds"]))
        bn = decode(big, cores, f"4GB-{cores}w")
        rows.append(row(f"bootprof decode, 4GB, {cores} workers", big, bn, bn["seconds"]))
        sizes.append("4GB")
    probe_after = machine_probe()
    counted = instructions(trace) if args.instructions else {}
    one_row, all_row, inproc_row = rows[2], rows[3], rows[4]
    keyed_row = next(r for r in rows if "stack keys" in r["measure"])
    varied_row = next(r for r in rows if "varied stacks" in r["measure"])
    rows.insert(1, fields_row)
    # Per GB beyond the first: the 4 GB run minus the 1 GB run, both with one worker (fixed costs cancel).
    marginal = 0.0
    if args.big and "stage_s" in rows[-2] and "stage_s" in one_row and rows[-2]["stage_s"] > one_row["stage_s"]:
        marginal = round((rows[-2]["MB"] - one_row["MB"]) / (rows[-2]["stage_s"] - one_row["stage_s"]), 1)
    per_core_cli = one_row["MB_per_s"]
    per_core = one_row.get("stage_MB_per_s", 0.0)
    per_core_best = one_row.get("best_stage_MB_per_s", 0.0)
    all_cores = all_row.get("stage_MB_per_s", 0.0)
    cpu_s = one_row.get("user_s", 0) + one_row.get("sys_s", 0)
    per_cpu_second = round(one_row["MB"] / cpu_s, 1) if cpu_s else 0.0
    dissect_rate = rows[0]["MB_per_s"]
    ratio = per_core / dissect_rate
    fields_rate = fields_row["MB_per_s"]
    fields_ratio = per_core / fields_rate if fields_rate else 0.0
    peak = max(r["peak_rss_MB"] for r in rows[1:])
    peak_pss = max(r["peak_pss_MB"] for r in rows[1:])
    print(f"\n{'measure':<40} {'MB':>6} {'records':>11} {'s':>6} {'MB/s':>7} {'events/s':>10} {'RSS MB':>7} {'PSS MB':>7} "
          f"{'stage s':>7} {'stage MB/s':>10} {'best MB/s':>9} {'user s':>6} {'sys s':>6} {'1st run s':>9}")
    for r in rows:
        print(f"{r['measure']:<40} {r['MB']:>6,.0f} {r['records']:>11,} {r['seconds']:>6.2f} {r['MB_per_s']:>7,.1f} "
              f"{r['events_per_s']:>10,} {r['peak_rss_MB']:>7,} {r['peak_pss_MB']:>7,}"
              + (f" {r['stage_s']:>7.2f} {r['stage_MB_per_s']:>10,.1f} {r['best_stage_MB_per_s']:>9,.1f} "
                 f"{r['user_s']:>6.1f} {r['sys_s']:>6.1f} {r['first_run_s']:>9.2f}" if "stage_s" in r else "")
              + (f"  FAILED: {r['error']}" if "error" in r else ""))
    failed = [r["measure"] for r in rows if "error" in r]
    verdict = lambda ok: "met" if ok and not failed else "NOT met"  # noqa: E731
    print(f"per core (decode stage, 1 worker, median of 3 runs): {per_core:,.1f} MB/s (target >= 300: "
          f"{verdict(per_core >= 300)}; best run {per_core_best:,.1f}); "
          f"{cores} workers: {all_cores:,.1f} MB/s; whole CLI run, 1 worker: {per_core_cli:,.1f} MB/s, "
          f"in one process without dask: {inproc_row['MB_per_s']:,.1f} MB/s; "
          f"{per_cpu_second:,.1f} MB per CPU-second of the process tree"
          + (f"; beyond the first GB (4 GB run minus 1 GB run, 1 worker): {marginal:,.1f} MB/s" if marginal else ""))
    print(f"vs dissect.etl reading record headers only: {ratio:,.0f}x (target >= 100: {verdict(ratio >= 100)}); "
          f"vs dissect.etl parsing every record's fields (the same work): {fields_ratio:,.0f}x "
          f"({verdict(fields_ratio >= 100)}); "
          f"peak memory of the process tree (PSS) {peak_pss:,} MB (target < 1500: {verdict(peak_pss < 1500)}), "
          f"its RSS summed per process {peak:,} MB (counts pages the workers share with their fork server once "
          f"per process)")
    print("machine probe before / after (s): " + "; ".join(
        f"{k} {probe_before[k]} / {probe_after[k]}" for k in probe_before))
    if "M_instructions_per_MB" in counted:
        per_mb = counted["M_instructions_per_MB"]
        counted["G_instructions_per_s_this_run"] = round(per_mb * inproc_row.get("stage_MB_per_s", 0.0) / 1e3, 2)
        counted["G_instructions_per_s_for_300_MB_per_s"] = round(per_mb * 300 / 1e3, 2)
        print(f"instructions (callgrind, in one process, {counted['slices_MB'][0]:,.0f} -> {counted['slices_MB'][1]:,.0f} MB "
              f"slices, sha256 left out): {per_mb:,.2f} M per MB ("
              + ", ".join(f"{k} {v:,.2f}" for k, v in counted["M_instructions_per_MB_by_part"].items())
              + f"); 300 MB/s needs a core retiring "
              f"{counted['G_instructions_per_s_for_300_MB_per_s']:,.2f} G instructions/s on this code; this VM's core "
              f"retired {counted['G_instructions_per_s_this_run']:,.2f} G/s in the in-process run above")
        if "peer_M_instructions_per_MB" in counted:
            print(f"the peer on the same slices: {counted['peer_M_instructions_per_MB']:,.2f} M per MB; bootprof "
                  f"{counted['ratio_vs_peer']:,.2f}x of it")
        elif "peer_error" in counted:
            print(f"the peer's instructions: not counted: {counted['peer_error']}")
    elif counted:
        print(f"instructions: not counted: {counted['error']}")
    result = {"cores": cores, "sizes": ",".join(sizes), "seed": SEED, "simulated_cpus": SIM_CPUS,
              "machine_probe_before": probe_before, "machine_probe_after": probe_after,
              "per_core_MB_per_s": per_core, "per_core_best_run_MB_per_s": per_core_best, "all_cores_MB_per_s": all_cores, "cli_1_worker_MB_per_s": per_core_cli,
              "cli_in_process_MB_per_s": inproc_row["MB_per_s"],
              "MB_per_cpu_second": per_cpu_second, "marginal_1_worker_MB_per_s": marginal, "dissect_MB_per_s": dissect_rate, "ratio_vs_dissect": round(ratio, 1),
              "dissect_fields_MB_per_s": fields_rate, "ratio_vs_dissect_fields": round(fields_ratio, 1),
              "stack_keys_1_worker_MB_per_s": keyed_row.get("stage_MB_per_s", 0.0),
              "varied_stacks_1_worker_MB_per_s": varied_row.get("stage_MB_per_s", 0.0), "varied_stack_variety": VARIETY,
              "peak_rss_MB": peak, "peak_pss_MB": peak_pss, "target_per_core_MB_per_s": 300, "target_ratio": 100, "target_peak_rss_MB": 1500,
              "instructions": counted, "failed_runs": len(failed), "rows": rows}
    (OUT / "decode.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
