"""`make pipeline` as a user runs it: jobs/single-trace.yaml through the CLI on a real dask LocalCluster,
once on the synthesized demo trace and once on a directory of real rustc self-profiles."""

from __future__ import annotations

import contextlib
import json

from pipeline.cli import main as cli_main
from pipeline.runs import read_manifest
from tests.conftest import ROOT, S3_BUCKET, assert_same_tables, contract_breaches, fixture_path
from tests.rangeserver import serving

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
    assert cli_main(["--config", _config(tmp_path), "run", str(ROOT / "jobs" / "single-trace.yaml"), "--demo", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"report: {run / 'report' / 'index.html'}" in out
    # (aggregate starts beside symbolize; each stage's line comes as it ends, in the job's order)
    lines = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert lines == ["synth", "decode", "symbolize", "aggregate", "report", "warehouse"]
    assert "(started beside symbolize)" in next(line for line in out.splitlines() if line.startswith("  aggregate"))
    assert "(started beside report)" in next(line for line in out.splitlines() if line.startswith("  warehouse"))
    assert (run / "input" / "demo.etl").exists()
    manifests = {stage: read_manifest(run, stage) for stage in STAGES}
    assert manifests["decoded"]["etl"]["buffers_skipped"] == 0
    assert manifests["decoded"]["tables"]["samples"] > 1000
    # the demo's symbol path is its own Breakpad store: every image with a debug id has symbols
    assert manifests["symbolized"]["images_without_symbols"] == []
    assert {"cpu", "memory", "processes"} <= set(manifests["aggregated"]["sections"])
    assert (tmp_path / "wh.duckdb").exists()
    # Each stage's line is its headline, the numbers from its manifest (which holds the rest), not the whole summary.
    shown = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    etl, sym = manifests["decoded"]["etl"], manifests["symbolized"]
    assert f"{etl['records']:,} records (0 errors), {etl['samples']:,} samples" in shown["decode"]
    assert f"{sym['frames']:,} frames, 100.0 % resolved" in shown["symbolize"]
    assert f"{manifests['aggregated']['sections']['cpu']['samples']:,} CPU samples" in shown["aggregate"]
    assert "run demo-run: 28 tables" in shown["warehouse"]
    assert not [line for line in shown.values() if "{" in line or len(line) > 200], shown
    assert contract_breaches(run) == []


def test_demo_job_on_a_self_profile_directory(tmp_path, capsys):
    run = tmp_path / "sp-run"
    profiles = fixture_path("selfprofile/workspace-incremental")
    assert cli_main(["--config", _config(tmp_path), "run", str(ROOT / "jobs" / "single-trace.yaml"),
                     "--trace", str(profiles), "--run", str(run)]) == 0
    assert read_manifest(run, "symbolized")["skipped"].startswith("no ETL stacks")
    assert set(read_manifest(run, "aggregated")["sections"]) == {"queries"}
    assert (run / "report" / "profile_queries.counts.txt").exists()
    assert contract_breaches(run) == []


def test_run_takes_a_symbol_path(tmp_path, capsys):
    """``bootprof run --symbol-path P`` is the symbolize stage's symbol path (here a place with no symbols: the
    demo trace's frames stay unresolved, and the manifest says where it looked)."""
    run = tmp_path / "demo-run"
    empty = tmp_path / "no-symbols"
    empty.mkdir()
    # (a small demo trace in this process: what is proven is where the setting goes)
    assert cli_main(["--config", _sync_config(tmp_path), "run", str(ROOT / "jobs" / "single-trace.yaml"), "--demo",
                     "--run", str(run), "--symbol-path", str(empty), "--set", "synth.size=2MB"]) == 0
    m = read_manifest(run, "symbolized")
    assert m["symbol_path"] == str(empty) and m["resolution_rate"] == 0.0


def test_a_run_with_no_input_is_an_error_and_the_demo_comes_only_when_asked(tmp_path, capsys):
    """A CI job whose capture was lost once went green on the synthesized demo trace. Now a run with nothing to
    analyse is one line and exit 2, with nothing made; ``--demo`` asks for the demo, never beside an input."""
    job = str(ROOT / "jobs" / "single-trace.yaml")
    run = tmp_path / "lost-capture"
    assert cli_main(["--config", _sync_config(tmp_path), "run", job, "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run}: nothing to analyse: no --trace was given and the run holds no capture" in err
    assert "--demo" in err and len(err.strip().splitlines()) == 1
    assert not (run / "input").exists() and not (run / "decoded").exists()

    trace = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    assert cli_main(["run", job, "--demo", "--trace", str(trace), "--run", str(tmp_path / "both")]) == 2
    assert "--demo analyses the synthesized demo trace; it does not go with --trace" in capsys.readouterr().err

    from pipeline.capture import PROFILE_DIR, STAGE
    from pipeline.runs import stage_output

    captured = tmp_path / "captured"
    (captured / PROFILE_DIR).mkdir(parents=True)
    with stage_output(captured, STAGE, inputs=[], config={}) as out:
        out.manifest.update(files=[{"name": "x.mm_profdata", "size": 1}], profile_dir=str(captured / PROFILE_DIR))
    assert cli_main(["--config", _sync_config(tmp_path), "run", job, "--demo", "--run", str(captured)]) == 2
    assert f"{captured} holds a capture: analyse it without --demo" in capsys.readouterr().err
    assert not (captured / "input").exists()


def _sync_config(tmp_path, **extra) -> str:
    path = tmp_path / "sync.yaml"
    path.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "symbolize": {"cache_dir": str(tmp_path / "c")},
                                "warehouse": {"path": str(tmp_path / "wh.duckdb")}, **extra}))
    return str(path)


def _stage_lines(out: str) -> dict[str, str]:
    """stage -> "skipped" or its seconds, from the lines `bootprof run` prints per stage."""
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("  ")}


