"""The simulated build over time: the process tree of a stage-2 rustc bootstrap (python -> a cargo per phase ->
a build script and a rustc per crate -> link.exe) scheduled onto CPUs, with the images it loads and the stack
pools its CPU time draws from. Everything here is a plain description (numbers, names, numpy arrays) drawn from
one seeded generator; the names come from ``catalog.py``, the call stacks from ``stacks.py``, and ``writer.py``
turns the workload into ETL bytes and ``truth.py`` into the expected answers.

Time is in raw QPC ticks (10 MHz). Tick classes keep stack association unambiguous: samples sit
on ticks = 0 (mod 4), heap and VirtualAlloc events on 2 (mod 4), a stack record one tick after its
event, and every generation window ends on a multiple of 4 (see ``writer.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pipeline.synth import layout as L
from pipeline.synth.catalog import (LINKED_KINDS, PHASES, PYTHON_CMDLINE, Catalog, Crate, Phase, build_catalog,
                                    build_script_image, cargo_cmdline, extern_args, link_cmdline, rustc_cmdline,
                                    seeded_hash)
from pipeline.synth.stacks import Pools, Stacks, build_script_stacks, build_stacks

SAMPLE_PERIOD = L.PERF_FREQ // 1000        # 1 kHz per CPU
MARGIN = 200                               # ticks between a process edge and its first/last sample
HEAP_RATE = 300                            # heap operations per second of rustc CPU time
VA_RATE = 40                               # VirtualAlloc calls per second of rustc CPU time
SYSTEM_DLLS = ("ntdll.dll", "kernel32.dll", "KernelBase.dll", "ucrtbase.dll", "vcruntime140.dll")

#: Run-to-run noise by size, fitted to real rustc builds on a 2-core VM (``scripts/real_history.py``,
#: ``bench/HISTORY.md``): a job of ``s`` seconds varies by ``sqrt(noise^2 + (NOISE_ABSOLUTE_S / s)^2)`` (relative
#: standard deviation of one run; 0.08 and 0.023 s fit there), the whole machine by ``noise`` a night. A job's
#: seconds: its weight against the median rustc job's, which stands for ``MEDIAN_JOB_S`` of a real build.
NOISE_ABSOLUTE_S = 0.023
MEDIAN_JOB_S = 1.0


# ------------------------------------------------------------------------------------------------
# What the schedule makes
# ------------------------------------------------------------------------------------------------
@dataclass
class Proc:
    pid: int
    ppid: int
    name: str
    cmdline: str
    start: int                      # raw ticks
    end: int
    tids: list[int]
    images: list[int]               # image indices loaded at start
    kind: str                       # python | cargo | rustc | link | build
    cpu: int                        # CPU its events are logged on
    stage: str = "stage0"
    rundown: bool = False           # running before the trace started (DCStart) / after it stopped (DCEnd)
    crate: str | None = None
    #: The crates of the same phase whose libraries this rustc reads (``--extern``): each ended before it started;
    #: the first is the one that ended last (what it waited for).
    externs: list[str] = field(default_factory=list)
    index: int = 0                  # position in Workload.procs
    work: float = 1.0               # its work relative to the original build (a re-run's noise, an injected change)


@dataclass
class Segment:
    """A lane (CPU) runs ``proc`` with thread ``tids`` and stack pool ``pool`` in [start, end)."""

    cpu: int
    start: int
    end: int
    proc: int
    pool: str


@dataclass
class Workload:
    cpus: int
    pointer_size: int
    t0: int                                    # raw timestamp of the logfile header event
    t_end: int                                 # last event tick
    catalog: Catalog
    ids: dict[str, int]
    stacks: Stacks
    pools: Pools
    procs: list[Proc]
    segments: list[Segment]
    duration_s: float = 0.0                    # simulated duration the schedule was scaled to


# ------------------------------------------------------------------------------------------------
# Jobs and re-runs
# ------------------------------------------------------------------------------------------------
class Job(NamedTuple):
    """A process cargo runs for a crate: its build script or its rustc."""

    phase: int                      # index into PHASES
    kind: str                       # build | rustc
    crate: Crate
    weight: float                   # nominal work: the crate's weight, drawn around it (a re-run's factor applied)
    work: float = 1.0               # relative to the original build (Rerun)


def _jobs(rng) -> list[Job]:
    jobs = []
    for k, phase in enumerate(PHASES):
        for crate in phase.crates:
            if "build" in crate.kind:
                jobs.append(Job(k, "build", crate, 0.3 * float(rng.uniform(0.5, 1.5))))
            jobs.append(Job(k, "rustc", crate, crate.weight * float(rng.uniform(0.6, 1.4))))
    return jobs


def _makespan(jobs: list[Job], cpus: int) -> float:
    """Length of the list schedule in weight units, phase after phase; with more CPUs than the build can use,
    lanes idle."""
    nominal = 0.0
    for k in range(len(PHASES)):
        lanes = np.zeros(cpus)
        for job in (j for j in jobs if j.phase == k):
            lanes[int(np.argmin(lanes))] += job.weight
        nominal += float(lanes.max())
    return nominal


@dataclass(frozen=True)
class Rerun:
    """A re-run of the build (``SynthConfig.rerun``, ``noise``, ``inject``): each job's work is scaled by its own
    noise (larger for a smaller job, ``NOISE_ABSOLUTE_S``), the machine's, and the injected factors of its crate;
    the trace's size target only sets the time scale of the original build, so a slower re-run takes longer
    instead of being scaled back."""

    index: int = 0
    noise: float = 0.0
    crates: tuple[tuple[str, float], ...] = ()

    def factors(self, seed: int, jobs: list[Job]) -> np.ndarray:
        out = np.ones(len(jobs))
        if self.index:
            rng = np.random.default_rng([seed, 101, self.index])
            weights = np.array([j.weight for j in jobs])
            median = float(np.median([j.weight for j in jobs if j.kind == "rustc"] or [1.0]))
            seconds = weights / median * MEDIAN_JOB_S
            spread = np.sqrt(self.noise ** 2 + (NOISE_ABSOLUTE_S / seconds) ** 2) if self.noise else np.zeros(len(jobs))
            out *= np.exp(rng.normal(0.0, self.noise)) * np.exp(rng.normal(0.0, 1.0, len(jobs)) * spread)
        for crate, factor in self.crates:
            out *= np.array([factor if j.kind == "rustc" and j.crate.name == crate else 1.0 for j in jobs])
        return out

    def apply(self, seed: int, jobs: list[Job]) -> list[Job]:
        return [j._replace(weight=j.weight * f, work=f) for j, f in zip(jobs, self.factors(seed, jobs))]


# ------------------------------------------------------------------------------------------------
# The schedule
# ------------------------------------------------------------------------------------------------
def build_workload(seed: int, cpus: int, p: int, target_bytes: int, stack_caching: bool = False,
                   stack_variety: int | None = None, rerun: Rerun = Rerun()) -> Workload:
    """Schedule the build so that the trace comes out near ``target_bytes``: a first pass with an
    estimated duration, then a second one scaled by what the first pass's schedule would write.
    ``stack_variety`` multiplies the call-stack templates (default: 1 to 8 by size). ``rerun`` changes the work
    of the jobs after the time scale is set (the original build's)."""
    w = _build(seed, cpus, p, target_bytes, stack_caching, None, stack_variety)
    per_busy_s, idle_sample = _bytes_per_cpu_second(w.stacks, p, stack_caching)
    per_idle_s = 1000 * idle_sample
    span_s = (w.t_end - w.t0) / L.PERF_FREQ
    busy_s = sum(s.end - s.start for s in w.segments) / L.PERF_FREQ
    estimate = busy_s * per_busy_s + max(0.0, cpus * span_s - busy_s) * per_idle_s
    # bytes that do not scale with time: process/thread/image records with their ImageID/DbgID, heap
    # snapshots, and the part-filled last buffer of every CPU in each of the (at least 3) windows
    fixed = sum(600 * len(q.images) + 250 * len(q.tids) + 1200 for q in w.procs) + \
        sum(12_000 for q in w.procs if q.kind == "rustc") + 3 * cpus * 32_768
    scaled = max(target_bytes - fixed, target_bytes / 4)
    return _build(seed, cpus, p, target_bytes, stack_caching, w.duration_s * scaled / max(estimate, 1.0),
                  stack_variety, rerun)


def _bytes_per_cpu_second(st: Stacks, p: int, stack_caching: bool) -> tuple[float, int]:
    """Trace bytes per second of a busy CPU (one sample, profile + stack, per ms plus heap and VirtualAlloc
    events), and per sample of an idle CPU."""
    mean_frames = int(np.mean([len(f) for f in st.frames]))
    # (with stack caching an event carries a 24-byte key reference; definitions are few)
    per_stack = L.aligned(16 + 16 + p) if stack_caching else L.aligned(16 + 16 + p * mean_frames)
    per_sample = 32 + per_stack
    per_cpu_second = 1000 * per_sample + (HEAP_RATE + VA_RATE) * (40 + per_stack + 6 * p * (not stack_caching))
    idle_sample = 32 + (L.aligned(16 + 16 + p) if stack_caching else L.aligned(16 + 16 + 4 * p))
    return per_cpu_second, idle_sample


def _build(seed: int, cpus: int, p: int, target_bytes: int, stack_caching: bool, duration: float | None,
           stack_variety: int | None = None, rerun: Rerun = Rerun()) -> Workload:
    """One pass: the machine's images and stacks, then the jobs scheduled over ``duration`` seconds (None: an
    estimate from ``target_bytes``). The generator's draws come in a fixed order: images, stacks, build
    scripts, the trace's start, the order of fresh process ids, the jobs' weights, the schedule."""
    rng = np.random.default_rng(seed)
    scale = stack_variety or int(np.clip(target_bytes // (64 << 20), 1, 8))
    cat, ids = build_catalog(rng, p)
    st, pools = build_stacks(rng, cat, ids, scale)
    build_imgs = {}                 # crate -> the image of its build script (the first phase that builds it)
    for phase in PHASES:
        for crate in phase.crates:
            if "build" in crate.kind and crate.name not in build_imgs:
                img = build_script_image(rng, cat, crate.name, phase.name, p)
                build_script_stacks(rng, cat, st, pools, ids, img, f"build/{crate.name}")
                build_imgs[crate.name] = img
    t0 = 40_000_000 + int(rng.integers(0, 1_000_000)) * 4
    pids = _Ids(rng)
    jobs = _jobs(rng)
    nominal = _makespan(jobs, cpus)
    if duration is None:
        per_cpu_second, idle_sample = _bytes_per_cpu_second(st, p, stack_caching)
        busy = sum(j.weight for j in jobs) / nominal            # mean busy CPUs
        rate = busy * per_cpu_second + max(0.0, cpus - busy) * 1000 * idle_sample
        duration = target_bytes / (rate * 1.1)
    duration_s = max(0.5, duration)
    if rerun != Rerun():
        jobs = rerun.apply(seed, jobs)
    sched = _Scheduler(rng, pids, cat, ids, build_imgs, cpus, unit=(duration_s * L.PERF_FREQ) / (nominal * 1.25))
    t_end = sched.run(seed, t0, jobs)
    procs, segments = sched.ordered()
    return Workload(cpus=cpus, pointer_size=p, t0=t0, t_end=t_end, catalog=cat, ids=ids, stacks=st,
                    pools=pools, procs=procs, segments=segments, duration_s=duration_s)


class _Ids:
    """Process and thread ids as Windows hands them out: fresh ones, and now and then the id of a process or
    thread that exited a while before, so that the decoder must map an id to its process by time."""

    PID_REUSE = 0.12                # chance that a new process gets an old id
    TID_REUSE = 0.15                # chance, per thread, that a new thread does
    REUSE_AFTER = 100_000           # ticks an id rests after its exit

    def __init__(self, rng):
        self.rng = rng
        self.fresh = iter(rng.permutation(np.arange(1000, 40000, 4)).tolist())
        self.next_tid = 60000
        self.exited_pids: list[tuple[int, int]] = []     # (pid, exit time), oldest first
        self.exited_tids: list[tuple[int, int]] = []     # (tid, exit time)

    def fresh_pid(self) -> int:
        return int(next(self.fresh))

    def pid(self, at: int) -> int:
        """A process id for a process starting at ``at``: now and then the oldest one free again."""
        if self.rng.random() < self.PID_REUSE:
            for i, (pid, when) in enumerate(self.exited_pids):
                if when + self.REUSE_AFTER < at:
                    self.exited_pids.pop(i)
                    return pid
        return self.fresh_pid()

    def tids(self, n: int, at: int = 0) -> list[int]:
        """Thread ids for a process starting at ``at``."""
        out = []
        for _ in range(n):
            i = next((k for k, (_, when) in enumerate(self.exited_tids) if when + self.REUSE_AFTER < at), None)
            if i is not None and self.rng.random() < self.TID_REUSE:
                out.append(self.exited_tids.pop(i)[0])
            else:
                out.append(self.next_tid)
                self.next_tid += 4 * int(self.rng.integers(1, 6))
        return out

    def exit(self, q: Proc) -> None:
        self.exited_pids.append((q.pid, q.end))
        self.exited_tids.extend((tid, q.end) for tid in q.tids)


class _Scheduler:
    """Lays the jobs out phase after phase: cargo resolves on CPU 0, then each job starts on the CPU that comes
    free first; the processes in the order they started, and the segments of CPU time they run."""

    def __init__(self, rng, pids: _Ids, cat: Catalog, ids: dict[str, int], build_imgs: dict[str, int], cpus: int,
                 unit: float):
        self.rng, self.pids, self.cat, self.ids, self.build_imgs = rng, pids, cat, ids, build_imgs
        self.sys_images = [ids[n] for n in SYSTEM_DLLS]
        self.cpus = cpus
        self.unit = unit            # ticks per nominal weight unit
        self.procs: list[Proc] = []
        self.segments: list[Segment] = []

    def start(self, q: Proc) -> Proc:
        q.index = len(self.procs)
        self.procs.append(q)
        return q

    def runs(self, q: Proc, cpu: int, start: int, end: int, pool: str) -> None:
        self.segments.append(Segment(cpu, start, end, q.index, pool))

    def run(self, seed: int, t0: int, jobs: list[Job]) -> int:
        """Schedule every job; returns the trace's last tick."""
        python = self.start(Proc(pid=self.pids.fresh_pid(), ppid=self.pids.fresh_pid(), name="python.exe",
                                 cmdline=PYTHON_CMDLINE, start=t0 - 30_000_000, end=0, tids=self.pids.tids(2),
                                 images=[self.ids["python.exe"]] + self.sys_images, kind="python", cpu=0,
                                 rundown=True))
        t = t0 + 20_000
        lane_free = np.full(self.cpus, t, dtype=np.int64)
        for k, phase in enumerate(PHASES):
            gap = max(t, int(lane_free.max()))
            t = gap + 200_000
            self.runs(python, 0, gap + MARGIN, t - MARGIN, "python")
            cargo = self.start(Proc(pid=self.pids.pid(t), ppid=python.pid, name="cargo.exe",
                                    cmdline=cargo_cmdline(phase, self.cpus), start=t, end=0, tids=self.pids.tids(3, t),
                                    images=[self.ids["cargo.exe"]] + self.sys_images, kind="cargo", cpu=0,
                                    stage=phase.stage))
            resolve = int(0.02 * self.unit * 10) + 20_000
            self.runs(cargo, 0, t + MARGIN, t + resolve - MARGIN, "cargo")
            lane_free[:] = t + resolve
            for job in (j for j in jobs if j.phase == k):
                c = int(np.argmin(lane_free))
                s = int(lane_free[c]) + 4 * int(self.rng.integers(200, 4000))
                dur = max(4 * MARGIN + 8 * SAMPLE_PERIOD, int(job.weight * self.unit))
                if job.kind == "build":
                    self._build_script(job, phase, cargo, c, s, dur)
                else:
                    self._rustc(job, phase, cargo, c, s, dur)
                lane_free[c] = s + dur
            link_phase(seed, k, phase, [q for q in self.procs if q.kind == "rustc" and q.ppid == cargo.pid])
            cargo.end = int(lane_free.max()) + 4 * 500
            self.pids.exit(cargo)
            t = cargo.end
        t_end = t + 40_000
        python.end = t_end + 10_000_000       # still running when the trace stops (DCEnd)
        self.runs(python, 0, t + MARGIN, t_end - MARGIN, "python")
        return t_end

    def _build_script(self, job: Job, phase: Phase, cargo: Proc, c: int, s: int, dur: int) -> None:
        img = self.build_imgs[job.crate.name]
        cmdline = self.cat.images[img].path.replace("\\Device\\HarddiskVolume3\\", "C:\\")
        pr = self.start(Proc(pid=self.pids.pid(s), ppid=cargo.pid, name="build-script-build.exe", cmdline=cmdline,
                             start=s, end=s + dur, tids=self.pids.tids(1, s),
                             images=[img] + self.sys_images, kind="build", cpu=c, stage=phase.stage,
                             crate=job.crate.name))
        self.runs(pr, c, s + MARGIN, s + dur - MARGIN, f"build/{job.crate.name}")
        self.pids.exit(pr)

    def _rustc(self, job: Job, phase: Phase, cargo: Proc, c: int, s: int, dur: int) -> None:
        """The rustc of a crate: its main thread's analyses, then codegen; a dylib or binary is linked by a
        link.exe child in the rustc's last fifth."""
        stage, crate = phase.stage, job.crate
        h = seeded_hash(phase.name, crate.name)
        pr = self.start(Proc(pid=self.pids.pid(s), ppid=cargo.pid, name="rustc.exe",
                             cmdline=rustc_cmdline(crate, phase, h), start=s, end=s + dur,
                             tids=self.pids.tids(int(self.rng.integers(2, 5)), s),
                             images=[self.ids[f"rustc.exe/{stage}"], self.ids[f"rustc_driver/{stage}"],
                                     self.ids[f"std/{stage}"]] + self.sys_images,
                             kind="rustc", cpu=c, stage=stage, crate=crate.name, work=job.work))
        link = crate.kind in LINKED_KINDS
        compute_end = s + int(dur * (0.8 if link else 1.0))
        split = s + int((compute_end - s) * 0.6)
        self.runs(pr, c, s + MARGIN, split, f"rustc_main/{stage}")
        self.runs(pr, c, split, compute_end - MARGIN, f"rustc_codegen/{stage}")
        if link:
            ls, le = compute_end + 4 * 50, s + dur - 4 * 100
            lk = self.start(Proc(pid=self.pids.pid(ls), ppid=pr.pid, name="link.exe",
                                 cmdline=link_cmdline(crate, phase, h), start=ls, end=le, tids=self.pids.tids(1, ls),
                                 images=[self.ids["link.exe"]] + self.sys_images, kind="link", cpu=c, stage=stage,
                                 crate=crate.name))
            self.runs(lk, c, ls + MARGIN, le - MARGIN, "link")
            self.pids.exit(lk)
        self.pids.exit(pr)

    def ordered(self) -> tuple[list[Proc], list[Segment]]:
        """The processes by start time (``index`` their position) and the segments by CPU and start."""
        started = list(self.procs)
        procs = sorted(started, key=lambda q: (q.start, q.pid))
        for i, q in enumerate(procs):
            q.index = i
        for seg in self.segments:
            seg.proc = started[seg.proc].index
        return procs, sorted(self.segments, key=lambda s: (s.cpu, s.start))


def link_phase(seed: int, k: int, phase: Phase, rustcs: list[Proc]) -> None:
    """A dependency graph the phase's schedule keeps: each rustc reads (``--extern``) the library of the crate of its
    phase that ended last before it started, and now and then one more that ended before it; its command line names
    them by the files they wrote (``--out-dir``, ``lib<crate><extra-filename>.rlib``). Its own generator: the
    schedule's random numbers stay as they were."""
    rng = np.random.default_rng([seed, 43, k])
    for pr in sorted(rustcs, key=lambda q: q.start):
        done = sorted((q for q in rustcs if q.end <= pr.start and q.crate != pr.crate), key=lambda q: -q.end)
        if not done:
            continue
        pr.externs = [done[0].crate]
        if len(done) > 1 and rng.random() < 0.5:
            pr.externs.append(done[1 + int(rng.integers(0, len(done) - 1))].crate)
        pr.cmdline += extern_args(phase, pr.externs)
