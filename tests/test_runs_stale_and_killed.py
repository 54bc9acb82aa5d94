"""Outputs that no longer match their inputs are refused; what a killed stage leaves behind is removed by the
next run. Real stages on a small synthesized trace; the kill is a real SIGKILL of a real ``bootprof`` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.cluster import Pool
from pipeline.errors import ManifestError
from pipeline.runs import clean_leftovers, read_manifest
from tests.conftest import ROOT
from tests.helpers.runs import synth_run


@pytest.fixture()
def run(tmp_path):
    run, _ = synth_run(tmp_path, "plain64", Pool(None), stages=("decode", "symbolize", "aggregate"))
    return run


def test_an_upstream_stage_written_again_makes_its_outputs_stale(run, tmp_path):
    from pipeline import aggregate, decode, report, symbolize
    from tests.helpers.runs import etl_config

    config = etl_config(tmp_path / "input" / "trace.etl", tmp_path)
    config.cluster.mode = "synchronous"
    report.run(run, config, Pool(None))
    made = read_manifest(run, "aggregated")["upstream"]
    assert set(made) == {"decoded", "symbolized"}
    decode.run(run, config, Pool(None), inputs=[tmp_path / "input" / "trace.etl"])
    for stage in ("symbolized", "aggregated", "report"):
        changed = "decoded/ was"
        with pytest.raises(ManifestError, match=rf"{stage}/_manifest.json: stale: {changed} written again .* "
                                                 rf"run the '{stage}' stage again"):
            read_manifest(run, stage)
    # the aggregate refuses frames made from the old decode; symbolize again, and everything follows
    with pytest.raises(ManifestError, match="symbolized/_manifest.json: stale"):
        aggregate.run(run, config, Pool(None))
    symbolize.run(run, config, Pool(None))
    aggregate.run(run, config, Pool(None))
    report.run(run, config, Pool(None))
    for stage in ("symbolized", "aggregated", "report"):
        read_manifest(run, stage)


def test_a_killed_aggregate_leaves_nothing_after_the_next_run(run):
    """SIGKILL while the aggregate works (its DuckDB spill directory and temporary output exist): the previous
    output stays whole, and the next run of a stage removes the leftovers of the dead process but not those
    of a live one."""
    before = read_manifest(run, "aggregated")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for attempt in range(20):
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "aggregate", "--run", str(run)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if list(run.glob(".aggregate-spill-*")) and list(run.glob(".aggregated.tmp-*")):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait(timeout=60)
        if proc.returncode == -signal.SIGKILL:
            break
    else:
        pytest.fail("the aggregate finished before it could be killed, 20 times")
    # (sections run at once: there may be a spill directory for each; the run directory's lock and its owner note
    # are the command's, not a stage's leftovers: clean_leftovers removes the note of a dead owner)
    hidden = lambda: [p for p in run.iterdir() if p.name.startswith(".") and not p.name.startswith(".bootprof.")]  # noqa: E731
    left = sorted({p.name.split("-")[0] for p in hidden()})
    assert left == [".aggregate", ".aggregated.tmp"]
    assert read_manifest(run, "aggregated") == before
    live = run / f".report.tmp-{os.getpid()}-0000"          # (a stage of this very process, still at work)
    live.mkdir()
    removed = clean_leftovers(run)
    assert sorted({p.name.split("-")[0] for p in removed}) == [".aggregate", ".aggregated.tmp"]
    assert [p.name for p in hidden()] == [live.name] and not (run / ".bootprof.owner.json").exists()
    live.rmdir()
    from pipeline import aggregate
    from pipeline.config import Config

    aggregate.run(run, Config(), Pool(None))
    assert not hidden()
