"""ETL aggregate sections, their report sections and the warehouse on a synthesized trace.

Input: ``bootprof synth`` (seed 1, 16 simulated CPUs) of ``--size`` (default 200MB, env
``BENCH_AGGREGATE_SIZE``), decoded and symbolized once into ``bench/out/aggregate-<size>/run`` and
reused while its manifests exist. Measured in this process, one section at a time (no dask: these
sections are DuckDB, which uses every core itself): wall time of the cpu, memory and processes
aggregate sections, of the cpu/memory/processes report sections and of one warehouse ingestion,
with the rows each one handled. Target (reported, not asserted): the cpu section handles at least
1M samples/s. Writes ``bench/out/aggregate.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

SEED = 1
SIM_CPUS = 16
TARGET_SAMPLES_PER_S = 1_000_000


def prepare(size: str) -> Path:
    from pipeline import decode, symbolize, synth
    from pipeline.cluster import Pool
    from pipeline.config import Config, SynthConfig

    base = OUT / f"aggregate-{size}"
    run = base / "run"
    if (run / "symbolized" / "_manifest.json").exists():
        return run
    trace = base / "trace.etl"
    synth.run(trace, SynthConfig(seed=SEED, size=size, cpus=SIM_CPUS))
    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.symbol_path = str(base / "symbols")
    config.symbolize.cache_dir = base / "symcache"
    decode.run(run, config, Pool(None), inputs=[trace])
    symbolize.run(run, config, Pool(None))
    trace.unlink()   # the decoded tables are what the benchmark reads
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default=os.environ.get("BENCH_AGGREGATE_SIZE", "200MB"))
    args = parser.parse_args()

    from pipeline import aggregate, report, warehouse
    from pipeline.aggregate import cpu, memory, processes
    from pipeline.config import Config
    from pipeline.runs import read_manifest, stage_output

    run = prepare(args.size)
    decoded = read_manifest(run, "decoded")["tables"]
    config = Config()
    config.cluster.mode = "synchronous"
    rows = []
    with stage_output(run, "aggregated", config=config.resolved()) as out:
        ctx = aggregate.Context(run, config, None, out, read_manifest(run, "decoded"))
        summary = {}
        for section, handled in ((cpu.aggregate, decoded["samples"]), (memory.aggregate, decoded["virtual_allocs"]),
                                 (processes.aggregate, decoded["processes"])):
            t = time.perf_counter()
            summary[aggregate.section_name(section)] = section(ctx)
            dt = time.perf_counter() - t
            rows.append({"step": f"aggregate {aggregate.section_name(section)}", "rows_in": handled,
                         "seconds": round(dt, 3), "rows_per_s": round(handled / dt)})
        out.manifest["sections"] = summary
    samples_per_s = rows[0]["rows_per_s"]
    with stage_output(run, "report", config=config.resolved()) as out:
        ctx = report.Context(run, config, None, out)
        ctx.copy_static("report.css")
        for section in (report.cpu.section, report.memory.section, report.processes.section):
            t = time.perf_counter()
            s = section(ctx)
            rows.append({"step": f"report {s.id}", "rows_in": "", "seconds": round(time.perf_counter() - t, 3),
                         "rows_per_s": ""})
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        ingested = warehouse.ingest(Path(tmp) / "wh.duckdb", run)
        rows.append({"step": "warehouse ingest", "rows_in": ingested["rows"],
                     "seconds": round(time.perf_counter() - t, 3), "rows_per_s": ""})
    section = {"size": args.size, "samples": decoded["samples"], "units": summary["cpu"]["units"],
               "cpu_samples_per_s": samples_per_s,
               "target": f">= {TARGET_SAMPLES_PER_S:,} samples/s: "
                         f"{'met' if samples_per_s >= TARGET_SAMPLES_PER_S else 'NOT met'}",
               "rows": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "aggregate.json").write_text(json.dumps(section, indent=2) + "\n")
    width = max(len(r["step"]) for r in rows)
    print(f"{args.size} trace, {decoded['samples']:,} samples, {summary['cpu']['units']:,} units")
    for r in rows:
        print(f"  {r['step']:<{width}}  {r['seconds']:8.3f} s  {r['rows_in']!s:>10}  {r['rows_per_s']!s:>12}")
    print(section["target"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
