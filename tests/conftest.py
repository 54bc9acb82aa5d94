"""Shared test helpers. Fixtures are read in place from ../shared/fixtures and never copied."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.synth_traces import VARIANTS, Synth

#: A command the tests start that crashes in native code says where (seen once: a SIGSEGV of `bootprof run` on a
#: loaded machine, not seen again in 60 tries).
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures"


def run_dir_of_all_workers(tmp_path_factory) -> Path:
    """The temporary directory of the whole test run: shared by pytest-xdist's worker processes (each has its own
    below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def pytest_configure(config):
    """A test run started in the background by a shell without job control (`make test &` in a script, `nohup`,
    some CI runners) inherits SIGINT ignored, and so would every command it starts: no Ctrl-C would reach them, and
    the tests that send one (and ``signals_held``'s, in this process) would wait in vain. Handled here, it is the
    default again in the commands (an exec resets a handled signal, not an ignored one). (A hook, not code at import:
    a dask worker that imports a test module for its task function must keep ignoring it.)"""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: The modules that take longest (under `make test` on the 2-core VM), first: pytest-xdist hands whole modules out in
#: collection order (with ``--no-loadscope-reorder``, as `make test` runs it: by default xdist orders them by their
#: number of tests), and a long one handed out last keeps one process busy while the other has nothing left to do.
#: (Measured 2026-11-29 with --durations=0: each module's setup and calls, 114 s for test_jobs down to 19 s.)
LONGEST_FIRST = ("test_jobs", "test_portable", "test_ci_faults", "test_warehouse_history", "test_perf_dwarf",
                 "test_report_etl", "test_run_at_url", "test_perf_decode", "test_nightly_real", "test_perf_symbols",
                 "test_report_queries", "test_capture_etw", "test_decode_etl", "test_perf_dwarf_symbols",
                 "test_warehouse", "test_perf_run", "test_kernels_nojit")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))   # (stable: within a
    # module, and among the rest, the order stays)


def pytest_sessionstart(session):
    from tests.helpers import quiet

    # (one file for the test run, in its temporary directory, which pytest's workers share and pytest removes in
    # time: the session fixture `tmp_path_factory` is not there yet, its factory is)
    quiet.open_lock(run_dir_of_all_workers(session.config._tmp_path_factory) / "quiet.lock")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test holds the run's lock shared, so that one that must run alone (``tests/helpers/quiet.py``) can."""
    from tests.helpers import quiet

    with quiet.shared():
        yield


def fixture_path(rel: str) -> Path:
    """Path of a shared fixture; the test fails (never skips) when it is missing."""
    path = FIXTURES / rel
    if not path.exists():
        pytest.fail(f"required fixture is missing: {path} (../shared/fixtures must sit beside the project)")
    return path


@pytest.fixture(scope="session")
def dask_pool():
    """A real dask LocalCluster on 127.0.0.1 with two worker processes, shared by the session."""
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    with connect(ClusterConfig(mode="local", n_workers=2, memory_limit="3GiB")) as pool:
        yield pool



def made_once(tmp_path_factory, name: str, make) -> Path:
    """``RUN/name``, filled by ``make(directory)`` once per test run: the first of pytest-xdist's worker processes to
    ask makes it (the others wait for it), every later ask reads it."""
    import shutil

    from filelock import FileLock

    out = run_dir_of_all_workers(tmp_path_factory) / name
    with FileLock(str(out) + ".lock"):
        if not (out / ".made").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            make(out)
            (out / ".made").touch()
    return out


@pytest.fixture(scope="session")
def synth_traces(tmp_path_factory) -> dict:
    """Every variant of ``tests/synth_traces.py``, synthesized once per test run."""
    import json

    from pipeline import synth

    def make(root: Path):
        for name, cfg in VARIANTS.items():
            summary = synth.run(root / name / "trace.etl", cfg)
            (root / name / "summary.json").write_text(json.dumps(summary, default=str))

    root = made_once(tmp_path_factory, "synth-traces", make)
    return {name: Synth(name, cfg, root / name / "trace.etl",
                        json.loads((root / name / "trace.truth.json").read_text()),
                        json.loads((root / name / "summary.json").read_text()))
            for name, cfg in VARIANTS.items()}


@pytest.fixture(scope="session", params=list(VARIANTS))
def synth_trace(request, synth_traces):
    return synth_traces[request.param]


@pytest.fixture(scope="session")
def synth_decoded(synth_traces, dask_pool, tmp_path_factory):
    """Every variant decoded once per test run (real dask cluster).

    Returns name -> {"run": run dir, "tables": {table: list of row dicts}}. A test that writes more stages into a
    run does so in a copy (``tests/test_synth_symbolize.py``)."""
    from pipeline import decode
    from pipeline.config import Config
    from pipeline.runs import read_table, table_path

    def make(root: Path):
        for name, s in synth_traces.items():
            decode.run(root / name, Config(), dask_pool, inputs=[s.path])

    root = made_once(tmp_path_factory, "synth-decoded", make)
    out = {}
    for name in synth_traces:
        run, tables = root / name, {}
        for t in ("processes", "images", "samples", "stacks", "virtual_allocs", "heap_events", "heap_snapshots",
                  "heap_snapshot_blocks", "event_counts"):
            if table_path(run, "decoded", t).exists():
                tables[t] = read_table(run, "decoded", t).to_pylist()
        out[name] = {"run": run, "tables": tables}
    return out


