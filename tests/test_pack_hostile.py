"""Packs from elsewhere, as a hostile maker or a careless one would write them: every case is one line naming the pack
and the member (exit 2 through the command line), nothing is written outside the run, no temporary file is left,
and the run is made from the unpacked files alone (issue 52, rows 1-8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.capture.bundle import PACK_MANIFEST, unpack_into
from pipeline.errors import InputError
from tests.conftest import ROOT, fixture_path

#: A capture manifest as ``bootprof capture --self-profile`` writes one (the common part of every manifest, then the
#: capture's own keys).
CAPTURE = {"schema_version": 2, "project_version": "0.1.0", "stage": "capture", "created_utc": "2026-11-28T01:00:00Z",
           "elapsed_s": 1.0, "inputs": [], "config": {}, "config_hash": "0", "upstream": {}, "tables": {},
           "recording": None, "profile_dir": "/somewhere/else/selfprofile", "files": 1}


def make_pack(path: Path, members: dict[str, bytes], listed: list[str] | None = None, manifest=None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(PACK_MANIFEST, json.dumps(manifest if manifest is not None else {
            "format": 1, "files": [{"path": n, "size": len(members.get(n, b""))} for n in (listed or members)]}))
        for name, data in members.items():
            z.writestr(name, data)
    return path


def refused(tmp_path: Path, pack: Path, *words: str) -> str:
    run = tmp_path / "place" / "run"
    with pytest.raises(InputError) as caught:
        unpack_into(pack, run)
    line = str(caught.value)
    assert str(pack) in line and "\n" not in line, line
    for w in words:
        assert w in line, line
    leftovers = [p for p in (tmp_path / "place").rglob("*") if p.is_file()] if (tmp_path / "place").exists() else []
    assert leftovers == [], leftovers
    return line


@pytest.mark.parametrize("name", ["selfprofile/..", "selfprofile/.", "selfprofile//x.mm_profdata", "/etc/passwd",
                                  "C:/x/selfprofile/a", "selfprofile\\..\\..\\x", "selfprofile/a\x1b[31m"])
def test_member_names_that_leave_the_run_or_are_odd_are_refused(tmp_path, name):
    refused(tmp_path, make_pack(tmp_path / "p.zip", {name: b"x"}), repr(name))


def test_a_file_and_a_directory_of_one_name_collide(tmp_path):
    pack = make_pack(tmp_path / "p.zip", {"capture/_manifest.json": b"{}", "capture/_manifest.json/x": b"y"})
    refused(tmp_path, pack, "capture/_manifest.json", "a file and a directory")
    pack = make_pack(tmp_path / "q.zip", {"selfprofile/A.mm_profdata": b"1", "selfprofile/a.mm_profdata": b"2"})
    refused(tmp_path, pack, "collides")


@pytest.mark.parametrize("manifest", [[1, 2], {"format": 1, "files": [1]}, {"format": 1},
                                      {"format": 1, "files": [{"path": "selfprofile/a", "size": "1"}]}, "text"])
def test_a_pack_manifest_of_the_wrong_shape_is_not_a_pack(tmp_path, manifest):
    pack = make_pack(tmp_path / "p.zip", {"selfprofile/a": b"1"}, manifest=manifest)
    refused(tmp_path, pack, "not a readable bootprof pack")


def test_a_pack_of_an_unknown_format_is_refused(tmp_path):
    pack = make_pack(tmp_path / "p.zip", {"selfprofile/a": b"1"},
                     manifest={"format": 99, "files": [{"path": "selfprofile/a", "size": 1}]})
    refused(tmp_path, pack, "format 99")


def _patch_member(pack: Path, name: str, *, flag: int | None = None, method: int | None = None) -> None:
    """Set a member's general-purpose flag or compression method in both of its headers (local and central)."""
    data = bytearray(pack.read_bytes())
    with zipfile.ZipFile(pack) as z:
        info = z.getinfo(name)
    local = info.header_offset
    central = data.rindex(b"PK\x01\x02")            # (the last member's central entry: the member made last)
    for at, field in ((local, 6), (central, 8)):
        if flag is not None:
            data[at + field:at + field + 2] = flag.to_bytes(2, "little")
        if method is not None:
            data[at + field + 2:at + field + 4] = method.to_bytes(2, "little")
    pack.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["encrypted", "deflate64"])
def test_encrypted_and_deflate64_members_are_one_line(tmp_path, how):
    pack = make_pack(tmp_path / "p.zip", {"selfprofile/a.mm_profdata": b"x" * 100})
    _patch_member(pack, "selfprofile/a.mm_profdata", **({"flag": 1} if how == "encrypted" else {"method": 9}))
    refused(tmp_path, pack, "selfprofile/a.mm_profdata", "encrypted" if how == "encrypted" else "method 9")


