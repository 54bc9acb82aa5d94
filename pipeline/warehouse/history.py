"""The night's verdict from the whole history of a job's metrics: :func:`judge_history`, a pure function.

It takes the metrics of every night of one job and workload (a table of ``night``, ``kind``, ``key``, ``value``; a
missing row: the item was absent that night) and judges the last night. It reads no file and no database; the
compare stage, ingest's verdicts and ``bootprof warehouse replay`` call it on the rows they read, and
``bootprof warehouse calibrate`` fits its settings (:class:`Settings`) to a warehouse's noise-only history.

**Baseline of several nights.** A metric is judged against a robust centre (the median) of its own values over the
``window`` nights before, not against the night before: the change then carries the noise of one measurement and
a little of the centre's (``1 + 1.57 / n``), not of two. A crate back from a night away has its earlier values.

**The machine's speed that night** moves every crate together; it is taken out by a median polish of the log values
(items x nights): each night's effect is the median over the items of their deviation from their own centres. What
is left of the judged night is the metric's own change ``e``. The build totals are judged on their own (no other item
to hold the machine's speed); the night's effect itself is judged as ``everything`` against its own history, and
the query counts (deterministic) say whether a slower night did more work (``compiler``: it can be a regression)
or the same (``machine``: a suspect at most, for a slower runner is no regression of the compiler).

**Noise.** Per night, a weighted mean of three variances (empirical Bayes, as limma's): the item's own residuals
in the window, those of the kind's items of similar size (log2 bins of ``pool_band``, with the bins on either side),
and the prior ``a^2 + (b / size)^2`` (``Settings.prior``), weighted ``prior_weight``, ``pool_weight`` and the number
of own residuals. ``z = e / sd(e)``.

**Heavy tails.** Real noise has outliers. The standardized residuals of every night the verdict looks at but the
two it judges, pooled over the kind, give the tail's weight (:func:`tail_factor`: the ratio of their 95th to their 50th percentile, which a Gaussian has at 2.91),
and the thresholds are multiplied by what keeps Student's t noise of that weight as quiet as Gaussian noise.

**Verdicts** of a metric: ``regression``/``improvement`` past both floors (``floor_relative``, and the kind's
absolute floor) with ``|z| >= z_confident``; also when the night before was past ``z_each`` the same way and
together they reach ``z_confident`` (a lasting change, seen twice: each night past ``z_each`` and their sum over sqrt(2) past
``z_confident``, which noise reaches as rarely as one night past ``z_confident``); ``suspect`` past the floors with
``|z| >= z_suspect``, or a drift: the last ``drift_nights`` nights against as many a week, two weeks or a month back
(``drift_lags``), past ``z_confident`` (a creep of a few per cent a night); ``new``/``gone``: present on one side only; ``noise``: the rest.
A family (a crate's wall time, self-profile time and CPU samples) takes the verdict of its steadiest member.
Only ``regression`` fails a job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from pipeline.warehouse.significance import FLOOR_ABSOLUTE, KINDS, NEW_FLOOR, nanmedian, robust_variance

#: Per-night noise priors: the consecutive-night priors of :mod:`.significance` (fitted to a real 30-night history
#: of rustc builds on a 2-core VM: a = 0.15, b = 23 ms for the change between two nights) divided by sqrt(2), the
#: noise of one night.
PRIOR_PER_NIGHT = {
    "build time": (0.106, 0.0), "build memory": (0.071, 0.0), "crate time": (0.106, 16e6),
    "crate memory": (0.071, float(6 << 20)),
}
#: Variance of a median of n values over that of one value: pi / 2 (large n).
_MEDIAN_VAR = math.pi / 2
VERDICTS = ("regression", "improvement", "suspect", "noise", "new", "gone")
#: The kinds the verdict reads: those that vote, and the query counts (work done) for ``everything``.
READ_KINDS = tuple(k for k, v in KINDS.items() if v.role == "vote") + ("query_count",)


@dataclass(frozen=True)
class Settings:
    """What the verdict rests on; ``warehouse.verdict`` of the config, which ``bootprof warehouse calibrate``
    fits to a warehouse's own noise."""

    window: int = 14
    z_confident: float = 3.8
    z_suspect: float = 3.0
    floor_relative: float = 0.05
    prior: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(PRIOR_PER_NIGHT))
    prior_weight: float = 4.0
    pool_weight: float = 24.0
    pool_band: float = 2.0
    z_each: float = 1.5
    z_lasting: float = 3.7
    min_nights: int = 2
    drift_lags: tuple[int, ...] = (7, 14, 21, 28)
    drift_nights: int = 5

    @classmethod
    def of(cls, values: dict[str, Any] | None) -> "Settings":
        """Settings from a mapping (the config's section); keys it lacks keep their defaults."""
        if not values:
            return cls()
        known = {f.name for f in fields(cls)}
        given = {k: v for k, v in values.items() if k in known and v is not None}
        if "prior" in given:
            given["prior"] = {**PRIOR_PER_NIGHT, **{k: tuple(v) for k, v in given["prior"].items()}}
        if "drift_lags" in given:
            given["drift_lags"] = tuple(given["drift_lags"])
        return replace(cls(), **given)


