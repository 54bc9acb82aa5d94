"""A run that travels with its symbols: captured on the build's machine, packed, analyzed elsewhere.

The stand-in ``wpr`` (``tests/test_capture_etw.py``) writes a real Windows trace, perfview-net45-x86's, whose
images include three NGEN images with real PDBs (the fixture's ``symbols/``). Here those PDBs lie in the "build's
checkout", as a rustc build's own PDBs would. ``bootprof capture --wpr`` copies them into ``RUN_DIR/symbols`` (only
those whose GUID the trace names); ``bootprof pack`` writes one zip; the checkout and the run directory are removed;
``bootprof run --trace PACK`` in another directory, with no symbol path, resolves every frame of those images."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from pipeline.runs import read_manifest
from tests.conftest import ROOT, fixture_path
from tests.test_capture_etw import STANDIN, checkout

TRACE = "etl/perfview-net45-x86/PerfViewData.etl"
NGEN = ("mscorlib.ni.dll", "System.ni.dll", "System.Xml.ni.dll")


@pytest.fixture
def wpr(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "wpr").write_text(STANDIN.format(python=sys.executable))
    (bin_dir / "wpr").chmod(0o755)
    import os

    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STANDIN_LOG=str(tmp_path / "wpr.log"),
                STANDIN_TRACE=str(fixture_path(TRACE)))


@pytest.mark.slow
def test_captured_packed_moved_and_every_frame_of_the_builds_images_resolves(wpr, tmp_path):
    src, _ = checkout(tmp_path, debuginfo=1)
    # the build's own PDBs, where a build writes them (and a stale one of another GUID, which must be left)
    for pdb in fixture_path("etl/perfview-net45-x86/symbols").glob("*/*/*.pdb"):
        dest = src / "build" / "x86" / "stage1" / "bin" / pdb.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pdb, dest)
    stale = src / "build" / "old" / "mscorlib.ni.pdb"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"not this one")
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "symbolize": {"cache_dir": str(tmp_path / "sc")},
                                  "warehouse": {"path": str(tmp_path / "wh.duckdb")}}))
    run = tmp_path / "captured"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "capture", "--wpr", "--run",
                           str(run), "--", sys.executable, "-c", "pass"], env=wpr, cwd=src, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "copied 3 PDBs of the build's images" in proc.stdout
    copied = read_manifest(run, "capture")["symbols"]
    assert sorted(c["name"] for c in copied) == ["System.Xml.ni.pdb", "System.ni.pdb", "mscorlib.ni.pdb"]
    for c in copied:
        assert (run / c["path"]).stat().st_size == c["size"] > 0 and "/old/" not in c["source"]
        # symbol-store layout: NAME/GUIDAGE/NAME, as the fixture's own store (upper case here)
        want = next(fixture_path("etl/perfview-net45-x86/symbols").glob(f"{c['name']}/*/{c['name']}"))
        assert c["path"].split("/")[2].lower() == want.parent.name.lower()
    pack = tmp_path / "run.zip"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "pack", str(run), str(pack)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(pack) as z:
        names = set(z.namelist())
    assert {"input/trace.etl", "capture/_manifest.json", "bootprof-pack.json"} <= names
    assert sum(n.startswith("symbols/") for n in names) == 3
    # another machine: no checkout, no run directory, no symbol path
    shutil.rmtree(src)
    shutil.rmtree(run)
    elsewhere = tmp_path / "elsewhere" / "run"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "run",
                           str(ROOT / "jobs" / "single-trace.yaml"), "--trace", str(pack), "--run", str(elsewhere)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "inputs: the capture packed in" in proc.stdout
    symbolized = read_manifest(elsewhere, "symbolized")
    assert symbolized["symbol_path"].startswith(str(elsewhere / "symbols"))
    modules = symbolized["modules"]
    for name in NGEN:
        assert modules[name]["frames"] > 0 and modules[name]["resolved"] == modules[name]["frames"], (name, modules[name])
    assert not {m["module"] for m in symbolized["images_without_symbols"]} & set(NGEN)


def test_a_pack_member_outside_the_capture_is_refused(tmp_path):
    from pipeline.capture.bundle import PACK_MANIFEST, unpack_into
    from pipeline.errors import InputError

    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr(PACK_MANIFEST, json.dumps({"format": 1, "files": [{"path": "../escape.txt", "size": 1}]}))
        z.writestr("../escape.txt", "x")
    with pytest.raises(InputError, match="escape.txt"):
        unpack_into(bad, tmp_path / "run")
    assert not (tmp_path / "escape.txt").exists()
