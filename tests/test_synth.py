"""Synthesizer behaviour: determinism, the ground truth's internal consistency, symbols, CLI, demo job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import SynthConfig

ROOT = Path(__file__).resolve().parents[1]


def _files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("cfg", [SynthConfig(seed=9, size="2MB", cpus=3),
                                 SynthConfig(seed=9, size="2MB", cpus=3, compress=True, pointer_size=4,
                                             stack_caching=True)])
def test_same_seed_same_bytes(tmp_path, cfg):
    from pipeline import synth

    synth.run(tmp_path / "a" / "t.etl", cfg)
    synth.run(tmp_path / "b" / "t.etl", cfg)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.keys() == b.keys() and {"t.etl", "t.truth.json"} <= a.keys()
    assert a == b
    synth.run(tmp_path / "c" / "t.etl", cfg.model_copy(update={"seed": 10}))
    assert (tmp_path / "c" / "t.etl").read_bytes() != a["t.etl"]


def test_truth_is_consistent(synth_trace):
    t = synth_trace.truth
    s = t["samples"]
    assert s["total"] == sum(q["samples"] for q in s["per_process"]) + s["idle"]
    assert s["total"] == sum(s["per_stack"].values()) == t["event_counts"]["PerfInfo.SampledProfile"]
    assert sum(v["self"] for v in s["per_function"].values()) == s["total"]
    assert sum(v["self"] for v in s["per_module"].values()) == s["total"]
    assert all(v["inclusive"] >= v["self"] for v in s["per_function"].values())
    # the bootstrap's shape: rustc dominates, both mangling schemes are sampled, codegen commits most
    busy = s["total"] - s["idle"]
    assert s["per_crate"]["rustc_driver_impl"]["inclusive"] > 0.4 * busy > s["per_crate"]["cargo"]["inclusive"]
    names = [k.split("!", 1)[1] for k in s["per_function"]]
    assert any(n.startswith("_ZN") for n in names) and any(n.startswith("_R") for n in names)
    commit = t["commit"]["per_stack"]
    top = max(commit, key=lambda k: commit[k]["commit_bytes"])
    assert any("llvm::" in f for f in t["stacks"][top]["functions"])
    assert t["heap"]["events"]["alloc"] > t["heap"]["events"]["free"] > 0
    assert all(sn["tracked_bytes"] == sum(v["bytes"] for v in sn["per_stack"].values())
               for sn in t["heap"]["snapshots"])
    kinds = {q["kind"] for q in t["processes"]}
    assert {"python", "cargo", "rustc", "link", "build"} <= kinds
    size = synth_trace.path.stat().st_size
    assert t["trace"]["bytes"] == size
    if not synth_trace.cfg.compress:
        target = 3_000_000 if synth_trace.cfg.size.text == "3MB" else 2_000_000
        assert 0.5 * target < size < 2.5 * target


def test_symbol_files_cover_every_frame(synth_trace):
    """Every sampled frame falls inside a FUNC record of its image's .sym file."""
    t = synth_trace.truth
    root = synth_trace.path.parent / "symbols"
    funcs = {}
    for index, im in enumerate(t["images"]):
        sym = root / im["pdb_name"] / im["debug_id"] / (im["pdb_name"].rsplit(".", 1)[0] + ".sym")
        lines = sym.read_text().splitlines()
        assert lines[0] == f"MODULE windows {'x86_64' if synth_trace.cfg.pointer_size == 8 else 'x86'} " \
                           f"{im['debug_id']} {im['pdb_name']}"
        base = int(im["base"], 16)
        for line in lines:
            if line.startswith("FUNC "):
                _, rva, size, _, name = line.split(" ", 4)
                funcs[(index, name)] = (base + int(rva, 16), int(size, 16))
    for st in t["stacks"].values():
        for addr, fn, index in zip(st["frames"], st["functions"], st["images"]):
            start, size = funcs[(index, fn.split("!", 1)[1])]
            assert start <= int(addr, 16) < start + size


def test_cli_overrides_config(tmp_path):
    out = tmp_path / "cli.etl"
    r = subprocess.run([sys.executable, "-c", "from pipeline.cli import main; raise SystemExit(main())",
                        "synth", "--out", str(out), "--seed", "2", "--size", "1MB", "--cpus", "2",
                        "--compress", "--pointer-size", "4", "--stack-caching", "--stack-variety", "3",
                        "--no-self-profiles"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    truth = json.loads((tmp_path / "cli.truth.json").read_text())
    assert truth["config"] == {"seed": 2, "size": "1MB", "cpus": 2, "compress": True, "pointer_size": 4,
                               "stack_caching": True, "stack_variety": 3, "self_profiles": False, "rerun": 0, "noise": 0.08,
                               "inject": []}
    assert summary["self_profiles"] is None and not (tmp_path / "selfprofile").exists()
    assert summary["bytes"] == out.stat().st_size
    bad = subprocess.run([sys.executable, "-c", "from pipeline.cli import main; raise SystemExit(main())",
                          "synth", "--out", str(out), "--cpus", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--cpus" in bad.stderr and "Traceback" not in bad.stderr


def test_demo_trace_path(tmp_path):
    """`make pipeline` without TRACE: the job runner synthesizes RUN_DIR/input/demo.etl and its symbols."""
    from pipeline import synth
    from pipeline.config import load_config

    cfg = load_config(ROOT / "configs" / "default.yaml")
    trace = tmp_path / "run" / "input" / "demo.etl"
    summary = synth.run(trace, cfg.synth)
    assert trace.exists() and (trace.parent / "demo.truth.json").exists()
    assert (trace.parent / "symbols").is_dir() and summary["symbol_files"] > 10
    assert summary["seconds"] < 30