def test_a_name_over_255_bytes_is_one_line(tmp_path):
    name = "selfprofile/" + "é" * 200 + ".mm_profdata"
    refused(tmp_path, make_pack(tmp_path / "p.zip", {name: b"x"}), "longer than 255 bytes")


def test_a_zip_bomb_is_refused_before_a_byte_is_written(tmp_path):
    """A member of 1 GiB of zeros deflated to about 1 MB (1,000:1): refused from its headers."""
    pack = tmp_path / "bomb.zip"
    with zipfile.ZipFile(pack, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(PACK_MANIFEST, json.dumps({"format": 1, "files": [{"path": "input/trace.etl", "size": 1 << 30}]}))
        info = zipfile.ZipInfo("input/trace.etl")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as member:
            zeros = bytes(1 << 20)
            for _ in range(1024):
                member.write(zeros)
    assert pack.stat().st_size < 4 << 20
    refused(tmp_path, pack, "input/trace.etl", "over 500:1")


def test_a_member_that_holds_more_than_it_declares_is_cut_and_refused(tmp_path):
    """A member whose headers say 10 bytes and whose data is 3 MB: the unpacking stops past the 10, and nothing
    of it stays."""
    pack = make_pack(tmp_path / "p.zip", {"selfprofile/a.mm_profdata": os.urandom(3 << 20)})
    data = bytearray(pack.read_bytes())
    with zipfile.ZipFile(pack) as z:
        info = z.getinfo("selfprofile/a.mm_profdata")
    local = info.header_offset
    central = data.rindex(b"PK\x01\x02")
    data[local + 22:local + 26] = (10).to_bytes(4, "little")         # (uncompressed size, local header)
    data[central + 24:central + 28] = (10).to_bytes(4, "little")     # (and central directory)
    pack.write_bytes(bytes(data))
    refused(tmp_path, pack, "selfprofile/a.mm_profdata")


def _run(tmp_path: Path, pack: Path) -> subprocess.CompletedProcess:
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    return subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "run", "jobs/single-trace.yaml",
                           "--trace", str(pack), "--run", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_a_pack_without_a_capture_is_an_error_not_the_demo(tmp_path):
    """It once said "inputs: the capture packed in X.zip", then decoded, reported and ingested the synthesized demo
    trace, exit 0."""
    profile = fixture_path("selfprofile/hello-default/hello-0006647.mm_profdata")
    pack = make_pack(tmp_path / "p.zip", {f"selfprofile/{profile.name}": profile.read_bytes()})
    proc = _run(tmp_path, pack)
    assert proc.returncode == 2 and "holds no capture" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "input" / "demo.etl").exists()
    assert not (tmp_path / "wh.duckdb").exists()


def test_a_pack_is_analyzed_from_its_own_files_alone(tmp_path):
    """A capture manifest that names paths outside the pack (another directory's self-profiles; a file of the
    system as the trace) once made the decode read them, exit 0; the machine that captured, likewise, decoded the
    capture directory as it was now. Only the unpacked files are read, and the run's capture manifest names them."""
    other = tmp_path / "other-profiles"
    other.mkdir()
    for p in fixture_path("selfprofile/workspace-clean").glob("*.mm_profdata"):
        (other / p.name).write_bytes(p.read_bytes())
    mine = fixture_path("selfprofile/hello-default/hello-0006647.mm_profdata")
    capture = dict(CAPTURE, recording={"tool": "wpr", "path": "/etc/hostname"}, profile_dir=str(other))
    pack = make_pack(tmp_path / "p.zip", {"capture/_manifest.json": json.dumps(capture).encode(),
                                          f"selfprofile/{mine.name}": mine.read_bytes()})
    proc = _run(tmp_path, pack)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    decoded = json.loads((run / "decoded" / "_manifest.json").read_text())
    read = {Path(i["path"]).resolve() for i in decoded["inputs"]}
    assert read == {(run / "selfprofile" / mine.name).resolve()}, read
    kept = json.loads((run / "capture" / "_manifest.json").read_text())
    assert kept["profile_dir"] == str(run / "selfprofile") and kept["recording"]["path"] is None


def test_a_packed_trace_the_capture_manifest_does_not_name_is_still_the_runs(tmp_path):
    """A pack whose capture manifest has no recording (a self-profile capture) but holds ``input/trace.etl``: the
    trace is one of the run's inputs now, and a later run of the directory without ``--trace`` finds it too."""
    from pipeline.capture import TRACE
    from pipeline.capture.bundle import unpacked
    from pipeline.jobs import captured_inputs

    trace = fixture_path("etl/perfview-small/gcevents.etl")
    pack = make_pack(tmp_path / "p.zip", {"capture/_manifest.json": json.dumps(CAPTURE).encode(),
                                          TRACE.as_posix(): trace.read_bytes()})
    run = tmp_path / "run"
    assert unpacked([pack], run) == [run / TRACE]
    assert captured_inputs(run) == [run / TRACE]
