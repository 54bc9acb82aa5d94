"""The verdict rule (:mod:`pipeline.warehouse.significance`) on small arrays whose answers are worked out by hand:
the noise is the weighted mean of the prior, the pooled and the own variances; the other items' median change is
taken out; floors, evidence and the two z levels decide the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.warehouse import significance as sig
from pipeline.warehouse.significance import judge_kind

MS = 1e6


def crates(values: list[list[float]]) -> np.ndarray:
    return np.array(values, dtype=float)


def test_the_noise_is_the_weighted_mean_of_prior_pooled_and_own_variances():
    # two crates of 1 s, a third of 100 ms (another size band: not pooled with them); three past runs
    history = crates([[1000, 1100, 1000], [1000, 1000, 1100], [100, 100, 100]]) * MS
    base = history[:, -1]
    value = base * np.array([1.0, 1.0, 1.0])
    j = judge_kind("crate_wall_ns", history, base, value)
    # crate 0's past changes less the median of the two others' (the reference of three items)
    steps = np.log(history[:, 1:] / history[:, :-1])
    ref = np.array([[np.median(steps[[1, 2], k]) for k in range(2)], [np.median(steps[[0, 2], k]) for k in range(2)]])
    e0 = steps[0] - ref[0]
    own = np.median(e0 ** 2) / 0.454936
    e1 = steps[1] - ref[1]
    pooled = np.median(e1 ** 2) / 0.454936                  # (crate 1's changes: crate 0 does not pool itself)
    a, b = sig.PRIOR[("crate time", "time")]
    prior = a * a + (b / base[0]) ** 2
    want = (sig.PRIOR_WEIGHT * prior + 2 * pooled + 2 * own) / (sig.PRIOR_WEIGHT + 2 + 2)
    assert j.history[0] == 2 and j.pooled[0] == 2
    assert j.noise[0] == pytest.approx(math.sqrt(want))
    assert j.z[0] == 0 and j.verdict[0] == "noise"


def test_a_change_is_judged_against_the_other_items():
    history = crates([[1000, 1000, 1000, 1000]] * 4) * MS * np.array([[1.0], [0.8], [0.6], [1.2]])
    base = history[:, -1]
    # the machine was 30 % slower for everyone: no change; then one crate +60 % on a night the others were +30 %
    j = judge_kind("crate_wall_ns", history, base, base * 1.3)
    assert list(j.verdict) == ["noise"] * 4 and np.allclose(j.e, 0)
    j = judge_kind("crate_wall_ns", history, base, base * np.array([1.6, 1.3, 1.3, 1.3]))
    assert j.reference[0] == pytest.approx(math.log(1.3)) and j.e[0] == pytest.approx(math.log(1.6 / 1.3))
    # a build total has no reference: it is its own only item
    j = judge_kind("build_wall_ns", history[:1], base[:1], base[:1] * 1.3)
    assert j.reference[0] == 0 and j.e[0] == pytest.approx(math.log(1.3))


def test_z_levels_evidence_and_floors_decide_the_verdict():
    steady = crates([[1000] * 8, [1000] * 8, [1000] * 8]) * MS
    steady[:, ::2] *= 1.05                                  # past changes of ±5 %
    base = steady[:, -1]
    j = judge_kind("crate_wall_ns", steady, base, base * np.array([2.0, 1.0, 1.0]))
    assert j.verdict[0] == "regression" and j.z[0] >= sig.Z_CONFIDENT
    # z between the two levels: suspect
    noise = j.noise[0]
    between = math.exp((sig.Z_SUSPECT + sig.Z_CONFIDENT) / 2 * noise)
    j = judge_kind("crate_wall_ns", steady, base, base * np.array([between, 1.0, 1.0]))
    assert j.verdict[0] == "suspect"
    # the same doubling with no history at all (the second night): the prior only, never confident
    j = judge_kind("crate_wall_ns", steady[:, -1:], base, base * np.array([3.0, 1.0, 1.0]))
    assert j.history[0] == 0 and j.pooled[0] == 0 and j.z[0] > sig.Z_CONFIDENT and j.verdict[0] == "suspect"
    # one past change of its own and two pooled: exactly MIN_EVIDENCE, enough (the third night)
    j = judge_kind("crate_wall_ns", steady[:, -2:], base, base * np.array([3.0, 1.0, 1.0]))
    assert j.history[0] + j.pooled[0] == sig.MIN_EVIDENCE and j.verdict[0] == "regression"
    assert sig.confidence(int(j.history[0]), float(j.pooled[0])) == "pooled"
    assert [sig.confidence(h, 0) for h in (2, 3)] == ["prior", "history"]     # (mutation: ``>=`` as ``>``)
    # z is the change against the others over the noise (pinned here, not only by an integration test)
    assert j.z[0] == pytest.approx(j.e[0] / j.noise[0]) and j.e[0] == pytest.approx(math.log(3.0))
    # floors: a tiny crate that doubled by 30 ms is below the absolute floor
    small = steady / 1000 * 30
    j = judge_kind("crate_wall_ns", small, small[:, -1], small[:, -1] * np.array([2.0, 1.0, 1.0]))
    assert j.verdict[0] == "noise"


def test_deterministic_counts_change_for_real_unless_their_history_moves():
    same = crates([[278] * 5, [3002] * 5, [16] * 5])
    j = judge_kind("query_count", same, same[:, -1], np.array([422.0, 3002, 16]))
    assert j.verdict[0] == "regression" and math.isinf(j.z[0]) and list(j.verdict[1:]) == ["noise", "noise"]
    moving = same.copy()
    moving[0] = [278, 300, 260, 290, 278]
    j = judge_kind("query_count", moving, moving[:, -1], np.array([290.0, 3002, 16]))
    assert j.verdict[0] == "noise" and np.isfinite(j.z[0])


def test_sample_counts_carry_their_poisson_variance():
    history = crates([[100] * 6, [100] * 6, [100] * 6])
    j = judge_kind("cpu_crate", history, history[:, -1], np.array([200.0, 100, 100]))
    # no run-to-run change at all in the history: what is left is the prior's share and the counting error
    a, b = sig.PRIOR[("crate time", "count")]
    prior = a * a + (b / 100) ** 2
    var = sig.PRIOR_WEIGHT * prior / (sig.PRIOR_WEIGHT + 5 + 10) + 1 / 100 + 1 / 200
    assert j.noise[0] == pytest.approx(math.sqrt(var))


def test_new_and_gone_items():
    history = crates([[0, 0, 0], [1000, 1000, 1000], [900, 900, 900], [800, 800, 800]]) * MS
    base = history[:, -1]
    j = judge_kind("crate_wall_ns", history, base, np.array([60 * MS, 1000 * MS, 900 * MS, 0]))
    assert j.verdict[0] == "regression" and j.verdict[3] == "improvement"
    j = judge_kind("crate_wall_ns", history, base, np.array([40 * MS, 1000 * MS, 900 * MS, 800 * MS]))
    assert j.verdict[0] == "noise"                        # new, but below NEW_FLOOR
