"""Synthesized traces shared by the synth tests: one per variant, made once per test session.

Variants cover each option both ways: compression, pointer size 4/8, full stacks / stack caching
(caching with both pointer sizes), and a trace whose samples mostly have stacks of their own (stack
variety 200: ~4,000 distinct stacks among ~7,000 samples). Other stages' tests use these names: keep
them stable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config import SynthConfig

VARIANTS = {
    "plain64": SynthConfig(seed=3, size="3MB", cpus=4),
    "xpress32_cached": SynthConfig(seed=4, size="3MB", cpus=3, compress=True, pointer_size=4, stack_caching=True),
    "xpress64": SynthConfig(seed=5, size="3MB", cpus=5, compress=True),
    "plain32_cached": SynthConfig(seed=6, size="2MB", cpus=2, pointer_size=4, stack_caching=True),
    "plain64_cached": SynthConfig(seed=7, size="2MB", cpus=3, stack_caching=True),
    "plain64_varied": SynthConfig(seed=8, size="4MB", cpus=4, stack_variety=200),
}


@dataclass
class Synth:
    name: str
    cfg: SynthConfig
    path: Path
    truth: dict
    summary: dict


@pytest.fixture(scope="session")
def synth_traces(tmp_path_factory) -> dict[str, Synth]:
    from pipeline import synth

    out = {}
    for name, cfg in VARIANTS.items():
        path = tmp_path_factory.mktemp(f"synth-{name}") / "trace.etl"
        summary = synth.run(path, cfg)
        out[name] = Synth(name, cfg, path, json.loads(path.with_name("trace.truth.json").read_text()), summary)
    return out


@pytest.fixture(scope="session", params=list(VARIANTS))
def synth_trace(request, synth_traces) -> Synth:
    return synth_traces[request.param]


@pytest.fixture(scope="session")
def decoded(synth_traces, dask_pool, tmp_path_factory):
    """Decode every variant once (real dask cluster).

    Returns name -> {"run": run dir, "tables": {table: list of row dicts}}.
    """
    from pipeline import decode
    from pipeline.config import Config
    from pipeline.runs import read_table, table_path

    out = {}
    for name, s in synth_traces.items():
        run = tmp_path_factory.mktemp(f"decoded-{name}")
        decode.run(run, Config(), dask_pool, inputs=[s.path])
        tables = {}
        for t in ("processes", "images", "samples", "stacks", "virtual_allocs", "heap_events", "heap_snapshots",
                  "heap_snapshot_blocks", "event_counts"):
            if table_path(run, "decoded", t).exists():
                tables[t] = read_table(run, "decoded", t).to_pylist()
        out[name] = {"run": run, "tables": tables}
    return out
