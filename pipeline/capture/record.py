"""The capture's run: the build once, with the self-profiler on and/or inside an ETW recording that is always
stopped and merged (on failure, Ctrl-C and SIGTERM too), then the run directory's capture manifest."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from pipeline import portable
from pipeline.capture.paths import PARTIAL_TRACE, PROFILE_DIR, TRACE
from pipeline.capture.rustc import (DEFAULT_EVENTS, check_self_profile, checkout_commit, debuginfo_warning,
                                    is_bootstrap, profile_env, rustc_command, toolchain)
from pipeline.errors import BootprofError, InputError
from pipeline.runs import stage_output
from pipeline.sources import fingerprint
from pipeline.stages import CAPTURED


STAGE = CAPTURED


def _call(cmd: list[str], log: list[dict]) -> subprocess.CompletedProcess:
    """Run one ETW tool command; its line, exit code and output go to the manifest's log."""
    try:
        # (in a process group of its own: a Ctrl-C meant for the build must not cut a stop's merge short)
        proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=900,
                              **portable.shielded())
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc = subprocess.CompletedProcess(cmd, 127 if isinstance(exc, OSError) else 124, "", str(exc))
    log.append({"command": cmd, "exit_code": proc.returncode,
                "output": (proc.stdout + proc.stderr).strip()[-2000:]})
    return proc


class _Snapshots(threading.Thread):
    """Every ``period`` seconds, a heap snapshot of each live ``rustc`` process the build started."""

    def __init__(self, recording, build_pid: int, log: list[dict]):
        super().__init__(name="heap-snapshots", daemon=True)
        self.recording, self.build_pid, self.log = recording, build_pid, log
        self.done = threading.Event()
        self.taken: list[dict] = []

    def run(self) -> None:
        import psutil

        t0 = time.perf_counter()
        while not self.done.wait(self.recording.heap_period_s):
            try:
                children = psutil.Process(self.build_pid).children(recursive=True)
            except psutil.Error:
                return
            pids = []
            for child in children:
                try:
                    if Path(child.name()).stem.lower() == "rustc":
                        pids.append(child.pid)
                except psutil.Error:
                    continue                  # (ended since it was listed)
            if not pids:
                continue
            for cmd in self.recording.snapshot(sorted(pids)):
                ok = _call(cmd, self.log).returncode == 0
                self.taken.append({"t_s": round(time.perf_counter() - t0, 3), "pids": [int(p) for p in cmd[3:]],
                                   "ok": ok})


def _copy_symbols(run_dir: Path, trace: Path, checkout: Path, config) -> list[dict[str, Any]]:
    """Decode the recorded trace into the run (``bootprof run`` then finds it done) and copy the PDBs of its images
    that lie under ``checkout`` into ``RUN_DIR/symbols``."""
    from pipeline import decode, sources
    from pipeline.capture.bundle import collect_symbols
    from pipeline.cluster import connect

    with connect(config.cluster, warm_up=decode.WARM_UP, size=sources.input_bytes([trace]), background=True) as pool:
        decode.run(run_dir, config, pool, inputs=[trace])
    return collect_symbols(run_dir, checkout)


def _copy_elf_symbols(run_dir: Path, trace: Path, config, max_bytes: int) -> dict[str, Any]:
    """Decode the perf recording into the run (``bootprof run`` then finds it done) and copy the ELF files of its
    sampled images into ``RUN_DIR/symbols/elf``."""
    from pipeline import decode, sources
    from pipeline.capture.elfsymbols import collect_elf_symbols
    from pipeline.cluster import connect

    with connect(config.cluster, warm_up=decode.WARM_UP, size=sources.input_bytes([trace]), background=True) as pool:
        decode.run(run_dir, config, pool, inputs=[trace])
    return collect_elf_symbols(run_dir, max_bytes)


