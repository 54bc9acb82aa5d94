"""``bootprof decode PATH... --run RUN_DIR``"""

from __future__ import annotations

import json

from pipeline import sources


def add_arguments(p) -> None:
    p.add_argument("inputs", nargs="+", type=sources.parse, metavar="PATH",
                   help="an ETL trace, .mm_profdata files, or directories of them (recognized by content); a path "
                        "or an fsspec URL (https://, s3://, ...) that the workers read from")
    p.add_argument("--run", dest="run_dir", type=sources.run_dir, required=True,
                   help="run directory (or a store's URL: s3://...) to write decoded/ into")


def main(args, config) -> int:
    from pipeline import decode
    from pipeline.capture.bundle import unpacked
    from pipeline.cluster import run_once

    args.inputs = unpacked(args.inputs, args.run_dir)      # (a pack: its trace and self-profiles, into the run)
    decode.classify(args.inputs)  # a bad input fails here, before a cluster is started
    # (the cluster starts while the decode walks the trace's buffer headers and opens its output)
    summary = run_once("decode", args.run_dir, config, sources.input_bytes(args.inputs), args.inputs, eager=True)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0
