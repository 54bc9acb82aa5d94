"""Damage real traces and run them through the pipeline: every failure that is not a clear ``InputError`` is
a bug. A development tool, not a test (the suite keeps one damaged trace per kind of bug found this way).

    .venv/bin/python scripts/fuzz.py [--mutations N] [--seed S] [--header] [--stages decode,aggregate,...]
                                     [--no-synth] [-v] [FILE_OR_DIR ...]

Default input: every ``.etl`` and ``.mm_profdata`` under ``../shared/fixtures``, read in place, and four small
synthesized traces (``SYNTH``: plain, XPRESS, stack keys, 32-bit with both), which hold what no fixture has:
heap snapshots, heap and VirtualAlloc events in numbers (``--no-synth`` leaves them out). Each mutation is one
of: bit flips, 4-byte fields set to 0 / 0xFFFFFFFF / 0x7FFFFFFF / 0x80000000 / a random value, 8-byte fields
set to 2^63 / 2^64 - 1 / a random value, a field of an ETL buffer header, truncation (anywhere, or exactly at
a buffer boundary), a zeroed range or buffer header, a range or a whole buffer copied elsewhere; ``--header`` damages only the first 512 bytes (an ETL file's logfile header). The damaged
file is decoded in this process (``cluster.mode: synchronous``), then, if it decoded, run through the other
``--stages`` (symbolize offline). A damaged ETL trace that decodes fewer buffers than the intact one with no
``errors`` row and nothing counted missing is a *silent loss*. (Records overwritten by bytes that are valid
records themselves cannot be told from real ones: ETL has no checksums; the fuzzer counts buffers.) Prints one line per failure (file, seed,
mutation, exception), per silent loss, per run over ``--slow`` seconds, and a summary; exit status 1 if
anything failed or was lost silently. ``--budget S`` shares S seconds among the files: a file's runs stop when
its share is spent (``make fuzz``: 30 minutes, ``FUZZ_BUDGET``).
``-v`` prints each run before it starts, so that a crash of the process or a hang names its run. A mutation
is reproducible from its seed.

A failure on a synthesized trace is reproduced with no inputs, ``--seed S --mutations 1``.

2026-11-25 (`bd0fdf5`) fuzzed with these traces and mutations (about 19,700 decodes, 2,300 whole pipelines, 4,700 damaged
self-profiles): a heap-snapshot block size near 2^64, a VirtualAlloc size of 2^63 + 2^19, an image size of
2^64 - 1 and a process first seen 69 years before the trace failed the decode or the aggregate (fixed; tests
``test_heap_snapshots_with_impossible_blocks_are_markers``, ``test_regions_that_do_not_fit_in_the_address_space_are_errors``,
``test_a_process_first_seen_long_before_the_trace``). This script at 60 mutations of the synthesized traces
(decode, symbolize, aggregate: 240 runs) failed 4 runs on the code before the fixes and none after.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIELD_VALUES = (0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFF, 0x10000)
WIDE_VALUES = (1 << 63, (1 << 64) - 1, (1 << 63) + (1 << 19), 1 << 56)
#: Small synthesized traces (fixed seeds): name -> SynthConfig fields.
SYNTH = {"plain": {}, "xpress": {"compress": True}, "keys": {"stack_caching": True},
         "keys32-xpress": {"pointer_size": 4, "stack_caching": True, "compress": True}}


def mutate(data: bytes, rng: random.Random, header: bool, buffers: list[int]) -> tuple[str, bytes]:
    """One damaged copy of ``data``; ``buffers``: where its ETL data buffers start (none for a self-profile)."""
    b = bytearray(data)
    if header:
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(0, min(len(b), 0x200))
            if rng.random() < 0.5 and i + 4 <= len(b):
                b[i & ~3:(i & ~3) + 4] = rng.choice(FIELD_VALUES + (rng.getrandbits(32),)).to_bytes(4, "little")
            else:
                b[i] ^= 1 << rng.randrange(8)
        return "header", bytes(b)
    kind = rng.choice(["flip", "field", "field64", "trunc", "zero", "copy"]
                      + (["buffer", "cut_at_buffer", "zero_header", "copy_buffer"] if buffers else []))
    lo = 0 if rng.random() < 0.15 else min(len(b) - 1, 0x200)
    if kind == "flip":
        for _ in range(rng.randint(1, 30)):
            i = rng.randrange(lo, len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "field":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(lo, max(lo + 1, len(b) - 4)) & ~3
            b[i:i + 4] = rng.choice(FIELD_VALUES + (rng.getrandbits(32), rng.randrange(1, 64))).to_bytes(4, "little")
    elif kind == "field64":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(lo, max(lo + 1, len(b) - 8)) & ~7
            b[i:i + 8] = rng.choice(WIDE_VALUES + (rng.getrandbits(64),)).to_bytes(8, "little")
    elif kind == "buffer":
        for _ in range(rng.randint(1, 3)):
            i = rng.choice(buffers) + (rng.randrange(0, 0x48) & ~3)
            b[i:i + 4] = rng.choice(FIELD_VALUES + (rng.getrandbits(32),)).to_bytes(4, "little")
    elif kind == "cut_at_buffer":
        b = b[:rng.choice(buffers)]
    elif kind == "zero_header":
        i = rng.choice(buffers)
        b[i:i + 0x48] = bytes(min(0x48, len(b) - i))
    elif kind == "copy_buffer":
        if len(buffers) > 1:
            k = rng.randrange(len(buffers) - 1)
            i, j = buffers[k], buffers[k + 1]
            dest = rng.choice(buffers)
            if dest + j - i <= len(b):
                b[dest:dest + j - i] = data[i:j]
    elif kind == "trunc":
        b = b[:rng.randrange(1, len(b))]
    elif kind == "zero":
        i = rng.randrange(lo, len(b))
        j = min(len(b), i + rng.randrange(1, 4096))
        b[i:j] = bytes(j - i)
    else:
        i, j = rng.randrange(lo, len(b)), rng.randrange(lo, len(b))
        seg = b[i:i + rng.randrange(1, 2048)]
        b[j:j + len(seg)] = seg
    return kind, bytes(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", type=Path)
    ap.add_argument("--mutations", type=int, default=50, help="mutations per file (50)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (0)")
    ap.add_argument("--header", action="store_true", help="damage only the first 512 bytes")
    ap.add_argument("--stages", default="decode,symbolize,aggregate,report")
    ap.add_argument("--slow", type=float, default=20.0, help="report runs longer than this (seconds)")
    ap.add_argument("--no-synth", action="store_true", help="leave out the synthesized traces")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each run before it starts")
    ap.add_argument("--budget", type=float, default=None, help="start no run after this many seconds")
    args = ap.parse_args()

    from pipeline import aggregate, decode, report, symbolize
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.decode.etl.buffers import walk
    from pipeline.errors import InputError

    later = {"symbolize": symbolize, "aggregate": aggregate, "report": report}
    stages = [later[s] for s in args.stages.split(",") if s in later]
    inputs = args.inputs or [ROOT.parent / "shared" / "fixtures"]
    files = sorted(f for p in inputs for f in ([p] if p.is_file() else [*p.rglob("*.etl"), *p.rglob("*.mm_profdata")]))
    if not files:
        print(f"fuzz: no .etl or .mm_profdata files in {', '.join(map(str, inputs))}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bootprof-fuzz-"))
    if not args.inputs and not args.no_synth:
        from pipeline import synth
        from pipeline.config import SynthConfig

        for name, fields in SYNTH.items():
            path = work / "synth" / f"{name}.etl"
            path.parent.mkdir(exist_ok=True)
            synth.run(path, SynthConfig(seed=7, size="6MB", **fields))
            files.append(path)
    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.symbol_path, config.symbolize.cache_dir = "", work / "symbols"
    failures = runs = silent = 0
    try:
        for src in files:
            data = src.read_bytes()
            buffers = walk(src)[1]["file_offset"][1:].tolist() if src.suffix == ".etl" else []
            intact = records_of(src, work / "intact", config) if src.suffix == ".etl" else None
            damaged = work / f"damaged{src.suffix}"
            file_began = time.monotonic()
            for seed in range(args.seed, args.seed + args.mutations):
                if args.budget is not None and time.monotonic() - file_began > args.budget / len(files):
                    break
                kind, blob = mutate(data, random.Random(seed), args.header, buffers)
                damaged.write_bytes(blob)
                if args.verbose:
                    print(f"run {src} seed {seed} ({kind})", flush=True)
                run = work / "run"
                shutil.rmtree(run, ignore_errors=True)
                stage, start = "decode", time.monotonic()
                runs += 1
                try:
                    decode.run(run, config, Pool(None), inputs=[damaged])
                    if intact is not None and lost_silently(run, intact):
                        silent += 1
                        print(f"SILENT {src} seed {seed} ({kind}): {lost_silently(run, intact)}", flush=True)
                    for module in stages:
                        stage = module.__name__.rsplit(".", 1)[-1]
                        module.run(run, config, Pool(None))
                except InputError:
                    pass
                except Exception as exc:  # noqa: BLE001 - the point is to see them all
                    failures += 1
                    where = traceback.extract_tb(exc.__traceback__)[-1]
                    print(f"FAIL {src} seed {seed} ({kind}), {stage}: {type(exc).__name__}: {str(exc)[:200]} "
                          f"[{Path(where.filename).name}:{where.lineno}]", flush=True)
                if time.monotonic() - start > args.slow:
                    print(f"SLOW {src} seed {seed} ({kind}): {time.monotonic() - start:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"fuzz: {runs} damaged runs of {len(files)} files, {failures} failures, {silent} silent losses")
    return 1 if failures or silent else 0


def records_of(trace: Path, run: Path, config) -> int:
    """Buffers the decoder decodes in an intact trace."""
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.runs import read_manifest

    shutil.rmtree(run, ignore_errors=True)
    decode.run(run, config, Pool(None), inputs=[trace])
    etl = read_manifest(run, "decoded")["etl"]
    return int(etl["buffers_total"] - etl["buffers_skipped"])


def lost_silently(run: Path, intact: int) -> str | None:
    """What a damaged trace's decode lost without a word: fewer buffers decoded than in the intact trace, no errors
    row and no buffer counted missing (None when nothing was)."""
    from pipeline.runs import read_manifest

    m = read_manifest(run, "decoded")
    etl = m.get("etl", {})
    decoded = etl.get("buffers_total", 0) - etl.get("buffers_skipped", 0)
    if decoded < intact and not m.get("errors_total") and not etl.get("buffers_missing"):
        return f"{decoded} of {intact} buffers decoded, no error"
    return None


if __name__ == "__main__":
    sys.exit(main())
