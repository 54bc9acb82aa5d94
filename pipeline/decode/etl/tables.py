"""The ETL decoder's tables, each declared once: name, columns with their Arrow types, which may be null.

From a :class:`Table` come the forms its users need: the pyarrow schema that every part is written with
(``schema``), the DuckDB column list of an empty table of its shape (``ddl``: the joins' SQL runs on a trace
that lacks some event kinds) and an empty Arrow table (``empty``). A column is NOT NULL unless named in
``nullable``: a parquet part then needs no definition levels for it, and a reader knows it has no nulls.

``OUTPUT`` holds the final tables that partitions and buckets write part by part (``scratch.write_final``);
``SCRATCH`` the scratch tables the whole-trace joins read (``joins``). Adding a table: one ``Table`` here,
in the registry its writer uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

#: DuckDB's name of each Arrow type used here.
_DUCKDB = {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT",
           pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT", pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN",
           pa.list_(pa.uint64()): "UBIGINT[]"}


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, pa.DataType], ...]
    nullable: tuple[str, ...] = ()

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c, t, nullable=c in self.nullable) for c, t in self.columns])

    @property
    def ddl(self) -> str:
        """``name TYPE, ...`` for ``CREATE TABLE t (...)``."""
        return ", ".join(f"{c} {_DUCKDB[t]}" for c, t in self.columns)

    def empty(self) -> pa.Table:
        return self.schema.empty_table()


I64, I32, U8, U16, U32, U64, STR, BOOL = pa.int64(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(), pa.string(), pa.bool_()
FRAMES = pa.list_(pa.uint64())
#: The columns every event-like scratch table starts with: raw time, time since the trace start, CPU and the
#: record's position in its CPU's stream (the global order is (timestamp, cpu, stream_pos)).
_EVENT = (("timestamp", I64), ("timestamp_ns", I64), ("cpu", U16), ("stream_pos", I64))


def _registry(*tables: Table) -> dict[str, Table]:
    return {t.name: t for t in tables}


OUTPUT = _registry(
    Table("samples", (("timestamp", I64), ("timestamp_ns", I64), ("cpu", U16), ("tid", U32), ("pid", U32),
                      ("ip", U64), ("stack_id", I64), ("stream_pos", I64)), nullable=("pid", "stack_id")),
    Table("virtual_allocs", (("timestamp", I64), ("timestamp_ns", I64), ("cpu", U16), ("pid", U32), ("tid", U32),
                             ("base", U64), ("size", U64), ("flags", U32), ("kind", STR), ("stack_id", I64)),
          nullable=("tid", "stack_id")),
    Table("heap_events", (("timestamp", I64), ("timestamp_ns", I64), ("cpu", U16), ("pid", U32), ("tid", U32),
                          ("kind", STR), ("heap", U64), ("address", U64), ("size", U64), ("old_address", U64),
                          ("old_size", U64), ("flags", U32), ("source", U32), ("stack_id", I64)),
          nullable=("stack_id",)),
    Table("event_stacks", (("timestamp", I64), ("timestamp_ns", I64), ("cpu", U16), ("stream_pos", I64),
                           ("tid", U32), ("stack_id", I64)), nullable=("stack_id",)),
)

SCRATCH = _registry(
    Table("_process_events", _EVENT + (("kind", STR), ("pid", U32), ("parent_pid", U32), ("session", U32),
                                       ("exit_status", I32), ("unique_process_key", U64), ("flags", U32),
                                       ("image_name", STR), ("command_line", STR), ("version", U16))),
    Table("_thread_events", _EVENT + (("kind", STR), ("pid", U32), ("tid", U32), ("win32_start_addr", U64),
                                      ("thread_name", STR))),
    Table("_image_events", _EVENT + (("kind", STR), ("pid", U32), ("base", U64), ("size", U64), ("checksum", U32),
                                     ("time_date_stamp", U32), ("file_name", STR))),
    Table("_image_id_info", _EVENT + (("base", U64), ("size", U64), ("pid", U32), ("time_date_stamp", U32),
                                      ("original_file_name", STR))),
    Table("_image_id_dbg", _EVENT + (("base", U64), ("pid", U32), ("pdb_guid", STR), ("pdb_age", U32),
                                     ("pdb_name", STR), ("il", BOOL))),
    Table("_stack_defs", _EVENT + (("key", U64), ("opcode", U8), ("h1", U64), ("h2", U64), ("n", I32))),
    Table("_stack_frames", (("h1", U64), ("h2", U64), ("frames", FRAMES))),
    Table("_heapsnap_stacks", (("snapshot_id", I64), ("stack_ref", U64), ("stack_id", I64), ("id_check", U64),
                               ("frames", FRAMES))),
    # written by the bucket tasks: each bucket's distinct stacks and the pieces they are made of
    Table("_bucket_stacks", (("stack_id", I64), ("id_check", U64), ("bucket", I32))),
    Table("_bucket_stack_pieces", (("stack_id", I64), ("id_check", U64), ("bucket", I32), ("ord", I32), ("h1", U64),
                                   ("h2", U64))),
)


@dataclass(frozen=True)
class ThreadStacked:
    """An output table whose rows take the stack logged for their (time, thread): the partitions emit them as
    ``scratch`` rows (the table's columns but ``stack_id``; ``timestamp``, ``cpu``, ``stream_pos`` and ``tid`` at
    least), bucketed by time; each bucket joins them to its stack groups and writes the table's parts
    (``buckets._bucket_task``), and a sample's adopted stack goes back among the pieces when such a row shares
    its (time, thread). A new event kind with a stack: its extractor (``interpret.DISPATCH``), its ``Table`` in
    ``OUTPUT``, and a row here."""

    table: str
    scratch: str
    #: One row per event: an event with several stack items has one scratch row per item, all alike.
    one_per_event: bool = False

    @property
    def columns(self) -> list[str]:
        """The scratch columns the table keeps, in its order (``stack_id`` is added by the join)."""
        return [c for c, _ in OUTPUT[self.table].columns if c != "stack_id"]


THREAD_STACKED = (
    ThreadStacked("heap_events", "_heap_events"),
    ThreadStacked("event_stacks", "_event_stack_links", one_per_event=True),
)
