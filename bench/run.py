"""``make bench``: run every benchmark script and merge their results.

Harness convention (every ``bench/bench_<name>.py`` follows it):

* It is a standalone script: ``python bench/bench_<name>.py [its own flags]`` with defaults that keep
  ``make bench`` reasonable on a 2-core machine (minutes, not hours); bigger runs sit behind flags or
  environment variables that the script documents in its docstring.
* Inputs are deterministic (fixed seeds, real fixtures); large inputs go to ``bench/out/`` (gitignored)
  and may be reused by later runs.
* It prints its own table and writes one JSON section to ``bench/out/<name>.json``. If the section has
  ``"rows"`` (a list of flat dicts), this runner prints them as a table; other top-level scalars are
  printed as ``key: value``.
* Exit status 0 on success. Targets are reported in the table ("met" / "NOT met"), never asserted.

This runner calls each script in a subprocess (so memory measurements are not polluted and a crash of
one benchmark does not hide the others), then writes ``bench/results.json`` = ``{name: section}`` and
prints a combined table. ``python bench/run.py [name ...]`` runs only the named benchmarks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def print_section(name: str, section: dict) -> None:
    print(f"\n== {name} ==")
    for key, value in section.items():
        if key != "rows" and not isinstance(value, (dict, list)):
            print(f"{key}: {_fmt(value)}")
    rows = section.get("rows") or []
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))))


def main(argv: list[str]) -> int:
    scripts = sorted(BENCH.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if s.stem[len("bench_"):] in argv]
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    failed = []
    for script in scripts:
        name = script.stem[len("bench_"):]
        section_path = OUT / f"{name}.json"
        section_path.unlink(missing_ok=True)
        print(f"\n>>> {script.relative_to(BENCH.parent)}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, str(script)], cwd=BENCH.parent).returncode
        elapsed = round(time.perf_counter() - t0, 1)
        if rc != 0 or not section_path.exists():
            failed.append(name)
            results[name] = {"error": f"exit status {rc}", "elapsed_s": elapsed}
            continue
        section = json.loads(section_path.read_text())
        section.setdefault("elapsed_s", elapsed)
        results[name] = section
    (BENCH / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("\n################ combined results (bench/results.json) ################")
    for name, section in results.items():
        print_section(name, section)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
