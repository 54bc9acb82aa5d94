"""Call frame information of ELF images, for unwinding the user stacks of ``perf record --call-graph dwarf``.

symbolic (the library symbolize reads ELF files with) turns an image's ``.eh_frame``/``.debug_frame`` into
Breakpad's STACK CFI text; this module keeps of it what an x86-64 unwinder needs, one row per address where a rule
changes: how the canonical frame address (CFA) is found (``$rsp`` or ``$rbp`` plus an offset), where the return
address is saved (``.cfa`` plus an offset) and where the caller's ``$rbp`` is (``.cfa`` plus an offset, or kept).
A rule of any other form (a DWARF expression, as in PLT stubs) makes the row ``UNSUPPORTED``: unwinding stops
there. Addresses become file offsets (a frame of a perf run is a file offset of its mapping, as symbolize counts
them) by the file's PT_LOAD segments. ``RULES`` declares the row layout.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

#: ``cfa_reg``: the register the CFA is an offset from; ``UNSUPPORTED`` a row no unwinding goes past (an expression,
#: or no FDE covers the address: the gap after an FDE's end).
RSP, RBP, UNSUPPORTED = 0, 1, 2
#: An offset that is not given: the return address has no rule (the outermost frame), or ``$rbp`` keeps its value.
NO_OFFSET = -(1 << 31)
RULES = np.dtype([("start", "<u8"), ("cfa_reg", "<i4"), ("cfa_off", "<i4"), ("ra_off", "<i4"), ("bp_off", "<i4")])
_REG = {b"$rsp": RSP, b"$rbp": RBP}


def parse(text: bytes) -> np.ndarray:
    """The rows of Breakpad STACK CFI ``text``, sorted by address (relative to the image's load address), with an
    ``UNSUPPORTED`` row where each FDE ends (unless another starts there)."""
    out: list[tuple[int, int, int, int, int, int]] = []      # (address, order, cfa_reg, cfa_off, ra_off, bp_off)
    state = [UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET]
    for line in text.split(b"\n"):
        t = line.split(b" ")
        if len(t) < 4 or t[0] != b"STACK" or t[1] != b"CFI":
            continue
        try:
            if t[2] == b"INIT":
                addr, i = int(t[3], 16), 5
                out.append((addr + int(t[4], 16), 0, UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET))
                state = [UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET]
            else:
                addr, i = int(t[2], 16), 3
            n = len(t)
            while i < n:
                name, j = t[i], i + 1
                while j < n and not t[j].endswith(b":"):
                    j += 1
                e = t[i + 1:j]
                if name == b".cfa:":
                    ok = len(e) == 3 and e[2] == b"+" and e[0] in _REG
                    state[0], state[1] = (_REG[e[0]], int(e[1])) if ok else (UNSUPPORTED, 0)
                elif name in (b".ra:", b"$rbp:"):
                    off = int(e[1]) if len(e) == 4 and e[0] == b".cfa" and e[2] == b"+" and e[3] == b"^" else NO_OFFSET
                    state[2 if name == b".ra:" else 3] = off
                i = j
        except (ValueError, IndexError):
            state = [UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET]
            continue
        out.append((addr, 1, *state))
    if not out:
        return np.zeros(0, RULES)
    a = np.array(out, np.int64)
    order = np.lexsort((a[:, 1], a[:, 0]))      # (at one address an FDE's row wins over the end of the one before)
    a = a[order]
    keep = np.append(a[1:, 0] != a[:-1, 0], True)
    a = a[keep]
    rows = np.zeros(len(a), RULES)
    rows["start"] = a[:, 0].astype(np.uint64)
    for k, name in enumerate(("cfa_reg", "cfa_off", "ra_off", "bp_off")):
        rows[name] = a[:, 2 + k]
    return rows


def to_file_offsets(rows: np.ndarray, segments: list[tuple[int, int, int]]) -> np.ndarray:
    """``rows`` with addresses relative to the load address (the first PT_LOAD's ``p_vaddr``) moved to file offsets,
    segment by segment ((p_offset, p_vaddr, p_filesz) each); rows in no segment's bytes dropped."""
    if not segments or not len(rows):
        return rows
    svma = rows["start"] + np.uint64(segments[0][1])
    parts = []
    for p_offset, p_vaddr, p_filesz in segments:
        inside = (svma >= np.uint64(p_vaddr)) & (svma < np.uint64(p_vaddr + p_filesz))
        part = rows[inside].copy()
        part["start"] = svma[inside] - np.uint64(p_vaddr) + np.uint64(p_offset)
        parts.append(part)
    out = np.concatenate(parts)
    return out[np.argsort(out["start"], kind="stable")]


def image_rules(path: Path) -> tuple[np.ndarray | None, str | None]:
    """The unwind rows of the ELF file at ``path`` by file offset, or why it has none."""
    from pipeline.decode.perf.elfload import load_segments

    try:
        from symbolic import Archive
        from symbolic.cfi import CfiCache

        obj = next(iter(Archive.open(str(path)).iter_objects()), None)
        if obj is None:
            return None, f"{path}: no object"
        buf = io.BytesIO()
        CfiCache.from_object(obj).write_to(buf)
        return to_file_offsets(parse(buf.getvalue()), load_segments(path)), None
    except ImportError:
        return None, "reading call frame information needs the `symbolic` package"
    except Exception as exc:  # noqa: BLE001 - symbolic raises its own hierarchy; a reason, not a crash
        return None, f"{path}: {type(exc).__name__}: {exc}"
