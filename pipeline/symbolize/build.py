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
from typing import TYPE_CHECKING, Any

from pipeline.symbolize.symbolpath import Entry, Fetch, locate, store_key
from pipeline.symbolize.table import TABLE_VERSION, AddressTable, load_cached, symbolic_version, table_dir

if TYPE_CHECKING:
    from pipeline.contracts import ImageIdentity, SymbolLookup


#: Architectures without x86 ``__cdecl`` name decoration: a leading ``_`` is part of the name.
WIDE_ARCHES = ("x86_64", "arm64", "arm64e", "aarch64")


def debug_id_of(guid: str, age: int) -> str:
    """symbolic's debug id text: lowercase dashed GUID, ``-``, age in hex (``…-44205044422e-1``)."""
    g = guid.strip("{}").lower()
    return f"{g}-{int(age):x}"


def _guid_part(debug_id: str) -> str:
    return debug_id.lower().replace("-", "")[:32]


def have_symbolic() -> bool:
    import importlib.util

    return importlib.util.find_spec("symbolic") is not None


def identity_check(debug_id: str):
    """``check`` for :func:`locate`: None when a symbol file holds ``debug_id``'s GUID, else the reason."""

    def check(path: Path) -> str | None:
        if not have_symbolic():         # (a PDB's GUID, from its info stream; nothing else is readable)
            from pipeline.symbolize.pdbpublics import pdb_guid

            guid = pdb_guid(path)
            if guid is None:
                return f"{path} is not a PDB (other symbol files need the `symbolic` package)"
            return None if _guid_part(guid) == _guid_part(debug_id) else \
                f"GUID mismatch: {path} has GUID {guid}, the trace wants {debug_id}"
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
    """Make the address table of ``debug_id`` from a PDB or Breakpad file (None + reason on failure). Without
    symbolic, a PDB's public symbols: function names, no lines or inlines."""
    if not have_symbolic():
        return _publics_table(symbol_file, debug_id)
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


def _publics_table(symbol_file: Path, debug_id: str) -> tuple[AddressTable | None, str | None]:
    """The table of a PDB's public symbols, read without symbolic (:mod:`.pdbpublics`)."""
    from pipeline.errors import InputError
    from pipeline.symbolize.pdbpublics import is_pdb, read_publics

    if not is_pdb(symbol_file):
        return None, f"{symbol_file} is not a PDB; other symbol files need the `symbolic` package"
    try:
        rvas, names, facts = read_publics(Path(symbol_file))
    except (InputError, OSError, IndexError, ValueError) as exc:
        return None, f"unreadable symbol file {symbol_file}: {exc}"
    meta: dict[str, Any] = {"table_version": TABLE_VERSION, "symbolic": None, "debug_id": debug_id,
                            "source_file": str(symbol_file), "file_format": "pdb", "kind": "pdb-publics", **facts}
    return AddressTable.from_publics(rvas, names, meta), None


def _table_result(result: SymbolLookup, table: AddressTable, directory: Path) -> SymbolLookup:
    result.update(status="ok", table_dir=str(directory), image_size=table.meta.get("image_size"),
                  layout=table.meta.get("layout"), functions=len(table.names), ranges=int(len(table.starts)))
    return result


def _resolve_pdb(ident: ImageIdentity, entries: list[Entry], cache: Path, fetch: Fetch,
                 result: SymbolLookup) -> SymbolLookup:
    """Cached table of ident's debug id, or find its PDB/Breakpad file and build the table."""
    debug_id = ident["debug_id"]
    table = load_cached(cache, debug_id)
    if table is not None:
        result.update(cached=True, kind=table.meta.get("kind"), source=table.meta.get("source_file"))
        return _table_result(result, table, table_dir(cache, debug_id))
    found = locate(entries, ident["pdb_name"], store_key(ident["guid"], ident["age"]), fetch,
                   identity_check(debug_id))
    result["requests"] += found.requests
    if found.path is None:
        result.update(status="missing", reason=found.reason, tried=found.tried[:20])
        return result
    try:
        table, reason = build_table(found.path, debug_id, cache)
    except Exception as exc:  # noqa: BLE001 - a corrupt symbol file is a reason, not a crash
        table, reason = None, f"cannot read {found.path}: {type(exc).__name__}: {exc}"
    if table is None:
        result.update(status="missing", reason=reason, source=str(found.path))
        return result
    result.update(kind=table.meta["kind"], source=str(found.path), found_via=found.source)
    return _table_result(result, table, table.save(table_dir(cache, debug_id)))


