"""``bootprof warehouse ingest|query|verify|rebuild|prune|compare|replay|calibrate``

* ``ingest --run RUN_DIR [--label k=v ...] [--job NAME]``: put a run into the warehouse (again = replace).
* ``query "SQL"``: run SQL on the warehouse (read-only) and print the result as a table.
* ``verify``: read every table whole (DuckDB checks each block's checksum), then check it against the journal
  beside the file and the stage manifests of the runs' directories; exit 1 on a problem, 2 on damage.
* ``rebuild [RUN_DIR ...] [--out FILE]``: ingest run directories (default: those its journal names) into a new file.
* ``prune --keep N``: of each job and workload, only the newest N runs keep their detail tables; the others
  keep their summary (``runs``, ``run_metrics``, manifests), still history and baselines.
* ``compare --run A [--baseline B] [--all] [--format text|markdown|html] [--output FILE] [--budget PCT]``: run A against
  B (default: the previous run of A's job and workload): the verdict, the build and crate families that changed,
  the queries that explain them, then the other metrics by impact (``--all``: noise too). Exit status 1 when a
  build or crate family regressed with confidence by at least ``--budget`` percent (``warehouse.budget_pct``),
  else 0; also 0 when there is nothing to compare with (it says so).

``--db PATH`` overrides ``warehouse.path`` of the config.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import sources


def _db(text: str) -> Path:
    """``--db``: a file's path; an empty one (an unset variable in a CI script) would name the working directory."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset variable?): name the warehouse file")
    return Path(text)


def add_arguments(p) -> None:
    p.add_argument("--db", type=_db, help="DuckDB warehouse file (default: warehouse.path of the config)")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ing = sub.add_parser("ingest", help="ingest one run directory (re-ingesting replaces it)")
    ing.add_argument("--run", dest="run_dir", type=sources.run_dir, required=True,
                   help="run directory (or a store's URL: s3://...) with an aggregated/ output")
    ing.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label stored with the run")
    ing.add_argument("--job", help="job name (default: the run directory's name without its -YYYYmmdd-HHMMSS)")
    q = sub.add_parser("query", help="run SQL on the warehouse and print the result")
    q.add_argument("sql", help="SQL, e.g. \"SELECT * FROM regressions\"")
    q.add_argument("--limit", type=int, default=200, help="print at most this many rows (default 200)")
    pr = sub.add_parser("prune", help="keep the detail of the newest runs only (summaries stay)")
    pr.add_argument("--keep", type=int, required=True, help="runs of each job and workload that keep their detail")
    v = sub.add_parser("verify", help="read every table; check it against its journal and the runs' manifests")
    v.set_defaults(limit=40)
    rb = sub.add_parser("rebuild", help="ingest run directories again into a new warehouse file")
    rb.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR",
                    help="run directories (default: those the warehouse's journal names that are still there)")
    rb.add_argument("--out", type=Path, help="the new file (default: in place of the warehouse; the old file is kept "
                    "as <warehouse>.damaged)")
    rp = sub.add_parser("replay", help="the verdict of every stored night under the current settings")
    rp.add_argument("--job", help="only this job's runs")
    rp.add_argument("--all", dest="everything", action="store_true", help="every night, not only those with a verdict")
    cal = sub.add_parser("calibrate", help="fit the verdict's noise to this warehouse's history; print the config")
    cal.add_argument("--job", help="only this job's runs")
    c = sub.add_parser("compare", help="what changed between a run and its baseline")
    c.add_argument("--run", required=True, help="run id or run directory")
    c.add_argument("--baseline", help="run id or directory (default: the previous run of the same job and workload)")
    c.add_argument("--all", dest="everything", action="store_true", help="every metric, noise included")
    c.add_argument("--format", choices=("text", "markdown", "html"), default="text",
                   help="text (default), markdown (a CI job summary) or html (with a differential flame graph)")
    c.add_argument("--output", type=Path, help="write the comparison to this file (e.g. $GITHUB_STEP_SUMMARY)")
    c.add_argument("--limit", type=int, default=40, help="changes listed (default 40)")
    c.add_argument("--budget", type=float, help="fail (exit 1) on a significant regression of at least this many "
                   "percent (default: warehouse.budget_pct)")


