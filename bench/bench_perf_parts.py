"""perf.data decode throughput, one part against many: ``decode_perf`` on a made-up file of ``--size`` bytes
(``pipeline.synth.perf.write_large_perf``, seed 1, written once to ``bench/out/perf-<size>/perf.data``) in this
process as one part, then cut into ``decode.partition_bytes`` parts on a dask LocalCluster (127.0.0.1, one worker
per core, started before the clock runs), alternately ``--rounds`` times; beside ``perf script -i FILE >
/dev/null`` on the same file. The input is read through once before (page cache). Prints MB/s of the file per
second of ``decode_perf`` (the manifest's ``decode_s``; ``perf script``: its wall time), the median of the rounds and the range."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _decode(path: Path, out_dir: Path, pool, part_bytes: int) -> dict:
    """The decode stage on ``path``; its ``decode_perf`` seconds (the stage's own: the input's hash aside)."""
    from pipeline import decode
    from pipeline.config import Config

    cfg = Config()
    cfg.decode.partition_bytes = part_bytes
    shutil.rmtree(out_dir, ignore_errors=True)
    return decode.run(out_dir, cfg, pool, inputs=[path])["perf"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=300_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part-bytes", type=int, default=24 << 20)
    args = ap.parse_args()
    from pipeline.cluster import Pool, connect
    from pipeline.config import ClusterConfig
    from pipeline.synth.perf import write_large_perf

    base = ROOT / "bench" / "out" / f"perf-{args.size}"
    data = base / "perf.data"
    if not data.exists():
        write_large_perf(data, args.size, seed=1)
    size = data.stat().st_size
    with open(data, "rb") as f:
        while f.read(1 << 24):
            pass
    results: dict[str, list[float]] = {"one part, this process": [], "parts, LocalCluster": [], "perf script": []}
    workers = os.cpu_count() or 1
    with connect(ClusterConfig(mode="local", n_workers=workers, memory_limit="3GiB", inline_below=0)) as pool:
        pool.ready()
        for _ in range(args.rounds):
            results["one part, this process"].append(_decode(data, base / "one", Pool(None), 1 << 40)["decode_s"])
            results["parts, LocalCluster"].append(_decode(data, base / "many", pool, args.part_bytes)["decode_s"])
            t = time.perf_counter()
            with open(os.devnull, "wb") as null:
                subprocess.run(["perf", "script", "-i", str(data)], stdout=null, stderr=subprocess.DEVNULL,
                               check=True)
            results["perf script"].append(time.perf_counter() - t)
    parts = -(-size // args.part_bytes)
    print(f"file: {size / 1e6:.0f} MB, parts of {args.part_bytes >> 20} MiB: about {parts}, workers: {workers}")
    print(f"{'':28} {'median s':>9} {'MB/s':>7} {'range s':>14}")
    for name, runs in results.items():
        med = statistics.median(runs)
        print(f"{name:28} {med:9.2f} {size / 1e6 / med:7.0f} {min(runs):6.2f}-{max(runs):6.2f}")


if __name__ == "__main__":
    main()
