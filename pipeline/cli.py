"""Command line: ``bootprof <stage> ...`` and ``python -m pipeline <stage> ...``.

The core imports no stage at module level: each subcommand names the module that implements it
(``pipeline.<stage>.cli`` with ``add_arguments(parser)`` and ``main(args, config) -> int``), imported
only to build the parser and when that subcommand runs.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from pipeline import __version__
from pipeline.config import Config, load_config, load_job
from pipeline.errors import BootprofError
from pipeline.progress import Status

#: subcommand -> (module, one-line help). Order is the order of the pipeline.
COMMANDS: dict[str, tuple[str, str]] = {
    "capture": ("pipeline.capture.cli", "record a build (rustc -Z self-profile; WPR/xperf on Windows)"),
    "synth": ("pipeline.synth.cli", "write a synthetic rustc-bootstrap ETL trace with its ground truth"),
    "decode": ("pipeline.decode.cli", "decode an ETL trace or .mm_profdata files into parquet"),
    "symbolize": ("pipeline.symbolize.cli", "resolve stack frames to modules, functions and lines"),
    "aggregate": ("pipeline.aggregate.cli", "summarize CPU, memory, processes and queries"),
    "report": ("pipeline.report.cli", "write the HTML report, flamegraphs, tables and exports"),
    "warehouse": ("pipeline.warehouse.cli", "ingest runs into the DuckDB warehouse and query it"),
}

log = logging.getLogger("bootprof")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bootprof",
        description="Decode, symbolize and aggregate performance traces of rustc bootstrap builds.",
    )
    parser.add_argument("--version", action="version", version=f"bootprof {__version__}")
    parser.add_argument("--config", type=Path, help="YAML config file (default: built-in defaults)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue  # stage not built yet
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    run = sub.add_parser("run", help="run a job from jobs/ (all its stages) on one trace",
                         description="Run a job file's stages in order on one trace.")
    run.add_argument("job", type=Path, help="job file, e.g. jobs/demo.yaml")
    run.add_argument("--trace", type=Path, help="ETL trace or self-profile directory (default: synthesize the demo trace)")
    run.add_argument("--run", dest="run_dir", type=Path, help="run directory (default: <runs_dir>/<job>-<time>)")
    run.add_argument("--symbol-path", dest="symbol_path", help="symbol path for the symbolize stage "
                     "(_NT_SYMBOL_PATH syntax: DIR;srv*CACHE*URL;cache*DIR; overrides symbolize.symbol_path)")
    run.set_defaults(_module=None)
    return parser


def run_job(job_path: Path, trace: Path | None, run_dir: Path | None, config_path: Path | None,
            symbol_path: str | None = None) -> int:
    """Run every stage of a job on one trace; with no trace and a 'synth' stage, make the demo trace."""
    job = load_job(job_path)
    config = load_config(config_path or job.config)
    if symbol_path is not None:
        config.symbolize.symbol_path = symbol_path
    # Runs of one job are compared with each other in the warehouse, whatever their directory is called.
    config.warehouse.labels = {"job": job.name, **config.warehouse.labels}
    if run_dir is None:
        run_dir = job.runs_dir / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run directory: {run_dir}")
    stages = list(job.stages)
    if trace is None:
        if "synth" not in stages:
            raise BootprofError(f"{job_path}: job has no 'synth' stage, so --trace is required")
        synth = importlib.import_module("pipeline.synth")
        trace = run_dir / "input" / "demo.etl"
        t0 = time.perf_counter()
        with Status("synth", 0) as status:
            status.say(f"writing the demo trace ({config.synth.size})")
            synth.run(trace, config.synth)
        print(f"  synth      {time.perf_counter() - t0:7.2f} s  {trace}")
        symbols = trace.parent / "symbols"
        if symbols.exists() and not config.symbolize.symbol_path:
            config.symbolize.symbol_path = str(symbols.resolve())
    stages = [s for s in stages if s != "synth"]
    from pipeline.cluster import connect

    modules = {stage: importlib.import_module(f"pipeline.{stage}") for stage in stages}
    from pipeline.cluster import input_bytes

    summaries: dict[str, Any] = {}
    with connect(config.cluster, warm_up=[m for mod in modules.values() for m in getattr(mod, "WARM_UP", ())],
                 size=input_bytes([trace])) as pool:
        for stage, mod in modules.items():
            t0 = time.perf_counter()
            # (on a terminal: which stage runs, until its line is printed; a stage may show its own progress)
            with Status(stage, 0) as status:
                status.say("running")
                summary = summaries[stage] = mod.run(run_dir, config, pool, inputs=[trace])
            print(f"  {stage:<10} {time.perf_counter() - t0:7.2f} s  {summary or ''}")
    index = run_dir / "report" / "index.html"
    if "report" in stages and index.exists():
        print(f"report: {index}")
    if "compare" in stages:
        past = summaries["compare"]["regressions_past_budget"]
        print(f"compare: {run_dir / 'compare' / 'summary.md'}" + (
            f" ({past} significant regressions of {config.warehouse.budget_pct:g}% or more)" if past else ""))
        return 1 if past else 0
    return 0


def main(argv: list[str] | None = None) -> int:
    # One BLAS thread: nothing here multiplies matrices, and OpenBLAS's idle threads spin on a core the
    # stages need (what dask already sets for its workers). Before numpy is first imported.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "run":
            return run_job(args.job, args.trace, args.run_dir, args.config, args.symbol_path)
        config: Config = load_config(args.config)
        return int(args._module.main(args, config) or 0)
    except BootprofError as exc:
        print(f"bootprof: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bootprof: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # (whoever read the output went away, as `| head` does: nothing more to say; 128 + SIGPIPE, as a shell does)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def entry() -> NoReturn:
    """The ``bootprof`` command and ``python -m pipeline``: ``main``, then :func:`exit_quickly`."""
    exit_quickly(main())


def exit_quickly(code: int) -> NoReturn:
    """End the process with ``code`` as the interpreter would, but without its teardown.

    A command's work is done when ``main`` returns: every stage output is written and renamed into
    place, and files and DuckDB connections are closed where they are used. What the interpreter
    would still do is tear down ~170,000 objects of its imports (numpy, pyarrow, duckdb, dask,
    numba), running several full garbage collections over them: 0.4 s of every command here.
    So: wait for threads that are not daemons as usual (if any is alive, exit the usual way), run the
    ``atexit`` handlers (logging's flush, temporary directories, dask's), flush the standard streams,
    then ``os._exit``."""
    main_thread = threading.main_thread()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main_thread):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # (a closed pipe: what the interpreter would ignore too)
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
