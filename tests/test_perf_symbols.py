"""A perf run that travels with its ELF files: ``bootprof capture --perf --symbols`` copies each sampled image (by
build id; rustup's librustc_driver, which has none, by its path) into ``RUN_DIR/symbols/elf``, ``bootprof pack``
carries them, and symbolize reads them before the recorded paths: a packed run whose images are at none of their
recorded paths names the same top functions as the run symbolized from the files themselves.

The input is the test run's debug DWARF recording of a small real cargo build (``tests/helpers/perfbuild.py``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import perfbuild

pytestmark = pytest.mark.skipif(not perfbuild.have_tools(), reason="needs perf and cargo on PATH")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return perfbuild.recorded(tmp_path_factory, "debug", "dwarf")     # (recorded with --symbols)


def _symbolized(run: Path, cache: Path) -> Path:
    from pipeline import symbolize
    from pipeline.cluster import Pool
    from pipeline.config import Config

    config = Config()
    config.cluster.mode = "synchronous"
    config.symbolize.cache_dir = cache
    symbolize.run(run, config, Pool(None))
    return run


def _top(run: Path, n: int = 20) -> list[tuple[str, int]]:
    """Self samples of the top ``n`` leaf functions (outermost of the inline chain), kernel included."""
    import duckdb

    rows = duckdb.connect().execute(f"""
        WITH f AS (SELECT pid, address, any_value(function) AS function FROM
                   read_parquet('{run}/symbolized/frames.parquet') WHERE leaf AND inline_depth = 0 GROUP BY ALL)
        SELECT f.function, count(*) FROM read_parquet('{run}/decoded/samples.parquet') s
        LEFT JOIN f ON f.pid = s.pid AND f.address = s.ip GROUP BY ALL""").fetchall()
    return sorted(Counter(dict(rows)).items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]


def _elf_lookups(run: Path) -> dict[str, dict]:
    manifest = json.loads((run / "symbolized" / "_manifest.json").read_text())
    return {r["key"]: r for r in manifest["debug_ids"] if r["key"].startswith("elf-")}


def test_capture_copies_each_sampled_image_with_a_manifest(captured):
    from pipeline.capture.elfsymbols import sampled_images
    from pipeline.runs import read_manifest

    manifest = read_manifest(captured, "capture")
    copied, skipped = manifest["symbols"], manifest["symbols_skipped"]
    assert manifest["symbols_bytes"] == sum(c["size"] for c in copied) <= manifest["symbols_max_bytes"]
    for c in copied:
        assert (captured / c["path"]).stat().st_size == c["size"] == Path(c["source"]).stat().st_size
        assert c["path"] == f"symbols/elf/{c['debug_id']}/{c['name']}"
        assert c["debug_id"] == (f"elf-{c['build_id']}" if c["build_id"] else c["debug_id"])
    driver = [c for c in copied if c["name"].startswith("librustc_driver")]
    assert len(driver) == 1 and driver[0]["build_id"] is None and driver[0]["size"] > 50_000_000
    assert driver[0]["debug_id"].startswith("elf-path-")
    # every sampled image is copied or listed as left, with its reason; the kernel is left
    sampled = sampled_images(captured)
    sources = {c["source"] for c in copied}
    left = {s["name"] for s in skipped}
    for img in sampled:
        assert img["file"] in sources or img["file"] in left, img
    assert any(s["name"] == "[kernel]" and "kernel" in s["reason"] for s in skipped)
    # a distribution's detached debug file goes beside its file, when the machine has one
    from pipeline.symbolize.elf import debug_file

    for c in copied:
        if c["build_id"] and not c["name"].endswith(".debug"):
            has = debug_file(c["build_id"]) is not None
            assert ((captured / c["path"]).with_name(c["name"] + ".debug").is_file()) == has


def test_symbols_max_leaves_the_largest_images_with_the_reason(captured, tmp_path):
    from pipeline.capture.elfsymbols import collect_elf_symbols

    run = tmp_path / "run"
    shutil.copytree(captured, run, ignore=shutil.ignore_patterns("symbols"))
    out = collect_elf_symbols(run, 20_000_000)
    assert out["bytes"] == sum(c["size"] for c in out["copied"]) <= 20_000_000
    assert sum(p.stat().st_size for p in (run / "symbols").rglob("*") if p.is_file()) == out["bytes"]
    over = [s for s in out["skipped"] if "--symbols-max" in s["reason"]]
    assert any(s["name"].split("/")[-1].startswith("librustc_driver") and s["size"] > 50_000_000 for s in over)
    assert out["copied"], "the small images still fit"


def test_a_packed_run_resolves_from_its_own_symbols(captured, tmp_path):
    """Packed, unpacked elsewhere and analyzed: every ELF image is read from the run's copy. With the recorded paths
    rewritten to a directory that does not exist (the files are at none of them), the top functions are those of
    the run symbolized from the files at their recorded paths."""
    pack = tmp_path / "run.zip"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "pack", str(captured), str(pack)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    copied = json.loads((captured / "capture" / "_manifest.json").read_text())["symbols"]
    with zipfile.ZipFile(pack) as z:
        sizes = {i.filename: i.file_size for i in z.infolist()}
    assert {c["path"]: c["size"] for c in copied}.items() <= sizes.items()

    (tmp_path / "a").mkdir()
    there = perfbuild.analyze(tmp_path / "elsewhere", tmp_path / "a", pack)
    lookups = _elf_lookups(there)
    bundled = {c["debug_id"] for c in copied}
    assert bundled <= lookups.keys()
    for key in bundled:
        found = lookups[key]
        if found["status"] == "ok":
            assert found["found_via"] == "the run's symbols", found
            assert Path(found["source"]).is_relative_to(there / "symbols" / "elf"), found
        else:   # (a file with no symbols at all: rustup's ld.lld wrapper, when the build's link happened to be sampled)
            assert "neither a symbol table nor debug information" in found["reason"], found
    assert sum(lookups[key]["status"] == "ok" for key in bundled) >= len(bundled) - 1

    # the baseline: the captured run without its copies, symbolized from the files where the recording saw them
    base = tmp_path / "base"
    shutil.copytree(captured, base, ignore=shutil.ignore_patterns("symbols"))
    _symbolized(base, tmp_path / "cache-base")
    assert all(r["found_via"] == "recorded path" for r in _elf_lookups(base).values() if r["status"] == "ok")

    # elsewhere, with none of the recorded paths: the images table's files moved to a directory that does not exist
    moved = tmp_path / "moved"
    shutil.copytree(there, moved, ignore=shutil.ignore_patterns("symbolized"))
    images = pq.read_table(moved / "decoded" / "images.parquet")
    nowhere = tmp_path / "not-here"
    names = [f"{nowhere}/{Path(n).name}" if n and n.startswith("/") else n
             for n in images.column("file_name").to_pylist()]
    images = images.set_column(images.schema.get_field_index("file_name"), "file_name", pa.array(names, pa.string()))
    pq.write_table(images, moved / "decoded" / "images.parquet")
    _symbolized(moved, tmp_path / "cache-moved")
    lookups = _elf_lookups(moved)
    assert bundled <= lookups.keys()
    assert all(lookups[k]["found_via"] == "the run's symbols" for k in bundled if lookups[k]["status"] == "ok")

    top = _top(base)
    assert _top(moved) == top
    assert any(f and not f.startswith(("[kernel]", "librustc_driver")) and "+0x" not in f for f, _ in top[:5])
    rates = [json.loads((r / "symbolized" / "_manifest.json").read_text())["modules"] for r in (base, moved)]
    assert rates[0] == rates[1]
    driver = next(m for m in rates[1] if m.startswith("librustc_driver"))
    assert rates[1][driver]["resolved"] > 0
