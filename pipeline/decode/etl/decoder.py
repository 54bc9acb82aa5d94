"""One ETL trace decoded, from its buffer chain to the joined tables (:func:`decode_etl`, called by
:func:`pipeline.decode.run`): the buffer headers walked (``buffers``), the buffers planned into partitions that the
pool's tasks decode (``partition``), the joins over the whole trace (``joins``, ``heapsnap``), then the ``trace``,
``event_counts`` and ``errors`` tables written here."""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline import portable, sources
from pipeline.decode.etl import layout as L
from pipeline.decode.etl.buffers import walk
from pipeline.errors import out_of_memory
from pipeline.progress import Status

if TYPE_CHECKING:
    from pipeline.contracts import ErrorRow, EtlCounts


def plan_partitions(bufs: np.ndarray, partition_bytes: int) -> list[np.ndarray]:
    """Split buffers (file order) into runs of about ``partition_bytes`` each, counting a buffer's
    inflated size when it is compressed (that is what a worker holds in memory)."""
    parts = []
    start = 0
    acc = 0
    for i, size in enumerate(np.maximum(bufs["buffer_size"], bufs["data_len"]).tolist()):
        acc += size
        if acc >= partition_bytes:
            parts.append(bufs[start:i + 1])
            start, acc = i + 1, 0
    if start < len(bufs):
        parts.append(bufs[start:])
    return parts


def stream_ranks(bufs: np.ndarray) -> np.ndarray:
    """Rank of each buffer inside its CPU's stream (ordered by SequenceNumber, then file position)."""
    order = np.lexsort((bufs["index"], bufs["sequence"], bufs["cpu"]))
    ranks = np.empty(len(bufs), np.int64)
    cpu_sorted = bufs["cpu"][order]
    first = np.searchsorted(cpu_sorted, cpu_sorted, side="left")
    ranks[order] = np.arange(len(bufs)) - first
    return ranks


