"""Golden test on a real trace: perfview-net45-x86/PerfViewData.etl with its three real NGEN PDBs.

The trace is decoded by the decode stage, then symbolized with the fixture's ``symbols/`` store
(lower-case GUID directories, as the zip had them). Those PDBs are publics-only and carry no
section headers, so this exercises the publics fallback and its section-map layout. Every frame
inside mscorlib.ni.dll, System.ni.dll and System.Xml.ni.dll must resolve, those of the CPU samples' stacks
and those of the stacks carried by other events (``event_stacks``) alike; every other image is reported
once, as not found.
"""

from __future__ import annotations

import pytest

from pipeline.config import Config
from pipeline.runs import read_manifest, read_table
from pipeline.symbolize import run as symbolize
from tests.conftest import fixture_path

# frames (pid, address) per module: of the samples' stacks and ips, and of the event stacks too
NGEN_SAMPLES = {"mscorlib.ni.dll": 127, "System.ni.dll": 3, "System.Xml.ni.dll": 8}
NGEN = {"mscorlib.ni.dll": 143, "System.ni.dll": 3, "System.Xml.ni.dll": 8}

# (pid, module, rva) -> function. Checked independently with ``llvm-pdbutil-16 dump -publics``: the
# nearest S_PUB32 at or below ``0003:(rva - 0x2B4000)`` (segment 3 of mscorlib.ni starts at 0x2B4000).
GOLDEN = {
    (1876, "mscorlib.ni.dll", 0x2BD7B1): "System.Security.Cryptography.CryptoConfig.OpenCryptoConfig",
    (1876, "mscorlib.ni.dll", 0x2D054F): "System.Reflection.RuntimeMethodInfo.GetParameters",
    (3884, "mscorlib.ni.dll", 0xD2D6F7): "[COLD] System.Globalization.CultureData.GetCalendar",
}


@pytest.fixture(scope="module")
def symbolized(tmp_path_factory, dask_pool):
    from pipeline import decode

    trace = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    run_dir = tmp_path_factory.mktemp("perfview") / "run"
    cfg = Config()
    cfg.symbolize.symbol_path = str(fixture_path("etl/perfview-net45-x86/symbols"))
    cfg.symbolize.cache_dir = run_dir.parent / "cache"
    decode.run(run_dir, cfg, dask_pool, inputs=[trace])
    summary = symbolize(run_dir, cfg, dask_pool)
    return (summary, read_manifest(run_dir, "symbolized"), read_table(run_dir, "symbolized", "frames").to_pylist(),
            run_dir)


def ngen_frames(run_dir, with_event_stacks: bool) -> dict[str, set]:
    """(pid, address) of every frame inside the NGEN images, counted here from the decoded tables: the
    samples' stacks and ips and, ``with_event_stacks``, the stacks of ``event_stacks`` (pid from the event)."""
    images = [r for r in read_table(run_dir, "decoded", "images").to_pylist()
              if r["file_name"].rsplit("\\", 1)[-1] in NGEN]
    stacks = {r["stack_id"]: r["frames"] for r in read_table(run_dir, "decoded", "stacks").to_pylist()}
    seen = {(r["pid"], a) for r in read_table(run_dir, "decoded", "samples").to_pylist()
            for a in stacks.get(r["stack_id"], []) + ([r["ip"]] if r["ip"] else [])}
    if with_event_stacks:
        pid_of = {(r["timestamp"], r["cpu"], r["stream_pos"]): r["pid"]
                  for r in read_table(run_dir, "decoded", "events").to_pylist()}
        seen |= {(pid_of[(r["timestamp"], r["cpu"], r["stream_pos"])], a)
                 for r in read_table(run_dir, "decoded", "event_stacks").to_pylist() for a in stacks.get(r["stack_id"], [])}
    out: dict[str, set] = {m: set() for m in NGEN}
    for pid, address in seen:
        for i in images:
            if i["pid"] == pid and i["base"] <= address < i["base"] + i["size"]:
                out[i["file_name"].rsplit("\\", 1)[-1]].add((pid, address))
    return out


