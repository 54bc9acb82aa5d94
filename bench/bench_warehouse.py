"""Warehouse at scale: ingest seconds per run and compare time with a long history.

A nightly history of ``BENCH_WAREHOUSE_RUNS`` runs (default 1,000) of one synthesized build (2 MB, seed 3,
``bootprof synth --rerun K``: 8 different re-runs with run-to-run noise, each ingested many times under new
names) goes into a fresh warehouse; every ingest is timed, then ``warehouse compare`` of the newest run
against its baseline, with the history thresholds of its last 30 runs (target: < 1 s), in a fresh process
as the CLI runs it, three times.

    python bench/bench_warehouse.py          # BENCH_WAREHOUSE_RUNS=200 for a quicker look
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"

RUNS = int(os.environ.get("BENCH_WAREHOUSE_RUNS", "1000"))
DISTINCT = 8


def main() -> int:
    from pipeline import aggregate, decode, symbolize, synth, warehouse
    from pipeline.cluster import Pool
    from pipeline.config import Config, SynthConfig

    work = OUT / "warehouse"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.cache_dir = work / "symcache"
    sources = []
    for k in range(1, DISTINCT + 1):
        trace = work / f"trace-{k}" / "trace.etl"
        synth.run(trace, SynthConfig(seed=3, size="2MB", cpus=4, rerun=k))
        config.symbolize.symbol_path = str(trace.parent / "symbols")
        run = work / f"source-{k}"
        decode.run(run, config, Pool(None), inputs=[trace])
        symbolize.run(run, config, Pool(None))
        aggregate.run(run, config, Pool(None))
        sources.append(run)
    db = work / "warehouse.duckdb"
    times = []
    for i in range(RUNS):
        run = work / f"nightly-{20200101 + i:08d}-020000"
        shutil.copytree(sources[i % DISTINCT], run)
        t0 = time.perf_counter()
        warehouse.ingest(db, run, job="nightly")
        times.append(time.perf_counter() - t0)
        shutil.rmtree(run)
    newest = f"nightly-{20200101 + RUNS - 1:08d}-020000"
    compares = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pipeline", "warehouse", "--db", str(db), "compare", "--run", newest,
                        "--budget", "1000"], cwd=ROOT, capture_output=True, check=False)
        compares.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    c = warehouse.compare(db, newest)
    in_process = time.perf_counter() - t0
    section = {
        "runs": RUNS, "warehouse_mb": round(db.stat().st_size / 1e6, 1),
        "metrics_per_run": len(c["headline"]) + len(c["changes"]),
        "rows": [
            {"case": "ingest one run (s), median", "value": round(statistics.median(times), 3)},
            {"case": "ingest one run (s), first 10 / last 10 mean", "value":
                f"{statistics.mean(times[:10]):.3f} / {statistics.mean(times[-10:]):.3f}"},
            {"case": "compare, CLI process (s), median of 3", "value": round(statistics.median(compares), 3),
             "target": "< 1 s", "met": "met" if statistics.median(compares) < 1 else "NOT met"},
            {"case": "compare, in process (s)", "value": round(in_process, 3)},
        ],
    }
    for row in section["rows"]:
        print(row)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "warehouse.json").write_text(json.dumps(section, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
