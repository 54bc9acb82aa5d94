"""What a decode worker process keeps between its tasks.

* Memory: inside a task, glibc reuses freed memory for the next column instead of handing it back to the kernel
  (``reuse_freed_memory``); once the process has been idle for ``IDLE_TRIM_S``, or turns from partitions to
  buckets, free memory goes back (``release_freed_memory``).
* What it has written for the decode it works for: the frames of each distinct stack piece and the distinct
  stacks recur in task after task, and each is written once per process (``write_frame_rows``,
  ``write_stacks_once``), into files that are never replaced (``_write_new``).

Partition tasks (``partition.py``) and bucket tasks (``buckets.py``, ``settle.py``) both use it; it imports neither.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.decode.etl.batch import PairSet
from pipeline.decode.etl.scratch import write_part
from pipeline.decode.etl.stackkeys import forget_defs
from pipeline.cluster import gcpolicy
from pipeline.decode.etl.stacks import Stacks


#: glibc malloc settings for the decode tasks (see :func:`reuse_freed_memory`).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # mallopt parameter numbers (malloc.h)


@functools.cache
def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


#: Seconds a worker must be idle before freed memory goes back to the kernel (see below).
IDLE_TRIM_S = 0.5
_trim_lock = threading.Lock()
_trim_timer: threading.Timer | None = None


_last_kind: list[str] = []


@contextlib.contextmanager
def reuse_freed_memory(kind: str = "partition"):
    """Inside: glibc reuses freed memory for the next column instead of returning it to the kernel.
    Once the process has run no partition for ``IDLE_TRIM_S``, free memory goes back to the kernel, so an
    idle worker does not hold a partition's worth while the joins run.

    dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``. Setting any threshold turns off
    glibc's adaptive mmap threshold, so every array above 128 KiB becomes its own mmap and every use of
    it page-faults fresh zeroed pages (the interpretation took far longer, mostly in the kernel). Inside,
    arrays up to 32 MiB come from the heap and up to 128 MiB of freed memory stays there; the peak of a task is
    unchanged. Trimming after every task instead of when idle cost page faults in proportion to the trace. Idle,
    Arrow's allocator is emptied too. No-op without glibc."""
    # A process that turns from partitions to buckets first gives back what the partitions left in its
    # heap: the phases follow each other too closely for the idle trim, and both together raised a
    # worker's peak by ~100 MB.
    if _last_kind and _last_kind[-1] != kind:
        release_freed_memory()
    _last_kind[:] = [kind]
    gcpolicy.set_aside_at_first_task()
    libc = _glibc()
    if libc is None:
        yield
        return
    with _reuse_freed_memory(libc):
        yield


@contextlib.contextmanager
def _reuse_freed_memory(libc):
    global _trim_timer
    with _trim_lock:
        if _trim_timer is not None:
            _trim_timer.cancel()
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _trim_lock:
            _trim_timer = threading.Timer(IDLE_TRIM_S, release_freed_memory)
            _trim_timer.daemon = True
            _trim_timer.start()


def let_go() -> None:
    """Before the decode's output is swapped into place: no map or handle of a file in it stays open here (the
    stack definitions' ``.npy`` maps): Windows renames and removes no file that a process holds, and the idle trim
    that drops them runs only where glibc is, and only once the process has been idle a while."""
    import gc

    release_freed_memory()
    gc.collect()


def release_freed_memory() -> None:
    """Free memory back to the kernel: glibc's heap and Arrow's own allocator (which keeps freed buffers
    of concat_tables and the parquet writer for reuse)."""
    with _written_lock:
        _written.clear()
    forget_defs()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    pa.default_memory_pool().release_unused()


#: Scratch tables that the joins read keeping one row per key, whatever file it comes from: the frames of each
#: distinct stack piece (h1, h2, frames), and the stacks that partitions settled (``_bucket_stacks``, with
#: their pieces in ``_bucket_stack_pieces``; one row per (stack id, id check)).
FRAMES, STACKS = "_stack_frames", "_bucket_stacks"
#: What this process has written of those tables for the decode it works for: [(scratch directory,
#: {table: PairSet})]. At most ``REMEMBERED`` keys a table (~48 MB); then that table starts over. Emptied with
#: the rest of a worker's memory when its partitions are done (``release_freed_memory``).
_written: list = []
_written_lock = threading.Lock()
REMEMBERED = 1 << 21


@contextlib.contextmanager
def _remembered(scratch_dir: Path, table: str):
    """The keys of ``table`` that this process has written into ``scratch_dir`` (a PairSet to ``add`` to).

    A stack piece, and a stack, recur in partition after partition, and each partition wrote them again:
    on the 1 GB synth trace with 250,000 distinct stacks, 1.1 M rows of frames for 263,000 distinct pieces,
    and 1.06 M stack rows. Now once per worker. Only for tables larger than ``INLINE_BYTES``: smaller ones
    go back with the task's result as before (a few files per decode instead of one per partition).

    Safe when a task runs again (a lost result, a worker that died): every file has a name of its own and
    is never replaced (``_write_new``), so each key remembered here is in a file that stays; a key written
    twice (by two processes, or after the memory starts over) is kept once by the joins."""
    with _written_lock:        # (tasks may run on several threads of a worker; the sets are not thread-safe)
        if not _written or _written[0][0] != str(scratch_dir):
            _written[:] = [(str(scratch_dir), {})]
        sets = _written[0][1]
        if table not in sets or sets[table].n > REMEMBERED:
            sets[table] = PairSet()
        yield sets[table]


def write_frame_rows(data: pa.Table, part: int, scratch_dir: Path) -> None:
    """The partition's ``_stack_frames`` rows whose piece this process has not written for this decode."""
    with _remembered(scratch_dir, FRAMES) as seen:
        new = seen.add(data.column("h1").to_numpy(), data.column("h2").to_numpy())
    _write_new(data if new.all() else data.filter(pa.array(new)), FRAMES, f"partition-{part:05d}", scratch_dir)


def write_stack_rows(stacks: Stacks, part: int, scratch_dir: Path) -> None:
    """The stacks of the rows a partition settled (writer ``-1 - part``) that this process has not written
    for this decode, with their pieces."""
    write_stacks_once(stacks, -1 - part, f"partition-{part:05d}", scratch_dir)


def write_stacks_once(stacks: Stacks, writer: int, name: str, scratch_dir: Path) -> None:
    """``stacks`` (as writer ``writer``) but those this process has written for this decode, with their
    pieces, in files named after ``name``."""
    with _remembered(scratch_dir, STACKS) as seen:
        stacks = stacks.only(seen.add(stacks.sid.view(np.uint64), stacks.check))
    for table, data in stacks.tables(writer).items():
        _write_new(data, table, name, scratch_dir)


def _write_new(data: pa.Table, table: str, name: str, scratch_dir: Path) -> None:
    """A task's rows of ``table`` in a scratch file of a name of its own (``name`` and a random suffix:
    never replaced, never inline, as a task's result can be lost and a file cannot); nothing when there
    are no rows."""
    if not data.num_rows:
        return
    directory = scratch_dir / f"{table}.parquet"
    directory.mkdir(parents=True, exist_ok=True)
    write_part(data, directory / f"{name}-{uuid.uuid4().hex[:12]}.parquet", compression="none", use_dictionary=False)
