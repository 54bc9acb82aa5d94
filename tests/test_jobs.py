"""`make pipeline` as a user runs it: jobs/demo.yaml through the CLI on a real dask LocalCluster,
once on the synthesized demo trace and once on a directory of real rustc self-profiles."""

from __future__ import annotations

import json

from pipeline.cli import main as cli_main
from pipeline.runs import read_manifest
from tests.conftest import ROOT, fixture_path

STAGES = ["decoded", "symbolized", "aggregated", "report"]


def _config(tmp_path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({
        "cluster": {"mode": "local", "n_workers": 2, "memory_limit": "2GiB", "inline_below": 0},
        "symbolize": {"cache_dir": str(tmp_path / "symcache")},
        "warehouse": {"path": str(tmp_path / "wh.duckdb")},
    }))
    return str(path)


def test_demo_job_without_trace_runs_every_stage(tmp_path, capsys):
    run = tmp_path / "demo-run"
    assert cli_main(["--config", _config(tmp_path), "run", str(ROOT / "jobs" / "demo.yaml"), "--run", str(run)]) == 0
    assert f"report: {run / 'report' / 'index.html'}" in capsys.readouterr().out
    assert (run / "input" / "demo.etl").exists()
    manifests = {stage: read_manifest(run, stage) for stage in STAGES}
    assert manifests["decoded"]["etl"]["buffers_skipped"] == 0
    assert manifests["decoded"]["tables"]["samples"] > 1000
    # the demo's symbol path is its own Breakpad store: every image with a debug id has symbols
    assert manifests["symbolized"]["images_without_symbols"] == []
    assert {"cpu", "memory", "processes"} <= set(manifests["aggregated"]["sections"])
    assert (tmp_path / "wh.duckdb").exists()


def test_demo_job_on_a_self_profile_directory(tmp_path, capsys):
    run = tmp_path / "sp-run"
    profiles = fixture_path("selfprofile/workspace-incremental")
    assert cli_main(["--config", _config(tmp_path), "run", str(ROOT / "jobs" / "demo.yaml"),
                     "--trace", str(profiles), "--run", str(run)]) == 0
    assert read_manifest(run, "symbolized")["skipped"].startswith("no ETL stacks")
    assert set(read_manifest(run, "aggregated")["sections"]) == {"queries"}
    assert (run / "report" / "profile_queries.counts.txt").exists()


def test_run_takes_a_symbol_path(tmp_path, capsys):
    """``bootprof run --symbol-path P`` is the symbolize stage's symbol path (here a place with no symbols: the
    demo trace's frames stay unresolved, and the manifest says where it looked)."""
    run = tmp_path / "demo-run"
    empty = tmp_path / "no-symbols"
    empty.mkdir()
    assert cli_main(["--config", _config(tmp_path), "run", str(ROOT / "jobs" / "demo.yaml"), "--run", str(run),
                     "--symbol-path", str(empty)]) == 0
    m = read_manifest(run, "symbolized")
    assert m["symbol_path"] == str(empty) and m["resolution_rate"] == 0.0
