"""The dask task: decode one partition (a run of consecutive buffers) into parquet parts.

A task receives a descriptor (file path, buffer descriptors, trace constants, output directories),
reads its bytes itself with one read, inflates compressed buffers, walks the records, runs the
dispatch table and writes one parquet part per table. It returns the part paths and small counts.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.decode.etl import kernels as K
from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch, record_error, walk
from pipeline.decode.etl.buffers import MAX_BUFFER_SIZE
from pipeline.decode.etl.interpret import KERNEL_OR_CLASSIC, lookup

_GROUP_GUIDS = L.group_guid_table()


def decode_partition(task: dict[str, Any]) -> dict[str, Any]:
    path = task["path"]
    bufs = task["buffers"]
    part = task["part"]
    errors: list[dict[str, Any]] = []

    # 1. Bytes: one read covering all buffers of the partition (they are contiguous in the file).
    lo = int(bufs["file_offset"][0])
    hi = int(bufs["file_offset"][-1]) + int(bufs["buffer_size"][-1])
    raw = np.empty(hi - lo, np.uint8)
    with open(path, "rb") as f:
        f.seek(lo)
        got = f.readinto(memoryview(raw))
    raw = raw[:got]

    data_len = bufs["data_len"].astype(np.int64)
    bad = data_len > MAX_BUFFER_SIZE
    src_start = bufs["file_offset"].astype(np.int64) - lo + L.BUFFER_HEADER_SIZE
    src_end = bufs["file_offset"].astype(np.int64) - lo + bufs["buffer_size"].astype(np.int64)
    for i in np.flatnonzero(bad | (src_end > len(raw))):
        errors.append(record_error(path, bufs[i], 0, "bad_buffer_size",
                                   f"{int(data_len[i])} bytes of event data is not plausible; buffer skipped"))
        data_len[i] = 0
    data_len[src_end > len(raw)] = 0
    starts = np.zeros(len(bufs), np.int64)
    starts[1:] = np.cumsum(data_len)[:-1]
    blob = np.empty(int(data_len.sum()), np.uint8)
    comp = bufs["compressed"] & (data_len > 0)
    for i in np.flatnonzero(~comp & (data_len > 0)):
        blob[starts[i]:starts[i] + data_len[i]] = raw[src_start[i]:src_start[i] + data_len[i]]
    status = np.zeros(len(bufs), np.int32)
    produced = np.zeros(len(bufs), np.int64)
    if comp.any():
        K.decompress_buffers(raw, np.where(comp, src_start, -1), src_end, blob, starts, data_len, status, produced)
    del raw
    for i in np.flatnonzero(status != 0):
        errors.append(record_error(path, bufs[i], int(produced[i]), "decompress",
                                   f"{K.STATUS_TEXT[int(status[i])]} after {int(produced[i])} of "
                                   f"{int(data_len[i])} bytes; buffer skipped"))
    skipped = status != 0
    lens = np.where(skipped, 0, data_len)

    # 2. Records.
    cols, rstatus, rpos = walk(blob, starts, lens)
    for i in np.flatnonzero(rstatus != 0):
        errors.append(record_error(path, bufs[i], int(rpos[i]), "record",
                                   f"{K.STATUS_TEXT[int(rstatus[i])]}; rest of the buffer skipped"))

    consts = dict(task["consts"], path=path, starts=starts)
    b = Batch(blob, cols, bufs, consts)
    b.errors = errors
    providers, code = provider_codes(b)

    # 3. Interpretation: group records by (provider, opcode, version) and run the dispatch table.
    counts = event_counts(b, code, providers)
    key = (code.astype(np.int64) << 24) | (b.c["opcode"].astype(np.int64) << 16) | b.c["version"].astype(np.int64)
    kernel_like = np.isin(b.c["htype"], list(KERNEL_OR_CLASSIC))
    if b.n:
        order = np.argsort(key, kind="stable")
        uniq, first = np.unique(key[order], return_index=True)
        bounds = list(first) + [len(order)]
        for j, k in enumerate(uniq.tolist()):
            prov = providers[k >> 24]
            fn = lookup(prov, (k >> 16) & 0xFF, k & 0xFFFF)
            if fn is None:
                continue
            idx = np.sort(order[bounds[j]:bounds[j + 1]])
            idx = idx[kernel_like[idx]]
            if len(idx):
                fn(b, idx)

    rest = np.flatnonzero(~b.consumed)
    if len(rest):
        b.emit("events", {
            **b.common(rest),
            "provider_guid": pa.DictionaryArray.from_arrays(pa.array(code[rest], pa.int32()), pa.array(providers)),
            "opcode": b.c["opcode"][rest], "event_id": b.c["event_id"][rest], "version": b.c["version"][rest],
            "header_type": b.c["htype"][rest], "pid": b.c["pid"][rest].view(np.int32),
            "tid": b.c["tid"][rest].view(np.int32), "payload_len": b.c["pay_len"][rest],
            "buffer_index": b.buffer_index[rest],
        })

    # 4. Parquet parts.
    written: dict[str, str] = {}
    for table, pieces in b.out.items():
        root = Path(task["out_dir"] if not table.startswith("_") else task["scratch_dir"])
        directory = root / f"{table}.parquet"
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"part-{part:05d}-{uuid.uuid4().hex[:6]}.parquet"
        pq.write_table(pa.concat_tables(pieces, promote_options="permissive"), target, compression="zstd")
        written[table] = str(target)
    return {
        "part": part, "tables": written, "records": int(b.n), "bytes": int(hi - lo),
        "event_counts": counts, "errors": b.errors,
        "buffers_skipped": int(skipped.sum() + (rstatus != 0).sum() + bad.sum()),
    }


def provider_codes(b: Batch) -> tuple[list[str], np.ndarray]:
    """Provider GUID text of each record as (list of GUIDs, int32 code per record).

    Kernel group records use their group's classic GUID (HookId 0x030A is the Image Load event);
    FULL/INSTANCE/EVENT_HEADER records carry their GUID; MESSAGE records may carry one.
    """
    import uuid as _uuid

    c = b.c
    group = (c["hook"] >> 8).astype(np.int64)
    group[c["hook"] == L.IMAGE_LOAD_HOOK] = 0x14
    system = np.isin(c["htype"], list(L.SYSTEM_KINDS))
    guid16 = np.zeros((b.n, 16), np.uint8)
    guid16[system] = _GROUP_GUIDS[group[system]]
    has = c["guid_off"] >= 0
    if has.any():
        guid16[has] = b.blob[c["guid_off"][has][:, None] + np.arange(16)]
    uniq, inv = np.unique(np.ascontiguousarray(guid16).view("V16").ravel(), return_inverse=True)
    providers = [str(_uuid.UUID(bytes_le=bytes(u))) for u in uniq]
    return providers, inv.astype(np.int32).ravel()


def event_counts(b: Batch, code: np.ndarray, providers: list[str]) -> list[tuple]:
    """[(provider_guid, opcode, event_id, version, header_type, count)] of this partition."""
    if b.n == 0:
        return []
    c = b.c
    key = ((code.astype(np.uint64) << np.uint64(48)) | (c["opcode"].astype(np.uint64) << np.uint64(40))
           | (c["event_id"].astype(np.uint64) << np.uint64(24)) | (c["version"].astype(np.uint64) << np.uint64(8))
           | c["htype"].astype(np.uint64))
    uniq, n = np.unique(key, return_counts=True)
    out = []
    for k, cnt in zip(uniq.tolist(), n.tolist()):
        out.append((providers[k >> 48], (k >> 40) & 0xFF, (k >> 24) & 0xFFFF, (k >> 8) & 0xFFFF, k & 0xFF, cnt))
    return out