def run(run_dir: Path, config, pool=None, inputs: list[str] | None = None, events: str | None = None,
        cwd: Path | None = None, *, self_profile: bool = True, etw_tool: str | None = None,
        profiles: list[str] | None = None, heap_period_s: float | None = None,
        symbols: bool | None = None, perf_rate: int | None = None, perf_call_graph: str = "fp",
        symbols_max: int | None = None) -> dict[str, Any]:
    """Run the build command ``inputs`` (argv) once, with self-profiling into ``RUN_DIR/selfprofile/``
    and/or inside a WPR or xperf recording (``etw_tool``) into ``RUN_DIR/input/trace.etl``. Unless ``symbols`` is
    False, the recorded trace is decoded and the PDBs of its images that lie under the checkout are copied into
    ``RUN_DIR/symbols/`` (:mod:`pipeline.capture.bundle`), so that the run can be analyzed elsewhere. With
    ``perf_rate`` (Linux), the build runs under ``perf record`` at that many samples a CPU-second into
    ``RUN_DIR/input/perf.data`` (:mod:`pipeline.capture.perf`), with call stacks by ``perf_call_graph``; with
    ``symbols`` True, the recording is decoded and the ELF files of its sampled images, at most ``symbols_max``
    bytes, copied into ``RUN_DIR/symbols/elf/`` (:mod:`pipeline.capture.elfsymbols`)."""
    from pipeline.capture import etw
    from pipeline.capture import perf as linux_perf

    if not inputs:
        raise InputError("capture: no build command given (bootprof capture --self-profile -- cargo build)")
    if not self_profile and etw_tool is None and perf_rate is None:
        raise InputError("capture: say what to record: --self-profile (works anywhere), --wpr or --xperf "
                         "(Windows), --perf (Linux), or --self-profile with one of them")
    if perf_rate is not None and etw_tool is not None:
        raise InputError("capture: --perf records on Linux, --wpr and --xperf on Windows: one of them")
    if (profiles or heap_period_s is not None) and etw_tool != "wpr":
        raise InputError("capture: --profile and --heap-snapshots go with --wpr")
    run_dir = Path(run_dir).resolve()
    cwd = Path(cwd or os.getcwd()).resolve()
    base_env = dict(os.environ)
    warnings: list[str] = []
    manifest: dict[str, Any] = {"command": list(inputs), "cwd": str(cwd)}

    recording = None
    if etw_tool is not None:
        partial = run_dir / PARTIAL_TRACE
        recording = etw.wpr(partial, profiles, heap_period_s) if etw_tool == "wpr" else etw.xperf(partial)
        if etw.is_admin() is False:
            raise BootprofError(f"capture --{etw_tool}: ETW kernel sessions need administrator rights; "
                                "run this from an elevated (administrator) prompt")
        if (warning := debuginfo_warning(cwd)) is not None:
            warnings.append(warning)
    bootstrap = is_bootstrap(list(inputs), cwd)
    if self_profile and bootstrap:
        # (x.py builds with its own compilers, which take -Z: the rustc on PATH, if any, is not the build's)
        manifest["toolchain"], manifest["probe_warnings"] = None, []
    elif self_profile:
        rustc = rustc_command(base_env, list(inputs))
        manifest["toolchain"] = toolchain(rustc, base_env)
        manifest["probe_warnings"] = probe = check_self_profile(rustc, base_env, events or DEFAULT_EVENTS)
        warnings += [f"rustc: {w}" for w in probe]

    env, files_before, profile_dir = base_env, set(), run_dir / PROFILE_DIR
    if self_profile:
        events = events or DEFAULT_EVENTS
        profile_dir.mkdir(parents=True, exist_ok=True)
        files_before = {p.name for p in profile_dir.glob("*.mm_profdata")}
        env, carrier, added = profile_env(base_env, profile_dir, events, bootstrap)
        manifest.update({"rustflags_added": added, "rustflags_variable": carrier,
                         "events": events, "rustc_bootstrap": base_env.get("RUSTC_BOOTSTRAP"),
                         "profile_dir": str(profile_dir)})
    manifest.update({"checkout": {"path": str(cwd), "commit": checkout_commit(cwd)},
                     "host": {"name": platform.node(), "platform": platform.platform(),
                              "cpus": os.cpu_count()}})

    log: list[dict] = []
    perf_exe = None
    if perf_rate is not None:
        perf_exe = linux_perf.executable()
        manifest["recording"] = {"tool": "perf", "executable": perf_exe, "version": linux_perf.check(perf_exe),
                                 "event": "cpu-clock", "rate_hz": perf_rate, "call_graph": perf_call_graph,
                                 "clock": linux_perf.CLOCK}
        (run_dir / linux_perf.PARTIAL).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / linux_perf.PARTIAL).unlink(missing_ok=True)
    if recording is not None:
        manifest["recording"] = {"tool": recording.tool, "executable": recording.executable,
                                 "version": etw.version(recording.executable), "commands": log}
        (run_dir / PARTIAL_TRACE).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / PARTIAL_TRACE).unlink(missing_ok=True)
        for cmd in recording.before:
            _call(cmd, log)
        started = _call(recording.start, log)
        if started.returncode != 0:
            for cmd in recording.after:
                _call(cmd, log)
            raise BootprofError(f"capture: `{' '.join(recording.start)}` failed ({started.returncode}): "
                                f"{(started.stdout + started.stderr).strip()[-500:] or 'no output'}; nothing was built")

    interrupted, proc, snapshots, usage = None, None, None, {}
    previous = signal.signal(signal.SIGTERM, _sigterm) if threading.current_thread() is threading.main_thread() else None
    started_at, t0 = time.time(), time.perf_counter()
    try:
        try:
            if perf_exe is not None:    # (perf in a session of its own: a Ctrl-C must not cut its file short)
                proc = subprocess.Popen(linux_perf.command(perf_exe, run_dir / linux_perf.PARTIAL, perf_rate,
                                                           list(inputs), perf_call_graph),
                                        env=env, cwd=cwd, **portable.shielded())
            else:
                proc = subprocess.Popen(list(inputs), env=env, cwd=cwd, **portable.child_group())
        except OSError as exc:
            raise InputError(f"cannot run {inputs[0]}: {exc.strerror or exc}") from exc
        if recording is not None and recording.heap_period_s is not None:
            snapshots = _Snapshots(recording, proc.pid, log)
            snapshots.start()
        if perf_exe is not None:
            usage = linux_perf.wait(proc)
        else:
            portable.wait(proc)
    except KeyboardInterrupt as exc:
        interrupted = "SIGTERM" if isinstance(exc, _Terminated) else "SIGINT"
        if proc is not None:
            with _deferred_sigint():        # (a second Ctrl-C must not cut the ending of the tree short)
                linux_perf.stop(proc) if perf_exe is not None else portable.end_tree(proc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        elapsed = time.perf_counter() - t0
        if snapshots is not None:
            snapshots.done.set()
            snapshots.join()
        trace_info = _stop(recording, run_dir, log) if recording is not None else None
        if perf_exe is not None and proc is not None:
            with _deferred_sigint():
                trace_info = linux_perf.place(run_dir, {**usage, **linux_perf.finish(proc, interrupted is not None)},
                                              elapsed)
    exit_code = proc.returncode if proc is not None else None

    files = sorted(p for p in profile_dir.glob("*.mm_profdata") if p.name not in files_before) if self_profile else []
    inputs_fp = [fingerprint(p) for p in files]
    if trace_info and trace_info.get("path"):
        inputs_fp.append(fingerprint(Path(trace_info["path"])))
    copied, elf = None, None
    usable = trace_info and trace_info.get("path") and not interrupted and not trace_info.get("error")
    if usable and perf_exe is None and symbols is not False:       # (ETW: PDBs unless --no-symbols)
        copied = _copy_symbols(run_dir, Path(trace_info["path"]), cwd, config)
    if usable and perf_exe is not None and symbols:                 # (perf: ELF files with --symbols)
        from pipeline.capture.elfsymbols import DEFAULT_MAX

        elf = _copy_elf_symbols(run_dir, Path(trace_info["path"]), config,
                                DEFAULT_MAX if symbols_max is None else symbols_max)
        copied = elf["copied"]
    with stage_output(run_dir, STAGE, inputs=inputs_fp, config=config.resolved()) as out:
        out.manifest.update(manifest)
        if copied is not None:
            out.manifest["symbols"] = copied
        if elf is not None:
            out.manifest.update(symbols_skipped=elf["skipped"], symbols_bytes=elf["bytes"],
                                symbols_max_bytes=elf["max_bytes"])
        out.manifest.update({
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
            "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at + elapsed)),
            "elapsed_s": round(elapsed, 3),
            "exit_code": exit_code,
            "interrupted": interrupted,
            "warnings": warnings,
            "files": [{"name": p.name, "size": p.stat().st_size} for p in files],
        })
        if perf_exe is not None:
            out.manifest["recording"].update(trace_info or {})
        if recording is not None:
            out.manifest["recording"].update(trace_info or {})
            out.manifest["recording"]["heap_snapshots"] = snapshots.taken if snapshots is not None else []
    summary = {"exit_code": exit_code, "files": len(files), "profile_dir": str(profile_dir) if self_profile else None,
               "elapsed_s": round(elapsed, 3), "warnings": warnings, "trace": (trace_info or {}).get("path"),
               "trace_size": (trace_info or {}).get("size"), "run_dir": str(run_dir),
               "symbols": copied, "symbols_skipped": (elf or {}).get("skipped"), "recording": (trace_info or {}) if perf_exe is not None else None}
    where = f"capture manifest in {run_dir / STAGE}"
    if interrupted:
        raise KeyboardInterrupt(f"capture interrupted by {interrupted}; recording stopped; {where}")
    if trace_info is not None and trace_info.get("error"):
        raise BootprofError(f"capture: {trace_info['error']}; {where}")
    if exit_code != 0:
        raise BootprofError(f"build command exited with {exit_code} ({len(files)} self-profiles, trace "
                            f"{(trace_info or {}).get('path') or 'none'}; {where})")
    return summary


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the build is ended and the recording stopped."""


def _sigterm(signum, frame):
    raise _Terminated()


def _stop(recording, run_dir: Path, log: list[dict]) -> dict[str, Any]:
    """Stop the recording (always), move the complete trace into place; what happened, for the manifest."""
    from pipeline.decode import ETL, sniff

    partial, final = run_dir / PARTIAL_TRACE, run_dir / TRACE
    info: dict[str, Any] = {"stopped": False, "path": None, "size": None}
    # (Ctrl-C while the tool stops would leave a kernel logger running: finish the stop first.)
    with _deferred_sigint():
        stopped = _call(recording.stop, log)
        if stopped.returncode != 0:
            _call(recording.cancel, log)
        for cmd in recording.after:
            _call(cmd, log)
    info["stopped"] = stopped.returncode == 0
    if stopped.returncode != 0:
        info["error"] = (f"`{' '.join(recording.stop)}` failed ({stopped.returncode}): "
                         f"{(stopped.stdout + stopped.stderr).strip()[-500:] or 'no output'}")
        return info
    try:
        kind = sniff(partial)
    except InputError as exc:
        info["error"] = f"the stopped recording is not a usable trace: {exc}"
        return info
    if kind != ETL:
        info["error"] = f"{partial}: the stopped recording is not an ETL trace"
        return info
    portable.replace(partial, final)
    info.update(path=str(final), size=final.stat().st_size)
    return info


class _deferred_sigint:
    """Ignore SIGINT and SIGTERM while the ETW session is stopped: the build has ended already, and an
    interrupted stop would leave a kernel logger running. What arrived is kept in ``pending``."""

    def __enter__(self):
        self.pending, self.saved = [], {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, lambda s, f: self.pending.append(s))
        return self

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        return False
