"""One task per debug id: find its symbol file, build its address table once, report what happened.

This is the function the dask pool runs (one call per distinct debug id of the images that occur in
stacks). It receives a small descriptor and returns a small dict; the table itself goes to the
cache directory, never through the scheduler. Nothing raises for a missing or unusable symbol file:
the reason comes back as data and the stage reports it once per image.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

from pipeline.symbolize.symbolpath import Entry, locate
from pipeline.symbolize.table import TABLE_VERSION, AddressTable, load_cached, symbolic_version, table_dir


#: Architectures without x86 ``__cdecl`` name decoration: a leading ``_`` is part of the name.
WIDE_ARCHES = ("x86_64", "arm64", "arm64e", "aarch64")


def debug_id_of(guid: str, age: int) -> str:
    """symbolic's debug id text: lowercase dashed GUID, ``-``, age in hex (``…-44205044422e-1``)."""
    g = guid.strip("{}").lower()
    return f"{g}-{int(age):x}"


def _guid_part(debug_id: str) -> str:
    return debug_id.lower().replace("-", "")[:32]


def identity_check(debug_id: str):
    """``check`` for :func:`locate`: None when a symbol file holds ``debug_id``'s GUID, else the reason."""

    def check(path: Path) -> str | None:
        from symbolic import Archive

        try:
            found = [o.debug_id for o in Archive.open(str(path)).iter_objects()]
        except Exception as exc:  # noqa: BLE001 - an unreadable candidate is skipped with its reason
            return f"unreadable symbol file {path}: {type(exc).__name__}: {exc}"
        if any(_guid_part(d) == _guid_part(debug_id) for d in found):
            return None
        return f"GUID mismatch: {path} has debug id {', '.join(found) or '(none)'}, the trace wants {debug_id}"

    return check


def build_table(symbol_file: Path, debug_id: str, cache_dir: Path) -> tuple[AddressTable | None, str | None]:
    """Make the address table of ``debug_id`` from a PDB or Breakpad file (None + reason on failure)."""
    from symbolic import Archive

    from pipeline.symbolize.symc import SymcFile

    try:
        archive = Archive.open(str(symbol_file))
        objects = list(archive.iter_objects())
    except Exception as exc:  # noqa: BLE001 - symbolic raises its own hierarchy; report, don't crash
        return None, f"unreadable symbol file {symbol_file}: {type(exc).__name__}: {exc}"
    if not objects:
        return None, f"unreadable symbol file {symbol_file}: no objects"
    obj = next((o for o in objects if _guid_part(o.debug_id) == _guid_part(debug_id)), None)
    if obj is None:
        found = ", ".join(o.debug_id for o in objects)
        return None, f"GUID mismatch: {symbol_file} has debug id {found}, the trace wants {debug_id}"
    meta: dict[str, Any] = {
        "table_version": TABLE_VERSION,
        "symbolic": symbolic_version(),
        "debug_id": debug_id,
        "file_debug_id": obj.debug_id,
        "source_file": str(symbol_file),
        "file_format": obj.file_format,
        "arch": obj.arch,
    }
    buf = io.BytesIO()
    obj.make_symcache().dump_into(buf)
    symc = SymcFile(buf.getvalue(), where=f"SymCache of {symbol_file}")
    if len(symc.ranges) == 0 and obj.file_format == "pdb":
        from pipeline.symbolize.pdbpublics import read_publics

        rvas, names, facts = read_publics(Path(symbol_file))
        meta.update(kind="pdb-publics", **facts)
        return AddressTable.from_publics(rvas, names, meta), None
    meta["kind"] = obj.file_format
    publics = None
    if obj.file_format == "pdb" and obj.arch in WIDE_ARCHES:
        from pipeline.symbolize.pdbpublics import read_publics

        rvas, names, _ = read_publics(Path(symbol_file))
        publics = dict(zip(rvas.tolist(), names))
    return AddressTable.from_symc(symc, meta, publics), None


def resolve_debug_id(desc: dict[str, Any], entries: list[Entry], cache_dir: str, timeout: float) -> dict[str, Any]:
    """Task: make sure ``<cache>/tables/<debug_id>`` exists; return status and small statistics.

    ``desc`` holds ``debug_id``, ``guid``, ``age`` and ``pdb_name``.
    """
    t0 = time.perf_counter()
    cache = Path(cache_dir).expanduser()
    debug_id = desc["debug_id"]
    result: dict[str, Any] = {"debug_id": debug_id, "pdb_name": desc["pdb_name"], "requests": 0, "cached": False}
    table = load_cached(cache, debug_id)
    if table is not None:
        result.update(status="ok", cached=True, kind=table.meta.get("kind"), source=table.meta.get("source_file"))
    else:
        found = locate(entries, desc["pdb_name"], desc["guid"], desc["age"], timeout, identity_check(debug_id))
        result["requests"] = found.requests
        if found.path is None:
            result.update(status="missing", reason=found.reason, tried=found.tried[:20])
            result["elapsed_s"] = round(time.perf_counter() - t0, 4)
            return result
        try:
            table, reason = build_table(found.path, debug_id, cache)
        except Exception as exc:  # noqa: BLE001 - a corrupt symbol file is a reason, not a crash
            table, reason = None, f"cannot read {found.path}: {type(exc).__name__}: {exc}"
        if table is None:
            result.update(status="missing", reason=reason, source=str(found.path))
            result["elapsed_s"] = round(time.perf_counter() - t0, 4)
            return result
        table.save(table_dir(cache, debug_id))
        result.update(status="ok", kind=table.meta["kind"], source=str(found.path), found_via=found.source)
    result["table_dir"] = str(table_dir(cache, debug_id))
    result["image_size"] = table.meta.get("image_size")
    result["layout"] = table.meta.get("layout")
    result["functions"] = len(table.names)
    result["ranges"] = int(len(table.starts))
    result["elapsed_s"] = round(time.perf_counter() - t0, 4)
    return result
