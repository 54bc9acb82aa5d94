"""A real nightly history on this machine: the same workspace built night after night with this machine's rustc
(``tests/realbuild.py``), each night through ``bootprof run jobs/nightly.yaml``, with known changes on chosen nights.

    python scripts/real_history.py OUT [--nights 30] [--change 31:double:big] [--change 32:hot:mid] [--rejudge]
    python scripts/real_history.py OUT --fit

Each night is captured once into ``OUT/nightly-NNN`` (kept: a second call goes on where the first stopped, and
``--rejudge`` ingests and compares every captured night again into a new warehouse, to try another verdict rule
on the same builds). Prints a line a night (its changes, the job's exit status, what was flagged) and the false
alarm and detection counts, and writes them to ``OUT/history.json``. ``--fit`` prints, from the noise-only nights
in ``OUT/warehouse.duckdb``, each crate's noise (the spread of its night-to-night change less the other crates')
by its size, and the prior ``sqrt(a^2 + (b / size)^2)`` of ``pipeline/warehouse/significance.py`` fitted to them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import realbuild  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--nights", type=int, default=30, help="noise-only nights before the changed ones")
    p.add_argument("--change", action="append", default=[], metavar="NIGHT:KIND:CRATE",
                   help="a known change on a night (kinds: double, hot); repeatable")
    p.add_argument("--rejudge", action="store_true", help="ingest and compare every captured night again")
    p.add_argument("--fit", action="store_true", help="fit the noise prior to the noise-only nights of OUT")
    args = p.parse_args(argv)
    out = args.out.resolve()
    if args.fit:
        return fit(out / "warehouse.duckdb", out / "history.json")
    changes: dict[int, list[str]] = {}
    for c in args.change:
        k, _, change = c.partition(":")
        changes.setdefault(int(k), []).append(change)
    last = max([args.nights, *changes])
    db = out / "warehouse.duckdb"
    if args.rejudge:
        db.unlink(missing_ok=True)
    config = out / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"warehouse": {"path": str(db)}, "cluster": {"mode": "synchronous"}}) + "\n")
    rows = []
    for k in range(1, last + 1):
        run = out / f"nightly-{k:03d}"
        if not (run / "capture" / "_manifest.json").exists():
            realbuild.night(out / "ws", run, tuple(changes.get(k, ())))
        proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(config), "run",
                               str(ROOT / "jobs" / "nightly.yaml"), "--run", str(run), "--force"],
                              capture_output=True, text=True, cwd=ROOT)
        comparison = run / "compare" / "comparison.json"
        c = json.loads(comparison.read_text()) if comparison.exists() else {}
        flagged = [f"{r['kind']}:{r['key']} {100 * (r['relative_change'] or 0):+.1f}%"
                   for r in c.get("headline", []) + c.get("changes", []) if r["verdict"] == "regression"]
        rows.append({"night": k, "changes": changes.get(k, []), "exit": proc.returncode, "flagged": flagged,
                     "baseline": c.get("baseline_run_id")})
        print(f"night {k:3d}  {','.join(changes.get(k, [])) or 'noise':<14} exit {proc.returncode}  "
              f"{'; '.join(flagged[:6]) or '-'}", flush=True)
        if proc.returncode not in (0, 1):
            print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n")
    judged = [r for r in rows if r["baseline"] and not r["changes"]]
    false = sum(r["exit"] == 1 for r in judged)
    found = sum(r["exit"] == 1 for r in rows if r["changes"])
    print(f"noise-only nights with a baseline: {len(judged)}, red: {false}; changed nights: "
          f"{sum(bool(r['changes']) for r in rows)}, red: {found}")
    (out / "history.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def fit(db: Path, history: Path) -> int:
    """Print each crate's noise by its size and the prior fitted to them (least squares on the variances)."""
    import duckdb
    import numpy as np

    from pipeline.warehouse.significance import FLOOR_ABSOLUTE, log_change, reference, robust_variance

    nights = json.loads(history.read_text(encoding="utf-8"))
    quiet = [f"nightly-{r['night']:03d}" for r in nights if not r["changes"]]
    con = duckdb.connect(str(db), read_only=True)
    fits = {}
    for kind in ("crate_wall_ns", "query_crate_ns"):
        rows = con.execute("SELECT key, run_id, value FROM run_metrics WHERE kind = ? AND run_id IN "
                           "(SELECT unnest(?::VARCHAR[]))", [kind, quiet]).fetchall()
        keys = sorted({k for k, _, _ in rows})
        col = {r: i for i, r in enumerate(quiet)}
        values = np.full((len(keys), len(quiet)), np.nan)
        for key, run, value in rows:
            values[keys.index(key), col[run]] = value
        steps = log_change(values[:, :-1], values[:, 1:])
        e = steps - reference(steps, values[:, :-1], FLOOR_ABSOLUTE["time"])
        var, n = robust_variance(e)
        size = np.nanmedian(values, axis=1) / 1e9
        print(f"{kind}: {len(quiet)} noise-only nights")
        for key, s_, v, k in sorted(zip(keys, size, var, n), key=lambda t: t[1]):
            print(f"  {key:<22} {s_:7.3f} s  noise {np.sqrt(v):.3f}  ({k} changes)")
        # var = a^2 + b^2 / size^2: least squares in (a^2, b^2), both at least 0
        design = np.stack([np.ones(len(size)), 1 / size ** 2], axis=1)
        (a2, b2), *_ = np.linalg.lstsq(design, var, rcond=None)
        a, b = np.sqrt(max(a2, 0.0)), np.sqrt(max(b2, 0.0))
        fits[kind] = (a, b)
        print(f"  prior: a = {a:.3f}, b = {b * 1000:.1f} ms")
    con.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
