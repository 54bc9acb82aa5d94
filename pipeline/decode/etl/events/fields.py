"""Field readers the event families share."""

from __future__ import annotations

import numpy as np

from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch


def u32(b, idx, spec):
    return b.field(idx, spec[0], spec[1], 4)


def possible(b: Batch, idx: np.ndarray, what: str, *regions: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Which records' regions ((start, size) arrays) can all be: each size at most a user address space
    (``L.USER_SPACE_END`` of the record's pointer size) and each end inside the address space. The others
    become errors (kind ``bad_value``, their first impossible region named); the caller leaves them to ``events``."""
    big = b.c["ptr"][idx] == 8
    limit = np.where(big, np.uint64(L.USER_SPACE_END[8]), np.uint64(L.USER_SPACE_END[4]))
    top = np.where(big, np.uint64(2**64 - 1), np.uint64(1 << 32))
    fits = [(size <= limit) & (start <= top - np.minimum(size, limit)) for start, size in regions]
    ok = np.logical_and.reduce(fits)
    for j in np.flatnonzero(~ok)[:100].tolist():
        start, size = next(r for r, f in zip(regions, fits) if not f[j])
        b.error(int(idx[j]), "bad_value", f"{what}: a region of {int(size[j])} bytes at 0x{int(start[j]):x} does "
                                          "not fit in the address space")
    return ok
