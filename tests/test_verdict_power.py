"""The nightly verdict on simulated histories with known answers (``tests/helpers/histories.py``): a small version of
``bench/bench_verdicts.py``, which runs the issue's full simulation (100 histories of 30 nights a condition) and
checks the targets themselves. Here 30 histories, one seed: the bounds leave room for the smaller sample (the
full run's rates are in ``bench/HISTORY.md``). Then ``warehouse replay`` and ``warehouse calibrate`` on a warehouse
that holds such a history."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pipeline.warehouse.history import judge_history
from tests.conftest import ROOT
from tests.helpers.histories import A, B, Sim, history, scenarios


def test_the_verdict_has_the_power_and_the_quiet_it_promises():
    got = scenarios(np.random.default_rng(11), 30, judge_history)
    print(json.dumps(got, indent=1))
    assert got["noise_red"] <= 0.02 and got["noise_red_2k"] <= 0.05 and got["noise_red_t3"] <= 0.04
    assert got["one_2x_red"] >= 0.9 and got["one_2x_alone"] >= 0.95
    assert got["lasting_1_5x_red_by_2nd"] >= 0.7
    assert got["absent_back_red"] <= 0.02
    assert got["everything_2x_red_by_2nd"] >= 0.9
    assert got["creep_flagged"] >= 0.7


def test_judge_history_reads_a_table_and_says_each_verdict():
    """A pyarrow Table or a dict of columns; new, gone and a crate back from a night away."""
    import pyarrow as pa

    rng = np.random.default_rng(5)
    _, cols = history(rng, Sim(nights=16, crates=12))
    last = 15
    keep = [i for i in range(len(cols["night"])) if not (cols["key"][i] == "crate03" and cols["night"][i] == last)
            and not (cols["key"][i] == "crate04" and cols["night"][i] == last - 1)]
    cols = {c: [v[i] for i in keep] for c, v in cols.items()}
    cols["night"].append(last), cols["kind"].append("crate_wall_ns"), cols["key"].append("newcrate")
    cols["value"].append(3e9)
    for given in (cols, pa.table(cols)):
        rows = {r["key"]: r for r in judge_history(given).to_pylist() if r["family"] == "crate time"}
        assert rows["crate03"]["verdict"] == "gone" and rows["newcrate"]["verdict"] == "new"
        assert rows["crate04"]["verdict"] != "regression"          # (back from a night away)
        assert set(judge_history(given).column_names) == {"family", "key", "verdict", "change", "z", "kind"}


@pytest.fixture(scope="module")
def simulated_warehouse(tmp_path_factory):
    """A warehouse holding one simulated history of 30 nights (40 crates; crate 7, of 2 s or more, twice as slow on
    night 25), written as ingestion writes metrics."""
    from pipeline import warehouse

    from tests.helpers.histories import sizes

    db = tmp_path_factory.mktemp("simulated") / "wh.duckdb"
    big = int(np.flatnonzero(sizes(np.random.default_rng(21), 40) >= 2.0)[0])
    size, cols = history(np.random.default_rng(21), Sim(),
                         factor=lambda n, s: np.where((np.arange(len(s)) == big) & (n == 25), 2.0, 1.0))
    con = warehouse.connect(db)
    try:
        for night in range(30):
            con.execute("INSERT INTO runs (run_id, job, workload, run_time) VALUES (?, 'nightly', 'w', ?::TIMESTAMP)",
                        [f"night-{night:02d}", "2026-01-01 00:00:00"])
            con.execute("UPDATE runs SET run_time = run_time + to_days(?) WHERE run_id = ?", [night, f"night-{night:02d}"])
        con.executemany("INSERT INTO run_metrics VALUES (?, ?, ?, ?, NULL)",
                        [[f"night-{n:02d}", k, key, v] for n, k, key, v in zip(cols["night"], cols["kind"], cols["key"],
                                                                                   cols["value"])])
    finally:
        con.close()
    return db, big


def bootprof(*args):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_replay_names_the_night_and_the_crate(simulated_warehouse):
    from pipeline.warehouse.replay import replay

    db, big = simulated_warehouse
    nights = replay(db)
    red = [(n["run_id"], n["regression"]) for n in nights if n["verdict"] == "regression"]
    assert ("night-25", [f"crate time crate{big:02d}"]) in red, red
    assert len(red) <= 2, red
    proc = bootprof("warehouse", "--db", str(db), "replay")
    assert proc.returncode == 0 and "night-25" in proc.stdout and f"crate time crate{big:02d}" in proc.stdout, \
        proc.stderr
    assert "29 nights judged under the current settings" in proc.stdout


def test_calibrate_recovers_the_noise_it_was_made_with(simulated_warehouse):
    from pipeline.warehouse.replay import calibrate

    db, _ = simulated_warehouse
    fit = calibrate(db)
    a, b = fit["prior"]["crate time"]
    assert abs(a - A) / A < 0.25 and abs(b / 1e9 - B) / B < 0.6, fit
    assert fit["nights"] == 30 and fit["crates"] == 40
    proc = bootprof("warehouse", "--db", str(db), "calibrate")
    assert proc.returncode == 0 and "warehouse:\n  verdict:\n    prior:\n      build time: [" in proc.stdout, proc.stderr
    assert "fitted to 30 nights of 1 job/workload series, 40 crates" in proc.stdout


def test_the_configs_verdict_settings_are_the_functions_own():
    """The settings the simulation measured are those a job runs with: the config's defaults are judge_history's."""
    from dataclasses import asdict

    from pipeline.config import Config
    from pipeline.warehouse.history import Settings

    assert asdict(Settings.of(Config().warehouse.verdict.model_dump())) == asdict(Settings())


def test_everything_slower_is_said_in_its_own_words(tmp_path):
    """Every crate twice as slow on the last night (a slower runner: the query counts stay): the comparison says so in
    a family of its own, which its markdown and page name (a real history's night once failed the job with a
    KeyError there)."""
    from pipeline import warehouse
    from pipeline.compare import verdict

    db = tmp_path / "wh.duckdb"
    _, cols = history(np.random.default_rng(8), Sim(nights=16), factor=lambda n, s: np.full(len(s), 2.0 if n == 15 else 1.0))
    con = warehouse.connect(db)
    try:
        for night in range(16):
            con.execute("INSERT INTO runs (run_id, job, workload, run_time) VALUES (?, 'nightly', 'w', "
                        "'2026-01-01'::TIMESTAMP + to_days(?))", [f"night-{night:02d}", night])
        con.executemany("INSERT INTO run_metrics VALUES (?, ?, ?, ?, NULL)",
                        [[f"night-{n:02d}", k, key, v] for n, k, key, v in zip(cols["night"], cols["kind"], cols["key"],
                                                                                   cols["value"])])
    finally:
        con.close()
    c = warehouse.compare(db, "night-15")
    every = [f for f in c["families"] if f["family"] == "everything"]
    assert [(f["key"], f["verdict"]) for f in every] == [("machine", "suspect")], every    # (fails nothing)
    assert "every crate at once (the same work: the machine)" in verdict.markdown(c)
    assert "every crate at once" in verdict.html_page(c, [], [])
    assert not [f for f in c["families"] if f["family"] == "crate time" and f["verdict"] == "regression"]
