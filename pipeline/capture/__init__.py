"""Capture stage: run a build with rustc's self-profiler on and keep its ``.mm_profdata`` files.

Entry point: :func:`run`. ``-Zself-profile=RUN_DIR/selfprofile`` (and ``-Zself-profile-events=...``)
is appended to ``RUSTFLAGS`` (or ``CARGO_ENCODED_RUSTFLAGS`` when that is set, since cargo then
ignores ``RUSTFLAGS``), the command runs with the terminal's stdin/stdout/stderr, and
``RUN_DIR/capture/_manifest.json`` records the command, working directory, toolchain (``rustc -vV``),
start/end times, exit code and the files rustc wrote. Before the build, one tiny rustc run checks that
the toolchain accepts ``-Z`` (nightly, or stable with ``RUSTC_BOOTSTRAP=1``) and says so clearly
when it does not.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.errors import BootprofError, InputError
from pipeline.runs import fingerprint, stage_output

STAGE = "capture"
PROFILE_DIR = "selfprofile"
DEFAULT_EVENTS = "default"


def rustc_command(env: dict[str, str], build: list[str] | None = None) -> list[str]:
    """The rustc the build will run: ``$RUSTC``, else ``rustc`` with the build's ``+toolchain``."""
    if env.get("RUSTC"):
        return [env["RUSTC"]]
    if build and len(build) > 1 and Path(build[0]).name in ("cargo", "rustc") and build[1].startswith("+"):
        return ["rustc", build[1]]
    return ["rustc"]


def toolchain(rustc: list[str], env: dict[str, str]) -> dict[str, str]:
    """``rustc -vV`` as a dict (release, commit-hash, host, LLVM version, ...) plus the raw text."""
    try:
        proc = subprocess.run([*rustc, "-vV"], env=env, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise InputError(f"cannot run {' '.join(rustc)} -vV: {exc.strerror or exc} (is a Rust toolchain on PATH?)") from exc
    if proc.returncode != 0:
        raise InputError(f"{' '.join(rustc)} -vV failed ({proc.returncode}): {proc.stderr.strip()}")
    info = {"text": proc.stdout.strip()}
    for line in proc.stdout.splitlines()[1:]:
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    info["version"] = proc.stdout.splitlines()[0] if proc.stdout else ""
    return info


def check_self_profile(rustc: list[str], env: dict[str, str], events: str) -> list[str]:
    """Run rustc once with the -Z flags; BootprofError if it refuses them, else its warnings."""
    with tempfile.TemporaryDirectory(prefix="bootprof-probe-") as tmp:
        cmd = [*rustc, f"-Zself-profile={tmp}", f"-Zself-profile-events={events}", "--print", "sysroot"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp)
    if proc.returncode != 0:
        if "only accepted on the nightly compiler" in proc.stderr:
            raise BootprofError(
                "rustc refuses -Z self-profile: this is a stable or beta toolchain. Use a nightly toolchain "
                "(e.g. `cargo +nightly ...`) or set RUSTC_BOOTSTRAP=1 to allow -Z options on stable.")
        raise BootprofError(f"rustc refuses the self-profile options ({' '.join(cmd[-5:-3])}): "
                            f"{proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else proc.returncode}")
    return [line for line in proc.stderr.splitlines() if "WARN" in line or "warning" in line]


def profile_env(env: dict[str, str], profile_dir: Path, events: str) -> dict[str, str]:
    """The build's environment with the self-profile flags added to the rustc flags cargo passes on."""
    flags = [f"-Zself-profile={profile_dir}", f"-Zself-profile-events={events}"]
    env = dict(env)
    if "CARGO_ENCODED_RUSTFLAGS" in env:
        encoded = env["CARGO_ENCODED_RUSTFLAGS"]
        env["CARGO_ENCODED_RUSTFLAGS"] = "\x1f".join(([encoded] if encoded else []) + flags)
    else:
        env["RUSTFLAGS"] = " ".join(([env["RUSTFLAGS"]] if env.get("RUSTFLAGS") else []) + flags)
    return env


def run(run_dir: Path, config, pool=None, inputs: list[str] | None = None, events: str | None = None,
        cwd: Path | None = None) -> dict[str, Any]:
    """Run the build command ``inputs`` (argv) with self-profiling into ``RUN_DIR/selfprofile/``."""
    if not inputs:
        raise InputError("capture: no build command given (bootprof capture --self-profile -- cargo build)")
    run_dir = Path(run_dir).resolve()
    events = events or DEFAULT_EVENTS
    base_env = dict(os.environ)
    rustc = rustc_command(base_env, list(inputs))
    tool = toolchain(rustc, base_env)
    warnings = check_self_profile(rustc, base_env, events)
    profile_dir = run_dir / PROFILE_DIR
    profile_dir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in profile_dir.glob("*.mm_profdata")}
    env = profile_env(base_env, profile_dir, events)
    started, t0 = time.time(), time.perf_counter()
    try:
        proc = subprocess.run(list(inputs), env=env, cwd=cwd)
    except OSError as exc:
        raise InputError(f"cannot run {inputs[0]}: {exc.strerror or exc}") from exc
    elapsed = time.perf_counter() - t0
    files = sorted(p for p in profile_dir.glob("*.mm_profdata") if p.name not in before)
    with stage_output(run_dir, STAGE, inputs=[fingerprint(p) for p in files], config=config.resolved()) as out:
        out.manifest.update({
            "command": list(inputs),
            "cwd": str(Path(cwd or os.getcwd()).resolve()),
            "rustflags_added": env.get("CARGO_ENCODED_RUSTFLAGS", env.get("RUSTFLAGS")),
            "events": events,
            "toolchain": tool,
            "rustc_bootstrap": base_env.get("RUSTC_BOOTSTRAP"),
            "probe_warnings": warnings,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "elapsed_s": round(elapsed, 3),
            "exit_code": proc.returncode,
            "profile_dir": str(profile_dir),
            "files": [{"name": p.name, "size": p.stat().st_size} for p in files],
        })
    summary = {"exit_code": proc.returncode, "files": len(files), "profile_dir": str(profile_dir),
               "elapsed_s": round(elapsed, 3), "warnings": warnings}
    if proc.returncode != 0:
        raise BootprofError(f"build command exited with {proc.returncode} ({len(files)} self-profiles written "
                            f"to {profile_dir}; capture manifest in {run_dir / STAGE})")
    return summary
