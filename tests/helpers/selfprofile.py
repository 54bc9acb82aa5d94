"""An independent, plain-Python reading of .mm_profdata files and of measureme's summarize, and the Rust
toolchain the tests build with.

The reading is written from the format notes (``../shared/docs/measureme-format.md`` §2 and §3) with ``struct``
only, one event at a time, with an explicit per-thread stack of event records: nothing is shared with
``pipeline.decode.measureme`` or ``pipeline.aggregate.queries``. ``tests/test_selfprofile_reference.py`` compares
the pipeline's tables with it on every self-profile fixture; other tests read their own profiles with it."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from tests.conftest import fixture_path

FIRST_REGULAR = 100_000_003
INVALID = 100_000_002


def read_events(path: Path) -> tuple[dict, list[dict]]:
    """(metadata, events) of one file; each event has kind, label, args, tid, payload, start, end, value."""

    raw = Path(path).read_bytes()
    assert raw[:4] == b"MMPD"
    version = struct.unpack_from("<I", raw, 4)[0]
    wide = version == 9
    streams = {0: bytearray(), 1: bytearray(), 2: bytearray()}
    pos = 8
    while pos < len(raw):
        tag, size = raw[pos], struct.unpack_from("<I", raw, pos + 1)[0]
        streams[tag] += raw[pos + 5: pos + 5 + size]
        pos += 5 + size
    data = bytes(streams[1])
    idfmt, idsize = ("<Q", 8) if wide else ("<I", 4)
    index = {}
    for vid, addr in struct.iter_unpack(idfmt[0] + idfmt[1] * 2, bytes(streams[2][8:])):
        index[vid] = addr
    memo: dict[int, str] = {}

    def addr_of(sid):
        if sid >= FIRST_REGULAR:
            return sid - FIRST_REGULAR
        if sid == INVALID:
            return None
        return index.get(sid)

    def string(addr):
        if addr is None:
            return "<unknown>"
        if addr in memo:
            return memo[addr]
        out, p = [], addr
        while data[p] != 0xFF:
            if data[p] == 0xFE:
                (sid,) = struct.unpack_from(idfmt, data, p + 1)
                out.append(string(addr_of(sid)))
                p += 1 + idsize
            else:
                q = p
                while data[q] not in (0xFE, 0xFF):
                    q += 1
                out.append(data[p:q].decode("utf-8", "replace"))
                p = q
        memo[addr] = "".join(out)
        return memo[addr]

    metadata = json.loads(json_of_rust_escapes(string(index[100_000_001])))
    rec = "<QQIIII" if wide else "<IIIIII"
    events = []
    for kind, eid, tid, p1, p2, upper in struct.iter_unpack(rec, bytes(streams[0][8:])):
        v1 = p1 | ((upper >> 16) << 32)
        v2 = p2 | ((upper & 0xFFFF) << 32)
        label, *args = string(addr_of(eid)).split("\x1e")
        ev = {"kind": string(addr_of(kind)), "label": label, "args": args or None, "tid": tid}
        if v2 == 0xFFFF_FFFF_FFFF:
            ev.update(payload="instant", start=v1, end=None, value=None)
        elif v2 == 0xFFFF_FFFF_FFFE:
            ev.update(payload="integer", start=None, end=None, value=v1)
        else:
            ev.update(payload="interval", start=v1, end=v2, value=None)
        events.append(ev)
    return metadata, events


def json_of_rust_escapes(text: str) -> str:
    """rustc writes METADATA's command line with Rust's ``escape_default``: ``\\u{e9}`` and ``\\'`` are not JSON.
    Walked escape by escape, so that an escaped backslash before ``u{`` stays what it is."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "'":
            out.append("'")
            i += 2
        elif nxt == "u" and text.startswith("{", i + 2):
            end = text.index("}", i + 3)
            out.append(json.dumps(chr(int(text[i + 3:end], 16)))[1:-1])
            i = end + 1
        else:
            out.append(text[i:i + 2])
            i += 2
    return "".join(out)


def summarize(events: list[dict]) -> tuple[dict[str, list[int]], int, dict[str, int]]:
    """analyzeme's perform_analysis: ({label: [self, time, invocations, misses, hits, blocked,
    incr_load, incr_hashing]}, total_time, artifact sizes)."""
    rows: dict[str, list[int]] = {}
    sizes: dict[str, int] = {}
    stacks: dict[int, list[dict]] = {}
    spans: dict[int, list[int]] = {}
    counted: set[str] = set()

    def row(label):
        return rows.setdefault(label, [0] * 8)

    for ev in reversed(events):
        kind, label = ev["kind"], ev["label"]
        if ev["payload"] == "instant":
            if kind == "QueryCacheHit" and label not in counted:
                row(label)[4] += 1
            continue
        if ev["payload"] == "integer":
            if kind == "ArtifactSize":
                sizes[label] = sizes.get(label, 0) + ev["value"]
            elif kind == "QueryCacheHitCount":
                counted.add(label)
                row(label)[4] += ev["value"]
            continue
        start, end = ev["start"], ev["end"]
        d = end - start
        stack = stacks.setdefault(ev["tid"], [])
        while stack and not (stack[-1]["start"] <= start and end <= stack[-1]["end"]):
            stack.pop()
        if stack:
            parent = stack[-1]
            prow = row(parent["label"])
            prow[0] -= d
            if parent["kind"] == "IncrementalResultHashing":
                prow[7] -= d
            elif parent["kind"] == "IncrementalLoadResult":
                prow[6] -= d
        r = row(label)
        if kind in ("Query", "GenericActivity"):
            r[0] += d; r[1] += d; r[3] += 1; r[2] += 1  # noqa: E702
        elif kind == "QueryBlocked":
            r[0] += d; r[1] += d; r[5] += d  # noqa: E702
        elif kind == "IncrementalLoadResult":
            r[0] += d; r[1] += d; r[6] += d  # noqa: E702
        elif kind == "IncrementalResultHashing":
            r[0] += d; r[7] += d  # noqa: E702
        else:
            r[0] += d; r[1] += d; r[2] += 1  # noqa: E702
        span = spans.setdefault(ev["tid"], [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
        stack.append(ev)
    total = sum(e - s for s, e in spans.values())
    return rows, total, sizes


def rust_path() -> str:
    """PATH with the rustup bin directory added when cargo is not on PATH (e.g. a CI shell without
    ~/.cargo/env); the tests fail, never skip, when no toolchain is found at all."""
    path = os.environ.get("PATH", "")
    if shutil.which("cargo") is None and (Path.home() / ".cargo" / "bin" / "cargo").exists():
        path = f"{Path.home() / '.cargo' / 'bin'}{os.pathsep}{path}"
    if shutil.which("cargo", path=path) is None or shutil.which("rustc", path=path) is None:
        pytest.fail("no Rust toolchain (cargo, rustc) on PATH or in ~/.cargo/bin")
    return path


def workspace_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ws"
    shutil.copytree(fixture_path("selfprofile/workspace-src"), dst, copy_function=shutil.copyfile)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst
