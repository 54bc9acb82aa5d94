"""Memory events: VirtualAlloc and VirtualFree (PageFault, §3.7) and classic heap events (§3.8), which take
their stack in the buckets (``tables.THREAD_STACKED``) or, when complete, in the partition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch
from pipeline.decode.etl.events.fields import possible, u32


# --- PageFault VirtualAlloc / VirtualFree (§3.7) ---------------------------------------------------
def virtual_alloc(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, 16 + 2 * (P - 4), "VirtualAlloc")
    V = L.VIRTUAL_ALLOC
    base, size = b.pointer(idx, *V["base"]), b.pointer(idx, *V["size"])
    ok = possible(b, idx, "VirtualAlloc", (base, size))
    if not ok.all():
        idx, base, size = idx[ok], base[ok], size[ok]
    b.emit("_virtual_allocs", {
        **b.common(idx), "pid": u32(b, idx, V["pid"]), "base": base, "size": size,
        "flags": u32(b, idx, V["flags"]), "is_free": b.c["opcode"][idx] == 99,
    }, idx)


# --- Heap (§3.8) -----------------------------------------------------------------------------------
HEAP_KIND = {32: "create", 33: "alloc", 34: "realloc", 35: "destroy", 36: "free"}
_HEAP_KIND_NAMES = pa.array([HEAP_KIND[k] for k in range(32, 37)])


def heap(b: Batch, idx: np.ndarray) -> None:
    """Classic heap events: one row layout for all five kinds; absent fields are 0."""
    op = b.c["opcode"][idx]
    P = b.c["ptr"][idx].astype(np.int64)
    need = np.select([op == 32, op == 33, op == 34, op == 35, op == 36],
                     [4 + P, 4 + 3 * P, 4 + 5 * P, P, 4 + 2 * P], P)
    idx = b.require(idx, need, "Heap")
    n = len(idx)
    op = b.c["opcode"][idx]
    cols = {k: np.zeros(n, np.uint64) for k in ("heap", "address", "size", "old_address", "old_size")}
    flags = np.zeros(n, np.uint32)
    source = np.zeros(n, np.uint32)
    cols["heap"] = b.pointer(idx, 0, 0)
    for code, layout in ((33, L.HEAP_ALLOC), (34, L.HEAP_REALLOC), (36, L.HEAP_FREE)):
        m = op == code
        if not m.any():
            continue
        for name, spec in layout.items():
            if name == "heap":
                continue
            if name == "source":
                source[m] = u32(b, idx[m], spec)
            else:
                cols[name][m] = b.pointer(idx[m], *spec)
    m = op == 32
    if m.any():
        flags[m] = u32(b, idx[m], L.HEAP_CREATE["flags"])
    ok = possible(b, idx, "Heap", (cols["address"], cols["size"]), (cols["old_address"], cols["old_size"]))
    if not ok.all():
        idx, op, flags, source = idx[ok], op[ok], flags[ok], source[ok]
        cols = {k: v[ok] for k, v in cols.items()}
    b.emit("_heap_events", {
        **b.common(idx), "pid": b.c["pid"][idx], "tid": b.c["tid"][idx],
        "kind": pa.DictionaryArray.from_arrays(pa.array(op.astype(np.int8) - 32), _HEAP_KIND_NAMES),
        **cols, "flags": flags, "source": source, "_rec": idx,     # (as for samples: see _samples)
    }, idx)
