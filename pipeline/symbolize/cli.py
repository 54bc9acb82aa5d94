"""``bootprof symbolize --run RUN_DIR [--symbol-path PATH] [--cache-dir DIR]``"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import sources


def add_arguments(p) -> None:
    p.add_argument("--run", dest="run_dir", type=sources.run_dir, required=True,
                   help="run directory holding decoded/ (writes symbolized/)")
    p.add_argument("--symbol-path", dest="symbol_path", default=None,
                   help="symbol path in _NT_SYMBOL_PATH syntax (DIR; srv*CACHE*URL; cache*DIR), ';'-separated; "
                        "overrides symbolize.symbol_path and the _NT_SYMBOL_PATH environment variable")
    p.add_argument("--cache-dir", dest="cache_dir", type=Path, default=None,
                   help="cache of downloaded symbol files and address tables (overrides symbolize.cache_dir)")


def main(args, config) -> int:
    from pipeline.cluster import run_once
    from pipeline.runs import decoded_input_bytes

    if args.symbol_path is not None:
        config.symbolize.symbol_path = args.symbol_path
    if args.cache_dir is not None:
        config.symbolize.cache_dir = args.cache_dir
    # (a cluster only when there are symbol files to find and read)
    summary = run_once("symbolize", args.run_dir, config, decoded_input_bytes(args.run_dir))
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0
