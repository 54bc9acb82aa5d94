"""The self-profiles of a run decoded (:func:`decode_profiles`): grouped into tasks by size (:func:`plan_groups`),
each task (:func:`decode_group`) reading its files (:mod:`.reader`) into one parquet part of ``query_events`` and one
``self_profiles`` row per file."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pipeline import sources

if TYPE_CHECKING:
    from pipeline.contracts import SelfProfileCounts

EVENTS_TABLE = "query_events"
FILES_TABLE = "self_profiles"

#: files per task: a task takes files until it holds this many bytes (a whole bootstrap has
#: hundreds of files, most of them small).
GROUP_BYTES = 32 << 20

#: How parts are written: dictionaries for the string columns only, delta encoding for the
#: increasing integer columns (half the write time of the defaults, and smaller files).
PARQUET_OPTIONS = {
    "compression": "zstd",
    "use_dictionary": ["crate", "kind", "label", "payload"],
    "column_encoding": {c: "DELTA_BINARY_PACKED" for c in ("event_index", "start_ns", "end_ns", "self_ns", "parent")},
}

_PROBE_NAME = re.compile(r"^___-\d+\.mm_profdata$")
_NAME_PID = re.compile(r"^(?P<crate>.+)-(?P<pid>\d+)\.mm_profdata$")


def events_schema():
    import pyarrow as pa

    d = pa.dictionary(pa.int32(), pa.string())
    return pa.schema([
        ("file_id", pa.int32()), ("pid", pa.int64()), ("crate", d), ("thread", pa.uint32()),
        ("event_index", pa.int64()), ("kind", d), ("label", d), ("args", pa.list_(pa.string())),
        ("string_id", pa.int64()),
        ("payload", d), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("value", pa.int64()),
        ("self_ns", pa.int64()), ("depth", pa.int32()), ("parent", pa.int64()),
    ])


def files_schema():
    import pyarrow as pa

    return pa.schema([
        ("file_id", pa.int32()), ("path", pa.string()), ("size", pa.int64()), ("status", pa.string()),
        ("error", pa.string()), ("format_version", pa.int32()), ("pid", pa.int64()), ("crate", pa.string()),
        ("cmd", pa.string()), ("start_time_ns", pa.int64()), ("counter", pa.string()),
        ("events", pa.int64()), ("threads", pa.int32()), ("unknown_events", pa.int64()),
        ("index_entries", pa.int64()), ("decode_s", pa.float64()), ("part", pa.string()),
    ])


#: The crate a rustc command line compiles: ``--crate-name X``, ``--crate-name=X``, either quoted (a Windows
#: command line). The same rule as the aggregate stage's ``CMD_CRATE_SQL``, which matches self-profiles to
#: ETL processes by it; a test holds the two to the same answers.
_CRATE_NAME = re.compile(r'--crate-name"?[ =]+"?([^ "]+)')


def crate_of(cmd: str | None, path: sources.Input) -> str:
    """The crate named by ``--crate-name`` in the command line, else the file-name prefix."""
    m = _CRATE_NAME.search(cmd or "")
    if m:
        return m.group(1)
    m = _NAME_PID.match(sources.name(path))
    return m.group("crate") if m else sources.stem(path)


def events_table(file_id: int, prof, crate: str):
    """The ``query_events`` rows of one decoded file, in file order."""
    import numpy as np
    import pyarrow as pa

    from pipeline.decode.measureme.layout import INTEGER, INTERVAL, PAYLOAD_NAMES
    from pipeline.decode.measureme.reader import split_event_id

    n = prof.n_events
    labels: dict[str, int] = {}
    label_of_code = np.empty(len(prof.strings), np.int32)
    args_of_code = []
    for code, text in enumerate(prof.strings):
        label, args = split_event_id(text)
        label_of_code[code] = labels.setdefault(label, len(labels))
        args_of_code.append(args)
    label_dict = pa.array(list(labels), pa.string())
    used = np.zeros(len(prof.strings), bool)  # the few kind strings, numbered in O(n) (no sort)
    used[prof.kind_code] = True
    kind_codes = np.nonzero(used)[0]
    kind_idx = (np.cumsum(used) - 1)[prof.kind_code]
    kind_dict = pa.array([prof.strings[c] for c in kind_codes], pa.string())
    pay = prof.payload
    interval, integer = pay == INTERVAL, pay == INTEGER
    pay_dict = pa.array([PAYLOAD_NAMES[k] for k in sorted(PAYLOAD_NAMES)], pa.string())
    schema = events_schema()

    def dict_col(indices, dictionary):
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)

    cols = {
        "file_id": pa.array(np.full(n, file_id, np.int32)),
        "pid": pa.array(np.full(n, int(prof.metadata.get("process_id", -1)), np.int64)),
        "crate": dict_col(np.zeros(n, np.int32), pa.array([crate], pa.string())),
        "thread": pa.array(prof.thread, pa.uint32()),
        "event_index": pa.array(np.arange(n, dtype=np.int64)),
        "kind": dict_col(kind_idx.astype(np.int32), kind_dict),
        "label": dict_col(label_of_code[prof.id_code], label_dict),
        "args": pa.array(args_of_code, pa.list_(pa.string())).take(pa.array(prof.id_code)),
        "string_id": pa.array(prof.string_id),
        "payload": dict_col(pay.astype(np.int32) - 1, pay_dict),
        "start_ns": pa.array(prof.start, mask=integer),
        "end_ns": pa.array(prof.end, mask=~interval),
        "value": pa.array(prof.start, mask=~integer),
        "self_ns": pa.array(prof.self_ns, mask=~interval),
        "depth": pa.array(prof.depth, pa.int32()),
        "parent": pa.array(prof.parent, pa.int64()),
    }
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


class ProfileGroup(TypedDict):
    """One task of the self-profile decode: its files (file id, path), in input order, and its part file."""

    files: list[tuple[int, str]]
    part: str           # the part file's name in ``query_events/``
    out: str            # its path


def decode_group(group: ProfileGroup) -> list[dict[str, Any]]:
    """Dask task: decode ``group['files']`` (list of (file_id, path)) into one part file.

    Returns one ``self_profiles`` row per file; bulk data stays on disk.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.decode.measureme.reader import UNKNOWN, ProfileError, read_profile

    rows, tables = [], []
    for file_id, path in group["files"]:
        path = sources.parse(path)
        row: dict[str, Any] = {"file_id": file_id, "path": str(path), "size": sources.size(path),
                               "status": "ok", "part": None}
        t0 = time.perf_counter()
        try:
            prof = read_profile(path)
        except ProfileError as exc:
            row.update(status="error", error=str(exc))
            rows.append(row)
            continue
        except MemoryError:
            row.update(status="error", error=f"{path}: out of memory decoding {row['size']} bytes "
                                             f"(raise cluster.memory_limit)")
            rows.append(row)
            continue
        meta = prof.metadata
        cmd = meta.get("cmd")
        crate = crate_of(cmd, path)
        table = events_table(file_id, prof, crate)
        unknown = [i for i, s in enumerate(prof.strings) if s == UNKNOWN]
        counter = meta.get("counter")
        row.update(
            format_version=prof.version, pid=meta.get("process_id"), crate=crate, cmd=cmd,
            start_time_ns=meta.get("start_time"),
            counter=counter.get("name") if isinstance(counter, dict) else None,
            events=prof.n_events, threads=prof.n_threads,
            unknown_events=int(np.isin(prof.id_code, unknown).sum()) if unknown else 0,
            index_entries=prof.index_entries, decode_s=round(time.perf_counter() - t0, 4),
            part=group["part"],
        )
        rows.append(row)
        tables.append(table)
    if tables:
        table = pa.concat_tables(tables).unify_dictionaries()
        pq.write_table(table, group["out"], **PARQUET_OPTIONS)
    return rows


