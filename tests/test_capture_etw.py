"""`bootprof capture --wpr / --xperf` around a build, on Linux.

``wpr`` and ``xperf`` here are stand-ins for the Windows tools (wpr.exe, xperf.exe), which do not run on
Linux: small scripts put first on PATH that append their arguments to a log and, where the real tool stops
a recording and merges it (``wpr -stop FILE``, ``xperf -d FILE``), write a real Windows ETL fixture to FILE.
Everything else is real: the bootprof CLI in a subprocess, the build command, signals, the decode of the
captured run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.capture import etw
from pipeline.runs import read_manifest
from tests.conftest import ROOT, fixture_path

TRACE = "etl/perfview-net452-x64/net.4.5.2.x64.etl"

STANDIN = """#!{python}
# Stand-in for the Windows tool of the same name (tests only): logs its arguments; writes a real ETL
# trace where the real tool would stop and merge a recording.
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + args) + "\\n")
if args[:1] == ["-?"]:
    print("Microsoft Windows Performance Recorder Version 10.0.26100 (stand-in)")
if args and args[0] in os.environ.get("STANDIN_FAIL", "").split(","):
    print("stand-in: failing " + args[0], file=sys.stderr)
    sys.exit(1)
if len(args) == 2 and args[0] in ("-stop", "-d"):
    shutil.copyfile(os.environ["STANDIN_TRACE"], args[1])
"""


@pytest.fixture
def tools(tmp_path):
    """A bin directory with stand-in ``wpr`` and ``xperf``, and the environment that puts it on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("wpr", "xperf"):
        path = bin_dir / name
        path.write_text(STANDIN.format(python=sys.executable))
        path.chmod(0o755)
    log = tmp_path / "tool.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STANDIN_LOG=str(log),
               STANDIN_TRACE=str(fixture_path(TRACE)))
    env.pop("STANDIN_FAIL", None)
    return env, log, bin_dir


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def capture(args, env, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "pipeline", "capture", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def checkout(tmp_path: Path, debuginfo: int | None) -> Path:
    """A directory standing for a rust checkout: a git repository with one commit and a bootstrap.toml."""
    src = tmp_path / "rust"
    src.mkdir()
    if debuginfo is not None:
        (src / "bootstrap.toml").write_text(f'profile = "compiler"\n\n[rust]\ndebuginfo-level = {debuginfo}\n')
    git = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *cmd], cwd=src, env=git, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True).stdout.strip()
    return src, commit