def text_table(cols: list[str], rows: list[tuple], width: int = 60) -> str:
    """Rows as aligned text; cells longer than ``width`` are cut with '…'."""
    def cell(v) -> str:
        s = "NULL" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
        return s if len(s) <= width else s[: width - 1] + "…"

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), line]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def main(args, config) -> int:
    import duckdb

    from pipeline import warehouse
    from pipeline.errors import ConfigError, InputError

    db = args.db or config.warehouse.path
    if args.action == "ingest":
        labels = dict(config.warehouse.labels)
        for item in args.label:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--label {item!r}: expected KEY=VALUE")
            labels[key] = value
        summary = warehouse.ingest(db, args.run_dir, labels=labels, job=args.job,
                                   lock_timeout_s=config.warehouse.lock_timeout_s,
                                   settings=config.warehouse.verdict.model_dump())
        print(f"ingested run {summary['run_id']} into {summary['db']}: {summary['tables']} tables, {summary['rows']} rows")
        return 0
    if args.action == "query":
        con = warehouse.connect(db, read_only=True, lock_timeout_s=config.warehouse.lock_timeout_s)
        try:
            cur = con.execute(args.sql)
        except duckdb.Error as exc:
            raise InputError(f"query failed: {' '.join(str(exc).split())}") from None
        if cur.description is None:
            return 0
        rows = cur.fetchmany(args.limit + 1)
        print(text_table([d[0] for d in cur.description], rows[: args.limit]))
        if len(rows) > args.limit:
            print(f"(more than {args.limit} rows; --limit N shows more)")
        return 0
    if args.action == "prune":
        if args.keep < 1:
            raise ConfigError(f"--keep {args.keep}: keep at least one run")
        done = warehouse.prune(db, args.keep, lock_timeout_s=config.warehouse.lock_timeout_s)
        print(f"pruned the detail of {done['runs_pruned']} runs ({done['rows_deleted']} rows); their summaries stay")
        return 0
    if args.action == "verify":
        from pipeline.warehouse import integrity, journal

        found = integrity.verify(db, lock_timeout_s=config.warehouse.lock_timeout_s)
        print(f"{db}: read {len(found.tables)} tables whole ({sum(found.tables.values()):,} rows), {found.runs} runs; "
              f"checked against {journal.journal_path(db).name} and {found.checked_dirs} run directories")
        for line in found.problems[:args.limit]:
            print(f"  {line}")
        if len(found.problems) > args.limit:
            print(f"  ... and {len(found.problems) - args.limit} more")
        print(f"{len(found.problems)} problems" if found.problems else "no problem found")
        return 1 if found.problems else 0
    if args.action == "replay":
        from pipeline.warehouse.replay import replay

        nights = replay(db, config.warehouse.verdict.model_dump(), args.job, config.warehouse.lock_timeout_s)
        shown = [n for n in nights if args.everything or n["verdict"] != "no change"]
        print(text_table(["run", "verdict", "regressions", "suspects"],
                         [(n["run_id"], n["verdict"], ", ".join(n["regression"]), ", ".join(n["suspect"]))
                          for n in shown]) if shown else "")
        red = sum(n["verdict"] == "regression" for n in nights)
        print(f"{len(nights)} nights judged under the current settings: {red} regressions "
              f"({100 * red / max(len(nights), 1):.1f} %), "
              f"{sum(n['verdict'] == 'suspect' for n in nights)} with suspects")
        return 0
    if args.action == "calibrate":
        from pipeline.warehouse.replay import calibrate

        fit = calibrate(db, args.job, config.warehouse.lock_timeout_s)
        if not fit["prior"]:
            print(f"{db}: too little history to fit (a job and workload needs 5 runs or more)", file=sys.stderr)
            return 2
        print(f"# fitted to {fit['nights']} nights of {fit['series']} job/workload series, {fit['crates']} crates;")
        print("# the noise of one night, sd of the log value: sqrt(a^2 + (b / size)^2), b in ns")
        print("warehouse:\n  verdict:\n    prior:")
        for family, (a, b) in sorted(fit["prior"].items()):
            print(f"      {family}: [{a}, {b:g}]")
        return 0
    if args.action == "rebuild":
        from pipeline.warehouse import integrity

        done = integrity.rebuild(db, args.runs or None, args.out, lock_timeout_s=config.warehouse.lock_timeout_s)
        for line in done["failed"]:
            print(f"not ingested: {line}", file=sys.stderr)
        if done["missing"]:
            print(f"{len(done['missing'])} runs of the journal have no directory here any more: "
                  f"{', '.join(done['missing'][:5])}", file=sys.stderr)
        if done["pruned_again"]:
            print(f"pruned again (as the old file was): {len(done['pruned_again'])} runs keep their summary only")
        print(f"rebuilt {done['db']} from {len(done['ingested'])} runs"
              + (f"; the old file is {done['damaged']}" if done["damaged"] else ""))
        return 1 if done["failed"] else 0
    from pipeline.runs import atomic_write_text
    from pipeline.compare import verdict

    c = warehouse.compare(db, args.run, args.baseline, lock_timeout_s=config.warehouse.lock_timeout_s,
                          settings=config.warehouse.verdict.model_dump())
    if args.format == "html":
        if c["baseline_run_id"] is None:
            shown = verdict.html_page(c, [], [], args.limit)
        else:
            shown = verdict.html_page(c, warehouse.folded(db, c["baseline_run_id"]), warehouse.folded(db, c["run_id"]),
                                      args.limit)
    elif args.format == "markdown":
        shown = verdict.markdown(c, args.limit)
    else:
        shown = verdict.text(c, args.limit, args.everything)
    if args.output:
        atomic_write_text(args.output, shown if shown.endswith("\n") else shown + "\n")
    else:
        print(shown)
    budget = config.warehouse.budget_pct if args.budget is None else args.budget
    failing = verdict.exceeds_budget(c, budget) if c["baseline_run_id"] else []
    if failing:
        print(f"{len(failing)} confident regressions of {budget:g}% or more", file=sys.stderr)
    return 1 if failing else 0
