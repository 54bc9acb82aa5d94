"""``bootprof aggregate --run RUN_DIR``"""

from __future__ import annotations

import json

from pipeline import sources


def add_arguments(p) -> None:
    p.add_argument("--run", dest="run_dir", type=sources.run_dir, required=True,
                   help="run directory (or a store's URL: s3://...) with a decoded/ output")


def main(args, config) -> int:
    from pipeline.cluster import run_once
    from pipeline.runs import self_profile_bytes

    # (workers only for the self-profiles' sections; the ETL trace's run here, in DuckDB)
    summary = run_once("aggregate", args.run_dir, config, self_profile_bytes(args.run_dir))
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0
