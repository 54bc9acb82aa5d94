"""Runs the tests make: a synthesized trace through the stages a test needs."""

from __future__ import annotations

import json

from pipeline.config import Config
from tests.synth_traces import VARIANTS


def etl_config(trace, tmp) -> Config:
    config = Config()
    config.symbolize.symbol_path = str(trace.parent / "symbols")
    config.symbolize.cache_dir = tmp / "symcache"
    return config


def synth_run(tmp, variant: str, pool, stages=("decode", "symbolize", "aggregate")):
    """Synthesize ``variant`` under ``tmp`` and run ``stages`` on it; returns (run dir, truth)."""
    import importlib

    from pipeline import synth

    trace = tmp / "input" / "trace.etl"
    synth.run(trace, VARIANTS[variant])
    truth = json.loads(trace.with_name("trace.truth.json").read_text())
    run = tmp / "run"
    config = etl_config(trace, tmp)
    for stage in stages:
        importlib.import_module(f"pipeline.{stage}").run(run, config, pool, inputs=[trace])
    return run, truth
