"""Inputs read where they lie (pipeline/sources.py): a trace and its self-profiles given as http:// URLs of a real
server on loopback decode, on a dask cluster whose worker processes read their byte ranges themselves, into the
same tables as from their files; only the trace's bytes go over the wire, once."""

from __future__ import annotations

import json

import pytest

from pipeline import sources
from pipeline.errors import InputError
from tests.conftest import assert_same_tables
from tests.rangeserver import serving


@pytest.fixture(scope="module", params=["plain", "xpress"])
def build(request, tmp_path_factory):
    """A synthesized trace (buffers as WPR writes them, or XPRESS-compressed as xperf -merge -compress does) with
    several partitions, and the self-profiles of its rustc processes."""
    from pipeline import synth
    from pipeline.config import SynthConfig

    tmp = tmp_path_factory.mktemp(f"sources-{request.param}")
    trace = tmp / "input" / "trace.etl"
    synth.run(trace, SynthConfig(seed=5, size="6MB", cpus=3, compress=request.param == "xpress"))
    return trace


def config(tmp):
    from pipeline.config import Config

    cfg = Config()
    cfg.decode.partition_bytes = 1 << 20
    cfg.symbolize.cache_dir = tmp / "symcache"
    return cfg


def test_a_url_decodes_as_the_files_do(build, tmp_path, dask_pool):
    from pipeline import decode

    trace = build
    local = decode.run(tmp_path / "local", config(tmp_path), dask_pool, inputs=[trace, trace.parent / "selfprofile"])
    with serving(trace.parent) as (base, log):
        remote = decode.run(tmp_path / "url", config(tmp_path), dask_pool,
                            inputs=[sources.parse(f"{base}/trace.etl"), sources.parse(f"{base}/selfprofile/")])
    assert local["etl"]["partitions"] == remote["etl"]["partitions"] > 3
    assert assert_same_tables(tmp_path / "local" / "decoded", tmp_path / "url" / "decoded", ignore=("path", "file")) >= 15
    for what in ("records", "samples", "stacks", "errors"):
        assert remote["etl"][what] == local["etl"][what], what
    assert remote["self_profile"]["decoded"] == local["self_profile"]["decoded"] > 10

    # What the server sent of the trace: each partition's range once to a worker, and to the client's walk the
    # headers of buffers that have the session's size, or the whole trace once when they are compressed.
    size = trace.stat().st_size
    sent = [(lo, n) for method, path, lo, n, ranged in log if path == "/trace.etl" and method == "GET"]
    assert all(ranged for method, path, lo, n, ranged in log if path == "/trace.etl" and method == "GET")
    assert remote["etl"]["walk_reads"] == ("headers" if remote["etl"]["buffers_compressed"] == 0 else "blocks")
    if remote["etl"]["walk_reads"] == "headers":
        assert len([n for _, n in sent if n > 0x1000]) == remote["etl"]["partitions"]
        assert size <= sum(n for _, n in sent) < size * 1.05
    else:
        assert size * 1.5 < sum(n for _, n in sent) <= size * 2
    manifest = json.loads((tmp_path / "url" / "decoded" / "_manifest.json").read_text())
    etl = next(i for i in manifest["inputs"] if i["path"].endswith("/trace.etl"))
    assert etl["size"] == size and etl["sha256_tree"] is None and etl["version"].startswith("ETag:")


