"""The perf decoder's run: one ``perf.data`` file into the ``decoded/`` tables (:func:`decode_perf`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline import sources

if TYPE_CHECKING:
    from pipeline.contracts import PerfCounts

#: What the workers of a local cluster load while they start: what a part's task runs.
WARM_UP = ("pipeline.decode.perf.kernels", "pipeline.decode.perf.parts", "pipeline.decode.perf.unwind")

FILE_TABLE = "perf_file"
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: ``perf_file``'s columns: the file's 64-bit fields as unsigned, as the file has them (any value of a damaged
#: file fits).
FILE_SCHEMA = pa.schema([
    ("file", pa.string()), ("file_size", pa.int64()), ("data_offset", pa.uint64()), ("data_size", pa.uint64()),
    ("hostname", pa.string()), ("os_release", pa.string()), ("perf_version", pa.string()), ("arch", pa.string()),
    ("cpu_count", pa.int64()), ("cmdline", pa.string()), ("events", pa.int64()), ("event_type", pa.uint32()),
    ("event_config", pa.uint64()), ("sample_type", pa.string()), ("sample_freq", pa.uint64()),
    ("sample_period", pa.uint64()), ("clockid", pa.int64()), ("origin_timestamp", pa.int64()),
    ("origin_unix_ns", pa.int64()), ("first_sample_time", pa.uint64()), ("last_sample_time", pa.uint64()),
    ("features", pa.string()), ("build_ids", pa.int64())])
RECORD_COUNTS_TABLE = "perf_record_counts"


def decode_perf(path: sources.Input, out, cfg, pool) -> PerfCounts:
    """Decode one perf.data file into ``out`` (a StageOutput); returns the summary stored in the manifest.

    Here, a walk of the record headers cuts the data section into parts of about ``cfg.partition_bytes`` at
    record boundaries (``records.plan_parts``), and a second one reads the task and mmap records of the whole
    file: the processes, threads and images, which the DWARF unwind of every part needs. The parts go to
    ``pool.map`` (``parts.decode_part``: the walk of their samples, the unwind, the stack ids); their rows are
    put together here in file order, so the tables are those of one part whatever the cut. A URL is one part
    (a task would read the whole file)."""
    from pipeline import portable
    from pipeline.decode.etl.decoder import ERRORS_SCHEMA
    from pipeline.decode.perf import kernels as K
    from pipeline.decode.perf import layout as L
    from pipeline.decode.perf import tables as T
    from pipeline.decode.perf.header import read_header
    from pipeline.decode.perf.parts import PartTask, decode_part, is_dwarf, read_ipc
    from pipeline.decode.perf.records import error_rows, load, plan_parts, read_tasks, sample_layout
    from pipeline.mirror import placed_by

    t0 = time.perf_counter()
    local = not sources.is_url(path)
    data = load(path)
    hdr = read_header(path, data)
    lay = sample_layout(path, hdr)
    tk = read_tasks(data, hdr, lay)
    cuts = plan_parts(data, hdr, cfg.partition_bytes if local else max(len(data), 1))
    del data
    dwarf = is_dwarf(hdr.attrs[0].sample_type)
    # (the images for the unwind: their raw load and unload times need no samples)
    images_raw = T.images_table(tk, T.lifetimes(tk, []), 0)[0] if dwarf else None
    scratch = out.path / ".scratch-perf"
    scratch.mkdir(parents=True, exist_ok=True)
    # (the run's copies of its images' files, from `capture --perf --symbols`: capture.bundle.SYMBOLS)
    symbols = Path(out.run_dir).absolute() / "symbols"
    tasks = [PartTask(path=str(Path(path).resolve()) if local else str(path), part=k, lo=lo, hi=hi, rec0=rec0,
                      scratch_dir=str(scratch), max_errors=cfg.max_error_rows, symbols_dir=str(symbols),
                      cache_dir=str(cfg.cache_dir)) for k, (lo, hi, rec0) in enumerate(cuts)]
    pool.require_shared(out.path, placed_by(out.run_dir))        # (the tasks write their parts there)
    parts = pool.map(decode_part, tasks, images=images_raw)
    t_walk = time.perf_counter()
    seen = T.firsts(*np.concatenate([r.seen for r in parts]).T) if parts else []
    origin = T.origin(tk, min((r.sample_min for r in parts if r.sample_min), default=0))
    life = T.lifetimes(tk, seen)
    images, inherited, refused = T.images_table(tk, life, origin)
    samples = T.samples_table([read_ipc(r.samples) for r in parts], origin)
    stacks, collisions = T.stacks_table([read_ipc(r.stacks) for r in parts])
    out.write_table("samples", samples)
    out.write_table("stacks", stacks.sort_by("stack_id"))
    out.write_table("processes", T.processes_table(life, origin))
    out.write_table("threads", T.threads_table(life, origin))
    out.write_table("images", images)
    portable.remove_tree(scratch)
    tot = np.sum([r.totals for r in parts], axis=0)
    type_counts = np.sum([r.type_counts for r in parts], axis=0)
    errors = hdr.errors + error_rows(path, np.concatenate([r.errors for r in parts])[:cfg.max_error_rows],
                                     hdr.data_offset)
    if refused:
        errors.append({"file": str(path), "buffer_index": -1, "file_offset": hdr.data_offset, "record_offset": -1,
                       "kind": "images",
                       "message": f"{path}: forked processes would start with {inherited + refused:,} mappings of "
                                  f"their parents, past {T.INHERITED_MAX:,}: the last {refused:,} were not copied "
                                  "(samples before those children's exec stay without an image)"})
    total_errors = len(hdr.errors) + int(tot[K.N_ERRORS]) + bool(refused)
    out.write_table("errors", pa.Table.from_pylist(errors[:cfg.max_error_rows], schema=ERRORS_SCHEMA))
    out.manifest["errors_total"] = total_errors
    counts = [(t, L.RECORD_NAMES.get(t, "unknown" if t < 255 else "unknown (type above 254)"), int(c))
              for t, c in enumerate(type_counts.tolist()) if c]
    out.write_table(RECORD_COUNTS_TABLE, pa.table({
        "type": pa.array([c[0] for c in counts], pa.uint32()), "name": pa.array([c[1] for c in counts], pa.string()),
        "count": pa.array([c[2] for c in counts], pa.int64())}))
    attr = hdr.attrs[0]
    # (the Unix time of timestamp_ns 0, when perf wrote its clock's reference: what puts samples on the wall clock)
    origin_unix_ns = origin - hdr.clock_ref_ns + hdr.clock_wall_ns if hdr.clock_ref_ns is not None and origin else None
    if origin_unix_ns is not None and not INT64_MIN <= origin_unix_ns <= INT64_MAX:
        origin_unix_ns = None       # (a clock reference no real recording has: no wall time, rather than a wrong one)
    out.write_table(FILE_TABLE, pa.Table.from_pylist([{
        "file": str(path), "file_size": hdr.file_size, "data_offset": hdr.data_offset, "data_size": hdr.data_size,
        "hostname": hdr.hostname, "os_release": hdr.os_release, "perf_version": hdr.perf_version, "arch": hdr.arch,
        "cpu_count": hdr.nr_cpus_online, "cmdline": " ".join(hdr.cmdline) if hdr.cmdline is not None else None,
        "events": len(hdr.attrs), "event_type": attr.type, "event_config": attr.config,
        "sample_type": attr.sample_type_names(), "sample_freq": attr.sample_period if attr.freq else None,
        "sample_period": None if attr.freq else attr.sample_period, "clockid": attr.clockid,
        "origin_timestamp": origin, "origin_unix_ns": origin_unix_ns,
        "first_sample_time": hdr.first_sample_time,
        "last_sample_time": hdr.last_sample_time,
        "features": ",".join(L.FEATURE_NAMES.get(b, str(b)) for b in hdr.features),
        "build_ids": len(hdr.build_ids),
    }], schema=FILE_SCHEMA))
    elapsed = time.perf_counter() - t0
    summary: PerfCounts = {
        "file": str(path), "file_size": hdr.file_size, "records": int(tot[K.N_RECORDS]),
        "samples": samples.num_rows, "samples_with_stack": int(samples.column("stack_id").is_valid().to_numpy(
            zero_copy_only=False).sum()) if samples.num_rows else 0,
        "stacks": stacks.num_rows, "stack_id_collisions": int(collisions), "processes": len(life.processes),
        "threads": len(life.threads), "images": images.num_rows, "images_inherited": inherited,
        "build_ids": len(hdr.build_ids), "errors": total_errors, "lost_events": int(tot[K.N_LOST]),
        "lost_samples": int(tot[K.N_LOST_SAMPLES]), "bytes_skipped": int(tot[K.N_SKIPPED]),
        "resyncs": int(tot[K.N_RESYNCS]), "origin_unix_ns": origin_unix_ns, "parts": len(parts),
        "walk_s": round(t_walk - t0, 3),
        "decode_s": round(elapsed, 3), "tables_s": round(elapsed - (t_walk - t0), 3),
        "mb_per_s": round(hdr.file_size / 1e6 / max(elapsed, 1e-9), 1),
    }
    if dwarf:
        from pipeline.decode.perf.unwind import merged_info

        summary["dwarf_unwind"] = merged_info([r.unwound for r in parts])
    out.manifest["perf"] = summary
    return summary
