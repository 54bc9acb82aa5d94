"""The compare stage's entry point, :func:`run` (a :class:`pipeline.stages.StageModule`): the comparison with the
baseline read from the warehouse, written as ``RUN_DIR/compare/`` (:mod:`.verdict` words and draws it), and the
count of regressions past the budget that fails a job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.escape import terminal
from pipeline.runs import atomic_write_text, stage_output
from pipeline.stages import COMPARED

if TYPE_CHECKING:
    from pipeline.contracts import CompareSummary

STAGE = COMPARED


def run(run_dir: Path, config, pool, inputs=None) -> CompareSummary:
    from pipeline import warehouse
    from pipeline.compare import verdict
    from pipeline.warehouse.comparison import named

    run_dir = Path(run_dir)
    db, timeout = config.warehouse.path, config.warehouse.lock_timeout_s
    c = warehouse.compare(db, run_dir.resolve().name, lock_timeout_s=timeout,
                          settings=config.warehouse.verdict.model_dump())
    base = c["baseline_run_id"]
    failing = verdict.exceeds_budget(c, config.warehouse.budget_pct) if base else []
    markdown = verdict.markdown(c)
    with stage_output(run_dir, STAGE, config=config.resolved()) as out:
        atomic_write_text(out.path / "summary.md", markdown)
        folded = (warehouse.folded(db, base, timeout), warehouse.folded(db, c["run_id"], timeout)) if base else ([], [])
        atomic_write_text(out.path / "compare.html", verdict.html_page(c, *folded))
        atomic_write_text(out.path / "comparison.json", json.dumps(c, indent=1, sort_keys=True, default=str) + "\n")
        fams = c["families"]
        summary: CompareSummary = {"baseline_run_id": base, "reason": c["reason"], "verdict": c["verdict"],
                   "regressions": sum(f["verdict"] == "regression" for f in fams),
                   "suspects": sum(f["verdict"] == "suspect" for f in fams),
                   "improvements": sum(f["verdict"] == "improvement" for f in fams),
                   "regressions_past_budget": len(failing), "budget_pct": config.warehouse.budget_pct,
                   "regressed": [verdict.family_name(f, str) for f in failing],
                   "suspected": [verdict.family_name(f, str) for f in named(fams, "suspect")]}
        out.manifest.update(summary)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(markdown)
    return summary


def headline(summary: CompareSummary) -> str:
    """The stage's line in a job's output."""
    if not summary.get("baseline_run_id"):
        return f"no baseline: {summary.get('reason')}"
    shown = summary.get("regressed") or summary.get("suspected")
    regressed = f" ({', '.join(terminal(s) for s in shown[:3])})" if shown else ""
    return (f"against {terminal(summary['baseline_run_id'])}: {summary.get('verdict', '')}{regressed}; "
            f"{summary['regressions']} regressions ({summary['regressions_past_budget']} past the "
            f"{summary['budget_pct']:g} % budget), {summary.get('suspects', 0)} suspects, "
            f"{summary['improvements']} improvements")
