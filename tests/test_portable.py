"""bootprof on Windows, macOS and Linux, checked from Linux (no Windows machine runs here; these are the honest
substitutes, and what they cannot see is said in pipeline/portable.py's and the README's words):

- pyright's model of Windows and of macOS over ``pipeline/``: no call of an API that the system lacks (``os.fork``,
  ``signal.SIGHUP``, ``mmap.MAP_SHARED`` on Windows; ``os.pidfd_open`` on macOS), except where the code asks
  which system it runs on first, as ``pipeline/portable.py`` does;
- the runtime dependencies resolve to wheels for Windows and macOS, CPython 3.11-3.13 (but ``symbolic``, which has
  none for Windows: without it, symbolize says how to get it and the run goes on);
- what portable.py does differently where an API is missing, run here on its other path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import portable
from tests.conftest import ROOT

PYRIGHT = ROOT / ".venv" / "pyright" / "node_modules" / ".bin" / "pyright"
#: pyright's name of each system it checks for. Not Linux: the whole suite runs there, and an API that only Windows
#: or only macOS has (``os.startfile``, ``fcntl.F_FULLFSYNC``) is one the other system's model flags, unguarded.
SYSTEMS = ("Windows", "Darwin")
#: ``"X" is not a known attribute of module "M"`` (or an unknown import symbol of M) with M in the standard library.
MISSING_API = re.compile(r'"(\w+)" is (?:not a known attribute of module|unknown import symbol) "?([\w.]*)"?')


def platform_errors(system: str, *more: Path) -> list[str]:
    """pyright's errors for ``system`` over ``pipeline/`` (and ``more`` files) that name an API of the standard
    library the system lacks, as ``file:line: message``."""
    if not PYRIGHT.exists():
        pytest.fail(f"pyright is not installed at {PYRIGHT} (make test installs it from npm)")
    proc = subprocess.run([str(PYRIGHT), "--outputjson", "--pythonplatform", system, "--pythonpath", sys.executable,
                           "pipeline", *map(str, more)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)
    found = []
    for d in report["generalDiagnostics"]:
        m = MISSING_API.search(d["message"])
        module = (m.group(2) if m else "").split(".")[0]
        if d["severity"] == "error" and m and module in sys.stdlib_module_names:
            name = Path(d["file"]).relative_to(ROOT) if Path(d["file"]).is_relative_to(ROOT) else Path(d["file"]).name
            found.append(f"{name}:{d['range']['start']['line'] + 1}: {d['message']}")
    return found


@pytest.mark.slow
def test_no_platform_api_is_used_where_the_system_lacks_it(tmp_path):
    """No error in ``pipeline/``, for Windows and macOS (pyright runs for both at once). The check can fail: a module
    beside it that forks, as the command server did, and names SIGHUP is an error for Windows (the probe is checked
    with the package, in one run of pyright)."""
    import concurrent.futures

    probe = tmp_path / "portable_probe.py"
    probe.write_text("import os\nimport signal\n\n\ndef start():\n    os.fork()\n    return signal.SIGHUP\n")
    with concurrent.futures.ThreadPoolExecutor(len(SYSTEMS)) as pool:
        found = dict(zip(SYSTEMS, pool.map(lambda s: platform_errors(s, *([probe] if s == "Windows" else [])),
                                           SYSTEMS)))
    for system, errors in found.items():
        in_probe = [f for f in errors if f.startswith(probe.name)]
        assert [f for f in errors if f not in in_probe] == [], system
        if system == "Windows":
            assert len(in_probe) == 2 and '"fork"' in in_probe[0] and '"SIGHUP"' in in_probe[1], errors
        else:
            assert in_probe == []


def runtime_requirements() -> list[str]:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not d.startswith("symbolic")]


@pytest.mark.slow
def test_runtime_dependencies_resolve_to_wheels(tmp_path):
    """Every runtime dependency but symbolic, and what they need, installs from a wheel on Windows and macOS for
    CPython 3.11-3.13: pip resolves them for that system and interpreter from PyPI's metadata alone (no source
    build, nothing downloaded whole); the six resolutions run at once."""
    import concurrent.futures

    def resolve(case: tuple[str, str]) -> tuple[subprocess.CompletedProcess, Path]:
        platform, python = case
        report = tmp_path / f"report-{platform}-{python}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--report",
             str(report), "--only-binary=:all:", "--platform", platform, "--python-version", python,
             "--implementation", "cp", "--target", str(tmp_path / f"target-{platform}-{python}"),
             *runtime_requirements()], capture_output=True, text=True, timeout=900)
        return proc, report

    cases = [(platform, python) for platform in ("win_amd64", "macosx_14_0_arm64") for python in ("311", "312", "313")]
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        for case, (proc, report) in zip(cases, pool.map(resolve, cases)):
            assert proc.returncode == 0, (case, proc.stderr[-3000:])
            installs = json.loads(report.read_text())["install"]
            names = {i["metadata"]["name"].lower() for i in installs}
            assert {"numpy", "numba", "pyarrow", "duckdb", "distributed", "pydantic"} <= names, case
            assert all(i["download_info"]["url"].endswith(".whl") for i in installs), case


def test_symbolic_is_the_one_dependency_without_a_windows_wheel():
    deps = {re.split(r"[<>=; \[]", d)[0]: d for d in
            __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert deps["symbolic"].endswith("sys_platform != 'win32'")
    assert [d for d in deps.values() if ";" in d] == [deps["symbolic"]]


def test_reads_at_an_offset_without_pread(tmp_path):
    """Where ``os.pread`` is missing (Windows), a seek and a read under the descriptor's lock give the same bytes,
    from threads at once."""
    import concurrent.futures

    data = os.urandom(1 << 20)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    fd = os.open(path, portable.READ_BINARY)
    try:
        offsets = list(range(0, len(data), 4093))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda o: portable._seek_and_read(fd, 5000, o), offsets))
        assert got == [data[o:o + 5000] for o in offsets] == [portable.pread(fd, 5000, o) for o in offsets]
        buf = memoryview(bytearray(100))
        assert portable._seek_and_read_into(fd, buf, len(data) - 40) == 40 and bytes(buf[:40]) == data[-40:]
    finally:
        os.close(fd)


def test_a_swap_cut_between_its_renames_is_undone_at_the_next_run(tmp_path):
    """The old output was set aside and the process ended before the new one went in place: the next stage output
    in that run directory puts the old one back (and a finished swap leaves nothing behind)."""
    from pipeline.runs import clean_leftovers, stage_output, swap_into_place

    run = tmp_path / "run"
    (run / "decoded").mkdir(parents=True)
    (run / "decoded" / "_manifest.json").write_text("{}")
    # (what a killed process leaves: its pid is one that runs no more)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    aside = run / f".decoded.old-{dead}-0a1b2c3d"
    (run / "decoded").rename(aside)
    (run / f".decoded.tmp-{dead}-0a1b2c3d").mkdir()
    assert clean_leftovers(run) == [run / f".decoded.tmp-{dead}-0a1b2c3d"]
    assert (run / "decoded" / "_manifest.json").exists() and not aside.exists()
    # a whole swap: the new output in place, nothing aside
    with stage_output(run, "decoded") as out:
        (out.path / "x.txt").write_text("new")
    assert (run / "decoded" / "x.txt").read_text() == "new"
    assert sorted(p.name for p in run.iterdir()) == ["decoded"]
    # the new output cannot go in place: the old one stays where it was
    tmp = run / ".decoded.tmp-1-x"
    tmp.mkdir()
    with pytest.raises(FileNotFoundError):
        swap_into_place(tmp / "gone", run / "decoded")
    assert (run / "decoded" / "x.txt").read_text() == "new"


def test_a_reader_never_sees_part_of_a_stage_output_while_it_is_swapped(tmp_path):
    """Two renames: what a reader finds at ``RUN_DIR/decoded`` is always a directory that was complete before it
    went there (its inode is that of a finished private directory), or nothing for a moment; never one being
    filled (mutation once unseen: ``swap_into_place`` as ``rmtree`` + ``copytree``). (A reader that opened the old
    output sees it emptied as it is removed: on Linux its open files stay readable.)"""
    import threading

    from pipeline.runs import swap_into_place

    run = tmp_path / "run"
    run.mkdir()
    complete = set()

    def output(k: int) -> Path:
        tmp = run / f".decoded.tmp-{k}"
        tmp.mkdir()
        for i in range(300):
            (tmp / f"part-{i:04d}.parquet").write_bytes(b"x" * 64)
        complete.add(tmp.stat().st_ino)
        return tmp

    swap_into_place(output(0), run / "decoded")
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            try:
                seen.add(os.stat(run / "decoded").st_ino)
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for k in range(1, 30):
            swap_into_place(output(k), run / "decoded")
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 1 and seen <= complete, (len(seen), len(seen - complete))


def test_symbolize_without_symbolic_says_how_to_get_it_and_goes_on(tmp_path):
    """A machine without ``symbolic`` (Windows, without a Rust toolchain): modelled by a process in which it cannot
    be imported. The job goes on: every frame unresolved, one line that says how to get it, the same in the
    manifest and on the report's first banner."""
    from tests.synth_traces import VARIANTS

    trace = tmp_path / "t.etl"
    from pipeline import synth

    synth.run(trace, VARIANTS["plain32_cached"])
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"},
                                  "symbolize": {"symbol_path": str(trace.parent / "symbols"),
                                                "cache_dir": str(tmp_path / "symcache")},
                                  "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    run = tmp_path / "run"
    code = ("import sys\nsys.modules['symbolic'] = None\nfrom pipeline.cli import main\n"
            f"sys.exit(main(['--config', {str(config)!r}, 'run', 'jobs/single-trace.yaml', '--trace', {str(trace)!r}, "
            f"'--run', {str(run)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "symbolize: the `symbolic` package is not installed" in proc.stderr
    assert "pip install symbolic" in proc.stderr
    manifest = json.loads((run / "symbolized" / "_manifest.json").read_text())
    assert manifest["resolved_frames"] == 0 and manifest["frames"] > 0
    assert manifest["symbolic_missing"].startswith("the `symbolic` package is not installed")
    assert "Frames are unresolved: the `symbolic` package is not installed" in (run / "report" / "index.html").read_text()


def test_names_made_from_urls_and_times_are_names_on_windows():
    """A backfill names a run after its trace: a URL's ``%3A`` or a time's ``:`` gave a name NTFS refuses."""
    assert portable.file_name("2026-11-28T01:00:00") == "2026-11-28T01_00_00"
    assert portable.file_name('a<b>c"d|e?f*g\x01') == "a_b_c_d_e_f_g_"
    assert portable.file_name("trace. ") == "trace" and portable.file_name("..") == "_"


def test_windows_words_for_a_full_disk_and_a_held_file_are_one_line():
    """Windows' disk-full text was not recognised (a traceback), and a sharing violation, which Python maps to
    EACCES, was called "permission denied"."""
    from pipeline.errors import place_error

    full = RuntimeError('IO Error: Could not write file "C:\\runs\\r\\wh.duckdb": There is not enough space on the disk.')
    assert place_error(full) == "C:\\runs\\r\\wh.duckdb: no space left on the device"
    held = PermissionError(13, "The process cannot access the file because it is being used by another process",
                           "C:\\runs\\r\\decoded\\x.parquet")
    held.winerror = 32          # (as Windows' OSError carries it)
    assert place_error(held) == "C:\\runs\\r\\decoded\\x.parquet: the file is open in another process (a virus " \
                                "scanner, an indexer, an editor?)"
    assert place_error(PermissionError(13, "Permission denied", "/r/x")) == "/r/x: permission denied"


def test_replace_and_remove_try_again_while_windows_refuses(tmp_path, monkeypatch):
    """A scanner holding a file a moment: Windows refuses a replace or a removal with a sharing violation (a
    PermissionError, winerror 32); both are tried again until it lets go (here the refusal is given twice, by the
    system call's stand-in, then the real call runs)."""
    import shutil

    monkeypatch.setattr(portable, "WINDOWS", True)
    refusals = {"replace": 2, "rmtree": 2}

    def refusing(name, real):
        def call(*args, **kwargs):
            if refusals[name]:
                refusals[name] -= 1
                exc = PermissionError(13, "The process cannot access the file because it is being used by another "
                                      "process")
                exc.winerror = 32
                raise exc
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(portable.os, "replace", refusing("replace", os.replace))
    monkeypatch.setattr(shutil, "rmtree", refusing("rmtree", shutil.rmtree))
    (tmp_path / "a").write_text("new", encoding="utf-8")
    (tmp_path / "b").write_text("old", encoding="utf-8")
    portable.replace(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b").read_text(encoding="utf-8") == "new" and refusals["replace"] == 0
    (tmp_path / "d" / "e").mkdir(parents=True)
    portable.remove_tree(tmp_path / "d")
    assert not (tmp_path / "d").exists() and refusals["rmtree"] == 0
    portable.remove_tree(tmp_path / "gone")         # (gone already: no error)


def test_nothing_holds_a_file_of_the_decode_when_it_is_swapped_into_place(synth_traces, tmp_path):
    """Windows renames and removes no file a process holds: the workers kept the stack definitions' ``.npy`` files
    of the decode's scratch mapped until their cluster closed (only glibc's idle trim let go of them), so the swap
    of the stage's directory would have been refused, and the decode thrown away. Held at the swap, no process of
    the command (the command, its fork server, its workers) maps or opens a file of the stage's directory."""
    import psutil

    from tests.helpers import checkpoints

    trace = synth_traces["plain64_cached"].path        # (stack caching: the decode maps its stack definitions)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "local", "n_workers": 2, "memory_limit": "2GiB",
                                              "inline_below": 0}}), encoding="utf-8")
    run, held = tmp_path / "run", {}

    def look(proc):
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        tmp = [p for p in run.iterdir() if p.name.startswith(".decoded.tmp-")]
        assert len(tmp) == 1, tmp
        for p in family:
            try:
                paths = [m.path for m in p.memory_maps()] + [f.path for f in p.open_files()]
            except psutil.NoSuchProcess:
                continue
            held[p.pid] = [x for x in paths if x.startswith(str(tmp[0]))]
        assert len(held) >= 3, held        # (the command and at least its two workers were looked at)

    done = checkpoints.run_held([sys.executable, "-m", "pipeline", "--config", str(config), "decode", str(trace),
                                 "--run", str(run)], tmp_path / "hold", "decoded.swap", look, ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(held.values()), held


def test_a_tree_that_ignores_ctrl_c_is_ended_and_its_exit_code_kept(tmp_path):
    """A build that ignores SIGINT (or, on Windows, CTRL_BREAK with no console) is terminated with its children; its
    exit code is the one its Popen reaped (psutil's wait, which reaped it first, once left 0 there)."""
    import signal

    from pipeline.portable import end_tree, pid_alive

    pid_file = tmp_path / "grandchild.pid"
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            f"child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            f"signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)'])\n"
            f"open({str(pid_file)!r} + '.tmp', 'w').write(str(child.pid))\n"
            f"import os; os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        while not pid_file.exists():
            assert proc.poll() is None
            try:
                proc.wait(0.05)
            except subprocess.TimeoutExpired:
                pass
        grandchild = int(pid_file.read_text())
        end_tree(proc, grace_s=1.0)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM
    assert not pid_alive(grandchild)