def filetime_to_utc(ft: int) -> _dt.datetime | None:
    """A FILETIME (100 ns since 1601) as UTC; None when it is 0 or cannot be a time (``buffers.read_header``
    reports the latter)."""
    if not 0 < ft <= L.MAX_FILETIME:
        return None
    return _dt.datetime(1601, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(microseconds=ft // 10)


def decode_etl(path: sources.Input, out, cfg, pool) -> EtlCounts:
    """Decode one ETL trace into ``out`` (a StageOutput); returns the summary stored in the manifest. On a
    terminal, a status line shows the bytes decoded, the rate and the time to go, then the joins."""
    with Status("decode", 0) as status:
        return _decode_etl(path, out, cfg, pool, status)


def _let_go_everywhere(pool) -> None:
    from pipeline.decode.etl.workerstate import let_go

    try:
        pool.everywhere(let_go)
    except Exception:       # noqa: BLE001 - (a cluster that failed with the decode: its workers hold nothing to drop)
        let_go()


def _decode_etl(path: sources.Input, out, cfg, pool, status: Status) -> EtlCounts:
    import duckdb  # (imported here, so that set_aside keeps its objects out of the collector)

    from pipeline.decode.etl import heapsnap, joins
    from pipeline.decode.etl.partition import InlineScratch, decode_partition
    from pipeline.decode.etl.tasks import PartitionResult, PartitionTask
    from pipeline.decode.etl.workerstate import release_freed_memory
    from pipeline.mirror import placed_by

    pool.set_aside()
    t0 = time.time()
    path = path if sources.is_url(path) else Path(path).resolve()      # (a URL: each task reads its ranges from it)
    header, bufs = walk(path)
    ranks = stream_ranks(bufs)
    desc = np.empty(len(bufs), bufs.dtype.descr + [("stream_rank", "<i8")])
    for name in bufs.dtype.names:
        desc[name] = bufs[name]
    desc["stream_rank"] = ranks
    scratch = out.path / ".scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    consts = {"header_ts": header.header_ts, "perf_freq": header.perf_freq}
    tasks = [PartitionTask(path=str(path), buffers=part, part=i, consts=consts, out_dir=str(out.path),
                           scratch_dir=str(scratch))
             for i, part in enumerate(plan_partitions(desc, cfg.partition_bytes))]
    small = InlineScratch(scratch)
    status.total = int(desc["buffer_size"].sum())
    t_walk = time.time()
    pool.ready()        # (the cluster may still be starting: the manifest's cluster_wait_s)
    t_ready = time.time()
    preloading: list[threading.Thread] = []
    # (opened while the partitions run: the joins need it as soon as they end)
    connecting = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    con = connecting.submit(joins.connect, scratch, cfg)
    connecting.shutdown(wait=False)

    def take(result: PartitionResult) -> None:
        if not preloading and ("_heapsnap_chunks" in result.inline or "_heapsnap_chunks" in result.tables):
            preloading.append(threading.Thread(target=heapsnap.preload, name="bootprof-preload", daemon=True))
            preloading[0].start()
        small.take(result)
        status.advance(result.bytes)

    pool.require_shared(out.path, placed_by(out.run_dir))       # (the tasks write their parts there)
    try:
        results = pool.map(decode_partition, tasks, on_result=take)
        small.close()
        t_parts = time.time()
        status.say(f"{status.done / 1e9:.2f} GB in {t_parts - t0:.1f} s; joining stacks, processes and heap snapshots")

        errors = list(header.walk_errors) + header.field_errors
        for r in results:
            errors.extend(r.errors)
        write_event_counts(out, results)
        # Heap snapshots are assembled here, on a thread, while the workers run the bucket joins; the stacks
        # table needs them, so ``finish`` waits for them before building it.
        snap_errors: list[ErrorRow] = []

        def snapshots_beside() -> dict[str, int]:
            for thread in preloading:
                thread.join()
            return heapsnap.assemble(scratch, out, snap_errors, str(path), cfg.join_memory_limit)

        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as beside:
            snapshots = beside.submit(snapshots_beside)

            def snapshots_done() -> dict[str, int]:
                done = snapshots.result()
                errors.extend(snap_errors)
                release_freed_memory()
                return done

            try:
                joined = joins.finish(con.result(), out, scratch, header, cfg, pool, results, errors, snapshots_done)
            except duckdb.OutOfMemoryException as exc:
                # (the stage fails, nothing written, with the setting to change)
                raise out_of_memory(path, "the whole-trace joins", "decode.join_memory_limit", cfg.join_memory_limit,
                                    exc) from None
    except Exception:
        _let_go_everywhere(pool)    # (a failed decode's directory is removed: Windows removes no mapped file)
        raise
    # (the maps of scratch files, which Windows would not let the swap move; an interrupt ends the workers anyway)
    _let_go_everywhere(pool)
    portable.remove_tree(scratch)

    skipped = sum(r.buffers_skipped for r in results) + len(header.walk_errors)
    write_errors(out, errors, cfg.max_error_rows)
    f = header.fields
    events_lost = int(f["events_lost"])
    buffers_lost = int(f["buffers_lost"])
    flagged_events_lost = int(((bufs["buffer_flag"] & L.BUFFER_FLAG_EVENTS_LOST) != 0).sum())
    trace = {
        "file": str(path), "file_size": header.file_size,
        "os_version": f"{f['version_major']}.{f['version_minor']}", "os_build": f["os_build"],
        "log_format": f"{f['format_major']}.{f['format_minor']}",
        "pointer_size": header.pointer_size, "header_pointer_size": f["pointer_size"],
        "cpu_count": f["cpu_count"], "cpu_speed_mhz": f["cpu_speed_mhz"], "perf_freq": f["perf_freq"],
        "clock_type": f["clock_type"], "clock_frequency": header.perf_freq,
        "log_file_mode": f["log_file_mode"], "buffer_size": f["buffer_size"],
        "timer_resolution": f["timer_resolution"], "timezone_bias_min": f["timezone_bias_min"],
        "header_timestamp": header.header_ts,
        "start_utc": filetime_to_utc(f["start_time_filetime"]), "end_utc": filetime_to_utc(f["end_time_filetime"]),
        "boot_utc": filetime_to_utc(f["boot_time_filetime"]),
        "start_filetime": f["start_time_filetime"], "end_filetime": f["end_time_filetime"],
        "buffers": len(bufs), "buffers_written": f["buffers_written"],
        "compressed_buffers": int(bufs["compressed"].sum()), "buffers_skipped": skipped,
        "buffers_missing": header.missing_buffers, "bytes_resynced": header.resync_bytes,
        "events_lost": events_lost, "buffers_lost": buffers_lost,
        "buffers_flagged_events_lost": flagged_events_lost,
        "records": sum(r.records for r in results),
        "logger_name": header.logger_name, "log_file_name": header.log_file_name,
    }
    out.write_table("trace", pa.Table.from_pylist([trace]))
    elapsed = time.time() - t0
    summary = {
        "file": str(path), "walk_reads": header.walk_reads, "buffers_total": len(bufs),
        "buffers_compressed": trace["compressed_buffers"],
        "buffers_skipped": skipped, "buffers_missing": header.missing_buffers, "bytes_resynced": header.resync_bytes,
        "events_lost": events_lost, "buffers_lost": buffers_lost, "records": trace["records"], "errors": len(errors), "partitions": len(tasks),
        "decode_s": round(t_parts - t0, 3), "join_s": round(elapsed - (t_parts - t0), 3),
        # (decode_s split: the walk of the buffer headers and the plan, serial; the wait for a cluster that was
        # still starting; the partitions, on the workers)
        "walk_s": round(t_walk - t0, 3), "cluster_wait_s": round(t_ready - t_walk, 3),
        "partitions_s": round(t_parts - t_ready, 3),
        "mb_per_s": round(header.file_size / 1e6 / max(elapsed, 1e-9), 1), **joined,
    }
    out.manifest["etl"] = summary
    return summary


EVENT_COUNTS_SCHEMA = pa.schema([
    ("provider_guid", pa.string()), ("opcode", pa.uint8()), ("event_id", pa.uint16()),
    ("version", pa.uint16()), ("header_type", pa.uint8()), ("count", pa.int64()),
])


def write_event_counts(out, results) -> None:
    totals: dict[tuple, int] = {}
    for r in results:
        for *key, n in r.event_counts:
            totals[tuple(key)] = totals.get(tuple(key), 0) + n
    rows = [(*k, n) for k, n in sorted(totals.items())]
    cols = list(zip(*rows)) if rows else [[] for _ in EVENT_COUNTS_SCHEMA]
    out.write_table("event_counts", pa.table([pa.array(c, t.type) for c, t in zip(cols, EVENT_COUNTS_SCHEMA)],
                                             schema=EVENT_COUNTS_SCHEMA))


ERRORS_SCHEMA = pa.schema([
    ("file", pa.string()), ("buffer_index", pa.int32()), ("file_offset", pa.int64()),
    ("record_offset", pa.int64()), ("kind", pa.string()), ("message", pa.string()),
])


def write_errors(out, errors: list[ErrorRow], limit: int) -> None:
    rows = sorted(errors, key=lambda e: (e["buffer_index"], e["record_offset"]))[:limit]
    out.write_table("errors", pa.Table.from_pylist(rows, schema=ERRORS_SCHEMA))
    out.manifest["errors_total"] = len(errors)
