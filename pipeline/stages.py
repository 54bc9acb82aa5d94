"""The stages, one typed row each: what the command line, the job runner, the up-to-date check and the warehouse
know of a stage. A stage is a module with ``run(run_dir, config, pool, inputs=...) -> summary`` (and
``headline(summary) -> str`` for its line in a job's output); a new stage is that module plus one row here
(:func:`register`). This module imports no stage: it names their modules, loaded when a stage runs.

Stages meet only through their outputs in the run directory (``output``: a directory with its manifest, written
last and swapped in whole, :func:`pipeline.runs.stage_output`), which record the hashes of the ``upstream``
outputs they read.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

#: The output directories of the stages that write one (the only place their names are spelled).
CAPTURED, DECODED, SYMBOLIZED, AGGREGATED, REPORTED, COMPARED = \
    "capture", "decoded", "symbolized", "aggregated", "report", "compare"


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline.

    ``name``: its job-file and command name; ``module``: where its ``run`` is; ``output``: its directory in a run
    (None: it writes none there: synth writes a trace, the warehouse a DuckDB file); ``section``: the config section
    its output depends on (a change makes it stale); ``upstream``: the stages whose outputs it reads; ``beside``:
    the stage before it that it may start beside (it waits for that one's output where it needs it, through the
    ``after`` its ``run`` gets); ``cluster``: whether its work goes to the dask pool (``tasks``) or runs in this
    process (``none``); ``always``: never up to date (a comparison's baseline may have changed meanwhile);
    ``command``: the module of its ``bootprof <name>`` command (``add_arguments(parser)``, ``main(args, config)``;
    None: it has none, it runs in jobs only), with its one-line ``help``; ``writes_run``: the command holds its
    ``--run`` while it runs (``runs.owned``)."""

    name: str
    module: str
    output: str | None
    section: str | None = None
    upstream: tuple[str, ...] = ()
    beside: str | None = None
    cluster: str = "tasks"
    always: bool = False
    command: str | None = None
    help: str = ""
    writes_run: bool = False

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

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


@dataclass(frozen=True)
class Command:
    """A ``bootprof`` command: a stage's, or one that is no stage (``pack``, which makes an input)."""

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
    Stage("capture", "pipeline.capture", CAPTURED, cluster="none", command="pipeline.capture.cli",
          help="record a build (rustc -Z self-profile; WPR/xperf on Windows; perf on Linux)", writes_run=True),
    Stage("synth", "pipeline.synth", None, "synth", cluster="none", command="pipeline.synth.cli",
          help="write a synthetic rustc-bootstrap ETL trace with its ground truth"),
    Stage("decode", "pipeline.decode", DECODED, "decode", command="pipeline.decode.cli",
          help="decode an ETL trace, a perf.data file or .mm_profdata files into parquet", writes_run=True),
    Stage("symbolize", "pipeline.symbolize", SYMBOLIZED, "symbolize", upstream=("decode",),
          command="pipeline.symbolize.cli", help="resolve stack frames to modules, functions and lines",
          writes_run=True),
    Stage("aggregate", "pipeline.aggregate", AGGREGATED, "aggregate", upstream=("decode", "symbolize"),
          beside="symbolize", command="pipeline.aggregate.cli",
          help="summarize CPU, memory, processes and queries", writes_run=True),
    Stage("report", "pipeline.report", REPORTED, "report", upstream=("decode", "aggregate"),
          command="pipeline.report.cli", help="write the HTML report, flamegraphs, tables and exports",
          writes_run=True),
    Stage("warehouse", "pipeline.warehouse", None, "warehouse", upstream=("aggregate",), beside="report",
          cluster="none", command="pipeline.warehouse.cli", help="ingest runs into the DuckDB warehouse and query it"),
    Stage("compare", "pipeline.compare", COMPARED, "warehouse", upstream=("aggregate", "warehouse"), cluster="none",
          always=True),
):
    register(_row)

_OTHER_COMMANDS.append(("capture", Command("pack", "pipeline.capture.pack_cli",
                                           "pack a captured run (trace, self-profiles, symbols) into one zip")))
