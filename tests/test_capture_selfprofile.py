"""`bootprof capture --self-profile` on a real cargo build with this machine's rustc, then decode it.

The workspace source is copied to tmp_path so that cargo's target/ is never written into shared/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.selfprofile import read_events, rust_path, summarize, workspace_copy


def is_nightly() -> bool:
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PATH=rust_path())).stdout
    return "nightly" in out or "-dev" in out


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One real build: -Zthreads=2 already in RUSTFLAGS, events default + per-hit instants."""
    from pipeline import capture
    from pipeline.config import Config

    tmp = tmp_path_factory.mktemp("capture")
    ws = workspace_copy(tmp)
    # (a run directory as a user folder may name it: a space, a non-ASCII letter; cargo must get one flag)
    tmp = tmp / "John Smith é"
    mp = pytest.MonkeyPatch()
    mp.setenv("PATH", rust_path())
    mp.setenv("RUSTC_BOOTSTRAP", "1")
    mp.setenv("RUSTFLAGS", "-Zthreads=2")
    mp.delenv("CARGO_TARGET_DIR", raising=False)
    mp.delenv("CARGO_ENCODED_RUSTFLAGS", raising=False)
    mp.delenv("RUSTC", raising=False)
    try:
        summary = capture.run(tmp / "run", Config(), None, inputs=["cargo", "build", "--offline", "--quiet"],
                              events="default,query-cache-hit", cwd=ws)
    finally:
        mp.undo()
    return tmp / "run", summary


def test_capture_manifest_and_files(captured):
    from pipeline.runs import read_manifest

    run, summary = captured
    assert summary["exit_code"] == 0
    manifest = read_manifest(run, "capture")
    assert manifest["command"] == ["cargo", "build", "--offline", "--quiet"]
    assert manifest["toolchain"]["release"] and manifest["toolchain"]["host"]
    assert manifest["toolchain"]["version"].startswith("rustc ")
    assert manifest["rustflags_variable"] == "CARGO_ENCODED_RUSTFLAGS"
    assert manifest["rustflags_added"] == [f"-Zself-profile={run / 'selfprofile'}",
                                           "-Zself-profile-events=default,query-cache-hit"]
    assert " " in str(run)
    assert manifest["elapsed_s"] > 0 and manifest["exit_code"] == 0
    names = sorted(f["name"].rsplit("-", 1)[0] for f in manifest["files"])
    assert names == ["___", "app", "mathx", "util"]  # one per rustc process, cargo's probe included
    assert {Path(i["path"]).parent for i in manifest["inputs"]} == {run / "selfprofile"}


def test_capture_decodes_one_file_per_crate(captured, dask_pool):
    from pipeline import aggregate, decode
    from pipeline.config import Config
    from pipeline.runs import read_table

    run, _ = captured
    decode.run(run, Config(), dask_pool, inputs=[run / "selfprofile"])
    files = read_table(run, "decoded", "self_profiles").to_pylist()
    ok = sorted(f["crate"] for f in files if f["status"] == "ok")
    assert ok == ["app", "mathx", "util"]
    assert [f["status"] for f in files if Path(f["path"]).name.startswith("___-")] == ["skipped"]
    for f in files:
        if f["status"] == "ok":
            assert f"--crate-name {f['crate']}" in f["cmd"] and f["pid"] > 0 and f["format_version"] == 9
    # With query-cache-hit, per-hit instants and per-invocation counts are both recorded: the summary
    # must count each hit once, exactly as the reference summarize does.
    aggregate.run(run, Config(), dask_pool)
    summary = read_table(run, "aggregated", "query_summary").to_pylist()
    cols = ["self_ns", "time_ns", "invocations", "cache_misses", "cache_hits", "blocked_ns", "incr_load_ns",
            "incr_hashing_ns"]
    instants = 0
    for f in files:
        if f["status"] != "ok":
            continue
        _, events = read_events(Path(f["path"]))
        instants += sum(e["payload"] == "instant" for e in events)
        rows, _, _ = summarize(events)
        mine = {r["label"]: [r[c] for c in cols] for r in summary if r["scope"] == "file" and r["file_id"] == f["file_id"]}
        assert mine == rows
    assert instants > 1000


