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
    process (``none``); ``always``: never up to date (a comparison's baseline may have changed meanwhile)."""

    name: str
    module: str
    output: str | None
    section: str | None = None
    upstream: tuple[str, ...] = ()
    beside: str | None = None
    cluster: str = "tasks"
    always: bool = False

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


def outputs() -> tuple[str, ...]:
    """Every stage output directory, in the order of the pipeline."""
    return tuple(s.output for s in _REGISTRY.values() if s.output)


for _row in (
    Stage("capture", "pipeline.capture", CAPTURED, cluster="none"),
    Stage("synth", "pipeline.synth", None, "synth", cluster="none"),
    Stage("decode", "pipeline.decode", DECODED, "decode"),
    Stage("symbolize", "pipeline.symbolize", SYMBOLIZED, "symbolize", upstream=("decode",)),
    Stage("aggregate", "pipeline.aggregate", AGGREGATED, "aggregate", upstream=("decode", "symbolize"),
          beside="symbolize"),
    Stage("report", "pipeline.report", REPORTED, "report", upstream=("decode", "aggregate")),
    Stage("warehouse", "pipeline.warehouse", None, "warehouse", upstream=("aggregate",), beside="report",
          cluster="none"),
    Stage("compare", "pipeline.compare", COMPARED, "warehouse", upstream=("aggregate", "warehouse"), cluster="none",
          always=True),
):
    register(_row)
