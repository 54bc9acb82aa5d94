"""Compile and cache every numba kernel of the pipeline once, at install time (``make install``), so that a
user's first ``make pipeline`` or ``bootprof decode`` is not a compile (~25 s of it on a fresh machine, the
decode of the 8 MB demo trace taking 19.4 s instead of 0.7 s).

Small synthesized traces of each kind the kernels have signatures for (plain and XPRESS buffers, full stacks
and stack keys, 64- and 32-bit) go through decode, symbolize and aggregate in this process, and small made-up
perf.data files (``pipeline.synth.perf``, frame-pointer and DWARF call graphs) through decode; numba writes the
compiled code beside the sources (``__pycache__``), where every later process and worker loads it. Nothing
is kept but that cache. Prints how long it took.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = [{}, {"compress": True, "stack_caching": True}, {"pointer_size": 4, "stack_caching": True, "compress": True}]


def main() -> int:
    from pipeline import aggregate, decode, symbolize, synth
    from pipeline.cluster import Pool
    from pipeline.config import Config, SynthConfig
    from pipeline.decode.perf import cfi
    from pipeline.synth.perf import write_perf

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bootprof-compile-"))
    try:
        for k, fields in enumerate(VARIANTS):
            trace = work / f"t{k}" / "trace.etl"
            synth.run(trace, SynthConfig(seed=1, size="2MB", cpus=2, **fields))
            config = Config()
            config.cluster.mode = "synchronous"
            config.symbolize.symbol_path = str(trace.parent / "symbols")
            config.symbolize.cache_dir = work / "symcache"
            run = work / f"run{k}"
            decode.run(run, config, Pool(None), inputs=[trace])
            symbolize.run(run, config, Pool(None))
            aggregate.run(run, config, Pool(None))
        # the perf.data walk and the DWARF unwinder (Linux perf runs): small made-up files with samples, callchains,
        # register and stack copies, and task records
        config = Config()
        config.cluster.mode = "synchronous"
        for dwarf in (False, True):
            perf = work / f"perf-{dwarf}" / "perf.data"
            write_perf(perf, seed=1, dwarf=dwarf)
            decode.run(work / f"run-perf-{dwarf}", config, Pool(None), inputs=[perf])
        cfi.parse(b"STACK CFI INIT 10 8 .cfa: $rsp 8 + .ra: .cfa -8 + ^\nSTACK CFI 11 .cfa: $rsp 16 +\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"compile_kernels: numba kernels compiled and cached in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
