"""Layer 3, interpretation: ONE dispatch table from (provider, opcode, version) to a payload extractor.

The extractors live in :mod:`pipeline.decode.etl.events`, one module per event family (heap snapshots in
:mod:`pipeline.decode.etl.heapsnap`). An extractor receives the partition's :class:`Batch` and the indices
of the records it owns, reads their payload fields column-wise and emits rows to one table. Records no
extractor claims (and records an extractor rejects as too short) go to the ``events`` table, so nothing is
invisible. Tables whose rows need information from other buffers (stacks, process of a sample, lifetimes)
are emitted as raw ``_``-prefixed scratch tables and finished by :mod:`pipeline.decode.etl.joins`.
Adding an event kind: its extractor in the family's module (or a new one), and a row here.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pipeline.decode.etl import heapsnap
from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch
from pipeline.decode.etl.events.lifetimes import IMAGE_KIND, PROCESS_KIND, THREAD_KIND, dbg_id, image, image_id, process, thread
from pipeline.decode.etl.events.memory import HEAP_KIND, heap, virtual_alloc
from pipeline.decode.etl.events.sampling import sampled_profile
from pipeline.decode.etl.events.stackwalk import stack_key_def, stack_key_ref, stack_walk
from pipeline.decode.etl.events.sysconfig import sysconfig_cpu

Extractor = Callable[[Batch, np.ndarray], None]


# --- THE dispatch table ----------------------------------------------------------------------------
#: (provider GUID, id, version or None for any) -> extractor. ``id`` is the opcode (Class.Type) of
#: kernel and classic events and the event id of manifest (EVENT_HEADER) events. Extractors bound every
#: read by the record's payload length, so later versions that append fields decode with the same code.
DISPATCH: dict[tuple[str, int, int | None], Extractor] = {
    **{(L.PROCESS_GUID, op, None): process for op in PROCESS_KIND},
    **{(L.THREAD_GUID, op, None): thread for op in THREAD_KIND},
    **{(L.IMAGE_GUID, op, None): image for op in IMAGE_KIND},
    (L.IMAGE_ID_GUID, 0, None): image_id,
    (L.IMAGE_ID_GUID, 36, None): dbg_id,
    (L.IMAGE_ID_GUID, 37, None): dbg_id,
    (L.PERFINFO_GUID, 46, None): sampled_profile,
    (L.STACKWALK_GUID, 32, None): stack_walk,
    (L.STACKWALK_GUID, 37, None): stack_key_ref,
    (L.STACKWALK_GUID, 38, None): stack_key_ref,
    **{(L.STACKWALK_GUID, op, None): stack_key_def for op in (34, 35, 36)},
    (L.PAGEFAULT_GUID, 98, None): virtual_alloc,
    (L.PAGEFAULT_GUID, 99, None): virtual_alloc,
    **{(L.HEAP_GUID, op, None): heap for op in HEAP_KIND},
    (L.SYSCONFIG_GUID, 10, None): sysconfig_cpu,
    (heapsnap.PROVIDER, heapsnap.EVENT_CHUNK, 1): heapsnap.chunk_events,
    (heapsnap.PROVIDER, heapsnap.EVENT_END, 1): heapsnap.end_events,
}

#: Header kinds whose records carry the payload layouts above: kernel/classic layouts for all
#: extractors except the manifest-event ones.
KERNEL_OR_CLASSIC = frozenset(L.SYSTEM_KINDS) | {L.HT_FULL32, L.HT_FULL64, L.HT_INSTANCE32, L.HT_INSTANCE64}
MANIFEST = frozenset({L.HT_EVENT32, L.HT_EVENT64})
HEADER_KINDS: dict[Extractor, frozenset] = {heapsnap.chunk_events: MANIFEST, heapsnap.end_events: MANIFEST}


def lookup(provider: str, opcode: int, event_id: int, version: int, header_type: int) -> Extractor | None:
    """The extractor of one event kind, or None (the records then go to ``events``)."""
    key_id = event_id if header_type in MANIFEST else opcode
    fn = DISPATCH.get((provider, key_id, version)) or DISPATCH.get((provider, key_id, None))
    if fn is None or header_type not in HEADER_KINDS.get(fn, KERNEL_OR_CLASSIC):
        return None
    return fn
