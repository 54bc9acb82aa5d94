"""Layer 3, events: one module per event family, each a set of payload extractors.

An extractor receives the partition's :class:`~pipeline.decode.etl.batch.Batch` and the indices of the
records it owns, reads their payload fields column-wise and emits rows to one table (``Batch.emit``). Which
extractor owns which event kind is the one dispatch table, :data:`pipeline.decode.etl.interpret.DISPATCH`.
The families: ``lifetimes`` (Process, Thread, Image, ImageID/DbgID), ``sampling`` (SampledProfile),
``stackwalk`` (StackWalk, stack keys, stacks inline in EVENT_HEADER records), ``memory`` (VirtualAlloc,
heap events), ``sysconfig``; heap snapshots are ``pipeline.decode.etl.heapsnap``. The section numbers (§)
are those of ``../shared/docs``' ETL layout notes. Helpers the families share are in ``fields``.
"""
