"""The nightly verdict's power and false alarms on simulated histories (``tests/helpers/histories.py``): 40 crates of
0.05-60 s (log-uniform), noise k times the calibrated per-night prior, a shared machine factor of sd m = 10 %, 30
nights; ``--histories`` a condition (default 100).

Each condition under ``judge_history`` (the verdict now: a multi-night baseline, lasting changes, drift, tails) and
under the pairwise verdict it replaced (each night against the one before, ``significance.judge_kind``), with the
targets of issue 54. Noise-only nights are counted from the 16th night on (``--noise-nights``, default 14: those
whose 14-night window is full); earlier nights, judged on less history, are less quiet (see ``bench/HISTORY.md``).
Prints a table; writes ``bench/out/verdicts.json``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

#: condition -> (target, whether the rate must be at most it (True) or at least it)
TARGETS = {"noise_red": (0.01, True), "noise_red_2k": (0.02, True), "noise_red_t3": (0.02, True),
           "one_2x_red": (0.90, False), "one_2x_alone": (0.95, False), "lasting_1_5x_red_by_2nd": (0.80, False),
           "absent_back_red": (0.02, True), "everything_2x_red_by_2nd": (0.90, False), "creep_flagged": (0.80, False)}


def pairwise(cols) -> "object":
    """The verdict before: the last night against the one before, the noise from the nights before it
    (``significance.judge_kind``), in ``judge_history``'s table."""
    import pyarrow as pa

    from pipeline.warehouse.significance import KINDS, judge_kind

    night = np.asarray(cols["night"])
    last = int(night.max())
    out = {"family": [], "key": [], "verdict": [], "change": [], "z": [], "kind": []}
    for kind in ("crate_wall_ns", "build_wall_ns"):
        rows = [i for i, k in enumerate(cols["kind"]) if k == kind]
        keys = sorted({cols["key"][i] for i in rows})
        index = {k: i for i, k in enumerate(keys)}
        x = np.full((len(keys), last + 1), np.nan)
        for i in rows:
            x[index[cols["key"][i]], cols["night"][i]] = cols["value"][i]
        if last < 1:
            continue
        j = judge_kind(kind, x[:, :last], np.nan_to_num(x[:, last - 1]), np.nan_to_num(x[:, last]))
        for i, key in enumerate(keys):
            out["family"].append(KINDS[kind].family)
            out["key"].append(key)
            out["verdict"].append(str(j.verdict[i]))
            out["change"].append(float(np.expm1(j.e[i])) if np.isfinite(j.e[i]) else None)
            out["z"].append(float(j.z[i]) if np.isfinite(j.z[i]) else None)
            out["kind"].append(kind)
    return pa.table(out)


def main() -> int:
    from pipeline.warehouse.history import judge_history
    from tests.helpers.histories import scenarios

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--histories", type=int, default=100)
    p.add_argument("--only-now", action="store_true", help="judge_history alone (not the pairwise verdict before)")
    p.add_argument("--seed", type=int, default=54)
    p.add_argument("--noise-nights", type=int, default=14, help="the last N nights of each noise-only history judged")
    args = p.parse_args()
    results: dict = {"noise_nights": args.noise_nights}
    for name, judge in (("judge_history", judge_history), ("pairwise (before)", pairwise))[: 1 if args.only_now else 2]:
        t0 = time.perf_counter()
        results[name] = scenarios(np.random.default_rng(args.seed), args.histories, judge, noise_nights=args.noise_nights)
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"{'condition':28} {'target':>8} {'before':>8} {'now':>8}  met")
    for cond, (target, at_most) in TARGETS.items():
        now, before = results["judge_history"][cond], results.get("pairwise (before)", {}).get(cond, float("nan"))
        met = now <= target if at_most else now >= target
        print(f"{cond:28} {('<= ' if at_most else '>= ') + f'{target:.0%}':>8} {before:8.1%} {now:8.1%}  "
              f"{'yes' if met else 'NO'}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "verdicts.json").write_text(json.dumps({"histories": args.histories, "seed": args.seed,
                                                   "targets": TARGETS, "results": results}, indent=1),
                                       encoding="utf-8")
    print(f"wrote {OUT / 'verdicts.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
