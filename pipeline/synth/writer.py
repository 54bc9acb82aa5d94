"""Turn a workload into an ETL file.

The trace is generated window by window (a fixed span of simulated time). Each window's records
are merged per CPU in (timestamp, rank) order, packed greedily into 64 KiB buffers (a CPU's last
buffer of a window is flushed partly filled, as ETW's flush timer does), optionally XPRESS
compressed, and written in flush order (last timestamp of each buffer), so buffers of different
CPUs interleave in time. Buffer 0 is the short header buffer of a relogged file; its logfile
header is rewritten at the end with the final buffer count and end time.

With stack caching, every stack reference of a window gets a key (slot numbers in order of first
use, so keys are reused for other stacks in later windows) and the key definitions are written as
KeyDelete records at the window's last tick (KeyRundown in the last window): each reference
resolves to the first definition at or after it.
"""

from __future__ import annotations

import numba
import numpy as np

from pipeline.synth import layout as L
from pipeline.synth import xpress
from pipeline.synth.activity import Samples, samples_in
from pipeline.synth.records import (KINDS, RANK_DBGID, RANK_IMAGE_ID, RANK_KEY_DEF, RANK_STACK, Batch, OneOff,
                                    ansiz, fixed_batch, stack_batch, utf16z)
from pipeline.synth.workload import Workload

FILETIME_START = 134_100_000_000_000_000     # 2025-12-12 08:00 UTC in 100 ns units since 1601
FILETIME_DAY = 864_000_000_000


def start_filetime(rerun: int) -> int:
    """When the build was recorded: re-run K a day after re-run K - 1, as nightly builds are."""
    return FILETIME_START + rerun * FILETIME_DAY
WINDOW_BYTES = 24 << 20                      # target bytes of one generation window


@numba.njit(cache=True, nogil=True)
def gather(blob, off, length, order, out):
    o = 0
    for i in order:
        n = length[i]
        out[o:o + n] = blob[off[i]:off[i] + n]
        o += n


@numba.njit(cache=True, nogil=True)
def pack_buffers(lengths, cpus, capacity):
    """Greedy packing of per-CPU record runs into buffers; returns the buffer number of each record."""
    n = lengths.shape[0]
    buf = np.empty(n, np.int64)
    b = -1
    fill = 0
    prev = -1
    for i in range(n):
        if cpus[i] != prev or fill + lengths[i] > capacity:
            b += 1
            fill = 0
            prev = cpus[i]
        buf[i] = b
        fill += lengths[i]
    return buf


def _sid(p: int, pid: int) -> bytes:
    """TOKEN_USER (pointer + attributes, padded) followed by S-1-5-21-a-b-c-1001."""
    tok = (0xFFFF_C001_2345_6780 + pid * 16).to_bytes(8, "little") + b"\0" * 8 if p == 8 else \
        (0xE123_4560 + pid * 16 & 0xFFFFFFFF).to_bytes(4, "little") + b"\0" * 4
    sub = [21, 3_711_121_034, 2_284_471_928, 1_862_010_321, 1001]
    return tok + bytes([1, len(sub), 0, 0, 0, 0, 0, 5]) + b"".join(s.to_bytes(4, "little") for s in sub)