def binary_check(key: str):
    """``check`` for :func:`locate` when searching a binary by its code key (TimeDateStamp+SizeOfImage)."""

    def check(path: Path) -> str | None:
        from symbolic import Archive

        try:
            codes = [o.code_id for o in Archive.open(str(path)).iter_objects()]
        except Exception as exc:  # noqa: BLE001
            return f"unreadable binary {path}: {type(exc).__name__}: {exc}"
        if any((c or "").upper() == key for c in codes):
            return None
        return f"code id mismatch: {path} has {', '.join(c or '(none)' for c in codes)}, the trace wants {key}"

    return check


def _resolve_binary(desc: ImageIdentity, entries: list[Entry], cache: Path, fetch: Fetch,
                    result: SymbolLookup) -> SymbolLookup:
    """No DbgID in the trace: fetch the binary by its code key, read its PDB identity, then as above.

    Without a PDB, the binary's own export table (symbolic reads it) is the symbol source.
    """
    if not have_symbolic():
        result.update(status="missing", reason=f"no debug id in the trace for {desc['code_file']}, and finding its "
                                               "PDB through the binary needs the `symbolic` package")
        return result
    from symbolic import Archive

    from pipeline.symbolize.pe import read_codeview

    found = locate(entries, desc["code_file"], desc["code_key"], fetch, binary_check(desc["code_key"]))
    result["requests"] += found.requests
    if found.path is None:
        result.update(status="missing", reason=f"no debug id in the trace and binary {desc['code_file']}/"
                                               f"{desc['code_key']} {found.reason}")
        return result
    result["binary"] = str(found.path)
    cv = read_codeview(found.path)
    pdb_reason = "the binary names no PDB"
    if cv is not None:
        ident = dict(cv, debug_id=debug_id_of(cv["guid"], cv["age"]))
        result.update(learned_debug_id=ident["debug_id"], pdb_name=ident["pdb_name"])
        _resolve_pdb(ident, entries, cache, fetch, result)
        if result.get("status") == "ok":
            return result
        pdb_reason = result.get("reason", "not found")
    key = f"pe-{desc['code_file'].lower()}-{desc['code_key']}"
    table = load_cached(cache, key)
    if table is None:
        obj = next(iter(Archive.open(str(found.path)).iter_objects()), None)
        symc = None
        if obj is not None:
            import io

            from pipeline.symbolize.symc import SymcFile

            buf = io.BytesIO()
            obj.make_symcache().dump_into(buf)
            symc = SymcFile(buf.getvalue(), where=f"SymCache of {found.path}")
        if symc is None or len(symc.ranges) == 0:
            result.update(status="missing", reason=f"{pdb_reason}; the binary exports no functions")
            return result
        meta = {"table_version": TABLE_VERSION, "symbolic": symbolic_version(), "debug_id": key,
                "source_file": str(found.path), "kind": "pe-exports", "arch": obj.arch}
        table = AddressTable.from_symc(symc, meta)
        table.save(table_dir(cache, key))
    result.update(kind="pe-exports", source=str(found.path), pdb_reason=pdb_reason, reason=None)
    return _table_result(result, table, table_dir(cache, key))


def resolve_debug_id(desc: ImageIdentity, entries: list[Entry], cache_dir: str, fetch: Fetch) -> SymbolLookup:
    """Task: make sure the address table of one image identity is in ``<cache>/tables``.

    ``desc["key"]`` names the identity. With ``debug_id``, ``guid``, ``age`` and ``pdb_name`` it is a
    PDB (or Breakpad file) identity from the trace's DbgID record; with ``code_file`` and
    ``code_key`` it is a binary to fetch first (no DbgID record). Returns status, reason and small
    statistics; the table itself stays on disk.
    """
    t0 = time.perf_counter()
    cache = Path(cache_dir).expanduser()
    result: SymbolLookup = {"key": desc["key"], "debug_id": desc.get("debug_id"),
                              "pdb_name": desc.get("pdb_name"), "requests": 0, "cached": False}
    try:
        if desc.get("elf_path") or desc.get("kernel"):
            from pipeline.symbolize.elf import resolve_elf

            resolve_elf(desc, cache, result)
        elif desc.get("code_file"):
            result["code_file"] = desc["code_file"]
            _resolve_binary(desc, entries, cache, fetch, result)
        else:
            _resolve_pdb(desc, entries, cache, fetch, result)
    except Exception as exc:  # noqa: BLE001 - whatever a server or a file does, one image's line, the stage goes on
        result.update(status="missing", reason=f"symbol lookup failed: {type(exc).__name__}: {exc}")
    result["elapsed_s"] = round(time.perf_counter() - t0, 4)
    return result
