"""A Linux perf run beyond its decode: packed and analyzed elsewhere, crates and queries from the self-profiles of
its rustc processes, beside Windows runs in one warehouse. The input is one real cargo build recorded here with
``bootprof capture --perf --self-profile`` (``tests/helpers/perfbuild.py``, shared with ``test_perf_decode.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pyarrow.parquet as pq
import pytest

from tests.helpers import perfbuild

pytestmark = pytest.mark.skipif(not perfbuild.have_tools(), reason="needs perf and cargo on PATH")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    why = perfbuild.cannot_record()
    if why:
        pytest.skip(f"perf cannot record on this machine: {why}")
    return perfbuild.recorded(tmp_path_factory)


def _tables(run, stage):
    return {p.name: pq.read_table(p) for p in sorted((run / stage).glob("*.parquet"))}


#: Columns that name where an input file lies (the run directory differs); columns ending ``_s`` are how long
#: something took.
WHERE = ("file", "path")


def _rows(table) -> list[str]:
    drop = [c for c in table.column_names if c in WHERE or c.endswith("_s")]
    return sorted(repr(r) for r in table.drop_columns(drop).to_pylist())


def test_a_packed_perf_run_analyzes_to_the_same_tables(recorded, tmp_path_factory, tmp_path):
    """``bootprof pack`` takes the perf.data file and the self-profiles; ``bootprof run --trace PACK`` elsewhere
    unpacks them and gives the tables the captured run gives."""
    pack = tmp_path / "run.zip"
    subprocess.run([sys.executable, "-m", "pipeline", "pack", str(recorded), str(pack)], check=True,
                   capture_output=True, text=True)
    with zipfile.ZipFile(pack) as z:
        names = set(z.namelist())
        listed = {f["path"] for f in json.loads(z.read("bootprof-pack.json"))["files"]}
        size = z.getinfo("input/perf.data").file_size
    assert "input/perf.data" in names and "capture/_manifest.json" in names
    assert any(n.startswith("selfprofile/") and n.endswith(".mm_profdata") for n in names)
    assert names - {"bootprof-pack.json"} == listed
    assert size == (recorded / "input" / "perf.data").stat().st_size

    there = perfbuild.analyze(tmp_path / "elsewhere", tmp_path, pack)
    assert (there / "input" / "perf.data").read_bytes() == (recorded / "input" / "perf.data").read_bytes()
    manifest = json.loads((there / "capture" / "_manifest.json").read_text())
    assert manifest["recording"]["path"] == str(there / "input" / "perf.data")
    here = perfbuild.analyzed(tmp_path_factory)
    for stage in ("decoded", "aggregated"):
        ours, theirs = _tables(here, stage), _tables(there, stage)
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert ours[name].schema == theirs[name].schema, (stage, name)
            assert _rows(ours[name]) == _rows(theirs[name]), (stage, name)
    assert {"samples.parquet", "self_profiles.parquet", "query_events.parquet"} <= _tables(here, "decoded").keys()
    assert (there / "report" / "index.html").is_file()


def test_a_pack_with_two_recordings_or_a_stray_input_is_refused(tmp_path):
    """A perf.data member passes the checks every member passes; a pack holding both kinds of recording, or a file
    beside them in ``input/``, is not a capture."""
    from pipeline.capture.bundle import PACK_MANIFEST, unpack_into, unpacked
    from pipeline.errors import BootprofError, InputError

    def make(name, members):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(PACK_MANIFEST, json.dumps({"format": 1, "files": [{"path": n, "size": len(d)}
                                                                         for n, d in members.items()]}))
            for n, d in members.items():
                z.writestr(n, d)
        return path

    manifest = json.dumps({"recording": {"tool": "perf", "path": "/elsewhere/input/perf.data"}}).encode()
    both = make("both.zip", {"capture/_manifest.json": manifest, "input/perf.data": b"PERFILE2",
                             "input/trace.etl": b"x"})
    with pytest.raises(BootprofError, match="an ETL trace and a perf.data file"):
        unpacked([both], tmp_path / "r1")
    for stray in ("input/perf.data.old", "input/perf.partial.data", "input/perf"):
        with pytest.raises(InputError, match="not part of a capture"):
            unpack_into(make("stray.zip", {"capture/_manifest.json": manifest, stray: b"x"}), tmp_path / "r2")
    assert not (tmp_path / "r2" / "input").exists()