class Structure:
    """Process, thread, image, ImageID/DbgID, heap snapshot and SysConfig records of the whole trace."""

    def __init__(self, w: Workload, snapshots_blobs):
        self.w = w
        p = self.p = w.pointer_size
        self.rec = OneOff(p)
        self.image_times: dict[tuple[int, int], list] = {}
        procs = w.procs
        for q in procs:
            main = q.tids[0]
            if q.rundown:
                self._process(L.HOOK_PROCESS_DCSTART, "Process.DCStart", q, 0, w.t0 + 100, 0, 0)
            else:
                parent = next((r for r in procs if r.pid == q.ppid and r.start <= q.start < r.end), None)
                self._process(L.HOOK_PROCESS_START, "Process.Start", q, q.cpu, q.start,
                              parent.tids[0] if parent else 0, q.ppid)
            t = (w.t0 + 104) if q.rundown else q.start + 4
            for tid in q.tids:
                self._thread(L.HOOK_THREAD_DCSTART if q.rundown else L.HOOK_THREAD_START,
                             "Thread.DCStart" if q.rundown else "Thread.Start", q, tid, t, 0 if q.rundown else main)
                t += 4
            for img in q.images:
                self._image(L.HOOK_IMAGE_DCSTART if q.rundown else L.HOOK_IMAGE_LOAD,
                            "Image.DCStart" if q.rundown else "Image.Load", q, img, t, main)
                t += 4
            if q.rundown:
                end = w.t_end + 2000
                self._process(L.HOOK_PROCESS_DCEND, "Process.DCEnd", q, 0, end, 0, 0)
                for tid in q.tids:
                    self._thread(L.HOOK_THREAD_DCEND, "Thread.DCEnd", q, tid, end + 4, 0)
            else:
                t = q.end - 4 * (len(q.images) + len(q.tids) + 2)
                for img in q.images:
                    self._image(L.HOOK_IMAGE_UNLOAD, "Image.UnLoad", q, img, t, main)
                    t += 4
                for tid in q.tids:
                    self._thread(L.HOOK_THREAD_END, "Thread.End", q, tid, t, tid)
                    t += 4
                self._process(L.HOOK_PROCESS_END, "Process.End", q, q.cpu, q.end, main, q.pid, exit_status=0)
        # the kernel and the idle/system processes, as rundown
        self._system_processes()
        # kernel session bookkeeping (etl-format §5.2): group masks at start and stop, rundown done (no payload)
        ext = np.zeros(1, L.HEADER_EXTENSION)
        ext["GroupMask"][0, :2] = (0x2000_0207, 0x0000_1000)
        ext["KernelEventVersion"] = 60
        self.rec.system("EventTrace.HeaderExtension", L.HOOK_HEADER_EXTENSION, 2, 0, w.t0 + 20, 0, 0, ext.tobytes())
        self.rec.system("EventTrace.RundownComplete", L.HOOK_RUNDOWN_COMPLETE, 2, 0, w.t_end + 2900, 0, 0, b"")
        self.rec.system("EventTrace.EndExtension", L.HOOK_END_EXTENSION, 2, 0, w.t_end + 2904, 0, 0, ext.tobytes())
        for (q, inst, ts, blob, stack_bytes) in snapshots_blobs:
            self._snapshot(q, inst, ts, blob, stack_bytes)
        cfg = np.zeros(1, L.sysconfig_cpu(p))
        cfg["ProcessorSpeed"], cfg["NumberOfProcessors"], cfg["MemorySize"] = 3000, w.cpus, 65536
        cfg["PageSize"], cfg["AllocationGranularity"] = 4096, 65536
        cfg["ComputerName"] = np.void(utf16z("BUILDBOX").ljust(512, b"\0"))
        cfg["DomainName"] = np.void(utf16z("WORKGROUP").ljust(268, b"\0"))
        cfg["HighestUserAddress"] = 0x7FFF_FFFE_FFFF if p == 8 else 0x7FFE_FFFF
        cfg["ProcessorArchitecture"] = 9 if p == 8 else 0
        cfg["ProcessorLevel"], cfg["ProcessorRevision"], cfg["NxEnabled"] = 6, 0x9701, 1
        cfg["MemorySpeed"] = 3200
        self.rec.system("SysConfig.CPU", L.HOOK_SYSCONFIG_CPU, L.VERSION_SYSCONFIG_CPU, 0, w.t_end + 3000, 0, 0,
                        cfg.tobytes())
        self.rec.sort()

    def _process(self, hook, kind, q, cpu, ts, htid, hpid, exit_status=259):
        p = self.p
        fixed = np.zeros(1, L.process_fixed(p))
        fixed["UniqueProcessKey"] = (0xFFFF_A000_0000_0000 if p == 8 else 0x8500_0000) + q.pid * 0x80
        fixed["ProcessId"], fixed["ParentId"] = q.pid, q.ppid
        fixed["SessionId"] = 0xFFFFFFFF if q.pid in (0, 4) else 1
        fixed["ExitStatus"] = exit_status
        fixed["DirectoryTableBase"] = 0x1_0000_0000 + q.pid * 0x1000 if p == 8 else 0x0100_0000 + q.pid * 0x20
        sid = b"\0\0\0\0" if q.pid in (0, 4) else _sid(p, q.pid)
        payload = fixed.tobytes() + sid + ansiz(q.name) + utf16z(q.cmdline) + utf16z("") + utf16z("")
        self.rec.system(kind, hook, L.VERSION_PROCESS, cpu, ts, htid, hpid, payload)

    def _thread(self, hook, kind, q, tid, ts, htid):
        p = self.p
        t = np.zeros(1, L.thread_fixed(p))
        t["ProcessId"], t["ThreadId"] = q.pid, tid
        kstack = (0xFFFF_F000_0000_0000 if p == 8 else 0x9000_0000) + tid * 0x400
        t["StackBase"], t["StackLimit"] = kstack + 0x6000, kstack
        t["UserStackBase"], t["UserStackLimit"] = 0x1000_0000 + tid * 0x100, 0x0F00_0000 + tid * 0x100
        t["TebBase"] = (0x7FF_0000_0000 if p == 8 else 0x7FF0_0000) + tid * 0x10
        t["BasePriority"], t["PagePriority"], t["IoPriority"] = 8, 5, 2
        self.rec.system(kind, hook, L.VERSION_THREAD, q.cpu if hook != L.HOOK_THREAD_DCSTART else 0, ts,
                        htid, q.pid if htid else 0, t.tobytes() + utf16z(""))

    def _image(self, hook, kind, q, index, ts, htid):
        p = self.p
        img = self.w.catalog.images[index]
        pid = 0 if img.kernel else q.pid
        # (process index or -1 for the kernel, image index) -> [load or DCStart tick, unload tick or None]
        times = self.image_times.setdefault((-1 if img.kernel else q.index, index), [None, None])
        times[1 if hook == L.HOOK_IMAGE_UNLOAD else 0] = ts
        f = np.zeros(1, L.image_fixed(p))
        f["ImageBase"], f["ImageSize"], f["ProcessId"] = img.base, img.size, pid
        f["ImageChecksum"], f["TimeDateStamp"], f["DefaultBase"] = img.checksum, img.timedatestamp, img.base
        cpu = 0 if hook in (L.HOOK_IMAGE_DCSTART,) else q.cpu
        self.rec.system(kind, hook, L.VERSION_IMAGE, cpu, ts, htid if pid else 0, pid, f.tobytes() + utf16z(img.path))
        ii = np.zeros(1, L.image_id_fixed(p))
        ii["ImageBase"], ii["ImageSize"], ii["ProcessId"], ii["TimeDateStamp"] = img.base, img.size, pid, img.timedatestamp
        self.rec.full("ImageID.Info", L.IMAGE_ID_GUID, L.IMAGE_ID_TYPE_INFO, L.IMAGE_ID_VERSION, cpu, ts, 0xFFFFFFFF,
                      pid, ii.tobytes() + utf16z(img.name), RANK_IMAGE_ID)
        d = np.zeros(1, L.dbgid_rsds_fixed(p))
        d["ImageBase"], d["ProcessId"], d["GuidSig"], d["Age"] = img.base, pid, np.void(img.pdb_guid.bytes_le), img.pdb_age
        self.rec.full("ImageID.DbgID_RSDS", L.IMAGE_ID_GUID, L.IMAGE_ID_TYPE_DBGID_RSDS, L.IMAGE_ID_VERSION, cpu, ts,
                      0xFFFFFFFF, pid, d.tobytes() + ansiz(img.pdb_name), RANK_DBGID)

    def _system_processes(self):
        from pipeline.synth.workload import Proc

        w = self.w
        kernel = w.ids["ntoskrnl.exe"]
        idle = Proc(pid=0, ppid=0, name="Idle", cmdline="", start=0, end=0, tids=[0], images=[], kind="idle", cpu=0,
                    rundown=True)
        system = Proc(pid=4, ppid=0, name="System", cmdline="", start=0, end=0, tids=[8], images=[], kind="system",
                      cpu=0, rundown=True)
        for q in (idle, system):
            self._process(L.HOOK_PROCESS_DCSTART, "Process.DCStart", q, 0, w.t0 + 40, 0, 0)
            self._thread(L.HOOK_THREAD_DCSTART, "Thread.DCStart", q, q.tids[0], w.t0 + 44, 0)
            self._process(L.HOOK_PROCESS_DCEND, "Process.DCEnd", q, 0, w.t_end + 2500, 0, 0)
        self._image(L.HOOK_IMAGE_DCSTART, "Image.DCStart", system, kernel, w.t0 + 48, 0)

    def _snapshot(self, q, inst, ts, blob: bytes, stack_bytes: int):
        """Event 100 chunks of at most 16 KiB; an event 200 after the stack section and at the end."""
        seq = 0
        t = ts
        for lo, hi in ((0, stack_bytes), (stack_bytes, len(blob))):
            for c0 in range(lo, hi, L.HEAP_SNAPSHOT_CHUNK_BYTES):
                chunk = blob[c0:min(hi, c0 + L.HEAP_SNAPSHOT_CHUNK_BYTES)]
                head = np.zeros(1, L.HEAP_SNAPSHOT_CHUNK_PREFIX)
                head["Instance"], head["Sequence"], head["BufferLen"] = inst, seq, len(chunk)
                self.rec.event("HeapSnapshot.Chunk", L.HEAP_SNAPSHOT_GUID, L.HEAP_SNAPSHOT_CHUNK_ID,
                               L.HEAP_SNAPSHOT_EVENT_VERSION, q.cpu, t, q.tids[0], q.pid, head.tobytes() + chunk)
                seq += 1
                t += 4
            end = np.zeros(1, L.HEAP_SNAPSHOT_END)
            end["Instance"], end["TotalData"] = inst, hi
            self.rec.event("HeapSnapshot.End", L.HEAP_SNAPSHOT_GUID, L.HEAP_SNAPSHOT_END_ID,
                           L.HEAP_SNAPSHOT_EVENT_VERSION, q.cpu, t, q.tids[0], q.pid, end.tobytes())
            t += 4


