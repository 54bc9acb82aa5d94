"""Jobs: ``bootprof run JOB`` runs a job file's stages in order, on one trace or (backfill) on each of many.

A job file (``jobs/*.yaml``, :class:`pipeline.config.Job`) names its stages and config. Before each stage the
run directory is checked: a stage whose output exists and was made by this bootprof version from the same
inputs (content hashes) with the same settings is skipped, so a rerun of a job does only what changed:

- ``decoded``: its manifest's inputs (path, size, sha256) equal the inputs now, and ``decode`` settings
  are the same;
- ``symbolized``, ``aggregated``, ``report``: their own config section is the same and the outputs they were
  made from (the ``upstream`` manifest hashes) have not been written again since;
- ``warehouse``: the warehouse holds this run with the same stage manifests and labels;
- ``compare`` always runs: its answer depends on the other runs in the warehouse.

A stage rerun rewrites its manifest, so every stage after it is stale and runs too.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote


from pipeline import __version__, portable, sources, stages, steps
from pipeline.config import Config, Job, load_config, load_job, parse_yaml
from pipeline.errors import BootprofError, ConfigError, InputError, ManifestError
from pipeline.mirror import mirrored
from pipeline.progress import Status, print_line
from pipeline.runs import MANIFEST, RunLocation, canonical_hash, fresh_dir, owned, read_manifest, stage_dir
from pipeline.stages import CAPTURED, DECODED, REPORTED

if TYPE_CHECKING:
    from pipeline.contracts import Summary
    from pipeline.stages import StageModule

def apply_sets(config: Config, sets: list[str]) -> Config:
    """``--set section.key=value`` (value read as YAML: 4, true, 20MB, [a, b]) over ``config``, validated."""
    from pydantic import ValidationError

    data = config.resolved()
    for item in sets:
        key, sep, text = item.partition("=")
        path = [p for p in key.strip().split(".") if p]
        if not sep or not path:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set synth.size=20MB")
        shown = item if len(item) <= 80 else item[:77] + "..."
        value = parse_yaml(text, f"--set {shown!r}: the value")[0] if text.strip() else ""
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                if part in node and node[part] is not None:
                    raise ConfigError(f"--set {item!r}: {part} is not a section")
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
        try:
            Config.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"--set {item!r}: {where}: {err['msg'].removeprefix('Value error, ')}") from None
    return Config.model_validate(data)


def captured_inputs(run_dir: Path) -> list[Path]:
    """What ``bootprof capture`` left in ``run_dir``: its trace and its self-profile directory."""
    try:
        manifest = read_manifest(run_dir, CAPTURED)
    except ManifestError:
        return []
    from pipeline.capture.paths import PROFILE_DIR, RECORDINGS

    # (where they are in this run directory, else where the capture wrote them: an ETL trace or a perf.data file)
    found = []
    trace = (manifest.get("recording") or {}).get("path")
    if trace:
        found += [p for p in (*(run_dir / t for t in RECORDINGS if t.name == Path(trace).name), Path(trace))
                  if p.exists()][:1]
    if manifest.get("files") and manifest.get("profile_dir"):
        found += [p for p in (run_dir / PROFILE_DIR, Path(manifest["profile_dir"])) if p.is_dir()][:1]
    return found


@dataclass(frozen=True)
class Inputs:
    """What a job runs on, made once as it starts: the ``files`` (local paths and URLs) and where they came from:
    ``given`` (``--trace``), ``captured`` (the run's capture), ``synth`` (the demo), or ``decoded``: the files the
    run's decode was made from, for ``bootprof run`` without ``--trace`` on a run that has one. The run then goes on
    from its decode, which stays as it is while its settings do, whether or not these files are still where they
    were (on another machine that works on a run kept at a URL, they are not)."""

    files: tuple[sources.Input, ...]
    origin: str = "given"


def decoded_inputs(run_dir: Path) -> Inputs:
    """The inputs of the run's decode, as its manifest names them (none without a decode)."""
    try:
        manifest = read_manifest(run_dir, DECODED)
    except ManifestError:
        return Inputs((), "decoded")
    return Inputs(tuple(sources.parse(i["path"]) for i in manifest.get("inputs") or [] if i.get("path")), "decoded")


def stale_reason(run_dir: Path, stage: str, config: Config, inputs: Inputs) -> str | None:
    """Why ``stage`` must run in ``run_dir``; None when its output is up to date. (The stage module's optional
    ``stale_reason`` and ``inputs_changed``: :class:`pipeline.stages.StageModule`.)"""
    row = stages.get(stage)
    if row.always:
        return "always (its baseline may have changed)"
    module = row.load()
    own = getattr(module, "stale_reason", None)
    if own is not None:         # (a stage whose output is not a directory of the run: it says itself)
        return own(run_dir, config)
    out, section = row.output, row.section
    if out is None:
        return "it writes no output to check"
    if not (stage_dir(run_dir, out) / MANIFEST).exists():
        return "no output yet"
    try:
        manifest = read_manifest(run_dir, out)
    except ManifestError as exc:
        return str(exc).split(": ", 1)[-1]
    if manifest.get("project_version") != __version__:
        return f"made by bootprof {manifest.get('project_version')}"
    if section is not None and canonical_hash((manifest.get("config") or {}).get(section)) != \
            canonical_hash(config.resolved()[section]):
        return f"the {section} settings changed"
    changed = getattr(module, "inputs_changed", None)
    # (inputs that are those of the run's decode are the files it was made from, wherever they are now)
    if changed is not None and inputs.origin != "decoded" and changed(manifest, list(inputs.files)):
        return "the inputs changed"
    return None


def run_stages(job: Job, config: Config, inputs: Inputs, run_dir: Path, force: bool = False
               ) -> dict[str, Summary | None]:
    """Every stage of ``job`` (but its demo trace, ``stages.DEMO``) on ``inputs`` in ``run_dir``; their summaries,
    by stage."""
    run_dir = Path(run_dir).absolute()      # (the tasks may run in workers of another working directory)
    from pipeline.cluster import connect

    todo_stages = [s for s in job.stages if s != stages.DEMO]
    modules = {stage: stages.get(stage).load() for stage in todo_stages}
    summaries: dict[str, Summary | None] = {}
    # (no cluster starts for a job whose stages are all up to date)
    first = next((s for s in todo_stages if force or stale_reason(run_dir, s, config, inputs) is not None), None)
    for stage in todo_stages[:todo_stages.index(first) if first else len(todo_stages)]:
        print_line(f"  {stage:<10} {'skipped':>7}  (up to date)")
        summaries[stage] = None
    if first is None:
        return summaries
    todo = todo_stages[todo_stages.index(first):]
    with connect(config.cluster, warm_up=[m for s in todo for m in stages.warm_up(modules[s])],
                 size=sources.input_bytes(inputs.files), background=True) as pool:
        beside: concurrent.futures.Future | None = None     # (the stage that runs beside the next one)
        for k, stage in enumerate(todo):
            if beside is not None:
                summaries[todo[k - 1]], summaries[stage] = _run_beside(
                    (todo[k - 1], modules[todo[k - 1]]), beside, stage, modules[stage], run_dir, config, pool, inputs)
                beside = None
                continue
            if not force and stage != first and stale_reason(run_dir, stage, config, inputs) is None:
                print_line(f"  {stage:<10} {'skipped':>7}  (up to date)")
                summaries[stage] = None
                continue
            after = todo[k + 1] if k + 1 < len(todo) else None
            if after is not None and stages.get(after).beside == stage:
                # (the next stage starts now, beside this one, and waits for it where it needs its output)
                beside = _start_beside(stage, modules[stage], run_dir, config, pool, inputs)
                continue
            t0 = time.perf_counter()
            with Status(stage, 0) as status:
                status.say("running")
                summary = summaries[stage] = modules[stage].run(run_dir, config, pool, inputs=list(inputs.files))
            print_line(f"  {stage:<10} {time.perf_counter() - t0:7.2f} s  {headline(modules[stage], summary)}")
    return summaries


def headline(module: StageModule, summary: Summary | None) -> str:
    """A stage's summary as its line in the job's output: its module's ``headline`` (the manifest holds the whole
    summary)."""
    if summary is None:
        return ""
    try:
        return module.headline(summary)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):      # (a summary of another shape: all of it)
        return str(summary)


