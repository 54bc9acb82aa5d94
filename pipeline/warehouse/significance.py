"""When a difference between a run and its baseline counts as real: defined here, once.

A metric (``run_metrics``: kind, key, value) of a run is compared with the same metric of its baseline, the
previous run of the same job and workload. Every metric has a *test*, named by what its values are:

``count``  CPU samples of a function, crate or the build. Sampling makes them Poisson counts: the difference
           of two independent counts ``v`` and ``b`` has variance ``v + b``, so ``z = (v - b) / sqrt(v + b)``.
``share``  a function's samples as a share of the build's CPU samples (``v/n`` against ``b/m``): a build that
           is 3% longer overall moves every large function's samples by 3% but not its share. Two-proportion
           test, ``z = (p1 - p0) / sqrt(p (1 - p) (1/n + 1/m))`` with the pooled ``p``.
``time``, ``bytes``, ``number``  measured (wall times, self-profile times, bytes committed, query
           invocations): no counting error, only run-to-run noise.

**Noise from history.** Two runs of the same build differ by more than sampling error (machine load,
scheduling, the OS). So, as rustc-perf does, each metric gets its own threshold from its past: the relative
changes ``|v - b| / b`` of the last ``HISTORY_RUNS`` consecutive pairs of runs of the job and workload before
this one, and ``threshold = Q3 + IQR_FACTOR * IQR`` of them (the upper outer fence of Tukey: an outlier
among the changes the metric usually shows), never below ``MIN_RELATIVE[test]``. A metric with fewer than
``MIN_HISTORY`` past changes gets the fixed ``FIXED_RELATIVE[test]`` instead and is marked *needs more runs*.

A change is **significant** when its relative change exceeds that threshold, and, for ``count`` and ``share``,
``|z| >= SAMPLE_Z``, and for measured tests the absolute change is at least ``MIN_ABSOLUTE[test]`` (a crate
whose 40 ms grew by 5 ms is not worth a look in a bootstrap build). One comparison tests thousands of sample
metrics at once (every function, self and inclusive, as samples and as a share): at 3 sigma, sampling alone
would flag a few of them every night. ``SAMPLE_Z`` = 4.5 keeps the chance of any false alarm in a comparison
of 10,000 sample metrics near 5% (Bonferroni: the two-sided 0.05 / 10,000 quantile is 4.56).
A metric that is new (baseline 0) is significant when its value is at least ``NEW_FLOOR[test]``.
Its **verdict** is ``regression`` (significant, value went up: every metric here is worse when larger),
``improvement`` (significant, down) or ``noise``; its **confidence** is ``history`` or ``fixed``.
"""

from __future__ import annotations

#: |z| at or above which a sample-count or share difference can be significant (two-sided; see the module doc).
SAMPLE_Z = 4.5
#: Past changes a metric needs before its own threshold is used; consecutive run pairs looked at.
MIN_HISTORY = 10
HISTORY_RUNS = 30
#: Tukey's outer fence: Q3 + IQR_FACTOR x IQR of the past relative changes.
IQR_FACTOR = 3.0
#: Relative thresholds without enough history, and the lowest a history may bring them to.
FIXED_RELATIVE = {"count": 0.05, "share": 0.05, "time": 0.10, "bytes": 0.10, "number": 0.10}
MIN_RELATIVE = {"count": 0.01, "share": 0.01, "time": 0.02, "bytes": 0.02, "number": 0.01}
#: Smallest absolute change of a measured metric that is reported: 10 ms, 1 MiB, 10 invocations.
MIN_ABSOLUTE = {"time": 10_000_000, "bytes": 1 << 20, "number": 10}
#: A metric absent from the baseline is significant from this value on (samples: sqrt(v) >= SAMPLE_Z).
NEW_FLOOR = {"count": SAMPLE_Z ** 2, "share": 0.001, "time": 50_000_000, "bytes": 16 << 20, "number": 100}

TESTS = tuple(FIXED_RELATIVE)


def _case(mapping: dict, test: str) -> str:
    return "CASE " + " ".join(f"WHEN {test} = '{t}' THEN {v}" for t, v in mapping.items()) + " END"


def z_sql(test: str, v: str, b: str, n: str, m: str) -> str:
    """SQL: the z-score of a change of a count (``v`` against ``b``) or a share (``v`` of ``n`` against ``b`` of
    ``m``); NULL for measured tests."""
    p = f"(({v}) * ({n}) + ({b}) * ({m})) / nullif(({n}) + ({m}), 0)"
    share = (f"(({v}) - ({b})) / nullif(sqrt({p} * (1 - {p}) * (1.0 / nullif({n}, 0) + 1.0 / nullif({m}, 0))), 0)")
    return (f"CASE {test} WHEN 'count' THEN (({v}) - ({b})) / sqrt(greatest(({v}) + ({b}), 1)) "
            f"WHEN 'share' THEN {share} END")


def threshold_sql(test: str, history: str, q1: str, q3: str) -> str:
    """SQL: the relative threshold of a metric with ``history`` past changes whose quartiles are ``q1``, ``q3``."""
    fence = f"greatest(({q3}) + {IQR_FACTOR} * (({q3}) - ({q1})), {_case(MIN_RELATIVE, test)})"
    return f"(CASE WHEN {history} >= {MIN_HISTORY} THEN {fence} ELSE {_case(FIXED_RELATIVE, test)} END)::DOUBLE"


def significant_sql(test: str, v: str, b: str, z: str, threshold: str) -> str:
    """SQL boolean: is the change from ``b`` to ``v`` significant (see the module doc)?"""
    statistic = (f"CASE WHEN {test} IN ('count', 'share') THEN abs(coalesce({z}, 0)) >= {SAMPLE_Z} "
                 f"ELSE abs(({v}) - ({b})) >= {_case(MIN_ABSOLUTE, test)} END")
    relative = (f"CASE WHEN ({b}) = 0 THEN ({v}) >= {_case(NEW_FLOOR, test)} "
                f"ELSE abs(({v}) - ({b})) / abs({b}) > {threshold} END")
    return f"(({statistic}) AND ({relative}))"