def snapshot_blob(p: int, stacks_frames: list[np.ndarray], stack_ids: list[int], refcounts: list[int],
                  heaps: list[tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray]], segment_base: int):
    """Serialize a heap-stack database and the busy blocks of each heap (heap-snapshot.md §3).

    heaps: (handle, total_commit, total_reserve, addr, stackref, size). Returns (blob, stack_section_bytes).
    """
    pt = L.ptr(p)
    segments: dict[bytes, tuple[int, int]] = {}          # frames bytes -> (segment id, refcount)
    stack_recs = []
    for frames, sid, rc in zip(stacks_frames, stack_ids, refcounts):
        refs = []
        for k in range(0, len(frames), L.STACKDB_SEGMENT_FRAMES):
            piece = frames[k:k + L.STACKDB_SEGMENT_FRAMES].astype(pt).tobytes()
            if piece not in segments:
                segments[piece] = (segment_base + len(segments) * 0x80, 0)
            seg_id, seg_rc = segments[piece]
            segments[piece] = (seg_id, seg_rc + 1)
            refs.append(seg_id)
        info = (len(frames) << 24) | min(rc, 0xFFFFFF)
        stack_recs.append(np.array([info], "<u4").tobytes() + np.array([sid], pt).tobytes()
                          + np.array(refs, pt).tobytes())
    head = np.zeros(1, L.STACKDB_HEADER)
    head["SegmentCount"], head["StackCount"] = len(segments), len(stack_recs)
    head["Version"], head["PointerSize"] = L.STACKDB_VERSION, p
    parts = [head.tobytes()]
    for piece, (seg_id, rc) in segments.items():
        nf = len(piece) // p
        parts.append(np.array([(nf << 24) | rc], "<u4").tobytes() + np.array([seg_id], pt).tobytes() + piece)
    parts += stack_recs
    stack_section = b"".join(parts)
    hdt = L.heap_section_header(p)
    rec = np.dtype([("Address", pt), ("StackRef", pt), ("Size", pt)])
    hparts = []
    for handle, commit, reserve, addr, sref, size in heaps:
        h = np.zeros(1, hdt)
        h["Version"], h["PointerSize"], h["Heap"] = L.HEAP_SECTION_VERSION, p, handle
        h["TotalCommit"], h["TotalReserve"] = commit, reserve
        blocks = np.zeros(len(addr) + 1, rec)
        blocks["Address"][:-1], blocks["StackRef"][:-1], blocks["Size"][:-1] = addr, sref, size
        blocks[-1] = (L.SNAPSHOT_SENTINEL_ADDRESS, 0, L.SNAPSHOT_SENTINEL_SIZE)
        hparts.append(h.tobytes() + blocks.tobytes())
    return stack_section + b"".join(hparts), len(stack_section)


