"""Call frame information of ELF images, for unwinding the user stacks of ``perf record --call-graph dwarf``.

symbolic (the library symbolize reads ELF files with) turns an image's ``.eh_frame``/``.debug_frame`` into
Breakpad's STACK CFI text; this module keeps of it what an x86-64 unwinder needs, one row per address where a rule
changes: how the canonical frame address (CFA) is found (``$rsp`` or ``$rbp`` plus an offset), where the return
address is saved (``.cfa`` plus an offset) and where the caller's ``$rbp`` is (``.cfa`` plus an offset, or kept).
A rule of any other form (a DWARF expression, as in PLT stubs) makes the row ``UNSUPPORTED``: unwinding stops
there. Addresses become file offsets (a frame of a perf run is a file offset of its mapping, as symbolize counts
them) by the file's PT_LOAD segments. ``RULES`` declares the row layout.

The rows of librustc_driver and libLLVM (a million or more each) take seconds to make, and every decode of a DWARF
run of one toolchain needs the same ones: :func:`cached_rules` keeps them on disk (``decode.cache_dir``), one file
per image key (its build id, else its path, size and time), and takes a file only when it is whole (its length,
its digest, the symbolic that made it): anything else is made again and written over. Only rows of this machine's
files are written there, never those of a run's copies.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import struct
import tempfile
from pathlib import Path

import numba as nb
import numpy as np

#: ``cfa_reg``: the register the CFA is an offset from; ``UNSUPPORTED`` a row no unwinding goes past (an expression,
#: or no FDE covers the address: the gap after an FDE's end).
RSP, RBP, UNSUPPORTED = 0, 1, 2
#: An offset that is not given: the return address has no rule (the outermost frame), or ``$rbp`` keeps its value.
NO_OFFSET = -(1 << 31)
RULES = np.dtype([("start", "<u8"), ("cfa_reg", "<i4"), ("cfa_off", "<i4"), ("ra_off", "<i4"), ("bp_off", "<i4")])
JIT = dict(nogil=True, cache=True)


# Tokens of the text, as byte tuples (the kernel compares them in place).
_STACK_CFI = (83, 84, 65, 67, 75, 32, 67, 70, 73, 32)       # "STACK CFI "
_INIT = (73, 78, 73, 84, 32)                                 # "INIT "
_CFA_RULE, _RA_RULE, _BP_RULE = (46, 99, 102, 97, 58), (46, 114, 97, 58), (36, 114, 98, 112, 58)   # .cfa: .ra: $rbp:
_RSP, _RBP, _CFA = (36, 114, 115, 112), (36, 114, 98, 112), (46, 99, 102, 97)                        # $rsp $rbp .cfa
_PLUS, _DEREF, _SPACE, _NEWLINE, _COLON = 43, 94, 32, 10, 58


@nb.njit(**JIT)
def _is(buf, a, b, lit):
    if b - a != len(lit):
        return False
    for j in range(len(lit)):
        if buf[a + j] != lit[j]:
            return False
    return True


@nb.njit(**JIT)
def _number(buf, a, b, base):
    """The integer in ``buf[a:b]`` (hex or decimal with an optional '-'); ``ok`` False when it is not one."""
    neg = b > a and buf[a] == 45
    i = a + 1 if neg else a
    if i >= b or b - i > 18:
        return 0, False
    v = 0
    for j in range(i, b):
        c = np.int64(buf[j])     # (not uint8 arithmetic: as plain Python, numpy would keep the byte's type)
        if 48 <= c <= 57:
            d = c - 48
        elif base == 16 and 97 <= c <= 102:
            d = c - 87
        elif base == 16 and 65 <= c <= 70:
            d = c - 55
        else:
            return 0, False
        v = v * base + d
    return (-v if neg else v), True


@nb.njit(**JIT)
def _offset_rule(buf, ts, te, nt):
    """``.cfa N + ^`` (saved at CFA + N): N, else NO_OFFSET."""
    if nt == 4 and _is(buf, ts[0], te[0], _CFA) and _is(buf, ts[2], te[2], (_PLUS,)) and \
            _is(buf, ts[3], te[3], (_DEREF,)):
        v, ok = _number(buf, ts[1], te[1], 10)
        if ok:
            return v
    return NO_OFFSET


@nb.njit(**JIT)
def scan_cfi(buf, fill, out):
    """The rows of the STACK CFI text ``buf`` into ``out`` (n, 6): address, order (0: where an FDE ends, 1: a row),
    cfa_reg, cfa_off, ra_off, bp_off; returns how many (counted without ``fill``). A line that is not a row is
    skipped; one whose numbers do not read ends its FDE's rules (``UNSUPPORTED``). A row outside its FDE's range is
    left out: an FDE's instructions may advance to its end address (3 % of libLLVM's FDEs end with a row there), and
    that address is the next FDE's or none's."""
    n = buf.shape[0]
    ts = np.zeros(8, np.int64)
    te = np.zeros(8, np.int64)
    k = 0
    reg, cfa, ra, bp = UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET
    lo, hi = 0, 0       # (the current FDE's addresses)
    i = 0
    while i < n:
        e = i
        while e < n and buf[e] != _NEWLINE:
            e += 1
        p = i + len(_STACK_CFI)
        if p <= e and _is(buf, i, p, _STACK_CFI):
            good = True
            if p + len(_INIT) <= e and _is(buf, p, p + len(_INIT), _INIT):
                p += len(_INIT)
                q = p
                while q < e and buf[q] != _SPACE:
                    q += 1
                addr, ok1 = _number(buf, p, q, 16)
                r = q + 1
                while r < e and buf[r] != _SPACE:
                    r += 1
                size, ok2 = _number(buf, q + 1, r, 16)
                good = ok1 and ok2
                lo, hi = (addr, addr + size) if good else (0, 0)
                if good:
                    if fill:
                        out[k, 0] = addr + size
                        out[k, 1] = 0
                        out[k, 2] = UNSUPPORTED
                        out[k, 3] = 0
                        out[k, 4] = NO_OFFSET
                        out[k, 5] = NO_OFFSET
                    k += 1
                reg, cfa, ra, bp = UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET
                p = r + 1
            else:
                q = p
                while q < e and buf[q] != _SPACE:
                    q += 1
                addr, good = _number(buf, p, q, 16)
                p = q + 1
                if good and not lo <= addr < hi:
                    i = e + 1
                    continue
            if not good:
                reg, cfa, ra, bp = UNSUPPORTED, 0, NO_OFFSET, NO_OFFSET
            else:
                target = -1
                nt = 0
                while True:
                    a = p
                    while p < e and buf[p] != _SPACE:
                        p += 1
                    end_of_line = a >= e
                    if end_of_line or buf[p - 1] == _COLON:
                        # the rule before this one is complete: apply it
                        if target == 0:
                            if nt == 3 and _is(buf, ts[2], te[2], (_PLUS,)) and \
                                    (_is(buf, ts[0], te[0], _RSP) or _is(buf, ts[0], te[0], _RBP)):
                                v, ok = _number(buf, ts[1], te[1], 10)
                                reg = (RSP if _is(buf, ts[0], te[0], _RSP) else RBP) if ok else UNSUPPORTED
                                cfa = v if ok else 0
                            else:
                                reg, cfa = UNSUPPORTED, 0
                        elif target == 1:
                            ra = _offset_rule(buf, ts, te, nt)
                        elif target == 2:
                            bp = _offset_rule(buf, ts, te, nt)
                        if end_of_line:
                            break
                        target = 0 if _is(buf, a, p, _CFA_RULE) else 1 if _is(buf, a, p, _RA_RULE) else \
                            2 if _is(buf, a, p, _BP_RULE) else 3
                        nt = 0
                    else:
                        if nt < 8:
                            ts[nt] = a
                            te[nt] = p
                        nt += 1
                    p += 1
                if fill:
                    out[k, 0] = addr
                    out[k, 1] = 1
                    out[k, 2] = reg
                    out[k, 3] = cfa
                    out[k, 4] = ra
                    out[k, 5] = bp
                k += 1
        i = e + 1
    return k


def parse(text: bytes) -> np.ndarray:
    """The rows of Breakpad STACK CFI ``text``, sorted by address (relative to the image's load address), with an
    ``UNSUPPORTED`` row where each FDE ends (unless another starts there)."""
    buf = np.frombuffer(text, np.uint8)
    n = scan_cfi(buf, False, np.zeros((0, 6), np.int64))
    a = np.zeros((n, 6), np.int64)
    scan_cfi(buf, True, a)
    if not n:
        return np.zeros(0, RULES)
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


def image_rules(path: Path, build_id: str | None = None) -> tuple[np.ndarray | None, str | None]:
    """The unwind rows of the ELF file at ``path`` by file offset, or why it has none; with ``build_id`` (the one
    the recording saw), only when the file has that build id."""
    from pipeline.decode.perf.elfload import load_segments

    try:
        from symbolic import Archive
        from symbolic.cfi import CfiCache

        obj = next(iter(Archive.open(str(path)).iter_objects()), None)
        if obj is None:
            return None, f"{path}: no object"
        if build_id and (obj.code_id or "").lower() != build_id.lower():
            return None, (f"{path}: build id {obj.code_id or '(none)'}, the recording saw {build_id} (the file was "
                          "replaced since)")
        buf = io.BytesIO()
        CfiCache.from_object(obj).write_to(buf)
        return to_file_offsets(parse(buf.getvalue()), load_segments(path)), None
    except ImportError:
        return None, "reading call frame information needs the `symbolic` package"
    except Exception as exc:  # noqa: BLE001 - symbolic raises its own hierarchy; a reason, not a crash
        return None, f"{path}: {type(exc).__name__}: {exc}"


#: The cache's file format (:func:`cached_rules`): a header (magic with this version, rows, the rows' digest, the
#: symbolic version that made them), then the rows as ``RULES``. A new version makes new files: raise it whenever
#: the rows made of a file change (``scan_cfi``, ``parse``, ``to_file_offsets``, ``load_segments``), or entries of
#: the old rows are read as they were. (2: rows past their FDE's end left out.)
CACHE_FORMAT = 2
_MAGIC = b"BPCFI\0\0" + bytes([CACHE_FORMAT])
_HEAD = struct.Struct("<8sQ16s32s")
#: The keys a cache file is named by: ``elf-<build id>``, ``elf-path-<hash>-<size>-<time>`` (a copy's directory
#: name in a run's ``symbols/elf``, or ``elfload.path_key``). Any other (a made-up copy's) is not cached.
_KEY = re.compile(r"elf-(path-)?[0-9a-f][0-9a-f-]{0,200}")


@functools.cache
def _symbolic() -> bytes:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("symbolic").encode()[:32]
    except PackageNotFoundError:
        return b""


def cached_rules(path: Path, key: str, build_id: str | None, cache_dir: Path, keep: bool = True
                 ) -> tuple[np.ndarray | None, str | None]:
    """:func:`image_rules` of the file ``path`` whose image key is ``key``, read from ``cache_dir/cfi/<key>.rows``
    when a whole file of the same format and symbolic is there; else made, and with ``keep`` written there (to a
    file of its own, then renamed over the entry: two decodes at once write the same bytes). A cache that cannot be
    written is none: the rows are still returned.

    ``keep`` is False for a run's copy of a file (``capture --perf --symbols``, perhaps from someone else's pack): its
    rows are read from the cache, never written there, as a made-up copy under a key (a build id is a note anyone
    can write) would otherwise give its rows to this machine's own file of that key in every later decode."""
    entry = Path(cache_dir).expanduser() / "cfi" / f"{key}.rows" if _KEY.fullmatch(key) else None
    if entry is not None:
        rows = _read_entry(entry)
        if rows is not None:
            return rows, None
    rows, why = image_rules(path, build_id)
    if rows is not None and entry is not None and keep:
        try:
            _write_entry(entry, rows)
        except OSError:
            pass        # (a read-only or full cache directory: the next decode makes the rows again)
    return rows, why


def _read_entry(entry: Path) -> np.ndarray | None:
    """The rows of a cache file, None when there is none or it is not whole."""
    try:
        raw = entry.read_bytes()
    except OSError:
        return None
    if len(raw) < _HEAD.size:
        return None
    magic, n, digest, made_by = _HEAD.unpack_from(raw)
    body = memoryview(raw)[_HEAD.size:]
    if magic != _MAGIC or made_by.rstrip(b"\0") != _symbolic() or len(body) != n * RULES.itemsize \
            or hashlib.blake2b(body, digest_size=16).digest() != digest:
        return None
    return np.frombuffer(raw, RULES, n, _HEAD.size)


def _write_entry(entry: Path, rows: np.ndarray) -> None:
    from pipeline import portable

    body = np.ascontiguousarray(rows, RULES).view(np.uint8)
    head = _HEAD.pack(_MAGIC, len(rows), hashlib.blake2b(body, digest_size=16).digest(), _symbolic())
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", dir=entry.parent)
    try:
        with open(fd, "wb") as f:
            f.write(head)
            f.write(body)
        portable.replace(tmp, entry)
    finally:
        Path(tmp).unlink(missing_ok=True)
