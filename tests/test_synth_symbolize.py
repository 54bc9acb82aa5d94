"""The synthesizer's Breakpad symbol files through the real decode and symbolize stages: every sampled
frame resolves, and samples per function (module + symbol; self and inclusive) equal the ground truth."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict

import pytest


@pytest.mark.parametrize("variant", ["plain64", "xpress32_cached"])
def test_samples_per_function_after_symbolize(variant, synth_traces, synth_decoded, dask_pool, tmp_path):
    import shutil

    from pipeline import symbolize
    from pipeline.config import Config
    from pipeline.runs import read_table

    s = synth_traces[variant]
    run = tmp_path / "run"         # (a copy: the shared decode stays as it was made)
    shutil.copytree(synth_decoded[variant]["run"] / "decoded", run / "decoded")
    cfg = Config()
    cfg.symbolize.symbol_path = str(s.path.parent / "symbols")
    cfg.symbolize.cache_dir = run / "symcache"
    summary = symbolize.run(run, cfg, dask_pool)
    assert summary["resolution_rate"] == 1.0
    frames = defaultdict(list)            # (address, pid) -> [(load_ns, unload_ns, module!symbol)]
    for r in read_table(run, "symbolized", "frames").to_pylist():
        if r["inline_depth"] == 0:
            frames[(r["address"], r["pid"])].append(
                (r["image_load_ns"] or -1, r["image_unload_ns"] or 1 << 62, f"{r['module']}!{r['raw_name']}"))
    for v in frames.values():
        v.sort()

    def name(addr, pid, ts):
        cands = frames.get((addr, pid)) or frames[(addr, 0)]      # kernel frames are mapped in pid 0
        i = bisect.bisect_right([c[0] for c in cands], ts) - 1
        assert i >= 0 and ts < cands[i][1]
        return cands[i][2]

    stacks = {r["stack_id"]: r["frames"] for r in synth_decoded[variant]["tables"]["stacks"]}
    fself, fincl = Counter(), Counter()
    for smp in synth_decoded[variant]["tables"]["samples"]:
        names = [name(a, smp["pid"], smp["timestamp_ns"]) for a in stacks[smp["stack_id"]]]
        fself[names[0]] += 1
        fincl.update(set(names))
    truth = s.truth["samples"]["per_function"]
    assert dict(fself) == {k: v["self"] for k, v in truth.items() if v["self"]}
    assert dict(fincl) == {k: v["inclusive"] for k, v in truth.items()}
