"""bootprof beside the peer decoder, at every size and worker count (issue: fast at every size).

The peer is snail-server's ``snail-tool-analysis --no-progress --no-analysis`` (C++, one thread;
``../shared/peers/snail/run.sh`` installs its runtime libraries): it reads the trace into its samples-with-stacks
model, the closest to ``bootprof decode``. Runs alternate between the tools, each with its input in the page
cache; the median of ``--runs`` (default 3) is reported, and every ratio is of two numbers of this run:

* the small real trace (``perfview-net452-x64``, 4.9 MB, XPRESS): ``bootprof decode`` end to end (in process,
  as inputs below ``cluster.inline_below`` run) against the peer, in a fresh process. Target: at most 5x the peer.
* a 1 GB synthesized trace (``bench_decode``'s: seed 1, 16 simulated CPUs): ``bootprof decode`` with one
  worker against the peer's one thread, and with every core; then decode wall time with 1, 2 and all workers,
  with the **serial seconds** of each run: the wall time outside the decode stage's parallel partition phase
  (the manifest's ``partitions_s``): process start and imports, the walk, the wait for the cluster (which
  starts meanwhile), the joins, the wait for the input hash, and manifests, each reported (``PHASES``). The
  speed-up that N workers can give is at most wall(1) / (serial + parallel / N): on a machine with more
  cores than this one, the serial seconds are what limits it. Target (on 16 cores): >= 10x from 1 to 16
  workers; here it is reported for the cores there are.
* the same decode with the fewest and the most workers on a **standing dask cluster** (``dask scheduler
  --scheduler-file F`` and ``dask worker --scheduler-file F``, started before the runs; ``cluster.mode: address``,
  ``scheduler_file: F``), which takes the cluster's start out of each run's serial seconds;
  ``speedup_most_workers_standing`` is the speed-up between those two.
* the full pipeline on the 1 GB trace (``bootprof run jobs/single-trace.yaml``, its self-profiles too, every
  core): each stage's seconds and the whole against the decode alone on every core. Target: within 2x.

Writes ``bench/out/peer.json``. ``--size`` changes the synthesized size, ``--runs`` the repetitions,
``--workers`` the worker counts (``1,2,4,8,16``; default 1, 2 and every core), ``--no-pipeline`` leaves the
pipeline out. Where the peer cannot run (no ``../shared`` beside the checkout, as on a machine lent for a
scaling check), its columns stay empty and the bootprof-only ratios are still reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_decode import PEER, PEER_TOOL, cluster_config, measure, page_in, synthesize  # noqa: E402

SMALL = ROOT.parent / "shared" / "fixtures" / "etl" / "perfview-net452-x64" / "net.4.5.2.x64.etl"


def peer(trace: Path) -> float:
    page_in(trace)
    t0 = time.perf_counter()
    proc = subprocess.run([str(PEER), *PEER_TOOL, str(trace)],
                          capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"peer failed on {trace}: {proc.stderr[-500:]}")
    return secs


def ours(trace: Path, cfg: Path | None, tag: str) -> dict:
    """One ``bootprof decode`` in its own process: wall seconds and the manifest's stage phases."""
    run = OUT / f"peer-{tag}"
    shutil.rmtree(run, ignore_errors=True)
    page_in(trace)
    cmd = [sys.executable, "-m", "pipeline", *(["--config", str(cfg)] if cfg else []), "decode", str(trace), "--run", str(run)]
    secs, _, _, out = measure(cmd)
    summary = json.loads(out[out.index("{"):])
    etl = summary["etl"]
    elapsed = json.loads((run / "decoded" / "_manifest.json").read_text())["elapsed_s"]
    print(f"  decode {tag}: {secs:.2f} s (stage {elapsed:.2f} s, partitions {etl['partitions_s']:.2f} s, "
          f"joins {etl['join_s']:.2f} s)", flush=True)
    return {"seconds": secs, "join_s": etl["join_s"], "walk_s": etl["walk_s"],
            "cluster_wait_s": etl["cluster_wait_s"], "partitions_s": etl["partitions_s"],
            "hash_wait_s": summary["hash_wait_s"],
            # (process start, imports, input checks, manifest and exit: the wall time outside the stage)
            "outside_s": secs - elapsed}