def test_a_rerun_skips_what_is_up_to_date(tmp_path, capsys):
    """Run a job twice on one trace: the second run skips every stage. Change the report's settings: the
    report and the warehouse run again, nothing before them. A changed input reruns everything."""
    from pipeline.runs import stage_dir

    cfg, run = _sync_config(tmp_path), tmp_path / "run"
    trace = fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl")
    job = str(ROOT / "jobs" / "single-trace.yaml")
    assert cli_main(["--config", cfg, "run", job, "--trace", str(trace), "--run", str(run)]) == 0
    first = _stage_lines(capsys.readouterr().out)
    assert "skipped" not in first.values() and len(first) == 5
    made = {s: read_manifest(run, s)["created_utc"] for s in STAGES}
    decoded_mtime = (stage_dir(run, "decoded") / "_manifest.json").stat().st_mtime_ns

    assert cli_main(["--config", cfg, "run", job, "--trace", str(trace), "--run", str(run)]) == 0
    second = _stage_lines(capsys.readouterr().out)
    assert list(second.values()) == ["skipped"] * 5, second
    assert (stage_dir(run, "decoded") / "_manifest.json").stat().st_mtime_ns == decoded_mtime

    assert cli_main(["--config", cfg, "run", job, "--trace", str(trace), "--run", str(run),
                     "--set", "report.title=nightly x64"]) == 0
    third = _stage_lines(capsys.readouterr().out)
    assert [s for s, how in third.items() if how == "skipped"] == ["decode", "symbolize", "aggregate"]
    assert read_manifest(run, "report")["config"]["report"]["title"] == "nightly x64"
    assert read_manifest(run, "aggregated")["created_utc"] == made["aggregated"]

    other = tmp_path / "other.etl"
    other.write_bytes(trace.read_bytes())          # (the same bytes elsewhere: another input path)
    assert cli_main(["--config", cfg, "run", job, "--trace", str(other), "--run", str(run)]) == 0
    assert "skipped" not in _stage_lines(capsys.readouterr().out).values()

    assert cli_main(["--config", cfg, "run", job, "--trace", str(other), "--run", str(run), "--force"]) == 0
    assert "skipped" not in _stage_lines(capsys.readouterr().out).values()

    # Without --trace the run goes on from its decode, even once its trace is gone (no demo trace is made); a
    # changed decode setting needs the trace again, and says which file is missing.
    other.unlink()
    assert cli_main(["--config", cfg, "run", job, "--run", str(run), "--set", "report.title=again"]) == 0
    out = capsys.readouterr().out
    assert "inputs: those of the run's decode (1 file)" in out and "synth" not in out
    assert [s for s, how in _stage_lines(out).items() if how == "skipped"] == ["decode", "symbolize", "aggregate"]
    assert cli_main(["--config", cfg, "run", job, "--run", str(run), "--set", "decode.max_error_rows=7"]) == 2
    assert str(other) in capsys.readouterr().err


