"""Self-profiles of the synthesized build: one ``.mm_profdata`` (measureme format 9) per rustc process.

Each rustc process of the workload gets a timeline per thread that agrees with the trace: the main thread
(measureme thread 3, the process's first OS thread) runs nested queries and activities over the time its
frontend is sampled, then ``codegen_crate`` and, when it links, ``link_crate``; each codegen thread
(measureme threads 4, 5, ..., the process's other OS threads) runs ``codegen_module`` with two LLVM
activities inside, over the time the codegen threads are sampled. All codegen threads share one
timeline: nothing in a trace tells two of them apart. Some gaps between the main thread's top-level
items stay outside any query, as rustc's own work between queries does.

Interval bounds sit on raw ticks = 2 (mod 4) and samples on 0 (mod 4), so every sample is inside or
outside an interval without doubt: :class:`QueryCounter` gives the truth of which query each sample of a
rustc thread belongs to (the innermost interval at its time). The byte layout is this module's own,
from ``../shared/docs/measureme-format.md``, never the decoder's.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.synth import layout as L

FORMAT_VERSION = 9
PAGE_MAX = 256 * 1024
METADATA_ID = 100_000_001
FIRST_REGULAR_ID = 100_000_003
MAIN_THREAD = 3
TICK_NS = 1_000_000_000 // L.PERF_FREQ

#: Top-level items of a frontend, in order: (kind, label, weight of its share of the time).
FRONTEND = [("GenericActivity", "parse_crate", 1), ("GenericActivity", "expand_crate", 3),
            ("Query", "resolver_for_lowering_raw", 2), ("GenericActivity", "incr_comp_prepare_session_directory", 0.3),
            ("Query", "analysis", 9), ("GenericActivity", "metadata_register_crate", 0.5),
            ("Query", "collect_and_partition_mono_items", 2), ("GenericActivity", "self_profile_alloc_query_strings", 0.3)]
#: Queries nested inside the top-level items.
NESTED = ["typeck", "mir_borrowck", "type_of", "predicates_of", "optimized_mir", "mir_built", "check_well_formed",
          "layout_of", "evaluate_obligation", "fn_sig", "adt_def", "normalize_canonicalized_projection_ty",
          "param_env", "impl_trait_header", "mir_drops_elaborated_and_const_checked", "check_mod_type_wf"]
CODEGEN = ("GenericActivity", "codegen_module")
LLVM = [("GenericActivity", "LLVM_module_optimize"), ("GenericActivity", "LLVM_module_codegen_emit_obj")]


def _on2(t: int, up: bool = True) -> int:
    """The nearest tick = 2 (mod 4) at or after (``up``) / at or before ``t``."""
    r = (2 - t) % 4
    return t + r if up else t - ((t - 2) % 4)


@dataclass
class Timeline:
    """One measureme thread: its intervals (start, end, depth, kind, label) and the innermost label of each
    elementary piece of time (``pieces``: start, end, label; label None outside any interval)."""

    thread: int
    tids: list[int]
    intervals: list[tuple[int, int, int, str, str]] = field(default_factory=list)
    pieces: list[tuple[int, int, str | None]] = field(default_factory=list)

    def add(self, a: int, b: int, depth: int, kind: str, label: str, rng) -> None:
        """Interval [a, b] at ``depth`` with random nested children (queries) inside, pieces in order."""
        self.intervals.append((a, b, depth, kind, label))
        children = []
        if depth < 4 and b - a >= 400:
            n = int(rng.integers(0, 4))
            cuts = sorted(_on2(int(x)) for x in rng.integers(a + 8, b - 8, 2 * n)) if n else []
            for i in range(0, len(cuts) - 1, 2):
                lo, hi = cuts[i], cuts[i + 1]
                if hi - lo >= 8 and (not children or lo > children[-1][1]):
                    children.append((lo, hi))
        t = a
        for lo, hi in children:
            if lo > t:
                self.pieces.append((t, lo, label))
            self.add(lo, hi, depth + 1, "Query", NESTED[int(rng.integers(0, len(NESTED)))], rng)
            t = hi
        if b > t:
            self.pieces.append((t, b, label))

    def gap(self, a: int, b: int) -> None:
        if b > a:
            self.pieces.append((a, b, None))


@dataclass
class Profile:
    proc: int                     # index into Workload.procs
    start_tick: int               # when the profiler started (its time 0)
    timelines: list[Timeline]


def _segments(w, proc: int) -> dict[str, tuple[int, int]]:
    return {s.pool.split("/")[0]: (s.start, s.end) for s in w.segments if s.proc == proc}


def schedule(w, proc: int, rng) -> Profile:
    """The timelines of rustc process ``proc``."""
    pr = w.procs[proc]
    cg_lo, cg_hi = _segments(w, proc)["rustc_codegen"]
    start = pr.start + 1
    main = Timeline(MAIN_THREAD, [pr.tids[0]])
    # frontend: [a, split) cut into the FRONTEND items by weight, a gap outside queries here and there
    a, split = _on2(pr.start + 2), _on2(cg_lo, up=False)
    weights = np.array([f[2] for f in FRONTEND], float) * rng.uniform(0.5, 1.5, len(FRONTEND))
    bounds = [a] + [_on2(int(a + (split - a) * x)) for x in np.cumsum(weights)[:-1] / weights.sum()] + [split]
    for (kind, label, _), lo, hi in zip(FRONTEND, bounds, bounds[1:]):
        if hi - lo < 16:
            main.gap(lo, hi)
            continue
        end = hi
        if rng.random() < 0.3:                     # rustc's own work after this item, outside any query
            end = _on2(hi - int((hi - lo) * 0.1), up=False)
        main.add(lo, end, 0, kind, label, rng)
        main.gap(end, hi)
    cg_a, cg_b = split, _on2(cg_hi)
    end = _on2(pr.end - 4, up=False)
    for lo, hi, label in ((cg_a, cg_b, "codegen_crate"), (cg_b, end, "link_crate")):
        if hi - lo >= 16:
            main.intervals.append((lo, hi, 0, "GenericActivity", label))
            main.pieces.append((lo, hi, label))
    timelines = [main]
    workers = pr.tids[1:]
    if workers:
        mid = _on2(cg_a + int((cg_b - cg_a) * rng.uniform(0.5, 0.8)))
        for k, tid in enumerate(workers):
            t = Timeline(MAIN_THREAD + 1 + k, [tid])
            t.intervals += [(cg_a, cg_b, 0, *CODEGEN), (cg_a + 4, mid, 1, *LLVM[0]), (mid, cg_b - 4, 1, *LLVM[1])]
            t.pieces += [(cg_a, cg_a + 4, CODEGEN[1]), (cg_a + 4, mid, LLVM[0][1]), (mid, cg_b - 4, LLVM[1][1]),
                         (cg_b - 4, cg_b, CODEGEN[1])]
            timelines.append(t)
    return Profile(proc, start, timelines)


class _Streams:
    """The three streams of a measureme file: events, string data, string index."""

    def __init__(self):
        self.events = bytearray(b"MMES" + struct.pack("<I", FORMAT_VERSION))
        self.data = bytearray(b"MMSD" + struct.pack("<I", FORMAT_VERSION))
        self.index = bytearray(b"MMSI" + struct.pack("<I", FORMAT_VERSION))
        self.ids: dict[str, int] = {}

    def string(self, text: str) -> int:
        """A concrete string id (its address + FIRST_REGULAR_ID), written once per text."""
        if text not in self.ids:
            self.ids[text] = len(self.data) + FIRST_REGULAR_ID
            self.data += text.encode() + b"\xff"
        return self.ids[text]

    def virtual(self, vid: int, text: str) -> int:
        self.index += struct.pack("<QQ", vid, self.string(text) - FIRST_REGULAR_ID)
        return vid

    def event(self, kind: int, event_id: int, thread: int, start: int, end: int) -> None:
        upper = ((start >> 32) & 0xFFFF) << 16 | ((end >> 32) & 0xFFFF)
        self.events += struct.pack("<QQIIII", kind, event_id, thread, start & 0xFFFFFFFF, end & 0xFFFFFFFF, upper)

    def file(self) -> bytes:
        out = bytearray(b"MMPD" + struct.pack("<I", FORMAT_VERSION))
        for tag, stream in ((0, self.events), (1, self.data), (2, self.index)):
            for at in range(0, len(stream), PAGE_MAX):
                page = stream[at:at + PAGE_MAX]
                out += struct.pack("<BI", tag, len(page)) + page
        return bytes(out)


def profile_bytes(w, p: Profile, unix_ns_at_t0: int) -> bytes:
    """The .mm_profdata of one profile; times are ns since the profiler started."""
    pr = w.procs[p.proc]
    s = _Streams()
    meta = {"start_time": unix_ns_at_t0 + (p.start_tick - w.t0) * TICK_NS, "process_id": pr.pid,
            "cmd": pr.cmdline + " ", "counter": {"name": "wall-time", "units": [["ns", 1], ["μs", 1000],
                                                                                  ["ms", 1000000], ["s", 1000000000]]}}
    s.data += json.dumps(meta, ensure_ascii=False).encode() + b"\xff"      # (address 8: the METADATA string)
    s.index += struct.pack("<QQ", METADATA_ID, 8)
    kinds = {k: s.string(k) for k in ("Query", "GenericActivity")}
    rows = []
    invocation = 0
    for t in p.timelines:
        for a, b, depth, kind, label in t.intervals:
            if kind == "Query":
                invocation += 1
                event_id = s.virtual(invocation, label)
            else:
                event_id = s.string(label)
            # (an interval is written when it ends: children before their parent)
            rows.append((b, -depth, t.thread, kinds[kind], event_id, (a - p.start_tick) * TICK_NS,
                         (b - p.start_tick) * TICK_NS))
    for _, _, thread, kind, event_id, start, end in sorted(rows):
        s.event(kind, event_id, thread, start, end)
    return s.file()


def write_profiles(w, out_dir: Path, seed: int, unix_ns_at_t0: int) -> list[Profile]:
    """One file per rustc process into ``out_dir/<stage>/<crate>-<pid>.mm_profdata``; the profiles."""
    from pipeline.runs import atomic_write_bytes

    rng = np.random.default_rng([seed, 23])
    profiles = []
    for i, pr in enumerate(w.procs):
        if pr.kind != "rustc":
            continue
        p = schedule(w, i, rng)
        profiles.append(p)
        path = Path(out_dir) / pr.stage / f"{pr.crate}-{pr.pid:07d}.mm_profdata"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, profile_bytes(w, p, unix_ns_at_t0))
    return profiles


class QueryCounter:
    """The truth of the attribution: samples of each rustc process per innermost query label, and per
    (label, leaf function). ``__call__`` sees every window's samples."""

    def __init__(self, w, profiles: list[Profile], func_key):
        self.w, self.func_key = w, func_key
        self.labels: list[str | None] = [None]            # code 0: outside any interval
        codes: dict[str | None, int] = {None: 0}
        self.lookup = {}
        for p in profiles:
            for t in p.timelines:
                starts = np.array([x[0] for x in t.pieces], np.int64)
                ends = np.array([x[1] for x in t.pieces], np.int64)
                code = np.array([codes.setdefault(x[2], len(codes)) for x in t.pieces], np.int64)
                for tid in t.tids:
                    self.lookup[(p.proc, tid)] = (starts, ends, code)
        self.labels = list(codes)
        self.leaf = np.array([int(f[0]) for f in w.stacks.funcs], np.int64)
        self.rustc = np.array(sorted({p.proc for p in profiles}), np.int64)
        self.by_process: dict[tuple[int, int], int] = defaultdict(int)      # (proc, label code) -> samples
        self.by_function: dict[tuple[int, int], int] = defaultdict(int)     # (label code, leaf fid) -> samples

    def __call__(self, s) -> None:
        rustc = np.isin(s.proc, self.rustc)
        for proc, tid in sorted(set(zip(s.proc[rustc].tolist(), s.tid[rustc].tolist()))):
            sel = rustc & (s.proc == proc) & (s.tid == tid)
            starts, ends, code = self.lookup[(proc, tid)]
            ts = s.ts[sel]
            j = np.searchsorted(starts, ts, side="right") - 1
            inside = (j >= 0) & (ts < ends[np.maximum(j, 0)])
            label = np.where(inside, code[np.maximum(j, 0)], 0)
            for c, n in zip(*np.unique(label, return_counts=True)):
                self.by_process[(proc, int(c))] += int(n)
            keys, counts = np.unique(np.stack([label, self.leaf[s.tmpl[sel]]]), axis=1, return_counts=True)
            for (c, fid), n in zip(keys.T.tolist(), counts.tolist()):
                self.by_function[(c, fid)] += n

    def truth(self) -> dict:
        procs, name = self.w.procs, self.labels
        return {
            "by_process": [{"pid": procs[p].pid, "crate": procs[p].crate, "stage": procs[p].stage, "label": name[c],
                            "samples": n} for (p, c), n in sorted(self.by_process.items(),
                                                                  key=lambda kv: (kv[0][0], name[kv[0][1]] or ""))],
            "by_function": sorted(({"label": name[c], "function": self.func_key(self.w, fid), "samples": n}
                                   for (c, fid), n in self.by_function.items()),
                                  key=lambda r: (r["label"] or "", r["function"])),
        }
