"""A real HTTP symbol server on 127.0.0.1: download once into the cache, .pd_ (CAB), errors reported.

The server is Python's ``http.server`` in a thread, serving a symbol store laid out on disk from the
PDBs built by ``test_symbolize_images``; it counts every request. Requests go only to loopback.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import cabarchive
import pytest

from pipeline.runs import read_manifest, read_table
from pipeline.symbolize import run
from pipeline.symbolize.symbolpath import expand_cab, locate, parse_symbol_path, store_key
from tests.test_symbolize_images import built_images, pe_identity
from tests.test_symbolize_stage import DLL_BASE, EXE_BASE, config_for, publics, write_decoded


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.server.requests.append(self.path)
        if any(part in self.path for part in self.server.fail_paths):
            self.send_error(500, "symbol server is broken today")
            return
        super().do_GET()


@pytest.fixture()
def server(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(store)))
    httpd.requests = []
    httpd.fail_paths = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, store, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _publish(store: Path, pdb: Path, ident: dict, compressed: bool) -> None:
    keyed = store / ident["pdb_name"] / store_key(ident["guid"], ident["age"])
    keyed.mkdir(parents=True)
    if compressed:
        arc = cabarchive.CabArchive()
        arc[pdb.name] = cabarchive.CabFile(pdb.read_bytes())
        (keyed / (pdb.name[:-1] + "_")).write_bytes(arc.save(compress=True))
    else:
        (keyed / pdb.name).write_bytes(pdb.read_bytes())


def test_symbol_path_syntax(tmp_path):
    entries = parse_symbol_path(r"C:\sym;srv*/tmp/c1*https://msdl.example/download/symbols;cache*/tmp/c2;"
                                "SRV*https://other.example;srv*/tmp/c3*/mnt/store;symsrv*symsrv.dll*/tmp/c4*http://x",
                                tmp_path)
    assert [(e.kind, e.target, e.caches) for e in entries] == [
        ("dir", r"C:\sym", ()),
        ("server", "https://msdl.example/download/symbols", ("/tmp/c1",)),
        ("cache", "/tmp/c2", ()),
        ("server", "https://other.example", (str(tmp_path / "downloads"),)),
        ("server", "/mnt/store", ("/tmp/c3",)),
        ("server", "http://x", ("/tmp/c4",)),
    ]
    assert store_key("d1307f3d-ffee-c84a-4c4c-44205044422e", 1) == "D1307F3DFFEEC84A4C4C44205044422E1"
    assert store_key("{51E29341-44BA-1562-8BA5-A31BE2DAE7DC}", 0x1A) == "51E2934144BA15628BA5A31BE2DAE7DC1A"


def test_cab_round_trip():
    arc = cabarchive.CabArchive()
    arc["x.pdb"] = cabarchive.CabFile(b"Microsoft C/C++ MSF 7.00\r\n" + bytes(range(256)) * 64)
    assert expand_cab(arc.save(compress=True), "x.pd_") == b"Microsoft C/C++ MSF 7.00\r\n" + bytes(range(256)) * 64
    with pytest.raises(ValueError, match="not a readable CAB"):
        expand_cab(b"MSCF but not really", "broken.pd_")


def test_download_once_then_cache_only_and_server_errors_reported(server, tmp_path, dask_pool):
    httpd, store, url = server
    root = built_images() / "full"
    exe, dll = pe_identity(root / "fakerustc.exe"), pe_identity(root / "rustlib.dll")
    _publish(store, root / "fakerustc.pdb", exe, compressed=True)       # only the .pd_ form
    _publish(store, root / "rustlib.pdb", dll, compressed=False)
    full, lib = publics("full", "fakerustc.pdb"), publics("full", "rustlib.pdb")
    main = full["_RNvCs1234_7mycrate4main"]
    reallo = lib["_ZN7rustlib5alloc6reallo17habcdefabcdef0123E"]
    images = [dict(pid=7, base=EXE_BASE, size=exe["size"], file_name=r"C:\b\fakerustc.exe", load_ns=0),
              dict(pid=7, base=DLL_BASE, size=dll["size"], file_name=r"C:\b\rustlib.dll", load_ns=0),
              dict(pid=7, base=0x1000000, size=0x10000, file_name=r"C:\b\absent.dll", load_ns=0)]
    ids = [dict(pid=7, base=EXE_BASE, **{k: exe[k] for k in ("guid", "age", "pdb_name")}),
           dict(pid=7, base=DLL_BASE, **{k: dll[k] for k in ("guid", "age", "pdb_name")}),
           dict(pid=7, base=0x1000000, guid="12345678-0000-0000-0000-000000000000", age=1, pdb_name="absent.pdb")]
    run_dir = tmp_path / "run"
    write_decoded(run_dir, [(1, 7, EXE_BASE + main, 1)],
                  {1: [EXE_BASE + main, DLL_BASE + reallo + 2, 0x1000000 + 0x40]}, images, ids)
    cache = tmp_path / "symcache"
    cfg = config_for(tmp_path, f"srv*{cache}*{url}")

    # 1) rustlib's PDB is unreachable (HTTP 500): reported, the run goes on and resolves the rest
    httpd.fail_paths = ["rustlib.pdb"]
    run(run_dir, cfg, dask_pool)
    m = read_manifest(run_dir, "symbolized")
    missing = {e["module"]: e["reason"] for e in m["images_without_symbols"]}
    assert missing["rustlib.dll"].startswith("download failed:") and "HTTP 500" in missing["rustlib.dll"]
    assert missing["absent.dll"].startswith("not found")
    frames = {r["address"]: r for r in read_table(run_dir, "symbolized", "frames").to_pylist()}
    assert frames[EXE_BASE + main]["function"] == "mycrate::main"      # from the downloaded .pd_
    assert frames[DLL_BASE + reallo + 2]["function"] == f"rustlib.dll+0x{reallo + 2:x}"
    first = list(httpd.requests)
    exe_dir = f"/fakerustc.pdb/{store_key(exe['guid'], exe['age'])}/"
    assert first.count(exe_dir + "fakerustc.pdb") == 1 and first.count(exe_dir + "fakerustc.pd_") == 1
    assert (cache / "fakerustc.pdb" / store_key(exe["guid"], exe["age"]) / "fakerustc.pdb").is_file()
    # absent.pdb: .pdb, .pd_ and .sym asked once each, all 404
    assert sum("absent" in p for p in first) == 3

    # 2) the server is healthy again: only rustlib is fetched; the cached .pd_ and the known-missing
    #    absent.pdb cost no request
    httpd.fail_paths = []
    httpd.requests.clear()
    run(run_dir, cfg, dask_pool)
    assert httpd.requests == [f"/rustlib.pdb/{store_key(dll['guid'], dll['age'])}/rustlib.pdb"]
    frames = {r["address"]: r for r in read_table(run_dir, "symbolized", "frames").to_pylist()}
    assert frames[DLL_BASE + reallo + 2]["function"] == "rustlib::alloc::reallo"

    # 3) a third run, even with the derived tables deleted, makes no request at all
    httpd.requests.clear()
    import shutil

    shutil.rmtree(Path(cfg.symbolize.cache_dir) / "tables")
    run(run_dir, cfg, dask_pool)
    assert httpd.requests == []
    assert read_manifest(run_dir, "symbolized")["http_requests"] == 0


def test_cache_star_copies_from_later_entries(tmp_path):
    root = built_images() / "full"
    ident = pe_identity(root / "rustlib.dll")
    store = tmp_path / "store"
    _publish(store, root / "rustlib.pdb", ident, compressed=False)
    entries = parse_symbol_path(f"cache*{tmp_path / 'local'};{store}", tmp_path)
    key = store_key(ident["guid"], ident["age"])
    found = locate(entries, "rustlib.pdb", key, 5.0)
    assert found.path == tmp_path / "local" / "rustlib.pdb" / key / "rustlib.pdb"
    again = locate(entries, "rustlib.pdb", key, 5.0)
    assert again.source == f"cache {tmp_path / 'local'}"


def test_images_without_dbgid_fetch_the_binary_then_its_pdb(server, tmp_path, dask_pool):
    from pipeline.symbolize.pe import code_key, read_codeview

    httpd, store, url = server
    root = built_images() / "full"
    exe, dll = pe_identity(root / "fakerustc.exe"), pe_identity(root / "rustlib.dll")
    # the binary's own CodeView record agrees with symbolic's debug id
    cv = read_codeview(root / "fakerustc.exe")
    assert (cv["pdb_name"], f"{cv['guid']}-{cv['age']:x}") == ("fakerustc.pdb", exe["debug_id"])
    for ident, name in ((exe, "fakerustc.exe"), (dll, "rustlib.dll")):
        keyed = store / name / code_key(ident["time_date_stamp"], ident["size"])
        keyed.mkdir(parents=True)
        (keyed / name).write_bytes((root / name).read_bytes())
    _publish(store, root / "fakerustc.pdb", exe, compressed=False)   # rustlib: binary only
    main = publics("full", "fakerustc.pdb")["_RNvCs1234_7mycrate4main"]
    reallo = publics("full", "rustlib.pdb")["_ZN7rustlib5alloc6reallo17habcdefabcdef0123E"]
    images = [dict(pid=9, base=EXE_BASE, size=exe["size"], file_name=r"C:\b\fakerustc.exe", load_ns=0,
                   time_date_stamp=exe["time_date_stamp"]),
              dict(pid=9, base=DLL_BASE, size=dll["size"], file_name=r"C:\b\rustlib.dll", load_ns=0,
                   time_date_stamp=dll["time_date_stamp"])]
    run_dir = tmp_path / "run"
    write_decoded(run_dir, [(1, 9, EXE_BASE + main, 1)], {1: [EXE_BASE + main, DLL_BASE + reallo + 2]}, images, [])
    cfg = config_for(tmp_path, f"srv*{tmp_path / 'symcache'}*{url}")
    run(run_dir, cfg, dask_pool)
    frames = {r["address"]: r for r in read_table(run_dir, "symbolized", "frames").to_pylist()}
    assert frames[EXE_BASE + main]["function"] == "mycrate::main"
    assert frames[EXE_BASE + main]["debug_id"] == exe["debug_id"]       # learned from the binary
    assert frames[EXE_BASE + main]["line"] > 0
    exported = frames[DLL_BASE + reallo + 2]
    assert (exported["function"], exported["resolved"], exported["file"]) == ("rustlib::alloc::reallo", True, None)
    m = read_manifest(run_dir, "symbolized")
    kinds = {d["code_file"]: d["kind"] for d in m["debug_ids"]}
    assert kinds == {"fakerustc.exe": "pdb", "rustlib.dll": "pe-exports"}
    assert m["images_without_symbols"] == []
    assert m["http_requests"] >= 3
    httpd.requests.clear()
    run(run_dir, cfg, dask_pool)
    assert httpd.requests == []   # binaries and PDB come from the cache; rustlib.pdb is known missing


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A symbol server that misbehaves by PDB name: a body cut short, a garbage status line, a body over the
    cap, one that trickles a byte at a time, a redirect to another host name of this machine, and a good one
    (a real PDB) that sits behind a same-host redirect."""

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.server.requests.append(self.path)
        name = self.path.split("/")[1]
        if name == "trunc.pdb":
            self.send_response(200)
            self.send_header("Content-Length", "200000")
            self.end_headers()
            self.wfile.write(b"Microsoft C/C++ MSF 7.00\r\n" + bytes(100))
        elif name == "garbage.pdb":
            self.wfile.write(b"SPAM SPAM SPAM\r\n\r\n")
        elif name == "big.pdb":
            self.send_response(200)
            self.end_headers()                    # (no Content-Length: the cap must stop the stream itself)
            for _ in range(512):
                self.wfile.write(bytes(1024))
        elif name == "slow.pdb":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                if self.server.stop.wait(0.1):
                    return
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
        elif name == "away.pdb" and self.headers.get("Host", "").startswith("localhost"):
            self.send_error(404)                  # (the other host has nothing either)
        elif name in ("away.pdb", "fakerustc.pdb") and not self.path.startswith("/fakerustc.pdb/moved/"):
            host = "localhost" if name == "away.pdb" else "127.0.0.1"
            rest = self.path if name == "away.pdb" else self.path.replace("/fakerustc.pdb/", "/fakerustc.pdb/moved/", 1)
            self.send_response(302)
            self.send_header("Location", f"http://{host}:{self.server.server_address[1]}{rest}")
            self.end_headers()
        elif self.path.startswith("/fakerustc.pdb/moved/") and self.path.endswith("/fakerustc.pdb"):
            data = self.server.pdb
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_error(404)


