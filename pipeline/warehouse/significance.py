"""When a difference between a run and its baseline counts as real: defined here, once.

Every metric of the warehouse has one of three *tests*, named by what its values are:

``count`` (CPU samples). A sample count of a function, crate or program is a Poisson count: at a
fixed sampling rate the number of samples that land in it has variance equal to its mean. The
difference of two independent Poisson counts ``v`` (run) and ``b`` (baseline) has variance
``v + b``, so ``z = (v - b) / sqrt(v + b)``. A change is significant when ``|z| >= SAMPLE_Z``
(3 sigma: about 1 false alarm in 370 comparisons of unchanged code) *and* the relative change is at
least ``SAMPLE_MIN_RELATIVE`` (a 1% change of a huge count is real but not worth a look).

``time`` (self-profile nanoseconds) and ``bytes`` (memory). These are measured, not sampled: no
counting error, but run-to-run noise that we cannot model from one run. A change is significant
when it is at least ``RELATIVE_THRESHOLD`` of the baseline *and* at least the absolute floor of its
unit (``MIN_TIME_NS``, ``MIN_BYTES``), so tiny items that double from 3 µs to 6 µs stay quiet.

A metric missing from one run counts as 0 there (a new function, a crate no longer built).
"""

from __future__ import annotations

#: |z| at or above which a sample-count difference is significant (two-sided, Poisson counts).
SAMPLE_Z = 3.0
#: Smallest relative change of a sample count that is reported, even when |z| is large.
SAMPLE_MIN_RELATIVE = 0.05
#: Smallest relative change of a time or a byte count that is reported.
RELATIVE_THRESHOLD = 0.10
#: Smallest absolute change of a time (1 ms) / of a byte count (1 MiB) that is reported.
MIN_TIME_NS = 1_000_000
MIN_BYTES = 1 << 20


def significant_sql(test: str, value: str, base: str) -> str:
    """SQL boolean: is the change from ``base`` to ``value`` significant under ``test``?"""
    diff = f"abs(({value}) - ({base}))"
    relative = f"({diff} >= {{rel}} * abs({base}))"
    if test == "count":
        z = f"({diff} / sqrt(greatest(({value}) + ({base}), 1)))"
        return f"({z} >= {SAMPLE_Z} AND {relative.format(rel=SAMPLE_MIN_RELATIVE)})"
    floor = {"time": MIN_TIME_NS, "bytes": MIN_BYTES}[test]
    return f"({relative.format(rel=RELATIVE_THRESHOLD)} AND {diff} >= {floor})"


def z_sql(test: str, value: str, base: str) -> str:
    """SQL: the z-score of a count change (NULL for measured tests)."""
    if test != "count":
        return "NULL::DOUBLE"
    return f"(({value}) - ({base})) / sqrt(greatest(({value}) + ({base}), 1))"
