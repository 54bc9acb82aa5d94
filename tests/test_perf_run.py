"""A Linux perf run beyond its decode: packed and analyzed elsewhere, crates and queries from the self-profiles of
its rustc processes (the workspace's crates and those from Debian's registry), beside Windows runs in one warehouse.
The inputs are real cargo builds, debug and release, recorded here with ``bootprof capture --perf --self-profile``
(``tests/helpers/perfbuild.py``, shared with ``test_perf_decode.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pyarrow.parquet as pq
import pytest

from tests.helpers import perfbuild

pytestmark = pytest.mark.skipif(not perfbuild.have_tools(), reason="needs perf and cargo on PATH")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return perfbuild.recorded(tmp_path_factory)


def _tables(run, stage):
    return {p.name: pq.read_table(p) for p in sorted((run / stage).glob("*.parquet"))}


#: Columns that name where an input file lies (the run directory differs); columns ending ``_s`` are how long
#: something took.
WHERE = ("file", "path")


def _rows(table) -> list[str]:
    drop = [c for c in table.column_names if c in WHERE or c.endswith("_s")]
    return sorted(repr(r) for r in table.drop_columns(drop).to_pylist())


def test_a_packed_perf_run_analyzes_to_the_same_tables(recorded, tmp_path_factory, tmp_path):
    """``bootprof pack`` takes the perf.data file and the self-profiles; ``bootprof run --trace PACK`` elsewhere
    unpacks them and gives the tables the captured run gives."""
    pack = tmp_path / "run.zip"
    subprocess.run([sys.executable, "-m", "pipeline", "pack", str(recorded), str(pack)], check=True,
                   capture_output=True, text=True)
    with zipfile.ZipFile(pack) as z:
        names = set(z.namelist())
        listed = {f["path"] for f in json.loads(z.read("bootprof-pack.json"))["files"]}
        size = z.getinfo("input/perf.data").file_size
    assert "input/perf.data" in names and "capture/_manifest.json" in names
    assert any(n.startswith("selfprofile/") and n.endswith(".mm_profdata") for n in names)
    assert names - {"bootprof-pack.json"} == listed
    assert size == (recorded / "input" / "perf.data").stat().st_size

    there = perfbuild.analyze(tmp_path / "elsewhere", tmp_path, pack)
    assert (there / "input" / "perf.data").read_bytes() == (recorded / "input" / "perf.data").read_bytes()
    manifest = json.loads((there / "capture" / "_manifest.json").read_text())
    assert manifest["recording"]["path"] == str(there / "input" / "perf.data")
    here = perfbuild.analyzed(tmp_path_factory)
    for stage in ("decoded", "aggregated"):
        ours, theirs = _tables(here, stage), _tables(there, stage)
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert ours[name].schema == theirs[name].schema, (stage, name)
            assert _rows(ours[name]) == _rows(theirs[name]), (stage, name)
    assert {"samples.parquet", "self_profiles.parquet", "query_events.parquet"} <= _tables(here, "decoded").keys()
    assert (there / "report" / "index.html").is_file()


def test_a_pack_with_two_recordings_or_a_stray_input_is_refused(tmp_path):
    """A perf.data member passes the checks every member passes; a pack holding both kinds of recording, or a file
    beside them in ``input/``, is not a capture."""
    from pipeline.capture.bundle import PACK_MANIFEST, unpack_into, unpacked
    from pipeline.errors import BootprofError, InputError

    def make(name, members):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(PACK_MANIFEST, json.dumps({"format": 1, "files": [{"path": n, "size": len(d)}
                                                                         for n, d in members.items()]}))
            for n, d in members.items():
                z.writestr(n, d)
        return path

    manifest = json.dumps({"recording": {"tool": "perf", "path": "/elsewhere/input/perf.data"}}).encode()
    both = make("both.zip", {"capture/_manifest.json": manifest, "input/perf.data": b"PERFILE2",
                             "input/trace.etl": b"x"})
    with pytest.raises(BootprofError, match="an ETL trace and a perf.data file"):
        unpacked([both], tmp_path / "r1")
    for stray in ("input/perf.data.old", "input/perf.partial.data", "input/perf"):
        with pytest.raises(InputError, match="not part of a capture"):
            unpack_into(make("stray.zip", {"capture/_manifest.json": manifest, stray: b"x"}), tmp_path / "r2")
    assert not (tmp_path / "r2" / "input").exists()


@pytest.mark.parametrize("profile", perfbuild.PROFILES)
def test_crates_and_queries_of_a_perf_run(profile, tmp_path_factory):
    """``capture --perf --self-profile``: each rustc process is named by its self-profile (command line, so crate),
    CPU by crate counts the samples of those pids (the crates from Debian's registry among them), and the samples are
    attributed to the queries running on their threads (the sample clock put on the wall clock by perf's
    CLOCK_DATA); in the debug build and the release one."""
    import duckdb

    run = perfbuild.analyzed(tmp_path_factory, profile, perfbuild.CALL_GRAPH_OF[profile])
    capture = json.loads((run / "capture" / "_manifest.json").read_text())
    assert capture["recording"]["clock"] == "monotonic" and len(capture["files"]) >= 4
    perf = json.loads((run / "decoded" / "_manifest.json").read_text())["perf"]
    profiles = pq.read_table(run / "decoded" / "self_profiles.parquet").to_pylist()
    ok = [p for p in profiles if p["status"] == "ok"]
    assert {p["crate"] for p in ok} >= {"tiny", "small", "app", "build_script_build", *perfbuild.DEPS}
    assert perf["command_lines_from_profiles"] == len(ok) and perf["profiles_unmatched"] == 0
    origin = pq.read_table(run / "decoded" / "perf_file.parquet").column("origin_unix_ns")[0].as_py()
    assert origin is not None and abs(origin - min(p["start_time_ns"] for p in ok)) < 60e9

    procs = pq.read_table(run / "decoded" / "processes.parquet").to_pylist()
    named = {p["pid"]: p["command_line"] for p in procs if p["command_line"]}
    assert named == {p["pid"]: p["cmd"].rstrip() for p in ok}

    # CPU by crate: the samples of each rustc pid its self-profile names, crate by crate
    per_pid = duckdb.sql(f"SELECT pid, count(*) FROM read_parquet('{run}/decoded/samples.parquet') GROUP BY pid"
                         ).fetchall()
    per_pid = dict(per_pid)
    want = {}
    for p in ok:
        want[p["crate"]] = want.get(p["crate"], 0) + per_pid.get(p["pid"], 0)
    by_crate = {r["crate"]: r["samples"] for r in pq.read_table(run / "aggregated" / "cpu_by_crate.parquet").to_pylist()}
    assert by_crate == {c: n for c, n in want.items() if n}
    assert sum(by_crate.values()) > 100 and set(perfbuild.DEPS) <= by_crate.keys(), by_crate

    # CPU by query: every sample of a profiled rustc process attributed, most inside a query
    by_query = pq.read_table(run / "aggregated" / "cpu_by_query.parquet").to_pylist()
    build = [r for r in by_query if r["scope"] == "build"]
    assert sum(r["samples"] for r in build) == sum(by_crate.values())
    inside = sum(r["samples"] for r in build if r["attribution"] == "query")
    assert inside >= 0.6 * sum(by_crate.values()), (inside, sum(by_crate.values()))
    labels = {r["label"] for r in build if r["attribution"] == "query"}
    assert {"typeck", "LLVM_passes"} & labels or {"codegen_module"} & labels, sorted(labels)[:20]

    # the report: the crates, the queries and what they burn CPU in, the critical path through the crates
    page = (run / "report" / "index.html").read_text(encoding="utf-8")
    for section in ('id="queries"', 'id="query-cpu"'):
        assert section in page
    assert f"{len(ok)} rustc processes are named by their self-profile" in page
    # (shown when the path has two crates or more: a library, then app, which takes it with --extern)
    assert "critical path (from their command lines' <code>--extern</code>)" in page


def test_a_profile_names_the_instance_of_its_pid_alive_at_its_start():
    from pipeline.decode.perf.commands import match

    procs = [{"pid": 5, "start_ns": 0, "end_ns": 100}, {"pid": 5, "start_ns": 200, "end_ns": None},
             {"pid": 6, "start_ns": None, "end_ns": 50}]
    origin = 1_000_000
    profiles = [{"pid": 5, "cmd": "rustc --crate-name b ", "start_time_ns": origin + 250},
                {"pid": 6, "cmd": "rustc --crate-name c ", "start_time_ns": None},
                {"pid": 7, "cmd": "rustc --crate-name d ", "start_time_ns": origin}]
    assert match(procs, profiles, origin) == ({1: "rustc --crate-name b", 2: "rustc --crate-name c"}, 1)
    # (without perf's clock a reused pid cannot be told apart: counted, not guessed)
    assert match(procs, profiles[:1], None) == ({}, 1)


def test_a_linux_and_a_windows_run_in_one_warehouse(recorded, tmp_path, capsys):
    """A perf run of the fixtures' cargo workspace beside a Windows run (an ETL fixture trace with the same
    workspace's self-profiles, recorded by rustc 1.95) in one warehouse: each labelled with its platform, one job and
    workload (the same crates), and ``warehouse compare`` gives the crates' and queries' differences and says the
    runs were recorded on different platforms."""
    from pipeline.cli import main as cli_main
    from pipeline.warehouse import compare
    from tests.conftest import fixture_path
    from tests.helpers.selfprofile import workspace_copy
    from tests.realbuild import rust_env

    db = tmp_path / "wh.duckdb"
    # Windows: the fixture trace (its start: 2019) and the fixture self-profiles, through every stage
    windows = perfbuild.analyze(tmp_path / "xplat-20190101-000000", tmp_path, fixture_path("etl/airbus/AMSITrace.etl"),
                                fixture_path("selfprofile/workspace-clean"), db=db)
    # Linux: the same workspace built here under capture --perf --self-profile
    ws = workspace_copy(tmp_path)
    linux = tmp_path / "xplat-20260101-000000"
    subprocess.run([sys.executable, "-m", "pipeline", "capture", "--perf", "--self-profile", "--run", str(linux), "--",
                    "cargo", "build", "--offline", "--quiet"], cwd=ws, env=rust_env(), check=True,
                   stdout=subprocess.DEVNULL)
    perfbuild.analyze(linux, tmp_path, db=db)

    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT run_id, job, workload, labels['platform'] FROM runs ORDER BY run_time").fetchall()
    con.close()
    assert [(r[0], r[3]) for r in runs] == [(windows.name, "windows"), (linux.name, "linux")]
    assert runs[0][1:3] == runs[1][1:3] and runs[0][2].startswith("build of 3 crates")

    c = compare(db, linux.name)
    assert c["baseline_run_id"] == windows.name
    assert "recorded on linux, the baseline on windows" in c["reason"]
    rows = c["headline"] + c["changes"]
    crates = {r["key"] for r in rows if r["kind"] in ("query_crate_ns", "crate_wall_ns")}
    assert crates == {"app", "util", "mathx"}
    queries = {r["key"]: r for r in rows if r["kind"] == "query_self_ns"}
    assert {"typeck", "mir_borrowck", "LLVM_passes"} <= queries.keys()
    assert all(r["baseline_value"] > 0 and r["value"] > 0 for k, r in queries.items() if k in ("typeck", "LLVM_passes"))
    assert {f["key"] for f in c["families"] if f["family"] == "crate time"} >= {"app", "util", "mathx"}

    capsys.readouterr()
    code = cli_main(["warehouse", "--db", str(db), "compare", "--run", linux.name, "--all", "--limit", "100000"])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    assert f"vs baseline {windows.name}" in out and "recorded on linux, the baseline on windows" in out
    assert "mathx" in out and "typeck" in out
