"""Linux: the build recorded with ``perf record`` (CPU samples with call stacks), always stopped.

``perf record -e cpu-clock -F RATE -g -k monotonic -o RUN_DIR/input/perf.partial.data -- BUILD...`` runs the build
as its workload. ``cpu-clock`` is a software event, so it works where the machine has no hardware counters (VMs); it
samples each thread of the build (perf follows forks, so every rustc cargo starts) ``RATE`` times a CPU-second;
``-g`` records the frame-pointer call chain of each sample; ``-k monotonic`` times samples on CLOCK_MONOTONIC and
has perf write the wall-clock time of one moment of it. perf runs in a session of its own
(``portable.shielded``), so a Ctrl-C meant for the build does not cut its writing short: on Ctrl-C or SIGTERM the
build's process tree is ended (:func:`stop`), perf sees its workload end and writes the file as usual. Only a
complete file (its header says how much data it holds) is moved to ``RUN_DIR/input/perf.data``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from pipeline import portable
from pipeline.capture.paths import PERF_TRACE
from pipeline.errors import BootprofError

#: Samples per CPU-second: rustc's phases last milliseconds to seconds, and at ~1 kHz a 2-second crate gets ~2000
#: samples while the file grows ~150 KB a CPU-second with frame-pointer stacks. perf's default (4000 Hz) quadruples
#: both, and a prime rate keeps the sampling out of step with periodic work.
DEFAULT_RATE = 999
#: The sample clock (``perf record -k``): with a clock named, perf writes the Unix time of one moment of it
#: (HEADER_CLOCK_DATA), which puts samples on the self-profiles' clock (wall time) for CPU by query; CLOCK_MONOTONIC
#: does not jump with the wall clock during the build.
CLOCK = "monotonic"
#: How long perf may take to write its file (build ids of every image it saw) once its workload has ended.
FINISH_S = 120.0

PARTIAL = Path("input") / "perf.partial.data"
TRACE = PERF_TRACE


def executable() -> str:
    """The ``perf`` on PATH, or why there is none."""
    found = shutil.which("perf")
    if found is None:
        raise BootprofError("capture --perf: no `perf` on PATH (Debian/Ubuntu: apt-get install linux-perf or "
                            "linux-tools-$(uname -r))")
    return found


#: ``--perf-call-graph``: frame pointers (``-g``: perf walks the chain in the kernel; code built without them gives
#: short or wrong user stacks), or ``dwarf``: each sample keeps the user registers and the top ``DWARF_STACK``
#: bytes of the user stack, which the decoder unwinds with the images' ``.eh_frame`` (``pipeline/decode/perf/unwind.py``;
#: ~8 KB a sample, so a file ~30 times larger at the same rate).
CALL_GRAPHS = ("fp", "dwarf")
DWARF_STACK = 8192


def command(perf: str, out: Path, rate: int, build: list[str], call_graph: str = "fp") -> list[str]:
    graph = ["-g"] if call_graph == "fp" else ["--call-graph", f"dwarf,{DWARF_STACK}"]
    return [perf, "record", "-e", "cpu-clock", "-F", str(rate), *graph, "-k", CLOCK, "-o", str(out), "--", *build]


def check(perf: str) -> str:
    """perf's version, after a one-process recording that shows it may record here (perf_event_paranoid, a
    container without perf_event_open); BootprofError with perf's own words otherwise."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bootprof-perf-") as tmp:
        probe = subprocess.run([perf, "record", "-e", "cpu-clock", "-q", "-o", str(Path(tmp) / "probe.data"), "--",
                                "true"], capture_output=True, text=True, encoding="utf-8", errors="replace",
                               timeout=60)
    if probe.returncode != 0:
        raise BootprofError(f"capture --perf: `perf record` cannot record here ({probe.returncode}): "
                            f"{(probe.stdout + probe.stderr).strip()[-500:] or 'no output'} (as root, or with "
                            "/proc/sys/kernel/perf_event_paranoid at 1 or below)")
    version = subprocess.run([perf, "--version"], capture_output=True, text=True, encoding="utf-8", errors="replace")
    return version.stdout.strip()


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End the build that perf runs (its workload and everything that started), SIGINT first as a Ctrl-C would,
    then SIGTERM and SIGKILL for what is left; perf itself is left to finish its file (:func:`wait`)."""
    import psutil

    def tree() -> list[psutil.Process]:
        try:
            return [p for p in psutil.Process(proc.pid).children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    # (psutil's terminate and kill: SIGTERM and SIGKILL, named so on every system the module is read on)
    for step in (lambda p: p.send_signal(signal.SIGINT), psutil.Process.terminate, psutil.Process.kill):
        rest = tree()
        if not rest:
            return
        for p in rest:
            try:
                step(p)
            except psutil.Error:
                pass
        psutil.wait_procs(rest, timeout=grace_s)


def wait(proc: subprocess.Popen) -> dict[str, Any]:
    """Wait for perf (and so the build) to end, sampling perf's own CPU time meanwhile; its CPU seconds (what the
    recording cost, beside the build's) and those of the build."""
    import psutil

    before = os.times()
    own = 0.0
    try:
        me = psutil.Process(proc.pid)
    except psutil.Error:
        me = None
    while proc.poll() is None:
        if me is not None:
            try:
                t = me.cpu_times()
                own = t.user + t.system
            except psutil.Error:
                pass
        try:
            proc.wait(timeout=portable.WAIT_STEP_S)
        except subprocess.TimeoutExpired:
            pass
    after = os.times()
    tree = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"perf_cpu_s": round(own, 3), "build_cpu_s": round(max(tree - own, 0.0), 3)}


