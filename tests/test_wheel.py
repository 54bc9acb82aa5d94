"""bootprof as `pip install` puts it on a machine that has no checkout (issue 53, row 7): the wheel built from this
tree, installed into a fresh virtual environment, used from another directory. It once shipped neither `configs/` nor
`jobs/`: `capture --wpr` found no recording profile, and jobs existed only in a checkout.

The environment takes the dependencies from this project's (a `.pth` line naming its site-packages, whose own
`.pth` files, among them this checkout's editable install, are not read), so nothing is downloaded but the build's
setuptools, and `pipeline` is the wheel's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT, fixture_path
from tests.test_capture_etw import STANDIN, TRACE, calls


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel of this tree installed (no editable link to the checkout)."""
    import shutil

    base = tmp_path_factory.mktemp("wheel")
    # (built from a copy of the tree's files: pip builds in the source tree, and would leave build/ in the checkout)
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    source = base / "source"
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w",
                            str(base / "dist")], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (base / "dist").glob("bootprof-*.whl")
    env_dir = base / "env with space é"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=300)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "bootprof-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return env_dir


def test_the_wheel_runs_a_job_by_name_from_another_directory(installed, tmp_path):
    """The job and its config are found in the installed package, by the job's name, from another directory (the
    run then stops at its missing input: the pipeline itself is tested elsewhere, and a first run in a fresh
    environment compiles every kernel)."""
    elsewhere = tmp_path / "rust checkout"
    elsewhere.mkdir()
    where = subprocess.run([str(installed / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(installed), where      # (the wheel's package, not the checkout's)
    for job in ("nightly", "single-trace", "jobs/backfill.yaml"):
        proc = subprocess.run([str(installed / "bin" / "bootprof"), "run", job, "--run", str(tmp_path / job)],
                              cwd=elsewhere, capture_output=True, text=True, timeout=600)
        if job.endswith("backfill.yaml"):
            assert proc.returncode == 2 and "is a backfill: give its traces with --trace" in proc.stderr, proc.stderr
        else:
            assert proc.returncode == 2 and "nothing to analyse" in proc.stderr, proc.stderr
        assert "config" not in proc.stderr.lower() and "Traceback" not in proc.stderr
    assert not (elsewhere / "runs").exists()


def test_the_wheel_finds_its_recording_profile(installed, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("wpr", "xperf"):
        (bin_dir / name).write_text(STANDIN.format(python=sys.executable), encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "tool.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STANDIN_LOG=str(log),
               STANDIN_TRACE=str(fixture_path(TRACE)))
    proc = subprocess.run([str(installed / "bin" / "bootprof"), "capture", "--wpr", "--run", str(tmp_path / "run"),
                           "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = next(c for c in calls(log) if c[1] == "-start")
    profile = start[2].split("!")[0]
    assert Path(profile).is_relative_to(installed) and Path(profile).is_file(), start
    assert json.loads((tmp_path / "run" / "capture" / "_manifest.json").read_text(encoding="utf-8"))["exit_code"] == 0
