"""Synthesized traces read by an independent decoder (dissect.etl, test-only, AGPL): per-kind record
counts, and the fields of Process, Image and SampledProfile events, against the ground truth.
dissect also inflates the compressed buffers (dissect.util lzxpress), cross-checking the encoder.

dissect quirks handled here: manifest-provider GUIDs come out byte-swapped; the 32-bit pointer switch
of its generated payload parsers lacks a @classmethod (fixed below before parsing 32-bit traces).
"""

from __future__ import annotations

import struct
import uuid
from collections import Counter, defaultdict

import pytest
from dissect.etl import ETL, manifest

from pipeline.synth.records import KINDS

PROCESS, IMAGE, PERFINFO = ("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", "2cb15d1d-5fc1-11d2-abe1-00a0c911f518",
                            "ce1dbfb4-137e-4da6-87b0-3f59aa102cbc")


def _fix_dissect_32bit_pointers():
    for guid in (PROCESS, IMAGE, PERFINFO):
        for base in manifest.lookup(uuid.UUID(guid)).c_parser.EtwPointer.__mro__:
            fn = base.__dict__.get("as_32bit")
            if fn is not None:
                if not isinstance(fn, classmethod):
                    base.as_32bit = classmethod(fn)
                break


def _kind_key(h) -> tuple[str, int]:
    name = type(h).__name__
    if name == "EventHeader":      # dissect reads these GUIDs big-endian
        return str(uuid.UUID(bytes_le=h.provider_id.bytes)), h.descriptor.id
    if name == "EventTraceHeader":
        return str(h.provider_id), h.header.Version & 0xFF
    return str(h.provider_id), h.hook_id & 0xFF


KIND_BY_KEY = {(guid, op): name for name, (guid, op, _) in KINDS.items()}


@pytest.fixture(scope="session")
def dissected(synth_traces):
    """One dissect pass per variant: kind counts and the decoded fields we compare."""
    _fix_dissect_32bit_pointers()
    out = {}
    for name, s in synth_traces.items():
        kinds = Counter()
        procs, images, dbgids = set(), set(), {}
        ips, tids = Counter(), Counter()
        chunks = defaultdict(dict)
        ends = defaultdict(list)
        timed = defaultdict(list)       # (pid, instance) -> (time, sequence, bytes): snapshots of a reused pid apart
        parts = defaultdict(list)        # (event timestamp, thread) -> [(kernel?, frames or key)]
        key_defs = defaultdict(list)     # key -> [(record timestamp, frames)]
        p = s.cfg.pointer_size
        with open(s.path, "rb") as fh:
            etl = ETL(fh)
            assert etl.pointer_size == p
            for rec in etl:
                h = rec.header
                kind = KIND_BY_KEY.get(_kind_key(h), repr(_kind_key(h)))
                kinds[kind] += 1
                if kind.startswith("Process."):
                    pl = bytes(h.payload)
                    fixed = 0x24 if p == 8 else 0x1C
                    if pl[fixed:fixed + 4] == b"\0\0\0\0":
                        # a 4-byte empty UserSID (Idle, System): dissect always reads a TOKEN_USER + SID,
                        # so these are read here by the test, per etl-format §3.1
                        pid, ppid = struct.unpack_from("<II", pl, p)
                        image, rest = pl[fixed + 4:].split(b"\0", 1)
                        cmd = rest[:rest.index(b"\0\0") + (rest.index(b"\0\0") % 2)].decode("utf-16-le")
                        procs.add((kind, pid, ppid, image.decode(), cmd))
                        continue
                    e = rec.event._struct
                    procs.add((kind, e.ProcessId, e.ParentId, e.ImageFileName.decode(), e.CommandLine))
                elif kind.startswith("Image."):
                    e = rec.event._struct
                    images.add((kind, e.ProcessId, e.ImageBase, e.ImageSize, e.FileName))
                elif kind == "PerfInfo.SampledProfile":
                    e = rec.event._struct
                    ips[e.InstructionPointer] += 1
                    tids[(e.ThreadId, h.time_delta)] += 1
                elif kind == "ImageID.DbgID_RSDS":
                    pl = bytes(h.payload)
                    base = int.from_bytes(pl[:p], "little")
                    guid = uuid.UUID(bytes_le=pl[p + 4:p + 20])
                    age = struct.unpack_from("<I", pl, p + 20)[0]
                    dbgids[base] = (guid, age, pl[p + 24:].split(b"\0")[0].decode())
                elif kind.startswith("StackWalk."):
                    pl = bytes(h.payload)
                    ptrs = lambda b: tuple(int.from_bytes(b[i:i + p], "little")  # noqa: E731
                                           for i in range(0, len(b), p))
                    if kind in ("StackWalk.KeyDelete", "StackWalk.KeyRundown"):
                        key_defs[ptrs(pl[:p])[0]].append((h.time_delta, ptrs(pl[p:])))
                    else:
                        ev_ts, _, tid = struct.unpack_from("<qII", pl)
                        body = ptrs(pl[16:])
                        parts[(ev_ts, tid)].append((kind, body if kind == "StackWalk.Stack" else body[0],
                                                    h.time_delta))
                elif kind == "HeapSnapshot.Chunk":
                    inst, seq, n = struct.unpack_from("<III", bytes(h.payload))
                    chunks[(h.process_id, inst, )][seq] = bytes(h.payload)[12:12 + n]
                    timed[(h.process_id, inst)].append((h.time_delta, seq, bytes(h.payload)[12:12 + n]))
                elif kind == "HeapSnapshot.End":
                    inst, total = struct.unpack_from("<II", bytes(h.payload))
                    ends[(h.process_id, inst)].append(total)
        out[name] = dict(kinds=kinds, procs=procs, images=images, dbgids=dbgids, ips=ips, tids=tids,
                         chunks=chunks, ends=ends, timed=timed, parts=parts, key_defs=key_defs)
    return out


