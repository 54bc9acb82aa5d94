"""The perf decoder's parts (``decode.partition_bytes``): a file cut into many parts, decoded on a real dask
LocalCluster or in this process, gives the tables of one part; on a large made-up file, on the recorded build
(frame pointers and DWARF), and on damaged copies (error rows with their offsets, the rest decoded)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import assert_same_tables, made_once
from tests.helpers import perfbuild

#: Bytes of the made-up file: 12 parts of the default 24 MiB (the test's two decodes and its write take ~40 s on
#: this 2-core VM; a GB would take minutes).
LARGE = 300_000_000
ONE_PART = 1 << 40


def tiny_parts(path: Path) -> int:
    """Part bytes that cut ``path`` into about 20 parts."""
    return max(path.stat().st_size // 20, 64)


def _decode(path: Path, run: Path, pool, part_bytes: int) -> dict:
    from pipeline import decode
    from pipeline.config import Config

    config = Config()
    # (model_copy: below the setting's least, 64 KiB, to cut a recorded build of ~100 KB into many parts)
    config.decode = config.decode.model_copy(update={"partition_bytes": part_bytes})
    return decode.run(run, config, pool, inputs=[path])["perf"]


@pytest.fixture(scope="session")
def large_perf(tmp_path_factory) -> Path:
    """A made-up perf.data of ~300 MB (``write_large_perf``), written once per test run, with its truth."""
    from pipeline.synth.perf import write_large_perf

    def make(root: Path):
        truth = write_large_perf(root / "perf.data", LARGE, seed=5)
        (root / "truth.json").write_text(json.dumps(truth))

    return made_once(tmp_path_factory, "perf-large", make) / "perf.data"


def test_a_large_file_in_parts_on_a_cluster_equals_one_part(large_perf, dask_pool, tmp_path):
    from pipeline.cluster import Pool

    one = _decode(large_perf, tmp_path / "one", Pool(None), ONE_PART)
    many = _decode(large_perf, tmp_path / "many", dask_pool, 24 << 20)
    assert one["parts"] == 1 and many["parts"] >= 10
    assert assert_same_tables(tmp_path / "one" / "decoded", tmp_path / "many" / "decoded") == 8
    truth = json.loads((large_perf.parent / "truth.json").read_text())
    samples = pq.read_table(tmp_path / "many" / "decoded" / "samples.parquet", columns=["pid"])
    assert many["samples"] == truth["samples"] > 1_000_000
    assert Counter(samples.column("pid").to_pylist()) == {int(k): v for k, v in truth["per_pid"].items()}
    procs = pq.read_table(tmp_path / "many" / "decoded" / "processes.parquet").to_pylist()
    rustc = [p for p in procs if p["image_name"] == "rustc"]
    assert len(rustc) == 6 and all(p["start_ns"] is not None and p["end_ns"] is not None for p in rustc)
    keep = {k: v for k, v in one.items() if not k.endswith("_s") and k not in ("mb_per_s", "parts")}
    assert keep == {k: many[k] for k in keep}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return perfbuild.recorded(tmp_path_factory) / "input" / "perf.data"


def test_the_recorded_build_in_tiny_parts_equals_one_part(recorded, tmp_path):
    from pipeline.cluster import Pool

    one = _decode(recorded, tmp_path / "one", Pool(None), ONE_PART)
    many = _decode(recorded, tmp_path / "many", Pool(None), tiny_parts(recorded))
    assert many["parts"] >= 15 and many["samples"] == one["samples"] > 200
    assert assert_same_tables(tmp_path / "one" / "decoded", tmp_path / "many" / "decoded") == 8


@pytest.mark.parametrize("kind", ["zero_size", "flipped"])
def test_a_damaged_file_in_parts_gives_error_rows_and_the_rest(recorded, tmp_path, kind):
    from pipeline.cluster import Pool
    from tests.test_perf_decode import _damaged, _flipped

    path = _flipped(recorded.parent.parent, tmp_path)[0] if kind == "flipped" else \
        _damaged(recorded.parent.parent, tmp_path, kind)
    one = _decode(path, tmp_path / "one", Pool(None), ONE_PART)
    many = _decode(path, tmp_path / "many", Pool(None), tiny_parts(path))
    assert many["parts"] >= 15 and many["errors"] == one["errors"] > 0 and many["samples"] == one["samples"] > 0
    assert assert_same_tables(tmp_path / "one" / "decoded", tmp_path / "many" / "decoded") == 8
    errors = pq.read_table(tmp_path / "many" / "decoded" / "errors.parquet").to_pylist()
    assert all(str(path) in e["message"] and e["file_offset"] >= 0 for e in errors)
    assert {e["kind"] for e in errors} >= ({"record", "resync"} if kind == "zero_size" else {"record"})
