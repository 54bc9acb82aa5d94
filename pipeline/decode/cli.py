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
    from pipeline.cluster import connect

    from pipeline.jobs import unpacked

    args.inputs = unpacked(args.inputs, args.run_dir)      # (a pack: its trace and self-profiles, into the run)
    decode.classify(args.inputs)  # a bad input fails here, before a cluster is started
    # (the cluster starts while the decode walks the trace's buffer headers and opens its output)
    with connect(config.cluster, warm_up=decode.WARM_UP, size=sources.input_bytes(args.inputs), background=True) as pool:
        summary = decode.run(args.run_dir, config, pool, inputs=args.inputs)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0
