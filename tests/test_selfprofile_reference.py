"""An independent, plain-Python reading of .mm_profdata files and of measureme's summarize.

Written from the format notes (``../shared/docs/measureme-format.md`` §2 and §3) with ``struct``
only, one event at a time, with an explicit per-thread stack of event records: nothing is shared
with ``pipeline.decode.measureme`` or ``pipeline.aggregate.queries``. The tests compare the
pipeline's tables with it (``tests/helpers/selfprofile.py``) on every self-profile fixture.
"""

from __future__ import annotations


import pytest

from tests.conftest import fixture_path
from tests.helpers.selfprofile import read_events, summarize


PROFILES = [
    "selfprofile/hello-default/hello-0006647.mm_profdata",
    "selfprofile/hello-args/unknown-crate-0006345.mm_profdata",
    "selfprofile/workspace-clean/util-0009378.mm_profdata",
    "selfprofile/workspace-clean/mathx-0009384.mm_profdata",
    "selfprofile/workspace-clean/app-0009460.mm_profdata",
    "selfprofile/workspace-incremental/mathx-0009537.mm_profdata",
    "selfprofile/workspace-incremental/app-0009552.mm_profdata",
]


@pytest.fixture(scope="module")
def aggregated_run(tmp_path_factory, dask_pool):
    """Decode and aggregate every fixture profile with the real dask pool."""
    from pipeline import aggregate, decode
    from pipeline.config import Config

    run = tmp_path_factory.mktemp("ref") / "run"
    config = Config()
    decode.run(run, config, dask_pool, inputs=[fixture_path(p) for p in PROFILES])
    aggregate.run(run, config, dask_pool)
    return run


@pytest.mark.parametrize("rel", PROFILES)
def test_events_match_reference_decoder(rel, aggregated_run):
    """Every event of every fixture: kind, label, args, thread and payload as the reference reads them."""
    import pyarrow.compute as pc

    from pipeline.runs import read_table

    path = fixture_path(rel)
    meta, ref = read_events(path)
    files = read_table(aggregated_run, "decoded", "self_profiles").to_pylist()
    (row,) = [f for f in files if f["path"] == str(path)]
    assert row["status"] == "ok" and row["events"] == len(ref)
    assert (row["pid"], row["start_time_ns"], row["cmd"]) == (meta["process_id"], meta["start_time"], meta["cmd"])
    table = read_table(aggregated_run, "decoded", "query_events")
    mine = table.filter(pc.equal(table["file_id"], row["file_id"])).sort_by("event_index").to_pylist()
    got = [{"kind": e["kind"], "label": e["label"], "args": e["args"], "tid": e["thread"], "payload": e["payload"],
            "start": e["start_ns"], "end": e["end_ns"], "value": e["value"]} for e in mine]
    assert got == ref


@pytest.mark.parametrize("rel", PROFILES)
def test_summary_matches_reference_summarize(rel, aggregated_run):
    """query_summary (scope 'file') equals the reference summarize row for row, and the totals agree."""
    from pipeline.runs import read_table

    path = fixture_path(rel)
    _, ref = read_events(path)
    rows, total, sizes = summarize(ref)
    files = read_table(aggregated_run, "decoded", "self_profiles").to_pylist()
    (file_id,) = [f["file_id"] for f in files if f["path"] == str(path)]
    summary = [r for r in read_table(aggregated_run, "aggregated", "query_summary").to_pylist()
               if r["scope"] == "file" and r["file_id"] == file_id]
    cols = ["self_ns", "time_ns", "invocations", "cache_misses", "cache_hits", "blocked_ns", "incr_load_ns",
            "incr_hashing_ns"]
    assert {r["label"]: [r[c] for c in cols] for r in summary} == rows
    totals = [r for r in read_table(aggregated_run, "aggregated", "query_totals").to_pylist()
              if r["scope"] == "file" and r["file_id"] == file_id]
    assert totals[0]["total_ns"] == total
    # Self times and the time between root events add up to the total time exactly.
    assert sum(r["self_ns"] for r in summary) + totals[0]["gap_ns"] == total
    arts = [r for r in read_table(aggregated_run, "aggregated", "artifact_sizes").to_pylist()
            if r["scope"] == "file" and r["file_id"] == file_id]
    assert {r["label"]: r["bytes"] for r in arts} == sizes