def _start_beside(stage: str, module, run_dir: Path, config: Config, pool, inputs: Inputs) -> concurrent.futures.Future:
    """``stage`` on a thread of its own (:func:`pipeline.steps.beside`): a future of (its summary, its seconds)."""
    def work() -> tuple[Any, float]:
        t0 = time.perf_counter()
        return module.run(run_dir, config, pool, inputs=list(inputs.files)), time.perf_counter() - t0

    return steps.beside(work, f"stage-{stage}")


def _run_beside(started: tuple[str, Any], running: concurrent.futures.Future, stage: str, module, run_dir: Path,
                config: Config, pool, inputs: Inputs) -> tuple[Any, Any]:
    """``stage`` (whose module names the ``started`` stage, ``(name, module)``, as its ``BESIDE``) while that one
    runs on its thread (``running``): it gets ``after``, which returns once the first has ended (and raises its
    error). Both lines are printed as each stage ends; an error of the first is raised before one of ``stage``.
    Returns both summaries."""
    import threading

    first, first_module = started
    t0 = time.perf_counter()
    shown: list[Any] = []
    printing = threading.Lock()

    def after() -> None:
        steps.wait_for([running])
        summary, seconds = running.result()
        with printing:
            if not shown:
                shown.append(summary)
                print_line(f"  {first:<10} {seconds:7.2f} s  {headline(first_module, summary)}")

    try:
        with Status(f"{first}, {stage}", 0) as status:
            status.say("running")
            summary = module.run(run_dir, config, pool, inputs=list(inputs.files), after=after)
    except KeyboardInterrupt:
        raise                       # (the stage beside goes with the process; its output is never swapped in)
    except BaseException:
        after()                     # (waits for first; raises its error, if it failed)
        raise
    after()
    print_line(f"  {stage:<10} {time.perf_counter() - t0:7.2f} s  (started beside {first}) {headline(module, summary)}")
    return shown[0], summary


