"""Decode the same traces with this working tree and with another revision, and check that every table is the same.

    .venv/bin/python scripts/same_decode.py [--base REV] [--partition-bytes N,...] [--no-synth] [--keep DIR] [FILE ...]

For changes to the decoder that must not change what it writes (issue 31: a faster or reshaped decoder keeps
every output table). The base revision (``HEAD`` unless ``--base``) is exported with ``git archive`` into a
temporary directory and run with this checkout's virtual environment; both decode each input in one process
(``cluster.mode: synchronous``) at each ``--partition-bytes`` (default: 24 MiB, the default setting, and 1 MiB,
which cuts even the small inputs into many partitions and so sends rows through the buckets and joins).

Inputs: the ``.etl`` files named, or by default every ``.etl`` under ``../shared/fixtures`` (read in place) and
five synthesized traces that hold what no fixture has (``SYNTH``: plain, XPRESS, stack keys, 32-bit pointers,
stacks that vary as a real build's do; heap snapshots, heap and VirtualAlloc events in all of them). Tables are
compared with ``tests.conftest.assert_same_tables`` (same schema, same rows in any order, the run-specific columns
aside), and the manifests' table row counts and error counts too. Prints a line per input and setting and exits 1
when any differs or does not decode. ``--keep DIR`` keeps the base tree, the synthesized traces and the runs there
for the next check (the base tree's numba cache is compiled on its first use).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Synthesized inputs: name -> ``synth`` settings.
SYNTH = {
    "plain": dict(seed=11, size="24MB", cpus=4),
    "xpress": dict(seed=12, size="24MB", cpus=4, compress=True),
    "stack-keys": dict(seed=13, size="24MB", cpus=4, stack_caching=True),
    "ptr32": dict(seed=14, size="12MB", cpus=2, pointer_size=4, stack_caching=True),
    "varied": dict(seed=15, size="24MB", cpus=4, stack_variety=2000),
}


def decode(tree: Path, trace: Path, run: Path, partition_bytes: int) -> dict:
    """``bootprof decode`` of ``trace`` into ``run`` with the code of ``tree``; returns its manifest."""
    shutil.rmtree(run, ignore_errors=True)         # (else a decode found up to date would not run again)
    run.parent.mkdir(parents=True, exist_ok=True)
    cfg = run.parent / f"{run.name}.yaml"
    cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "decode": {"partition_bytes": partition_bytes}}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_DISABLE_JIT")}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--config", str(cfg), "decode", str(trace), "--run", str(run)],
                          cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{trace} with {tree}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return json.loads((run / "decoded" / "_manifest.json").read_text())


def export_revision(rev: str, work: Path) -> tuple[str, Path]:
    """The commit ``rev`` names, and its tree exported with ``git archive`` into ``work/base-<commit>`` (once: a tree
    already there is reused; an export cut short is never taken for one, it is made beside and renamed)."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    base = work / f"base-{commit[:12]}"
    if not base.exists():
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
        partial = base.with_name(base.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        partial.rename(base)
    return commit, base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--base", default="HEAD", help="the revision to compare with (HEAD)")
    ap.add_argument("--partition-bytes", type=lambda text: [int(x) for x in text.split(",")], default=[24 << 20, 1 << 20],
                    help="partition sizes to decode at, comma-separated (25165824,1048576)")
    ap.add_argument("--no-synth", action="store_true", help="only the fixtures (or the files named)")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary directory)")
    args = ap.parse_args()

    from tests.conftest import assert_same_tables

    work = args.keep or Path(tempfile.mkdtemp(prefix="same-decode-"))
    work.mkdir(parents=True, exist_ok=True)
    commit, base = export_revision(args.base, work)     # (kept with --keep: its numba cache is compiled once)
    inputs = list(args.files) or sorted((ROOT.parent / "shared" / "fixtures").rglob("*.etl"))
    if not args.files and not args.no_synth:
        from pipeline import synth
        from pipeline.config import SynthConfig
        for name, settings in SYNTH.items():
            trace = work / "synth" / name / "trace.etl"
            if not trace.exists():
                synth.run(trace, SynthConfig(**settings))
            inputs.append(trace)
    failed = 0
    for i, trace in enumerate(inputs):
        for pb in args.partition_bytes:
            t0 = time.time()
            runs = {side: work / "runs" / f"{i:02d}-{pb}-{side}" for side in ("base", "here")}
            try:
                manifests = {side: decode(tree, trace, runs[side], pb) for side, tree in (("base", base), ("here", ROOT))}
                tables = assert_same_tables(runs["base"] / "decoded", runs["here"] / "decoded")
                counts = [(m["tables"], m.get("errors")) for m in manifests.values()]
                assert counts[0] == counts[1], f"manifest counts differ: {counts}"
                print(f"same     {trace}  partition_bytes={pb}: {tables} tables, "
                      f"{sum(manifests['here']['tables'].values()):,} rows ({time.time() - t0:.1f} s)", flush=True)
            except (AssertionError, RuntimeError) as e:
                failed += 1
                print(f"DIFFERS  {trace}  partition_bytes={pb}: {str(e)[:2000]}", flush=True)
    print(f"{len(inputs)} inputs x {len(args.partition_bytes)} settings against {args.base} ({commit[:12]}): "
          f"{'all the same' if not failed else f'{failed} differ'}" + (f" (work: {work})" if args.keep else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