def span(settings: Settings | dict | None = None) -> int:
    """How many nights (the judged one included) the verdict looks at."""
    s = settings if isinstance(settings, Settings) else Settings.of(settings)
    return max(s.window + 2, max(s.drift_lags, default=0) + s.drift_nights) + 1


def _columns(metrics) -> dict[str, np.ndarray]:
    """``metrics`` (a pyarrow Table or a dict of columns) as numpy arrays."""
    if hasattr(metrics, "column_names"):
        metrics = {c: metrics.column(c).to_pylist() for c in ("night", "kind", "key", "value")}
    return {"night": np.asarray(metrics["night"], np.int64), "kind": np.asarray(metrics["kind"], object),
            "key": np.asarray(metrics["key"], object), "value": np.asarray(metrics["value"], np.float64)}


@dataclass
class _Kind:
    """One kind's items judged on the last night."""

    keys: list[str]
    e: np.ndarray
    z: np.ndarray
    sd: np.ndarray
    verdict: np.ndarray
    night_effect: np.ndarray        # per night (0 for kinds judged alone)
    effect_sd: float


def judge_history(metrics, settings: Settings | dict | None = None):
    """One row per voting family of the last night: ``family``, ``key``, ``verdict`` (``regression``,
    ``improvement``, ``suspect``, ``noise``, ``new``, ``gone``), ``change`` (relative: 0.5 is +50 %), ``z`` and the
    ``kind`` that decided; and, when the night's effect is past the noise, a row of family ``everything``."""
    s = settings if isinstance(settings, Settings) else Settings.of(settings)
    cols = _columns(metrics)
    nights = np.unique(cols["night"])
    out: list[dict[str, Any]] = []
    if len(nights) == 0:
        return _table(out)
    column = {int(n): j for j, n in enumerate(nights)}
    judged: dict[str, _Kind] = {}
    for kind in sorted(set(cols["kind"].tolist())):
        k = KINDS.get(kind)
        if k is None or k.role != "vote":
            continue
        rows = cols["kind"] == kind
        keys = sorted(set(cols["key"][rows].tolist()))
        index = {key: i for i, key in enumerate(keys)}
        x = np.full((len(keys), len(nights)), np.nan)
        for night, key, value in zip(cols["night"][rows], cols["key"][rows], cols["value"][rows]):
            x[index[key], column[int(night)]] = value
        judged[kind] = _judge_kind(kind, keys, x, s)
    families: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for kind, j in judged.items():
        for i, key in enumerate(j.keys):
            families.setdefault((KINDS[kind].family, key), []).append((kind, i))
    for (family, key), members in sorted(families.items()):
        measured = [(judged[kd].sd[i], kd, i) for kd, i in members if np.isfinite(judged[kd].z[i])]
        if measured:
            _, kd, i = min(measured)
        else:
            kd, i = min(members, key=lambda m: (VERDICTS.index(str(judged[m[0]].verdict[m[1]])), m[0]))
        j = judged[kd]
        out.append({"family": family, "key": key, "verdict": str(j.verdict[i]),
                    "change": _finite(math.expm1(j.e[i])) if np.isfinite(j.e[i]) else None,
                    "z": _finite(j.z[i]), "kind": kd})
    out += _everything(judged, cols, column, s)
    return _table(out)


