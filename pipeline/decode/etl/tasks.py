"""What goes to a worker and what comes back: the partition tasks of the ETL decoder, as dataclasses.

The client plans one :class:`PartitionTask` per run of buffers (``plan_partitions``); a worker decodes it
(``partition.decode_partition``) and answers with a :class:`PartitionResult`: the parts it wrote
(:class:`WrittenParts`, from ``partition.write_parts``) and its counts. The client takes the small tables out
of each result as it arrives (``partition.InlineScratch``), then hands every result to the joins
(``joins.finish``), which read where the scratch parts are and what each partition settled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow


@dataclass
class PartitionTask:
    """One partition of the trace: buffers that lie side by side in the file, decoded on one worker."""

    #: The trace: a path, or an fsspec URL the worker reads its range from (``pipeline.sources``).
    path: str
    #: The partition's buffer descriptors (``buffers.walk``'s dtype plus ``stream_rank``), in file order.
    buffers: np.ndarray
    #: The partition's number: the names of the files it writes (``partition-<part>``).
    part: int
    #: The trace's clock, from the logfile header: ``header_ts`` and ``perf_freq``.
    consts: dict[str, int]
    #: The stage's output directory (final tables) and the scratch directory of the joins.
    out_dir: str
    scratch_dir: str


@dataclass
class WrittenParts:
    """The files one partition wrote, and what the joins need to know of them (``partition.write_parts``)."""

    #: Table -> the part file written for it (final tables and larger scratch tables).
    tables: dict[str, str]
    #: A sample of the event times, from which the client plans the time buckets of the joins.
    times: np.ndarray
    #: Bucketed scratch table -> (IPC file, first time, last time): a bucket task's sources.
    sources: dict[str, tuple[str, int, int]]
    #: Scratch file -> rows written into it (the samples settled by their stack keys, ``KEYED_SAMPLES``, too).
    scratch_rows: dict[str, int]
    #: Small scratch tables handed back instead of written (the client writes them together).
    inline: dict[str, pa.Table]
    #: Rows settled in the partition, by kind (``settle``): samples, heap events, stack keys with samples.
    settled: dict[str, int]


@dataclass
class PartitionResult(WrittenParts):
    """A decoded partition: its parts and its counts."""

    part: int = 0
    #: Records walked.
    records: int = 0
    #: Bytes of the partition's buffers in the file.
    bytes: int = 0
    #: (provider, opcode, event id, version, header type, count) of each kind of event seen.
    event_counts: list[tuple] = field(default_factory=list)
    #: Rows of the ``errors`` table: damage found, with the file and place.
    errors: list[ErrorRow] = field(default_factory=list)
    #: Buffers skipped whole (a size that cannot be, data that does not inflate) or from a bad record on.
    buffers_skipped: int = 0


@dataclass
class JoinTask:
    """What every task of the joins' one map (after the partitions) is given."""

    scratch_dir: str
    out_dir: str
    #: The trace's stack-key definitions, saved as arrays (``joins._stack_key_defs``): a path.
    stack_defs: str
    #: (header_ts, perf_freq): a timestamp's nanoseconds (``settle.to_ns``).
    clock: tuple[int, int]


@dataclass
class BucketTask(JoinTask):
    """One time bucket of the per-event joins (``buckets.bucket_task``): the scratch rows with times in
    [lo, hi) of every partition, joined to their stacks and threads."""

    #: Bucketed scratch table -> the (IPC file, first time, last time) sources that overlap the bucket.
    sources: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    #: The thread instances as slots, saved as arrays (``joins._thread_slots``): a path.
    threads: str = ""
    bucket: int = 0
    lo: int = 0
    hi: int = 0


@dataclass
class KeyedSamplesTask(JoinTask):
    """One partition's samples settled by their stack keys (``settle.keyed_samples_task``)."""

    #: The partition's IPC file of those samples.
    keyed_samples: str = ""
    part: int = 0
    #: The writer number of the stacks it writes (after the buckets').
    writer: int = 0


@dataclass
class BucketResult:
    """What a bucket or keyed-samples task wrote and counted (summed into the manifest by ``joins.finish``)."""

    #: The bucket number, or the keyed-samples task's writer number.
    bucket: int
    #: Table -> the part file written.
    tables: dict[str, str] = field(default_factory=dict)
    #: Scratch table -> rows read (every scratch row is read by exactly one task: ``joins._check_rows``).
    rows_in: dict[str, int] = field(default_factory=dict)
    groups: int = 0
    samples: int = 0
    samples_with_stack: int = 0
    samples_with_stack_records: int = 0
    samples_adopted_stacks: int = 0
    samples_settled_by_keys: int = 0
    stack_keys_unresolved: int = 0
    adopted_stacks_rejoined: int = 0
