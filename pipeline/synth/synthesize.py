"""The synthesizer's entry point, :func:`run`: the workload of a config (:mod:`.workload`), its activity
(:mod:`.activity`), the trace (:mod:`.writer`), its self-profiles (:mod:`.selfprofile`), its truth and symbol files
(:mod:`.truth`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

#: Where the self-profiles of the build's rustc processes go, beside the trace.
PROFILE_DIR = "selfprofile"
FILETIME_UNIX_EPOCH = 116_444_736_000_000_000


def run(out: Path, cfg) -> dict[str, Any]:
    """Synthesize the trace described by ``cfg`` (a SynthConfig) into ``out``; returns a summary."""
    from pipeline.runs import atomic_write_text
    from pipeline.synth import activity, truth, writer
    from pipeline.synth.stacks import templates_through
    from pipeline.synth.workload import Rerun, build_workload

    started = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    target = cfg.size
    p = int(cfg.pointer_size)
    changes = [(kind, name, float(factor)) for kind, name, factor in
               (c.split(":", 1)[:1] + c.split(":", 1)[1].rsplit(":", 1) for c in cfg.inject)]
    rerun = Rerun(cfg.rerun, cfg.noise, tuple((n, f) for k, n, f in changes if k == "crate"))
    w = build_workload(cfg.seed, cfg.cpus, p, target, cfg.stack_caching, cfg.stack_variety, rerun)
    for _, name, factor in (c for c in changes if c[0] == "function"):
        w.pools.favor(templates_through(w.catalog, w.stacks, name), factor)
    commit_factor: dict[int, float] = {}
    for _, name, factor in (c for c in changes if c[0] == "commit"):
        for t in templates_through(w.catalog, w.stacks, name):
            commit_factor[t] = commit_factor.get(t, 1.0) * factor
    heaps, virtuals, snaps = activity.heap_and_virtual(w, cfg.seed, cfg.rerun, cfg.noise, commit_factor)
    heap_of = {h.proc: h for h in heaps}
    rng = np.random.default_rng([cfg.seed, 11])
    blobs, snap_truth = [], []
    for s in snaps:
        h = heap_of[s.proc]
        q = w.procs[s.proc]
        addr, size, tmpl = activity.live_blocks(h, s.ts)
        db = activity.recorded_stacks(h, s.ts)
        stack_base = (0x0000_0210_0000_0000 + (s.proc << 28)) if p == 8 else 0x0B00_0000 + ((s.proc % 32) << 19)
        stack_ids = stack_base + 0x100 * np.arange(len(db))
        refcount = [int((tmpl == t).sum()) or 1 for t in db.tolist()]
        sref = stack_ids[np.searchsorted(db, tmpl)] if len(tmpl) else np.zeros(0, np.int64)
        n_un = 12
        un_size = rng.integers(2, 256, n_un) * 16
        un_addr = h.heap + 0x1000 + np.cumsum(un_size + 16) - un_size
        crt_heap = h.heap + 0x4000_0000 if p == 8 else h.heap + 0x0080_0000
        crt_size = rng.integers(2, 64, 4) * 16
        blob, stack_bytes = writer.snapshot_blob(
            p, [w.stacks.frames[t] for t in db.tolist()], stack_ids.tolist(), refcount,
            [(h.heap, 0x0100_0000, 0x0400_0000, np.concatenate([un_addr, addr]),
              np.concatenate([np.zeros(n_un, np.int64), sref]), np.concatenate([un_size, size])),
             (crt_heap, 0x10000, 0x100000, crt_heap + 0x800 + 0x100 * np.arange(4), np.zeros(4, np.int64), crt_size)],
            segment_base=stack_base + 0x0800_0000 if p == 8 else stack_base + 0x40000)
        blobs.append((q, s.instance, s.ts, blob, stack_bytes))
        snap_truth.append(truth.snapshot_truth(w, h, s.instance, s.ts, np.concatenate([un_size, crt_size])))
    structure = writer.Structure(w, blobs)
    events = writer.EventTables(w, heaps, virtuals)
    counter = truth.SampleCounter(w)
    on_samples, queries = counter, None
    if cfg.self_profiles:
        from pipeline.synth import selfprofile

        unix_ns_at_t0 = (writer.start_filetime(cfg.rerun) - FILETIME_UNIX_EPOCH) * 100
        profiles = selfprofile.write_profiles(w, out.parent / PROFILE_DIR, cfg.seed, unix_ns_at_t0)
        queries = selfprofile.QueryCounter(w, profiles, truth.func_key)

        def on_samples(s):
            counter(s)
            queries(s)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as f:
        written = writer.write_trace(f, w, events, structure, seed=cfg.seed, compress=cfg.compress,
                                     stack_caching=cfg.stack_caching, target_bytes=target, on_samples=on_samples,
                                     rerun=cfg.rerun)
    tmp.replace(out)
    symbols = out.parent / "symbols"
    n_sym = truth.write_symbols(w, symbols)
    config = cfg.model_dump(mode="json")
    t = truth.build_truth(w, counter, heaps, virtuals, snap_truth, written, config, structure.image_times)
    if queries is not None:
        t["query_cpu"] = queries.truth()
    truth_path = out.with_name(out.name.rsplit(".", 1)[0] + ".truth.json")
    atomic_write_text(truth_path, __import__("json").dumps(t, indent=1, sort_keys=True) + "\n")
    return {"trace": str(out), "truth": str(truth_path), "symbols": str(symbols), "symbol_files": n_sym,
            "bytes": written["bytes"], "buffers": written["buffers"], "events": sum(written["kinds"].values()),
            "samples": counter.total, "self_profiles": str(out.parent / PROFILE_DIR) if cfg.self_profiles else None,
            "seconds": round(time.perf_counter() - started, 2)}
