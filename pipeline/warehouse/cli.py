"""``bootprof warehouse ingest|query|compare``

* ``ingest --run RUN_DIR [--label k=v ...] [--job NAME]``: put a run into the warehouse (again = replace).
* ``query "SQL"``: run SQL on the warehouse (read-only) and print the result as a table.
* ``compare --run A [--baseline B] [--all]``: significant metric changes of run A against B (default:
  the previous run of A's job); ``--all`` prints every metric.

``--db PATH`` overrides ``warehouse.path`` of the config.
"""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--db", type=Path, help="DuckDB warehouse file (default: warehouse.path of the config)")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ing = sub.add_parser("ingest", help="ingest one run directory (re-ingesting replaces it)")
    ing.add_argument("--run", dest="run_dir", type=Path, required=True, help="run directory with an aggregated/ output")
    ing.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label stored with the run")
    ing.add_argument("--job", help="job name (default: the run directory's name without its -YYYYmmdd-HHMMSS)")
    q = sub.add_parser("query", help="run SQL on the warehouse and print the result")
    q.add_argument("sql", help="SQL, e.g. \"SELECT * FROM regressions\"")
    q.add_argument("--limit", type=int, default=200, help="print at most this many rows (default 200)")
    c = sub.add_parser("compare", help="what changed between a run and its baseline")
    c.add_argument("--run", required=True, help="run id or run directory")
    c.add_argument("--baseline", help="run id or directory (default: the previous run of the same job)")
    c.add_argument("--all", dest="everything", action="store_true", help="every metric, not only significant changes")


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
        summary = warehouse.ingest(db, args.run_dir, labels=labels, job=args.job)
        print(f"ingested run {summary['run_id']} into {summary['db']}: {summary['tables']} tables, {summary['rows']} rows")
        return 0
    if args.action == "query":
        con = warehouse.connect(db, read_only=True)
        try:
            cur = con.execute(args.sql)
        except duckdb.Error as exc:
            raise InputError(f"query failed: {exc}") from None
        if cur.description is None:
            return 0
        rows = cur.fetchmany(args.limit + 1)
        print(text_table([d[0] for d in cur.description], rows[: args.limit]))
        if len(rows) > args.limit:
            print(f"(more than {args.limit} rows; --limit N shows more)")
        return 0
    rows = warehouse.compare(db, args.run, args.baseline, args.everything)
    if not rows:
        print("no significant changes")
        return 0
    cols = ["kind", "key", "baseline_value", "value", "relative_change", "z", "direction"]
    print(f"run {rows[0]['run_id']} vs baseline {rows[0]['baseline_run_id']}:")
    print(text_table(cols, [tuple(r[c] for c in cols) for r in rows]))
    return 0
