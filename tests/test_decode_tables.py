"""The decoder's table registry (pipeline/decode/etl/tables.py) says what the decoder writes: every scratch table
that partitions and bucket tasks write has the columns and types of its registry entry (what the joins' SQL
assumes of it, and the shape of the empty table it gets when no partition wrote it), on a real trace and on
synthesized variants with heap snapshots, stack keys and XPRESS."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.decode.etl import tables
from tests.conftest import fixture_path
from tests.synth_traces import VARIANTS


def plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


@pytest.mark.parametrize("source", ["etl/perfview-net452-x64/net.4.5.2.x64.etl", "plain64", "xpress32_cached"])
def test_written_scratch_tables_have_their_registry_schema(source, tmp_path, monkeypatch):
    import shutil

    from pipeline import decode, portable, synth
    from pipeline.cluster import Pool
    from pipeline.config import Config

    if source in VARIANTS:
        trace = tmp_path / "trace.etl"
        synth.run(trace, VARIANTS[source])
    else:
        trace = fixture_path(source)
    # (the decode's scratch stays: it moves with the stage's output into decoded/)
    monkeypatch.setattr(portable, "remove_tree", lambda path, must=False: None)
    decode.run(tmp_path / "run", Config(), Pool(None), inputs=[trace])
    scratch = tmp_path / "run" / "decoded" / ".scratch"
    checked = set()
    for name, table in tables.SCRATCH.items():
        target = scratch / f"{name}.parquet"
        parts = sorted(target.rglob("*.parquet")) if target.is_dir() else [target] if target.exists() else []
        for part in parts:
            got = pq.read_schema(part)
            assert [(f.name, plain(f.type)) for f in got] == [(c, t) for c, t in table.columns], part
            checked.add(name)
    assert {"_process_events", "_thread_events", "_image_events", "_stack_frames", "_bucket_stacks"} <= checked
    if source == "xpress32_cached":
        assert "_stack_defs" in checked
    if source == "plain64":
        assert "_heapsnap_stacks" in checked
    shutil.rmtree(scratch)
    _no_kernel_took_a_named_tuple()


def _no_kernel_took_a_named_tuple() -> None:
    """Kernels take plain tuples: numba's cache index pickles a named tuple's class with a kernel's signatures,
    and loading that index fails outright (not as a cache miss) once the class has moved (``batch.record_columns``).
    Checked on every signature this process compiled or loaded for the decoder's kernels."""
    import importlib
    import pkgutil

    from numba.core import types
    from numba.core.registry import CPUDispatcher

    import pipeline.decode.etl as etl

    names = [m.name for m in pkgutil.walk_packages(etl.__path__, "pipeline.decode.etl.")]
    kernels = [(name, k) for name in names for k, obj in vars(importlib.import_module(name)).items()
               if isinstance(obj, CPUDispatcher) and obj.signatures]
    assert len(kernels) > 20
    for name, k in kernels:
        for sig in getattr(importlib.import_module(name), k).signatures:
            assert not any(isinstance(t, types.BaseNamedTuple) for t in sig), f"{name}.{k} takes a named tuple: {sig}"


def test_forms_come_from_one_declaration():
    samples = tables.OUTPUT["samples"]
    assert samples.schema.names == [c for c, _ in samples.columns] and samples.empty().num_rows == 0
    assert not samples.schema.field("ip").nullable and samples.schema.field("stack_id").nullable
    assert tables.SCRATCH["_stack_frames"].ddl == "h1 UBIGINT, h2 UBIGINT, frames UBIGINT[]"


def test_decoder_modules_import_in_layers_and_stay_small():
    """The decoder's layers (issue 31): no module of ``pipeline/decode/etl`` imports another that imports it back,
    directly or through others (imports inside functions count: a cycle there is still a tangle to read; the whole
    package's graph, ``tests/test_layers.py``), and no module is over 800 lines."""
    from tests.conftest import ROOT
    from tests.test_layers import cycles, modules

    root = ROOT / "pipeline" / "decode" / "etl"
    for path in root.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 800, f"{path.relative_to(ROOT)} is over 800 lines"
    prefix = "pipeline.decode.etl"
    graph = {m: {d for d, _ in deps if d.startswith(prefix)} for m, deps in modules().items() if m.startswith(prefix)}
    assert len(graph) > 15
    assert not cycles(graph), cycles(graph)