#: The phases of a decode's wall time (manifest), reported per worker count.
PHASES = ("walk_s", "cluster_wait_s", "partitions_s", "join_s", "hash_wait_s", "outside_s")


@contextlib.contextmanager
def standing_cluster(n: int):
    """A dask scheduler and ``n`` single-threaded workers started by hand, as a user keeps them between commands;
    the config that points bootprof at them. Stopped after."""
    sched_file = OUT / f"scheduler-{n}w.json"
    sched_file.unlink(missing_ok=True)
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = subprocess.Popen([*dask, "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                                  str(sched_file)], stderr=subprocess.DEVNULL)
    workers = None
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                    str(sched_file), "--nworkers", str(n), "--nthreads", "1", "--memory-limit", "4GiB",
                                    "--no-dashboard"], stderr=subprocess.DEVNULL, cwd=ROOT)
        cfg = OUT / f"decode-standing-{n}w.yaml"
        cfg.write_text(f"cluster:\n  mode: address\n  scheduler_file: {sched_file}\n")
        from distributed import Client

        with Client(scheduler_file=str(sched_file)) as client:
            client.wait_for_workers(n, timeout=120)
        yield cfg
    finally:
        for proc in (workers, scheduler):
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def pipeline(trace: Path) -> dict:
    """``bootprof run jobs/single-trace.yaml`` on the trace and its self-profiles: seconds per stage."""
    run = OUT / "peer-pipeline"
    shutil.rmtree(run, ignore_errors=True)
    page_in(trace)
    cmd = [sys.executable, "-m", "pipeline", "run", "jobs/single-trace.yaml", "--trace", str(trace),
           "--trace", str(trace.parent / "selfprofile"), "--symbol-path", str(trace.parent / "symbols"),
           "--run", str(run), "--set", f"warehouse.path={OUT / 'peer-warehouse.duckdb'}", "--force"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline failed: {proc.stderr[-2000:]}")
    stages = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\w+)\s+([\d.]+) s", proc.stdout, re.M)}
    return {"wall_s": wall, **stages}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default=os.environ.get("BENCH_PEER_SIZE", "1GB"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", default="", help="worker counts, e.g. 1,2,4,8,16 (default: 1, 2, every core)")
    ap.add_argument("--no-pipeline", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    rows, result = [], {"cores": cores}
    has_peer = PEER.exists()
    if not has_peer:
        print(f"no peer at {PEER}: bootprof alone", file=sys.stderr)

    # Small real trace: bootprof in process (its default below cluster.inline_below) against the peer.
    if SMALL.exists():
        small_peer, small_ours = [], []
        for _ in range(args.runs):
            if has_peer:
                small_peer.append(peer(SMALL))
            small_ours.append(ours(SMALL, None, "small")["seconds"])
        p = statistics.median(small_peer) if has_peer else None
        for how, times, key in (("own process", small_ours, "small_ratio"),):
            o = statistics.median(times)
            row = {"case": f"{SMALL.name} ({SMALL.stat().st_size / 1e6:.1f} MB), {how}", "bootprof_s": o}
            if has_peer:
                result[key] = round(o / p, 1)
                row.update(peer_s=p, ratio=o / p, target="<= 5x", met="met" if o / p <= 5 else "NOT met")
            rows.append(row)

    # The big trace: the peer's one thread, then bootprof with each worker count (1, 2 and every core unless
    # --workers says).
    trace = synthesize(args.size)
    counts = sorted({int(n) for n in args.workers.split(",")} if args.workers else {1, 2, cores})
    most = counts[-1]
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    big_peer = []
    for _ in range(args.runs):
        if has_peer:
            big_peer.append(peer(trace))
        for n in counts:
            runs[n].append(ours(trace, cluster_config("local", n), f"{n}w"))
    # The fewest and the most workers again, each on a dask cluster started before its runs and stopped after
    # them: no cluster start in any run, so the speed-up is the decode's own.
    standing: dict[int, list[dict]] = {}
    for n in dict.fromkeys([counts[0], most]):
        with standing_cluster(n) as cfg:
            for _ in range(args.runs):
                standing.setdefault(n, []).append(ours(trace, cfg, f"{n}w-standing"))
    mb = trace.stat().st_size / 1e6
    result["trace_mb"] = round(mb)
    one = median(runs[counts[0]], "seconds")
    if has_peer:
        p = statistics.median(big_peer)
        rows.append({"case": f"synth {args.size}: peer, one thread", "peer_s": p, "mb_per_s": mb / p})
    for n in counts:
        wall, par = median(runs[n], "seconds"), median(runs[n], "partitions_s")
        serial = wall - par
        row = {"case": f"synth {args.size}: bootprof, {n} worker{'s' * (n > 1)}", "bootprof_s": wall,
               "mb_per_s": mb / wall, "serial_s": serial, "parallel_s": par, "speedup": one / wall}
        if has_peer:
            row["ratio"] = wall / p
        rows.append(row)
        # (the parallel seconds are the phase partitions_s)
        result[f"workers_{n}"] = {"wall_s": round(wall, 2), "serial_s": round(serial, 2),
                                  **{k: round(median(runs[n], k), 2) for k in PHASES}}
    for how, tag, of in ((", standing dask cluster", "standing", standing),):
        for n, done in of.items():
            wall, par = median(done, "seconds"), median(done, "partitions_s")
            rows.append({"case": f"synth {args.size}: bootprof, {n} worker{'s' * (n > 1)}{how}",
                         "bootprof_s": wall, "mb_per_s": mb / wall, "serial_s": wall - par, "parallel_s": par,
                         "speedup": one / wall, **({"ratio": wall / p} if has_peer else {})})
            result[f"workers_{n}_{tag}"] = {"wall_s": round(wall, 2), "serial_s": round(wall - par, 2),
                                            **{k: round(median(done, k), 2) for k in PHASES}}
    serial1, par1 = result[f"workers_{counts[0]}"]["serial_s"], result[f"workers_{counts[0]}"]["partitions_s"]
    if has_peer:
        result["ratio_one_worker"] = round(one / p, 2)
    result["speedup_most_workers"] = round(one / median(runs[most], "seconds"), 2)
    # (what 16 workers could give at most, were the parallel phase to scale perfectly and the serial part stay)
    result["speedup_16_bound"] = round(one / (result[f"workers_{most}"]["serial_s"] + par1 / 16), 2)
    # (both ends on standing clusters: the fewest workers' run has no cluster start either)
    for tag in ("standing",):
        r_one, r_most = result[f"workers_{counts[0]}_{tag}"], result[f"workers_{most}_{tag}"]
        result[f"speedup_most_workers_{tag}"] = round(r_one["wall_s"] / r_most["wall_s"], 2)
        result[f"speedup_16_bound_{tag}"] = round(r_one["wall_s"] / (r_most["serial_s"] + r_one["partitions_s"] / 16), 2)
    result["serial_s_1_worker"] = serial1

    if not args.no_pipeline:
        pipe = pipeline(trace)
        decode_wall = median(runs[most], "seconds")      # (the pipeline runs on every core too)
        total = sum(v for k, v in pipe.items() if k not in ("wall_s", "synth"))
        result["pipeline"] = {k: round(v, 2) for k, v in pipe.items()}
        result["pipeline_over_decode"] = round(pipe["wall_s"] / decode_wall, 2)
        rows.append({"case": f"synth {args.size}: whole pipeline ({', '.join(f'{k} {v:.1f}' for k, v in pipe.items() if k != 'wall_s')})",
                     "bootprof_s": pipe["wall_s"], "ratio": pipe["wall_s"] / decode_wall, "target": "<= 2x decode",
                     "met": "met" if pipe["wall_s"] <= 2 * decode_wall else "NOT met", "stages_s": total})

    result["rows"] = rows
    (OUT / "peer.json").write_text(json.dumps(result, indent=2))
    cols = list(dict.fromkeys(k for r in rows for k in r))
    print("  ".join(cols))
    for r in rows:
        print("  ".join(f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
