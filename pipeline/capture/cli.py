"""``bootprof capture --self-profile [--events LIST] [--run RUN_DIR] -- <build command...>``"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--self-profile", action="store_true",
                   help="profile every rustc the command starts with -Z self-profile (the only mode on Linux)")
    p.add_argument("--events", default="default",
                   help="-Z self-profile-events list, e.g. default,args or default,query-cache-hit (default: default)")
    p.add_argument("--run", dest="run_dir", type=Path,
                   help="run directory (default: runs/capture-<time>); profiles go to RUN_DIR/selfprofile/")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the build command, after --")


def main(args, config) -> int:
    from pipeline import capture
    from pipeline.errors import BootprofError

    if not args.self_profile:
        raise BootprofError("capture: only --self-profile is supported on this platform (ETW capture needs Windows)")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    run_dir = args.run_dir or Path("runs") / f"capture-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = capture.run(run_dir, config, None, inputs=command, events=args.events)
    print(f"captured {summary['files']} self-profiles into {summary['profile_dir']} in {summary['elapsed_s']} s")
    for warning in summary["warnings"]:
        print(f"  rustc: {warning}")
    print(f"next: bootprof decode {summary['profile_dir']} --run {run_dir}")
    return 0
