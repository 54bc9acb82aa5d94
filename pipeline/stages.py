"""The stages, one typed row each: what the command line, the job runner, the up-to-date check and the warehouse
know of a stage. A stage is a module that follows :class:`StageModule` (``run`` and ``headline``, and the optional
parts it lists); a new stage is that module plus one row here (:func:`register`). This module imports no stage: it
names their modules, loaded when a stage runs.

Stages meet only through their outputs in the run directory (``output``: a directory with its manifest, written
last and swapped in whole, :func:`pipeline.runs.stage_output`), which record the hashes of the ``upstream``
outputs they read.

Commands that are no stage are listed here too (:func:`commands`): ``pack`` packs a run into one zip, ``synth``
writes a synthesized trace. Both make inputs and read no run; a job may begin with ``synth`` (:data:`DEMO`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

#: The output directories of the stages that write one (the only place their names are spelled).
CAPTURED, DECODED, SYMBOLIZED, AGGREGATED, REPORTED, COMPARED = \
    "capture", "decoded", "symbolized", "aggregated", "report", "compare"


class StageModule(Protocol):
    """What the module a stage's row names (``Stage.module``) defines: the job runner, ``bootprof <stage>``
    (:func:`pipeline.cluster.run_once`) and the up-to-date check (:func:`pipeline.jobs.stale_reason`) call these.

    Required: :meth:`run` and :meth:`headline`. Optional (a module that lacks one gets the default):

    - ``WARM_UP: tuple[str, ...]``: modules that local workers import, with their compiled kernels, before the
      stage's first task (:func:`warm_up`; default: none);
    - ``after``: a keyword of ``run`` for a stage whose row has ``beside``: a function that returns once the stage
      it started beside has ended (and raises its error), to call before it reads that one's output;
    - ``stale_reason(run_dir, config) -> str | None``: for a stage whose output is not a directory of the run (the
      warehouse: a DuckDB file): why it must run, None when it is up to date, in place of the check of its
      output's manifest;
    - ``inputs_changed(manifest, inputs) -> bool``: for a stage that reads the run's inputs (decode): whether
      ``inputs`` are other files than those its output's ``manifest`` was made from (a job's up-to-date check).

    Capture, which jobs never run (its row's ``job`` is False), has ``run`` only, with its command's options.

    (``Any`` below stands for types this module may not import, even to annotate: the config, the cluster and the
    contracts import it.)"""

    def run(self, run_dir: Path, config: Any, pool: Any, inputs: list[Any] | None = None) -> Any:
        """Run the stage on ``run_dir`` with ``config`` (:class:`pipeline.config.Config`), its tasks on ``pool``
        (:class:`pipeline.cluster.Pool`), reading ``inputs`` (paths or URLs, :mod:`pipeline.sources`) where it reads
        the run's inputs; write its output there and return its summary (:data:`pipeline.contracts.Summary`, kept in
        the output's manifest too)."""
        ...

    def headline(self, summary: Any) -> str:
        """The stage's line in a job's output: the few numbers that say what it did (the manifest has the rest)."""
        ...


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline.

    ``name``: its job-file and command name; ``module``: where its ``run`` is (a :class:`StageModule`); ``output``:
    its directory in a run (None: it writes none there: the warehouse writes a DuckDB file); ``section``: the config
    section its output depends on (a change makes it stale); ``upstream``: the stages whose outputs it reads;
    ``beside``: the stage before it that it may start beside (it waits for that one's output where it needs it,
    through the ``after`` its ``run`` gets); ``always``: never up to date (a comparison's baseline may have changed
    meanwhile); ``command``: the module of its ``bootprof <name>`` command (``add_arguments(parser)``,
    ``main(args, config)``; None: it has none, it runs in jobs only), with its one-line ``help``; ``writes_run``:
    the command holds its ``--run`` while it runs (``runs.owned``); ``job``: a job may name it (capture: only its
    command runs it)."""

    name: str
    module: str
    output: str | None
    section: str | None = None
    upstream: tuple[str, ...] = ()
    beside: str | None = None
    always: bool = False
    command: str | None = None
    help: str = ""
    writes_run: bool = False
    job: bool = True

    def load(self) -> StageModule:
        return cast(StageModule, importlib.import_module(self.module))

    def upstream_outputs(self) -> tuple[str, ...]:
        """The output directories of its upstream stages."""
        return tuple(o for o in (get(s).output for s in self.upstream) if o)


_REGISTRY: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    """Add (or replace) a stage's row; its upstream and beside stages must be there already."""
    for other in (*stage.upstream, *([stage.beside] if stage.beside else [])):
        if other not in _REGISTRY:
            raise ValueError(f"stage {stage.name}: no stage {other!r} to read from")
    _REGISTRY[stage.name] = stage
    return stage


def get(name: str) -> Stage:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no stage {name!r} (stages: {', '.join(_REGISTRY)})") from None


def names() -> list[str]:
    """Every stage, in the order of the pipeline."""
    return list(_REGISTRY)


#: The one step of a job that is no stage: ``synth`` writes the demo trace that ``bootprof run --demo`` analyses
#: (in the run's ``input/``), before the stages run. It makes inputs, as ``pack`` does; it reads no run.
DEMO = "synth"


def job_steps() -> list[str]:
    """What a job file's ``stages`` may name, in the order of the pipeline: :data:`DEMO`, then every stage a job
    runs."""
    return [DEMO] + [s.name for s in _REGISTRY.values() if s.job]


def warm_up(module: StageModule) -> tuple[str, ...]:
    """The modules local workers load before a stage's first task: its module's ``WARM_UP`` (none by default)."""
    return tuple(getattr(module, "WARM_UP", ()))


@dataclass(frozen=True)
class Command:
    """A ``bootprof`` command: a stage's, or one that is no stage (``pack`` and ``synth``, which make inputs)."""

    name: str
    module: str
    help: str
    writes_run: bool = False


#: Commands that are no stage, each after the stage it belongs with.
_OTHER_COMMANDS: list[tuple[str, Command]] = []


def commands() -> list[Command]:
    """Every ``bootprof`` command but ``run``, in the order of the pipeline."""
    out = []
    for stage in _REGISTRY.values():
        if stage.command:
            out.append(Command(stage.name, stage.command, stage.help, stage.writes_run))
        out += [c for after, c in _OTHER_COMMANDS if after == stage.name]
    return out


def upstream_of(output: str) -> tuple[str, ...]:
    """The output directories that the stage writing ``output`` reads (its row's ``upstream``): declared once, there."""
    row = next((s for s in _REGISTRY.values() if s.output == output), None)
    return row.upstream_outputs() if row is not None else ()


def outputs() -> tuple[str, ...]:
    """Every stage output directory, in the order of the pipeline."""
    return tuple(s.output for s in _REGISTRY.values() if s.output)


for _row in (
    Stage("capture", "pipeline.capture.record", CAPTURED, command="pipeline.capture.cli",
          help="record a build (rustc -Z self-profile; WPR/xperf on Windows; perf on Linux)", writes_run=True,
          job=False),
    Stage("decode", "pipeline.decode.stage", DECODED, "decode", command="pipeline.decode.cli",
          help="decode an ETL trace, a perf.data file or .mm_profdata files into parquet", writes_run=True),
    Stage("symbolize", "pipeline.symbolize.stage", SYMBOLIZED, "symbolize", upstream=("decode",),
          command="pipeline.symbolize.cli", help="resolve stack frames to modules, functions and lines",
          writes_run=True),
    Stage("aggregate", "pipeline.aggregate.stage", AGGREGATED, "aggregate", upstream=("decode", "symbolize"),
          beside="symbolize", command="pipeline.aggregate.cli",
          help="summarize CPU, memory, processes and queries", writes_run=True),
    Stage("report", "pipeline.report.stage", REPORTED, "report", upstream=("decode", "aggregate"),
          command="pipeline.report.cli", help="write the HTML report, flamegraphs, tables and exports",
          writes_run=True),
    Stage("warehouse", "pipeline.warehouse.ingest", None, "warehouse", upstream=("aggregate",), beside="report",
          command="pipeline.warehouse.cli", help="ingest runs into the DuckDB warehouse and query it"),
    Stage("compare", "pipeline.compare.stage", COMPARED, "warehouse", upstream=("aggregate", "warehouse"), always=True),
):
    register(_row)

_OTHER_COMMANDS += [
    ("capture", Command("pack", "pipeline.capture.pack_cli",
                        "pack a captured run (trace, self-profiles, symbols) into one zip")),
    ("capture", Command(DEMO, "pipeline.synth.cli", "write a synthetic rustc-bootstrap ETL trace with its ground truth")),
]
