"""``bootprof synth --out demo.etl [--seed N] [--size 1GB] [--cpus 16] [--compress] [--pointer-size 4|8] [--stack-caching]
[--stack-variety N] [--[no-]self-profiles] [--rerun K [--noise X]] [--inject KIND:NAME:FACTOR ...]``

Flags override the ``synth`` section of the config. ``--rerun K`` writes the same build run again (K > 0) with
run-to-run noise; ``--inject`` adds known changes (a slower crate, a function sampled more, a stack committing
more), so a history of nightly runs with known answers is a loop over K.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, required=True, help="ETL file to write; truth JSON and symbols/ go beside it")
    p.add_argument("--seed", type=int, help="random seed (same seed and options -> byte-identical files)")
    p.add_argument("--size", help="approximate uncompressed trace size, e.g. 20MB, 1GB")
    p.add_argument("--cpus", type=int, help="logical CPUs of the simulated machine")
    p.add_argument("--compress", action=argparse.BooleanOptionalAction, default=None,
                   help="XPRESS-compress the data buffers")
    p.add_argument("--pointer-size", type=int, choices=(4, 8), help="pointer size of the simulated system")
    p.add_argument("--stack-variety", type=int, help="call-stack templates as a multiple of the smallest set (default: "
                   "1-8 by size, ~1,100 distinct stacks at 1 GB; 2000: ~250,000)")
    p.add_argument("--stack-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="stack keys (StackKeyUser/Kernel + KeyDelete/KeyRundown) instead of full StackWalk events")
    p.add_argument("--self-profiles", action=argparse.BooleanOptionalAction, default=None,
                   help="also write a rustc self-profile of every rustc process into selfprofile/ beside the trace")
    p.add_argument("--rerun", type=int, help="re-run K of the same build (0: the original), with run-to-run noise")
    p.add_argument("--noise", type=float, help="relative standard deviation of a 1-second process's work, and of the machine's speed, "
                   "between re-runs (default 0.08, as on real builds; smaller processes vary more)")
    p.add_argument("--inject", action="append", metavar="KIND:NAME:FACTOR",
                   help="a known change: crate:NAME:FACTOR, function:NAME:FACTOR or commit:NAME:FACTOR (repeatable)")


def main(args, config) -> int:
    from pipeline import synth
    from pipeline.config import SynthConfig
    from pipeline.errors import ConfigError

    overrides = {k: v for k, v in (("seed", args.seed), ("size", args.size), ("cpus", args.cpus),
                                   ("compress", args.compress), ("pointer_size", args.pointer_size),
                                   ("stack_caching", args.stack_caching), ("stack_variety", args.stack_variety),
                                   ("self_profiles", args.self_profiles), ("rerun", args.rerun), ("noise", args.noise), ("inject", args.inject))
                 if v is not None}
    from pydantic import ValidationError

    try:
        cfg = SynthConfig.model_validate(config.synth.model_dump() | overrides)
    except ValidationError as exc:
        msgs = "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg'].removeprefix('Value error, ')} (got {e['input']!r})"
                         for e in exc.errors())
        raise ConfigError(f"synth: {msgs}") from None
    summary = synth.run(args.out, cfg)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0
