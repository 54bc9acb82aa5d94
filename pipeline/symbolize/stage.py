"""The symbolize stage's run (the steps are in :mod:`pipeline.symbolize`'s docstring) and its line in a job."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.progress import Status
from pipeline.runs import has_table, read_manifest, read_table, stage_output
from pipeline.stages import DECODED, SYMBOLIZED
from pipeline.symbolize.frames import collect_frames, map_images, sorted_frames
from pipeline.symbolize.identity import image_debug_ids
from pipeline.symbolize.lookup import assemble

if TYPE_CHECKING:
    from pipeline.contracts import ImageIdentity, SymbolizeSummary


STAGE = SYMBOLIZED


log = logging.getLogger("bootprof.symbolize")


def run(run_dir: Path, config, pool, inputs: list[Path] | None = None) -> SymbolizeSummary:
    """Symbolize ``RUN_DIR/decoded`` into ``RUN_DIR/symbolized``; returns the stage's summary."""
    from pipeline.cluster import Pool
    from pipeline.symbolize.build import resolve_debug_id
    from pipeline.symbolize.symbolpath import parse_symbol_path
    from pipeline.symbolize.table import is_cached

    run_dir = Path(run_dir)
    cfg = config.symbolize
    t0 = time.perf_counter()
    decoded = read_manifest(run_dir, DECODED)
    if not (has_table(run_dir, DECODED, "stacks") and has_table(run_dir, DECODED, "images")):
        # A run of self-profiles only has no stacks: the stage finishes with nothing to resolve, so a
        # job's later stages run as usual.
        with stage_output(run_dir, STAGE, inputs=decoded.get("inputs", []), config=config.resolved()) as out:
            out.manifest["skipped"] = "no ETL stacks or images in decoded/"
        return {"frames": 0, "skipped": "no ETL stacks or images in decoded/"}
    cache_dir = Path(cfg.cache_dir).expanduser().absolute()
    symbol_path = cfg.symbol_path if cfg.symbol_path is not None else os.environ.get("_NT_SYMBOL_PATH", "")
    bundled = run_dir / "symbols"
    if bundled.is_dir():        # (the PDBs that capture copied with the run: searched first)
        symbol_path = f"{bundled.absolute()};{symbol_path}" if symbol_path else str(bundled.absolute())
    entries = parse_symbol_path(symbol_path, cache_dir)

    frames = collect_frames(run_dir)
    images = read_table(run_dir, DECODED, "images")
    image_ids = read_table(run_dir, DECODED, "image_ids") if has_table(run_dir, DECODED, "image_ids") else None
    mapped = sorted_frames(map_images(frames, images), images)
    t_frames = time.perf_counter()

    ids = image_debug_ids(images, image_ids)
    if bundled.is_dir():        # (the ELF files that capture --perf --symbols copied: before the recorded paths)
        from pipeline.symbolize.elf import use_bundled

        use_bundled(ids, bundled)
    used = np.unique(mapped["image"][mapped["image"] >= 0])
    wanted: dict[str, ImageIdentity] = {}
    for row in used.tolist():
        if ids[row] is not None:
            wanted.setdefault(ids[row]["key"], ids[row])
    descs = [wanted[k] for k in sorted(wanted)]
    # Workers only for the symbol files to find and read: a table in the cache, or an image with nowhere to
    # look (no symbol path), takes milliseconds here, and a lazy pool then starts no cluster.
    todo = [d for d in descs if entries and (d.get("code_file") or not is_cached(cache_dir, d["debug_id"]))]
    here = [d for d in descs if d not in todo]
    # (on a terminal: how many symbol files are resolved, read or downloaded, out of how many)
    if todo:        # (the tasks write the symbol tables there, and this process reads them)
        cache_dir.mkdir(parents=True, exist_ok=True)
        pool.require_shared(cache_dir, "symbolize.cache_dir")
    missing_reader = symbolic_missing()
    if missing_reader:
        # (PDBs still give their public symbols; the run goes on)
        print(f"bootprof: symbolize: {missing_reader}", file=sys.stderr)
    with Status("symbolize", len(descs), unit="symbol files") as shown:
        shared = dict(on_result=lambda _: shown.advance(1), entries=entries, cache_dir=str(cache_dir),
                      fetch=fetch_limits(cfg))
        # (a map of nothing starts no cluster)
        results = Pool(None).map(resolve_debug_id, here, **shared) + pool.map(resolve_debug_id, todo, **shared)
    status = {r["key"]: r for r in results}
    t_symbols = time.perf_counter()

    frames_table, stats = assemble(mapped, images, ids, status)
    t_lookup = time.perf_counter()

    with stage_output(run_dir, STAGE, inputs=decoded.get("inputs", []), config=config.resolved()) as out:
        # string columns are dictionary arrays in memory; without the stored Arrow schema, readers see
        # plain strings (the parquet column is dictionary-encoded either way)
        out.write_table("frames", frames_table, store_schema=False)
        out.manifest.update(stats)
        out.manifest["symbol_path"] = symbol_path
        out.manifest["cache_dir"] = str(cache_dir)
        out.manifest["symbolic_missing"] = missing_reader
        out.manifest["debug_ids"] = sorted(
            ({k: v for k, v in r.items() if k != "tried"} for r in results), key=lambda r: r["key"])
        out.manifest["http_requests"] = int(sum(r.get("requests", 0) for r in results))
        out.manifest["reused_range_frames"] = mapped["reused_range_frames"]
        out.manifest["stack_sources"] = frames["sources"]
        out.manifest["timings_s"] = {
            "frames_and_images": round(t_frames - t0, 3),
            "symbol_files": round(t_symbols - t_frames, 3),
            "lookups": round(t_lookup - t_symbols, 3),
        }
    for img in stats["images_without_symbols"]:
        log.info("no symbols for %s (%s): %s", img["module"], img["debug_id"], img["reason"])
    if stats["images_without_symbols"]:
        log.warning("%d images without symbols (reasons in %s/%s/_manifest.json, images_without_symbols)",
                    len(stats["images_without_symbols"]), run_dir, STAGE)
    return {
        "frames": stats["frames"],
        "rows": frames_table.num_rows,
        "resolved_frames": stats["resolved_frames"],
        "resolution_rate": stats["resolution_rate"],
        "images_without_symbols": len(stats["images_without_symbols"]),
    }


