"""What a capture asks of the toolchain and the checkout: the rustc a build runs, whether it takes ``-Z
self-profile``, the environment that turns the profiler on, and what the checkout says (debuginfo, commit)."""

from __future__ import annotations

import subprocess
import tempfile
import tomllib
from pathlib import Path

from pipeline.errors import BootprofError, InputError


DEFAULT_EVENTS = "default"


def rustc_command(env: dict[str, str], build: list[str] | None = None) -> list[str]:
    """The rustc the build will run: ``$RUSTC``, else ``rustc`` with the build's ``+toolchain``."""
    if env.get("RUSTC"):
        return [env["RUSTC"]]
    # (``cargo.exe`` on Windows, as a shell or a script may name it)
    if build and len(build) > 1 and Path(build[0]).stem.lower() in ("cargo", "rustc") and build[1].startswith("+"):
        return ["rustc", build[1]]
    return ["rustc"]


def toolchain(rustc: list[str], env: dict[str, str]) -> dict[str, str]:
    """``rustc -vV`` as a dict (release, commit-hash, host, LLVM version, ...) plus the raw text."""
    try:
        proc = subprocess.run([*rustc, "-vV"], env=env, capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=60)
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
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, encoding="utf-8", errors="replace",
                              timeout=120, cwd=tmp)
    if proc.returncode != 0:
        if "only accepted on the nightly compiler" in proc.stderr:
            raise BootprofError(
                "rustc refuses -Z self-profile: this is a stable or beta toolchain. Use a nightly toolchain "
                "(e.g. `cargo +nightly ...`) or set RUSTC_BOOTSTRAP=1 to allow -Z options on stable.")
        raise BootprofError(f"rustc refuses the self-profile options ({' '.join(cmd[-5:-3])}): "
                            f"{proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else proc.returncode}")
    return [line for line in proc.stderr.splitlines() if "WARN" in line or "warning" in line]


#: The names a rust checkout's bootstrap is started by (``x.py build``, ``./x build``, ``x.ps1 build``).
BOOTSTRAP_NAMES = {"x.py", "x", "x.ps1", "x.exe", "x.sh"}


def is_bootstrap(build: list[str], cwd: Path) -> bool:
    """Whether the build is a rust checkout's ``x.py`` (bootstrap), which reads ``RUSTFLAGS`` itself: an argument
    among the first few named as its entry points, in a rust checkout or below one (``python C:\\src\\rust\\x.py``
    from elsewhere, ``python -X utf8 x.py``, ``x`` from a subdirectory of the checkout)."""
    for arg in build[:5]:
        if Path(arg).name.lower() not in BOOTSTRAP_NAMES:
            continue
        where = (cwd / arg).parent.resolve()
        if any((d / "src" / "bootstrap").is_dir() for d in (where, *where.parents)):
            return True
    return False


def cargo_rustflags(env: dict[str, str]) -> list[str]:
    """The rustc flags cargo takes from the environment: ``CARGO_ENCODED_RUSTFLAGS`` (split at 0x1f) when it is
    set, else ``RUSTFLAGS`` split at spaces, as cargo splits them."""
    if "CARGO_ENCODED_RUSTFLAGS" in env:
        encoded = env["CARGO_ENCODED_RUSTFLAGS"]
        return encoded.split("\x1f") if encoded else []
    return [part for part in (p.strip() for p in env.get("RUSTFLAGS", "").split(" ")) if part]


def profile_env(env: dict[str, str], profile_dir: Path, events: str,
                bootstrap: bool = False) -> tuple[dict[str, str], str, list[str]]:
    """The build's environment with the self-profile flags added to the rustc flags it passes on; also the
    variable that carries them and the flags added.

    cargo gets them in ``CARGO_ENCODED_RUSTFLAGS`` (flags separated by 0x1f), so a directory whose path holds a
    space (``C:\\Users\\John Smith``, OneDrive) stays one flag; the flags already in ``RUSTFLAGS`` go with them, since
    cargo then ignores ``RUSTFLAGS``. A checkout's ``x.py`` reads ``RUSTFLAGS`` itself, split at every space, and
    passes its own to cargo there, so for it they go into ``RUSTFLAGS``, and a path with a space is refused
    before anything runs."""
    flags = [f"-Zself-profile={profile_dir}", f"-Zself-profile-events={events}"]
    env = dict(env)
    if bootstrap:
        if any(c.isspace() for c in str(profile_dir)):
            raise InputError(f"capture: x.py splits RUSTFLAGS at spaces, and the self-profile directory "
                             f"{profile_dir} holds one: give --run a path without spaces")
        env["RUSTFLAGS"] = " ".join(([env["RUSTFLAGS"]] if env.get("RUSTFLAGS", "").strip() else []) + flags)
        return env, "RUSTFLAGS", flags
    env["CARGO_ENCODED_RUSTFLAGS"] = "\x1f".join(cargo_rustflags(env) + flags)
    return env, "CARGO_ENCODED_RUSTFLAGS", flags


def debuginfo_warning(checkout: Path) -> str | None:
    """A warning when the checkout's ``bootstrap.toml`` (or older ``config.toml``) does not give the
    compiler line tables: without ``[rust] debuginfo-level = 1`` (or more) its frames have no names."""
    for name in ("bootstrap.toml", "config.toml"):
        path = checkout / name
        if not path.exists():
            continue
        try:
            rust = tomllib.loads(path.read_text()).get("rust", {})
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            return f"{path}: cannot read it ({exc}); set [rust] debuginfo-level = 1 so rustc's frames get names"
        level = rust.get("debuginfo-level-rustc", rust.get("debuginfo-level", 0)) if isinstance(rust, dict) else 0
        if not isinstance(level, int) or isinstance(level, bool):
            level = {"line-tables-only": 1, "limited": 1, "full": 2}.get(str(level), 0)
        if level >= 1:
            return None
        return (f"{path}: [rust] debuginfo-level is {level}: the compiler's PDBs will have no function names; "
                "set debuginfo-level = 1 and rebuild stage 1")
    return (f"{checkout}: no bootstrap.toml or config.toml: if this is a rust checkout, set [rust] "
            "debuginfo-level = 1 so the compiler's frames get names")


def checkout_commit(checkout: Path) -> str | None:
    """``git rev-parse HEAD`` of the directory the build runs in, None when it is not a git checkout."""
    try:
        proc = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                              text=True, encoding="utf-8", errors="replace", timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
