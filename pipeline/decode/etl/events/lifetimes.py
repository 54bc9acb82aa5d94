"""Process, thread and image lifetimes (§3.1-3.3) and the images' symbol identities (KernelTraceControl
ImageID and DbgID, §3.9): scratch tables from which the joins build ``processes``, ``threads``, ``images``
and ``image_ids``."""

from __future__ import annotations

import numpy as np

from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch
from pipeline.decode.etl.events.fields import possible, u32


# --- Process (§3.1) --------------------------------------------------------------------------------
PROCESS_KIND = {1: "start", 2: "end", 3: "dcstart", 4: "dcend", 39: "defunct"}


def process(b: Batch, idx: np.ndarray) -> None:
    S = L.PROCESS
    # UserSID position by version: v4+ after Flags, v3 after DirectoryTableBase, v1/v2 after ExitStatus.
    def sid_offset(idx):
        v = b.c["version"][idx].astype(np.int64)
        P = b.c["ptr"][idx].astype(np.int64)
        return np.where(v >= 4, S["sid"][0], np.where(v == 3, 0x18, 0x14)) + (P - 4) * np.where(v >= 3, 2, 1)

    idx = b.require(idx, sid_offset(idx) + 4, "Process")
    if len(idx) == 0:
        return
    v = b.c["version"][idx].astype(np.int64)
    P = b.c["ptr"][idx].astype(np.int64)
    plen = b.c["pay_len"][idx]
    sid_rel = sid_offset(idx)
    first = b.gather(b.c["pay_off"][idx] + sid_rel, 4)
    n_pos = np.minimum(sid_rel + 2 * P + 1, plen - 1)
    nsub = b.gather(b.c["pay_off"][idx] + n_pos, 1).astype(np.int64)
    sid_len = np.where(first == 0, 4, 2 * P + 8 + 4 * nsub)
    name_rel = np.minimum(sid_rel + sid_len, plen)
    names, used = b.strings(idx, name_rel, wide=False)
    cmd_rel = name_rel + used
    cmds, _ = b.strings(idx, cmd_rel, wide=True)
    cmds = [c if vv >= 2 else "" for c, vv in zip(cmds, v.tolist())]
    kinds = [PROCESS_KIND.get(int(o), str(int(o))) for o in b.c["opcode"][idx]]
    b.emit("_process_events", {
        **b.common(idx), "kind": kinds,
        "pid": u32(b, idx, S["pid"]), "parent_pid": u32(b, idx, S["parent_pid"]),
        "session": u32(b, idx, S["session"]), "exit_status": u32(b, idx, S["exit_status"]).view(np.int32),
        "unique_process_key": b.pointer(idx, *S["unique_key"]),
        "flags": np.where(v >= 4, u32(b, idx, S["flags"]), 0).astype(np.uint32),
        "image_name": names, "command_line": cmds, "version": b.c["version"][idx],
    }, idx)


# --- Thread (§3.2) ---------------------------------------------------------------------------------
THREAD_KIND = {1: "start", 2: "end", 3: "dcstart", 4: "dcend"}


def thread(b: Batch, idx: np.ndarray) -> None:
    idx = b.require(idx, 8, "Thread")
    if len(idx) == 0:
        return
    T = L.THREAD
    P = b.c["ptr"][idx].astype(np.int64)
    full = b.c["pay_len"][idx] >= 0x2C + 7 * (P - 4)
    start = np.zeros(len(idx), np.uint64)
    if full.any():
        start[full] = b.pointer(idx[full], *T["win32_start_addr"])
    name_rel = b.offset_of(idx, *T["name"])
    names, _ = b.strings(idx, name_rel, wide=True)
    b.emit("_thread_events", {
        **b.common(idx), "kind": [THREAD_KIND.get(int(o), str(int(o))) for o in b.c["opcode"][idx]],
        "pid": u32(b, idx, T["pid"]), "tid": u32(b, idx, T["tid"]), "win32_start_addr": start,
        "thread_name": names,
    }, idx)


# --- Image (§3.3) ----------------------------------------------------------------------------------
IMAGE_KIND = {10: "load", 2: "unload", 3: "dcstart", 4: "dcend"}


def image(b: Batch, idx: np.ndarray) -> None:
    I = L.IMAGE
    v = b.c["version"][idx]
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, np.where(v >= 2, 0x2C + 3 * (P - 4), 0x0C + 2 * (P - 4)), "Image")
    base, size = b.pointer(idx, *I["base"]), b.pointer(idx, *I["size"])
    ok = possible(b, idx, "Image", (base, size))
    if not ok.all():
        idx, base, size = idx[ok], base[ok], size[ok]
    if len(idx) == 0:
        return
    v = b.c["version"][idx]
    new = v >= 2
    name_rel = np.where(new, b.offset_of(idx, *I["file_name"]), b.offset_of(idx, 0x0C, 2))
    names, _ = b.strings(idx, name_rel, wide=True)
    pid = u32(b, idx, I["pid"])
    zero = np.zeros(len(idx), np.uint32)
    b.emit("_image_events", {
        **b.common(idx), "kind": [IMAGE_KIND.get(int(o), str(int(o))) for o in b.c["opcode"][idx]],
        "pid": pid, "base": base, "size": size,
        "checksum": np.where(new, u32(b, idx, I["checksum"]), zero),
        "time_date_stamp": np.where(new, u32(b, idx, I["time_date_stamp"]), zero),
        "file_name": names,
    }, idx)


# --- KernelTraceControl ImageID / DbgID (§3.9) -----------------------------------------------------
def image_id(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, 2 * P + 8, "ImageID")
    if len(idx) == 0:
        return
    D = L.IMAGE_ID
    names, _ = b.strings(idx, b.offset_of(idx, *D["file_name"]), wide=True)
    b.emit("_image_id_info", {
        **b.common(idx), "base": b.pointer(idx, *D["base"]), "size": b.pointer(idx, *D["size"]),
        "pid": u32(b, idx, D["pid"]), "time_date_stamp": u32(b, idx, D["time_date_stamp"]),
        "original_file_name": names,
    }, idx)


def dbg_id(b: Batch, idx: np.ndarray) -> None:
    P = b.c["ptr"][idx].astype(np.int64)
    idx = b.require(idx, P + 24, "DbgID_RSDS")
    if len(idx) == 0:
        return
    D = L.DBG_ID
    g = b.c["pay_off"][idx] + b.offset_of(idx, *D["guid"])
    guids = guid_texts(b.blob[g.astype(np.int64)[:, None] + np.arange(16)])
    names, _ = b.strings(idx, b.offset_of(idx, *D["pdb_name"]), wide=False)
    b.emit("_image_id_dbg", {
        **b.common(idx), "base": b.pointer(idx, *D["base"]), "pid": u32(b, idx, D["pid"]),
        "pdb_guid": guids, "pdb_age": u32(b, idx, D["age"]), "pdb_name": names,
        "il": b.c["opcode"][idx] == 37,
    }, idx)


#: Byte order of a GUID's text form from its Windows memory layout (Data1..3 little-endian).
_GUID_TEXT_ORDER = np.array([3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15])


def guid_texts(raw: np.ndarray) -> list[str]:
    """Canonical lowercase text of (n, 16) GUIDs in memory order, without a Python object per byte."""
    h = np.ascontiguousarray(raw[:, _GUID_TEXT_ORDER]).tobytes().hex()
    return [f"{h[i:i + 8]}-{h[i + 8:i + 12]}-{h[i + 12:i + 16]}-{h[i + 16:i + 20]}-{h[i + 20:i + 32]}"
            for i in range(0, len(h), 32)]