#: What symbolize says without ``symbolic``, which has wheels for Linux and macOS, not for Windows, where pip builds it
#: from its sdist with a Rust toolchain.
SYMBOLIC_MISSING = ("the `symbolic` package is not installed: PDBs give function names from their public symbols "
                    "only (no source lines, no inlined frames), and other symbol files are not read; with a Rust "
                    "toolchain (https://rustup.rs), `pip install symbolic` builds it from its sdist")


def symbolic_missing() -> str | None:
    """Why symbol files cannot be read here (``SYMBOLIC_MISSING``), or None when they can."""
    import importlib.util

    return SYMBOLIC_MISSING if importlib.util.find_spec("symbolic") is None else None


def fetch_limits(cfg):
    """The download limits of the ``symbolize`` config section."""
    from pipeline.symbolize.symbolpath import Fetch

    return Fetch(timeout_s=cfg.download_timeout_s, deadline_s=cfg.download_deadline_s,
                 max_bytes=cfg.download_max_bytes, redirect_hosts=tuple(cfg.redirect_hosts))


def headline(summary: SymbolizeSummary) -> str:
    """The stage's line in a job's output."""
    if summary.get("skipped"):
        return f"nothing to resolve: {summary['skipped']}"
    missing = summary.get("images_without_symbols", 0)
    return (f"{summary.get('frames', 0):,} frames, {100 * summary.get('resolution_rate', 0):.1f} % resolved"
            + (f" ({missing:,} images without symbols)" if missing else ""))
