"""Distinct stacks (id, check) and the pieces they are made of, as partitions and buckets collect them for
the ``stacks`` table (``joins`` builds it once per distinct stack)."""

from __future__ import annotations

from pathlib import Path

import numba as nb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.decode.etl.batch import unique_pairs
from pipeline.decode.etl.kernels import JIT

class Stacks:
    """Distinct stacks (id, check) and their pieces in order (``owner``: index of the stack, ``ordinal``,
    the piece's hashes), written per bucket for the ``stacks`` table."""

    def __init__(self, sid, check, owner, ordinal, h1, h2):
        self.sid, self.check, self.owner, self.ordinal, self.h1, self.h2 = sid, check, owner, ordinal, h1, h2

    @classmethod
    def empty(cls) -> Stacks:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros(0, np.uint64), np.zeros(0, np.uint64))

    def plus(self, other: Stacks) -> Stacks:
        """These stacks and those of ``other`` that are not among them."""
        if not len(other.sid):
            return self
        if not len(self.sid):
            return other
        first, _ = unique_pairs(np.concatenate([self.sid, other.sid]).view(np.uint64),
                                np.concatenate([self.check, other.check]))
        new = np.sort(first[first >= len(self.sid)] - len(self.sid))
        take = np.zeros(len(other.sid), np.int64)
        take[new] = np.arange(len(new)) + len(self.sid)
        rows = np.flatnonzero(np.isin(other.owner, new))
        return Stacks(np.concatenate([self.sid, other.sid[new]]), np.concatenate([self.check, other.check[new]]),
                      np.concatenate([self.owner, take[other.owner[rows]]]),
                      np.concatenate([self.ordinal, other.ordinal[rows]]),
                      np.concatenate([self.h1, other.h1[rows]]), np.concatenate([self.h2, other.h2[rows]]))

    def only(self, keep: np.ndarray) -> Stacks:
        """The stacks of mask ``keep``, with their pieces."""
        if keep.all():
            return self
        at = np.full(len(self.sid), -1, np.int64)
        at[keep] = np.arange(int(keep.sum()))
        rows = keep[self.owner]
        return Stacks(self.sid[keep], self.check[keep], at[self.owner[rows]], self.ordinal[rows], self.h1[rows],
                      self.h2[rows])

    def tables(self, k: int) -> dict[str, pa.Table]:
        """The stacks as the scratch tables ``_bucket_stacks`` and ``_bucket_stack_pieces``, under writer
        number ``k`` (a bucket, or a partition's negative number): ``joins`` takes each stack's pieces from
        one writer."""
        return {"_bucket_stacks": pa.table({"stack_id": self.sid, "id_check": self.check,
                                            "bucket": np.full(len(self.sid), k, np.int32)}),
                "_bucket_stack_pieces": pa.table({"stack_id": self.sid[self.owner], "id_check": self.check[self.owner],
                                                  "bucket": np.full(len(self.owner), k, np.int32),
                                                  "ord": self.ordinal.astype(np.int32), "h1": self.h1, "h2": self.h2})}

    def write(self, scratch: Path, k: int) -> None:
        if not len(self.sid):
            return
        for name, table in self.tables(k).items():
            path = scratch / f"{name}.parquet" / f"part-{k:05d}.parquet"
            path.parent.mkdir(exist_ok=True)
            pq.write_table(table, path, compression="none")


@nb.njit(**JIT)
def run_has(ts, key, start, t, value):
    """Whether a row from ``start`` on with ``ts`` == ``t`` (sorted ``ts``) has ``key`` == ``value``."""
    q = start
    while q < ts.shape[0] and ts[q] == t:
        if key[q] == value:
            return True
        q += 1
    return False
