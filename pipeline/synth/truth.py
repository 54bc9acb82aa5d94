"""The exact answers for a synthesized trace (``<trace>.truth.json``) and its Breakpad symbol files.

Everything is derived from the same arrays the writer serialized, never from the written bytes.
Times: ``*_raw`` are QPC ticks as in the trace, ``*_ns`` nanoseconds since the logfile header
event (the trace start). Addresses are hex strings (JSON numbers cannot carry 64-bit values
everywhere). Stacks are referred to by template id; ``stacks`` maps an id to its frames (leaf
first), the function of each frame (``module!symbol``) and its image (index into ``images``).
Function keys merge images that share a file name (stage0 and stage1 ``rustc.exe``, the build
scripts), as a report by module and function name would.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from pipeline.synth import layout as L
from pipeline.synth.activity import HeapBlocks, Samples, VirtualBlocks, live_blocks
from pipeline.synth.workload import Workload

TRUTH_FORMAT = 1
#: bumped whenever the same seed and config would give different bytes (benchmarks reuse traces by it)
GENERATOR_VERSION = 9


def ns(w: Workload, raw: int) -> int:
    return (int(raw) - w.t0) * L.NS_PER_TICK


class SampleCounter:
    """Samples per (process, stack template), accumulated window by window."""

    def __init__(self, w: Workload):
        self.n_t = len(w.stacks.frames)
        self.counts = np.zeros((len(w.procs) + 1, self.n_t), np.int64)   # last row: idle
        self.total = 0

    def __call__(self, s: Samples) -> None:
        row = np.where(s.proc < 0, self.counts.shape[0] - 1, s.proc)
        np.add.at(self.counts, (row, s.tmpl), 1)
        self.total += len(s.ts)


def func_key(w: Workload, fid: int) -> str:
    f = w.catalog.funcs
    return f"{w.catalog.images[f.image[fid]].name}!{f.name[fid]}"


def build_truth(w: Workload, counter: SampleCounter, heaps: list[HeapBlocks], virtuals: list[VirtualBlocks],
                snapshots: list[dict], written: dict, config: dict, image_times: dict) -> dict:
    cat = w.catalog
    f = cat.funcs
    per_t = counter.counts.sum(axis=0)
    used = set(np.nonzero(per_t)[0].tolist())
    per_function: dict[str, dict[str, int]] = defaultdict(lambda: {"self": 0, "inclusive": 0})
    per_crate: dict[str, dict[str, int]] = defaultdict(lambda: {"self": 0, "inclusive": 0})
    per_module: dict[str, dict[str, int]] = defaultdict(lambda: {"self": 0, "inclusive": 0})
    for t in sorted(used):
        n = int(per_t[t])
        funcs = w.stacks.funcs[t]
        leaf = int(funcs[0])
        per_function[func_key(w, leaf)]["self"] += n
        per_module[cat.images[f.image[leaf]].name]["self"] += n
        if f.crate[leaf]:
            per_crate[f.crate[leaf]]["self"] += n
        for fid in sorted(set(funcs.tolist())):
            per_function[func_key(w, fid)]["inclusive"] += n
        for mod in sorted({cat.images[f.image[x]].name for x in funcs.tolist()}):
            per_module[mod]["inclusive"] += n
        for crate in sorted({f.crate[x] for x in funcs.tolist() if f.crate[x]}):
            per_crate[crate]["inclusive"] += n
    procs = []
    for q in w.procs:
        procs.append({
            "pid": q.pid, "parent_pid": q.ppid, "image_name": q.name, "command_line": q.cmdline,
            "kind": q.kind, "crate": q.crate, "cpu": q.cpu,
            "start_raw": None if q.rundown else q.start, "end_raw": None if q.rundown else q.end,
            "start_ns": None if q.rundown else ns(w, q.start), "end_ns": None if q.rundown else ns(w, q.end),
            "rundown": q.rundown, "threads": q.tids,
            "images": [cat.images[i].name for i in q.images],
            "image_paths": [cat.images[i].path for i in q.images],
            "samples": int(counter.counts[q.index].sum()),
        })
    commit: dict[int, dict[str, int]] = defaultdict(lambda: {"commit_bytes": 0, "allocs": 0})
    commit_pid: dict[int, int] = defaultdict(int)
    released = 0
    for v in virtuals:
        pid = w.procs[v.proc].pid
        m = (v.flags & L.MEM_COMMIT) != 0
        for t, size in zip(v.tmpl[m].tolist(), v.size[m].tolist()):
            commit[t]["commit_bytes"] += size
            commit[t]["allocs"] += 1
        commit_pid[pid] += int(v.size[m].sum())
        released += int(v.size[v.t_free >= 0].sum())
    stacks_used = used | set(commit) | {t for s in snapshots for t in s["_tmpls"]}
    heap_counts = {"alloc": sum(int((h.t_alloc >= 0).sum()) for h in heaps),
                   "realloc": sum(int((h.t_realloc >= 0).sum()) for h in heaps),
                   "free": sum(int((h.t_free >= 0).sum()) for h in heaps)}
    for h in heaps:
        stacks_used |= set(h.tmpl1.tolist()) | set(h.tmpl2[h.tmpl2 >= 0].tolist())
    return {
        "format": TRUTH_FORMAT,
        "generator_version": GENERATOR_VERSION,
        "config": config,
        "trace": {"bytes": written["bytes"], "buffers": written["buffers"],
                  "compressed_buffers": written["compressed_buffers"], "pointer_size": w.pointer_size,
                  "cpus": w.cpus, "perf_freq": L.PERF_FREQ, "start_raw": w.t0, "end_raw": w.t_end + 3000},
        "event_counts": written["kinds"],
        "processes": procs,
        "critical_path": critical_path(w),
        "images": [{"name": im.name, "path": im.path, "base": hex(im.base), "size": im.size,
                    "timedatestamp": im.timedatestamp, "checksum": im.checksum, "pdb_name": im.pdb_name,
                    "pdb_guid": str(im.pdb_guid), "pdb_age": im.pdb_age, "debug_id": im.debug_id,
                    "kernel": im.kernel} for im in cat.images],
        "samples": {"total": counter.total, "idle": int(counter.counts[-1].sum()),
                    "per_process": [{"pid": p["pid"], "start_raw": p["start_raw"], "image_name": p["image_name"],
                                     "samples": p["samples"]} for p in procs if p["samples"]],
                    "per_function": dict(sorted(per_function.items())),
                    "per_crate": dict(sorted(per_crate.items())),
                    "per_module": dict(sorted(per_module.items())),
                    "per_stack": {str(t): int(per_t[t]) for t in sorted(used)}},
        "commit": {"per_stack": {str(t): v for t, v in sorted(commit.items())},
                   "per_pid": {str(k): v for k, v in sorted(commit_pid.items())},
                   "total_bytes": int(sum(v["commit_bytes"] for v in commit.values())),
                   "released_bytes": released},
        "heap": {"events": heap_counts,
                 "snapshots": [{k: v for k, v in s.items() if not k.startswith("_")} for s in snapshots]},
        "image_loads": [{"pid": 0 if pi < 0 else w.procs[pi].pid, "path": cat.images[ii].path,
                         "base": hex(cat.images[ii].base), "load_raw": lo, "unload_raw": un,
                         "load_ns": ns(w, lo), "unload_ns": None if un is None else ns(w, un),
                         "rundown": pi < 0 or w.procs[pi].rundown}
                        for (pi, ii), (lo, un) in sorted(image_times.items())],
        "stacks": {str(t): {"frames": [hex(int(x)) for x in w.stacks.frames[t]],
                            "functions": [func_key(w, int(x)) for x in w.stacks.funcs[t]],
                            "images": [f.image[int(x)] for x in w.stacks.funcs[t]]}
                   for t in sorted(stacks_used)},
    }


def critical_path(w: Workload) -> list[dict]:
    """What bounded the build's wall time, by construction of its dependency graph (``workload.link_phase``): from
    the rustc process that ended last, back through the crate each one read that ended last before it, first to
    last."""
    rustcs = [q for q in w.procs if q.kind == "rustc" and not q.rundown]
    if not rustcs:
        return []
    by = {(q.stage, q.crate): q for q in rustcs}
    chain = [max(rustcs, key=lambda q: q.end)]
    while chain[-1].externs:
        chain.append(by[(chain[-1].stage, chain[-1].externs[0])])
    return [{"crate": q.crate, "pid": q.pid, "stage": q.stage, "start_ns": ns(w, q.start), "end_ns": ns(w, q.end)}
            for q in reversed(chain)]


def snapshot_truth(w: Workload, h: HeapBlocks, inst: int, ts: int, untracked_sizes: np.ndarray) -> dict:
    addr, size, tmpl = live_blocks(h, ts)
    per = defaultdict(lambda: [0, 0])
    for t, s in zip(tmpl.tolist(), size.tolist()):
        per[t][0] += s
        per[t][1] += 1
    q = w.procs[h.proc]
    return {"pid": q.pid, "process_start_raw": q.start, "instance": inst, "timestamp_raw": ts,
            "timestamp_ns": ns(w, ts), "blocks": int(len(addr) + len(untracked_sizes)),
            "tracked_bytes": int(size.sum()), "untracked_bytes": int(untracked_sizes.sum()),
            "untracked_blocks": int(len(untracked_sizes)),
            "per_stack": {str(t): {"bytes": b, "blocks": c} for t, (b, c) in sorted(per.items())},
            "_tmpls": sorted(per)}


def write_symbols(w: Workload, root: Path) -> int:
    """One Breakpad .sym per image: ``root/<pdb>/<DEBUGID>/<pdb stem>.sym``."""
    cat = w.catalog
    arch = "x86_64" if w.pointer_size == 8 else "x86"
    n = 0
    for im in cat.images:
        stem = im.pdb_name.rsplit(".", 1)[0]
        d = root / im.pdb_name / im.debug_id
        d.mkdir(parents=True, exist_ok=True)
        lines = [f"MODULE windows {arch} {im.debug_id} {im.pdb_name}",
                 f"INFO CODE_ID {im.timedatestamp:08X}{im.size:x} {im.name}",
                 f"FILE 0 C:\\src\\rust\\{stem}\\src\\lib.rs"]
        for k, fid in enumerate(im.func_ids):
            rva = cat.funcs.start[fid] - im.base
            size = cat.funcs.size[fid]
            lines.append(f"FUNC {rva:x} {size:x} 0 {cat.funcs.name[fid]}")
            lines.append(f"{rva:x} {size:x} {10 + 7 * k} 0")
        (d / f"{stem}.sym").write_text("\n".join(lines) + "\n")
        n += 1
    return n


def write_truth(path: Path, truth: dict) -> None:
    path.write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n", encoding="utf-8")