# ------------------------------------------------------------------------------------------------
# The file
# ------------------------------------------------------------------------------------------------
KEY_BASE = {8: 0xFFFF_E000_1000_0000, 4: 0xC100_0000}
KEY_STEP = 0x40


class EventTables:
    """Heap and VirtualAlloc events of all processes, each table sorted by timestamp."""

    def __init__(self, w: Workload, heaps, virtuals):
        procs = w.procs
        cols: dict[str, list] = {k: [] for k in ("ha", "hr", "hf", "va", "vf")}
        for h in heaps:
            q = procs[h.proc]
            a = h.t_alloc >= 0
            cols["ha"].append(dict(ts=h.t_alloc[a], addr=h.addr1[a], size=h.size1[a], tmpl=h.tmpl1[a], q=q, heap=h.heap))
            r = h.t_realloc >= 0
            cols["hr"].append(dict(ts=h.t_realloc[r], addr=h.addr2[r], old=h.addr1[r], size=h.size2[r],
                                   old_size=h.size1[r], tmpl=h.tmpl2[r], q=q, heap=h.heap))
            f = h.t_free >= 0
            cols["hf"].append(dict(ts=h.t_free[f], addr=np.where(h.t_realloc[f] >= 0, h.addr2[f], h.addr1[f]), q=q,
                                   heap=h.heap))
        for v in virtuals:
            q = procs[v.proc]
            cols["va"].append(dict(ts=v.t_alloc, addr=v.base, size=v.size, flags=v.flags, tmpl=v.tmpl, q=q))
            f = v.t_free >= 0
            cols["vf"].append(dict(ts=v.t_free[f], addr=v.base[f], size=v.size[f],
                                   flags=np.full(int(f.sum()), L.MEM_RELEASE), q=q))
        self.t: dict[str, dict[str, np.ndarray]] = {}
        for name, parts in cols.items():
            table: dict[str, np.ndarray] = {}
            for key in ("ts", "addr", "size", "tmpl", "old", "old_size", "flags"):
                if parts and key in parts[0]:
                    table[key] = np.concatenate([pt[key] for pt in parts]).astype(np.int64)
            n = [len(pt["ts"]) for pt in parts]
            table["pid"] = np.repeat([pt["q"].pid for pt in parts], n).astype(np.int64)
            table["tid"] = np.repeat([pt["q"].tids[0] for pt in parts], n).astype(np.int64)
            table["cpu"] = np.repeat([pt["q"].cpu for pt in parts], n).astype(np.int32)
            table["heap"] = np.repeat([pt.get("heap", 0) for pt in parts], n).astype(np.int64)
            if "ts" not in table:
                table = {k: np.zeros(0, np.int64) for k in ("ts", "addr", "size", "tmpl", "pid", "tid", "cpu", "heap",
                                                            "old", "old_size", "flags")}
            order = np.argsort(table["ts"], kind="stable")
            self.t[name] = {k: v[order] for k, v in table.items()}

    def window(self, name: str, lo: int, hi: int) -> dict[str, np.ndarray]:
        t = self.t[name]
        i0, i1 = np.searchsorted(t["ts"], [lo, hi])
        return {k: v[i0:i1] for k, v in t.items()}