def test_kind_counts_match_truth(synth_trace, dissected):
    got = dissected[synth_trace.name]["kinds"]
    want = {k: v for k, v in synth_trace.truth["event_counts"].items() if v}
    assert dict(got) == want
    assert sum(got.values()) == synth_trace.summary["events"]
    if synth_trace.cfg.stack_caching:
        assert got["StackWalk.KeyUser"] and got["StackWalk.KeyDelete"] and got["StackWalk.KeyRundown"]
        assert "StackWalk.Stack" not in got
    else:
        # VirtualAlloc stacks and page-fault samples reach into the kernel: a kernel part and a user part each
        t = synth_trace.truth
        split = sum(n for k, n in t["samples"]["per_stack"].items()
                    if "ntoskrnl.exe!KiPageFault" in t["stacks"][k]["functions"])
        assert split > 0
        assert got["StackWalk.Stack"] == (got["PerfInfo.SampledProfile"] + split + got["Heap.Alloc"]
                                          + got["Heap.ReAlloc"] + 2 * got["PageFault.VirtualAlloc"])
    if synth_trace.cfg.compress:
        assert synth_trace.truth["trace"]["compressed_buffers"] > 0


def test_process_fields(synth_trace, dissected):
    got = dissected[synth_trace.name]["procs"]
    want = set()
    for q in synth_trace.truth["processes"]:
        kinds = ("Process.DCStart", "Process.DCEnd") if q["rundown"] else ("Process.Start", "Process.End")
        for k in kinds:
            want.add((k, q["pid"], q["parent_pid"], q["image_name"], q["command_line"]))
    for pid, name in ((0, "Idle"), (4, "System")):
        want |= {("Process.DCStart", pid, 0, name, ""), ("Process.DCEnd", pid, 0, name, "")}
    assert got == want
    rustc = [q for q in synth_trace.truth["processes"] if q["image_name"] == "rustc.exe"]
    assert any("--crate-name rustc_middle" in q["command_line"] and "stage1-rustc" in q["command_line"] for q in rustc)
    assert len({q["pid"] for q in synth_trace.truth["processes"]}) < len(synth_trace.truth["processes"])  # PID reuse


def test_image_fields_and_debug_ids(synth_trace, dissected):
    d = dissected[synth_trace.name]
    images = {im["name"]: im for im in synth_trace.truth["images"]}
    by_path = {im["path"]: im for im in synth_trace.truth["images"]}
    want = set()
    for q in synth_trace.truth["processes"]:
        kinds = ("Image.DCStart",) if q["rundown"] else ("Image.Load", "Image.UnLoad")
        for name in q["images"]:
            cands = [im for im in synth_trace.truth["images"] if im["name"] == name]
            want |= {(k, q["pid"], int(im["base"], 16), im["size"], im["path"]) for im in cands for k in kinds}
    kernel = images["ntoskrnl.exe"]
    want.add(("Image.DCStart", 0, int(kernel["base"], 16), kernel["size"], kernel["path"]))
    got = d["images"]
    assert {g for g in got if g[0] != "Image.DCStart" or g[1] == 0} <= want
    assert {(g[1], g[2], g[4]) for g in got} == {(w[1], w[2], w[4]) for w in want
                                                 if (w[1], w[2], w[4]) in {(g[1], g[2], g[4]) for g in got}}
    for _, pid, base, size, path in got:
        im = by_path[path]
        assert (int(im["base"], 16), im["size"]) == (base, size)
    # every DbgID_RSDS names a .sym file in the symbol store with the same debug id
    symbols = synth_trace.path.parent / "symbols"
    for base, (guid, age, pdb) in d["dbgids"].items():
        debug_id = guid.hex.upper() + format(age, "X")
        sym = symbols / pdb / debug_id / (pdb.rsplit(".", 1)[0] + ".sym")
        assert sym.exists(), sym
        assert sym.read_text().splitlines()[0].split()[3] == debug_id