def finish(proc: subprocess.Popen, interrupted: bool) -> dict[str, Any]:
    """After the build: perf given ``FINISH_S`` to write its file (then SIGINT, then SIGKILL); its exit code."""
    deadline = time.monotonic() + FINISH_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"perf_exit_code": proc.returncode, "stopped": True, "interrupted": interrupted}


def build_ids(path: Path) -> list[dict[str, Any]]:
    """The build ids perf wrote into the file (``perf buildid-list``): one per image with samples."""
    out = subprocess.run([shutil.which("perf") or "perf", "buildid-list", "-i", str(path)], capture_output=True,
                         text=True, encoding="utf-8", errors="replace", timeout=120)
    rows = []
    for line in out.stdout.splitlines():
        bid, _, name = line.partition(" ")
        if bid and name:
            rows.append({"file": name.strip(), "build_id": bid, "kernel": name.strip().startswith("[kernel")})
    return rows


def place(run_dir: Path, info: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    """Move the recording into place when it is a complete perf.data file; what it is (or its error)."""
    import struct

    from pipeline.decode import PERF, sniff
    from pipeline.errors import InputError

    partial, final = run_dir / PARTIAL, run_dir / TRACE
    info.update(path=None, size=None)
    if not partial.is_file():
        info["error"] = f"perf wrote no {partial} (exit code {info.get('perf_exit_code')})"
        return info
    try:
        if sniff(partial) != PERF:
            raise InputError(f"{partial}: not a perf.data file")
    except InputError as exc:
        info["error"] = f"the stopped recording is not a usable perf.data file: {exc}"
        return info
    size = partial.stat().st_size
    with open(partial, "rb") as f:
        head = f.read(104)
    # (perf writes the data section's size into the header as it stops: 0, or past the end, is a file cut short)
    data_offset, data_size = struct.unpack_from("<QQ", head, 40) if len(head) == 104 else (0, 0)
    if data_size == 0 or data_offset + data_size > size:
        info["error"] = f"{partial}: incomplete (its header says {data_size} bytes of data at {data_offset})"
        return info
    portable.replace(partial, final)
    info.update(path=str(final), size=size, bytes_per_s=round(size / max(elapsed_s, 1e-9)),
                build_ids=build_ids(final))
    if info.get("build_cpu_s"):
        info["overhead_pct"] = round(100 * info["perf_cpu_s"] / info["build_cpu_s"], 2)
    return info
