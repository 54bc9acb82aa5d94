"""Decode stage: ETL traces and rustc self-profiles into parquet tables in ``RUN_DIR/decoded/``.

Entry point: :func:`run`. Inputs are recognized by content, not by name: an ETL file starts with a
buffer header whose first record is the logfile header event; a measureme file starts with ``MMPD``;
a directory is searched for ``*.mm_profdata`` files. One run holds at most one ETL trace and any
number of self-profiles; both decode into the same ``decoded/`` output. An input may be an fsspec URL
(:mod:`pipeline.sources`): the tasks then read their parts of it from there.
"""

from __future__ import annotations

import concurrent.futures
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import sources
from pipeline.checkpoints import checkpoint
from pipeline.errors import InputError
from pipeline.runs import stage_output
from pipeline.stages import DECODED

if TYPE_CHECKING:
    from pipeline.contracts import DecodeSummary

STAGE = DECODED

ETL = "etl"
SELF_PROFILE = "mm_profdata"
PERF = "perf"   # a Linux perf.data file (``pipeline.decode.perf``): the run's one trace, as an ETL trace would be
#: What the workers of a local cluster load while it starts (``pipeline.warmup``): the ETL tasks and kernels.
WARM_UP = ("pipeline.decode.etl.kernels", "pipeline.decode.etl.batch", "pipeline.decode.etl.partition", "pipeline.decode.etl.buckets",
           "pipeline.decode.etl.settle", "pipeline.decode.etl.stackkeys", "pipeline.decode.etl.scratch",
           "pipeline.decode.etl.xpress")


def sniff(path: sources.Input) -> str:
    """Which format a file is, by its first bytes; InputError naming the file otherwise."""
    head = sources.read_head(path, 0x50)
    if head[:4] == b"MMPD":
        return SELF_PROFILE
    if head[:8] in (b"PERFILE2", b"2ELIFREP"):     # (a big-endian one is refused by the perf decoder, by name)
        return PERF
    if len(head) >= 0x4C:
        buffer_type = struct.unpack_from("<H", head, 0x36)[0]
        header_type, marker_flags = head[0x4A], head[0x4B]
        if marker_flags == 0xC0 and header_type in (0x01, 0x02) and buffer_type in (4, 0):
            return ETL
    if len(head) < 0x4C:
        raise InputError(f"{path}: {len(head)} bytes: too short to be an ETL trace or a .mm_profdata file")
    raise InputError(
        f"{path}: not an ETL trace (no logfile header event at byte offset 0x48) "
        f"and not a .mm_profdata file (no 'MMPD' magic at offset 0)"
    )


def classify(inputs: list[sources.Input]) -> tuple[sources.Input | None, list[sources.Input]]:
    """Split inputs (paths or URLs, see :mod:`pipeline.sources`) into the one ETL trace and the self-profile
    files (directories expanded)."""
    etl: list[sources.Input] = []
    profiles: list[sources.Input] = []
    for raw in inputs:
        path = raw if sources.is_url(raw) else Path(raw)
        if not sources.exists(path):
            raise InputError(f"{path}: no such file or directory")
        if not sources.is_url(path):
            path = path.absolute()     # (the tasks may run in workers of another working directory)
        if not sources.is_url(path) and not (path.is_file() or path.is_dir()):
            raise InputError(f"{path}: not a regular file or directory (a pipe, FIFO or device): bootprof reads a "
                             "trace at offsets, so give the file itself")
        if sources.is_dir(path):
            found = sources.profiles_below(path)
            if not found:
                raise InputError(f"{path}: directory holds no .mm_profdata files")
            profiles.extend(found)
            continue
        kind = sniff(path)
        (etl if kind in (ETL, PERF) else profiles).append(path)
    if len(etl) > 1:
        raise InputError(f"one run holds one ETL trace, got {len(etl)}: {', '.join(map(str, etl))}")
    return (etl[0] if etl else None), profiles


