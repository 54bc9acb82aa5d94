"""A toy stage for ``tests/test_layers.py``: the self-profile events of the decode, counted into ``toyed/``."""

from __future__ import annotations

from pathlib import Path

from pipeline.runs import read_manifest, stage_output


def run(run_dir: Path, config, pool, inputs=None) -> dict:
    events = read_manifest(run_dir, "decoded")["self_profile"]["events"]
    with stage_output(run_dir, "toyed", config=config.resolved(), upstream=("decoded",)) as out:
        out.manifest["events"] = events
    return {"events": events}


def headline(summary: dict) -> str:
    return f"{summary['events']:,} events counted"