@pytest.fixture(scope="session")
def etl_run(tmp_path_factory, dask_pool):
    """The ``plain64`` synthesized trace through decode, symbolize and aggregate (tests that ingest it work on a
    copy)."""
    from tests.helpers.runs import synth_run

    return synth_run(tmp_path_factory.mktemp("wh-etl"), "plain64", dask_pool)[0]


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the whole test run (``tests/helpers/browser.py``); each use gets a fresh page."""
    from tests.helpers.browser import Browser

    b = Browser()
    try:
        yield b
    finally:
        b.close()


#: Credentials of the S3 API server of ``s3_store`` (any will do; the commands take them from the environment).
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bootprof-test", "AWS_SECRET_ACCESS_KEY": "bootprof-test",
                  "AWS_DEFAULT_REGION": "us-east-1"}
#: The bucket ``s3_store`` makes.
S3_BUCKET = "runs-bucket"


@pytest.fixture(scope="session")
def s3_store():
    """A real S3 API server on 127.0.0.1 (moto's, spoken to over HTTP by s3fs) with an empty bucket; its endpoint."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3_client(endpoint).mkdir(S3_BUCKET)
        yield endpoint
    finally:
        server.stop()


def s3_client(endpoint: str):
    """A client of the store of its own (not the one the commands use)."""
    import s3fs

    return s3fs.S3FileSystem(key=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                             endpoint_url=endpoint, skip_instance_cache=True, use_listings_cache=False)


@pytest.fixture
def s3_here(s3_store, monkeypatch):
    """This process speaks to ``s3_store`` for ``s3://`` URLs (fsspec's config and the credentials)."""
    import fsspec

    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_store, "skip_instance_cache": True,
                                                   "use_listings_cache": False})
    return s3_store


#: Columns that differ between two decodes of the same input by design: how long a self-profile took, and which
#: part of ``query_events`` holds its rows.
RUN_SPECIFIC = ("decode_s", "part")


def assert_same_tables(a_dir: Path, b_dir: Path, ignore: tuple[str, ...] = ()) -> int:
    """Every parquet table (file or dataset directory) of ``a_dir`` equals the one of ``b_dir``: same schema, same
    rows in one order (the decoder's parts may cut them otherwise), dictionary columns as plain values,
    ``RUN_SPECIFIC`` columns and those named in ``ignore`` aside. Returns how many tables were compared."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def plain(t):
        t = t.unify_dictionaries().combine_chunks()
        return pa.table({c: pc.cast(t[c], t.schema.field(c).type.value_type) if pa.types.is_dictionary(t.schema.field(c).type)
                         else t[c] for c in t.column_names if c not in RUN_SPECIFIC and c not in ignore})

    compared = 0
    names = sorted(p.name for p in Path(a_dir).glob("*.parquet"))
    assert names == sorted(p.name for p in Path(b_dir).glob("*.parquet")), (a_dir, b_dir)
    for name in names:
        a, b = pq.read_table(Path(a_dir) / name), pq.read_table(Path(b_dir) / name)
        assert a.schema == b.schema, name
        a, b = plain(a), plain(b)
        key = [(c, "ascending") for c in a.column_names
               if not str(a.schema.field(c).type).startswith(("list", "large_list", "struct", "map"))]
        assert a.sort_by(key).equals(b.sort_by(key)), name
        compared += 1
    return compared


def contract_breaches(run_dir: Path) -> list[str]:
    """Where the manifests of ``run_dir``'s stage outputs differ from their types (:mod:`pipeline.contracts`): a
    value of another type, a key the type requires and the manifest lacks, or a key the manifest has and its type
    does not declare (pydantic drops those as it validates: what it returns lacks them)."""
    import json

    from pydantic import TypeAdapter, ValidationError

    from pipeline.contracts import MANIFESTS

    def undeclared(a, b, where: str) -> list[str]:
        if isinstance(a, dict) and isinstance(b, dict):
            return [x for k, v in a.items()
                    for x in ([f"{where}.{k}: not in the contract"] if k not in b else undeclared(v, b[k], f"{where}.{k}"))]
        if isinstance(a, list) and isinstance(b, list):
            return [x for i, (u, v) in enumerate(zip(a, b)) for x in undeclared(u, v, f"{where}[{i}]")]
        return []

    found = []
    for output, contract in MANIFESTS.items():
        path = Path(run_dir) / output / "_manifest.json"
        if not path.exists():
            continue
        manifest = json.loads(path.read_text())
        try:
            found += undeclared(manifest, TypeAdapter(contract).validate_python(manifest, strict=True), output)
        except ValidationError as exc:
            found += [f"{output}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return found