def test_frames_of_samples_and_event_stacks_are_counted_independently(symbolized):
    *_, run_dir = symbolized
    assert {m: len(v) for m, v in ngen_frames(run_dir, False).items()} == NGEN_SAMPLES
    assert {m: len(v) for m, v in ngen_frames(run_dir, True).items()} == NGEN


def test_ngen_frames_resolve_to_function_names(symbolized):
    summary, manifest, frames, run_dir = symbolized
    for module, count in NGEN.items():
        assert manifest["modules"][module] == {"frames": count, "resolved": count, "rate": 1.0}, module
        rows = [r for r in frames if r["module"] == module]
        assert len(rows) == count
        assert {(r["pid"], r["address"]) for r in rows} == ngen_frames(run_dir, True)[module]
        assert all(r["resolved"] and r["function"] and "+0x" not in r["function"] and r["line"] is None
                   for r in rows)
    found = {(r["pid"], r["module"], r["rva"]): r["function"] for r in frames if r["module"] in NGEN}
    for key, function in GOLDEN.items():
        assert found[key] == function
    ok = {d["pdb_name"]: d for d in manifest["debug_ids"] if d["status"] == "ok"}
    assert set(ok) == {"mscorlib.ni.pdb", "System.ni.pdb", "System.Xml.ni.pdb"}
    assert {d["kind"] for d in ok.values()} == {"pdb-publics"}
    # the native image's RSDS record wins over the IL assembly's ILRSDS record of the same load
    assert all(e["pdb_name"] != "mscorlib.pdb" for e in manifest["images_without_symbols"])


def test_other_images_are_reported_once_with_a_reason(symbolized):
    summary, manifest, frames, _ = symbolized
    missing = manifest["images_without_symbols"]
    keys = [(e["module"], e["debug_id"]) for e in missing]
    assert len(keys) == len(set(keys)) == summary["images_without_symbols"]
    assert {e["module"] for e in missing} >= {"ntoskrnl.exe", "clr.dll", "ntdll.dll"}
    assert all(e["reason"].startswith(("not found", "no debug id")) for e in missing)
    unresolved = [r for r in frames if not r["resolved"] and r["module"]]
    assert unresolved and all(r["function"] == f"{r['module']}+0x{r['rva']:x}" for r in unresolved)
    resolved = sum(r["resolved"] for r in frames if r["inline_depth"] == 0)
    assert manifest["resolved_frames"] == resolved == sum(NGEN.values())
    assert manifest["resolution_rate"] == round(resolved / manifest["frames"], 6)


def test_without_symbolic_the_pdbs_give_the_same_names(symbolized, tmp_path):
    """Without ``symbolic`` (Windows' default: it has no wheel there) nothing was symbolized, though a PDB's public
    symbols need no symbolic. In a process where it cannot be imported, the same run is symbolized by the publics
    reader alone, and every frame gets the name it gets with symbolic (these PDBs hold publics only)."""
    import json
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    _, _, frames, run_dir = symbolized
    run = tmp_path / "run"
    shutil.copytree(run_dir / "decoded", run / "decoded")
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"cluster": {"mode": "synchronous"},
                                  "symbolize": {"cache_dir": str(tmp_path / "cache"),
                                                "symbol_path": str(fixture_path("etl/perfview-net45-x86/symbols"))}}),
                      encoding="utf-8")
    code = ("import sys\nsys.modules['symbolic'] = None\nfrom pipeline.cli import main\n"
            f"sys.exit(main(['--config', {str(config)!r}, 'symbolize', '--run', {str(run)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PDBs give function names from their public symbols only" in proc.stderr
    manifest = json.loads((run / "symbolized" / "_manifest.json").read_text(encoding="utf-8"))
    assert manifest["symbolic_missing"] and manifest["resolved_frames"] > 0
    alone = read_table(run, "symbolized", "frames").to_pylist()
    key = lambda r: (r["pid"], r["address"])      # noqa: E731
    assert sorted(alone, key=key) == sorted(frames, key=key)
