"""Self-profiles joined to an ETL trace's processes by pid, command line and start time.

No ETL trace of a rustc build exists among the fixtures, so the test writes the ETL decoder's
``processes`` and ``trace`` tables (its documented columns) next to real decoded self-profiles.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import fixture_path

FILETIME_UNIX_EPOCH = 116_444_736_000_000_000


def test_join_by_pid_command_line_and_time(tmp_path, dask_pool):
    from pipeline import aggregate, decode
    from pipeline.config import Config
    from pipeline.runs import read_table

    run = tmp_path / "run"
    config = Config()
    decode.run(run, config, dask_pool, inputs=[fixture_path("selfprofile/workspace-clean")])
    files = {f["crate"]: f for f in read_table(run, "decoded", "self_profiles").to_pylist() if f["status"] == "ok"}
    # The trace started about 5 s before util, on a FILETIME tick (100 ns).
    trace_start_unix_ns = (files["util"]["start_time_ns"] - 5_000_000_000) // 100 * 100

    def rel(unix_ns):  # ETL process times are ns since the trace start
        return unix_ns - trace_start_unix_ns

    def cmd(crate):
        return f'"C:\\\\rust\\\\bin\\\\rustc.exe" --crate-name {crate} --edition=2021 {crate}\\\\src\\\\lib.rs'

    app, mathx, util = files["app"], files["mathx"], files["util"]
    processes = [
        # app: same pid, same crate, started 3 ms apart -> pid+cmd+time
        {"pid": app["pid"], "parent_pid": 100, "image_name": "rustc.exe", "command_line": cmd("app"),
         "start_ns": rel(app["start_time_ns"] - 3_000_000), "end_ns": rel(app["start_time_ns"] + 10**9)},
        # mathx's pid was reused later by another crate: must not match ...
        {"pid": mathx["pid"], "parent_pid": 100, "image_name": "rustc.exe", "command_line": cmd("serde"),
         "start_ns": rel(mathx["start_time_ns"] + 60 * 10**9), "end_ns": None},
        # ... the right process has another pid (a different pid namespace) -> cmd+time
        {"pid": 4242, "parent_pid": 100, "image_name": "rustc.exe", "command_line": cmd("mathx"),
         "start_ns": rel(mathx["start_time_ns"] + 1_000_000), "end_ns": None},
        # util: the crate matches but the time is far off and the pid differs -> no match
        {"pid": 777, "parent_pid": 100, "image_name": "rustc.exe", "command_line": cmd("util"),
         "start_ns": rel(util["start_time_ns"] + 30 * 10**9), "end_ns": None},
        {"pid": 100, "parent_pid": 4, "image_name": "cargo.exe", "command_line": "cargo build", "start_ns": 0,
         "end_ns": None},
    ]
    # Every column the ETL decoder writes (pipeline/decode/etl/joins.py), so other aggregate sections run too.
    for key, p in enumerate(processes):
        p.update(session=1, exit_status=None, unique_process_key=0xFFFF0000 + key, flags=0,
                 start_timestamp=p["start_ns"], end_timestamp=p["end_ns"],
                 first_seen_ns=p["start_ns"], last_seen_ns=p["end_ns"] or p["start_ns"])
    schema = pa.schema([("pid", pa.uint32()), ("parent_pid", pa.uint32()), ("image_name", pa.string()),
                        ("command_line", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                        ("session", pa.uint32()), ("exit_status", pa.int32()), ("unique_process_key", pa.uint64()),
                        ("flags", pa.uint32()), ("start_timestamp", pa.int64()), ("end_timestamp", pa.int64()),
                        ("first_seen_ns", pa.int64()), ("last_seen_ns", pa.int64())])
    pq.write_table(pa.Table.from_pylist(processes, schema=schema), run / "decoded" / "processes.parquet")
    start_filetime = trace_start_unix_ns // 100 + FILETIME_UNIX_EPOCH
    pq.write_table(pa.table({"start_filetime": pa.array([start_filetime], pa.int64())}),
                   run / "decoded" / "trace.parquet")

    summary = aggregate.run(run, config, dask_pool)
    assert summary["queries"]["etl_matched"] == 2
    joined = {r["crate"]: r for r in read_table(run, "aggregated", "self_profile_processes").to_pylist()}
    assert joined["app"]["etl_match"] == "pid+cmd+time" and joined["app"]["etl_image"] == "rustc.exe"
    assert joined["app"]["etl_start_ns"] == app["start_time_ns"] - 3_000_000
    assert joined["mathx"]["etl_match"] == "cmd+time" and joined["mathx"]["etl_pid"] == 4242
    assert joined["util"]["etl_match"] is None and joined["util"]["etl_pid"] is None


def crate_token(command_line: str) -> str | None:
    """The crate the aggregate stage reads from a command line (``CMD_CRATE_SQL``)."""
    import duckdb

    from pipeline.aggregate.resolve import CMD_CRATE_SQL

    with duckdb.connect() as con:
        return con.execute(f"select {CMD_CRATE_SQL} from (select ?::varchar as command_line)",
                           [command_line]).fetchone()[0]


def test_join_without_etl_leaves_columns_empty():
    from pipeline.aggregate.queries import join_etl

    assert crate_token('"C:\\rustc.exe" --crate-name core --edition=2021') == "core"
    assert crate_token("cargo build") is None
    rows = join_etl([{"pid": 1, "crate": "a", "start_time_ns": 10}], [], 1000)
    assert rows == [{"etl_pid": None, "etl_parent_pid": None, "etl_image": None, "etl_start_ns": None,
                     "etl_end_ns": None, "etl_match": None}]


def test_decoder_and_aggregate_read_the_same_crate_from_a_command_line():
    """The self-profile decoder's crate (``crate_of``) and the aggregate's (``CMD_CRATE_SQL``, which matches
    self-profiles to ETL processes) follow one rule: each form rustc accepts, plain or quoted."""
    from pipeline.decode.measureme import crate_of

    lines = {
        "rustc --crate-name alpha x.rs": "alpha",
        "rustc --crate-name=beta --edition=2021 y.rs": "beta",
        '"C:\\rust\\rustc.exe" "--crate-name" gamma src\\lib.rs': "gamma",
        'rustc.exe --crate-name "delta" z.rs': "delta",
        "rustc   --crate-name   epsilon": "epsilon",
    }
    for line, crate in lines.items():
        assert (crate_of(line, Path("x-1.mm_profdata")), crate_token(line)) == (crate, crate), line
    # Without --crate-name, the decoder falls back on the file name (<crate>-<pid>.mm_profdata).
    assert crate_of("rustc -", Path("zeta-0001234.mm_profdata")) == "zeta"
    assert crate_of(None, Path("eta-17.mm_profdata")) == "eta"
