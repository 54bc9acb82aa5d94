"""Command line: ``bootprof <stage> ...`` and ``python -m pipeline <stage> ...``.

The commands are the registry's (:func:`pipeline.stages.commands`): each row names the module that implements its
command (``add_arguments(parser)`` and ``main(args, config) -> int``), imported only to build the parser. This module
names no stage; ``run`` (a job) is its own.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from pipeline import ENV_DEFAULTS, __version__, sources, stages
from pipeline.config import Config, load_config
from pipeline.errors import DONE, BootprofError, Terminated, is_duckdb_error, is_interrupt, place_error

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
    for command in stages.commands():      # (the registry's: a stage's row names its command)
        mod = importlib.import_module(command.module)
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        mod.add_arguments(p)
        p.set_defaults(_module=mod, _writes_run=command.writes_run)
    run = sub.add_parser("run", help="run a job from jobs/ (all its stages) on a trace, or on each of many",
                         description="Run a job file's stages in order. A stage whose output is up to date (same "
                         "inputs by content hash, same settings) is skipped.")
    run.add_argument("job", type=Path, help="job file (jobs/single-trace.yaml) or a job's name (single-trace, nightly, "
                     "backfill: jobs/NAME.yaml of the working directory, else bootprof's own)")
    run.add_argument("--trace", type=sources.parse, action="append", help="ETL trace or self-profile directory, a path or an "
                     "fsspec URL (https://, s3://, ... : the workers read it there); repeatable "
                     "(one run holds one ETL trace and its self-profiles; a backfill job runs each one). Default: "
                     "what `bootprof capture` left in --run, else what the run's decode was made from")
    run.add_argument("--run", dest="run_dir", type=sources.run_dir,
                     help="run directory, or a store's URL (s3://...) the run is kept at (default: <runs_dir>/<job>-<time>)")
    run.add_argument("--symbol-path", dest="symbol_path", help="symbol path for the symbolize stage "
                     "(_NT_SYMBOL_PATH syntax: DIR;srv*CACHE*URL;cache*DIR; overrides symbolize.symbol_path)")
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override a config value (read as YAML), e.g. --set synth.size=20MB or "
                     "--set warehouse.labels.workload=stage2; repeatable")
    run.add_argument("--force", action="store_true", help="run every stage, even those that are up to date")
    run.add_argument("--demo", action="store_true", help="analyse a synthesized demo trace (made in the run by the "
                     "job's synth step); without it, a run with no input is an error")
    run.set_defaults(_module=None)
    return parser


def _text_out() -> None:
    """What is printed never fails on a character the output's encoding lacks: a pipe or a file on Windows takes
    the ANSI code page (cp1252, ...), where a crate, a path or a unit (μs) may have none; such a character is
    written as its escape (``\\u03a9``) instead of ending the command."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding and not encoding.startswith("utf") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):       # (a stream that cannot be reconfigured: left as it is)
                pass


