"""A run against its baseline: every metric judged (:mod:`.significance`), one verdict per family, the
comparison's own verdict, and what explains a family that regressed.

:func:`compare` reads the run, its baseline and the runs before it (the history the noise is estimated from) from
the warehouse; :func:`write_verdicts` keeps each run's comparison with its default baseline in the ``verdicts``
table, which the ``comparisons`` and ``regressions`` views read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.warehouse import significance as sig

if TYPE_CHECKING:
    from pipeline.contracts import ComparisonRow, Family

#: The kinds a comparison opens with (one key, 'build'), in order.
HEADLINE = ("build_wall_ns", "cpu_build", "peak_commit_build", "query_build_ns", "commit_build")
#: Columns of the ``verdicts`` table, in order.
COLUMNS = {
    "run_id": "VARCHAR", "baseline_run_id": "VARCHAR", "kind": "VARCHAR", "test": "VARCHAR", "family": "VARCHAR",
    "role": "VARCHAR", "key": "VARCHAR", "baseline_value": "DOUBLE", "value": "DOUBLE", "change": "DOUBLE",
    "relative_change": "DOUBLE", "reference": "DOUBLE", "adjusted_change": "DOUBLE", "noise": "DOUBLE",
    "z": "DOUBLE", "threshold": "DOUBLE", "history": "INTEGER", "pooled": "DOUBLE", "confidence": "VARCHAR",
    "verdict": "VARCHAR", "decides": "BOOLEAN",
}
VERDICTS_DDL = ("CREATE TABLE IF NOT EXISTS verdicts ("
                + ", ".join(f"{c} {t}" for c, t in COLUMNS.items()) + ")")
_RANK = {"regression": 0, "suspect": 1, "improvement": 2, "noise": 3}


def history_of(con, run_id: str) -> tuple[str, str, list[str]]:
    """(job, workload, the runs of its job and workload before it, oldest first, at most HISTORY_RUNS + 1)."""
    return _neighbours(con, run_id, later=False)


def later_runs(con, run_id: str) -> list[str]:
    """Runs of ``run_id``'s job and workload after it whose history holds it (their verdicts change with it)."""
    return _neighbours(con, run_id, later=True)[2]


def _neighbours(con, run_id: str, later: bool) -> tuple[str, str, list[str]]:
    """(job, workload, the HISTORY_RUNS + 1 runs of that job and workload nearest ``run_id`` on one side of it, in
    the order they ran); runs are ordered by run_time, then run_id."""
    job, workload, run_time = con.execute("SELECT job, workload, run_time FROM runs WHERE run_id = ?",
                                          [run_id]).fetchone()
    side, order = (">", "ASC") if later else ("<", "DESC")
    found = [r[0] for r in con.execute(
        f"""SELECT run_id FROM runs WHERE job IS NOT DISTINCT FROM $job AND workload IS NOT DISTINCT FROM $workload
            AND (run_time {side} $time OR (run_time = $time AND run_id {side} $run))
            ORDER BY run_time {order}, run_id {order} LIMIT $n""",
        {"job": job, "workload": workload, "time": run_time, "run": run_id, "n": sig.HISTORY_RUNS + 1}).fetchall()]
    return job, workload, found if later else found[::-1]


