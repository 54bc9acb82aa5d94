"""ETL aggregate and report sections on the real PerfView traces (Windows 7 x86 with full stacks and
three real PDBs; Windows 8 x64 with stack caching): every sample lands in exactly one process, one
leaf and one folded stack, and the totals equal the SampledProfile counts the fixture README gives
(counted by TraceEvent, an independent decoder)."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.config import Config
from pipeline.runs import read_manifest, read_table
from tests.conftest import fixture_path

TRACES = {"net45-x86": ("etl/perfview-net45-x86/PerfViewData.etl", 16_865),
          "net452-x64": ("etl/perfview-net452-x64/net.4.5.2.x64.etl", 79_528)}


_made: dict[str, object] = {}


def made(name: str, tmp_path_factory, dask_pool):
    """The run of one trace, decoded to its report once per session."""
    from pipeline import aggregate, decode, report, symbolize

    if name not in _made:
        run = tmp_path_factory.mktemp(f"real-{name}") / "run"
        config = Config()
        config.symbolize.symbol_path = str(fixture_path("etl/perfview-net45-x86/symbols"))
        config.symbolize.cache_dir = run.parent / "symcache"
        decode.run(run, config, dask_pool, inputs=[fixture_path(TRACES[name][0])])
        symbolize.run(run, config, dask_pool)
        aggregate.run(run, config, dask_pool)
        report.run(run, config, dask_pool)
        _made[name] = run
    return _made[name]


@pytest.fixture(scope="module", params=list(TRACES))
def real_run(request, tmp_path_factory, dask_pool):
    return made(request.param, tmp_path_factory, dask_pool), TRACES[request.param][1]


def rows(run, table):
    return read_table(run, "aggregated", table).to_pylist()


def test_every_sample_counted_once(real_run):
    run, samples = real_run
    cpu = read_manifest(run, "aggregated")["sections"]["cpu"]
    assert cpu["samples"] == samples
    assert sum(r["samples"] for r in rows(run, "cpu_by_process")) == samples
    assert sum(r["samples"] for r in rows(run, "cpu_folded")) == samples
    functions = rows(run, "cpu_by_function")
    assert sum(r["self_samples"] for r in functions) == samples
    assert all(r["self_samples"] <= r["inclusive_samples"] <= samples for r in functions)
    modules = rows(run, "cpu_by_module")
    assert sum(r["self_samples"] for r in modules) == samples
    # a module's inclusive count is at least that of each of its functions
    per_module = {r["module"]: r["inclusive_samples"] for r in modules}
    assert all(r["inclusive_samples"] <= per_module[r["module"]] for r in functions)


def test_processes_and_tree(real_run):
    run, _ = real_run
    tree = rows(run, "process_tree")
    assert len(tree) == read_manifest(run, "decoded")["tables"]["processes"]
    keys = {r["process_key"] for r in tree}
    assert all(r["parent_key"] in keys for r in tree if r["parent_key"] is not None)
    by_key = {r["process_key"]: r for r in tree}
    for r in tree:
        if r["parent_key"] is not None:
            assert by_key[r["parent_key"]]["pid"] == r["parent_pid"]
    cpu = Counter()
    for r in rows(run, "cpu_by_process"):
        cpu[r["process_key"]] += r["samples"]
    assert {k: v for k, v in cpu.items() if v} == {r["process_key"]: r["samples"] for r in tree if r["samples"]}
    # rundown processes are ordered by the rundown, so reused parent pids make no cycles
    assert read_manifest(run, "aggregated")["sections"]["processes"]["parent_cycles_broken"] == 0
    assert all(r["depth"] is not None for r in tree)
    roots = [r for r in tree if r["parent_key"] is None]
    assert sum(r["tree_samples"] for r in roots) == sum(cpu.values()) - cpu.get(None, 0)


def test_no_memory_tables_without_memory_events(real_run):
    run, _ = real_run
    assert "memory" not in read_manifest(run, "aggregated")["sections"]
    index = (run / "report" / "index.html").read_text()
    assert '<section id="cpu"' in index and '<section id="memory"' not in index


@pytest.fixture(scope="module")
def x86_run(tmp_path_factory, dask_pool):
    """The x86 trace's run alone: the PDBs that ship with the fixtures are of its NGEN images. (Its tests once
    took ``real_run`` and returned early for the x64 trace, passing there without a check.)"""
    return made("net45-x86", tmp_path_factory, dask_pool)


def test_pdb_functions_of_the_x86_trace(x86_run):
    run = x86_run
    functions = rows(run, "cpu_by_function")
    named = [r for r in functions if r["module"] == "mscorlib.ni.dll" and r["raw_name"] is not None]
    assert named, "mscorlib.ni.dll frames resolve through the fixture's PDB"
    assert all(r["crate"] is None for r in named)   # C# names are not Rust paths


def test_ngen_frames_resolve_in_every_view_of_the_x86_trace(x86_run):
    """Every frame inside the three NGEN images whose PDBs ship with the fixture is a function name in every
    view that shows frames: functions, modules' functions, folded stacks (and so the flame graph)."""
    run = x86_run
    ngen = ("mscorlib.ni.dll", "System.ni.dll", "System.Xml.ni.dll")
    functions = [r for r in rows(run, "cpu_by_function") if r["module"] in ngen]
    assert {r["module"] for r in functions} == set(ngen)
    assert all(r["raw_name"] and "+0x" not in r["function"] for r in functions)
    frames = [f for r in rows(run, "cpu_folded") for f in r["stack"].split(";")[1:] if f.startswith(ngen)]
    assert frames and not [f for f in frames if "+0x" in f]
    folded = (run / "report" / "cpu_folded.txt").read_text()
    assert "mscorlib.ni.dll!" in folded and "ni.dll+0x" not in folded
