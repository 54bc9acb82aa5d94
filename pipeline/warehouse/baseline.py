"""A run against its baseline, read from the warehouse (:func:`compare`), and the folded stacks its page draws."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.warehouse import comparison
from pipeline.warehouse.comparison import HEADLINE
from pipeline.warehouse.store import connect, run_id_of

if TYPE_CHECKING:
    from pipeline.contracts import Comparison


def compare(db: Path, run: str, baseline: str | None = None, lock_timeout_s: float = 300.0,
            settings=None) -> Comparison:
    """``run`` against ``baseline`` (default: the previous run of its job and workload), judged as
    :mod:`.significance` says. Returns ``{run_id, job, workload, baseline_run_id (None: nothing to compare with),
    reason, verdict, headline, families, changes, explanations}``: ``verdict`` the comparison's (``regression``,
    ``suspect``, ``improvement``, ``no change``); ``headline`` the build's metrics; ``families`` one verdict per
    build and crate family, worst first; ``changes`` every other metric, regressions first, then by impact (its
    change as a share of its kind's baseline total); ``explanations``: for each crate family that regressed or is
    suspect, the queries of the crate that grew most. A baseline of another workload is compared (it was asked
    for) and ``reason`` says so."""
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        run_id = run_id_of(con, run)
        job, workload, before = comparison.history_of(con, run_id)
        out: Comparison = {"run_id": run_id, "job": job, "workload": workload, "baseline_run_id": None,
                               "reason": None, "verdict": "no change", "headline": [], "families": [], "changes": [],
                               "explanations": {}}
        if baseline is None:
            if not before:
                out["reason"] = f"no earlier run of job '{job}' and workload '{workload}' to compare with"
                return out
            base_id = before[-1]
        else:
            base_id = run_id_of(con, baseline)
            other = con.execute("SELECT workload FROM runs WHERE run_id = ?", [base_id]).fetchone()[0]
            if other != workload:
                out["reason"] = f"the baseline is of another workload ('{other}'): differences include the workload's"
        out["baseline_run_id"] = base_id
        platforms = [r[0] for r in con.execute("SELECT labels['platform'] FROM runs WHERE run_id IN (?, ?) "
                                                "ORDER BY run_id = ? DESC", [run_id, base_id, run_id]).fetchall()]
        if len(platforms) == 2 and None not in platforms and platforms[0] != platforms[1]:
            # (perf's cpu-clock and ETW's sampled profile count CPU alike, at their own rates and costs)
            note = (f"this run was recorded on {platforms[0]}, the baseline on {platforms[1]}: crate and query times "
                    "compare; CPU samples differ by recorder and rate")
            out["reason"] = f"{out['reason']}; {note}" if out["reason"] else note
        rows = comparison.judge(con, run_id, base_id, before, settings)
        fams = comparison.families(rows)
        out["explanations"] = {f["key"]: comparison.explain(con, run_id, base_id, f["key"]) for f in fams
                               if f["family"] == "crate time" and f["verdict"] in ("regression", "suspect")
                               and (f["adjusted_change"] or 0) > 0}
    finally:
        con.close()
    totals: dict[str, float] = {}
    for r in rows:
        totals[r["kind"]] = totals.get(r["kind"], 0.0) + abs(r["baseline_value"])
    for r in rows:
        r["impact"] = abs(r["change"]) / totals[r["kind"]] if totals[r["kind"]] else float(abs(r["change"]) > 0)
    by_kind = {r["kind"]: r for r in rows if r["kind"] in HEADLINE}
    out["headline"] = [by_kind[k] for k in HEADLINE if k in by_kind]
    out["families"] = fams
    out["verdict"] = comparison.overall(fams)
    rank = {"regression": 0, "suspect": 1, "improvement": 2, "noise": 3}
    out["changes"] = sorted((r for r in rows if r["kind"] not in HEADLINE),
                            key=lambda r: (rank[r["verdict"]], -r["impact"], r["kind"], r["key"]))
    return out


def folded(db: Path, run_id: str, lock_timeout_s: float = 300.0) -> list[tuple[str, int]]:
    """The folded CPU stacks of one run (``cpu_folded``; empty when the run has none or its detail was pruned)."""
    con = connect(db, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        if not con.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'cpu_folded'").fetchone():
            return []
        return [(s, int(n)) for s, n in con.execute(
            "SELECT stack, sum(samples) FROM cpu_folded WHERE run_id = ? GROUP BY stack", [run_id]).fetchall()]
    finally:
        con.close()
