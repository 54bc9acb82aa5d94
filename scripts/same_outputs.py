"""Aggregate and report the same runs with this working tree and with another revision, and check that every
aggregated table and every report export is the same.

    .venv/bin/python scripts/same_outputs.py [--base REV] [--keep DIR] RUN_DIR [RUN_DIR ...]

For changes to the stages after decode that must not change what they write (issue 56: a faster job keeps its
answers). Each run must hold ``decoded/`` (and ``symbolized/``, when it was symbolized): both are linked, not copied,
into two runs under the work directory, which the base revision (``HEAD`` unless ``--base``, exported with ``git
archive``) and this tree then aggregate and report with this checkout's virtual environment. Aggregated tables are
compared row for row in the order written (the stage orders every table); report files byte for byte, but
``index.html`` and ``_manifest.json`` (they carry the time and the run's path). Prints a line per run with each
side's seconds and exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from same_decode import export_revision  # noqa: E402
#: Report files that carry the time or the run's path.
REPORT_OWN = {"index.html", "_manifest.json"}


def stages(tree: Path, run: Path) -> dict[str, float]:
    """``bootprof aggregate`` then ``report`` on ``run`` with the code of ``tree``: seconds of each."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_DISABLE_JIT")}
    took = {}
    for stage in ("aggregate", "report"):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pipeline", stage, "--run", str(run)], cwd=tree, env=env,
                              capture_output=True, text=True)
        took[stage] = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{stage} of {run} with {tree}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return took


def linked_copy(src: Path, dst: Path) -> None:
    """``dst`` with ``src``'s decoded/ and symbolized/, their files hard-linked (read only by the stages)."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for stage in ("decoded", "symbolized"):
        if (src / stage).is_dir():
            shutil.copytree(src / stage, dst / stage, copy_function=os.link)


def differences(a: Path, b: Path) -> list[str]:
    import pyarrow.parquet as pq

    out = []
    names = sorted(p.name for p in (a / "aggregated").glob("*.parquet"))
    if names != sorted(p.name for p in (b / "aggregated").glob("*.parquet")):
        out.append("aggregated/: not the same tables")
    for name in names:
        ta, tb = pq.read_table(a / "aggregated" / name), pq.read_table(b / "aggregated" / name)
        if ta.schema != tb.schema or not ta.equals(tb):
            out.append(f"aggregated/{name}")
    files = sorted(str(p.relative_to(a / "report")) for p in (a / "report").rglob("*") if p.is_file())
    if files != sorted(str(p.relative_to(b / "report")) for p in (b / "report").rglob("*") if p.is_file()):
        out.append("report/: not the same files")
    for name in files:
        if Path(name).name not in REPORT_OWN and (a / "report" / name).read_bytes() != (b / "report" / name).read_bytes():
            out.append(f"report/{name}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--base", default="HEAD", help="the revision to compare with (HEAD)")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary directory)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="same-outputs-"))
    work.mkdir(parents=True, exist_ok=True)
    _, base = export_revision(args.base, work)
    failed = 0
    try:
        for i, run in enumerate(args.runs):
            sides = {}
            for side, tree in (("base", base), ("this", ROOT)):
                sides[side] = work / f"{i}-{run.name}-{side}"
                linked_copy(run.resolve(), sides[side])
            took = {side: stages(tree, sides[side]) for side, tree in (("base", base), ("this", ROOT))}
            diff = differences(sides["base"], sides["this"])
            failed += bool(diff)
            print(f"{'DIFFERS' if diff else 'same   '} {run}  (aggregate, report: base "
                  f"{took['base']['aggregate']:.2f}, {took['base']['report']:.2f} s; this "
                  f"{took['this']['aggregate']:.2f}, {took['this']['report']:.2f} s)"
                  + "".join(f"\n    {d}" for d in diff), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
