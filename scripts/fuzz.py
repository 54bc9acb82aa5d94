"""Damage real traces and run them through the pipeline: every failure that is not a clear ``InputError`` is
a bug. A development tool, not a test (the suite keeps one damaged trace per kind of bug found this way).

    .venv/bin/python scripts/fuzz.py [--mutations N] [--seed S] [--header] [--stages decode,aggregate,...]
                                     [FILE_OR_DIR ...]

Default input: every ``.etl`` and ``.mm_profdata`` under ``../shared/fixtures``, read in place. Each mutation
is one of: bit flips, 4-byte fields set to 0 / 0xFFFFFFFF / 0x7FFFFFFF / 0x80000000 / a random value,
truncation, a zeroed range, a range copied elsewhere; ``--header`` damages only the first 512 bytes (an ETL
file's logfile header). The damaged file is decoded in this process (``cluster.mode: synchronous``), then,
if it decoded, run through the other ``--stages`` (symbolize offline). Prints one line per failure (file,
seed, mutation, exception), one per run over ``--slow`` seconds, and a summary; exit status 1 if anything
failed. A mutation is reproducible from its seed.
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


def mutate(data: bytes, rng: random.Random, header: bool) -> tuple[str, bytes]:
    b = bytearray(data)
    if header:
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(0, min(len(b), 0x200))
            if rng.random() < 0.5 and i + 4 <= len(b):
                b[i & ~3:(i & ~3) + 4] = rng.choice(FIELD_VALUES + (rng.getrandbits(32),)).to_bytes(4, "little")
            else:
                b[i] ^= 1 << rng.randrange(8)
        return "header", bytes(b)
    kind = rng.choice(["flip", "field", "trunc", "zero", "copy"])
    lo = 0 if rng.random() < 0.15 else min(len(b) - 1, 0x200)
    if kind == "flip":
        for _ in range(rng.randint(1, 30)):
            i = rng.randrange(lo, len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "field":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(lo, max(lo + 1, len(b) - 4)) & ~3
            b[i:i + 4] = rng.choice(FIELD_VALUES + (rng.getrandbits(32), rng.randrange(1, 64))).to_bytes(4, "little")
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
    args = ap.parse_args()

    from pipeline import aggregate, decode, report, symbolize
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.errors import InputError

    later = {"symbolize": symbolize, "aggregate": aggregate, "report": report}
    stages = [later[s] for s in args.stages.split(",") if s in later]
    inputs = args.inputs or [ROOT.parent / "shared" / "fixtures"]
    files = sorted(f for p in inputs for f in ([p] if p.is_file() else [*p.rglob("*.etl"), *p.rglob("*.mm_profdata")]))
    if not files:
        print(f"fuzz: no .etl or .mm_profdata files in {', '.join(map(str, inputs))}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bootprof-fuzz-"))
    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.symbol_path, config.symbolize.cache_dir = "", work / "symbols"
    failures = runs = 0
    try:
        for src in files:
            data = src.read_bytes()
            damaged = work / f"damaged{src.suffix}"
            for seed in range(args.seed, args.seed + args.mutations):
                kind, blob = mutate(data, random.Random(seed), args.header)
                damaged.write_bytes(blob)
                run = work / "run"
                shutil.rmtree(run, ignore_errors=True)
                stage, start = "decode", time.monotonic()
                runs += 1
                try:
                    decode.run(run, config, Pool(None), inputs=[damaged])
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
    print(f"fuzz: {runs} damaged runs of {len(files)} files, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