def logfile_header_record(w: Workload, *, compress: bool, buffers: int, end_ts: int, rerun: int = 0) -> bytes:
    p = w.pointer_size
    start = start_filetime(rerun)
    h = np.zeros(1, L.logfile_header(p))
    h["BufferSize"] = L.SESSION_BUFFER_SIZE
    h["VersionMajor"], h["VersionMinor"], h["SubVersion"], h["SubMinorVersion"] = 10, 0, 2, 0
    h["ProviderVersion"], h["NumberOfProcessors"] = 19045, w.cpus
    h["EndTime"] = start + (end_ts - w.t0)
    h["TimerResolution"] = 156250
    h["LogFileMode"] = L.LOG_MODE_SEQUENTIAL | L.LOG_MODE_RELOG | (L.LOG_MODE_COMPRESSED if compress else 0)
    h["BuffersWritten"], h["StartBuffers"], h["PointerSize"] = buffers, 1, p
    h["CpuSpeedInMHz"] = 3000
    h["BootTime"] = start - 36_000_000_000
    h["PerfFreq"], h["StartTime"], h["ReservedFlags"] = L.PERF_FREQ, start, L.CLOCK_TYPE_QPC
    payload = h.tobytes() + utf16z("Relogger") + utf16z("[multiple files]")
    rec = OneOff(p)
    rec.system("EventTrace.Header", L.HOOK_LOGFILE_HEADER, 2, 0, w.t0, 0, 0, payload)
    return rec.items[0][4]


def header_buffer(record: bytes) -> bytes:
    hb = np.zeros(1, L.BUFFER_HEADER)
    fill = L.BUFFER_HEADER_SIZE + len(record)
    hb["BufferSize"], hb["SavedOffset"], hb["CurrentOffset"], hb["Offset"] = L.HEADER_BUFFER_SIZE, fill, fill, fill
    hb["State"], hb["BufferFlag"], hb["BufferType"] = L.BUFFER_STATE_FLUSH, L.BUFFER_FLAG_FLUSH_MARKER, L.BUFFER_TYPE_HEADER
    out = hb.tobytes() + record
    return out + b"\xff" * (L.HEADER_BUFFER_SIZE - len(out))


