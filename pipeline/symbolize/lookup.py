"""Step 4 of the symbolize stage: each frame looked up in its image's address table, one output row per frame and
inline level, and the resolution rate per module."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.symbolize.frames import column
from pipeline.symbolize.identity import module_name

if TYPE_CHECKING:
    from pipeline.contracts import MissingSymbols, ModuleRate


def assemble(mapped: dict, images, ids: list, status: dict[str, dict]):
    """Build ``frames.parquet`` rows and the manifest statistics from mapped frames and tables."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.symbolize.table import NONE, AddressTable

    n = len(mapped["address"])
    image = mapped["image"]
    bases = column(images, "base", "images", 0).astype(np.uint64)
    loads = images.column("load_ns")
    unloads = images.column("unload_ns")
    modules = [module_name(f) for f in images.column("file_name").to_pylist()]
    has_image = image >= 0
    safe = np.maximum(image, 0)
    if "pgoff" in images.column_names:     # (a perf run's image is a mapping: its RVAs are file offsets, see .elf)
        bases = bases - column(images, "pgoff", "images", 0).astype(np.uint64)
    rva = np.where(has_image, mapped["address"] - bases[safe], 0).astype(np.uint64)
    # identity keys as small integer codes: code 0 = none, k = keys[k]
    keys = [None] + sorted({i["key"] for i in ids if i})
    code_of = {name: k for k, name in enumerate(keys)}
    image_code = np.array([code_of[i["key"]] if i else 0 for i in ids] + [0], dtype=np.int64)
    # the debug id shown per key: from the trace, or learned from the binary
    shown = [None] + [(status.get(k, {}).get("debug_id") or status.get(k, {}).get("learned_debug_id"))
                      for k in keys[1:]]
    frame_code = image_code[np.where(has_image, image, len(ids))]
    lookup_rva = rva - np.where(mapped["leaf"] | (rva == 0), 0, 1).astype(np.uint64)
    by_code = np.argsort(frame_code, kind="stable")
    bounds = np.searchsorted(frame_code[by_code], np.arange(len(keys) + 1))

    # Every string column is built as a dictionary array: per-row int indices into one dictionary
    # (the concatenated names / files of all tables), gathered with numpy. No string is copied per
    # row in Python or Arrow; the parquet writer stores the strings (see write_frames).
    parts: list[dict[str, np.ndarray]] = []
    names_dict: list = []       # pa arrays: each table's display names, then the unresolved names
    raw_dict: list = []
    files_dict: list = []
    n_names = n_files = 0
    resolved = np.zeros(n, dtype=bool)
    for key, res in sorted(status.items()):
        if res.get("status") != "ok":
            continue
        code = code_of.get(key)
        if code is None:
            continue
        sel = by_code[bounds[code] : bounds[code + 1]]
        if len(sel) == 0:
            continue
        table = AddressTable.load(Path(res["table_dir"]))
        query, loc, depth = table.chains(table.innermost(lookup_rva[sel]))
        if len(query) == 0:
            continue
        locs = table.locations[loc]
        file_idx = locs["file"].astype(np.int64)
        has_file = (file_idx != NONE) & (file_idx < len(table.files))
        line = locs["line"].astype(np.int64)
        resolved[sel[query]] = True
        parts.append({
            "frame": sel[query], "inline_depth": depth, "name": n_names + locs["function"].astype(np.int64),
            "file": np.where(has_file, n_files + file_idx, -1), "line": line,
        })
        names_dict.extend(table.names.chunks)
        raw_dict.extend(table.raw_names.chunks)
        files_dict.extend(table.files.chunks)
        n_names += len(table.names)
        n_files += len(table.files)
    unres = np.flatnonzero(~resolved)
    if len(unres):
        labels = [
            f"{modules[int(image[k])] or '?'}+0x{int(rva[k]):x}" if image[k] >= 0 else f"0x{int(mapped['address'][k]):x}"
            for k in unres.tolist()
        ]
        names_dict.append(pa.array(labels, pa.string()))
        parts.append({
            "frame": unres, "inline_depth": np.zeros(len(unres), dtype=np.int64),
            "name": n_names + np.arange(len(unres), dtype=np.int64), "file": np.full(len(unres), -1, np.int64),
            "line": np.zeros(len(unres), dtype=np.int64),
        })

    def gather(key):
        return np.concatenate([p[key] for p in parts]) if parts else np.zeros(0, dtype=np.int64)

    frame, depth = gather("frame"), gather("inline_depth")
    order = np.lexsort((depth, frame))
    frame, depth = frame[order], depth[order]
    name_idx, file_idx, line = gather("name")[order], gather("file")[order], gather("line")[order]
    img = image[frame]

    def dictionary(indices: np.ndarray, values: list, valid: np.ndarray | None = None):
        """Rows ``values[indices]``; null where ``valid`` is false or the value itself is null."""
        values = pa.concat_arrays([v.cast(pa.string()) for v in values]) if values else pa.array([], pa.string())
        safe_idx = np.where(indices >= 0, indices, 0).astype(np.int32)
        ok = np.ones(len(indices), dtype=bool) if valid is None else valid.copy()
        if values.null_count:
            present = values.is_valid().to_numpy(zero_copy_only=False)
            ok &= present[safe_idx] if len(values) else False
            values = pc.fill_null(values, "")
        if len(values) == 0:
            values = pa.array([""], pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(safe_idx, mask=~ok), values)

    def per_image(col):
        vals = col.take(pa.array(np.maximum(img, 0))) if len(col) else pa.nulls(len(frame), pa.int64())
        return pc.if_else(pa.array(img < 0), pa.scalar(None, vals.type), vals)

    is_resolved = resolved[frame]
    table = pa.table({
        "address": pa.array(mapped["address"][frame], pa.uint64()),
        "pid": pa.array(mapped["pid"][frame], pa.uint32()),
        "leaf": pa.array(mapped["leaf"][frame]),
        "module": dictionary(img, [pa.array(modules, pa.string())], img >= 0),
        "rva": pa.array(rva[frame], pa.uint64(), mask=img < 0),
        "function": dictionary(name_idx, names_dict),
        "raw_name": dictionary(name_idx, raw_dict, is_resolved),
        "inline_depth": pa.array(depth, pa.uint16()),
        "file": dictionary(file_idx, files_dict, file_idx >= 0),
        "line": pa.array(line, pa.uint32(), mask=line <= 0),
        "resolved": pa.array(is_resolved),
        "debug_id": dictionary(frame_code[frame], [pa.array(shown, pa.string())], frame_code[frame] > 0),
        "image_load_ns": per_image(loads),
        "image_unload_ns": per_image(unloads),
    })
    stats = _statistics(mapped, image, modules, ids, status, resolved)
    return table, stats