def test_a_job_runs_by_name_from_any_directory(tmp_path, capsys, monkeypatch):
    """`bootprof run jobs\\single-trace.yaml` typed in another directory (the rust checkout, where capture ran) once
    failed on its config, `configs/default.yaml`, looked for in the working directory only. A job is now found by its
    name, and its config beside its directory; what is not found is one line naming where it was looked for."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert cli_main(["run", "jobs/single-trace.yaml", "--demo", "--run", str(run), "--set", "synth.size=2MB",
                     "--set", "cluster.mode=synchronous", "--set", f"warehouse.path={tmp_path / 'wh.duckdb'}",
                     "--set", f"symbolize.cache_dir={tmp_path / 'c'}"]) == 0
    assert read_manifest(run, "decoded")["config"]["synth"]["size"] == "2MB"
    assert cli_main(["run", "nightli", "--run", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "nightli: no such job file, and no job of that name (bootprof's own: backfill, nightly, single-trace)" in err
    (tmp_path / "mine.yaml").write_text("name: mine\nconfig: configs/mine.yaml\nstages: [decode]\n", encoding="utf-8")
    assert cli_main(["run", "mine.yaml", "--run", str(tmp_path / "r3")]) == 2
    err = capsys.readouterr().err
    assert f"mine.yaml: config: configs/mine.yaml is neither in the working directory {tmp_path} nor in" in err
    assert "--config" in err and not (tmp_path / "r3").exists()


def test_set_overrides_and_errors(tmp_path, capsys):
    from pipeline.config import load_config
    from pipeline.jobs import apply_sets

    config = apply_sets(load_config(None), ["synth.size=20MB", "cluster.n_workers=3", "warehouse.labels.workload=s2",
                                            "synth.inject=[crate:core:1.5]"])
    assert (config.synth.size, config.synth.size.text, config.cluster.n_workers) == (20_000_000, "20MB", 3)
    assert config.warehouse.labels == {"workload": "s2"} and config.synth.inject == ["crate:core:1.5"]
    job = str(ROOT / "jobs" / "single-trace.yaml")
    for bad, says in [("synth.sise=1", "--set 'synth.sise=1': synth.sise: Extra inputs are not permitted"),
                      ("cluster.n_workers=0", "cluster.n_workers: Input should be greater than or equal to 1"),
                      ("synth.size=huge", "not a size: 'huge'"), ("size", "expected SECTION.KEY=VALUE")]:
        assert cli_main(["run", job, "--run", str(tmp_path / "r"), "--set", bad]) == 2
        assert says in capsys.readouterr().err


def test_backfill_puts_each_trace_into_the_warehouse(tmp_path, capsys):
    """jobs/backfill.yaml on a directory of two real traces, one more trace and a damaged file: each good
    trace is its own run in the warehouse, the damaged one is reported and fails the job; run again, every
    stage of the good ones is skipped."""
    import duckdb
    import shutil

    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copyfile(fixture_path("etl/perfview-net452-x64/net.4.5.2.x64.etl"), traces / "night1.etl")
    shutil.copyfile(fixture_path("etl/perfview-small/smallEtlFile.etl"), traces / "night2.etl")
    bad = tmp_path / "damaged.etl"
    bad.write_bytes(b"\0" * 100)
    job = tmp_path / "backfill.yaml"
    job.write_text((ROOT / "jobs" / "backfill.yaml").read_text().replace("runs_dir: runs", f"runs_dir: {tmp_path / 'runs'}"))
    cfg = _sync_config(tmp_path)
    assert cli_main(["--config", cfg, "run", str(job), "--trace", str(traces), "--trace", str(bad),
                     "--set", "warehouse.labels.workload=fixtures"]) == 1
    out = capsys.readouterr().out
    assert f"[3/3] {bad} -> {tmp_path / 'runs' / 'backfill-damaged'}" in out
    assert "failed: " in out and "damaged.etl" in out and "backfill: 2 of 3 traces" in out
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    rows = con.execute("SELECT run_id, job, workload FROM runs ORDER BY run_id").fetchall()
    con.close()
    assert rows == [("backfill-night1", "backfill", "fixtures"), ("backfill-night2", "backfill", "fixtures")]
    assert cli_main(["--config", cfg, "run", str(job), "--trace", str(traces),
                     "--set", "warehouse.labels.workload=fixtures"]) == 0
    lines = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert lines == ["skipped"] * 8


def test_backfilled_runs_are_ordered_by_when_they_were_recorded(tmp_path, capsys):
    """Three nights of one build (synth re-runs 0, 1, 2: recorded a day apart) backfilled newest first: each
    night's baseline is still the night before, because runs are ordered by their recording time."""
    import duckdb

    from pipeline import synth
    from pipeline.config import SynthConfig

    traces = tmp_path / "traces"
    for rerun, name in ((0, "c"), (1, "b"), (2, "a")):
        synth.run(traces / f"{name}.etl", SynthConfig(seed=5, size="1MB", cpus=2, rerun=rerun, self_profiles=False))
    job = tmp_path / "backfill.yaml"
    job.write_text((ROOT / "jobs" / "backfill.yaml").read_text().replace("runs_dir: runs", f"runs_dir: {tmp_path / 'runs'}"))
    assert cli_main(["--config", _sync_config(tmp_path), "run", str(job), "--trace", str(traces),
                     "--set", "warehouse.labels.workload=stage2"]) == 0
    out = capsys.readouterr().out
    assert out.index("a.etl ->") < out.index("b.etl ->") < out.index("c.etl ->")
    con = duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True)
    rows = con.execute("SELECT run_id, baseline_run_id, run_time::VARCHAR FROM run_baselines ORDER BY run_time").fetchall()
    con.close()
    assert [r[:2] for r in rows] == [("backfill-c", None), ("backfill-b", "backfill-c"), ("backfill-a", "backfill-b")]
    assert [r[2][:10] for r in rows] == ["2025-12-12", "2025-12-13", "2025-12-14"]


