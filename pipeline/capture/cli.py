"""``bootprof capture (--self-profile | --wpr | --xperf)... [--run RUN_DIR] -- <build command...>``"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeline import sources


def _period(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a period in seconds: {text!r} (e.g. 30 or 30s)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1 second between heap snapshots, got {text!r}")
    return value


def add_arguments(p) -> None:
    p.add_argument("--self-profile", action="store_true",
                   help="profile every rustc the command starts with -Z self-profile (works anywhere)")
    tool = p.add_mutually_exclusive_group()
    tool.add_argument("--wpr", action="store_const", const="wpr", dest="etw",
                      help="record the build with WPR (Windows; CPU samples and VirtualAlloc with stacks)")
    tool.add_argument("--xperf", action="store_const", const="xperf", dest="etw",
                      help="record the build with xperf's kernel logger (Windows Performance Toolkit)")
    p.add_argument("--perf", action="store_true",
                   help="record the build with Linux perf (cpu-clock samples with frame-pointer call stacks)")
    p.add_argument("--perf-rate", type=int, metavar="HZ", help="with --perf: samples per CPU-second (default 999)")
    p.add_argument("--perf-call-graph", choices=("fp", "dwarf"), default=None,
                   help="with --perf: call stacks by frame pointers (fp, default) or by DWARF unwinding of a copy of "
                   "each sample's user stack (dwarf: deeper user stacks, ~30 times larger files)")
    p.add_argument("--profile", action="append", metavar="FILE.wprp!NAME",
                   help="with --wpr: a WPR profile to start instead of bootprof's CPU and VirtualAlloc "
                   "(FILE.wprp!NAME or a built-in name such as GeneralProfile); repeatable")
    p.add_argument("--heap-snapshots", type=_period, metavar="PERIOD",
                   help="with --wpr: heap snapshot of every live rustc of the build every PERIOD seconds "
                   "(very expensive; only when asked)")
    symbols = p.add_mutually_exclusive_group()
    symbols.add_argument("--no-symbols", dest="symbols", action="store_false", default=None,
                         help="with --wpr or --xperf: do not copy the PDBs of the build's own images (those under the "
                         "working directory that the trace names) into RUN_DIR/symbols")
    symbols.add_argument("--symbols", dest="symbols", action="store_true", default=None,
                         help="with --perf: copy the ELF files of the images that had samples (by build id; a "
                         "distribution's detached debug file beside its file) into RUN_DIR/symbols/elf, so that "
                         "`bootprof pack` carries them (--wpr and --xperf copy PDBs unless --no-symbols)")
    p.add_argument("--symbols-max", type=_size, metavar="SIZE",
                   help="with --perf --symbols: copy at most this much, most-sampled images first (default 1GB; "
                   "rustup's librustc_driver alone is ~150 MB)")
    p.add_argument("--events", default="default",
                   help="-Z self-profile-events list, e.g. default,args or default,query-cache-hit (default: default)")
    p.add_argument("--run", dest="run_dir", type=sources.local_run_dir,
                   help="run directory (default: runs/capture-<time>); profiles go to RUN_DIR/selfprofile/, "
                   "the trace to RUN_DIR/input/trace.etl")
    # (not ``command``: that is the subcommand's name, which says that capture writes a run directory)
    p.add_argument("build", nargs=argparse.REMAINDER, metavar="command", help="the build command, after --")


def _size(text: str) -> int:
    from pipeline.errors import ConfigError
    from pipeline.units import Size

    try:
        return Size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _symbols(args) -> tuple[bool | None, int | None]:
    from pipeline.errors import InputError

    if args.symbols and not args.perf:
        raise InputError("capture: --symbols goes with --perf (--wpr and --xperf copy PDBs unless --no-symbols)")
    if args.symbols_max is not None and not (args.perf and args.symbols):
        raise InputError("capture: --symbols-max goes with --perf --symbols")
    return args.symbols, args.symbols_max


def _perf_rate(args) -> int | None:
    from pipeline.capture.perf import DEFAULT_RATE
    from pipeline.errors import InputError

    if args.perf_rate is not None and not args.perf:
        raise InputError("capture: --perf-rate goes with --perf")
    if args.perf_rate is not None and not 1 <= args.perf_rate <= 100_000:
        raise InputError(f"capture --perf-rate: between 1 and 100000 samples a second, got {args.perf_rate}")
    return (args.perf_rate or DEFAULT_RATE) if args.perf else None


def _call_graph(args) -> str:
    from pipeline.errors import InputError

    if args.perf_call_graph is not None and not args.perf:
        raise InputError("capture: --perf-call-graph goes with --perf")
    return args.perf_call_graph or "fp"


def main(args, config) -> int:
    from pipeline import capture

    command = args.build[1:] if args.build[:1] == ["--"] else args.build
    from pipeline.runs import fresh_dir

    run_dir = args.run_dir or fresh_dir(Path("runs") / f"capture-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = capture.run(run_dir, config, None, inputs=command, events=args.events, self_profile=args.self_profile,
                          etw_tool=args.etw, profiles=args.profile, heap_period_s=args.heap_snapshots,
                          symbols=_symbols(args)[0], symbols_max=_symbols(args)[1], perf_rate=_perf_rate(args),
                          perf_call_graph=_call_graph(args))
    for warning in summary["warnings"]:
        print(f"  warning: {warning}")
    if args.self_profile:
        print(f"captured {summary['files']} self-profiles into {summary['profile_dir']}")
    if summary["trace"]:
        print(f"captured {summary['trace']} ({summary['trace_size'] / 1e6:.1f} MB)")
    perf = summary.get("recording") or {}
    if perf.get("bytes_per_s") is not None:
        print(f"perf: {perf['bytes_per_s'] / 1e3:.0f} KB/s of build; perf's own CPU {perf.get('perf_cpu_s', 0):.2f} s "
              f"beside the build's {perf.get('build_cpu_s', 0):.2f} s ({perf.get('overhead_pct', 0):.1f} %); "
              f"{len(perf.get('build_ids') or [])} images with build ids")
    if summary.get("symbols") is not None and args.perf:
        copied, skipped = summary["symbols"], summary.get("symbols_skipped") or []
        print(f"copied {len({s['debug_id'] for s in copied})} ELF images that had samples ({len(copied)} files, "
              f"{sum(s['size'] for s in copied) / 1e6:.1f} MB) into {Path(run_dir) / 'symbols' / 'elf'}"
              + (f"; {len(skipped)} left (reasons in the capture manifest's symbols_skipped)" if skipped else ""))
    elif summary.get("symbols") is not None:
        print(f"copied {len(summary['symbols'])} PDBs of the build's images into {Path(run_dir) / 'symbols'} "
              f"({sum(s['size'] for s in summary['symbols']) / 1e6:.1f} MB)")
    print(f"build took {summary['elapsed_s']} s; next: bootprof run jobs/single-trace.yaml --run {run_dir} "
          f"(elsewhere: bootprof pack {run_dir} run.zip)")
    return 0
