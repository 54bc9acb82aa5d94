"""Self-profile decode throughput: query events decoded (and nested) per second.

Deterministic input (no randomness, so no seed needed beyond the fixture): the event stream of a
real rustc 1.95 profile (``../shared/fixtures/selfprofile/workspace-clean/util-*.mm_profdata``,
104k events) repeated ``--copies`` times, each copy shifted in time after the previous one, into one
large v9 file with the original string table. Measures, on that file:

* ``kernels``: ``decode_events`` + ``nest_events`` alone on the in-memory event stream (the issue's
  target: at least 20M events/s per core, decode and nesting together; the kernels are single-threaded);
* ``read_profile``: the whole file: read, split pages, string table, kernels, strings resolved;
* ``decode_group``: plus the Arrow table and the parquet part (one dask task's work);
* ``stage``: ``decode.run`` on a directory of ``--files`` copies of the fixture workspace's files,
  inline and on a dask LocalCluster with 2 workers.

Prints a table and writes ``bench/out/selfprofile.json``. Usage:
``python bench/bench_selfprofile.py [--copies 40] [--files 24]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIXTURE = ROOT.parent / "shared" / "fixtures" / "selfprofile" / "workspace-clean"
PAGE = 1 << 18


def big_profile(src: Path, dst: Path, copies: int) -> int:
    """Write ``copies`` time-shifted repetitions of ``src``'s events with its strings; returns events."""
    from pipeline.decode.measureme import layout as L
    from pipeline.decode.measureme.reader import split_streams

    lay, streams = split_streams(src, np.fromfile(src, np.uint8))
    ev = np.frombuffer(streams[L.TAG_EVENTS], lay.event, offset=L.STREAM_HEADER_SIZE)
    up = ev["payloads_upper"].astype(np.int64)
    v1 = ev["payload1_lower"].astype(np.int64) | ((up >> 16) << 32)
    v2 = ev["payload2_lower"].astype(np.int64) | ((up & 0xFFFF) << 32)
    timed = v2 != L.INTEGER_MARKER
    interval = timed & (v2 != L.INSTANT_MARKER)
    span = int(v2[interval].max()) + 1000
    out = np.empty(len(ev) * copies, lay.event)
    for k in range(copies):
        a, b = v1.copy(), v2.copy()
        a[timed] += k * span
        b[interval] += k * span
        chunk = ev.copy()
        chunk["payload1_lower"] = a & 0xFFFFFFFF
        chunk["payload2_lower"] = b & 0xFFFFFFFF
        chunk["payloads_upper"] = ((a >> 32) << 16) | (b >> 32)
        out[k * len(ev):(k + 1) * len(ev)] = chunk
    events = streams[L.TAG_EVENTS][:L.STREAM_HEADER_SIZE].tobytes() + out.tobytes()
    with open(dst, "wb") as f:
        f.write(L.FILE_MAGIC + np.uint32(lay.version).tobytes())
        for tag, data in ((L.TAG_EVENTS, events), (L.TAG_STRING_DATA, streams[L.TAG_STRING_DATA].tobytes()),
                          (L.TAG_STRING_INDEX, streams[L.TAG_STRING_INDEX].tobytes())):
            for i in range(0, len(data), PAGE):
                piece = data[i:i + PAGE]
                f.write(bytes([tag]) + np.uint32(len(piece)).tobytes() + piece)
    return len(out)


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_kernels(path: Path) -> tuple[int, float]:
    from pipeline.decode.measureme import kernels, layout as L
    from pipeline.decode.measureme.reader import StringTable, split_streams

    lay, streams = split_streams(path, np.fromfile(path, np.uint8))
    strings = StringTable(path, lay, streams[L.TAG_STRING_DATA], streams[L.TAG_STRING_INDEX])
    words = streams[L.TAG_EVENTS].view("<u4")
    n = (len(streams[L.TAG_EVENTS]) - L.STREAM_HEADER_SIZE) // lay.event.itemsize
    cols = [np.empty(n, t) for t in (np.int32, np.int32, np.int64, np.uint32, np.int32, np.int64, np.int64, np.int8)]
    nest = [np.empty(n, t) for t in (np.int64, np.int32, np.int64)]

    def run():
        status, _, _, _, n_threads = kernels.decode_events(words, 2, n, lay.event_words, lay.id_words,
                                                           strings.virt_addr, strings.sparse_ids,
                                                           strings.sparse_addrs, len(strings.data), *cols)
        assert status == kernels.OK
        kernels.nest_events(n, n_threads, cols[4], cols[5], cols[6], cols[7], *nest)

    run()  # compile / load the numba cache
    return n, best_of(run)


