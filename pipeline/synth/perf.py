"""A small made-up ``perf.data`` file (file mode, little-endian) with its exact sample counts: a cargo process
that forks rustc processes, each exec'd, mapping two files, sampled on two threads with frame-pointer callchains
(user and kernel frames), then exiting. What ``scripts/compile_kernels.py`` decodes so the perf walk is compiled
at install time, and what tests decode without perf.

The byte layouts are written here from the format notes (the kernel's ``tools/perf/Documentation/
perf.data-file-format.txt`` and ``include/uapi/linux/perf_event.h``), independent of ``pipeline/decode/perf``: a
header, one ``perf_event_attr`` (cpu-clock, ``sample_type`` IP|TID|TIME|CALLCHAIN|PERIOD, ``sample_id_all``,
``use_clockid``) with its id, the data section, then the HOSTNAME, SAMPLE_TIME and CLOCK_DATA features. Same seed
-> the same bytes.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

# record types and header bits
MMAP, COMM, EXIT, FORK, SAMPLE, MMAP2, FINISHED_ROUND = 1, 3, 4, 7, 9, 10, 68
MISC_KERNEL, MISC_USER, MISC_COMM_EXEC, MISC_MMAP_BUILD_ID = 1, 2, 1 << 13, 1 << 14
IP, TID, TIME, CALLCHAIN, PERIOD = 1 << 0, 1 << 1, 1 << 2, 1 << 5, 1 << 8
# attr flag bits: disabled, inherit, mmap, comm, freq, task, sample_id_all, mmap2, comm_exec, use_clockid
FLAGS = (1 << 0) | (1 << 1) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 13) | (1 << 18) | (1 << 23) | (1 << 24) \
    | (1 << 25)
CONTEXT_KERNEL, CONTEXT_USER, CONTEXT_MAX = (1 << 64) - 128, (1 << 64) - 512, (1 << 64) - 4095
FEAT_HOSTNAME, FEAT_SAMPLE_TIME, FEAT_CLOCK_DATA = 3, 21, 29
ATTR_SIZE = 128
#: Where the made-up files are mapped, and the kernel.
TEXT, DRIVER, KERNEL = 0x5555_5555_0000, 0x7F00_0000_0000, 0xFFFF_FFFF_8100_0000
#: The library mapped at ``DRIVER``, where the user frames fall.
DRIVER_NAME = "/synth/lib/librustc_driver.so"
#: The Unix time (ns) of the sample clock's 0: what CLOCK_DATA says.
WALL_AT_ZERO = 1_795_000_000_000_000_000


def _rec(rtype: int, misc: int, body: bytes, trailer: bytes = b"") -> bytes:
    """One record: the 8-byte header, the body padded to 8 bytes, then the sample-id trailer."""
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<IHH", rtype, misc, 8 + len(body) + len(trailer)) + body + trailer


def _name(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return raw + b"\0" * (-len(raw) % 8)


def _write_file(path: Path, data: list[bytes], first: int, last: int, dwarf: bool = False) -> None:
    """The file around its data section (``data``, its pieces in order): header, the attr and its id, the
    features."""
    attr = bytearray(ATTR_SIZE)
    sample_type = IP | TID | TIME | CALLCHAIN | PERIOD | ((REGS_USER | STACK_USER) if dwarf else 0)
    struct.pack_into("<IIQQQQQ", attr, 0, 1, ATTR_SIZE, 0, 999, sample_type, 0, FLAGS)
    if dwarf:
        struct.pack_into("<QI", attr, 80, REGS_MASK, STACK_COPY)    # sample_regs_user, sample_stack_user
    struct.pack_into("<i", attr, 92, 1)     # clockid: CLOCK_MONOTONIC
    header_size, attrs_at = 104, 104
    ids_at = attrs_at + ATTR_SIZE + 16
    data_at = ids_at + 8
    size = sum(len(d) for d in data)
    features_at = data_at + size
    hostname = b"synth\0\0\0"
    sections = [struct.pack("<I", len(hostname)) + hostname, struct.pack("<QQ", first, last),
                struct.pack("<IIQQ", 1, 1, WALL_AT_ZERO + first, first)]
    content_at = features_at + 16 * len(sections)
    table, offset = b"", content_at
    for body in sections:
        table += struct.pack("<QQ", offset, len(body))
        offset += len(body)
    bits = (1 << FEAT_HOSTNAME) | (1 << FEAT_SAMPLE_TIME) | (1 << FEAT_CLOCK_DATA)
    head = struct.pack("<8sQQQQQQQQ4Q", b"PERFILE2", header_size, ATTR_SIZE + 16, attrs_at, ATTR_SIZE + 16, data_at,
                       size, 0, 0, bits, 0, 0, 0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head + bytes(attr) + struct.pack("<QQ", ids_at, 8) + struct.pack("<Q", 1))
        for piece in data:
            f.write(piece)
        f.write(table + b"".join(sections))


#: ``dwarf``: the user registers perf asks for with ``--call-graph dwarf`` on x86-64 (AX..SS, R8..R15: 20 of them, in
#: bit order; BP is the 7th, SP the 8th, IP the 9th), and the bytes of user stack copied with each sample.
REGS_MASK, STACK_COPY = 0xFF0FFF, 64
REGS_USER, STACK_USER, REGS_ABI_64 = 1 << 12, 1 << 13, 2


def write_perf(path: Path, seed: int = 1, rustcs: int = 3, samples: int = 120, dwarf: bool = False,
               libraries: tuple[str, ...] = (DRIVER_NAME,)) -> dict[str, Any]:
    """Write the file; its truth: samples per pid and per (pid, tid), processes and their names, and each sample's
    frames (leaf first). With ``dwarf``, as ``perf record --call-graph dwarf`` writes samples: the callchain holds
    the kernel part only, then the user registers and a copy of the stack (of made-up files, which have no call
    frame information on any machine: the user part of a stack is its IP). Rustc ``k`` maps
    ``libraries[k % len(libraries)]`` (with a build id) where its user frames fall."""
    rng = random.Random(seed)
    t = 1_000_000_000
    out: list[bytes] = []
    per_tid: dict[tuple[int, int], int] = {}
    stacks: list[list[int]] = []

    def trailer(pid: int, tid: int) -> bytes:    # (sample_id_all: TID and TIME, in sample_type order)
        return struct.pack("<IIQ", pid, tid, t)

    out.append(_rec(MMAP, MISC_KERNEL, struct.pack("<iIQQQ", -1, 0, KERNEL, 0x100_0000, 0) + _name("[kernel.kallsyms]_text"),
                    struct.pack("<IIQ", 0, 0, 0)))
    cargo = 100
    out.append(_rec(COMM, MISC_USER, struct.pack("<II", cargo, cargo) + _name("cargo"), trailer(cargo, cargo)))
    first = t
    for k in range(rustcs):
        pid = 200 + 10 * k
        t += rng.randrange(1_000_000, 5_000_000)
        out.append(_rec(FORK, 0, struct.pack("<IIIIQ", pid, cargo, pid, cargo, t), trailer(pid, pid)))
        t += 50_000
        out.append(_rec(COMM, MISC_COMM_EXEC, struct.pack("<II", pid, pid) + _name("rustc"), trailer(pid, pid)))
        bid = bytes(rng.randrange(256) for _ in range(20))
        for base, size, name, with_id in ((TEXT, 0x10_0000, "/synth/bin/rustc", False),
                                          (DRIVER, 0x400_0000, libraries[k % len(libraries)], True)):
            t += 10_000
            ident = (struct.pack("<B3x20s", 20, bid) if with_id else struct.pack("<IIQQ", 8, 1, 1000 + k, 0))
            out.append(_rec(MMAP2, MISC_USER | (MISC_MMAP_BUILD_ID if with_id else 0),
                            struct.pack("<IIQQQ", pid, pid, base, size, 0x1000) + ident + struct.pack("<II", 5, 2)
                            + _name(name), trailer(pid, pid)))
        worker = pid + 1
        t += 20_000
        out.append(_rec(FORK, 0, struct.pack("<IIIIQ", pid, pid, worker, pid, t), trailer(pid, worker)))
        out.append(_rec(COMM, 0, struct.pack("<II", pid, worker) + _name("opt cgu.0"), trailer(pid, worker)))
        for _ in range(samples):
            tid = rng.choice((pid, worker))
            t += rng.randrange(500_000, 1_500_000)
            kernel = rng.random() < 0.2
            user = [DRIVER + rng.randrange(0x1000, 0x400_0000) for _ in range(rng.randrange(1, 12))]
            chain = ([CONTEXT_KERNEL, KERNEL + rng.randrange(0x1000, 0x100_0000), CONTEXT_USER] if kernel
                     else [CONTEXT_USER]) + user
            tail = b""
            if dwarf:
                chain = chain[:2] if kernel else []
                regs = [0] * 20
                regs[6], regs[7], regs[8] = 0x7FFF_0000_1000, 0x7FFF_0000_0F00, user[0]     # BP, SP, IP
                tail = (struct.pack("<Q20Q", REGS_ABI_64, *regs) + struct.pack("<Q", STACK_COPY)
                        + bytes(rng.randrange(256) for _ in range(STACK_COPY)) + struct.pack("<Q", STACK_COPY))
                stacks.append([x for x in chain if x < CONTEXT_MAX] + [user[0]])
            else:
                stacks.append([x for x in chain if x < CONTEXT_MAX])
            out.append(_rec(SAMPLE, MISC_KERNEL if kernel else MISC_USER,
                            struct.pack("<QIIQQQ", chain[1] if kernel else user[0], pid, tid, t, 1_001_001, len(chain))
                            + struct.pack(f"<{len(chain)}Q", *chain) + tail))     # (PERIOD comes before CALLCHAIN)
            per_tid[(pid, tid)] = per_tid.get((pid, tid), 0) + 1
            if rng.random() < 0.05:
                out.append(_rec(FINISHED_ROUND, 0, b""))
        t += 100_000
        for tid in (worker, pid):
            out.append(_rec(EXIT, 0, struct.pack("<IIIIQ", pid, cargo, tid, pid if tid != pid else cargo, t),
                            trailer(pid, tid)))
    last = t
    _write_file(Path(path), out, first, last, dwarf)
    per_pid: dict[int, int] = {}
    for (pid, _), n in per_tid.items():
        per_pid[pid] = per_pid.get(pid, 0) + n
    return {"samples": sum(per_pid.values()), "per_pid": per_pid, "per_tid": per_tid, "stacks": stacks,
            "origin_unix_ns": WALL_AT_ZERO + first}


def write_large_perf(path: Path, size: int, seed: int = 1, rustcs: int = 6, chunk: int = 4096) -> dict[str, Any]:
    """A file of about ``size`` bytes, written quickly (numpy, ``chunk`` samples at a time): cargo forks ``rustcs``
    rustc processes one after another, each living for a stretch of the file beside the one before (FORK, COMM
    exec, two MMAP2, a second thread, EXITs), sampled with frame-pointer callchains drawn from 3,000 stacks of 4
    to 40 frames (a fifth with a kernel frame), times out of order by up to 2 ms within a round of perf's
    buffers, a FINISHED_ROUND after each chunk. Returns samples per pid. Same seed -> the same bytes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    stacks = (DRIVER + rng.integers(0x1000, 0x400_0000, size=(3000, 40))).astype(np.uint64)
    t = 1_000_000_000
    out: list[bytes] = []
    cargo = 100

    def trailer(pid: int, tid: int) -> bytes:
        return struct.pack("<IIQ", pid, tid, t)

    out.append(_rec(MMAP, MISC_KERNEL, struct.pack("<iIQQQ", -1, 0, KERNEL, 0x100_0000, 0) + _name("[kernel.kallsyms]_text"),
                    struct.pack("<IIQ", 0, 0, 0)))
    out.append(_rec(COMM, MISC_USER, struct.pack("<II", cargo, cargo) + _name("cargo"), trailer(cargo, cargo)))
    first = t
    chunks = max(1, size // (chunk * 256))
    per_process = max(1, chunks // rustcs)
    live: list[int] = []
    per_pid: dict[int, int] = {}
    for c in range(chunks):
        if c % per_process == 0 and len(live) < 2 and c // per_process < rustcs:     # a rustc starts
            pid = 200 + 10 * (c // per_process)
            t += 1_000_000
            out.append(_rec(FORK, 0, struct.pack("<IIIIQ", pid, cargo, pid, cargo, t), trailer(pid, pid)))
            out.append(_rec(COMM, MISC_COMM_EXEC, struct.pack("<II", pid, pid) + _name("rustc"), trailer(pid, pid)))
            for base, span, name in ((TEXT, 0x10_0000, "/synth/bin/rustc"), (DRIVER, 0x400_0000, DRIVER_NAME)):
                bid = bytes(rng.integers(0, 256, 20, dtype=np.uint8))
                out.append(_rec(MMAP2, MISC_USER | MISC_MMAP_BUILD_ID, struct.pack("<IIQQQ", pid, pid, base, span, 0x1000)
                                + struct.pack("<B3x20s", 20, bid) + struct.pack("<II", 5, 2) + _name(name),
                                trailer(pid, pid)))
            out.append(_rec(FORK, 0, struct.pack("<IIIIQ", pid, pid, pid + 1, pid, t), trailer(pid, pid + 1)))
            out.append(_rec(COMM, 0, struct.pack("<II", pid, pid + 1) + _name("opt cgu.0"), trailer(pid, pid + 1)))
            live.append(pid)
        # the chunk's samples: one callchain length each chunk, so that the records are one numpy array
        depth = int(rng.integers(4, 41))
        nr = depth + 3
        rec = np.zeros(chunk, [("type", "<u4"), ("misc", "<u2"), ("size", "<u2"), ("ip", "<u8"), ("pid", "<u4"),
                               ("tid", "<u4"), ("time", "<u8"), ("period", "<u8"), ("nr", "<u8"), ("chain", "<u8", nr)])
        pids = np.array(live, np.uint32)[rng.integers(0, len(live), chunk)]
        kernel = rng.random(chunk) < 0.2
        which = rng.integers(0, len(stacks), chunk)
        user = stacks[which, :depth]
        ts = t + np.cumsum(rng.integers(50_000, 150_000, chunk)) + rng.integers(0, 2_000_000, chunk)
        rec["type"], rec["size"] = SAMPLE, rec.dtype.itemsize
        rec["misc"] = np.where(kernel, MISC_KERNEL, MISC_USER)
        rec["pid"], rec["tid"] = pids, pids + (rng.random(chunk) < 0.5)
        rec["time"], rec["period"], rec["nr"] = ts, 1_001_001, nr
        kaddr = np.uint64(KERNEL) + rng.integers(0x1000, 0x100_0000, chunk).astype(np.uint64)
        chain = rec["chain"]
        chain[:, 0] = np.where(kernel, np.uint64(CONTEXT_KERNEL), np.uint64(CONTEXT_USER))
        chain[:, 1] = np.where(kernel, kaddr, user[:, 0])
        chain[:, 2] = np.where(kernel, np.uint64(CONTEXT_USER), user[:, 1])
        chain[:, 3:] = user
        rec["chain"] = chain
        rec["ip"] = chain[:, 1]
        out.append(rec.tobytes())
        out.append(_rec(FINISHED_ROUND, 0, b""))
        for p, n in zip(*np.unique(pids, return_counts=True)):
            per_pid[int(p)] = per_pid.get(int(p), 0) + int(n)
        t = int(ts.max()) + 1
        if (c + 1) % per_process == 0 and len(live) == 2 or c == chunks - 1:    # the older rustc exits
            for pid in (live if c == chunks - 1 else live[:1]):
                for tid in (pid + 1, pid):
                    out.append(_rec(EXIT, 0, struct.pack("<IIIIQ", pid, cargo, tid, pid if tid != pid else cargo, t),
                                    trailer(pid, tid)))
            live = [] if c == chunks - 1 else live[1:]
    _write_file(Path(path), out, first, t)
    return {"samples": sum(per_pid.values()), "per_pid": per_pid}
