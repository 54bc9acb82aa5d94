"""Real builds with this machine's rustc: a generated cargo workspace built night after night with
``-Z self-profile``, for histories with real run-to-run noise and known changes.

The workspace holds library crates of chosen sizes (a size is a number of generated functions; each costs rustc
type checking, MIR building and LLVM codegen), a build script in one of them, and a binary ``app`` that uses them
all. A *night* is ``cargo clean`` then ``cargo build`` of the whole workspace with the self-profiler on, through
``bootprof capture --self-profile``, into a run directory of its own. A night may carry changes:

``double:CRATE``  the crate's code twice over (twice the functions): its compile time about doubles;
``hot:CRATE``     one function of the crate gets a body that rustc spends far more time on (a long chain of
                  generic calls to monomorphize and optimize away), the rest stays: a change to one function.

Used by ``scripts/real_history.py`` (a history to calibrate the noise model on) and ``tests/test_nightly_real.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

#: Crates and their sizes (generated functions): about 0.2, 0.3, 0.6 and 1 s of rustc each on a 2-core VM.
CRATES = {"tiny": 3, "small": 8, "mid": 22, "big": 36}


def _function(i: int) -> str:
    return f"""
pub fn f{i}(x: &[u64], s: &str) -> (u64, String) {{
    let mut acc: u64 = {i};
    for (k, v) in x.iter().enumerate() {{
        acc = acc.wrapping_mul(31).wrapping_add(*v ^ (k as u64));
        if acc % {i % 7 + 2} == 0 {{ acc = acc.rotate_left({i % 13 + 1}); }}
    }}
    let items: Vec<Item> = x.iter().map(|v| Item {{ a: *v + {i}, b: format!("{{}}-{{}}", s, v), c: vec![*v as u32; 3] }})
        .collect();
    let t = items.iter().filter(|it| it.a % 2 == {i % 2}).map(|it| it.b.clone()).collect::<Vec<_>>().join(",");
    (acc, t)
}}"""


def _hot_function(depth: int = 480) -> str:
    """One function whose body is a chain of ``depth`` distinct generic closures: monomorphization and LLVM time."""
    steps = "".join(f"    let v = step(v, |a: u64| a.wrapping_mul({k + 3}).rotate_left({k % 31 + 1}) ^ {k});\n"
                    for k in range(depth))
    return f"""