def bench_stage(work: Path, n_files: int) -> dict[str, float]:
    from pipeline import decode
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig, Config

    src = work / "many"
    src.mkdir()
    originals = sorted(p for p in FIXTURE.glob("*.mm_profdata") if not p.name.startswith("___"))
    for i in range(n_files):
        p = originals[i % len(originals)]
        shutil.copyfile(p, src / f"{p.stem.rsplit('-', 1)[0]}-{i:07d}.mm_profdata")
    config = Config()
    out = {}
    for mode, cluster in (("inline", ClusterConfig(mode="synchronous")),
                          ("dask_2_workers", ClusterConfig(mode="local", n_workers=2, memory_limit="3GiB"))):
        with connect(cluster) as pool:
            decode.run(work / f"warm-{mode}", config, pool, inputs=[originals[0]])  # start workers, load kernels
            t0 = time.perf_counter()
            summary = decode.run(work / f"run-{mode}", config, pool, inputs=[src])
            out[mode] = time.perf_counter() - t0
            out["events"] = summary["self_profile"]["events"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=40, help="repetitions of the 104k-event profile (default 40)")
    ap.add_argument("--files", type=int, default=24, help="files for the stage run (default 24)")
    args = ap.parse_args()
    if not FIXTURE.exists():
        print(f"bench_selfprofile: {FIXTURE} is missing (../shared/fixtures must sit beside the project)")
        return 1
    from pipeline.decode.measureme import decode_group
    from pipeline.decode.measureme.reader import read_profile

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-selfprofile-") as tmp:
        work = Path(tmp)
        big = work / "util-0000001.mm_profdata"
        n = big_profile(next(FIXTURE.glob("util-*.mm_profdata")), big, args.copies)
        size = big.stat().st_size
        n_k, t_k = bench_kernels(big)
        rows.append(("kernels (decode + nest)", n_k, t_k))
        rows.append(("read_profile (file -> arrays + strings)", n, best_of(lambda: read_profile(big), 2)))
        part = work / "part.parquet"
        rows.append(("decode_group (+ arrow + parquet part)", n,
                     best_of(lambda: decode_group({"files": [(0, str(big))], "part": "p", "out": str(part)}), 2)))
        stage = bench_stage(work, args.files)
        for mode in ("inline", "dask_2_workers"):
            rows.append((f"decode stage, {args.files} files, {mode}", stage["events"], stage[mode]))
    print(f"input: {n:,} events ({size / 1e6:.0f} MB, {args.copies} copies of the util profile)")
    print(f"{'measure':<44} {'events':>12} {'seconds':>9} {'M events/s':>11}")
    for name, events, secs in rows:
        print(f"{name:<44} {events:>12,} {secs:>9.3f} {events / secs / 1e6:>11.1f}")
    target = 20.0
    kernel_rate = rows[0][1] / rows[0][2] / 1e6
    print(f"target: >= {target:.0f}M events/s per core for decode + nesting: "
          f"{'met' if kernel_rate >= target else 'NOT met'} ({kernel_rate:.1f}M/s)")
    result = {"input_events": n, "input_bytes": size, "copies": args.copies, "target_m_events_per_s": target,
              "rows": [{"measure": m, "events": e, "seconds": round(s, 4), "m_events_per_s": round(e / s / 1e6, 2)}
                       for m, e, s in rows]}
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "selfprofile.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