def test_a_misbehaving_server_and_hostile_names_cost_one_line_per_image(tmp_path, dask_pool):
    """Every image's lookup ends with a one-line reason and the stage goes on: a truncated body, a garbage
    status line, a body over ``download_max_bytes`` (streamed, never read whole), a server past
    ``download_deadline_s``, a redirect to another host (refused until ``redirect_hosts`` allows it), and PDB
    names ``..`` and ``.`` that once wrote above the cache or crashed. A same-host redirect is followed."""
    root = built_images() / "full"
    exe = pe_identity(root / "fakerustc.exe")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.requests, httpd.pdb, httpd.stop = [], (root / "fakerustc.pdb").read_bytes(), threading.Event()
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        main = publics("full", "fakerustc.pdb")["_RNvCs1234_7mycrate4main"]
        names = ["trunc.pdb", "garbage.pdb", "big.pdb", "slow.pdb", "away.pdb", "..", "."]
        images = [dict(pid=7, base=EXE_BASE, size=exe["size"], file_name=r"C:\b\fakerustc.exe", load_ns=0)]
        ids = [dict(pid=7, base=EXE_BASE, **{k: exe[k] for k in ("guid", "age", "pdb_name")})]
        frames = [EXE_BASE + main]
        for k, name in enumerate(names):
            base = 0x1000000 * (k + 1)
            images.append(dict(pid=7, base=base, size=0x10000, file_name=f"C:\\b\\m{k}.dll", load_ns=0))
            ids.append(dict(pid=7, base=base, guid=f"{k + 1:08x}-0000-0000-0000-000000000000", age=1, pdb_name=name))
            frames.append(base + 0x40)
        run_dir = tmp_path / "cache" / "sub" / "run"
        write_decoded(run_dir, [(1, 7, frames[0], 1)], {1: frames}, images, ids)
        cache = tmp_path / "cache" / "sub" / "symcache"
        cfg = config_for(tmp_path, f"srv*{cache}*{url}")
        cfg.symbolize.cache_dir = cache
        cfg.symbolize.download_max_bytes = "256KiB"
        cfg.symbolize.download_deadline_s = 1.0
        cfg.symbolize.download_timeout_s = 5.0
        run(run_dir, cfg, dask_pool)
        m = read_manifest(run_dir, "symbolized")
        reasons = {e["pdb_name"]: e["reason"] for e in m["images_without_symbols"]}
        assert set(reasons) == set(names) and len(m["images_without_symbols"]) == len(names)
        assert all("\n" not in r for r in reasons.values())
        assert "body cut short: 126 of 200000 bytes" in reasons["trunc.pdb"]
        assert reasons["garbage.pdb"].startswith("download failed:") and "BadStatusLine" in reasons["garbage.pdb"]
        assert "more than symbolize.download_max_bytes (262144) bytes" in reasons["big.pdb"]
        assert "symbolize.download_deadline_s (1 s)" in reasons["slow.pdb"]
        assert "from host 127.0.0.1 to host localhost refused" in reasons["away.pdb"]
        assert reasons[".."].startswith("unsafe symbol file name '..'") and reasons["."].startswith("unsafe")
        table = {r["address"]: r for r in read_table(run_dir, "symbolized", "frames").to_pylist()}
        assert table[frames[0]]["function"] == "mycrate::main"          # behind a same-host redirect
        # nothing was written beside or above the cache, and no partial download was left in it
        assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["sub"]
        assert sorted(p.name for p in (tmp_path / "cache" / "sub").iterdir()) == ["run", "symcache"]
        assert not [p for p in cache.rglob("*") if ".part-" in p.name or p.name.endswith(".download")]
        assert not any(".." in r or r.endswith("/./") for r in httpd.requests)

        # the other host, once allowed, is followed (and answers 404 there: remembered as missing)
        cfg.symbolize.redirect_hosts = ["local*"]
        run(run_dir, cfg, dask_pool)
        reasons = {e["pdb_name"]: e["reason"] for e in read_manifest(run_dir, "symbolized")["images_without_symbols"]}
        assert reasons["away.pdb"].startswith("not found")
    finally:
        httpd.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
