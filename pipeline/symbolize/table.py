"""Sorted address tables, one per debug id, cached on disk: the warm path of symbolization.

A table answers "which function, file, line and inline chain covers this RVA" for millions of RVAs
with one ``np.searchsorted`` and a few gathers, no Python per address:

    starts[r]      u32, sorted: first RVA of range r (a range ends where the next one starts)
    range_loc[r]   u32: innermost location of range r, NONE for a gap (padding between functions)
    locations[l]   (function, file, line, parent): parent is the location this one was inlined
                   into, NONE for the real (outermost) function
    functions      raw name and display name of each function index (functions.parquet)
    files          path of each file index (files.parquet)

Tables are built once per debug id from symbolic's SymCache (PDB or Breakpad) or, for PDBs symbolic
cannot place, from the PDB's publics, and stored under ``<cache>/tables/<debug_id>/v<TABLE_VERSION>-<symbolic
version>/`` (written to a temporary directory, then renamed, so a reader sees a whole table or none). Each version
has its own directory: a table built by another version is never read, and never replaced (another install sharing
the cache may have it mapped).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import portable

NONE = 0xFFFFFFFF
#: Bump when the on-disk layout of a table or the name cleaning changes.
TABLE_VERSION = 1

LOCATION = np.dtype([("function", "<u4"), ("file", "<u4"), ("line", "<u4"), ("parent", "<u4")])


def symbolic_version() -> str | None:
    """The installed symbolic's version (part of a table's identity); None without it (tables of PDB publics)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("symbolic")
    except PackageNotFoundError:
        return None