def _table(rows: list[dict[str, Any]]):
    import pyarrow as pa

    return pa.table({"family": pa.array([r["family"] for r in rows], pa.string()),
                     "key": pa.array([r["key"] for r in rows], pa.string()),
                     "verdict": pa.array([r["verdict"] for r in rows], pa.string()),
                     "change": pa.array([r["change"] for r in rows], pa.float64()),
                     "z": pa.array([r["z"] for r in rows], pa.float64()),
                     "kind": pa.array([r["kind"] for r in rows], pa.string())})


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), np.nan)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    ok = np.isfinite(values) & (weights > 0)
    if not ok.any():
        return math.nan
    order = np.argsort(values[ok])
    v, w = values[ok][order], weights[ok][order]
    cum = np.cumsum(w)
    return float(v[np.searchsorted(cum, 0.5 * cum[-1])])


def polish_nights(lv: np.ndarray, cols: np.ndarray, weight: np.ndarray, min_items: int = 3) -> np.ndarray:
    """Median polish of log values ``lv`` (items x nights) over the nights ``cols``: each night's effect, the
    median of the items' deviations from their centres weighted by ``weight`` (their precision: a steady large crate
    says more of the machine's speed than a small one, whose noise is mostly its own)."""
    effect = np.zeros(lv.shape[1])
    sub = lv[:, cols]
    centre = nanmedian(sub, axis=1)
    eff = np.zeros(len(cols))
    for _ in range(2):
        dev = sub - centre[:, None]
        for j in range(len(cols)):
            if np.isfinite(dev[:, j]).sum() >= min_items:
                eff[j] = _weighted_median(dev[:, j], weight)
        centre = nanmedian(sub - eff[None, :], axis=1)
    effect[cols] = np.nan_to_num(eff)
    return effect


