"""ETW recordings around a build: which WPR or xperf commands start, snapshot and stop them.

A :class:`Recording` is plain data: the command lines of one tool, built once from the options, so that
the orchestration (``pipeline.capture.run``) runs them in order and tests compare them with the tools'
documented syntax. Nothing here checks which OS runs it: the tools are looked up on ``PATH``.

WPR (``wpr.exe``, in Windows 10 and later and in the Windows Performance Toolkit)::

    wpr -snapshotconfig heap -name rustc.exe enable      (only with heap snapshots)
    wpr -start P!CPU -start P!VirtualAlloc [-start P!HeapSnapshot] -filemode
    wpr -singlesnapshot heap PID...                       (every PERIOD seconds, at most 8 PIDs a call)
    wpr -stop TRACE.etl                                   (stops and merges: ImageID/DbgID records)
    wpr -snapshotconfig heap -name rustc.exe disable     (only with heap snapshots)

where P is ``configs/profiles/bootprof.wprp`` unless ``--profile`` names others. xperf (the Windows
Performance Toolkit's older controller)::

    xperf -on Diag+VIRT_ALLOC -stackwalk Profile+VirtualAlloc
    xperf -d TRACE.etl                                    (stops the kernel logger and merges)

When the stop command fails, ``wpr -cancel`` / ``xperf -stop`` ends the session so that no logger is
left running.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import packaged
from pipeline.errors import BootprofError, InputError

#: Our WPR profiles: CPU sampling with stacks, VirtualAlloc with stacks, heap snapshots.
PROFILES = packaged.directory("configs") / "profiles" / "bootprof.wprp"
DEFAULT_PROFILES = ("CPU", "VirtualAlloc")
HEAP_PROFILE = "HeapSnapshot"
#: The image whose new processes get heap snapshots enabled (``wpr -snapshotconfig heap -name``).
HEAP_IMAGE = "rustc.exe"
#: ``wpr -singlesnapshot heap`` takes at most this many PIDs (more: E_WPRC_EXCEEDED_HEAP_SNAPSHOT_PIDS).
SNAPSHOT_PIDS_MAX = 8
#: Kernel flags and stack walks of ``--xperf``: the seeds' ``Diag`` group (process, thread, image, CPU
#: sampling, context switches, disk) plus VirtualAlloc, so that the memory views have data.
XPERF_ON = "Diag+VIRT_ALLOC"
XPERF_STACKWALK = "Profile+VirtualAlloc"

ADVICE = ("`bootprof capture --self-profile -- <build>` works anywhere; ETW capture needs Windows with "
          "the Windows Performance Toolkit (wpr.exe ships with Windows 10 and later, xperf.exe with the ADK).")


@dataclass(frozen=True)
class Recording:
    """The command lines of one ETW recording, in the order they run."""

    tool: str                                   # "wpr" or "xperf"
    executable: str                             # its path, as found on PATH
    before: list[list[str]] = field(default_factory=list)   # before the session starts
    start: list[str] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)           # stops and merges into the trace
    cancel: list[str] = field(default_factory=list)         # ends the session when stop fails
    after: list[list[str]] = field(default_factory=list)    # after the session, whatever happened
    heap_period_s: float | None = None

    def snapshot(self, pids: list[int]) -> list[list[str]]:
        """``wpr -singlesnapshot heap`` for ``pids``, in calls of at most 8."""
        return [[self.executable, "-singlesnapshot", "heap", *map(str, pids[i:i + SNAPSHOT_PIDS_MAX])]
                for i in range(0, len(pids), SNAPSHOT_PIDS_MAX)]


def find_tool(name: str) -> str:
    """The tool's path on PATH; BootprofError saying what is needed otherwise."""
    path = shutil.which(name)
    if path is None:
        raise BootprofError(f"capture --{name}: `{name}` is not on PATH. {ADVICE}")
    return path


def profile_names(path: Path) -> set[str]:
    """The ``Name`` of every ``<Profile>`` in a WPR profile file; InputError naming the file otherwise."""
    try:
        root = ET.parse(path).getroot()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the WPR profile: {exc.strerror or exc}") from exc
    except ET.ParseError as exc:
        raise InputError(f"{path}: not a WPR profile (XML error at line {exc.position[0]}, "
                         f"column {exc.position[1]})") from exc
    return {p.get("Name") for p in root.iter() if p.tag.rsplit("}", 1)[-1] == "Profile" and p.get("Name")}


def check_profile(spec: str) -> str:
    """A ``-start`` argument: ``FILE.wprp!NAME`` (the file must hold that profile) or a built-in name."""
    if spec.lower().endswith(".wprp"):
        raise InputError(f"--profile {spec}: name the profile in the file, as FILE.wprp!NAME "
                         f"(`wpr -profiles {spec}` lists them)")
    if "!" not in spec:
        return spec                                     # a built-in WPR profile, e.g. GeneralProfile
    file, _, name = spec.rpartition("!")
    names = profile_names(Path(file))
    if name.split(".")[0] not in names:
        raise InputError(f"{file}: no profile named {name!r} (it has: {', '.join(sorted(names)) or 'none'})")
    return f"{Path(file).resolve()}!{name}"


def wpr(trace: Path, profiles: list[str] | None = None, heap_period_s: float | None = None) -> Recording:
    """The WPR recording of a build into ``trace``."""
    exe = find_tool("wpr")
    specs = [check_profile(p) for p in profiles] if profiles else [
        check_profile(f"{PROFILES}!{name}") for name in DEFAULT_PROFILES]
    before, after = [], []
    if heap_period_s is not None:
        specs.append(check_profile(f"{PROFILES}!{HEAP_PROFILE}"))
        before = [[exe, "-snapshotconfig", "heap", "-name", HEAP_IMAGE, "enable"]]
        after = [[exe, "-snapshotconfig", "heap", "-name", HEAP_IMAGE, "disable"]]
    start = [exe]
    for spec in specs:
        start += ["-start", spec]
    start.append("-filemode")
    return Recording("wpr", exe, before=before, start=start, stop=[exe, "-stop", str(trace)],
                     cancel=[exe, "-cancel"], after=after, heap_period_s=heap_period_s)


def xperf(trace: Path) -> Recording:
    """The xperf kernel-logger recording of a build into ``trace``."""
    exe = find_tool("xperf")
    return Recording("xperf", exe, start=[exe, "-on", XPERF_ON, "-stackwalk", XPERF_STACKWALK],
                     stop=[exe, "-d", str(trace)], cancel=[exe, "-stop"])


def version(exe: str) -> str:
    """The tool's banner line with its version (from ``-?``), or what went wrong."""
    try:
        proc = subprocess.run([exe, "-?"], capture_output=True, text=True, encoding="utf-8", errors="replace",
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return next((line for line in lines if "version" in line.lower()), lines[0] if lines else "unknown")


def is_admin() -> bool | None:
    """Administrator rights on Windows (ETW kernel sessions need them); None elsewhere."""
    import ctypes

    shell32 = getattr(getattr(ctypes, "windll", None), "shell32", None)
    return bool(shell32.IsUserAnAdmin()) if shell32 is not None else None
