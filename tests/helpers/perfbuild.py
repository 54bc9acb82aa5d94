"""Real cargo builds recorded with ``bootprof capture --perf``, and what ``perf script`` and ``perf report`` say of
them: the shared inputs of the perf tests, each made once per test run (:func:`recorded`, :func:`analyzed`).

The workspace (``tests/realbuild.py``) has two generated crates with a build script, a binary, and real crates from
Debian's packaged crate sources (:data:`DEPS`, from ``/usr/share/cargo/registry``, ``scripts/system-deps.sh``); it is
built as ``cargo build`` (debug) and ``cargo build --release``, with frame-pointer call chains or ``--perf-call-graph
dwarf``."""

from __future__ import annotations

import functools
import re
import shutil
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.realbuild import DEBIAN_CRATES, missing_debian_crates, rust_env, write_workspace

#: Two small crates, a build script and a binary: about 2 s of cargo and rustc on this 2-core VM.
CRATES = {"tiny": 3, "small": 8}

#: Crates of Debian's registry the shared recordings' workspace depends on.
DEPS = tuple(DEBIAN_CRATES)

#: The cargo profiles the shared recordings are built with: ``cargo build`` and ``cargo build --release``.
PROFILES = ("debug", "release")

#: The call chains of the shared recordings: frame pointers (perf's default), or user stacks to unwind with DWARF
#: CFI (``--perf-call-graph dwarf``, at half the rate: each sample carries an 8 KB stack copy).
CALL_GRAPHS = ("fp", "dwarf")

#: The recording of each profile that the checks against perf's own tools and the self-profiles read (samples per
#: thread, top functions, crates and queries): the debug build with frame pointers, the release build with DWARF
#: call graphs and self-profiles, so that three recordings (debug fp, debug DWARF, release DWARF) cover both
#: profiles with and without DWARF.
CALL_GRAPH_OF = {"debug": "fp", "release": "dwarf"}


@functools.cache
def cannot_record(deps: tuple[str, ...] = ()) -> str | None:
    """Why perf cannot record here, or the Debian crates ``deps`` are missing (None when it can); asked once a
    process (perf's probe recording takes a second)."""
    from pipeline.capture.perf import check, executable
    from pipeline.errors import BootprofError

    try:
        check(executable())
    except BootprofError as exc:
        return f"perf cannot record on this machine: {exc}"
    missing = missing_debian_crates(deps)
    if missing:
        return (f"Debian's crate sources for {', '.join(deps)} are not installed: apt-get install "
                f"{' '.join(missing)} (scripts/system-deps.sh)")
    return None


def require_recording(deps: tuple[str, ...] = ()) -> None:
    """Skip the test (with perf's own words, or the Debian packages to install) where perf cannot record, or the
    crates ``deps`` are not in Debian's registry."""
    import pytest

    why = cannot_record(deps)
    if why:
        pytest.skip(why)


def record(root: Path, rate: int = 999, crates: dict[str, int] = CRATES, extra: tuple[str, ...] = (),
           self_profile: bool = True, release: bool = False, deps: tuple[str, ...] = ()) -> Path:
    """The workspace (with the Debian crates ``deps``) built from clean under ``bootprof capture --perf
    --self-profile`` (``self_profile``; and ``extra`` options; ``cargo build --release`` where ``release``) into
    ``root/run`` (perf's samples and every rustc's self-profile of one build); the run directory."""
    ws = write_workspace(root / "ws", crates, deps=deps)
    env = rust_env()        # (RUSTC_BOOTSTRAP=1: -Z self-profile on the stable toolchain)
    env.pop("CARGO_HOME", None)
    subprocess.run(["cargo", "clean", "--quiet"], cwd=ws, env=env, check=True)
    run = root / "run"
    config = root / "capture.yaml"      # (a --symbols capture decodes the samples: its unwind rows made here)
    config.write_text(f"decode:\n  cache_dir: '{root / 'decodecache'}'\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "capture", "--perf", "--perf-rate", str(rate),
                    *(["--self-profile"] if self_profile else []), *extra, "--run", str(run), "--", "cargo", "build",
                    "--offline", "--quiet", *(["--release"] if release else [])], cwd=ws, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return run


def recorded(tmp_path_factory, profile: str = "debug", call_graph: str = "fp") -> Path:
    """The test run's one recorded build (:func:`record`) of the workspace with Debian's crates for the cargo
    ``profile`` and ``call_graph`` (:data:`PROFILES`, :data:`CALL_GRAPHS`), shared by every perf test module and
    pytest-xdist worker (skips as :func:`require_recording` says). The debug DWARF build carries copies of its
    images (``--symbols``): the tests of a run that travels with its ELF files read it too. Read it, never write
    into it."""
    from tests.conftest import made_once

    require_recording(DEPS)
    dwarf = call_graph == "dwarf"

    def make(root: Path):
        extra = ("--perf-call-graph", "dwarf", *(("--symbols",) if profile == "debug" else ())) if dwarf else ()
        record(root, rate=499 if dwarf else 999, extra=extra, self_profile=CALL_GRAPH_OF[profile] == call_graph,
               release=profile == "release", deps=DEPS)

    return made_once(tmp_path_factory, f"perf-{profile}-{call_graph}", make) / "run"