def spread(e: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(variance, count) of changes ``e`` around 0 (NaN: none there), winsorized: squares past ``WINSOR`` times the
    robust (median of squares) estimate are cut to it. Robust to a real change in the history, as the median of
    squares is, but far less noisy with a dozen values (the median of squares alone left a night's z heavy-tailed:
    1.3 % of noise-only nights red where 0.13 % were due)."""
    rough, count = robust_variance(e, axis=axis)
    with np.errstate(all="ignore"):
        cap = np.expand_dims(WINSOR * WINSOR * rough, axis)
        sq = np.minimum(e * e, cap)
        var = np.nansum(np.where(np.isfinite(e), sq, 0.0), axis=axis) / np.maximum(count, 1)
        # (a Gaussian's variance winsorized at WINSOR sd is this share of it)
        var = var / WINSOR_SHARE
    return np.where(count > 0, var, np.nan), count


#: Squares past this many robust sd are cut to it (:func:`spread`), and what is left of a Gaussian's variance then.
WINSOR = 2.5
WINSOR_SHARE = 0.9776


def _judge_at(kind: str, lv: np.ndarray, night: int, s: Settings,
              effect: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """e, sd(e), per-night sd, number of window values and degrees of freedom of each item for ``night`` (a
    column), against the ``window`` nights before it."""
    k = KINDS[kind]
    a, b = s.prior.get(k.family, (0.106, 0.0))
    lo = max(0, night - s.window)
    win = np.arange(lo, night)
    n_items = lv.shape[0]
    if len(win) == 0:
        nan = np.full(n_items, np.nan)
        return nan, nan, nan, np.zeros(n_items), np.ones(n_items)
    centre, resid, own_var, n = _about_centres(lv, effect, win)
    own_n = np.maximum(n - 1, 0)        # (the median took one degree of freedom)
    size = np.exp(centre)
    bins = np.floor(np.log(np.maximum(np.nan_to_num(size, nan=1.0), 1e-300)) / math.log(s.pool_band)).astype(np.int64)
    pool_var = np.full(n_items, np.nan)
    pool_n = np.zeros(n_items)
    for bin_ in np.unique(bins):
        near = np.abs(bins - bin_) <= 1
        for i in np.flatnonzero(bins == bin_):
            others = near.copy()
            others[i] = False
            if others.any():
                pool_var[i], pool_n[i] = spread(resid[others].ravel())
    pool_w = np.minimum(pool_n, s.pool_weight)
    with np.errstate(all="ignore"):
        prior_var = a * a + np.where(size > 0, (b / np.where(size > 0, size, 1.0)) ** 2, 0.0)
        var = (s.prior_weight * prior_var + pool_w * np.nan_to_num(pool_var) + own_n * np.nan_to_num(own_var)) \
            / (s.prior_weight + pool_w + own_n)
        e = lv[:, night] - effect[night] - centre
        sd = np.sqrt(var * (1.0 + _MEDIAN_VAR / np.maximum(n, 1)))
    # (the degrees of freedom of the noise as estimated: the pooled residuals count for more than their weight in the
    # mean, since there are hundreds of them, but for no more than twice it: their items are only alike)
    dof = s.prior_weight + np.minimum(pool_n, 2 * s.pool_weight) + own_n
    return e, sd, np.sqrt(var), n, dof


#: The tail weight of the residuals, each over its own item's spread: ``q95 / q50`` of their absolute values (free of
#: their scale), and what it multiplies the thresholds by. Measured on the simulated histories of
#: ``tests/helpers/histories.py`` (40 crates, the residuals of up to 28 nights: :func:`past_residuals`), 2-98 %:
#: Gaussian noise 2.78-3.31 (with 14 nights: 2.77-3.58), Student's t of 5 degrees of freedom 3.18-3.97 (median
#: 3.60), of 3: 3.68-4.78 (median 4.16); the synthesized traces' reruns 2.9-3.3. The factors keep a night of 40
#: crates under 2 % false alarms with t3 noise (bench/bench_verdicts.py); the knee at 3.55 is set for t3 histories
#: whose ratio came out low.
TAIL_RATIO = (3.35, 3.55, 4.2, 6.0)
#: Fewer residuals than this say nothing of the tails (a 95th percentile of 50 values is two of them).
TAIL_MIN = 200
TAIL_FACTOR = (1.0, 1.5, 2.3, 3.5)


def tail_ratio(z_past: np.ndarray) -> float:
    """``q95 / q50`` of ``|z_past|`` (NaN: too few values to say)."""
    if z_past.size < TAIL_MIN:
        return math.nan
    a = np.abs(z_past)
    mid = float(np.quantile(a, 0.5))
    return float(np.quantile(a, 0.95)) / mid if mid > 0 else math.nan


def tail_factor(z_past: np.ndarray) -> float:
    """How much heavier than a Gaussian's the tails of ``z_past`` are, as a multiplier of the thresholds."""
    ratio = tail_ratio(z_past)
    return 1.0 if not math.isfinite(ratio) else float(np.interp(ratio, TAIL_RATIO, TAIL_FACTOR))


def _about_centres(lv: np.ndarray, effect: np.ndarray,
                   cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each item's centre over the nights ``cols`` (the median of its log values less the night's effect), its
    residuals about it, their spread (:func:`spread`, made up for the degree of freedom the median took: residuals
    about their own median are smaller than the noise) and how many there are."""
    adj = lv[:, cols] - effect[cols][None, :]
    centre = nanmedian(adj, axis=1)
    resid = adj - centre[:, None]
    var, n = spread(resid)
    with np.errstate(all="ignore"):
        var = var * np.where(n > 1, n / np.maximum(n - 1, 1), np.nan)
    return centre, resid, var, n


def past_residuals(lv: np.ndarray, effect: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The residuals of the nights ``cols`` (log values less the night's effect, about each item's median), each
    over its own item's spread, pooled: the shape of the noise, free of each item's scale."""
    if len(cols) < 6:
        return np.empty(0)
    _, resid, var, n = _about_centres(lv, effect, cols)
    with np.errstate(all="ignore"):
        z = resid / np.sqrt(var)[:, None]
    return z[np.isfinite(z) & (n >= 5)[:, None]]


def as_gaussian(t: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """A t statistic of ``dof`` degrees of freedom as the Gaussian z of the same tail probability (Hill's
    approximation, within a few per cent for dof of 5 or more). The noise a change is judged against is itself
    estimated from a few dozen residuals: read as a Gaussian z, a night's z was heavy-tailed (1.3 % of noise-only
    nights red where 0.13 % were due)."""
    d = np.maximum(np.asarray(dof, np.float64), 1.0)
    with np.errstate(all="ignore"):
        return t * (1.0 - 1.0 / (4.0 * d)) / np.sqrt(1.0 + t * t / (2.0 * d))


def _judge_kind(kind: str, keys: list[str], x: np.ndarray, s: Settings) -> _Kind:
    k = KINDS[kind]
    test = k.test
    lv = _log(x)
    last = x.shape[1] - 1
    floor = FLOOR_ABSOLUTE[test]
    window = np.arange(max(0, last - max(s.window, max(s.drift_lags, default=0) + 3)), last + 1)
    a, b = s.prior.get(k.family, (0.106, 0.0))
    with np.errstate(all="ignore"):
        typical = np.exp(nanmedian(lv, axis=1))
        weight = np.nan_to_num(1.0 / (a * a + (b / typical) ** 2), nan=0.0, posinf=0.0)
    effect_var = 0.0
    if k.reference == "others":
        effect = polish_nights(np.where(np.nan_to_num(x) >= floor, lv, np.nan), window, weight)
        # (the night's effect is itself estimated: the variance of a weighted median of the items' deviations)
        effect_var = _MEDIAN_VAR / weight.sum() if weight.sum() > 0 else 0.0
    else:
        effect = np.zeros(x.shape[1])
    e, sd, night_sd, n, dof = _judge_at(kind, lv, last, s, effect)
    # (the tails from every night the verdict looks at but the two it judges: a thousand residuals, not five hundred)
    tail = tail_factor(past_residuals(lv, effect, window[window < last - 1]))
    sd = np.sqrt(sd * sd + effect_var)
    z_conf, z_susp = s.z_confident * tail, s.z_suspect * tail
    with np.errstate(all="ignore"):
        z = as_gaussian(np.where(sd > 0, e / sd, np.nan), dof)
        base = np.exp(lv[:, last] - e - effect[last])         # (the baseline's centre, in the metric's unit)
        rel = np.expm1(e)
        past_floors = np.isfinite(e) & (np.abs(rel) >= s.floor_relative) & (np.abs(base * rel) >= floor)
    # (a regression needs a history: min_nights values of the item, whose spread and tails can then be read)
    past_floors_sure = past_floors & (n >= s.min_nights)
    sure = past_floors_sure & (np.abs(z) >= z_conf)
    # a lasting change: the night before past z_each the same way, and both together confident
    if last >= 2:
        e1, sd1, _, n1, dof1 = _judge_at(kind, lv, last - 1, s, effect)
        sd1 = np.sqrt(sd1 * sd1 + effect_var)
        # (the two nights' baselines share most of their nights: their z are correlated by that much)
        rho = (_MEDIAN_VAR / np.maximum(n1, 1)) / (1.0 + _MEDIAN_VAR / np.maximum(n1, 1))
        with np.errstate(all="ignore"):
            z1 = as_gaussian(np.where(sd1 > 0, e1 / sd1, np.nan), dof1)
            both = np.isfinite(z1) & (np.sign(z1) == np.sign(z)) & (np.abs(z1) >= s.z_each * tail) \
                & (np.abs(z) >= s.z_each * tail)
            # (two nights' z together: under noise as rare as one night past z_confident)
            sure |= past_floors_sure & both & ((np.abs(z) + np.abs(z1)) / np.sqrt(2 + 2 * rho) >= s.z_lasting * tail)
    maybe = past_floors & (np.abs(z) >= z_susp) & ~sure
    maybe |= _drift(lv, effect, last, night_sd, s, z_conf) & ~sure
    verdict = np.where(sure, np.where(e > 0, "regression", "improvement"), np.where(maybe, "suspect", "noise"))
    verdict = verdict.astype(object)
    window_cols = np.arange(max(0, last - s.window), last)
    had = np.isfinite(lv[:, window_cols]).any(axis=1) if len(window_cols) else np.zeros(len(keys), bool)
    now = np.isfinite(lv[:, last])
    verdict[~had & now & (np.nan_to_num(x[:, last]) >= NEW_FLOOR[test])] = "new"
    verdict[~had & now & (np.nan_to_num(x[:, last]) < NEW_FLOOR[test])] = "noise"
    verdict[had & ~now] = "gone"
    effect_sd = float(np.sqrt(robust_variance(np.diff(effect[window_cols]))[0] / 2)) if len(window_cols) > 2 else math.nan
    return _Kind(keys, e, z, sd, verdict, effect, effect_sd)


def _drift(lv: np.ndarray, effect: np.ndarray, last: int, night_sd: np.ndarray, s: Settings,
           z_conf: float) -> np.ndarray:
    """Items whose last ``drift_nights`` nights moved from as many nights ``drift_lags`` back by more than the noise
    allows."""
    out = np.zeros(lv.shape[0], bool)
    adj = lv - effect[None, :]
    recent = adj[:, max(0, last - s.drift_nights + 1): last + 1]
    r_med, r_n = nanmedian(recent, axis=1), np.isfinite(recent).sum(axis=1)
    for lag in s.drift_lags:
        hi = last - lag + 1
        lo = max(0, hi - s.drift_nights)
        if hi - lo < 2:
            continue
        old = adj[:, lo:hi]
        o_med, o_n = nanmedian(old, axis=1), np.isfinite(old).sum(axis=1)
        with np.errstate(all="ignore"):
            sd = night_sd * np.sqrt(_MEDIAN_VAR / np.maximum(r_n, 1) + _MEDIAN_VAR / np.maximum(o_n, 1))
            d = r_med - o_med
            out |= (r_n >= 2) & (o_n >= 2) & np.isfinite(d) & (np.abs(np.expm1(d)) >= s.floor_relative) \
                & (np.abs(d) >= z_conf * sd)
    return out


def _everything(judged: dict[str, _Kind], cols, column: dict[int, int], s: Settings) -> list[dict[str, Any]]:
    """The night's effect on the crates (all of them slower together) against its own history, when past the
    noise: one row, family ``everything``, key ``compiler`` when the query counts changed too, else ``machine``."""
    j = judged.get("crate_wall_ns") or judged.get("query_crate_ns")
    if j is None or not math.isfinite(j.effect_sd):
        return []
    last = len(j.night_effect) - 1
    window = j.night_effect[max(0, last - s.window): last]
    if len(window) < 3:
        return []
    centre = float(np.median(window))
    a = s.prior.get("build time", PRIOR_PER_NIGHT["build time"])[0]     # (the machine's own night-to-night spread)
    var = (s.prior_weight * a * a + len(window) * j.effect_sd ** 2) / (s.prior_weight + len(window))
    sd = math.sqrt(var * (1 + _MEDIAN_VAR / len(window)))
    e = float(j.night_effect[last]) - centre
    z = e / sd
    if abs(z) < s.z_suspect or abs(math.expm1(e)) < s.floor_relative:
        return []
    counts = cols["kind"] == "query_count"
    key = "machine"
    if counts.any():
        totals: dict[int, float] = {}
        for night, value in zip(cols["night"][counts], cols["value"][counts]):
            totals[column[int(night)]] = totals.get(column[int(night)], 0.0) + float(value)
        before = [totals[c] for c in range(max(0, last - s.window), last) if c in totals]
        if last in totals and before and abs(totals[last] / float(np.median(before)) - 1) >= 0.01:
            key = "compiler"
    # (a slower machine, the same work, fails no job: it is said, as a suspect; more work is the compiler's)
    sure = abs(z) >= s.z_confident and key == "compiler"
    verdict = ("regression" if e > 0 else "improvement") if sure else "suspect"
    return [{"family": "everything", "key": key, "verdict": verdict, "change": math.expm1(e), "z": z,
             "kind": "crate_wall_ns"}]