def test_stable_rustc_without_bootstrap_is_refused_clearly(tmp_path):
    """Without RUSTC_BOOTSTRAP a stable rustc refuses -Z: one clear line, exit 2, no build run."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUSTC_BOOTSTRAP", "RUSTC")}
    env["PATH"] = rust_path()
    marker = tmp_path / "build-ran"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "capture", "--self-profile", "--run", str(tmp_path / "run"),
                           "--", "touch", str(marker)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if is_nightly():
        assert proc.returncode == 0 and marker.exists(), proc.stderr
        return
    assert proc.returncode == 2
    assert "rustc refuses -Z self-profile" in proc.stderr and "RUSTC_BOOTSTRAP=1" in proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()


def test_flags_already_set_go_with_ours_and_x_py_gets_rustflags(tmp_path):
    """cargo ignores RUSTFLAGS once CARGO_ENCODED_RUSTFLAGS is set: the flags a user set are carried over, split as
    cargo splits them. A checkout's x.py reads RUSTFLAGS itself (split at every space), so it gets them there, and a
    directory with a space is refused before the build."""
    from pipeline.capture.rustc import is_bootstrap, profile_env
    from pipeline.errors import InputError

    spaced = tmp_path / "a b" / "selfprofile"
    env, var, added = profile_env({"RUSTFLAGS": "  -Zthreads=2   -Cdebuginfo=1 "}, spaced, "default")
    assert var == "CARGO_ENCODED_RUSTFLAGS"
    assert env["CARGO_ENCODED_RUSTFLAGS"].split("\x1f") == ["-Zthreads=2", "-Cdebuginfo=1", *added]
    env, _, added = profile_env({"CARGO_ENCODED_RUSTFLAGS": "--cfg\x1ffoo bar", "RUSTFLAGS": "-Cignored"}, spaced, "all")
    assert env["CARGO_ENCODED_RUSTFLAGS"].split("\x1f") == ["--cfg", "foo bar", *added]

    checkout = tmp_path / "rust"
    (checkout / "src" / "bootstrap").mkdir(parents=True)
    assert is_bootstrap(["python", "x.py", "build"], checkout) and is_bootstrap(["./x", "build"], checkout)
    assert not is_bootstrap(["cargo", "build"], checkout) and not is_bootstrap(["./x", "build"], tmp_path)
    # (run from elsewhere, with interpreter options, or as `x` from a directory below the checkout)
    assert is_bootstrap(["python", str(checkout / "x.py"), "build"], tmp_path)
    assert is_bootstrap(["python", "-X", "utf8", "x.py", "build"], checkout)
    (checkout / "library" / "std").mkdir(parents=True)
    assert is_bootstrap(["x", "build"], checkout / "library" / "std")
    env, var, added = profile_env({"RUSTFLAGS": "-Zthreads=2"}, tmp_path / "run" / "selfprofile", "default", True)
    assert var == "RUSTFLAGS" and env["RUSTFLAGS"] == " ".join(["-Zthreads=2", *added])
    assert "CARGO_ENCODED_RUSTFLAGS" not in env
    with pytest.raises(InputError, match="x.py splits RUSTFLAGS at spaces.*a b"):
        profile_env({}, spaced, "default", True)


def test_the_toolchain_of_cargo_plus_is_probed_under_any_name():
    from pipeline.capture.rustc import rustc_command

    assert rustc_command({}, ["cargo", "+nightly", "build"]) == ["rustc", "+nightly"]
    assert rustc_command({}, ["C:/Users/x/.cargo/bin/cargo.exe", "+nightly", "build"]) == ["rustc", "+nightly"]
    assert rustc_command({"RUSTC": "/r/rustc"}, ["cargo", "+nightly"]) == ["/r/rustc"]


BUILD_SCRIPT = """
fn main() {
    let pid_file = std::env::var("BUILD_SCRIPT_PID").unwrap();
    std::fs::write(format!("{pid_file}.tmp"), std::process::id().to_string()).unwrap();
    std::fs::rename(format!("{pid_file}.tmp"), &pid_file).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(600));
}
"""


def test_sigint_to_bootprof_ends_the_whole_build_tree(tmp_path):
    """SIGINT to bootprof's own pid (not the terminal's group, as `kill` or a CI runner sends it): cargo ends, and
    so does the build script it was running, which would otherwise be left behind under init."""
    import signal

    from pipeline.portable import pid_alive
    from pipeline.runs import read_manifest

    crate = tmp_path / "slow-build"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "slow"\nversion = "0.1.0"\nedition = "2021"\n')
    (crate / "src" / "lib.rs").write_text("pub fn f() {}\n")
    (crate / "build.rs").write_text(BUILD_SCRIPT)
    pid_file = tmp_path / "build-script.pid"
    env = {k: v for k, v in os.environ.items() if k not in ("RUSTC", "CARGO_TARGET_DIR", "CARGO_ENCODED_RUSTFLAGS")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{rust_path()}", RUSTC_BOOTSTRAP="1",
               BUILD_SCRIPT_PID=str(pid_file))
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "capture", "--self-profile", "--run", str(run), "--",
                             "cargo", "build", "--offline", "--quiet"], env=env, cwd=crate, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while not pid_file.exists():
            assert proc.poll() is None, proc.communicate()[1]
            try:
                proc.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
        script_pid = int(pid_file.read_text())
        assert pid_alive(script_pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err and "Traceback" not in err
    assert not pid_alive(script_pid), "the build script outlived the capture"
    manifest = read_manifest(run, "capture")
    assert manifest["interrupted"] == "SIGINT" and manifest["exit_code"] != 0, manifest["exit_code"]


X_PY = """import json, os, sys
with open(os.environ["X_PY_SAW"], "w", encoding="utf-8") as f:
    json.dump({k: os.environ.get(k) for k in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS")}, f)
"""


def test_an_x_py_build_gets_rustflags_and_no_probe_of_the_rustc_on_path(tmp_path):
    """x.py builds with its own compilers: the rustc on PATH (none here, or a stable one) is not probed for -Z, and
    the flags go into RUSTFLAGS, which x.py reads; a run directory whose path holds a space is one line, exit 2."""
    checkout = tmp_path / "rust"
    (checkout / "src" / "bootstrap").mkdir(parents=True)
    (checkout / "x.py").write_text(X_PY, encoding="utf-8")
    saw = tmp_path / "saw.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RUSTC", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS",
                                                              "RUSTC_BOOTSTRAP")}
    env.update(PATH=str(Path(sys.executable).parent), X_PY_SAW=str(saw))       # (no rustc on it)
    run = tmp_path / "runs" / "tonight"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "capture", "--self-profile", "--run", str(run), "--",
                           sys.executable, "x.py", "build"], env=env, cwd=checkout, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    flags = json.loads(saw.read_text(encoding="utf-8"))
    assert flags["CARGO_ENCODED_RUSTFLAGS"] is None
    assert flags["RUSTFLAGS"] == f"-Zself-profile={run / 'selfprofile'} -Zself-profile-events=default"
    spaced = tmp_path / "John Smith" / "run"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "capture", "--self-profile", "--run", str(spaced), "--",
                           sys.executable, "x.py", "build"], env=env, cwd=checkout, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "x.py splits RUSTFLAGS at spaces" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