def run_the_capture(run: Path, tmp_path: Path) -> dict:
    """`bootprof run jobs/single-trace.yaml --run RUN` (no --trace) on a captured run; the decoded manifest."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "symbolize": {"cache_dir": str(tmp_path / "c")},
                               "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(cfg), "run",
                           str(ROOT / "jobs" / "single-trace.yaml"), "--run", str(run)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return read_manifest(run, "decoded")


def test_wpr_capture_runs_the_documented_commands_and_keeps_the_trace(tools, tmp_path):
    env, log, bin_dir = tools
    src, commit = checkout(tmp_path, debuginfo=1)
    run = tmp_path / "run"
    proc = capture(["--wpr", "--run", str(run), "--", "sh", "-c", "echo built > built.txt"], env, src)
    assert proc.returncode == 0, proc.stderr
    partial = str(run.resolve() / "input" / "trace.partial.etl")
    profiles = str(etw.PROFILES)
    assert calls(log) == [
        ["wpr", "-?"],
        ["wpr", "-start", f"{profiles}!CPU", "-start", f"{profiles}!VirtualAlloc", "-filemode"],
        ["wpr", "-stop", partial],
    ]
    assert (src / "built.txt").read_text() == "built\n"
    trace = run / "input" / "trace.etl"
    assert trace.read_bytes() == fixture_path(TRACE).read_bytes() and not Path(partial).exists()
    m = read_manifest(run, "capture")
    assert m["command"] == ["sh", "-c", "echo built > built.txt"] and m["exit_code"] == 0
    assert m["checkout"] == {"path": str(src.resolve()), "commit": commit}
    assert m["host"]["name"] and m["host"]["platform"]
    assert m["started_utc"] <= m["ended_utc"] and m["interrupted"] is None and m["warnings"] == []
    rec = m["recording"]
    assert rec["tool"] == "wpr" and rec["executable"] == str(bin_dir / "wpr")
    assert rec["version"] == "Microsoft Windows Performance Recorder Version 10.0.26100 (stand-in)"
    assert rec["path"] == str(trace.resolve()) and rec["size"] == trace.stat().st_size and rec["stopped"]
    assert [c["command"][1] for c in rec["commands"]] == ["-start", "-stop"]
    assert [i["path"] for i in m["inputs"]] == [str(trace.resolve())]
    assert f"captured {trace.resolve()} (4.9 MB)" in proc.stdout
    assert f"next: bootprof run jobs/single-trace.yaml --run {run}" in proc.stdout


def test_captured_run_is_ready_for_bootprof_run(tools, tmp_path):
    """`bootprof run JOB --run RUN_DIR` without --trace decodes what the capture recorded."""
    env, log, _ = tools
    src, _ = checkout(tmp_path, debuginfo=1)
    run = tmp_path / "run"
    assert capture(["--xperf", "--run", str(run), "--", "true"], env, src).returncode == 0
    decoded = run_the_capture(run, tmp_path)
    assert [i["path"] for i in decoded["inputs"]] == [str((run / "input" / "trace.etl").resolve())]
    assert decoded["tables"]["samples"] == 79_528


def test_xperf_capture_commands(tools, tmp_path):
    env, log, bin_dir = tools
    src, _ = checkout(tmp_path, debuginfo=2)
    run = tmp_path / "run"
    proc = capture(["--xperf", "--run", str(run), "--", "true"], env, src)
    assert proc.returncode == 0, proc.stderr
    partial = str(run.resolve() / "input" / "trace.partial.etl")
    assert calls(log) == [["xperf", "-?"], ["xperf", "-on", "Diag+VIRT_ALLOC", "-stackwalk", "Profile+VirtualAlloc"],
                          ["xperf", "-d", partial]]
    assert read_manifest(run, "capture")["recording"]["tool"] == "xperf"


def test_a_failed_build_still_stops_the_recording(tools, tmp_path):
    env, log, _ = tools
    src, _ = checkout(tmp_path, debuginfo=1)
    run = tmp_path / "run"
    proc = capture(["--wpr", "--run", str(run), "--", "sh", "-c", "exit 3"], env, src)
    assert proc.returncode == 2
    assert "build command exited with 3" in proc.stderr and "Traceback" not in proc.stderr
    assert [c[1] for c in calls(log)] == ["-?", "-start", "-stop"]
    assert (run / "input" / "trace.etl").exists()
    assert read_manifest(run, "capture")["exit_code"] == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_ends_the_build_and_stops_the_recording(tools, tmp_path, sig):
    env, log, _ = tools
    src, _ = checkout(tmp_path, debuginfo=1)
    run = tmp_path / "run"
    # (SIGINT back to its default in the child: a shell runs background jobs with it ignored, and Python then
    # never turns it into KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "capture", "--wpr", "--run", str(run), "--",
                             "sh", "-c", "echo $$ > build.pid; exec sleep 120"], env=env, cwd=src,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not (src / "build.pid").exists() or not (src / "build.pid").read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.05)
    build_pid = int((src / "build.pid").read_text())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"interrupted by {sig.name}" in err and "recording stopped" in err
    assert [c[1] for c in calls(log)] == ["-?", "-start", "-stop"]
    with pytest.raises(ProcessLookupError):
        os.kill(build_pid, 0)
    m = read_manifest(run, "capture")
    assert m["interrupted"] == sig.name and m["recording"]["stopped"]
    assert (run / "input" / "trace.etl").exists()


def test_a_failed_stop_cancels_the_session(tools, tmp_path):
    env, log, _ = tools
    src, _ = checkout(tmp_path, debuginfo=1)
    proc = capture(["--wpr", "--run", str(tmp_path / "run"), "--", "true"], dict(env, STANDIN_FAIL="-stop"), src)
    assert proc.returncode == 2
    assert "`" in proc.stderr and "-stop" in proc.stderr and "stand-in: failing -stop" in proc.stderr
    assert [c[1] for c in calls(log)] == ["-?", "-start", "-stop", "-cancel"]
    assert not (tmp_path / "run" / "input" / "trace.etl").exists()


def test_heap_snapshots_of_the_builds_rustc_processes(tools, tmp_path):
    """--heap-snapshots 1: snapshots enabled for rustc.exe before the session, the live rustc of the build
    (here `sleep` under the name rustc) snapshotted every second, the setting undone after the stop."""
    env, log, bin_dir = tools
    src, _ = checkout(tmp_path, debuginfo=1)
    fake = tmp_path / "fake" / "rustc"
    fake.parent.mkdir()
    fake.symlink_to(os.path.realpath(sys.executable))     # (a Python named rustc: it forks no child of that name)
    run = tmp_path / "run"
    # (the stand-in rustc lives until three snapshots of it were taken, not for a time: once it slept 3.5 s and the
    # count had to fall in 2-4, which load could move)
    until = ("import pathlib, time\n"
             f"log = pathlib.Path({str(log)!r})\n"
             "while (log.read_text() if log.exists() else '').count('singlesnapshot') < 3:\n"
             "    time.sleep(0.05)\n")
    (tmp_path / "until.py").write_text(until)
    proc = capture(["--wpr", "--heap-snapshots", "1", "--run", str(run), "--", "sh", "-c",
                    f"{fake} {tmp_path / 'until.py'} & echo $! > rustc.pid; wait"], env, src)
    assert proc.returncode == 0, proc.stderr
    rustc_pid = (src / "rustc.pid").read_text().strip()
    profiles, partial = str(etw.PROFILES), str(run.resolve() / "input" / "trace.partial.etl")
    got = calls(log)
    assert got[:3] == [["wpr", "-?"], ["wpr", "-snapshotconfig", "heap", "-name", "rustc.exe", "enable"],
                       ["wpr", "-start", f"{profiles}!CPU", "-start", f"{profiles}!VirtualAlloc",
                        "-start", f"{profiles}!HeapSnapshot", "-filemode"]]
    snaps = got[3:-2]
    assert len(snaps) >= 3 and all(c == ["wpr", "-singlesnapshot", "heap", rustc_pid] for c in snaps)
    assert got[-2:] == [["wpr", "-stop", partial], ["wpr", "-snapshotconfig", "heap", "-name", "rustc.exe", "disable"]]
    taken = read_manifest(run, "capture")["recording"]["heap_snapshots"]
    assert [t["pids"] for t in taken] == [[int(rustc_pid)]] * len(snaps) and all(t["ok"] for t in taken)


def test_snapshot_calls_take_at_most_eight_pids():
    rec = etw.Recording("wpr", "wpr", heap_period_s=1)
    assert rec.snapshot(list(range(1, 11))) == [["wpr", "-singlesnapshot", "heap", *map(str, range(1, 9))],
                                                ["wpr", "-singlesnapshot", "heap", "9", "10"]]


def test_without_the_tool_capture_refuses_and_runs_nothing(tmp_path):
    env = dict(os.environ, PATH="/usr/bin:/bin")
    for tool in ("wpr", "xperf"):
        proc = capture([f"--{tool}", "--run", str(tmp_path / "run"), "--", "touch", "built"], env, tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"`{tool}` is not on PATH" in proc.stderr and "--self-profile" in proc.stderr
        assert not (tmp_path / "built").exists() and not (tmp_path / "run" / "capture").exists()


def test_checks_before_the_build(tools, tmp_path):
    env, log, _ = tools
    src, _ = checkout(tmp_path, debuginfo=0)
    proc = capture(["--wpr", "--run", str(tmp_path / "run"), "--", "true"], env, src)
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {src.resolve() / 'bootstrap.toml'}: [rust] debuginfo-level is 0" in proc.stdout
    bad = capture(["--wpr", "--profile", str(tmp_path / "none.wprp") + "!CPU", "--", "touch", "x"], env, src)
    assert bad.returncode == 2 and "none.wprp: cannot read the WPR profile" in bad.stderr
    bare = capture(["--wpr", "--profile", str(etw.PROFILES), "--", "touch", "x"], env, src)
    assert bare.returncode == 2 and "FILE.wprp!NAME" in bare.stderr
    wrong = capture(["--wpr", "--profile", f"{etw.PROFILES}!Nope", "--", "touch", "x"], env, src)
    assert wrong.returncode == 2 and "no profile named 'Nope' (it has: CPU, HeapSnapshot, VirtualAlloc)" in wrong.stderr
    heap = capture(["--xperf", "--heap-snapshots", "5", "--", "touch", "x"], env, src)
    assert heap.returncode == 2 and "go with --wpr" in heap.stderr
    assert not (src / "x").exists()


def test_our_wpr_profiles(tmp_path):
    """configs/profiles/bootprof.wprp: a File and a Memory variant of each profile; CPU samples and
    VirtualAlloc with stacks, process/thread/image events, the heap-snapshot provider."""
    root = ET.parse(etw.PROFILES).getroot()
    profiles = {p.get("Id"): p for p in root.iter("Profile")}
    assert set(profiles) == {f"{n}.Verbose.{m}" for n in ("CPU", "VirtualAlloc", "HeapSnapshot")
                             for m in ("File", "Memory")}
    providers = {p.get("Id"): p for p in root.iter("SystemProvider")}

    def stacks(pid):
        own = {s.get("Value") for s in providers[pid].iter("Stack")}
        base = providers[pid].get("Base")
        return own | (stacks(base) if base else set())

    def keywords(pid):
        own = {k.get("Value") for k in providers[pid].iter("Keyword")}
        base = providers[pid].get("Base")
        return own | (keywords(base) if base else set())

    assert {"SampledProfile", "ProcessThread", "Loader"} <= keywords("SP_CPU") and "SampledProfile" in stacks("SP_CPU")
    assert "VirtualAllocation" in keywords("SP_VirtualAlloc") and "VirtualAllocation" in stacks("SP_VirtualAlloc")
    assert [e.get("Name") for e in root.iter("EventProvider")] == ["901d2afa-4ff6-46d7-8d0e-53645e1a47f5"]


def test_self_profile_and_wpr_together_give_one_run_with_both(tools, tmp_path):
    """One real cargo build with --self-profile --wpr: the self-profiles and the trace land in one run, and
    `bootprof run` decodes both."""
    from tests.helpers.selfprofile import rust_path, workspace_copy

    env, log, _ = tools
    ws = workspace_copy(tmp_path)
    env = dict(env, PATH=f"{env['PATH'].split(os.pathsep)[0]}{os.pathsep}{rust_path()}", RUSTC_BOOTSTRAP="1")
    for var in ("CARGO_TARGET_DIR", "CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS"):
        env.pop(var, None)
    run = tmp_path / "run"
    proc = capture(["--self-profile", "--wpr", "--run", str(run), "--", "cargo", "build", "--offline", "--quiet"],
                   env, ws, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "captured 4 self-profiles" in proc.stdout
    m = read_manifest(run, "capture")
    assert m["toolchain"]["version"].startswith("rustc ") and m["recording"]["tool"] == "wpr"
    assert sorted(Path(i["path"]).suffix for i in m["inputs"]) == [".etl"] + [".mm_profdata"] * 4
    decoded = run_the_capture(run, tmp_path)
    assert decoded["tables"]["samples"] == 79_528 and decoded["self_profile"]["decoded"] == 3