def plan_groups(files: list[tuple[int, sources.Input]], n_workers: int, parts_dir: Path) -> list[ProfileGroup]:
    """Bins of files in input order, each up to GROUP_BYTES, and at least 2 per worker if possible."""
    sizes = {file_id: sources.size(p) for file_id, p in files}
    total = sum(sizes.values())
    target = max(1, min(GROUP_BYTES, total // max(1, 2 * n_workers)))
    groups: list[list[tuple[int, str]]] = [[]]
    size = 0
    for file_id, path in files:
        if groups[-1] and size >= target:
            groups.append([])
            size = 0
        groups[-1].append((file_id, str(path)))
        size += sizes[file_id]
    return [{"files": g, "part": f"part-{i:05d}.parquet", "out": str(parts_dir / f"part-{i:05d}.parquet")}
            for i, g in enumerate(groups) if g]


def decode_profiles(paths: list[sources.Input], out, cfg, pool) -> SelfProfileCounts:
    """Decode self-profiles into ``out``'s ``query_events`` (dataset dir) and ``self_profiles`` tables."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    parts_dir = out.table_path(EVENTS_TABLE)
    parts_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    todo: list[tuple[int, Path]] = []
    for file_id, path in enumerate(sorted((sources.parse(p) for p in paths), key=str)):
        if cfg.skip_cargo_probe and _PROBE_NAME.match(sources.name(path)):
            rows.append({"file_id": file_id, "path": str(path), "size": sources.size(path),
                         "status": "skipped", "error": "cargo probe run (decode.skip_cargo_probe)"})
        else:
            todo.append((file_id, path))
    for result in pool.map(decode_group, plan_groups(todo, pool.n_workers, parts_dir)):
        rows.extend(result)
    rows.sort(key=lambda r: r["file_id"])
    if not any(parts_dir.iterdir()):
        pq.write_table(events_schema().empty_table(), parts_dir / "part-00000.parquet")
    schema = files_schema()
    out.write_table(FILES_TABLE, pa.Table.from_pylist(rows, schema=schema))
    events = sum(r.get("events") or 0 for r in rows)
    elapsed = time.perf_counter() - t0
    errors = [r["error"] for r in rows if r["status"] == "error"]
    return {
        "files": len(rows),
        "decoded": sum(r["status"] == "ok" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "errors": len(errors),
        "error_messages": errors[:20],
        "events": events,
        "elapsed_s": round(elapsed, 3),
    }