@contextlib.contextmanager
def dask_scheduler(workers: int, hidden=None):
    """A real `dask scheduler` on loopback with ``workers`` `dask worker` processes; its address. With ``hidden`` (a
    directory), each worker runs in a mount namespace of its own where an empty filesystem lies over it, as on a
    machine that does not share it."""
    import os
    import re
    import subprocess
    import sys
    import time
    from pathlib import Path

    dask = str(Path(sys.executable).with_name("dask"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    scheduler = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"],
                                 stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    started = []
    try:
        address, deadline = None, time.monotonic() + 120
        while address is None and time.monotonic() < deadline:
            line = scheduler.stderr.readline()
            m = re.search(r"Scheduler at:\s+(tcp://127\.0\.0\.1:\d+)", line)
            address = m.group(1) if m else None
        assert address, "the dask scheduler did not say its address"
        worker = [dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--memory-limit", "2GiB"]
        if hidden is not None:
            worker = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                      f'mount -t tmpfs bootprof-hidden "{hidden}" && exec "$@"', "sh", *worker]
        for _ in range(workers):
            started.append(subprocess.Popen(worker, stderr=subprocess.DEVNULL, env=env, cwd=ROOT))
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address
    finally:
        for p in started + [scheduler]:
            p.terminate()
        for p in started + [scheduler]:
            p.wait(timeout=60)


def test_the_pipeline_on_a_dask_scheduler_and_workers_equals_a_local_run(tmp_path, capsys, s3_here):
    """Scale-out stays on dask: a real `dask scheduler` and two `dask worker` processes on loopback run the whole
    single-trace job (cluster.mode address) on a synthesized trace and its self-profiles, given as http:// URLs of a
    server on loopback (workers on other machines read their parts there), with the run kept in an S3 store (a real
    S3 API server on loopback); every table it decodes, symbolizes and aggregates, fetched from the store into a
    fresh copy, equals that of the same job run in this process on the files (rows compared in one order: the
    decoder's parts may cut them otherwise; the input's path or URL aside)."""
    with dask_scheduler(workers=2) as address:
        from pipeline import synth
        from pipeline.config import SynthConfig

        trace = tmp_path / "input" / "build.etl"
        synth.run(trace, SynthConfig(seed=9, size="6MB", cpus=3))
        job, runs = str(ROOT / "jobs" / "single-trace.yaml"), {}
        with serving(trace.parent) as (base, log):
            for mode in ("address", "synchronous"):
                cluster = {"mode": mode, "address": address} if mode == "address" else {"mode": mode}
                cfg = tmp_path / f"{mode}.yaml"
                cfg.write_text(json.dumps({"cluster": cluster, "symbolize": {"cache_dir": str(tmp_path / f"c-{mode}")},
                                           "warehouse": {"path": str(tmp_path / f"wh-{mode}.duckdb")},
                                           "runs": {"mirror_dir": str(tmp_path / "copies")}}))
                runs[mode] = f"s3://{S3_BUCKET}/scale-out/{mode}" if mode == "address" else tmp_path / mode
                # (the workers read the trace and the self-profiles from an HTTP server, as from an object store)
                inputs = (["--trace", f"{base}/build.etl", "--trace", f"{base}/selfprofile/"] if mode == "address" else
                          ["--trace", str(trace), "--trace", str(trace.parent / "selfprofile")])
                assert cli_main(["--config", str(cfg), "run", job, "--run", str(runs[mode]), *inputs,
                                 "--symbol-path", str(trace.parent / "symbols")]) == 0
            assert {p for _, p, _, n, _ in log if n} >= {"/build.etl"}
        from distributed import Client

        with Client(address, timeout=30) as client:
            assert len(client.scheduler_info()["workers"]) == 2
            # (the decode's tasks ran there: the workers imported its kernels)
            assert all(client.run(lambda: "pipeline.decode.etl.kernels" in __import__("sys").modules).values())
    capsys.readouterr()
    from pipeline.mirror import Mirror

    fresh = Mirror(runs["address"], tmp_path / "fresh")
    assert set(fresh.pull()) == {"decoded", "symbolized", "aggregated", "report"}
    runs["address"] = fresh.path
    compared = sum(assert_same_tables(runs["synchronous"] / stage, runs["address"] / stage, ignore=("path", "file"))
                   for stage in ("decoded", "symbolized", "aggregated"))
    assert compared >= 45
    assert (runs["address"] / "report" / "index.html").exists()
    assert sorted(p.name for p in (runs["address"] / "report").iterdir()) == \
        sorted(p.name for p in (runs["synchronous"] / "report").iterdir())


def test_workers_that_do_not_see_the_run_say_which_setting_to_change(tmp_path, capsys, s3_here):
    """Workers on other machines (cluster.mode address) must see the run directory, a URL run's working copy
    (runs.mirror_dir) and the symbol cache where this process does. A real `dask worker` for which an empty
    filesystem lies over them (a mount namespace of its own) meets each: the stage fails before its first task,
    naming the directory, the worker and the setting, and writes nothing."""
    from pipeline import synth
    from pipeline.config import SynthConfig

    hidden = tmp_path / "not-shared"
    hidden.mkdir()
    trace = tmp_path / "input" / "build.etl"
    synth.run(trace, SynthConfig(seed=3, size="2MB", cpus=2))
    with dask_scheduler(workers=1, hidden=hidden) as address:
        def config(name: str, **more) -> str:
            cfg = tmp_path / f"{name}.yaml"
            cfg.write_text(json.dumps({"cluster": {"mode": "address", "address": address}, **more}))
            return str(cfg)

        cases = [
            (["decode", str(trace), "--run", str(hidden / "run")], config("path"), hidden / "run",
             "the run directory"),
            (["decode", str(trace), "--run", f"s3://{S3_BUCKET}/not-shared/run"],
             config("url", runs={"mirror_dir": str(hidden / "copies")}), hidden / "copies",
             f"runs.mirror_dir (the working copy of s3://{S3_BUCKET}/not-shared/run)"),
        ]
        for args, cfg, where, what in cases:
            assert cli_main(["--config", cfg, *args]) == 2
            err = capsys.readouterr().err
            assert f"{where}" in err and "1 of the 1 workers of the dask scheduler at" in err, err
            assert f"workers on other machines need {what} on a filesystem they share" in err, err
            assert err.strip().splitlines()[-1].startswith(f"bootprof: error: {where}")
            assert not list(where.rglob("_manifest.json"))
        # The symbol cache: the run is where the worker sees it, the cache is not.
        run = tmp_path / "run"
        assert cli_main(["--config", config("sync-decode", cluster={"mode": "synchronous"}), "decode", str(trace),
                         "--run", str(run)]) == 0
        capsys.readouterr()
        cfg = config("cache", symbolize={"cache_dir": str(hidden / "symbols"), "symbol_path": str(trace.parent / "symbols")})
        assert cli_main(["--config", cfg, "symbolize", "--run", str(run)]) == 2
        err = capsys.readouterr().err
        assert "workers on other machines need symbolize.cache_dir on a filesystem they share" in err, err
        assert not (run / "symbolized").exists()


def test_workers_that_stay_between_commands_are_dasks_own(tmp_path):
    """The README's way to keep workers between commands: `dask scheduler --scheduler-file F` and `dask worker
    --scheduler-file F` started by hand, `cluster: {mode: address, scheduler_file: F}`; two commands run on them.
    A scheduler file that names no scheduler is one line saying how to start one."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    dask = str(Path(sys.executable).with_name("dask"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched_file)], stderr=subprocess.DEVNULL, env=env, cwd=ROOT)]
    try:
        deadline = time.monotonic() + 120
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        procs.append(subprocess.Popen([dask, "worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                                       "--no-dashboard", "--memory-limit", "2GiB"], stderr=subprocess.DEVNULL, env=env,
                                      cwd=ROOT))
        config = tmp_path / "c.yaml"
        config.write_text(json.dumps({"cluster": {"mode": "address", "scheduler_file": str(sched_file)},
                                      "aggregate": {"memory_limit": "1GB"}}))
        for k in (1, 2):
            run = tmp_path / f"run{k}"
            assert cli_main(["--config", str(config), "decode", str(fixture_path("selfprofile/workspace-clean")),
                             "--run", str(run)]) == 0
            assert read_manifest(run, "decoded")["self_profile"]["decoded"] >= 3
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
    config.write_text(json.dumps({"cluster": {"mode": "address", "scheduler_file": str(tmp_path / "none.json")}}))
    assert cli_main(["--config", str(config), "decode", str(fixture_path("selfprofile/hello-default")),
                     "--run", str(tmp_path / "run3")]) == 2