def judge(con, run_id: str, base_id: str, before: list[str], settings=None) -> list[ComparisonRow]:
    """Every metric of ``run_id`` and ``base_id`` judged, with the noise learned from ``before``, the runs of the
    run's job and workload before it (:func:`history_of`; up to the baseline when the baseline is one of them).
    Against the default baseline (the run before), each voting family's verdict is the history's
    (:func:`pipeline.warehouse.history.judge_history` over ``before`` and the run, with ``settings``); against one
    named, the pair's."""
    history = before[: before.index(base_id) + 1] if base_id in before else before
    ids = history + ([] if base_id in history else [base_id]) + [run_id]
    table = con.execute("""SELECT run_id, kind, key, value, n FROM run_metrics
                           WHERE run_id IN (SELECT unnest($1::VARCHAR[])) AND value IS NOT NULL""", [ids]).fetchall()
    column = {r: i for i, r in enumerate(ids)}
    by_kind: dict[str, dict[str, dict[int, tuple[float, float | None]]]] = {}
    for rid, kind, key, value, n in table:
        if kind in sig.KINDS:
            by_kind.setdefault(kind, {}).setdefault(key, {})[column[rid]] = (value, n)
    b_col, r_col = column[base_id], column[run_id]
    rows: list[ComparisonRow] = []
    for kind, items in by_kind.items():
        keys = sorted(k for k, cols in items.items() if b_col in cols or r_col in cols)
        if not keys:
            continue
        values = np.full((len(keys), len(ids)), np.nan)
        totals = np.full((len(keys), len(ids)), np.nan)
        for i, key in enumerate(keys):
            for c, (v, n) in items[key].items():
                values[i, c] = v
                totals[i, c] = np.nan if n is None else n
        base, value = np.nan_to_num(values[:, b_col]), np.nan_to_num(values[:, r_col])
        j = sig.judge_kind(kind, values[:, : len(history)], base, value, totals[:, b_col], totals[:, r_col])
        k = sig.KINDS[kind]
        for i, key in enumerate(keys):
            noise = float(j.noise[i])
            z = float(j.z[i])
            rows.append({
                "run_id": run_id, "baseline_run_id": base_id, "kind": kind, "test": k.test, "family": k.family,
                "role": k.role, "key": key, "baseline_value": float(base[i]), "value": float(value[i]),
                "change": float(value[i] - base[i]),
                "relative_change": float((value[i] - base[i]) / abs(base[i])) if base[i] else None,
                "reference": _finite(math.expm1(j.reference[i])), "adjusted_change": _finite(math.expm1(j.e[i])),
                "noise": _finite(noise), "z": _finite(z), "threshold": _finite(sig.threshold(noise, k.test)),
                "history": int(j.history[i]), "pooled": float(j.pooled[i]),
                "confidence": sig.confidence(int(j.history[i]), float(j.pooled[i])),
                "verdict": str(j.verdict[i]), "decides": False})
    _decide(rows)
    if before and base_id == before[-1]:
        _from_history(con, rows, before + [run_id], settings)
    return rows


#: The verdicts of :func:`judge_history` in a comparison's words (a new crate is shown, and fails no job).
_AS_COMPARISON = {"regression": "regression", "improvement": "improvement", "suspect": "suspect", "noise": "noise",
                  "new": "suspect", "gone": "improvement"}


def history_metrics(con, run_ids: list[str]) -> dict[str, list]:
    """The metrics :func:`judge_history` reads, of ``run_ids`` (in the order they ran: ``night`` is the index)."""
    from pipeline.warehouse.history import READ_KINDS

    night = {r: i for i, r in enumerate(run_ids)}
    got = con.execute("""SELECT run_id, kind, key, value FROM run_metrics
                         WHERE run_id IN (SELECT unnest($1::VARCHAR[])) AND kind IN (SELECT unnest($2::VARCHAR[]))
                         AND value IS NOT NULL""", [run_ids, list(READ_KINDS)]).fetchall()
    return {"night": [night[r] for r, *_ in got], "kind": [k for _, k, _, _ in got], "key": [k for _, _, k, _ in got],
            "value": [float(v) for *_, v in got]}


def _from_history(con, rows: list[ComparisonRow], run_ids: list[str], settings) -> None:
    """Each voting family's verdict (its deciding member's) from the whole history; a row of family ``everything``
    when all crates moved together past the noise."""
    from pipeline.warehouse.history import judge_history, span

    judged = judge_history(history_metrics(con, run_ids[-span(settings):]), settings).to_pylist()
    by_family = {(r["family"], r["key"]): r for r in judged}
    for (family, key), members in _voting_families(rows).items():
        got = by_family.get((family, key))
        pick = next(m for m in members if m["decides"])
        if got is None:
            continue
        pick["verdict"] = _AS_COMPARISON[got["verdict"]]
        if got["z"] is not None:
            pick["z"] = got["z"]
        if got["change"] is not None:
            pick["adjusted_change"] = got["change"]
    build = next((r for r in rows if r["kind"] == "build_wall_ns" and r["decides"]), None) or \
        next((r for r in rows if r["role"] == "vote"), None)
    for r in judged:
        if r["family"] == "everything" and build is not None:
            rows.append({**build, "family": "everything", "key": r["key"], "kind": build["kind"], "verdict":
                         _AS_COMPARISON[r["verdict"]], "z": r["z"], "adjusted_change": r["change"], "decides": True})


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _voting_families(rows: list[ComparisonRow]) -> dict[tuple[str, str], list[ComparisonRow]]:
    """The rows that vote, by family and key."""
    families: dict[tuple[str, str], list[ComparisonRow]] = {}
    for r in rows:
        if r["role"] == "vote":
            families.setdefault((r["family"], r["key"]), []).append(r)
    return families


