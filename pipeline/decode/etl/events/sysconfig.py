"""The machine (SysConfig CPU, §3.10): the ``sysconfig`` table."""

from __future__ import annotations

import numpy as np

from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch


# --- SysConfig CPU (§3.10) -------------------------------------------------------------------------
def sysconfig_cpu(b: Batch, idx: np.ndarray) -> None:
    C = L.SYSCONFIG_CPU
    idx = b.require(idx, C["computer_name"] + C["computer_name_bytes"], "SysConfig CPU")
    po = b.c["pay_off"][idx]
    names, _ = b.strings(idx, np.full(len(idx), C["computer_name"]), wide=True)
    b.emit("sysconfig", {
        **b.common(idx), "kind": ["cpu"] * len(idx),
        "cpu_mhz": b.gather(po + C["mhz"], 4), "cpu_count": b.gather(po + C["cpus"], 4),
        "memory_mb": b.gather(po + C["memory_mb"], 4), "page_size": b.gather(po + C["page_size"], 4),
        "allocation_granularity": b.gather(po + C["alloc_granularity"], 4), "computer_name": names,
    }, idx)