def _statistics(mapped, image, modules, ids, status, resolved) -> dict[str, Any]:
    """Resolution rate per module and one entry per image without symbols (with its reason)."""
    n = len(image)
    names = sorted({m or "?" for m in modules}) + ["(no image)"]
    code_of = {name: i for i, name in enumerate(names)}
    image_code = np.array([code_of[m or "?"] for m in modules] + [len(names) - 1], dtype=np.int64)
    frame_code = image_code[np.where(image >= 0, image, len(modules))]
    frames_per = np.bincount(frame_code, minlength=len(names))
    resolved_per = np.bincount(frame_code, weights=resolved.astype(np.int64), minlength=len(names)).astype(np.int64)
    per_module: dict[str, ModuleRate] = {
        names[i]: {"frames": int(frames_per[i]), "resolved": int(resolved_per[i]),
                   "rate": round(int(resolved_per[i]) / int(frames_per[i]), 6)}
        for i in np.flatnonzero(frames_per).tolist()
    }
    missing: dict[tuple[str, str], MissingSymbols] = {}
    used, counts = np.unique(image[image >= 0], return_counts=True)
    for row, count in zip(used.tolist(), counts.tolist()):
        ident = ids[row]
        if ident is None:
            reason, debug_id = ("no debug id: the trace has no DbgID_RSDS record and no TimeDateStamp "
                                "for this image"), ""
        else:
            res = status.get(ident["key"], {})
            debug_id = ident["debug_id"] or res.get("learned_debug_id") or ident["key"]
            if res.get("status") == "ok":
                continue
            reason = res.get("reason") or "not found"
        module = modules[row] or "?"
        entry = missing.setdefault((module, debug_id), {"module": module, "debug_id": debug_id or None,
                                                         "pdb_name": ident["pdb_name"] if ident else None,
                                                         "reason": reason, "frames": 0})
        entry["frames"] += count
    total_resolved = int(resolved.sum())
    return {
        "frames": n,
        "resolved_frames": total_resolved,
        "resolution_rate": round(total_resolved / n, 6) if n else 0.0,
        "modules": per_module,
        "images_without_symbols": sorted(missing.values(), key=lambda e: (e["module"], e["debug_id"] or "")),
    }
