"""Simulated nightly histories with known answers, for the verdict's power and its false alarms
(``tests/test_verdict_power.py`` runs a small version; ``bench/bench_verdicts.py`` the full one).

A history: ``crates`` crates of log-uniform sizes (0.05-60 s), each night each crate's wall time is its size times
the machine's factor that night (log-normal, sd ``m``, shared by every crate and the build) times its own noise
(sd ``k`` times the per-night prior, ``sqrt(0.106^2 + (0.016 s / size)^2)``: the consecutive-night prior fitted to a
real history here, divided by sqrt(2)); Gaussian, or Student's t of ``tails`` degrees of freedom scaled to the same
sd. The build's wall time is the sum of its crates with its own 2 % noise; the query count is deterministic. What
changes (one crate, everything, a creep, an absence) is applied on chosen nights."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

A, B = 0.106, 0.016          # per-night noise prior: relative, and seconds


@dataclass
class Sim:
    nights: int = 30
    crates: int = 40
    k: float = 1.0              # noise, times the prior
    m: float = 0.10             # the machine's factor, sd of its log
    tails: float | None = None  # Student's t degrees of freedom; None: Gaussian


def sizes(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.exp(rng.uniform(math.log(0.05), math.log(60.0), n))


def history(rng: np.random.Generator, sim: Sim, factor=None, absent=None):
    """(sizes in s, columns of metrics). ``factor(night, sizes) -> array of multipliers`` changes crates on chosen
    nights; ``absent(night) -> crate indexes`` leaves crates out of a night."""
    size = sizes(rng, sim.crates)
    sd = sim.k * np.sqrt(A * A + (B / size) ** 2)
    cols: dict[str, list] = {"night": [], "kind": [], "key": [], "value": []}
    for night in range(sim.nights):
        machine = math.exp(rng.normal(0, sim.m))
        if sim.tails is None:
            eps = rng.normal(0, 1, sim.crates)
        else:
            eps = rng.standard_t(sim.tails, sim.crates) / math.sqrt(sim.tails / (sim.tails - 2))
        wall = size * machine * np.exp(sd * eps)
        if factor is not None:
            wall = wall * factor(night, size)
        gone = set(absent(night)) if absent is not None else set()
        for i in range(sim.crates):
            if i in gone:
                continue
            cols["night"].append(night)
            cols["kind"].append("crate_wall_ns")
            cols["key"].append(f"crate{i:02d}")
            cols["value"].append(float(wall[i] * 1e9))
        total = float(sum(wall[i] for i in range(sim.crates) if i not in gone)) * math.exp(rng.normal(0, 0.02))
        cols["night"] += [night, night]
        cols["kind"] += ["build_wall_ns", "query_count"]
        cols["key"] += ["build", "build"]
        cols["value"] += [total * 1e9, 1e6]
    return size, cols


def upto(cols: dict, night: int) -> dict:
    """The metrics of the nights up to ``night`` (the last one is judged)."""
    keep = [i for i, n in enumerate(cols["night"]) if n <= night]
    return {c: [v[i] for i in keep] for c, v in cols.items()}


def red(table) -> bool:
    return "regression" in table.column("verdict").to_pylist()


def verdict_of(table, key: str) -> str | None:
    rows = [v for k, v in zip(table.column("key").to_pylist(), table.column("verdict").to_pylist()) if k == key]
    return rows[0] if rows else None


def others_red(table, key: str) -> bool:
    return any(v == "regression" and k != key for k, v, f in zip(table.column("key").to_pylist(),
                                                                 table.column("verdict").to_pylist(),
                                                                 table.column("family").to_pylist())
               if f == "crate time")


def _one(i: int, night_factor):
    """A factor for crate ``i`` alone: ``night_factor(night)``."""
    def factor(night, s):
        f = np.ones(len(s))
        f[i] = night_factor(night)
        return f
    return factor


def scenarios(rng: np.random.Generator, histories: int, judge, sim: Sim | None = None,
              noise_nights: int = 10) -> dict[str, float]:
    """The share of histories (or, for noise, of nights) in which each target event happened; ``judge(cols)`` gives
    the table of :func:`pipeline.warehouse.history.judge_history`."""
    sim = sim or Sim()
    last = sim.nights - 1
    out: dict[str, list[float]] = {k: [] for k in ("noise_red", "noise_red_2k", "noise_red_t3", "one_2x_red",
                                                      "one_2x_alone", "lasting_1_5x_red_by_2nd", "absent_back_red",
                                                      "everything_2x_red_by_2nd", "creep_flagged")}
    for _ in range(histories):
        for name, s in (("noise_red", sim), ("noise_red_2k", Sim(sim.nights, sim.crates, 2 * sim.k, sim.m)),
                        ("noise_red_t3", Sim(sim.nights, sim.crates, sim.k, sim.m, tails=3))):
            _, cols = history(rng, s)
            for night in range(last - noise_nights + 1, last + 1):
                out[name].append(float(red(judge(upto(cols, night)))))
        seed = int(rng.integers(1 << 31))

        def run(offset, pick_size=None, near=None, **kw):
            size = sizes(np.random.default_rng(seed + offset), sim.crates)
            if near is not None:
                i = int(np.argmin(np.abs(np.log(size / near))))
            else:
                big = np.flatnonzero(size >= pick_size)
                i = int(np.random.default_rng(seed + offset).choice(big)) if len(big) else int(np.argmax(size))
            factor = kw.pop("factor", None)
            _, cols = history(np.random.default_rng(seed + offset), sim,
                              factor=factor(i) if factor else None, **kw)
            return i, cols

        start = last - 1
        i, cols = run(0, 0.5, factor=lambda i: _one(i, lambda n: 2.0 if n == last else 1.0))
        t = judge(cols)
        out["one_2x_red"].append(float(verdict_of(t, f"crate{i:02d}") == "regression"))
        out["one_2x_alone"].append(float(not others_red(t, f"crate{i:02d}")))
        i, cols = run(1, 1.0, factor=lambda i: _one(i, lambda n: 1.5 if n >= start else 1.0))
        out["lasting_1_5x_red_by_2nd"].append(float(any(
            verdict_of(judge(upto(cols, n)), f"crate{i:02d}") == "regression" for n in (start, start + 1))))
        gone = int(np.random.default_rng(seed).integers(sim.crates))
        _, cols = history(np.random.default_rng(seed + 2), sim, absent=lambda n: [gone] if n == last - 1 else [])
        out["absent_back_red"].append(float(verdict_of(judge(cols), f"crate{gone:02d}") == "regression"))
        _, cols = history(np.random.default_rng(seed + 3), sim,
                          factor=lambda n, s: np.full(len(s), 2.0 if n >= start else 1.0))
        out["everything_2x_red_by_2nd"].append(float(any(red(judge(upto(cols, n))) for n in (start, start + 1))))
        creep_from = sim.nights - 20
        i, cols = run(4, near=5.0, factor=lambda i: _one(i, lambda n: 1.03 ** max(0, n - creep_from + 1)))
        out["creep_flagged"].append(float(verdict_of(judge(cols), f"crate{i:02d}") in ("regression", "suspect")))
    return {k: float(np.mean(v)) if v else math.nan for k, v in out.items()}
