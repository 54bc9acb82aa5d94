"""A busy CI runner's faults, at random moments, for a time budget: every end state is checked. A development tool
(``make fuzz`` runs it after ``scripts/fuzz.py``); the suite keeps one test per fault (``tests/test_ci_faults.py``).

    .venv/bin/python scripts/fuzz_faults.py [--budget S] [--seed N] [--faults two-jobs,signal,replaced,damage]

Faults, one per round, chosen at random:

* ``two-jobs``: two ``bootprof run`` of two different builds' self-profiles into one ``--run``, the second started
  0-3 s after the first. Both must exit 0; the run's manifests must chain up to one input (``read_manifest`` of
  every stage) and the warehouse's row of the run must carry that input's hash.
* ``signal``: SIGINT or SIGTERM to a job 0.2-8 s in. Exit 0, 130 or 143, one line, no traceback, no process of it
  left; the job run again must finish with every stage's manifest readable.
* ``replaced``: a synthesized trace replaced (renamed over) 0-3 s into its decode. Exit 2 naming the change, or exit
  0 with the hash and row counts of an undisturbed decode of one of the two files (the replacement came before the
  decode opened it, or after it ended).
* ``damage``: 4 KB of garbage at a random offset of a copy of a warehouse; ``query``, ``compare``, ``verify`` and
  ``ingest`` on it must exit 0, 1 or 2 with no traceback.

Prints a line per bad end (fault, seed, what), a table per fault (tries, exit 0, clear errors, tracebacks, hangs,
wrong end states) and exits 1 if any end was bad. A round is reproduced with ``--seed S --rounds 1``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT.parent / "shared" / "fixtures"
PROFILES = [FIXTURES / "selfprofile" / "workspace-clean", FIXTURES / "selfprofile" / "workspace-incremental"]
HANG_S = 300


def bootprof(*args, config: Path, wait: bool = True, **kw):
    cmd = [sys.executable, "-m", "pipeline", "--config", str(config), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    return finish(proc) if wait else proc


def finish(proc) -> tuple[int | None, str]:
    """(exit status, stderr); None when it hung (killed after HANG_S)."""
    try:
        _, err = proc.communicate(timeout=HANG_S)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, ""


def two_jobs(rng: random.Random, work: Path, config: Path) -> tuple[str, str]:
    from pipeline.runs import read_manifest

    run = work / "run"
    first = bootprof("run", "jobs/single-trace.yaml", "--trace", str(PROFILES[0]), "--run", str(run), config=config,
                     wait=False)
    time.sleep(rng.uniform(0, 3))
    second = bootprof("run", "jobs/single-trace.yaml", "--trace", str(PROFILES[1]), "--run", str(run), config=config,
                      wait=False)
    ends = [finish(first), finish(second)]
    for code, err in ends:
        if code is None:
            return "hang", "a job did not end"
        if "Traceback" in err:
            return "traceback", err.strip().splitlines()[-1]
        if code != 0:
            return "wrong", f"exit {code}: {err.strip()[-300:]}"
    try:
        decoded = read_manifest(run, "decoded")
        for stage in ("symbolized", "aggregated", "report"):
            if (run / stage).exists():
                read_manifest(run, stage)
    except Exception as exc:  # noqa: BLE001 - any error here is a mixed run
        return "wrong", f"manifests do not chain: {exc}"
    dirs = {os.path.dirname(i["path"]) for i in decoded["inputs"]}
    if len(dirs) != 1:
        return "wrong", f"decoded from {sorted(dirs)}"
    import duckdb

    shas = sorted(i["sha256_tree"] for i in decoded["inputs"])
    con = duckdb.connect(str(work / "wh.duckdb"), read_only=True)
    try:
        (sha,) = con.execute("SELECT trace_sha256 FROM runs WHERE run_id = 'run'").fetchone()
    finally:
        con.close()
    if sha != hashlib.sha256("".join(shas).encode()).hexdigest():
        return "wrong", "the warehouse's run is of another input"
    return "ok", ""


def a_signal(rng: random.Random, work: Path, config: Path) -> tuple[str, str]:
    import psutil

    from pipeline.runs import read_manifest

    run = work / "run"
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    args = ("run", "jobs/single-trace.yaml", "--trace", str(rng.choice(PROFILES)), "--run", str(run))
    proc = bootprof(*args, config=config, wait=False)
    time.sleep(rng.uniform(0.2, 8))
    kids = []
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    proc.send_signal(sig)
    code, err = finish(proc)
    if code is None:
        return "hang", f"{sig.name}: did not end"
    if "Traceback" in err:
        return "traceback", err.strip().splitlines()[-1]
    if code in (-signal.SIGINT, -signal.SIGTERM) and not kids and not err.strip():
        code = 128 + sig     # (it came while Python started, before bootprof had a handler or a child: nothing to end)
    if code not in (0, 130, 143):
        return "wrong", f"{sig.name}: exit {code}: {err.strip()[-300:]}"
    _, alive = psutil.wait_procs(kids, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    if alive:
        for p in alive:
            p.kill()
        return "wrong", f"{sig.name}: {len(alive)} processes left behind"
    again, err = bootprof(*args, config=config)
    if again != 0:
        return "wrong", f"the job again: exit {again}: {err.strip()[-300:]}"
    try:
        for stage in ("decoded", "symbolized", "aggregated", "report"):
            read_manifest(run, stage)
    except Exception as exc:  # noqa: BLE001
        return "wrong", f"after the rerun: {exc}"
    return ("ok" if code == 0 else "clear"), ""


def replaced(rng: random.Random, work: Path, config: Path) -> tuple[str, str]:
    from pipeline.runs import read_manifest

    traces = work.parent / "traces"
    if not traces.exists():
        traces.mkdir()
        for name, seed in (("a.etl", 1), ("b.etl", 2)):
            subprocess.run([sys.executable, "-m", "pipeline", "synth", "--out", str(traces / name), "--size", "40MB",
                            "--seed", str(seed)], cwd=ROOT, check=True, capture_output=True)
    trace = work / "t.etl"
    shutil.copyfile(traces / "a.etl", trace)
    proc = bootprof("decode", str(trace), "--run", str(work / "run"), config=config, wait=False)
    time.sleep(rng.uniform(0, 3))
    shutil.copyfile(traces / "b.etl", work / "b.etl")
    os.replace(work / "b.etl", trace)
    code, err = finish(proc)
    if code is None:
        return "hang", "decode did not end"
    if "Traceback" in err:
        return "traceback", err.strip().splitlines()[-1]
    if code == 2 and "changed while it was decoded" in err:
        return "clear", ""
    if code != 0:
        return "wrong", f"exit {code}: {err.strip()[-300:]}"
    # (replaced before the decode opened it, the decode is of the new file: what matters is that the hash and the
    # tables are of one file, the same as a decode of that file alone)
    made = read_manifest(work / "run", "decoded")
    clean = _clean_decodes(traces, config)
    got = (made["inputs"][0]["sha256_tree"], made["tables"])
    if got not in clean.values():
        return "wrong", "exit 0 with tables or a hash of no one file"
    return "ok", ""


_clean: dict[str, tuple] = {}


def _clean_decodes(traces: Path, config: Path) -> dict[str, tuple]:
    """(hash, row counts) of an undisturbed decode of each synthesized trace."""
    from pipeline.runs import read_manifest

    for name in ("a.etl", "b.etl"):
        if name not in _clean:
            run = traces / f"run-{name}"
            shutil.rmtree(run, ignore_errors=True)
            code, err = bootprof("decode", str(traces / name), "--run", str(run), config=config)
            if code != 0:
                raise RuntimeError(err)
            made = read_manifest(run, "decoded")
            _clean[name] = (made["inputs"][0]["sha256_tree"], made["tables"])
    return _clean


def damage(rng: random.Random, work: Path, config: Path) -> tuple[str, str]:
    base = work.parent / "warehouse"
    if not base.exists():
        base.mkdir()
        cfg = base / "w.yaml"
        cfg.write_text(json.dumps({"cluster": {"mode": "synchronous"}, "warehouse": {"path": str(base / "wh.duckdb")}}))
        for k, trace in enumerate(PROFILES):
            code, err = bootprof("run", "jobs/nightly.yaml", "--trace", str(trace), "--run", str(base / f"nightly-{k}"),
                                 config=cfg)
            if code != 0:
                raise RuntimeError(err)
    db = work / "wh.duckdb"
    data = bytearray((base / "wh.duckdb").read_bytes())
    at = rng.randrange(0, len(data) - 4096)
    data[at:at + 4096] = rng.randbytes(4096)
    db.write_bytes(bytes(data))
    shutil.copyfile(base / "wh.duckdb.journal.jsonl", work / "wh.duckdb.journal.jsonl")
    codes = []
    for args in (["query", "SELECT count(*) FROM run_metrics"], ["compare", "--run", "nightly-1"], ["verify"],
                 ["ingest", "--run", str(base / "nightly-1")]):
        code, err = bootprof("warehouse", "--db", str(db), *args, config=config)
        if code is None:
            return "hang", f"warehouse {args[0]} (offset {at})"
        if "Traceback" in err:
            return "traceback", f"warehouse {args[0]} (offset {at}): {err.strip().splitlines()[-1]}"
        if code not in (0, 1, 2):
            return "wrong", f"warehouse {args[0]}: exit {code}"
        codes.append(code)
    return ("ok" if set(codes) <= {0} else "clear"), ""


FAULTS = {"two-jobs": two_jobs, "signal": a_signal, "replaced": replaced, "damage": damage}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=600, help="seconds to spend (default 600)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=10**9, help="at most this many rounds")
    ap.add_argument("--faults", default=",".join(FAULTS), help="which faults (default: all)")
    args = ap.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        ap.error(f"unknown faults: {', '.join(sorted(unknown))}")
    table: dict[str, Counter] = defaultdict(Counter)
    bad = 0
    end = time.monotonic() + args.budget
    with tempfile.TemporaryDirectory(prefix="fuzz-faults-") as tmp:
        config = Path(tmp) / "c.yaml"
        config.write_text(json.dumps({"cluster": {"mode": "synchronous"},
                                      "warehouse": {"path": str(Path(tmp) / "round" / "wh.duckdb")}}))
        for k in range(args.rounds):
            if time.monotonic() >= end:
                break
            seed = args.seed + k
            rng = random.Random(seed)
            fault = rng.choice(faults)
            work = Path(tmp) / "round"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            outcome, why = FAULTS[fault](rng, work, config)
            table[fault]["tries"] += 1
            table[fault][outcome] += 1
            if outcome not in ("ok", "clear"):
                bad += 1
                print(f"{outcome.upper():<9} {fault} seed {seed}: {why}", flush=True)
    print(f"{'fault':<10} {'tries':>5} {'exit 0':>6} {'clear':>5} {'tracebacks':>10} {'hangs':>5} {'wrong':>5}")
    for fault, c in sorted(table.items()):
        print(f"{fault:<10} {c['tries']:>5} {c['ok']:>6} {c['clear']:>5} {c['traceback']:>10} {c['hang']:>5} "
              f"{c['wrong']:>5}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
