"""The records of one perf.data file as arrays: the header (:mod:`.header`) read, the sample layout chosen once from
the attrs, the kernel's two walks run (:mod:`.kernels`), and the strings (comm names, file names, build ids) cut
out of the bytes once per record. What the tables are made of (:mod:`.tables`)."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import sources
from pipeline.decode.perf import kernels as K
from pipeline.decode.perf import layout as L
from pipeline.decode.perf.header import PerfFileError, PerfHeader


@dataclass
class Tasks:
    """The task and mmap records of the whole file (what process, thread and image lifetimes are made of)."""

    header: PerfHeader
    tasks: np.ndarray           # int64 (n, K.T_COLS): COMM, FORK, EXIT
    task_names: list[str | None]
    mmaps: np.ndarray           # int64 (n, K.M_COLS)
    mmap_addrs: np.ndarray      # uint64 (n, K.M_ADDR_COLS)
    mmap_names: list[str]
    mmap_build_ids: list[str | None]


@dataclass
class Records:
    """The records of one part of the data section (:func:`read_part`)."""

    header: PerfHeader
    layout: K.SampleLayout
    samples: np.ndarray         # int64 (n, K.S_COLS)
    ips: np.ndarray             # uint64 (n,)
    frames: np.ndarray          # uint64: each sample's callchain without context markers, leaf first, in order
    errors: np.ndarray          # int64 (n, 3): byte offset, code, record type (or bytes skipped, for RESYNC)
    type_counts: np.ndarray     # int64 (256,)
    totals: np.ndarray          # int64 (K.N_TOTALS,)
    walk_s: float = 0.0
    data: np.ndarray | None = None     # the file's bytes (where the samples' register and stack copies lie)


def load(path: sources.Input) -> np.ndarray:
    """The file's bytes: a read-only memory map of a local file, the bytes of a URL's."""
    if sources.is_url(path):
        return np.frombuffer(sources.read_bytes(path), np.uint8)
    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            return np.zeros(0, np.uint8)
        return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)


def sample_layout(path, hdr: PerfHeader) -> K.SampleLayout:
    """The one sample layout of the file's attrs. Attrs whose samples differ in layout would need each record's
    id to pick its attr; files with those are refused, naming the attrs."""
    layouts = {(a.sample_type, a.read_format, a.sample_regs_user, a.sample_id_all) for a in hdr.attrs}
    if len(layouts) > 1:
        raise PerfFileError(f"{path}: {len(hdr.attrs)} events whose samples differ in layout (sample_type "
                            f"{', '.join(a.sample_type_names() for a in hdr.attrs)}): record one event "
                            "(perf record -e cpu-clock) to decode it")
    a = hdr.attrs[0]
    return K.SampleLayout(a.sample_type, a.read_format, a.sample_regs_user, False, a.sample_id_all)


def _strings(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[str | None]:
    """The NUL-terminated text in each [start, end) of ``data`` (None where start is -1)."""
    raw = memoryview(data)
    out: list[str | None] = []
    for a, b in zip(starts.tolist(), ends.tolist()):
        out.append(None if a < 0 else bytes(raw[a:b]).split(b"\0", 1)[0].decode("utf-8", "replace"))
    return out


def plan_parts(data: np.ndarray, hdr: PerfHeader, part_bytes: int) -> list[tuple[int, int, int]]:
    """The data section cut at record boundaries into parts of about ``part_bytes``: (first byte, end, index of
    the first record) of each, in file order (``kernels.plan``)."""
    start, end = hdr.data_offset, min(hdr.data_end, len(data))
    bounds = np.zeros(max(end - start, 0) // part_bytes + 1, np.int64)
    recs = np.zeros(len(bounds), np.int64)
    n = K.plan(data, start, end, part_bytes, bounds, recs)
    stops = bounds[1:n].tolist() + [end]
    return list(zip(bounds[:n].tolist(), stops, recs[:n].tolist()))


def _walk_twice(data, hdr: PerfHeader, lay: K.SampleLayout, lo: int, hi: int, rec0: int, with_samples: bool,
                max_errors: int):
    """``kernels.walk`` over [lo, hi): counting, then into arrays of those sizes."""
    args = (data, lo, hi, hdr.data_end, rec0, *lay.args())
    z2 = np.zeros((0, 1), np.int64)
    counts = np.zeros(256, np.int64)
    totals = np.zeros(K.N_TOTALS, np.int64)
    K.walk(*args, False, with_samples, z2, np.zeros(0, np.uint64), np.zeros(0, np.uint64), z2, z2,
           np.zeros((0, 1), np.uint64), z2, counts, totals)
    n = totals.copy()
    out = (np.zeros((n[K.N_SAMPLES], K.S_COLS), np.int64), np.zeros(n[K.N_SAMPLES], np.uint64),
           np.zeros(n[K.N_FRAMES], np.uint64), np.zeros((n[K.N_TASKS], K.T_COLS), np.int64),
           np.zeros((n[K.N_MMAPS], K.M_COLS), np.int64), np.zeros((n[K.N_MMAPS], K.M_ADDR_COLS), np.uint64),
           np.zeros((min(n[K.N_ERRORS], max_errors), 3), np.int64))
    counts[:] = 0
    totals[:] = 0
    K.walk(*args, True, with_samples, *out, counts, totals)
    if not np.array_equal(totals, n):
        raise AssertionError(f"the perf.data walks disagree: {n.tolist()} then {totals.tolist()}")
    return out, counts, totals


def read_tasks(data: np.ndarray, hdr: PerfHeader, lay: K.SampleLayout) -> Tasks:
    """The COMM, FORK, EXIT, MMAP and MMAP2 records of the whole data section, samples stepped over (their errors
    are the parts' to report)."""
    (_, _, _, tasks, mmaps, addrs, _), _, _ = _walk_twice(data, hdr, lay, hdr.data_offset, hdr.data_end, 0, False, 0)
    bids: list[str | None] = [None if a < 0 else bytes(data[a:a + k]).hex()
                              for a, k in zip(mmaps[:, K.M_BUILD_ID].tolist(), mmaps[:, K.M_BUILD_ID_LEN].tolist())]
    return Tasks(header=hdr, tasks=tasks, task_names=_strings(data, tasks[:, K.T_NAME], tasks[:, K.T_NAME_END]),
                 mmaps=mmaps, mmap_addrs=addrs,
                 mmap_names=[s or "" for s in _strings(data, mmaps[:, K.M_NAME], mmaps[:, K.M_NAME_END])],
                 mmap_build_ids=bids)


def read_part(data: np.ndarray, hdr: PerfHeader, lay: K.SampleLayout, lo: int, hi: int, rec0: int,
              max_errors: int = 1 << 20) -> Records:
    """The samples and errors of the records that begin in [lo, hi) (a part from :func:`plan_parts`)."""
    import time

    t0 = time.perf_counter()
    (samples, ips, frames, _, _, _, errors), counts, totals = _walk_twice(data, hdr, lay, lo, hi, rec0, True,
                                                                          max_errors)
    return Records(header=hdr, layout=lay, samples=samples, ips=ips, frames=frames, errors=errors,
                   type_counts=counts, totals=totals, walk_s=time.perf_counter() - t0, data=data)


def error_rows(path, errors: np.ndarray, data_offset: int) -> list[dict]:
    """The walk's errors as rows of ``decoded/errors`` (``file_offset``: the record's byte offset in the file)."""
    rows = []
    for off, code, rtype in errors.tolist():
        if code == K.RESYNC:
            what = f"{K.STATUS_TEXT[code]} after {rtype} bytes skipped"
        else:
            what = f"{L.RECORD_NAMES.get(rtype, f'type {rtype}')} record: {K.STATUS_TEXT[code]}"
        rows.append({"file": str(path), "buffer_index": -1, "file_offset": off,
                     "record_offset": off - data_offset, "kind": K.ERROR_KIND[code],
                     "message": f"{path}: byte offset {off}: {what}"})
    return rows
