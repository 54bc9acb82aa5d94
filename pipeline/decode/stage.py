"""The decode stage's entry point, :func:`run` (a :class:`pipeline.stages.StageModule`): the inputs told apart
(:mod:`.inputs`), the ETL trace decoded (:func:`pipeline.decode.etl.decode_etl`) and the self-profiles
(:func:`pipeline.decode.measureme.decode_profiles`) into one ``RUN_DIR/decoded/``, with the inputs' content hashes
in its manifest."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import sources
from pipeline.checkpoints import checkpoint
from pipeline.decode.inputs import PERF, classify, sniff
from pipeline.errors import InputError
from pipeline.runs import stage_output
from pipeline.stages import DECODED

if TYPE_CHECKING:
    from pipeline.contracts import DecodeSummary

STAGE = DECODED

#: What the workers of a local cluster load while it starts (``pipeline.cluster.warmup``): the ETL tasks and kernels.
WARM_UP = ("pipeline.decode.etl.kernels", "pipeline.decode.etl.batch", "pipeline.decode.etl.partition", "pipeline.decode.etl.buckets",
           "pipeline.decode.etl.settle", "pipeline.decode.etl.settle_kernels", "pipeline.decode.etl.stackkeys", "pipeline.decode.etl.scratch",
           "pipeline.decode.etl.xpress")


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
                    from pipeline.decode.etl.decoder import decode_etl

                    summary["etl"] = decode_etl(trace, out, config.decode, pool)
                if profiles:
                    from pipeline.decode.measureme.decoder import decode_profiles

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


def inputs_changed(manifest: dict, inputs: list[sources.Input]) -> bool:
    """Whether ``inputs`` are other files than those the decode of ``manifest`` was made from (by path, size and
    content hash: the files this stage reads and fingerprints); the job's up-to-date check."""
    trace, profiles = classify(inputs)
    key = lambda f: (f["path"], f["size"], f.get("sha256_tree") or "", f.get("version") or "")  # noqa: E731
    before = sorted(map(key, manifest.get("inputs") or []))
    now = sorted(key(sources.fingerprint(f)) for f in ([trace] if trace else []) + profiles)
    return before != now


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
