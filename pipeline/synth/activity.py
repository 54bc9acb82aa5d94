"""What the simulated machine does over time, as numpy arrays: CPU samples (per window), and the
heap and VirtualAlloc activity of every rustc process with its heap snapshots.

Heap model: each block has 1-3 events (alloc; alloc+free; alloc+realloc[+free]) drawn from one
pool of event times of its process (tick class 2 mod 4, and unique across all CPUs), so an event's
stack is identified by (timestamp, thread) and, for VirtualAlloc, by its timestamp alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.synth import layout as L
from pipeline.synth.catalog import seeded_hash
from pipeline.synth.workload import HEAP_RATE, MARGIN, SAMPLE_PERIOD, VA_RATE, Workload


def cpu_phase(c: int) -> int:
    """Tick offset of CPU ``c``'s sampling timer: a multiple of 4 in [16, SAMPLE_PERIOD - 16)."""
    return 16 + 4 * ((c * 613) % ((SAMPLE_PERIOD - 32) // 4))


@dataclass
class Samples:
    ts: np.ndarray          # int64 raw ticks
    cpu: np.ndarray         # int32
    pid: np.ndarray         # uint32
    tid: np.ndarray         # uint32
    tmpl: np.ndarray        # int64 stack template
    proc: np.ndarray        # int64 index into Workload.procs, -1 for idle


def samples_in(w: Workload, rng, t_lo: int, t_hi: int) -> Samples:
    """All SampledProfile ticks with t_lo <= ts < t_hi, CPU by CPU."""
    parts = []
    for c in range(w.cpus):
        ph = cpu_phase(c)
        k0 = -(-(t_lo - ph) // SAMPLE_PERIOD)
        k1 = -(-(t_hi - ph) // SAMPLE_PERIOD)
        ts = ph + SAMPLE_PERIOD * np.arange(k0, k1, dtype=np.int64)
        ts = ts[(ts >= w.t0 + 4000) & (ts < w.t_end)]
        n = len(ts)
        segs = [s for s in w.segments if s.cpu == c]
        starts = np.array([s.start for s in segs], dtype=np.int64)
        ends = np.array([s.end for s in segs], dtype=np.int64)
        j = np.searchsorted(starts, ts, side="right") - 1
        inside = (j >= 0) & (ts < ends[np.maximum(j, 0)]) if segs else np.zeros(n, bool)  # a CPU may stay idle
        proc = np.full(n, -1, dtype=np.int64)
        pid = np.zeros(n, dtype=np.uint32)
        tid = np.zeros(n, dtype=np.uint32)
        tmpl = w.pools.draw("idle", rng, n)
        for si in np.unique(j[inside]):
            sel = inside & (j == si)
            seg = segs[si]
            pr = w.procs[seg.proc]
            m = int(sel.sum())
            proc[sel] = seg.proc
            pid[sel] = pr.pid
            threads = pr.tids[1:] if seg.pool.startswith("rustc_codegen") and len(pr.tids) > 1 else pr.tids[:1]
            tid[sel] = np.array(threads, dtype=np.uint32)[rng.integers(0, len(threads), m)]
            tmpl[sel] = w.pools.draw(seg.pool, rng, m)
        parts.append((ts, np.full(n, c, np.int32), pid, tid, tmpl, proc))
    return Samples(*(np.concatenate([p[i] for p in parts]) for i in range(6)))


def _unique_ticks(rng, lo: int, hi: int, n: int, step: int, offset: int) -> np.ndarray:
    """n strictly increasing ticks = offset (mod step) in [lo, hi)."""
    n = max(0, min(n, (hi - lo) // (4 * step)))
    x = np.sort(rng.integers(lo // step + 1, (hi - step * n) // step, n)) * step + offset
    return x + step * np.arange(n, dtype=np.int64)


@dataclass
class HeapBlocks:
    """Classic heap tracing of one process: one row per block (times -1 where an event is absent)."""

    proc: int
    heap: int
    t_alloc: np.ndarray
    t_realloc: np.ndarray
    t_free: np.ndarray
    addr1: np.ndarray
    size1: np.ndarray
    tmpl1: np.ndarray
    addr2: np.ndarray
    size2: np.ndarray
    tmpl2: np.ndarray


@dataclass
class VirtualBlocks:
    proc: int
    t_alloc: np.ndarray
    t_free: np.ndarray
    base: np.ndarray
    size: np.ndarray
    flags: np.ndarray
    tmpl: np.ndarray


@dataclass
class Snapshot:
    proc: int
    instance: int
    ts: int                 # time of the first chunk event; the state is taken at this tick


def _blocks_times(rng, pool: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Give each block `counts[b]` distinct times from ``pool`` (in order); returns (B, 3), -1 padded."""
    m = int(counts.sum())
    times = pool[rng.permutation(len(pool))[:m]]
    block = np.repeat(np.arange(len(counts)), counts)
    order = np.lexsort((times, block))
    times, block = times[order], block[order]
    first = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    pos = np.arange(m) - first[block]
    out = np.full((len(counts), 3), -1, dtype=np.int64)
    out[block, pos] = times
    return out


def heap_and_virtual(w: Workload, seed: int, rerun: int = 0, noise: float = 0.0,
                     commit_factor: dict[int, float] | None = None):
    """Per rustc process: heap blocks, VirtualAlloc blocks and snapshot times.

    What a process allocates depends on what it compiles, not on how long the machine took: each process draws
    from its own generator, as many blocks as its work in the original build asks for. A re-run (``rerun`` > 0)
    lays them out in its own (noisy) time and varies each commit's size by ``noise / 3``; ``commit_factor``
    scales the VirtualAlloc sizes of the stack templates it names (an injected change)."""
    p = w.pointer_size
    heaps, virtuals, snaps = [], [], []
    for q in w.procs:
        if q.kind != "rustc":
            continue
        # (the same process in every re-run: its command line without the --extern list, which follows the schedule)
        who = seeded_hash(q.stage, q.crate, q.cmdline.split(" --extern ")[0]) & 0xFFFF_FFFF
        rng = np.random.default_rng([seed, 7, who])
        segs = [s for s in w.segments if s.proc == q.index]
        lo, hi = min(s.start for s in segs) + MARGIN, max(s.end for s in segs) - MARGIN
        secs = (hi - lo) / L.PERF_FREQ / q.work
        nb = max(8, int(HEAP_RATE * secs / 1.8))
        nv = max(3, int(VA_RATE * secs / 1.6))
        kinds = rng.choice(4, size=nb, p=[0.3, 0.5, 0.05, 0.15])  # alloc | alloc+free | alloc+realloc | all three
        hcounts = np.array([1, 2, 2, 3])[kinds]
        vcounts = 1 + (rng.random(nv) < 0.6)
        # ticks = 2 (mod 4) and unique across CPUs: the lane is encoded in the tick, so no two heap or
        # VirtualAlloc events anywhere share a timestamp
        pool = _unique_ticks(rng, lo, hi, int(hcounts.sum() + vcounts.sum()) + 4, 4 * w.cpus, 2 + 4 * q.cpu)
        if len(pool) < hcounts.sum() + vcounts.sum():
            continue
        perm = rng.permutation(len(pool))
        hpool, vpool = np.sort(pool[perm[:hcounts.sum()]]), np.sort(pool[perm[hcounts.sum():]])
        ht = _blocks_times(rng, hpool, hcounts)
        has_re = kinds >= 2
        t_alloc = ht[:, 0]
        t_realloc = np.where(has_re, ht[:, 1], -1)
        t_free = np.where(kinds == 1, ht[:, 1], np.where(kinds == 3, ht[:, 2], -1))
        size1 = np.clip(rng.lognormal(5.0, 1.6, nb), 8, 1 << 20).astype(np.int64)
        size2 = np.where(has_re, size1 * 2 + 8, 0)
        heap = (0x0000_01F0_0000_0000 + (q.index << 32)) if p == 8 else 0x0100_0000 + ((q.index % 16) << 24)
        al = lambda s: (s + 15) & ~15  # noqa: E731
        off1 = np.cumsum(al(size1) + 16) - (al(size1) + 16)
        off2 = np.cumsum(al(size2) + 16) - (al(size2) + 16)
        addr1 = heap + 0x10000 + off1 + 16
        addr2 = np.where(has_re, heap + 0x10000 + int(off1[-1] + al(size1[-1]) + 0x100000) + off2 + 16, 0)
        stage = q.stage
        tmpl1 = w.pools.draw(f"rustc_heap/{stage}", rng, nb)
        tmpl2 = np.where(has_re, w.pools.draw(f"rustc_heap/{stage}", rng, nb), -1)
        heaps.append(HeapBlocks(q.index, heap, t_alloc, t_realloc, t_free, addr1.astype(np.int64), size1, tmpl1,
                                addr2.astype(np.int64), size2, tmpl2))
        vt = _blocks_times(rng, vpool, vcounts)
        codegen = rng.random(nv) < 0.35
        vsize = np.where(codegen, rng.integers(16, 256, nv), rng.integers(1, 16, nv)) * 0x10000
        vtmpl = np.where(codegen, w.pools.draw(f"va_codegen/{stage}", rng, nv), w.pools.draw(f"va_other/{stage}", rng, nv))
        if rerun:
            jitter = np.exp(np.random.default_rng([seed, 8, who, rerun]).normal(0.0, noise / 3, nv))
            vsize = np.maximum(1, np.round(vsize * jitter / 0x10000)).astype(np.int64) * 0x10000
        for t, factor in (commit_factor or {}).items():
            vsize = np.where(vtmpl == t, np.maximum(1, np.round(vsize * factor / 0x10000)).astype(np.int64) * 0x10000, vsize)
        vflags = np.where(rng.random(nv) < 0.8, L.MEM_COMMIT | L.MEM_RESERVE, L.MEM_COMMIT)
        span = (1 << 40) if p == 8 else (1 << 30)
        vbase = ((0x0000_0200_0000_0000 if p == 8 else 0x4000_0000) + (np.cumsum(vsize) - vsize) % span)
        virtuals.append(VirtualBlocks(q.index, vt[:, 0], vt[:, 1], vbase.astype(np.int64), vsize.astype(np.int64),
                                      vflags.astype(np.int64), vtmpl))
        for inst, frac in ((1, 0.5), (2, 0.95)):
            ts = lo + int((hi - lo) * frac)
            snaps.append(Snapshot(q.index, inst, ts - ts % 4 + 3))
    return heaps, virtuals, snaps


def live_blocks(h: HeapBlocks, t: int):
    """Blocks live at tick t (alloc/realloc at or before t, not freed by t): (addr, size, tmpl) arrays."""
    alive = (h.t_alloc <= t) & ~((h.t_free >= 0) & (h.t_free <= t))
    moved = (h.t_realloc >= 0) & (h.t_realloc <= t)
    addr = np.where(moved, h.addr2, h.addr1)[alive]
    size = np.where(moved, h.size2, h.size1)[alive]
    tmpl = np.where(moved, h.tmpl2, h.tmpl1)[alive]
    return addr, size, tmpl


def recorded_stacks(h: HeapBlocks, t: int) -> np.ndarray:
    """Templates the process's stack database holds at tick t: every allocation stack seen so far."""
    a = h.tmpl1[h.t_alloc <= t]
    r = h.tmpl2[(h.t_realloc >= 0) & (h.t_realloc <= t)]
    return np.unique(np.concatenate([a, r]))
