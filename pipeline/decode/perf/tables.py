"""Layer 3 of the perf.data decoder: the records (:mod:`.records`) as the ``decoded/`` tables the later stages read
(``schema.md`` beside this file says what each column means for perf).

Processes and threads come from FORK, COMM and EXIT in time order; images from MMAP/MMAP2, with what a fork and
an exec do to an address space (a child starts with its parent's mappings, an exec ends them all); samples from
PERF_RECORD_SAMPLE, their callchains deduplicated into ``stacks`` with the ETL decoder's stack ids (equal frame
lists have equal ids whichever decoder wrote them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.decode.perf import kernels as K
from pipeline.decode.perf import layout as L
from pipeline.decode.perf.records import Records, Tasks

#: pid of the kernel's images in ``images`` (the group symbolize looks kernel addresses up in).
KERNEL_PID = 0
#: perf's pid of kernel mmaps (-1 as u32).
PERF_KERNEL_PID = 0xFFFFFFFF
#: Lowest kernel address on x86-64 and arm64 (48-bit address spaces): a sample above it with no kernel mmap in the
#: file is attributed to the ``[kernel]`` image that covers the upper half.
KERNEL_SPACE = np.uint64(0xFFFF800000000000)
#: The most mappings forked children may start with, all together (each copies its parent's live ones, and only a
#: child that may run before an exec needs them: ``_runs_before_exec``). A real build is far below it; a few hundred
#: KB of made-up MMAP and FORK records could otherwise ask for their product (2,000 x 2,000: 4 M rows, 1.4 GB).
INHERITED_MAX = 1_000_000
KERNEL_NAME = "[kernel.kallsyms]"

U32, I32, I64, U64, U16, STR = pa.uint32(), pa.int32(), pa.int64(), pa.uint64(), pa.uint16(), pa.string()


def origin(tk: Tasks, sample_min: int) -> int:
    """The raw time that ``timestamp_ns`` 0 stands for: the earliest time of a record that has one (perf's own
    records made before the recording started, and the kernel's mmap, carry time 0); ``sample_min``: the earliest
    nonzero time of a sample (0 when none has one)."""
    times = [tk.tasks[:, K.T_TIME], tk.mmaps[:, K.M_TIME], np.array([sample_min], np.int64)]
    nonzero = [t[t > 0] for t in times if len(t)]
    nonzero = [t for t in nonzero if len(t)]
    return int(min(t.min() for t in nonzero)) if nonzero else 0


def _ns(raw: int, t0: int) -> int | None:
    """``timestamp_ns`` of a raw time; None for time 0 (made before the recording started)."""
    return raw - t0 if raw > 0 else None


@dataclass
class _Process:
    pid: int
    parent_pid: int | None
    name: str
    start: int          # raw time, 0 = before the recording
    first: int
    last: int
    end: int = 0
    key: int = 0
    exec_name: str | None = None


@dataclass
class _Thread:
    pid: int
    tid: int
    name: str
    start: int
    first: int
    last: int
    end: int = 0


@dataclass
class Lifetimes:
    processes: list[_Process] = field(default_factory=list)
    threads: list[_Thread] = field(default_factory=list)
    #: (pid, raw time, parent pid) of each new process (FORK of a thread-group leader)
    forks: list[tuple[int, int, int]] = field(default_factory=list)
    #: (pid, raw time) of each exec (COMM with MISC_COMM_EXEC)
    execs: list[tuple[int, int]] = field(default_factory=list)


def lifetimes(tk: Tasks, seen: list[tuple[int, int, int]]) -> Lifetimes:
    """Process and thread instances from the task records (FORK, COMM, EXIT) in time order, record order among
    equal times. A FORK whose new thread leads its group (pid = tid) starts a process instance (a pid seen again
    ends the one before); other FORKs start threads; a COMM names its thread (and the process, for its leader);
    an EXIT ends the thread, and the process when the leader exits. Processes and threads that samples or mmaps
    name but no task record does get instances with unknown start (``seen``: :func:`firsts` of the samples)."""
    t = tk.tasks
    order = np.lexsort((t[:, K.T_REC], t[:, K.T_TIME]))
    out = Lifetimes()
    procs: dict[int, _Process] = {}
    threads: dict[int, _Thread] = {}

    def process(pid: int, time: int) -> _Process:
        p = procs.get(pid)
        if p is None:
            p = procs[pid] = _Process(pid, None, "", 0, time, time, key=len(out.processes))
            out.processes.append(p)
        p.first = min(p.first, time) if p.first else time
        p.last = max(p.last, time)
        return p

    def thread(pid: int, tid: int, time: int) -> _Thread:
        th = threads.get(tid)
        if th is None or th.pid != pid:
            th = threads[tid] = _Thread(pid, tid, "", 0, time, time)
            out.threads.append(th)
        th.first = min(th.first, time) if th.first else time
        th.last = max(th.last, time)
        return th

    for i in order.tolist():
        kind, misc, time = int(t[i, K.T_TYPE]), int(t[i, K.T_MISC]), int(t[i, K.T_TIME])
        pid, tid = int(t[i, K.T_PID]), int(t[i, K.T_TID])
        if kind == L.RECORD_FORK:
            ppid = int(t[i, K.T_PPID])
            if pid == tid and pid != ppid:
                parent = procs.get(ppid)
                old = procs.pop(pid, None)
                if old is not None and not old.end:
                    old.end = time
                p = process(pid, time)
                p.parent_pid, p.start, p.name = ppid, time, parent.name if parent else ""
                out.forks.append((pid, time, ppid))
            else:
                process(pid, time)
            old_thread = threads.pop(tid, None)
            if old_thread is not None and not old_thread.end:
                old_thread.end = time
            th = thread(pid, tid, time)
            th.start = time
            parent_thread = threads.get(int(t[i, K.T_PTID]))
            th.name = parent_thread.name if parent_thread else procs[pid].name
        elif kind == L.RECORD_COMM:
            name = tk.task_names[i] or ""
            p = process(pid, time)
            thread(pid, tid, time).name = name
            if misc & L.MISC_COMM_EXEC:
                p.exec_name = name
                out.execs.append((pid, time))
            if pid == tid:
                p.name = name
        elif kind == L.RECORD_EXIT:
            th = thread(pid, tid, time)
            th.end = time
            if pid == tid:
                process(pid, time).end = time
    # processes and threads named only by samples and mmaps
    for pid, tid, time in seen:
        if pid not in procs:
            process(pid, time)
        if tid not in threads:
            thread(pid, tid, time)
    return out


def firsts(pid: np.ndarray, tid: np.ndarray, time: np.ndarray) -> list[tuple[int, int, int]]:
    """(pid, tid, time of the first) of each distinct (pid, tid), by (pid, tid): of a part's samples in record
    order, or of the parts' firsts in file order."""
    if len(pid) == 0:
        return []
    keys = np.stack([pid, tid], axis=1)
    uniq, first = np.unique(keys, axis=0, return_index=True)
    return [(int(p), int(t), int(time[f])) for (p, t), f in zip(uniq.tolist(), first.tolist())]


def processes_table(life: Lifetimes, t0: int) -> pa.Table:
    ps = life.processes
    return pa.table({
        "pid": pa.array([p.pid for p in ps], U32),
        "parent_pid": pa.array([p.parent_pid for p in ps], U32),
        "image_name": pa.array([p.exec_name or p.name for p in ps], STR),
        "command_line": pa.array([None] * len(ps), STR),
        "start_ns": pa.array([_ns(p.start, t0) for p in ps], I64),
        "end_ns": pa.array([_ns(p.end, t0) for p in ps], I64),
        "session": pa.array([None] * len(ps), U32),
        "exit_status": pa.array([None] * len(ps), I32),
        "unique_process_key": pa.array([p.key for p in ps], U64),
        "flags": pa.array([0] * len(ps), U32),
        "start_timestamp": pa.array([p.start or None for p in ps], I64),
        "end_timestamp": pa.array([p.end or None for p in ps], I64),
        "first_seen_ns": pa.array([_ns(p.first, t0) for p in ps], I64),
        "last_seen_ns": pa.array([_ns(p.last, t0) for p in ps], I64),
    })


def threads_table(life: Lifetimes, t0: int) -> pa.Table:
    ts = life.threads
    return pa.table({
        "pid": pa.array([t.pid for t in ts], U32),
        "tid": pa.array([t.tid for t in ts], U32),
        "start_ns": pa.array([_ns(t.start, t0) for t in ts], I64),
        "end_ns": pa.array([_ns(t.end, t0) for t in ts], I64),
        "win32_start_addr": pa.array([0] * len(ts), U64),
        "thread_name": pa.array([t.name for t in ts], STR),
        "start_timestamp": pa.array([t.start or None for t in ts], I64),
        "end_timestamp": pa.array([t.end or None for t in ts], I64),
        "first_seen_ns": pa.array([_ns(t.first, t0) for t in ts], I64),
        "last_seen_ns": pa.array([_ns(t.last, t0) for t in ts], I64),
    })


@dataclass
class _Image:
    pid: int
    base: int
    size: int
    pgoff: int
    file_name: str
    load: int                   # raw time, 0 = before the recording
    unload: int = 0
    build_id: str | None = None
    inherited: bool = False


def _runs_before_exec(life: Lifetimes):
    """``needs(pid, fork_time)``: whether a child forked then may run its parent's code: it never execs, or forks
    children of its own before its exec. Only then are its parent's mappings, which the exec ends, of use (the images
    are made before the samples are read, for the unwind: a sample in the moment between a fork and its exec stays
    without an image). A build's children exec at once (cargo starting rustc), so most forks copy nothing."""
    execs: dict[int, list[int]] = {}
    for pid, time in life.execs:
        execs.setdefault(pid, []).append(time)
    forks_by: dict[int, list[int]] = {}
    for _pid, time, ppid in life.forks:
        forks_by.setdefault(ppid, []).append(time)

    def needs(pid: int, start: int) -> bool:
        stop = min((t for t in execs.get(pid, ()) if t >= start), default=None)
        return stop is None or any(start <= t < stop for t in forks_by.get(pid, ()))

    return needs


def images_table(rec: Tasks, life: Lifetimes, t0: int) -> tuple[pa.Table, int, int]:
    """One row per mapping of an executable file in a process: MMAP/MMAP2 records, plus each mapping a forked
    child starts with (its parent's, at the fork), each ended by the process's exec or exit. Kernel mmaps (perf's
    pid -1) go to pid 0. Returns the table, how many rows were inherited, and how many were not, past
    ``INHERITED_MAX``."""
    build_ids = {b.filename: b.build_id for b in rec.header.build_ids}
    m, a = rec.mmaps, rec.mmap_addrs
    order = np.lexsort((m[:, K.M_REC], m[:, K.M_TIME]))
    by_pid: dict[int, list[_Image]] = {}
    rows: list[_Image] = []
    events: list[tuple[int, int, int, int]] = []     # (time, kind 0 map / 1 fork / 2 exec, index, 0)
    for i in order.tolist():
        events.append((int(m[i, K.M_TIME]), 0, i, 0))
    for k, (pid, time, _ppid) in enumerate(life.forks):
        events.append((time, 1, k, 0))
    for k, (pid, time) in enumerate(life.execs):
        events.append((time, 2, k, 0))
    ends = {p.pid: p.end for p in life.processes}
    needs = _runs_before_exec(life)
    kernel_seen = False
    inherited = refused = 0
    for time, kind, i, _ in sorted(events):
        if kind == 0:
            if m[i, K.M_MISC] & L.MISC_MMAP_DATA:      # (a data mapping: no code runs there)
                continue
            pid = int(m[i, K.M_PID])
            name = rec.mmap_names[i]
            addr, length, pgoff = int(a[i, K.M_ADDR]), int(a[i, K.M_LEN]), int(a[i, K.M_PGOFF])
            kernel = pid == PERF_KERNEL_PID
            if kernel:
                kernel_seen = True
                pid, pgoff = KERNEL_PID, 0      # (a kernel mmap's pgoff is the address of its reference symbol)
                if name.startswith(KERNEL_NAME):
                    name = KERNEL_NAME
            if length == 0 or addr + length > 1 << 64:
                continue
            img = _Image(pid, addr, length, pgoff, name, time, build_id=rec.mmap_build_ids[i] or build_ids.get(name))
            by_pid.setdefault(pid, []).append(img)
            rows.append(img)
        elif kind == 1:
            pid, _t, ppid = life.forks[i]
            for old in by_pid.get(pid, []):
                old.unload = old.unload or time
            live = [x for x in by_pid.get(ppid, []) if not x.unload] if needs(pid, time) else []
            if inherited + len(live) > INHERITED_MAX:
                refused += len(live)    # (the child starts with no image: its samples before an exec stay unmapped)
                live = []
            copies = [_Image(pid, x.base, x.size, x.pgoff, x.file_name, time, build_id=x.build_id,
                             inherited=True) for x in live]
            inherited += len(copies)
            by_pid[pid] = copies
            rows.extend(copies)
        else:
            pid, _t = life.execs[i]
            for old in by_pid.get(pid, []):
                if not old.unload and old.load <= time:
                    old.unload = time
    for img in rows:
        end = ends.get(img.pid, 0)
        if not img.unload and end and img.pid != KERNEL_PID:
            img.unload = end
    if not kernel_seen:
        rows.append(_Image(KERNEL_PID, int(KERNEL_SPACE), (1 << 64) - int(KERNEL_SPACE), 0, "[kernel]", 0))
    table = pa.table({
        "pid": pa.array([r.pid for r in rows], U32),
        "base": pa.array([r.base for r in rows], U64),
        "size": pa.array([r.size for r in rows], U64),
        "file_name": pa.array([r.file_name for r in rows], STR),
        "load_ns": pa.array([_ns(r.load, t0) for r in rows], I64),
        "unload_ns": pa.array([_ns(r.unload, t0) for r in rows], I64),
        "checksum": pa.array([0] * len(rows), U32),
        "time_date_stamp": pa.array([0] * len(rows), U32),
        "load_timestamp": pa.array([r.load or None for r in rows], I64),
        "unload_timestamp": pa.array([r.unload or None for r in rows], I64),
        "first_seen_ns": pa.array([_ns(r.load, t0) for r in rows], I64),
        "last_seen_ns": pa.array([_ns(r.unload or r.load, t0) for r in rows], I64),
        "pgoff": pa.array([r.pgoff for r in rows], U64),
        "build_id": pa.array([r.build_id for r in rows], STR),
        "inherited": pa.array([r.inherited for r in rows], pa.bool_()),
    })
    return table, inherited, refused


def part_stacks(rec: Records) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """The stack id of each of a part's samples, whether it has a stack, and the part's distinct callchains: one
    row per distinct (stack id, check value), with the record index of its first sample (``first_rec``), its
    frames and depth (the ETL decoder's stack ids: equal frame lists have equal ids whichever decoder wrote
    them)."""
    from pipeline.decode.etl.kernels import hash_frame_lists, stack_ids

    s = rec.samples
    n = len(s)
    counts = s[:, K.S_FRAMES]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    h1 = np.zeros(n, np.uint64)
    h2 = np.zeros(n, np.uint64)
    cnt = np.zeros(n, np.int64)
    hash_frame_lists(offsets, rec.frames, h1, h2, cnt)
    sid = np.zeros(n, np.int64)
    check = np.zeros(n, np.uint64)
    stack_ids(h1, h2, cnt, sid, check)
    has_stack = counts > 0 if rec.layout.sample_type & L.SAMPLE_CALLCHAIN else np.zeros(n, bool)
    with_stack = np.flatnonzero(has_stack)
    _, first = np.unique(np.stack([sid[with_stack], check[with_stack].view(np.int64)], axis=1), axis=0,
                         return_index=True)
    rows = with_stack[first]
    frames_list = pa.ListArray.from_arrays(pa.array(_gather_offsets(offsets, rows), pa.int32()),
                                           pa.array(_gather_values(rec.frames, offsets, rows), U64))
    return sid, has_stack, pa.table({"stack_id": pa.array(sid[rows], I64), "check": pa.array(check[rows], U64),
                                     "first_rec": pa.array(s[rows, K.S_REC], I64), "frames": frames_list,
                                     "depth": pa.array(counts[rows].astype(np.int32), I32)})


def stacks_table(pieces: list[pa.Table]) -> tuple[pa.Table, int]:
    """``stacks`` (one row per stack id, by id: the frames of its first sample) from the parts'
    :func:`part_stacks`; and how many distinct callchains shared an id with another (a hash collision: the
    first kept)."""
    t = pa.concat_tables(pieces)
    sid = t.column("stack_id").to_numpy()
    check = t.column("check").to_numpy().view(np.int64)
    order = np.lexsort((t.column("first_rec").to_numpy(), sid))
    keep = order[np.r_[True, sid[order][1:] != sid[order][:-1]]] if len(order) else order
    pairs = len(np.unique(np.stack([sid, check], axis=1), axis=0)) if len(sid) else 0
    return t.take(pa.array(keep)).select(["stack_id", "frames", "depth"]), pairs - len(keep)


def part_samples(rec: Records, sid: np.ndarray, has_stack: np.ndarray) -> pa.Table:
    """A part's samples, in record order, as :func:`samples_table` takes them."""
    s = rec.samples
    return pa.table({"timestamp": pa.array(s[:, K.S_TIME], I64), "stream_pos": pa.array(s[:, K.S_REC], I64),
                     "cpu": pa.array(s[:, K.S_CPU], I64), "tid": pa.array(s[:, K.S_TID].astype(np.uint32), U32),
                     "pid": pa.array(s[:, K.S_PID].astype(np.uint32), U32), "ip": pa.array(rec.ips, U64),
                     "stack_id": pa.array(sid, I64, mask=~has_stack), "period": pa.array(s[:, K.S_PERIOD], I64),
                     "cpumode": pa.array((s[:, K.S_MISC] & L.MISC_CPUMODE_MASK).astype(np.uint8), pa.uint8())})


def samples_table(pieces: list[pa.Table], t0: int) -> pa.Table:
    """``samples`` from the parts' :func:`part_samples`: in time order, record order among equal times."""
    t = pa.concat_tables(pieces).combine_chunks()
    time = t.column("timestamp").to_numpy()
    order = np.lexsort((t.column("stream_pos").to_numpy(), time))
    t = t.take(pa.array(order))
    cpu = t.column("cpu").to_numpy()
    return pa.table({
        "timestamp": t.column("timestamp"),
        "timestamp_ns": pa.array(time[order] - t0, I64),
        "cpu": pa.array(np.where(cpu >= 0, cpu, 0).astype(np.uint16), U16),
        "tid": t.column("tid"), "pid": t.column("pid"), "ip": t.column("ip"), "stack_id": t.column("stack_id"),
        "stream_pos": t.column("stream_pos"), "period": t.column("period"), "cpumode": t.column("cpumode"),
    })


def _gather_offsets(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    lengths = offsets[rows + 1] - offsets[rows]
    out = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out.astype(np.int32)


def _gather_values(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    if len(rows) == 0:
        return np.zeros(0, np.uint64)
    lengths = offsets[rows + 1] - offsets[rows]
    starts = np.repeat(offsets[rows], lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return values[starts + within]
