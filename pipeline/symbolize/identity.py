"""Which symbols each image of a run needs: its PDB identity from the trace's DbgID records, or its binary's."""

from __future__ import annotations

import ntpath
from typing import TYPE_CHECKING

from pipeline.symbolize.frames import INT64_MIN, column

if TYPE_CHECKING:
    from pipeline.contracts import ImageIdentity


def image_debug_ids(images, image_ids) -> list[ImageIdentity | None]:
    """Symbol identity of each images row: a dict with ``key`` (what the lookup task is keyed by),
    or None when neither a DbgID record nor the binary's TimeDateStamp is known.

    A DbgID record (``guid``, ``age``, ``pdb_name``, ``debug_id``; key = debug id) belongs to the
    image with the same (pid, base); when a range was reused and several loads share that key, the
    record's ``timestamp_ns`` (if the table has it) picks the latest load at or before it. An image
    without its own record borrows the one of another load of the same file name (the same file
    has the same PDB). Failing that, an image with a TimeDateStamp gets the binary's identity
    (``code_file``, ``code_key``; key = ``pe:<name>/<code key>``): the task fetches the binary and
    reads its PDB identity from it.
    """
    from pipeline.symbolize.build import debug_id_of

    n = images.num_rows
    ids: list[ImageIdentity | None] = [None] * n
    if image_ids is not None and image_ids.num_rows:
        _dbgid_identities(images, image_ids, ids, debug_id_of)
    names = images.column("file_name").to_pylist()
    by_name = {names[i].lower(): ident for i, ident in enumerate(ids) if ident is not None and names[i]}
    stamps = (column(images, "time_date_stamp", "decoded/images.parquet", 0).tolist()
              if "time_date_stamp" in images.column_names else [0] * n)
    sizes = column(images, "size", "decoded/images.parquet", 0).tolist()
    for i in range(n):
        if ids[i] is None and names[i] and names[i].lower() in by_name:
            ids[i] = by_name[names[i].lower()]
        elif ids[i] is None and stamps[i] and names[i]:
            from pipeline.symbolize.pe import code_key

            file = module_name(names[i])
            ck = code_key(stamps[i], sizes[i])
            ids[i] = {"key": f"pe:{file}/{ck}", "code_file": file, "code_key": ck, "debug_id": None,
                      "pdb_name": None}
    from pipeline.symbolize.elf import identities

    identities(images, ids)     # (the ELF images and the kernel of a perf run)
    return ids


def _dbgid_identities(images, image_ids, ids: list, debug_id_of) -> None:
    """Fill ``ids`` from the trace's DbgID records (see :func:`image_debug_ids`)."""
    where = "decoded/image_ids.parquet"
    img_pid = column(images, "pid", "decoded/images.parquet", 0).tolist()
    img_base = column(images, "base", "decoded/images.parquet", 0).tolist()
    img_load = column(images, "load_ns", "decoded/images.parquet", INT64_MIN).tolist()
    loads_of: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(img_pid, img_base)):
        loads_of.setdefault(key, []).append(i)
    n_ids = image_ids.num_rows
    times = (column(image_ids, "timestamp_ns", where, 0).tolist() if "timestamp_ns" in image_ids.column_names
             else [None] * n_ids)
    kinds = (image_ids.column("debug_kind").to_pylist() if "debug_kind" in image_ids.column_names
             else [None] * n_ids)
    records = sorted(
        zip(column(image_ids, "pid", where, 0).tolist(), column(image_ids, "base", where, 0).tolist(),
            image_ids.column("pdb_guid").to_pylist(), image_ids.column("pdb_age").to_pylist(),
            image_ids.column("pdb_name").to_pylist(), times, kinds),
        # a native image's own PDB (RSDS) wins over the IL assembly's (ILRSDS) of the same load:
        # it is applied last
        key=lambda r: r[6] == "RSDS",
    )
    for pid, base, guid, age, name, ts, _kind in records:
        rows = loads_of.get((int(pid), int(base)))
        if not guid or age is None or not name or not rows:
            continue
        if len(rows) > 1 and ts is not None:
            before = [r for r in rows if img_load[r] <= ts]
            rows = [max(before, key=lambda r: img_load[r])] if before else [min(rows, key=lambda r: img_load[r])]
        debug_id = debug_id_of(str(guid), int(age))
        ident = {"key": debug_id, "guid": str(guid), "age": int(age),
                 "pdb_name": ntpath.basename(name.replace("/", "\\")), "debug_id": debug_id}
        for r in rows:
            ids[r] = ident


def module_name(file_name: str | None) -> str | None:
    if not file_name:
        return None
    return ntpath.basename(file_name.replace("/", "\\")) or file_name
