"""One part of a perf.data file's data section, decoded where a dask task runs it (:func:`decode_part`): the walk
of its records (``records.read_part``), the DWARF unwind of its samples' user stacks, their stack ids; its
samples and distinct stacks written as Arrow IPC files into the scratch directory, the rest (errors, counts, what
the tables of processes and threads need of the samples) handed back small.

A part begins and ends where the walk of the whole section passes (``records.plan_parts``), so its records are
those the whole walk reads there, numbered as it numbers them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.decode.perf import kernels as K
from pipeline.decode.perf import layout as L


@dataclass
class PartTask:
    path: str
    part: int
    lo: int                 # byte offset of its first record
    hi: int                 # where the next part begins (the end of the data section for the last)
    rec0: int               # index of its first record in the data section
    scratch_dir: str
    max_errors: int
    symbols_dir: str        # the run's ``symbols/``: its copies of the images' files, read before the recorded paths
    cache_dir: str          # ``decode.cache_dir``: the images' unwind rows, the [vdso]


@dataclass
class PartResult:
    part: int
    samples: str            # Arrow IPC file: ``tables.part_samples``
    stacks: str             # Arrow IPC file: ``tables.part_stacks``
    errors: np.ndarray      # int64 (n, 3), at most ``max_errors`` rows: ``records.Records.errors``
    type_counts: np.ndarray
    totals: np.ndarray
    seen: np.ndarray        # int64 (n, 3): ``tables.firsts`` of its samples
    sample_min: int         # earliest nonzero sample time, 0 when none
    walk_s: float
    unwound: dict | None    # ``unwind.user_stacks``' info, with --call-graph dwarf


def is_dwarf(sample_type: int) -> bool:
    """Whether samples carry user registers and stack copies to unwind (``perf record --call-graph dwarf``)."""
    return bool(sample_type & L.SAMPLE_REGS_USER and sample_type & L.SAMPLE_STACK_USER)


def decode_part(task: PartTask, images: pa.Table | None = None) -> PartResult:
    """Decode one part; ``images``: the file's ``images`` table (raw load and unload times), which a DWARF unwind
    needs."""
    from pipeline.decode.perf import tables as T
    from pipeline.decode.perf.header import read_header
    from pipeline.decode.perf.records import load, read_part, sample_layout

    data = load(task.path)
    hdr = read_header(task.path, data)
    rec = read_part(data, hdr, sample_layout(task.path, hdr), task.lo, task.hi, task.rec0, task.max_errors)
    unwound = None
    if is_dwarf(hdr.attrs[0].sample_type):
        from pipeline.decode.perf.unwind import user_stacks

        counts, rec.frames, unwound = user_stacks(rec, images, Path(task.symbols_dir), Path(task.cache_dir))
        rec.samples[:, K.S_FRAMES] = counts
    sid, has_stack, stacks = T.part_stacks(rec)
    s = rec.samples
    seen = np.array(T.firsts(s[:, K.S_PID], s[:, K.S_TID], s[:, K.S_TIME]), np.int64).reshape(-1, 3)
    times = s[:, K.S_TIME]
    times = times[times > 0]
    scratch = Path(task.scratch_dir)
    paths = []
    for name, table in (("samples", T.part_samples(rec, sid, has_stack)), ("stacks", stacks)):
        path = scratch / f"{name}-{task.part:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        paths.append(str(path))
    return PartResult(part=task.part, samples=paths[0], stacks=paths[1], errors=rec.errors,
                      type_counts=rec.type_counts, totals=rec.totals, seen=seen,
                      sample_min=int(times.min()) if len(times) else 0, walk_s=rec.walk_s, unwound=unwound)


def read_ipc(path: str) -> pa.Table:
    """An IPC file a part wrote, memory-mapped."""
    return pa.ipc.open_file(pa.memory_map(path)).read_all()