#[inline(never)]
fn step<F: Fn(u64) -> u64>(v: Vec<u64>, f: F) -> Vec<u64> {{ v.into_iter().map(|a| f(a)).collect() }}
pub fn hot(x: &[u64]) -> u64 {{
    let v: Vec<u64> = x.to_vec();
{steps}    v.iter().sum()
}}"""


def crate_source(n: int, hot: bool = False) -> str:
    head = "#[derive(Debug, Clone, PartialEq)]\npub struct Item { pub a: u64, pub b: String, pub c: Vec<u32> }\n"
    return head + "".join(_function(i) for i in range(n)) + (_hot_function() if hot else
                                                             "\npub fn hot(x: &[u64]) -> u64 { x.iter().sum() }\n")


#: Where Debian's ``librust-*-dev`` packages put their crates' sources: a cargo directory source.
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")

#: Crates from Debian's registry a workspace can depend on, each with its version, its package and a line of ``app``
#: that uses it: two small ones (a crate's self-profile events are read by every test of a run, and a larger crate
#: such as memchr holds more of them than the rest of the workspace together).
DEBIAN_CRATES = {
    "itoa": ("1", "librust-itoa-dev", 'println!("{}", itoa::Buffer::new().format(57u64));'),
    "fnv": ("1", "librust-fnv-dev", '{ use std::hash::Hasher; let mut h = fnv::FnvHasher::default(); '
                                    'h.write(b"57"); println!("{}", h.finish()); }'),
}

#: The workspace's cargo configuration with Debian's crates: crates.io replaced by the directory source.
DEBIAN_SOURCE = (f'[source.crates-io]\nreplace-with = "debian"\n\n[source.debian]\ndirectory = "{DEBIAN_REGISTRY}"\n'
                 '\n[net]\noffline = true\n')


def missing_debian_crates(deps: tuple[str, ...] = tuple(DEBIAN_CRATES)) -> list[str]:
    """The Debian packages of ``deps`` whose crate is not in :data:`DEBIAN_REGISTRY` (``scripts/system-deps.sh``
    installs them)."""
    return [DEBIAN_CRATES[d][1] for d in deps if not any(DEBIAN_REGISTRY.glob(f"{d}-{DEBIAN_CRATES[d][0]}.*"))]


def write_workspace(root: Path, crates: dict[str, int] = CRATES, changes: tuple[str, ...] = (),
                    deps: tuple[str, ...] = ()) -> Path:
    """The workspace at ``root`` (written again where it differs), with ``changes`` (``double:C``, ``hot:C``), and
    ``app`` using the crates ``deps`` of :data:`DEBIAN_CRATES` from Debian's registry (``.cargo/config.toml`` puts
    the directory source in crates.io's place)."""
    want: dict[Path, str] = {}
    names = list(crates)
    want[root / "Cargo.toml"] = ('[workspace]\nresolver = "2"\nmembers = [' + ", ".join(f'"{c}"' for c in names)
                                 + ', "app"]\n\n[profile.dev]\nincremental = false\n')
    for c, size in crates.items():
        size *= 2 if f"double:{c}" in changes else 1
        build = c == names[-1]
        want[root / c / "Cargo.toml"] = (f'[package]\nname = "{c}"\nversion = "0.1.0"\nedition = "2021"\n'
                                         + ('build = "build.rs"\n' if build else ""))
        want[root / c / "src" / "lib.rs"] = crate_source(size, hot=f"hot:{c}" in changes)
        if build:
            want[root / c / "build.rs"] = 'fn main() { println!("cargo:rustc-env=GENERATED=1"); }\n'
    want[root / "app" / "Cargo.toml"] = ('[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                         '[dependencies]\n' + "".join(f'{c} = {{ path = "../{c}" }}\n' for c in names)
                                         + "".join(f'{d} = "{DEBIAN_CRATES[d][0]}"\n' for d in deps))
    want[root / "app" / "src" / "main.rs"] = ("fn main() {\n" + "".join(
        f'    println!("{{:?}} {{}}", {c}::f1(&[1, 2, 3], "x"), {c}::hot(&[4, 5]));\n' for c in names)
        + "".join(f"    {DEBIAN_CRATES[d][2]}\n" for d in deps) + "}\n")
    if deps:
        want[root / ".cargo" / "config.toml"] = DEBIAN_SOURCE
    elif (root / ".cargo" / "config.toml").exists():
        (root / ".cargo" / "config.toml").unlink()
    for path, text in want.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


def rust_env() -> dict[str, str]:
    """The environment a build runs in: rustup's bin directory on PATH when cargo is not, ``RUSTC_BOOTSTRAP=1``
    (``-Z self-profile`` on a stable toolchain), and none of the caller's cargo settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_TARGET_DIR", "RUSTC", "CARGO_BUILD_JOBS")}
    cargo_bin = Path.home() / ".cargo" / "bin"
    if shutil.which("cargo") is None and (cargo_bin / "cargo").exists():
        env["PATH"] = f"{cargo_bin}{os.pathsep}{env.get('PATH', '')}"
    env["RUSTC_BOOTSTRAP"] = "1"
    return env


def night(ws: Path, run_dir: Path, changes: tuple[str, ...] = (), crates: dict[str, int] = CRATES) -> Path:
    """One night: the workspace (with ``changes``) cleaned and built under ``bootprof capture --self-profile`` into
    ``run_dir``, which is then ready for ``bootprof run jobs/nightly.yaml --run RUN_DIR``."""
    import sys

    write_workspace(ws, crates, changes)
    env = rust_env()
    subprocess.run(["cargo", "clean", "--quiet"], cwd=ws, env=env, check=True)
    subprocess.run([sys.executable, "-m", "pipeline", "capture", "--self-profile", "--run", str(run_dir), "--",
                    "cargo", "build", "--offline", "--quiet"], cwd=ws, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return run_dir
