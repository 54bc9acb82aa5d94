"""Synthesized traces with their Breakpad symbol files: every frame resolves to the ground-truth name.

The synthesizer writes ``<trace>.truth.json`` (stack templates: frames leaf first and the function of
each frame as ``module!name``) and one Breakpad ``.sym`` per image under ``symbols/``. Here the
decoded tables are built from the truth file (one process per stack template that loads the user
images of that stack, kernel images under pid 0: the synthetic system loads different rustc_driver
builds at one base in different processes), so this test checks symbolization alone; the decoder's
own golden tests check that the ETL decodes to the same tables.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from pipeline.config import SynthConfig
from pipeline.runs import read_manifest, read_table
from pipeline.symbolize import run
from pipeline.symbolize.names import clean_name
from tests.test_symbolize_stage import config_for, write_decoded

PID = 4242


@pytest.fixture(scope="module", params=[8, 4], ids=["x64", "x86"])
def synthesized(request, tmp_path_factory):
    from pipeline import synth

    out = tmp_path_factory.mktemp(f"synth{request.param}") / "demo.etl"
    synth.run(out, SynthConfig(size="2MB", pointer_size=request.param, seed=3))
    return out, json.loads(out.with_name("demo.truth.json").read_text())


def decoded_from_truth(trace: Path, truth: dict):
    """samples, stacks, images and image_ids rows equivalent to the synthesized trace."""
    images, ids, samples, stacks = [], [], [], {}

    @functools.cache
    def funcs_of(pdb_name: str, debug_id: str) -> list[tuple[int, int, str]]:
        """(start, end, name) of every FUNC record of an image's .sym file, read as text."""
        sym = trace.parent / "symbols" / pdb_name / debug_id / f"{pdb_name.rsplit('.', 1)[0]}.sym"
        out = []
        for line in sym.read_text().splitlines():
            if line.startswith("FUNC "):
                _, rva, size, _, name = line.split(" ", 4)
                out.append((int(rva, 16), int(rva, 16) + int(size, 16), name))
        return out

    def has(im, rva, fn) -> bool:
        return any(a <= rva < b and n == fn for a, b, n in funcs_of(im["pdb_name"], im["debug_id"]))

    def image_of(name: str, frames: list[tuple[str, int]]) -> dict:
        """The image called ``name`` whose .sym puts each (function, address) of one stack where the
        truth says (several builds of one file name load at one base in different processes)."""
        fits = [im for im in truth["images"] if im["name"] == name
                and all(has(im, address - int(im["base"], 16), fn) for fn, address in frames)]
        assert fits, (name, frames)
        return fits[0]

    def load(pid, im):
        images.append(dict(pid=pid, base=int(im["base"], 16), size=im["size"], file_name=im["path"], load_ns=0,
                           time_date_stamp=im["timedatestamp"]))
        ids.append(dict(pid=pid, base=int(im["base"], 16), guid=im["pdb_guid"], age=im["pdb_age"],
                        pdb_name=im["pdb_name"]))

    for im in truth["images"]:
        if im["kernel"]:
            load(0, im)
    for t, s in truth["stacks"].items():
        pid = PID + int(t)
        per_module: dict[str, list[tuple[str, int]]] = {}
        for address, key in zip(s["frames"], s["functions"]):
            module, fn = key.split("!", 1)
            per_module.setdefault(module, []).append((fn, int(address, 16)))
        for module, frames in sorted(per_module.items()):
            im = image_of(module, frames)
            if not im["kernel"]:
                load(pid, im)
        stacks[int(t)] = [int(a, 16) for a in s["frames"]]
        samples.append((1000 + int(t), pid, stacks[int(t)][0], int(t)))
    return samples, stacks, images, ids


def test_every_frame_resolves_to_the_ground_truth_name(synthesized, tmp_path, dask_pool):
    trace, truth = synthesized
    samples, stacks, images, ids = decoded_from_truth(trace, truth)
    run_dir = tmp_path / "run"
    write_decoded(run_dir, samples, stacks, images, ids)
    run(run_dir, config_for(tmp_path, str(trace.parent / "symbols")), dask_pool)

    rows = read_table(run_dir, "symbolized", "frames").to_pylist()
    by_address = {(r["pid"], r["address"]): r for r in rows if r["inline_depth"] == 0}
    checked = 0
    for t, s in truth["stacks"].items():
        for address, key in zip(s["frames"], s["functions"]):
            module, name = key.split("!", 1)
            row = by_address[(PID + int(t), int(address, 16))]
            assert row["resolved"], (t, address, key)
            assert (row["module"], row["raw_name"]) == (module, name), (t, address)
            assert row["function"] == clean_name(name)
            checked += 1
    assert checked > 100
    m = read_manifest(run_dir, "symbolized")
    assert m["resolution_rate"] == 1.0 and m["images_without_symbols"] == []
    assert {d["kind"] for d in m["debug_ids"]} == {"breakpad"}
    # Rust names came mangled from the .sym files and are shown demangled, hash kept in raw_name
    rust = [r for r in rows if r["raw_name"] and r["raw_name"].startswith("_ZN")]
    assert rust and all("::" in r["function"] and "17h" not in r["function"] for r in rust)


def test_decoded_synth_trace_resolves_every_frame(synthesized, tmp_path, dask_pool):
    """The same check through the real decoder: synth .etl -> decode -> symbolize."""
    from pipeline import decode
    from pipeline.config import Config

    trace, truth = synthesized
    run_dir = tmp_path / "run"
    cfg = Config()
    cfg.symbolize.symbol_path = str(trace.parent / "symbols")
    cfg.symbolize.cache_dir = tmp_path / "cache"
    decode.run(run_dir, cfg, dask_pool, inputs=[trace])
    run(run_dir, cfg, dask_pool)
    m = read_manifest(run_dir, "symbolized")
    assert m["images_without_symbols"] == []
    assert m["resolution_rate"] == 1.0, m["modules"]

    rows: dict[tuple[int, int], list[dict]] = {}
    for r in read_table(run_dir, "symbolized", "frames").to_pylist():
        if r["inline_depth"] == 0:
            rows.setdefault((r["pid"], r["address"]), []).append(r)

    def name_at(pid: int, address: int, t: int) -> str:
        """The row of (pid, address) whose image was loaded at time t (pids are reused)."""
        live = [r for r in rows[(pid, address)] if (r["image_load_ns"] or -1) <= t]
        r = max(live, key=lambda r: r["image_load_ns"] or -1)
        return f"{r['module']}!{r['raw_name']}"

    template = {tuple(int(a, 16) for a in s["frames"]): s["functions"] for s in truth["stacks"].values()}
    samples = read_table(run_dir, "decoded", "samples", columns=["pid", "stack_id", "timestamp_ns"]).to_pylist()
    stacks = {r["stack_id"]: r["frames"] for r in read_table(run_dir, "decoded", "stacks").to_pylist()}
    checked = 0
    for s in samples:
        frames = tuple(stacks.get(s["stack_id"]) or ())
        if frames not in template:
            continue
        got = [name_at(s["pid"], a, s["timestamp_ns"]) for a in frames]
        assert got == template[frames], (s, frames)
        checked += 1
    assert checked > 0.9 * len(samples)