def write_trace(f, w: Workload, events: EventTables, structure: Structure, *, seed: int, compress: bool,
                stack_caching: bool, target_bytes: int, on_samples, rerun: int = 0) -> dict:
    """Write the whole trace to the open binary file ``f``; returns counts. ``on_samples(Samples)`` sees
    every window's samples (for the ground truth)."""
    p = w.pointer_size
    frames, fstart, fcount = w.stacks.flat()
    leaf = frames[fstart]
    kernel_only = np.array(w.stacks.kernel_only)
    half_k = np.full(len(w.stacks.frames), -1, np.int64)
    half_u = half_k.copy()
    for t, (k, u) in w.stacks.halves.items():
        half_k[t], half_u[t] = k, u
    rng = np.random.default_rng([seed, 3] + ([rerun] if rerun else []))      # (a re-run samples anew)
    f.write(header_buffer(logfile_header_record(w, compress=compress, buffers=0, end_ts=w.t_end, rerun=rerun)))
    n_win = max(3, -(-target_bytes // WINDOW_BYTES))
    span = w.t_end - w.t0
    width = max(1, -(-span // (n_win * 10_000))) * 10_000
    bounds = list(range(w.t0, w.t_end, width)) + [None]
    kinds = np.zeros(len(KINDS), np.int64)
    seq = 0
    buffers = 1
    compressed_buffers = 0
    capacity = L.SESSION_BUFFER_SIZE - L.BUFFER_HEADER_SIZE
    for wi in range(len(bounds) - 1):
        lo = bounds[wi] if wi else 0
        last = bounds[wi + 1] is None
        hi = bounds[wi + 1] if not last else 1 << 62
        s: Samples = samples_in(w, rng, max(lo, w.t0), min(hi, w.t_end))
        on_samples(s)
        batches = []
        arr, done = fixed_batch("PerfInfo.SampledProfile", L.PERFINFO_HEADER, L.sampled_profile(p), len(s.ts), s.cpu, s.ts)
        arr["h"]["Version"], arr["h"]["HeaderType"], arr["h"]["HookId"] = L.VERSION_PERFINFO, L.HT_PERFINFO[p], L.HOOK_SAMPLED_PROFILE
        arr["p"]["InstructionPointer"], arr["p"]["ThreadId"], arr["p"]["Count"] = leaf[s.tmpl], s.tid, 1
        arr["p"]["Flags"] = np.where(s.pid == 0, 0, 8 << 3)
        batches.append(done())
        refs = [(s.ts, s.cpu, s.pid, s.tid, s.tmpl)]
        ha = events.window("ha", lo, hi)
        arr, done = fixed_batch("Heap.Alloc", L.SYSTEM_HEADER, L.heap_alloc(p), len(ha["ts"]), ha["cpu"], ha["ts"])
        _system_fill(arr, p, L.HOOK_HEAP_ALLOC, L.VERSION_HEAP, ha)
        arr["p"]["HeapHandle"], arr["p"]["Size"], arr["p"]["Address"] = ha["heap"], ha["size"], ha["addr"]
        batches.append(done())
        refs.append((ha["ts"], ha["cpu"], ha["pid"], ha["tid"], ha["tmpl"]))
        hr = events.window("hr", lo, hi)
        arr, done = fixed_batch("Heap.ReAlloc", L.SYSTEM_HEADER, L.heap_realloc(p), len(hr["ts"]), hr["cpu"], hr["ts"])
        _system_fill(arr, p, L.HOOK_HEAP_REALLOC, L.VERSION_HEAP, hr)
        arr["p"]["HeapHandle"], arr["p"]["NewAddress"], arr["p"]["OldAddress"] = hr["heap"], hr["addr"], hr["old"]
        arr["p"]["NewSize"], arr["p"]["OldSize"] = hr["size"], hr["old_size"]
        batches.append(done())
        refs.append((hr["ts"], hr["cpu"], hr["pid"], hr["tid"], hr["tmpl"]))
        hf = events.window("hf", lo, hi)
        arr, done = fixed_batch("Heap.Free", L.SYSTEM_HEADER, L.heap_free(p), len(hf["ts"]), hf["cpu"], hf["ts"])
        _system_fill(arr, p, L.HOOK_HEAP_FREE, L.VERSION_HEAP, hf)
        arr["p"]["HeapHandle"], arr["p"]["Address"] = hf["heap"], hf["addr"]
        batches.append(done())
        for name, kind, hook in (("va", "PageFault.VirtualAlloc", L.HOOK_VIRTUAL_ALLOC),
                                 ("vf", "PageFault.VirtualFree", L.HOOK_VIRTUAL_FREE)):
            v = events.window(name, lo, hi)
            arr, done = fixed_batch(kind, L.PERFINFO_HEADER, L.virtual_alloc(p), len(v["ts"]), v["cpu"], v["ts"])
            arr["h"]["Version"], arr["h"]["HeaderType"], arr["h"]["HookId"] = L.VERSION_PAGEFAULT, L.HT_PERFINFO[p], hook
            arr["p"]["BaseAddress"], arr["p"]["RegionSize"] = v["addr"], v["size"]
            arr["p"]["ProcessId"], arr["p"]["Flags"] = v["pid"], v["flags"]
            batches.append(done())
            if name == "va":
                refs.append((v["ts"], v["cpu"], v["pid"], v["tid"], v["tmpl"]))
        ev_ts, ev_cpu, ev_pid, ev_tid, ev_tmpl = _split_halves(
            w, half_k, half_u, *(np.concatenate([r[k] for r in refs]) for k in range(5)))
        if not stack_caching:
            batches.append(stack_batch("StackWalk.Stack", L.HOOK_STACK, p, ev_cpu, ev_ts + 1, ev_tmpl, frames, fstart,
                                       fcount, ev_ts=ev_ts, pid=ev_pid, tid=ev_tid))
        else:
            batches += _key_batches(p, ev_ts, ev_cpu, ev_pid, ev_tid, ev_tmpl, kernel_only, frames, fstart, fcount,
                                    def_ts=(hi - 1) if not last else int(w.t_end + 2800), last=last)
        batches.append(structure.rec.batch(lo, hi))
        b = Batch.concat(batches)
        kinds += np.bincount(b.kind, minlength=len(KINDS))
        out, nbuf, ncomp, seq = _buffers(b, capacity, seq, compress)
        f.write(out)
        buffers += nbuf
        compressed_buffers += ncomp
    end = f.tell()
    f.seek(0)
    f.write(header_buffer(logfile_header_record(w, compress=compress, buffers=buffers, end_ts=w.t_end + 3000, rerun=rerun)))
    f.seek(end)
    return {"buffers": buffers, "compressed_buffers": compressed_buffers, "bytes": end,
            "kinds": {name: int(kinds[i]) for i, name in enumerate(KINDS) if name != "EventTrace.Header"}
            | {"EventTrace.Header": 1}}


def _split_halves(w, half_k, half_u, ts, cpu, pid, tid, tmpl):
    """Replace each stack whose leaf side is in the kernel by its kernel part and its user part (same
    event timestamp and thread, kernel part first); every eighth user part is logged on the next CPU,
    as when the thread migrated before returning to user mode (etl-format §3.6 saw ~5 %)."""
    split = half_k[tmpl] >= 0
    if not split.any():
        return ts, cpu, pid, tid, tmpl
    keep = ~split
    ts_split = ts[split]
    migrated = (ts_split // 4) * 0x9E3779B1 % 8 == 0
    moved = np.where(migrated, (cpu[split] + 1) % w.cpus, cpu[split]).astype(np.int32)
    return (np.concatenate([ts[keep], ts[split], ts[split]]),
            np.concatenate([cpu[keep], cpu[split], moved]),
            np.concatenate([pid[keep], pid[split], pid[split]]),
            np.concatenate([tid[keep], tid[split], tid[split]]),
            np.concatenate([tmpl[keep], half_k[tmpl[split]], half_u[tmpl[split]]]))


def _system_fill(arr, p, hook, version, t):
    arr["h"]["Version"], arr["h"]["HeaderType"], arr["h"]["HookId"] = version, L.HT_SYSTEM[p], hook
    arr["h"]["ThreadId"], arr["h"]["ProcessId"] = t["tid"], t["pid"]


def _key_batches(p, ev_ts, ev_cpu, ev_pid, ev_tid, ev_tmpl, kernel_only, frames, fstart, fcount, *, def_ts, last):
    out = []
    order = np.argsort(ev_ts, kind="stable")
    uniq, first = np.unique(ev_tmpl[order], return_index=True)
    by_use = np.argsort(first, kind="stable")
    slot = np.empty(len(uniq), np.int64)
    slot[by_use] = np.arange(len(uniq))
    key_of_slot = np.uint64(KEY_BASE[p]) + np.uint64(KEY_STEP) * slot.astype(np.uint64)
    keys = key_of_slot[np.searchsorted(uniq, ev_tmpl)]
    kern = kernel_only[ev_tmpl]
    for kind, hook, sel in (("StackWalk.KeyKernel", L.HOOK_STACK_KEY_KERNEL, kern),
                            ("StackWalk.KeyUser", L.HOOK_STACK_KEY_USER, ~kern)):
        arr, done = fixed_batch(kind, L.PERFINFO_HEADER, L.stack_key_ref(p), int(sel.sum()), ev_cpu[sel],
                                ev_ts[sel] + 1, rank=RANK_STACK)
        arr["h"]["Version"], arr["h"]["HeaderType"], arr["h"]["HookId"] = L.VERSION_PERFINFO, L.HT_PERFINFO[p], hook
        arr["p"]["EventTimeStamp"], arr["p"]["StackProcess"], arr["p"]["StackThread"] = ev_ts[sel], ev_pid[sel], ev_tid[sel]
        arr["p"]["StackKey"] = keys[sel]
        out.append(done())
    def_cpu = ev_cpu[order][first]
    kind, hook = ("StackWalk.KeyRundown", L.HOOK_STACK_KEY_RUNDOWN) if last else ("StackWalk.KeyDelete", L.HOOK_STACK_KEY_DELETE)
    out.append(stack_batch(kind, hook, p, def_cpu, np.full(len(uniq), def_ts, np.int64), uniq, frames, fstart, fcount,
                           key=key_of_slot, rank=RANK_KEY_DEF))
    return out


def _buffers(b: Batch, capacity: int, seq: int, compress: bool):
    """Merge records per CPU, pack into buffers, order them by flush time; returns (bytes, n, n_compressed, seq)."""
    order = np.lexsort((b.rank, b.ts, b.cpu))
    lengths = b.length[order]
    cpus = b.cpu[order]
    ts = b.ts[order]
    stream = np.empty(int(lengths.sum()), np.uint8)
    gather(b.blob, b.off, b.length, order, stream)
    buf = pack_buffers(lengths, cpus, capacity)
    nb = int(buf[-1]) + 1 if len(buf) else 0
    if nb == 0:
        return b"", 0, 0, seq
    rec_end = np.cumsum(lengths)
    last_rec = np.searchsorted(buf, np.arange(nb), side="right") - 1
    first_rec = np.searchsorted(buf, np.arange(nb), side="left")
    b_start = rec_end[first_rec] - lengths[first_rec]
    b_end = rec_end[last_rec]
    b_cpu = cpus[first_rec]
    b_ts = ts[last_rec]
    flush = np.ones(nb, bool)
    flush[:-1] = b_cpu[1:] != b_cpu[:-1]
    file_order = np.lexsort((b_cpu, b_ts))
    hdr = np.zeros(nb, L.BUFFER_HEADER)
    fill = (b_end - b_start + L.BUFFER_HEADER_SIZE)[file_order]
    hdr["SavedOffset"] = hdr["Offset"] = hdr["CurrentOffset"] = fill
    hdr["TimeStamp"] = b_ts[file_order]
    hdr["SequenceNumber"] = seq + np.arange(nb)
    hdr["ProcessorIndex"] = b_cpu[file_order]
    hdr["State"] = L.BUFFER_STATE_FLUSH
    flags = L.BUFFER_FLAG_PROC_INDEX | np.where(flush[file_order], L.BUFFER_FLAG_FLUSH_MARKER, 0)
    starts, ends = b_start[file_order], b_end[file_order]
    ncomp = 0
    if compress:
        z, zs, ze = xpress.compress_many(stream, starts, ends, int((ends - starts).max()))
        use = (ze - zs) < (ends - starts)
        ncomp = int(use.sum())
        flags = flags | np.where(use, L.BUFFER_FLAG_COMPRESSED, 0)
        sizes = np.where(use, ze - zs, ends - starts) + L.BUFFER_HEADER_SIZE
        src = [(z, zs[i], ze[i]) if use[i] else (stream, starts[i], ends[i]) for i in range(nb)]
        out = np.empty(int(sizes.sum()), np.uint8)
    else:
        sizes = np.full(nb, L.SESSION_BUFFER_SIZE, np.int64)
        src = [(stream, starts[i], ends[i]) for i in range(nb)]
        out = np.full(nb * L.SESSION_BUFFER_SIZE, 0xFF, np.uint8)
    hdr["BufferSize"] = sizes
    hdr["BufferFlag"] = flags
    hb = hdr.view(np.uint8).reshape(nb, L.BUFFER_HEADER_SIZE)
    o = 0
    for i in range(nb):
        arr, s0, s1 = src[i]
        out[o:o + L.BUFFER_HEADER_SIZE] = hb[i]
        out[o + L.BUFFER_HEADER_SIZE:o + L.BUFFER_HEADER_SIZE + (s1 - s0)] = arr[s0:s1]
        o += int(sizes[i])
    return out, nb, ncomp, seq + nb
