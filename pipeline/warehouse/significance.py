"""When a difference between a run and its baseline counts as real: defined here, once.

A run's metrics (``run_metrics``: kind, key, value) are compared with its baseline's, the previous run of the same
job and workload. The rule is built for real run-to-run noise, which on a busy build machine is large (a crate's
compile time moves by 10-30 % between two builds of the same source) and grows as an item shrinks.

**Change.** Each metric's change is its log ratio ``r = ln(value / baseline)``. What moves every item of a kind
together (the machine's speed that night) is taken out: a crate is judged against the *other* crates, a query
against the other queries, a function's samples against the other functions (the median of their log ratios,
``reference``), never against a total that holds itself. Build totals have no reference; shares are already
relative to the build. What is left is the metric's own change, ``e = r - reference``.

**Noise, estimated.** ``e`` is compared with the noise ``s`` that such a change shows when nothing changed:
a weighted mean of three variances (empirical Bayes, as limma's moderated variance), each weighted by how many
changes it rests on:

- the metric's own past changes (``e`` of the consecutive pairs of runs before this one, up to ``HISTORY_RUNS``);
- the past changes of the kind's other items of similar size (a band of ``POOL_BAND`` around its baseline) in the
  same job and workload: noise grows as an item shrinks, and pooling gives a usable estimate from the third night;
  weight at most ``POOL_WEIGHT``;
- a prior for the kind (``PRIOR``: ``sqrt(a^2 + (b / size)^2)``, a relative part and an absolute one), weight
  ``PRIOR_WEIGHT``: all there is on the second night. Its constants were fitted to real histories of rustc builds
  on a 2-core VM (``scripts/real_history.py``; ``bench/HISTORY.md``).

Spreads are robust (median of squares, so a real change in the history does not widen them). Sample counts add
their Poisson variance ``1/v + 1/b`` (shares: of the samples they are made of). Deterministic counts (query invocations: the same source gives the same
count, checked on real repeated builds) have a prior of 0: any change is real, unless their history shows they move.

**Verdict** of a metric, from ``z = e / s`` and floors on the change (relative ``FLOOR_RELATIVE`` of ``exp(e) - 1``
and absolute ``FLOOR_ABSOLUTE``):

- ``regression`` / ``improvement``: past both floors, ``|z| >= Z_CONFIDENT``, and the noise rests on at least
  ``MIN_EVIDENCE`` past changes (own or pooled);
- ``suspect``: past both floors and ``|z| >= Z_SUSPECT``, but short of the above (too close to the noise, or no
  history yet): shown, never fails a job;
- ``noise``: the rest.

A metric absent from one side is ``regression`` (new) or ``improvement`` (gone) from ``NEW_FLOOR`` on.

**One vote per change.** Correlated metrics form a *family* (a crate's wall time, self-profile time and CPU
samples); the family's verdict is that of its steadiest member (smallest noise), which ``decides``. Only
families of the build and of crates vote (``role`` ``vote``); query and function metrics explain a vote (``role``
``explain``) and never fail a job on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Kind:
    """What a metric kind is: its test (``time``, ``bytes``, ``count``, ``share``, ``number``), the family it
    belongs to, whether it votes, and what its change is judged against (``others``: the median change of the
    kind's other items; ``none``)."""

    test: str
    family: str
    role: str = "explain"
    reference: str = "others"


KINDS = {
    "build_wall_ns": Kind("time", "build time", "vote", "none"),
    "query_build_ns": Kind("time", "build time", "vote", "none"),
    "cpu_build": Kind("count", "build time", "vote", "none"),
    "peak_commit_build": Kind("bytes", "build memory", "vote", "none"),
    "commit_build": Kind("bytes", "build memory", "vote", "none"),
    "crate_wall_ns": Kind("time", "crate time", "vote"),
    "query_crate_ns": Kind("time", "crate time", "vote"),
    "cpu_crate": Kind("count", "crate time", "vote"),
    "commit_crate": Kind("bytes", "crate memory", "vote"),
    "peak_commit": Kind("bytes", "crate memory", "vote"),
    "query_self_ns": Kind("time", "query time"),
    "query_count": Kind("number", "query count", reference="none"),
    "cpu_function_self": Kind("count", "function self CPU"),
    "cpu_function_self_share": Kind("share", "function self CPU", reference="none"),
    "cpu_function_inclusive": Kind("count", "function inclusive CPU"),
    "cpu_function_inclusive_share": Kind("share", "function inclusive CPU", reference="none"),
    "commit_function": Kind("bytes", "function commit"),
}

#: Past consecutive pairs of runs looked at.
HISTORY_RUNS = 30
#: Prior noise of a kind's change (standard deviation of ``e``): ``sqrt(a^2 + (b / size)^2)`` with ``a`` relative
#: and ``b`` in the metric's unit. Times: fitted to 30 noise-only nights of a real 6-crate workspace built by rustc
#: 1.95 on a 2-core VM (``scripts/real_history.py --fit``: crates of 0.1-2 s, robust noise of ``e`` from 0.10 at 2 s
#: to 0.25 at 0.1 s; a = 0.14-0.165, b = 21-26 ms for wall and self-profile time; the build's total 0.15, where no
#: reference takes the machine's speed out). Samples are CPU time (1 kHz: 1 sample a ms); a function's samples have
#: no absolute part (their counting error is added apart, as for shares), nor have a function's bytes. Bytes: no real history
#: here (no Windows build), set as wide as the times. Query counts: 0 (they never moved in those 30 nights).
PRIOR = {
    ("build time", "time"): (0.15, 0.0), ("build time", "count"): (0.15, 0.0),
    ("build memory", "bytes"): (0.10, 0.0),
    ("crate time", "time"): (0.15, 23e6), ("crate time", "count"): (0.15, 23.0),
    ("crate memory", "bytes"): (0.10, 8 << 20),
    ("query time", "time"): (0.15, 23e6), ("query count", "number"): (0.0, 0.0),
    ("function self CPU", "count"): (0.15, 0.0), ("function inclusive CPU", "count"): (0.15, 0.0),
    ("function self CPU", "share"): (0.15, 0.0), ("function inclusive CPU", "share"): (0.15, 0.0),
    ("function commit", "bytes"): (0.10, 0.0),
}
#: How many past changes the prior is worth; the most the pooled changes of similar items are worth.
PRIOR_WEIGHT = 4.0
POOL_WEIGHT = 12.0
#: Items pooled with one another: baselines within this factor of each other (log2 bins of this width, and the
#: bins on either side).
POOL_BAND = 2.0
#: Up to this many items in a band, each item's pool leaves its own changes out (it has them as its history).
POOL_EXACT = 64
#: Past changes (own or pooled) the noise must rest on before a change can be confident.
MIN_EVIDENCE = 3
#: |z| from which a change past the floors is confident, and from which it is a suspect. Real noise has heavy
#: tails: on the real history above, the largest |z| of a noise-only night was 3.5.
Z_CONFIDENT = 4.0
Z_SUSPECT = 3.0
#: Smallest relative (of the change against the other items) and absolute change worth a verdict.
FLOOR_RELATIVE = {"count": 0.05, "share": 0.05, "time": 0.05, "bytes": 0.05, "number": 0.01}
FLOOR_ABSOLUTE = {"count": 50.0, "share": 0.0005, "time": 50e6, "bytes": float(8 << 20), "number": 10.0}
#: A metric absent from the baseline (present in the run) is a change from this value on.
NEW_FLOOR = {"count": 50.0, "share": 0.01, "time": 50e6, "bytes": float(16 << 20), "number": 100.0}
#: The median of a chi-square variable of one degree of freedom: median(e^2) / this estimates the variance.
_CHI2_MEDIAN = 0.454936


def robust_variance(e: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(variance, count) of changes ``e`` around 0 from the median of their squares (NaN: no change there)."""
    finite = np.isfinite(e)
    count = finite.sum(axis=axis)
    with np.errstate(all="ignore"):
        sq = np.where(finite, e * e, np.nan)
        var = np.full(count.shape, np.nan) if sq.size == 0 else nanmedian(sq, axis) / _CHI2_MEDIAN
    return np.where(count > 0, var, np.nan), count


def nanmedian(a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``np.nanmedian`` without its warning for an all-NaN slice (which gives NaN, as wanted)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=axis)


def log_change(base: np.ndarray, value: np.ndarray) -> np.ndarray:
    """ln(value / base) where both are positive, else NaN."""
    ok = (base > 0) & (value > 0)
    with np.errstate(all="ignore"):
        return np.where(ok, np.log(np.where(ok, value, 1.0) / np.where(ok, base, 1.0)), np.nan)


def reference(r: np.ndarray, base: np.ndarray, floor: float) -> np.ndarray:
    """For each item (row), the median of the other items' log changes ``r`` in the same column (items with a change
    and a baseline of at least ``floor``); 0 where fewer than three items have one. ``r``, ``base``: items x pairs."""
    out = np.zeros(r.shape)
    for j in range(r.shape[1]):
        use = np.isfinite(r[:, j]) & (base[:, j] >= floor)
        vals = np.sort(r[use, j])
        n = len(vals)
        if n < 3:
            continue
        # the median of the n - 1 others: positions in the sorted list without the item itself
        rank = np.searchsorted(vals, np.nan_to_num(r[:, j]))
        lo, hi = (n - 2) // 2, (n - 1) // 2
        at_lo = np.where(use & (lo >= rank), lo + 1, lo)
        at_hi = np.where(use & (hi >= rank), hi + 1, hi)
        out[:, j] = np.where(use, 0.5 * (vals[at_lo] + vals[at_hi]), 0.5 * (vals[(n - 1) // 2] + vals[n // 2]))
    return out


@dataclass
class Judged:
    """A kind's items judged: arrays over its keys."""

    reference: np.ndarray        # log change of the other items (0: none)
    e: np.ndarray                # log change less the reference
    noise: np.ndarray            # standard deviation of e when nothing changed
    z: np.ndarray
    history: np.ndarray          # own past changes
    pooled: np.ndarray           # weight of the pooled changes of similar items
    verdict: np.ndarray          # str


def judge_kind(kind: str, history: np.ndarray, base: np.ndarray, value: np.ndarray,
               n_base: np.ndarray | None = None, n_value: np.ndarray | None = None) -> Judged:
    """Judge the items of one kind: ``history`` (items x past runs, oldest first, NaN where an item has no value),
    ``base`` and ``value`` (items) of the baseline and the run; ``n_base``/``n_value``: the totals shares are of."""
    k = KINDS[kind]
    test = k.test
    a, b = PRIOR.get((k.family, test), (0.15, 0.0))
    floor = FLOOR_ABSOLUTE[test]
    # past changes of each item, less their reference
    if history.shape[1] >= 2:
        steps = log_change(history[:, :-1], history[:, 1:])
        if k.reference == "others":
            steps = steps - reference(steps, history[:, :-1], floor)
    else:
        steps = np.empty((len(base), 0))
    own_var, own_n = robust_variance(steps)
    # pooled: the past changes of items of similar size (log2 bins of POOL_BAND, with the bins on either side)
    size = np.where(base > 0, base, value)
    bins = np.floor(np.log(np.maximum(size, 1e-300)) / math.log(POOL_BAND)).astype(np.int64)
    pool_var = np.full(len(base), np.nan)
    pool_n = np.zeros(len(base))
    if steps.shape[1]:
        for bin_ in np.unique(bins):
            near = np.abs(bins - bin_) <= 1
            here = np.flatnonzero(bins == bin_)
            if near.sum() <= POOL_EXACT:            # (each item's pool without itself)
                for i in here:
                    others = near.copy()
                    others[i] = False
                    pool_var[i], pool_n[i] = robust_variance(steps[others].ravel())
            else:                                   # (many items: one item more or less changes little)
                pool_var[here], pool_n[here] = robust_variance(steps[near].ravel())
    pool_w = np.minimum(pool_n, POOL_WEIGHT)
    with np.errstate(all="ignore"):
        prior_var = a * a + np.where(size > 0, (b / np.where(size > 0, size, 1.0)) ** 2, 0.0)
        num = PRIOR_WEIGHT * prior_var + pool_w * np.nan_to_num(pool_var) + own_n * np.nan_to_num(own_var)
        var = num / (PRIOR_WEIGHT + pool_w + own_n)
        if test in ("count", "share"):           # (the counting error of the samples: Poisson)
            cb = base if test == "count" else base * np.nan_to_num(n_base if n_base is not None else np.inf)
            cv = value if test == "count" else value * np.nan_to_num(n_value if n_value is not None else np.inf)
            var = var + np.where(cb > 0, 1.0 / np.where(cb > 0, cb, 1.0), 0.0) \
                + np.where(cv > 0, 1.0 / np.where(cv > 0, cv, 1.0), 0.0)
        r = log_change(base, value)
        ref = reference(r[:, None], base[:, None], floor)[:, 0] if k.reference == "others" else np.zeros(len(r))
        e = r - ref
        noise = np.sqrt(var)
        z = np.where(noise > 0, e / np.where(noise > 0, noise, 1.0), np.where(e == 0, 0.0, np.sign(e) * np.inf))
        z = np.where(np.isfinite(e), z, np.nan)
        adjusted = np.expm1(e)
        absolute = np.abs(base * adjusted)
    past = np.isfinite(e) & (np.abs(adjusted) >= FLOOR_RELATIVE[test]) & (absolute >= floor)
    sure = past & (np.abs(z) >= Z_CONFIDENT) & ((own_n + pool_n) >= MIN_EVIDENCE)
    maybe = past & (np.abs(z) >= Z_SUSPECT) & ~sure
    verdict = np.where(sure, np.where(e > 0, "regression", "improvement"), np.where(maybe, "suspect", "noise"))
    # new and gone metrics
    new = (base <= 0) & (value >= NEW_FLOOR[test])
    gone = (value <= 0) & (base >= NEW_FLOOR[test])
    verdict = np.where(new, "regression", np.where(gone, "improvement", verdict)).astype(object)
    return Judged(ref, e, noise, z, own_n, pool_w, verdict)


def confidence(history: int, pooled: float) -> str:
    """What a metric's noise rests on: ``history`` (MIN_EVIDENCE changes of its own), ``pooled`` (enough with those
    of similar items) or ``prior`` (too few: it can be a suspect, never confident)."""
    return "history" if history >= MIN_EVIDENCE else "pooled" if history + pooled >= MIN_EVIDENCE else "prior"


def threshold(noise: float, test: str) -> float:
    """The relative change (against the other items) that a metric with ``noise`` must pass to be confident."""
    return max(FLOOR_RELATIVE[test], math.expm1(min(Z_CONFIDENT * noise, 50.0))) if math.isfinite(noise) else math.inf