def run(run_dir: Path, config, pool, inputs: list[sources.Input]) -> DecodeSummary:
    """Decode ``inputs`` into ``RUN_DIR/decoded``; returns the stage's summary counts."""
    trace, profiles = classify(inputs)
    files = ([trace] if trace else []) + profiles
    # (each input pinned as it is opened and checked as the stage ends: a file replaced or written meanwhile would
    # give tables mixed from two files under the hash of one of them)
    pins = {f: sources.pin(f) for f in files}
    summary: DecodeSummary = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as hasher:
        # The inputs' content hashes (``sources.fingerprint``) run beside the decode (hashlib releases the GIL).
        prints = hasher.submit(lambda: [sources.fingerprint(f) for f in files])
        fps = None
        with stage_output(run_dir, STAGE, inputs=[], config=config.resolved()) as out:
            checkpoint("decode.started")
            try:
                if trace is not None and sniff(trace) == PERF:
                    from pipeline.decode.perf import decode_perf

                    summary["perf"] = decode_perf(trace, out, config.decode, pool)
                elif trace is not None:
                    from pipeline.decode.etl import decode_etl

                    summary["etl"] = decode_etl(trace, out, config.decode, pool)
                if profiles:
                    from pipeline.decode.measureme import decode_profiles

                    summary["self_profile"] = decode_profiles(profiles, out, config.decode, pool)
                if summary.get("perf") and profiles:    # (perf records no command lines; the self-profiles have them)
                    from pipeline.decode.perf import name_from_profiles

                    name_from_profiles(out, summary["perf"])
            except OSError:
                # (an input removed or replaced meanwhile, which the decode met as a file gone: said as such)
                refuse_changed(sources.changed(pins))
                raise
            nothing = (trace is None or not (summary.get("etl") or summary.get("perf") or {}).get("records")) and \
                (not profiles or not summary["self_profile"].get("decoded"))
            if nothing:     # (no data is not a result: nothing is written, nothing ingested or compared)
                errors = (summary.get("self_profile") or {}).get("error_messages") or []
                raise InputError(f"{', '.join(map(str, inputs))}: nothing could be decoded"
                                 + (f" ({len(profiles)} self-profiles, first error: {errors[0]})" if errors else "")
                                 + "; no run is made of it")
            waited = time.perf_counter()
            fps = prints.result()
            refuse_changed(sources.changed(pins))
            # (what the stage waited for the input hashes after the decode: the hash's serial part)
            summary["hash_wait_s"] = round(time.perf_counter() - waited, 3)
            out.manifest.update(summary)
            out.manifest["inputs"] = fps
    return summary


def refuse_changed(moved: list) -> None:
    """The stage's error when inputs are no longer the files that were opened (nothing when none moved)."""
    if moved:
        raise InputError(f"{moved[0]}: changed while it was decoded (removed, or its size, modification time or file "
                         f"id differ from when it was opened{f'; and {len(moved) - 1} more' if len(moved) > 1 else ''}); "
                         "nothing is kept: decode it again once it is complete")


def headline(summary: DecodeSummary) -> str:
    """The stage's line in a job's output: what was decoded, and anything lost or wrong (the rest: the manifest)."""
    parts = []
    etl = summary.get("etl")
    if etl:
        lost = [f"{etl[k]:,} {k.replace('_', ' ')}" for k in ("events_lost", "buffers_lost", "buffers_skipped") if etl.get(k)]
        parts.append(f"{etl.get('records', 0):,} records ({etl.get('errors', 0):,} errors{''.join(', ' + x for x in lost)}), "
                     f"{etl.get('samples', 0):,} samples, {etl.get('heap_snapshots', 0):,} heap snapshots")
    perf = summary.get("perf")
    if perf:
        parts.append(f"{perf.get('records', 0):,} perf records ({perf.get('errors', 0):,} errors), "
                     f"{perf.get('samples', 0):,} samples, {perf.get('processes', 0):,} processes")
    profiles = summary.get("self_profile")
    if profiles:
        bad = profiles.get("errors", 0) + profiles.get("skipped", 0)
        parts.append(f"{profiles.get('decoded', 0):,} self-profiles ({profiles.get('events', 0):,} events"
                     + (f", {bad:,} not decoded" if bad else "") + ")")
    return "; ".join(parts) or "nothing decoded"