def _decide(rows: list[ComparisonRow]) -> None:
    """Mark the member that decides each voting family's verdict: the steadiest (least noise) of those with a
    change on both sides, else (a new or gone item) the first that is not noise."""
    for members in _voting_families(rows).values():
        measured = [r for r in members if r["z"] is not None and r["noise"] is not None]
        if measured:
            pick = min(measured, key=lambda r: (r["noise"], r["kind"]))
        else:
            pick = min(members, key=lambda r: (_RANK[r["verdict"]], r["kind"]))
        pick["decides"] = True


def families(rows: list[ComparisonRow]) -> list[Family]:
    """The voting families, each with its verdict (that of the member that decides), worst first (a crate before
    the build: the crate is what a regression of both is about)."""
    out = []
    for members in _voting_families(rows).values():
        pick = next(m for m in members if m["decides"])
        out.append({**pick, "members": [{k: m[k] for k in ("kind", "relative_change", "adjusted_change", "z",
                                                             "verdict")} for m in members]})
    return sorted(out, key=lambda f: (_RANK[f["verdict"]], f["key"] == "build", f["adjusted_change"] is None,
                                      -abs(f["adjusted_change"] or 0), f["family"], f["key"]))


def named(fams: list[Family], verdict: str) -> list[Family]:
    """The families a comparison of ``verdict`` is about: those of that verdict (suspects: those that went up)."""
    return [f for f in fams if f["verdict"] == verdict and (verdict != "suspect" or (f["adjusted_change"] or 0) > 0)]


def overall(fams: list[Family]) -> str:
    """The comparison's verdict: ``regression`` (a family regressed), ``suspect`` (one may have: more runs will
    tell), ``improvement``, or ``no change``."""
    return next((v for v in ("regression", "suspect", "improvement") if named(fams, v)), "no change")


def explain(con, run_id: str, base_id: str, crate: str, limit: int = 5) -> list[dict[str, Any]]:
    """The queries of ``crate`` whose self time grew the most between the runs (their invocations too), from the
    detail ``query_summary`` (empty once pruned or without self-profiles)."""
    try:
        got = con.execute("""
            SELECT label, sum(self_ns) FILTER (WHERE run_id = $base) AS b, sum(self_ns) FILTER (WHERE run_id = $run) AS v,
                   sum(invocations) FILTER (WHERE run_id = $base) AS bn, sum(invocations) FILTER (WHERE run_id = $run) AS vn
            FROM query_summary WHERE run_id IN ($base, $run) AND scope = 'crate' AND crate = $crate
            GROUP BY label HAVING coalesce(v, 0) > coalesce(b, 0) ORDER BY coalesce(v, 0) - coalesce(b, 0) DESC
            LIMIT $limit""", {"base": base_id, "run": run_id, "crate": crate, "limit": limit}).fetchall()
    except Exception:        # noqa: BLE001 - a warehouse of an older bootprof without the columns: no explanation
        return []
    return [{"label": label, "baseline_ns": b or 0, "ns": v or 0, "baseline_invocations": bn, "invocations": vn}
            for label, b, v, bn, vn in got]


def write_verdicts(con, run_ids: list[str], settings=None) -> None:
    """(Re)write the ``verdicts`` rows of each run against its default baseline (none for a first run)."""
    for run_id in run_ids:
        con.execute("DELETE FROM verdicts WHERE run_id = ?", [run_id])
        _, _, before = history_of(con, run_id)
        if not before:
            continue
        rows = judge(con, run_id, before[-1], before, settings)
        if rows:
            import pyarrow as pa

            batch = pa.table({c: [r[c] for r in rows] for c in COLUMNS})  # noqa: F841 - read by the SQL below
            con.execute(f"INSERT INTO verdicts SELECT {', '.join(COLUMNS)} FROM batch")
