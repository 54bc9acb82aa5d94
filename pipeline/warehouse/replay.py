"""The warehouse's history judged again (``bootprof warehouse replay``) and the noise it rests on fitted from it
(``bootprof warehouse calibrate``), both with :func:`pipeline.warehouse.history.judge_history`'s reading."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.warehouse.comparison import history_metrics
from pipeline.warehouse.history import Settings, polish_nights, judge_history, span, spread
from pipeline.warehouse.significance import robust_variance
from pipeline.warehouse.store import connect


def _series(con, job: str | None = None) -> dict[tuple[str, str], list[str]]:
    """(job, workload) -> its runs in the order they ran."""
    out: dict[tuple[str, str], list[str]] = {}
    for run_id, j, workload in con.execute("SELECT run_id, job, workload FROM runs ORDER BY run_time, run_id").fetchall():
        if job is None or j == job:
            out.setdefault((j, workload), []).append(run_id)
    return out


def replay(db: Path, settings: Settings | dict | None = None, job: str | None = None,
           lock_timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """Every stored night (from each job and workload's second) judged under ``settings``: ``run_id``, ``job``,
    ``workload``, ``verdict`` (``regression``, ``suspect``, ``improvement`` or ``no change``) and the families of each
    verdict, by name."""
    n = span(settings)
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        out = []
        for (j, workload), runs in _series(con, job).items():
            for k in range(1, len(runs)):
                rows = judge_history(history_metrics(con, runs[max(0, k - n + 1): k + 1]), settings).to_pylist()
                named = {v: [f"{r['family']} {r['key']}" for r in rows if r["verdict"] == v]
                         for v in ("regression", "suspect", "improvement", "new", "gone")}
                verdict = next((v for v in ("regression", "suspect", "improvement") if named[v]), "no change")
                out.append({"run_id": runs[k], "job": j, "workload": workload, "verdict": verdict, **named})
        return out
    finally:
        con.close()


def calibrate(db: Path, job: str | None = None, lock_timeout_s: float = 300.0) -> dict[str, Any]:
    """The per-night noise priors fitted to the warehouse's history: for the crates, ``a`` and ``b`` of
    ``sd = sqrt(a^2 + (b / size)^2)`` by least squares over the robust variance of each crate's log residuals (its
    values less its median and the night's effect); for the build, ``a`` of its own. Robust estimates, so a few real
    changes in the history move them little. Returns ``{"prior": {...}, "nights": N, "series": S, "crates": C}``."""
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        crate_var: list[tuple[float, float, int]] = []      # (size, variance, residuals)
        build_res: list[np.ndarray] = []
        nights = series = 0
        for runs in _series(con, job).values():
            if len(runs) < 5:
                continue
            series += 1
            nights += len(runs)
            cols = history_metrics(con, runs)
            for kind in ("crate_wall_ns", "build_wall_ns"):
                rows = [i for i, k in enumerate(cols["kind"]) if k == kind]
                keys = sorted({cols["key"][i] for i in rows})
                if not keys:
                    continue
                index = {k: i for i, k in enumerate(keys)}
                x = np.full((len(keys), len(runs)), np.nan)
                for i in rows:
                    x[index[cols["key"][i]], cols["night"][i]] = cols["value"][i]
                with np.errstate(all="ignore"):
                    lv = np.where(x > 0, np.log(np.where(x > 0, x, 1.0) / (1e9 if kind == "crate_wall_ns" else 1)),
                                  np.nan)
                centre = np.nanmedian(lv, axis=1)
                dev = lv - centre[:, None]
                if kind == "crate_wall_ns":
                    # (the night's effect, weighted as the verdict weighs it: by each crate's prior precision)
                    a, b = Settings().prior["crate time"]
                    weight = 1.0 / (a * a + (b / np.exp(np.nan_to_num(centre))) ** 2)
                    effect = polish_nights(lv, np.arange(len(runs)), weight)
                    dev = lv - effect[None, :]
                    dev = dev - np.nanmedian(dev, axis=1)[:, None]
                    var, n = spread(dev)
                    var = var * n / np.maximum(n - 1, 1)      # (about their own median)
                    crate_var += [(float(math.exp(c)), float(v), int(m)) for c, v, m in zip(centre, var, n)
                                  if m >= 4 and math.isfinite(v)]
                else:
                    build_res.append(dev[np.isfinite(dev)])
    finally:
        con.close()
    prior: dict[str, list[float]] = {}
    if len(crate_var) >= 3:
        size = np.array([c[0] for c in crate_var])
        var = np.array([c[1] for c in crate_var])
        count = np.array([c[2] for c in crate_var], np.float64)
        # (least squares of var = a^2 + b^2 / size^2, each crate weighed by the precision of its variance,
        # count / var^2, the prediction's: small crates' variances are large and as uncertain)
        a2, b2 = float(np.median(var)), 0.0
        for _ in range(5):
            predicted = np.maximum(a2 + b2 / size ** 2, 1e-8)
            w = np.sqrt(count) / predicted
            design = np.column_stack([np.ones(len(size)), 1.0 / size ** 2]) * w[:, None]
            coef, *_ = np.linalg.lstsq(design, var * w, rcond=None)
            a2, b2 = max(float(coef[0]), 1e-6), max(float(coef[1]), 0.0)
        prior["crate time"] = [round(math.sqrt(a2), 4), round(math.sqrt(b2) * 1e9)]
    if build_res:
        v, _ = robust_variance(np.concatenate(build_res))
        prior["build time"] = [round(math.sqrt(float(v)), 4), 0.0]
    return {"prior": prior, "nights": nights, "series": series, "crates": len(crate_var)}