def test_a_job_sees_whether_a_url_changed(build, tmp_path, dask_pool):
    """A job's decode stage is up to date while the URL's ETag is the one decoded; a new version of the file
    (same size, new ETag) makes it stale."""
    import os

    from pipeline import decode
    from pipeline.jobs import Inputs, stale_reason

    with serving(build.parent) as (base, _):
        url = sources.parse(f"{base}/trace.etl")
        decode.run(tmp_path / "run", config(tmp_path), dask_pool, inputs=[url])
        assert stale_reason(tmp_path / "run", "decode", config(tmp_path), Inputs((url,))) is None
        st = build.stat()
        os.utime(build, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        sources._info.cache_clear()              # (a new process would ask the server again)
        assert stale_reason(tmp_path / "run", "decode", config(tmp_path), Inputs((url,))) == "the inputs changed"


@pytest.mark.parametrize("throttle, way", [(0.2, "headers"), (0.0, "blocks")])
def test_the_walk_reads_a_url_the_faster_way(tmp_path_factory, throttle, way):
    """The walk over a 40 MB trace's 640 buffer headers: from a store that is slow for large reads, 256 headers
    a round (the headers and little else go over the wire); from a server that streams fast, 4 MiB blocks. Either
    way the buffer table equals the file's."""
    import numpy as np

    from pipeline import synth
    from pipeline.config import SynthConfig
    from pipeline.decode.etl.buffers import walk

    trace = tmp_path_factory.getbasetemp() / "walk40" / "trace.etl"
    if not trace.exists():
        synth.run(trace, SynthConfig(seed=6, size="40MB", cpus=2, self_profiles=False))
    header, bufs = walk(trace)
    assert len(bufs) > 2 * sources.PREFETCH and header.walk_reads == "file"
    with serving(trace.parent, throttle=throttle) as (base, log):
        got_header, got = walk(f"{base}/trace.etl")
    assert got_header.walk_reads == way
    assert np.array_equal(got, bufs) and got_header.fields == header.fields
    sent = sum(n for method, _, _, n, _ in log if method == "GET")
    if way == "headers":     # (the first round, one block to compare, then rounds of headers)
        assert sent < sources.Reader.BLOCK + len(bufs) * 0x48 * 2
    else:                    # (the first round, then the blocks of the rest)
        assert sent >= trace.stat().st_size - sources.PREFETCH * int(bufs["buffer_size"][1])


def test_url_errors_name_the_url(build, tmp_path):
    from pipeline import decode

    with serving(build.parent) as (base, _):
        with pytest.raises(InputError, match=rf"{base}/missing.etl: no such file"):
            decode.classify([sources.parse(f"{base}/missing.etl")])
        with pytest.raises(InputError, match=rf"{base}/trace.truth.json: not an ETL trace"):
            decode.classify([sources.parse(f"{base}/trace.truth.json")])
    with pytest.raises(InputError, match="nosuchproto://x/y.etl: cannot read this URL"):
        sources.size("nosuchproto://x/y.etl")


def test_parse_keeps_urls_and_makes_paths():
    from pathlib import Path

    assert sources.parse("https://h/a/b.etl") == "https://h/a/b.etl"
    assert sources.parse("s3://bucket/key.etl") == "s3://bucket/key.etl"
    assert sources.parse("file:///tmp/x.etl") == Path("/tmp/x.etl")
    assert sources.parse("runs/x.etl") == Path("runs/x.etl")
    assert sources.stem("https://h/a/nightly.etl?sig=1") == "nightly"


def test_file_urls_are_read_as_the_system_reads_them(tmp_path):
    """``urlparse(...).path`` once kept ``%20`` encoded, and on Windows made ``file:///C:/x`` into ``\\C:\\x`` and
    dropped a UNC host."""
    import argparse
    from pathlib import Path

    spaced = tmp_path / "John Smith é" / "t.etl"
    assert sources.parse(spaced.as_uri()) == spaced
    assert sources.run_dir((tmp_path / "a run").as_uri()).path == tmp_path / "a run"
    assert sources.parse("file://localhost/tmp/a%20b.etl") == Path("/tmp/a b.etl")
    with pytest.raises(argparse.ArgumentTypeError, match="another host"):
        sources.parse("file://server/share/x.etl")
    # (Windows' reading, checked here with its own module)
    assert sources.file_url_path("file:///C:/Users/John%20Smith/t.etl", windows=True) == r"C:\Users\John Smith\t.etl"
    assert sources.file_url_path("file://server/share/a%20b.etl", windows=True) == r"\\server\share\a b.etl"
    assert sources.file_url_path("file://///server/share/x.etl", windows=True) == r"\\server\share\x.etl"
    for bad, says in [("file://server/C:/x.etl", r"a host \(server\) and a drive letter"),
                      ("file:///C:/a:b.etl", "not a Windows path")]:
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            sources.file_url_path(bad, windows=True)


def test_a_local_input_is_hashed_once_per_version(tmp_path, monkeypatch):
    """``fingerprint`` hashes a file once per version in a process (a job's up-to-date check, then its decode),
    and again once the file changed."""
    import pipeline.runs
    from pipeline import sources

    calls = []
    real = pipeline.runs.sha256_tree
    monkeypatch.setattr(pipeline.runs, "sha256_tree", lambda path: calls.append(path) or real(path))
    f = tmp_path / "trace.etl"
    f.write_bytes(b"a" * 1000)
    first = sources.fingerprint(f)
    assert sources.fingerprint(f) == first and len(calls) == 1
    f.write_bytes(b"b" * 1001)
    second = sources.fingerprint(f)
    assert second["sha256_tree"] != first["sha256_tree"] and second["size"] == 1001 and len(calls) == 2