def analyze(run: Path, tmp: Path, *trace: Path, db: Path | None = None) -> Path:
    """``bootprof run jobs/single-trace.yaml`` on ``run`` (its capture, or ``--trace`` files or a pack), every stage
    up to the warehouse (``db``, else one in ``tmp``); the run directory."""
    from tests.conftest import ROOT

    extra = [a for t in trace for a in ("--trace", str(t))]
    proc = subprocess.run([sys.executable, "-m", "pipeline", "run", str(ROOT / "jobs" / "single-trace.yaml"), "--run",
                           str(run), *extra, "--set", f"symbolize.cache_dir={tmp / 'symcache'}", "--set",
                           f"decode.cache_dir={tmp / 'decodecache'}", "--set",
                           f"warehouse.path={db or tmp / 'wh.duckdb'}"], cwd=tmp, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return run


def analyzed(tmp_path_factory, profile: str = "debug", call_graph: str = "fp") -> Path:
    """A copy of :func:`recorded`'s run through every stage (:func:`analyze`), once a test run. Read it, never
    write into it."""
    from tests.conftest import made_once

    source = recorded(tmp_path_factory, profile, call_graph)

    def make(root: Path):
        shutil.copytree(source, root / "run")
        analyze(root / "run", root)

    return made_once(tmp_path_factory, f"perf-{profile}-{call_graph}-analyzed", make) / "run"


def perf_script_counts(data: Path) -> tuple[Counter, Counter]:
    """Samples per pid and per (pid, tid), as ``perf script`` lists them."""
    out = subprocess.run(["perf", "script", "-F", "pid,tid", "-i", str(data)], capture_output=True, text=True,
                         errors="replace", check=True).stdout
    per_tid: Counter = Counter()
    for line in out.split():
        pid, tid = line.split("/")
        per_tid[(int(pid), int(tid))] += 1
    per_pid: Counter = Counter()
    for (pid, _), n in per_tid.items():
        per_pid[pid] += n
    return per_pid, per_tid


_REPORT_ROW = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*?)\s*$")


def perf_report_self(data: Path) -> tuple[Counter, dict[str, set[str]], int]:
    """Self samples per user-space function name (rows of one name in several images summed), the images (perf's
    short names) each name was found in, and the samples of kernel functions together, from ``perf report
    --no-children --sort dso,sym``."""
    out = subprocess.run(["perf", "report", "-n", "--stdio", "--no-children", "--sort", "dso,sym", "-g", "none",
                          "-i", str(data)], capture_output=True, text=True, errors="replace", check=True).stdout
    user: Counter = Counter()
    dsos: dict[str, set[str]] = {}
    kernel = 0
    for line in out.splitlines():
        m = _REPORT_ROW.match(line)
        if not m:
            continue
        n, dso, mode, name = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if mode == "k":
            kernel += n
        else:
            user[name] += n
            dsos.setdefault(name, set()).add(dso)
    return user, dsos, kernel


def aliases(path: str, name: str) -> set[str]:
    """The names the symbol tables of the ELF file ``path`` (and of its detached debug file) give the address of
    ``name``: perf and a debugger may choose different ones (``free`` and ``__libc_free``; perf may add the symbol's
    version, ``pthread_mutex_trylock@@GLIBC_2.34``; code folded into one copy has dozens of C++ names, as libLLVM's
    one-instruction functions do). Mangled and demangled, without parameters."""
    from pipeline.symbolize.elf import debug_file

    name = name.split("@")[0]
    files = [path]
    try:
        from symbolic import Archive

        bid = next(iter(Archive.open(path).iter_objects())).code_id
        extra = debug_file(bid)
        if extra is not None:
            files.append(str(extra))
    except Exception:  # noqa: BLE001 - no debug file: the file's own tables
        pass
    at: dict[int, set[str]] = {}
    for f in files:
        for demangle in ([], ["-C"]):     # (C++ names as perf shows them: demangled, without their parameters)
            out = subprocess.run(["readelf", "-sW", *demangle, f], capture_output=True, text=True,
                                 errors="replace").stdout
            for line in out.splitlines():
                parts = line.split(None, 7)
                if len(parts) == 8 and parts[0].endswith(":") and parts[3] in ("FUNC", "IFUNC"):
                    symbol = parts[7].split("@")[0]
                    at.setdefault(int(parts[1], 16), set()).update({symbol, symbol.split("(")[0]})
    return set().union(*[names for names in at.values() if name in names])


def record_offsets(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, size) of each record of an intact perf.data file's data section."""
    off, size = struct.unpack_from("<QQ", data, 40)
    out, end = [], off + size
    while off + 8 <= end:
        rtype, _misc, rsize = struct.unpack_from("<IHH", data, off)
        out.append((off, rtype, rsize))
        off += rsize
    return out


def callchain_at(data: bytes) -> int:
    """Where a sample's callchain length lies, from the record's start, as the first attr's ``sample_type`` says
    (the 8-byte fields before it: IDENTIFIER, IP, TID, TIME, ADDR, ID, STREAM_ID, CPU, PERIOD)."""
    attrs = struct.unpack_from("<Q", data, 24)[0]     # (the attrs section: after magic, size, attr_size)
    sample_type = struct.unpack_from("<Q", data, attrs + 24)[0]
    assert sample_type & (1 << 5) and not sample_type & (1 << 4), hex(sample_type)  # (CALLCHAIN, and no READ)
    before = sample_type & ((1 << 16) | 1 | 2 | 4 | 8 | (1 << 6) | (1 << 9) | (1 << 7) | (1 << 8))
    return 8 + 8 * bin(before).count("1")


def have_tools() -> bool:
    return shutil.which("perf") is not None and shutil.which("cargo", path=rust_env().get("PATH")) is not None
