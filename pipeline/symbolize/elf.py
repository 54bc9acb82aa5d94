"""Linux images (from a perf.data run): ELF files by build id, and the kernel.

An image of a perf run is one executable mapping of a file (``decoded/images``: ``base`` the mapping's start,
``pgoff`` its offset in the file), so a frame's RVA here is its **file offset**: ``address - base + pgoff``
(:func:`pipeline.symbolize.lookup.assemble`). Its address table is built in the same terms: symbolic's SymCache of
the ELF file (DWARF when the file has it, else its symbol table) gives addresses relative to the file's load
address, which the file's PT_LOAD program headers turn into file offsets, segment by segment. Two mappings of one
file (rustc's librustc_driver has two executable segments, their ``p_vaddr - p_offset`` differing) thus find their
functions in one table.

Identity: the build id perf recorded for the file (HEADER_BUILD_ID or the MMAP2 record), checked against the
file found at the recorded path; a file without a build id (librustc_driver has none) is taken by its path as it
is now, which the report's symbol line says. Kernel images (pid 0) resolve to one function, ``[kernel]``; the
``[vdso]`` is read from perf's build-id cache or, on the kernel that was recorded, from this process's own.

Which file: the run's copy (``capture --perf --symbols``, :func:`use_bundled`), else the recorded path; either only
when it can be an ELF image (:func:`pipeline.decode.perf.elfload.image_file`: a perf.data names any path). The
unwinder of a DWARF run finds its files the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.decode.perf.elfload import VDSO, bundled_copy, image_file, load_segments, path_key, vdso_file

if TYPE_CHECKING:
    from pipeline.contracts import ImageIdentity, SymbolLookup

KERNEL_KEY = "linux-kernel"
#: Where distributions install detached debug files, by build id (``<dir>/.build-id/ab/cdef….debug``; Debian's
#: ``*-dbg``/``*-dbgsym`` packages, Fedora's ``debuginfo``): searched before the mapped file itself.
DEBUG_DIRS = (Path("/usr/lib/debug"),)
KERNEL_FUNCTION = "[kernel]"


def identities(images, ids: list) -> None:
    """Fill the ``ids`` entries still None of a perf run's ``images`` (it has a ``pgoff`` column): kernel images
    (pid 0) get the kernel identity, files with a path their ELF identity; pseudo files (``[vdso]``, anonymous
    JIT maps ``//anon``) none."""
    if "pgoff" not in images.column_names:
        return
    pids = images.column("pid").to_pylist()
    names = images.column("file_name").to_pylist()
    bids = images.column("build_id").to_pylist() if "build_id" in images.column_names else [None] * len(pids)
    for i, (pid, name, bid) in enumerate(zip(pids, names, bids)):
        if ids[i] is not None or not name:
            continue
        if pid == 0:
            ids[i] = {"key": KERNEL_KEY, "debug_id": KERNEL_KEY, "pdb_name": None, "kernel": True}
        elif name.startswith("/"):
            key = f"elf-{bid}" if bid else path_key(name)
            ids[i] = {"key": key, "debug_id": key, "pdb_name": None, "elf_path": name, "build_id": bid}
        elif name == VDSO and bid:
            ids[i] = {"key": f"elf-{bid}", "debug_id": f"elf-{bid}", "pdb_name": None, "elf_path": VDSO,
                      "build_id": bid}


def use_bundled(ids: list, symbols_dir: Path) -> int:
    """Point the ELF identities of ``ids`` at the run's own copies of their files (``symbols_dir/elf/<key>/``,
    :func:`pipeline.decode.perf.elfload.bundled_copy`, the unwinder's lookup too), which are read before the recorded
    paths; a copy found for a file without a build id gives the copy's key (a table of its own whatever file lies at
    that path here). How many identities found a copy."""
    found = 0
    for ident in {id(i): i for i in ids if i and i.get("elf_path", "").startswith("/")}.values():
        copy = bundled_copy(symbols_dir, ident["elf_path"], ident.get("build_id"))
        if copy is None:
            continue
        ident.update(key=copy.parent.name, debug_id=copy.parent.name, bundled=str(copy))
        found += 1
    return found


def to_file_offsets(starts: np.ndarray, range_loc: np.ndarray, segments: list[tuple[int, int, int]],
                    none: int) -> tuple[np.ndarray, np.ndarray]:
    """Ranges starting at addresses relative to the load address (the first PT_LOAD's ``p_vaddr``, as symbolic
    counts them) moved to file offsets, each by its segment; ranges in no segment's file bytes dropped, and a gap
    (``none``) added where each segment's bytes end."""
    if not segments:
        return starts, range_loc
    load = segments[0][1]
    svma = starts.astype(np.uint64) + np.uint64(load)
    out_start, out_loc = [], []
    for p_offset, p_vaddr, p_filesz in segments:
        inside = (svma >= np.uint64(p_vaddr)) & (svma < np.uint64(p_vaddr + p_filesz))
        out_start.append(svma[inside] - np.uint64(p_vaddr) + np.uint64(p_offset))
        out_loc.append(range_loc[inside])
        out_start.append(np.array([p_offset + p_filesz], np.uint64))
        out_loc.append(np.array([none], range_loc.dtype))
    s = np.concatenate(out_start)
    loc = np.concatenate(out_loc)
    order = np.argsort(s, kind="stable")
    s, loc = s[order], loc[order]
    keep = np.append(s[1:] != s[:-1], True) & (s <= np.uint64(0xFFFFFFFF))     # (one range per start: the last)
    return s[keep].astype(np.uint32), loc[keep]


def _kernel_table(meta: dict):
    from pipeline.symbolize.table import AddressTable

    return AddressTable.from_publics(np.zeros(1, np.uint64), [KERNEL_FUNCTION], dict(meta, kind="kernel"))


def _open(path: Path):
    """symbolic's object of an ELF file, or the reason it has none."""
    from symbolic import Archive

    try:
        obj = next(iter(Archive.open(str(path)).iter_objects()), None)
    except Exception as exc:  # noqa: BLE001 - symbolic raises its own hierarchy; a reason, not a crash
        return None, f"unreadable ELF file {path}: {type(exc).__name__}: {exc}"
    return (obj, None) if obj is not None else (None, f"unreadable ELF file {path}: no objects")


def debug_file(build_id: str | None, dirs=DEBUG_DIRS) -> Path | None:
    """The detached debug file of ``build_id`` in the distribution's debug directories, if one is there."""
    if not build_id or len(build_id) < 4:
        return None
    for d in dirs:
        candidate = d / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
        if candidate.is_file():
            return candidate
    return None


def _elf_table(path: Path, desc: ImageIdentity, meta: dict) -> tuple[Any, str | None]:
    import io

    from pipeline.symbolize.symc import SymcFile
    from pipeline.symbolize.table import NONE, AddressTable

    obj, reason = _open(path)
    if obj is None:
        return None, reason
    want = desc.get("build_id")
    if want and (obj.code_id or "").lower() != want.lower():
        return None, (f"build id mismatch: {path} has {obj.code_id or '(none)'}, the recording saw {want} "
                      "(the file was replaced since)")
    if desc.get("bundled"):     # (the run's copy of the debug file, beside its copy of the file)
        detached = path.with_name(f"{path.name}.debug") if want else None
        detached = detached if detached is not None and detached.is_file() else None
    else:
        detached = debug_file(want)
    if detached is not None:
        dbg, _ = _open(detached)
        if dbg is not None and (dbg.code_id or "").lower() == want.lower():
            obj = dbg
            meta["debug_file"] = str(detached)
    buf = io.BytesIO()
    obj.make_symcache().dump_into(buf)
    symc = SymcFile(buf.getvalue(), where=f"SymCache of {path}")
    if len(symc.ranges) == 0:
        return None, f"{path} has neither a symbol table nor debug information"
    meta.update(kind="elf" if want else "elf-unchecked", arch=obj.arch, file_debug_id=obj.debug_id,
                code_id=obj.code_id, features=sorted(obj.features))
    table = AddressTable.from_symc(symc, meta)
    table.starts, table.range_loc = to_file_offsets(table.starts, table.range_loc, load_segments(path), NONE)
    return table, None


def _table_result(result: SymbolLookup, table, directory: Path) -> SymbolLookup:
    result.update(status="ok", table_dir=str(directory), functions=len(table.names), ranges=int(len(table.starts)))
    return result


def resolve_elf(desc: ImageIdentity, cache: Path, result: SymbolLookup) -> SymbolLookup:
    """The task of :func:`pipeline.symbolize.build.resolve_debug_id` for a Linux image: its cached table, or the
    table built from the kernel's one name or from the ELF file at the recorded path."""
    import importlib.util

    from pipeline.symbolize.table import TABLE_VERSION, load_cached, symbolic_version, table_dir

    key = desc["key"]
    table = load_cached(cache, key)
    if table is not None:
        result.update(cached=True, kind=table.meta.get("kind"), source=table.meta.get("source_file"))
        return _table_result(result, table, table_dir(cache, key))
    meta: dict[str, Any] = {"table_version": TABLE_VERSION, "symbolic": symbolic_version(), "debug_id": key}
    if desc.get("kernel"):
        table = _kernel_table(meta)
    else:
        path = Path(desc.get("bundled") or desc["elf_path"])
        if importlib.util.find_spec("symbolic") is None:
            result.update(status="missing", reason=f"reading ELF file {path} needs the `symbolic` package")
            return result
        path, reason = (vdso_file(desc["build_id"], cache / "vdso") if desc["elf_path"] == VDSO
                        else image_file(path))
        if path is None:
            result.update(status="missing", reason=reason)
            return result
        meta["source_file"] = str(path)
        table, reason = _elf_table(path, desc, meta)
        if table is None:
            result.update(status="missing", reason=reason, source=str(path))
            return result
        result.update(source=str(path), found_via="the run's symbols" if desc.get("bundled") else "recorded path")
    result.update(kind=table.meta["kind"])
    return _table_result(result, table, table.save(table_dir(cache, key)))