def main(argv: list[str] | None = None) -> int:
    for var, value in ENV_DEFAULTS.items():       # (before numpy is first imported)
        os.environ.setdefault(var, value)
    _text_out()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        sys.unraisablehook = _interrupt_again
    try:
        args = build_parser().parse_args(argv)
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        if args.command == "run":
            from pipeline.jobs import run_job

            return run_job(args.job, args.trace, args.run_dir, args.config, args.symbol_path, args.sets, args.force,
                           args.demo)
        config: Config = load_config(args.config)
        from pipeline.mirror import mirrored
        from pipeline.runs import RunLocation

        if isinstance(getattr(args, "run_dir", None), RunLocation):
            with mirrored(args.run_dir, config.runs) as args.run_dir:
                return _owning(args, config)
        return _owning(args, config)
    except BootprofError as exc:
        print(f"bootprof: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(str(exc))
    except BrokenPipeError:
        # (whoever read the output went away, as `| head` does: nothing more to say; 128 + SIGPIPE, as a shell does)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:        # (after the others: an exception re-raised here reaches no clause below it)
        place = place_error(exc)
        if place is not None:           # (a full or read-only disk: one line, what was written is left as it was)
            print(f"bootprof: error: {place}; nothing half-written was kept", file=sys.stderr)
            return 2
        if is_duckdb_error(exc) and not is_interrupt(exc):
            # (one line for any DuckDB error that no stage turned into its own: a damaged warehouse file, say)
            text = " ".join(str(exc).split())
            hint = ("; `bootprof warehouse verify` says what is damaged, `bootprof warehouse rebuild` remakes the "
                    "file from its runs" if "orrupt" in text or "checksum" in text else "")
            print(f"bootprof: error: DuckDB: {text[:400]}{hint}", file=sys.stderr)
            return 2
        if not is_interrupt(exc):       # (DuckDB's own word for a Ctrl-C during its query)
            raise
        return _interrupted("")


def _interrupted(why: str) -> int:
    """Exit status of a command ended by a signal: 143 for SIGTERM, 130 for Ctrl-C (as a shell counts them)."""
    why = "; ".join([w for w in [why] if w] + [f"{done} before that" for done in DONE])
    print(f"bootprof: {'terminated' if _terminated else 'interrupted'}{': ' + why if why else ''}", file=sys.stderr)
    return 143 if _terminated else 130


def _terminate(signum, frame) -> None:
    """SIGTERM: end as a Ctrl-C does (:class:`Terminated`), not at once with the workers left behind."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)     # (a second one ends the process at once)
    _terminated.append(signum)
    raise Terminated()


def _interrupt_again(unraisable) -> None:
    """``sys.unraisablehook``: a Ctrl-C or SIGTERM whose exception was raised inside a callback that Python runs for
    itself (a weak reference's, a ``__del__``, an import lock's) is printed as "Exception ignored" and dropped there,
    and the command went on as if it had never come (seen: a SIGTERM during an import, then no exit in 120 s). It is
    delivered again to the main thread, where it ends the command as it should; anything else is printed as usual."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        import _thread

        # (from another thread, a moment after this hook returned: raised in the hook, it would be dropped again; a
        # Terminated comes back as a Ctrl-C, and ``_terminated`` still says it was one)
        again = threading.Timer(0.05, _thread.interrupt_main, args=(signal.SIGINT,))
        again.daemon = True
        again.start()
        return
    sys.__unraisablehook__(unraisable)


#: Set once SIGTERM arrived: what DuckDB or a worker turned into their own interrupt is still a termination.
_terminated: list[int] = []


def _owning(args, config) -> int:
    """Run a subcommand, holding its run directory when it writes one (``writes_run`` in its registry row)."""
    if not getattr(args, "_writes_run", False) or getattr(args, "run_dir", None) is None:
        return int(args._module.main(args, config) or 0)
    from pipeline.runs import owned

    with owned(Path(args.run_dir), f"bootprof {args.command}", config.runs.lock_timeout_s):
        return int(args._module.main(args, config) or 0)


def entry() -> NoReturn:
    """The ``bootprof`` command and ``python -m pipeline``: ``main``, then :func:`exit_quickly`."""
    exit_quickly(main())


def exit_quickly(code: int) -> NoReturn:
    """End the process with ``code`` as the interpreter would, but without its teardown.

    A command's work is done when ``main`` returns: every stage output is written and renamed into
    place, and files and DuckDB connections are closed where they are used. What the interpreter
    would still do is tear down every object of its imports (numpy, pyarrow, duckdb, dask, numba),
    running several full garbage collections over them, a cost every command would pay.
    So: wait for threads that are not daemons as usual (if any is alive, exit the usual way), run the
    ``atexit`` handlers (logging's flush, temporary directories, dask's), flush the standard streams,
    then ``os._exit``."""
    main_thread = threading.main_thread()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main_thread):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:          # (None: the stream was closed before the process started)
                stream.flush()
        except (OSError, ValueError):       # (a closed pipe: what the interpreter would ignore too)
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