def _synth_demo(config: Config, run_dir: Path) -> list[Path]:
    """The demo trace, and the self-profiles of its rustc processes when ``synth.self_profiles``."""
    from pipeline import synth

    trace = run_dir / "input" / "demo.etl"
    t0 = time.perf_counter()
    with Status("synth", 0) as status:
        status.say(f"writing the demo trace ({config.synth.size.text})")
        summary = synth.run(trace, config.synth)
    print(f"  synth      {time.perf_counter() - t0:7.2f} s  {trace}")
    symbols = trace.parent / "symbols"
    if symbols.exists() and not config.symbolize.symbol_path:
        config.symbolize.symbol_path = str(symbols.resolve())
    return [trace] + ([Path(summary["self_profiles"])] if summary.get("self_profiles") else [])


def run_job(job_path: Path, traces: list[Path] | None, run_dir: RunLocation | None, config_path: Path | None,
            symbol_path: str | None = None, sets: list[str] | None = None, force: bool = False,
            demo: bool = False) -> int:
    """``bootprof run``: the job on its inputs; the exit status (1: a regression past budget or a failed trace).
    ``demo``: on the synthesized demo trace, which is never taken in place of an input that is missing."""
    from pipeline import packaged

    job_path = packaged.job_path(job_path)
    job = load_job(job_path)
    if demo and traces:
        raise InputError("bootprof run: --demo analyses the synthesized demo trace; it does not go with --trace")
    if demo and stages.DEMO not in job.stages:
        raise BootprofError(f"{job_path}: job has no 'synth' stage, so it cannot make the --demo trace")
    if config_path is None and job.config is not None:
        config_path = packaged.job_config(job_path, job.config)
    config = apply_sets(load_config(config_path), sets or [])
    if symbol_path is not None:
        config.symbolize.symbol_path = symbol_path
    # Runs of one job are compared with each other in the warehouse, whatever their directory is called.
    config.warehouse.labels = {"job": job.name, **config.warehouse.labels}
    traces = [t if sources.is_url(t) else Path(t) for t in traces or []]
    if job.backfill:
        return backfill(job, config, traces, force)
    if run_dir is None:
        run_dir = job.run_dir(f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if run_dir.path is not None:        # (two jobs started in the same second get a run each)
            run_dir = RunLocation(path=fresh_dir(run_dir.path))
    with mirrored(run_dir, config.runs) as local, \
            owned(Path(local), f"bootprof run {job_path}", config.runs.lock_timeout_s):
        return _run_in(job, job_path, config, traces, Path(local), force, shown=str(run_dir), demo=demo)


def _run_in(job: Job, job_path: Path, config: Config, traces: list[sources.Input], run_dir: Path, force: bool,
            shown: str, demo: bool = False) -> int:
    """``run_job`` in ``run_dir`` (``shown``: what the user named, a path or the URL it is a working copy of)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run directory: {shown}")
    from pipeline.capture.bundle import unpacked

    traces = unpacked(traces, run_dir)
    if demo:
        if captured_inputs(run_dir):
            raise InputError(f"{shown} holds a capture: analyse it without --demo, or give --demo a run of its own")
        inputs = Inputs(tuple(_synth_demo(config, run_dir)), "synth")
    elif traces:
        inputs = Inputs(tuple(traces))
    elif captured := captured_inputs(run_dir):
        inputs = Inputs(tuple(captured), "captured")
    else:
        inputs = decoded_inputs(run_dir)
    n = len(inputs.files)
    if inputs.origin == "decoded" and n:
        print(f"inputs: those of the run's decode ({n} file{'' if n == 1 else 's'})")
    if not inputs.files:
        # (a CI job whose capture was lost must not go green on made-up data)
        raise InputError(f"{shown}: nothing to analyse: no --trace was given and the run holds no capture and no "
                         "decode. Name a trace (--trace build.etl), capture into the run first (bootprof capture "
                         f"... --run {shown}), or ask for the synthesized demo trace (--demo)")
    summaries = run_stages(job, config, inputs, run_dir, force)
    index = run_dir / REPORTED / "index.html"
    if "report" in job.stages and index.exists():
        print(f"report: {index}")
    if "compare" in job.stages:
        past = summaries["compare"]["regressions_past_budget"]
        print(f"compare: {run_dir / 'compare' / 'summary.md'}" + (
            f" ({past} confident regressions of {config.warehouse.budget_pct:g}% or more)" if past else ""))
        return 1 if past else 0
    return 0


def backfill_inputs(traces: list[sources.Input]) -> list[sources.Input]:
    """Each trace of a backfill: files as given; a directory holding ETL traces gives each of them (sorted),
    any other directory is one run's self-profiles (paths or URLs)."""
    found: list[sources.Input] = []
    for path in traces:
        etls = sources.traces_in(path) if sources.exists(path) and sources.is_dir(path) else []
        found.extend(etls or [path])
    return found


def backfill(job: Job, config: Config, traces: list[sources.Input], force: bool = False) -> int:
    """Each trace into its own run (``<runs_dir>/<job>-<trace stem>``) and the warehouse. A trace that fails
    is reported and the others still run; the exit status is 1 when any failed."""
    inputs = backfill_inputs(traces)
    if not inputs:
        raise BootprofError(f"job {job.name} is a backfill: give its traces with --trace (files or directories)")
    names: dict[str, int] = {}
    failed = []
    for n, trace in enumerate(inputs, 1):
        stem = sources.name(trace) if sources.exists(trace) and sources.is_dir(trace) else sources.stem(trace)
        stem = portable.file_name(unquote(stem))       # (a URL's %3A or a time's ':' are no names on Windows)
        seen = names[stem.casefold()] = names.get(stem.casefold(), 0) + 1       # (NTFS: Trace.etl is trace.etl)
        run_dir = job.run_dir(f"{job.name}-{stem}" + ("" if seen == 1 else f"-{seen}"))
        print(f"[{n}/{len(inputs)}] {trace} -> {run_dir}")
        try:
            if not sources.exists(trace):
                raise BootprofError(f"{trace}: no such file or directory")
            with mirrored(run_dir, config.runs) as local, \
                    owned(Path(local), f"bootprof run {job.name} (backfill)", config.runs.lock_timeout_s):
                run_stages(job, config, Inputs((trace,)), Path(local), force)
        except BootprofError as exc:
            failed.append((trace, str(exc)))
            print(f"  failed: {exc}")
    print(f"backfill: {len(inputs) - len(failed)} of {len(inputs)} traces in {config.warehouse.path}"
          + (f"; failed: {', '.join(str(t) for t, _ in failed)}" if failed else ""))
    return 1 if failed else 0