def test_sampled_profile_fields(synth_trace, dissected):
    d = dissected[synth_trace.name]
    t = synth_trace.truth
    want_ips = Counter()
    for stack, n in t["samples"]["per_stack"].items():
        want_ips[int(t["stacks"][stack]["frames"][0], 16)] += n
    assert d["ips"] == want_ips
    # thread ids are reused: a sample's thread belongs to the process alive at the sample's time
    lives = defaultdict(list)
    for q in t["processes"]:
        for tid in q["threads"]:
            lives[tid].append((q["start_raw"] or 0, q["end_raw"] or 1 << 62, q["pid"]))
    assert any(len(v) > 1 for v in lives.values())
    per_pid = Counter()
    for (tid, ts), n in d["tids"].items():
        owners = [pid for lo, hi, pid in lives[tid] if lo <= ts < hi] if tid else [0]
        assert len(owners) == 1, (tid, ts, lives[tid])
        per_pid[owners[0]] += n
    want = Counter()
    for q in t["samples"]["per_process"]:
        want[q["pid"]] += q["samples"]
    want[0] += t["samples"]["idle"]
    assert per_pid == want
    assert sum(want.values()) == t["samples"]["total"] == sum(d["ips"].values())


def _parse_snapshot(blob: bytes, p: int):
    """heap-snapshot.md §3: stack DB then heap sections; returns {stack id: frames}, [(heap, addr, ref, size)]."""
    fmt = "<Q" if p == 8 else "<I"
    nseg, nstack, version, ptr = struct.unpack_from("<IIHH", blob, 0)
    assert (version, ptr) == (1, p)
    o = 12
    segs = {}
    for _ in range(nseg):
        info, = struct.unpack_from("<I", blob, o)
        sid, = struct.unpack_from(fmt, blob, o + 4)
        n = info >> 24
        segs[sid] = [struct.unpack_from(fmt, blob, o + 4 + p * (1 + k))[0] for k in range(n)]
        o += 4 + p * (1 + n)
    stacks = {}
    for _ in range(nstack):
        info, = struct.unpack_from("<I", blob, o)
        sid, = struct.unpack_from(fmt, blob, o + 4)
        n = info >> 24
        refs = [struct.unpack_from(fmt, blob, o + 4 + p * (1 + k))[0] for k in range((n + 7) // 8)]
        stacks[sid] = [f for r in refs for f in segs[r]]
        assert len(stacks[sid]) == n
        o += 4 + p * (1 + len(refs))
    blocks = []
    while o < len(blob):
        if p == 8:
            version, ptr, _, heap, _, _ = struct.unpack_from("<HHIQQQ", blob, o)
            o += 32
        else:
            version, ptr, heap, _, _ = struct.unpack_from("<HHIII", blob, o)
            o += 16
        assert (version, ptr) == (2, p)
        while True:
            addr, ref, size = struct.unpack_from("<QQQ" if p == 8 else "<III", blob, o)
            o += 3 * p
            if addr == 0x1234CDEF:
                break
            blocks.append((heap, addr, ref, size))
    return stacks, blocks


def test_heap_snapshots(synth_trace, dissected):
    d = dissected[synth_trace.name]
    t = synth_trace.truth
    p = synth_trace.cfg.pointer_size
    frames_of = {tuple(int(x, 16) for x in s["frames"]): k for k, s in t["stacks"].items()}
    snaps = {(s["pid"], s["instance"], s["timestamp_raw"]): s for s in t["heap"]["snapshots"]}
    assert len(d["chunks"]) == len({(pid, inst) for pid, inst, _ in snaps})
    by_pid_inst = defaultdict(list)
    for (pid, inst, ts), s in snaps.items():
        by_pid_inst[(pid, inst)].append(s)
    def per_stack(blob: bytes) -> tuple[dict, int]:
        stacks, blocks = _parse_snapshot(blob, p)
        per = defaultdict(int)
        untracked = 0
        for heap, addr, ref, size in blocks:
            if ref == 0:
                untracked += size
            else:
                per[frames_of[tuple(stacks[ref])]] += size
        return dict(per), untracked

    checked = 0
    for key, parts in d["chunks"].items():
        truths = sorted(by_pid_inst[key], key=lambda s: s["timestamp_raw"])
        if len(truths) == 1:
            blob = b"".join(parts[i] for i in range(len(parts)))
            assert d["ends"][key][-1] == len(blob) and len(d["ends"][key]) == 2
            blobs = [blob]
        else:
            # a reused PID took snapshots in two processes under one instance: each chunk belongs to the snapshot
            # that started last before it (its chunks follow its start 4 ticks apart); once these were skipped
            starts = [s["timestamp_raw"] for s in truths]
            mine = defaultdict(list)
            for t, seq, data in d["timed"][key]:
                mine[max(i for i, st in enumerate(starts) if st <= t)].append((seq, data))
            assert sorted(mine) == list(range(len(truths)))
            blobs = [b"".join(data for _, data in sorted(mine[i])) for i in range(len(truths))]
        for s, blob in zip(truths, blobs):
            per, untracked = per_stack(blob)
            assert untracked == s["untracked_bytes"]
            assert per == {k: v["bytes"] for k, v in s["per_stack"].items()}
            checked += 1
    assert checked == len(snaps)


def test_sample_stacks(synth_trace, dissected):
    """Stacks rebuilt from dissect's records by the format notes (§3.6): parts of one event share
    (EventTimeStamp, thread), kernel part first; a stack key resolves to the first KeyDelete/KeyRundown
    definition of that key at or after the reference. Samples per stack equal the truth."""
    import bisect

    d = dissected[synth_trace.name]
    t = synth_trace.truth
    defs = {k: sorted(v) for k, v in d["key_defs"].items()}

    def frames_of(kind, body, ts):
        if kind == "StackWalk.Stack":
            return body
        cands = defs[body]
        i = bisect.bisect_left([c[0] for c in cands], ts)
        assert i < len(cands), f"key {body:#x} referenced at {ts} has no later definition"
        return cands[i][1]

    kernel_start = 0xFFFF_8000_0000_0000 if synth_trace.cfg.pointer_size == 8 else 0x8000_0000
    per_stack = Counter()
    by_frames = {tuple(int(x, 16) for x in st["frames"]): k for k, st in t["stacks"].items()}
    for (ev_ts, tid), ps in d["parts"].items():
        if ev_ts % 4:
            continue                 # heap / VirtualAlloc events (tick class 2); samples are on 0 (mod 4)
        resolved = [frames_of(k, b, ts) for k, b, ts in ps]       # in file order, not time order
        resolved.sort(key=lambda f: f[0] < kernel_start)          # the kernel part first
        per_stack[by_frames.get(sum(resolved, ()), "?")] += 1
    assert dict(per_stack) == t["samples"]["per_stack"]
    if synth_trace.cfg.stack_caching:
        # keys are reused for other stacks in later windows, as real stack caches do
        assert any(len({f for _, f in v}) > 1 for v in defs.values())


def test_buffers_per_cpu_interleaved(synth_trace):
    """Per-CPU buffers: each CPU's records are in time order across its buffers (file order), buffers of
    different CPUs overlap in time, compressed buffers have their own on-disk size."""
    streams = defaultdict(list)          # cpu -> [(first ts, last ts)] in file order
    sizes, flags = set(), Counter()
    with open(synth_trace.path, "rb") as fh:
        etl = ETL(fh)
        for k, buf in enumerate(etl.buffers()):
            hdr = buf.header
            if k == 0:
                assert int(hdr.BufferType) == 4 and hdr.BufferSize == 0x400
                continue
            sizes.add(hdr.BufferSize)
            flags[int(hdr.BufferFlag)] += 1
            ts = [rec.header.time_delta for rec in buf]
            assert ts == sorted(ts)
            streams[hdr.ProcessorIndex].append((ts[0], ts[-1]))
    assert sorted(streams) == list(range(synth_trace.cfg.cpus))
    for spans in streams.values():
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    spans = sorted((s, e, cpu) for cpu, v in streams.items() for s, e in v)
    assert any(b[0] < a[1] and a[2] != b[2] for a, b in zip(spans, spans[1:]))
    if synth_trace.cfg.compress:
        assert len(sizes) > 10 and max(sizes) < 0x10000
        assert all(f & 0x20 for f in flags) and sum(n for f, n in flags.items() if f & 0x40) > 0
    else:
        assert sizes == {0x10000} and set(flags) == {0x20, 0x21}
