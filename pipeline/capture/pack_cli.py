"""``bootprof pack RUN_DIR OUT``: a captured run (trace, self-profiles, symbols, capture manifest) as one zip that
``bootprof run --trace OUT`` and ``bootprof decode OUT`` take on any system (:mod:`pipeline.capture.bundle`)."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory that bootprof capture wrote")
    p.add_argument("out", type=Path, metavar="OUT", help="the zip to write, e.g. run.zip")


def main(args, config) -> int:
    from pipeline.capture.bundle import pack

    done = pack(args.run_dir, args.out)
    print(f"packed {done['files']} files ({done['symbols']} symbol files) into {done['pack']} "
          f"({done['bytes'] / 1e6:.1f} MB)")
    return 0
