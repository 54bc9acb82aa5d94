"""Hold a command at one of its named moments (``pipeline/checkpoints.py``): start it with :func:`env`, wait for
:func:`reached`, do what the test needs done at that moment, then :func:`release` it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def env(where: Path, *names: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command that stops at the checkpoints ``names``, reporting in ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    return dict(base if base is not None else os.environ, BOOTPROF_PAUSE_AT=",".join(names),
                BOOTPROF_PAUSE_DIR=str(where))


def reached(where: Path, name: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Wait until ``proc`` is held at ``name`` (fails at once if it ended first)."""
    end = time.monotonic() + timeout
    while not (where / f"{name}.reached").exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {name}: {err[-3000:]}")
        assert time.monotonic() < end, f"the command never reached {name}"
        time.sleep(0.005)


def release(where: Path, name: str) -> None:
    (where / f"{name}.go").write_text("go", encoding="utf-8")


def run_held(args: list[str], where: Path, name: str, at, cwd: Path, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Run ``args`` held at checkpoint ``name``; there, call ``at(proc)``; let it go on; its result. ``at`` may
    release it itself (a signal held until a moment is over)."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(where, name))
    try:
        reached(where, name, proc)
        at(proc)
        release(where, name)
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)