@dataclass
class AddressTable:
    starts: np.ndarray          # u32[nr] sorted
    range_loc: np.ndarray       # u32[nr]
    locations: np.ndarray       # LOCATION[nl]
    raw_names: list[str]
    names: list[str]
    files: list[str | None]
    meta: dict

    # -- lookups -------------------------------------------------------------------------------

    def innermost(self, rvas: np.ndarray) -> np.ndarray:
        """Innermost location index of each RVA (int64), -1 where no range covers it."""
        rvas = np.asarray(rvas, dtype=np.uint64)
        out = np.full(len(rvas), -1, dtype=np.int64)
        if len(self.starts) == 0 or len(rvas) == 0:
            return out
        fits = rvas <= np.uint64(0xFFFFFFFF)
        idx = np.searchsorted(self.starts, rvas[fits].astype(np.uint32), side="right").astype(np.int64) - 1
        loc = np.full(len(idx), -1, dtype=np.int64)
        ok = idx >= 0
        found = self.range_loc[idx[ok]].astype(np.int64)
        found[found == NONE] = -1
        loc[ok] = found
        out[fits] = loc
        return out

    def chains(self, inner: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Expand innermost locations into inline chains.

        Returns ``(query, location, inline_depth)``, one entry per (query, level), ordered by query
        and then innermost first. ``inline_depth`` is 0 for the real function and grows towards
        the innermost inlined call. Queries with no location are left out.
        """
        parent = self.locations["parent"].astype(np.int64)
        parent[parent == NONE] = -1
        queries, levels = [], []
        q = np.flatnonzero(inner >= 0)
        cur = inner[q]
        level = 0
        while len(q):
            queries.append(q)
            levels.append((cur, np.full(len(q), level, dtype=np.int64)))
            nxt = parent[cur]
            keep = nxt >= 0
            q, cur = q[keep], nxt[keep]
            level += 1
            if level > 255:  # a cycle in a corrupt table must not loop forever
                break
        if not queries:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        query = np.concatenate(queries)
        loc = np.concatenate([c for c, _ in levels])
        from_inner = np.concatenate([lv for _, lv in levels])
        order = np.lexsort((from_inner, query))
        query, loc, from_inner = query[order], loc[order], from_inner[order]
        depth_count = np.bincount(query, minlength=len(inner))
        inline_depth = depth_count[query] - 1 - from_inner
        return query, loc, inline_depth

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_symc(cls, symc, meta: dict, publics: dict[int, str] | None = None) -> "AddressTable":
        """Table of a parsed ``.symc``.

        ``publics`` (RVA -> exact S_PUB32 name) improves function names at their entry address:
        a mangled public (Rust, C++) replaces the private name, because it demangles to the better
        name (``<Vec<T> as Drop>::drop`` rather than rustc's ``impl$3::drop`` or an asm alias) and
        keeps the Rust hash in ``raw_name``; and it undoes symbolic's x86 ``__cdecl`` undecoration,
        which also strips the leading ``_`` of 64-bit names.
        """
        from pipeline.symbolize.names import clean_names, is_mangled

        nr, nl = len(symc.ranges), len(symc.locations)
        locs = np.empty(nl, dtype=LOCATION)
        for field, src in (("function", "function"), ("file", "file"), ("line", "line"), ("parent", "inlined_into")):
            locs[field] = symc.locations[src]
        range_loc = np.arange(nl - nr, nl, dtype=np.uint32)
        gap = symc.locations["function"][nl - nr :] == NONE
        range_loc[gap] = NONE
        raw = symc.function_names()
        if publics:
            for i, pc in enumerate(symc.functions["entry_pc"].tolist()):
                exact = publics.get(pc)
                if exact is None or exact == raw[i]:
                    continue
                if is_mangled(exact) or (exact.startswith("_") and exact[1:] == raw[i]):
                    raw[i] = exact
        return cls(
            starts=np.ascontiguousarray(symc.ranges, dtype=np.uint32),
            range_loc=range_loc,
            locations=locs,
            raw_names=raw,
            names=clean_names(raw),
            files=symc.file_paths(),
            meta=meta,
        )

    @classmethod
    def from_publics(cls, rvas: np.ndarray, raw: list[str], meta: dict) -> "AddressTable":
        """One range per public symbol, reaching to the next one; no files, lines or inlines."""
        from pipeline.symbolize.names import clean_names

        keep = rvas <= np.uint64(0xFFFFFFFF)
        rvas = rvas[keep]
        raw = [r for r, k in zip(raw, keep) if k]
        # several names at one address: keep the first, so every start is unique
        starts, first = np.unique(rvas.astype(np.uint32), return_index=True)
        raw = [raw[i] for i in first]
        n = len(starts)
        locs = np.empty(n, dtype=LOCATION)
        locs["function"] = np.arange(n, dtype=np.uint32)
        locs["file"] = NONE
        locs["line"] = 0
        locs["parent"] = NONE
        return cls(starts, np.arange(n, dtype=np.uint32), locs, raw, clean_names(raw), [], meta)

    # -- storage -------------------------------------------------------------------------------

    def save(self, directory: Path) -> Path:
        """Write the table as ``directory`` (atomically: temp dir + rename; a concurrent writer wins). A directory is
        one version's (:func:`table_dir`), so no table is ever renamed over or aside: on Windows, another process
        may hold its files mapped."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir()
        try:
            np.save(tmp / "starts.npy", self.starts)
            np.save(tmp / "range_loc.npy", self.range_loc)
            np.save(tmp / "locations.npy", self.locations)
            pq.write_table(pa.table({"raw_name": pa.array(self.raw_names, pa.string()),
                                     "function": pa.array(self.names, pa.string())}), tmp / "functions.parquet")
            pq.write_table(pa.table({"path": pa.array(self.files, pa.string())}), tmp / "files.parquet")
            (tmp / "meta.json").write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            try:
                portable.rename(tmp, directory)
            except OSError:
                if not (directory / "meta.json").exists():
                    raise
                portable.remove_tree(tmp)  # another worker stored the same table first
        except BaseException:
            portable.remove_tree(tmp)
            raise
        return directory

    @classmethod
    def load(cls, directory: Path) -> "AddressTable":
        import pyarrow.parquet as pq

        directory = Path(directory)
        meta = json.loads((directory / "meta.json").read_text())
        functions = pq.read_table(directory / "functions.parquet")
        return cls(
            starts=np.load(directory / "starts.npy", mmap_mode="r"),
            range_loc=np.load(directory / "range_loc.npy", mmap_mode="r"),
            locations=np.load(directory / "locations.npy", mmap_mode="r"),
            raw_names=functions.column("raw_name"),
            names=functions.column("function"),
            files=pq.read_table(directory / "files.parquet").column("path"),
            meta=meta,
        )


def table_dir(cache_dir: Path, debug_id: str) -> Path:
    """Where the table of ``debug_id`` built by this version is: ``tables/<debug id>/v<TABLE_VERSION>-<symbolic's
    version, or 'publics' without it>``. Each version has its own, so two installs sharing a cache never replace
    each other's tables, and a table is never loaded by a version that did not build it."""
    return Path(cache_dir) / "tables" / debug_id / f"v{TABLE_VERSION}-{symbolic_version() or 'publics'}"


def is_cached(cache_dir: Path, debug_id: str) -> bool:
    """Whether the cache holds a table of ``debug_id`` built by this version (its metadata alone is read)."""
    try:
        meta = json.loads((table_dir(cache_dir, debug_id) / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("table_version") == TABLE_VERSION and meta.get("symbolic") == symbolic_version()


def load_cached(cache_dir: Path, debug_id: str) -> AddressTable | None:
    """The cached table of ``debug_id`` if one exists and was built by this version, else None."""
    return AddressTable.load(table_dir(cache_dir, debug_id)) if is_cached(cache_dir, debug_id) else None
