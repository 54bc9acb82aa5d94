"""The symbolize stage end to end on decoded tables that point into real PE+PDB images.

The decoded tables are written here as parquet (the decode stage's contract: samples, stacks, images,
image_ids); every address in them is a real RVA of a clang-cl/lld-link image built by
``test_symbolize_images``, resolved through the real PDBs on a real dask LocalCluster.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cluster import Pool
from pipeline.config import Config
from pipeline.runs import read_manifest, read_table, stage_output
from pipeline.symbolize import pdbpublics, run
from pipeline.symbolize.build import build_table
from tests.test_symbolize_images import built_images, pe_identity

EXE_BASE = 0x140000000
DLL_BASE = 0x180000000
KERNEL_BASE = 0xFFFFF80000000000


def write_decoded(run_dir: Path, samples: list[tuple], stacks: dict[int, list[int]], images: list[dict],
                  image_ids: list[dict]) -> None:
    """A finished ``decoded/`` output with the four tables symbolize reads."""
    with stage_output(run_dir, "decoded") as out:
        out.write_table("samples", pa.table({
            "timestamp_ns": pa.array([s[0] for s in samples], pa.int64()),
            "cpu": pa.array([0] * len(samples), pa.uint16()),
            "tid": pa.array([s[1] + 1 for s in samples], pa.uint32()),
            "pid": pa.array([s[1] for s in samples], pa.uint32()),
            "ip": pa.array([s[2] for s in samples], pa.uint64()),
            "stack_id": pa.array([s[3] for s in samples], pa.int64()),
        }))
        out.write_table("stacks", pa.table({
            "stack_id": pa.array(list(stacks), pa.int64()),
            "frames": pa.array(list(stacks.values()), pa.list_(pa.uint64())),
        }))
        out.write_table("images", pa.table({
            "pid": pa.array([i["pid"] for i in images], pa.uint32()),
            "base": pa.array([i["base"] for i in images], pa.uint64()),
            "size": pa.array([i["size"] for i in images], pa.uint64()),
            "file_name": pa.array([i["file_name"] for i in images], pa.string()),
            "load_ns": pa.array([i.get("load_ns") for i in images], pa.int64()),
            "unload_ns": pa.array([i.get("unload_ns") for i in images], pa.int64()),
            "checksum": pa.array([0] * len(images), pa.uint32()),
            "time_date_stamp": pa.array([i.get("time_date_stamp", 0) for i in images], pa.uint32()),
        }))
        out.write_table("image_ids", pa.table({
            "pid": pa.array([i["pid"] for i in image_ids], pa.uint32()),
            "base": pa.array([i["base"] for i in image_ids], pa.uint64()),
            "pdb_guid": pa.array([i["guid"] for i in image_ids], pa.string()),
            "pdb_age": pa.array([i["age"] for i in image_ids], pa.uint32()),
            "pdb_name": pa.array([i["pdb_name"] for i in image_ids], pa.string()),
            "timestamp_ns": pa.array([i.get("timestamp_ns", 0) for i in image_ids], pa.int64()),
        }))


def publics(build: str, name: str) -> dict[str, int]:
    rvas, names, _ = pdbpublics.read_publics(built_images() / build / name)
    return dict(zip(names, rvas.tolist()))


def inline_rva(build: str = "full") -> int:
    exe = built_images() / build / "fakerustc.exe"
    table, _ = build_table(exe.with_suffix(".pdb"), pe_identity(exe)["debug_id"], Path("/nonexistent"))
    for pc in range(0x1000, 0x1400):
        if len(table.chains(table.innermost(np.array([pc], dtype=np.uint64)))[0]) == 3:
            return pc
    pytest.fail("no inlined address in fakerustc.exe")


def config_for(tmp_path: Path, symbol_path: str) -> Config:
    cfg = Config()
    cfg.symbolize.symbol_path = symbol_path
    cfg.symbolize.cache_dir = tmp_path / "cache"
    return cfg


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, dask_pool):
    tmp = tmp_path_factory.mktemp("symstage")
    root = built_images()
    exe, dll = pe_identity(root / "full" / "fakerustc.exe"), pe_identity(root / "full" / "rustlib.dll")
    sexe = pe_identity(root / "stripped" / "fakerustc.exe")
    full, stripped, lib = publics("full", "fakerustc.pdb"), publics("stripped", "fakerustc.pdb"), publics("full", "rustlib.pdb")
    inl = inline_rva()
    rtc, drop = full["_RTC_Initialize"], full[
        "_ZN70_$LT$alloc..vec..Vec$LT$T$C$A$GT$$u20$as$u20$core..ops..drop..Drop$GT$4drop17h5f2a7c8e9b1d3f40E"]
    reallo = lib["_ZN7rustlib5alloc6reallo17habcdefabcdef0123E"]
    images = [
        dict(pid=100, base=EXE_BASE, size=exe["size"], file_name=r"\Device\HarddiskVolume2\rust\fakerustc.exe", load_ns=0),
        dict(pid=101, base=EXE_BASE, size=exe["size"], file_name=r"C:\rust\fakerustc.exe", load_ns=0),
        # one range, two images: rustlib.dll until t=1000, then other.dll (no symbols anywhere)
        dict(pid=100, base=DLL_BASE, size=dll["size"], file_name=r"C:\rust\rustlib.dll", load_ns=0, unload_ns=1000),
        dict(pid=100, base=DLL_BASE, size=0x3000, file_name=r"C:\rust\other.dll", load_ns=2000),
        dict(pid=200, base=EXE_BASE, size=sexe["size"], file_name=r"C:\stripped\fakerustc.exe", load_ns=0),
        dict(pid=0, base=KERNEL_BASE, size=0x100000, file_name=r"\SystemRoot\system32\ntoskrnl.exe"),
    ]
    ids = [dict(pid=100, base=EXE_BASE, **{k: exe[k] for k in ("guid", "age", "pdb_name")}),
           dict(pid=101, base=EXE_BASE, **{k: exe[k] for k in ("guid", "age", "pdb_name")}),
           # two DbgID records for one (pid, base): the record's time picks the load it belongs to
           dict(pid=100, base=DLL_BASE, timestamp_ns=0, **{k: dll[k] for k in ("guid", "age", "pdb_name")}),
           dict(pid=100, base=DLL_BASE, timestamp_ns=2000, guid="0badc0de-0000-0000-0000-000000000000", age=3,
                pdb_name="other.pdb"),
           dict(pid=200, base=EXE_BASE, **{k: sexe[k] for k in ("guid", "age", "pdb_name")})]
    kernel_addr = KERNEL_BASE + 0x4321
    stacks = {
        1: [EXE_BASE + inl, EXE_BASE + drop + 4, kernel_addr],  # leaf inline chain, a return address, kernel
        2: [DLL_BASE + reallo, EXE_BASE + drop + 4],           # rustlib (t=500) called from drop
        3: [DLL_BASE + reallo + 1, EXE_BASE + drop + 4],       # same range at t=2500: other.dll
        # the first address of the inline chain as a return address: address - 1 is before the chain
        5: [EXE_BASE + drop, EXE_BASE + inl],
        4: [EXE_BASE + stripped["_RTC_Initialize"], EXE_BASE + stripped["_RINvNtCs9I6RxzOjugb_7mycrate6worker12generic_stepmEB4_"] + 2],
    }
    samples = [
        (10, 100, EXE_BASE + inl, 1),
        (20, 101, EXE_BASE + rtc, -1),                         # rtc as a leaf (an ip, no stack)
        (25, 101, 0, 5),
        (26, 100, 0, 5),                                       # inl as a return address where it also is a leaf
        (500, 100, DLL_BASE + reallo, 2),
        (2500, 100, DLL_BASE + reallo + 1, 3),
        (30, 200, EXE_BASE + stripped["_RTC_Initialize"], 4),
        (40, 300, 0x1234, -1),                                  # a process without images
    ]
    run_dir = tmp / "run"
    write_decoded(run_dir, samples, stacks, images, ids)
    cfg = config_for(tmp, str(root / "full") + ";" + str(root / "stripped"))
    summary = run(run_dir, cfg, dask_pool)
    frames = read_table(run_dir, "symbolized", "frames").to_pylist()
    return {"summary": summary, "frames": frames, "manifest": read_manifest(run_dir, "symbolized"),
            "rva": {"inl": inl, "rtc": rtc, "drop": drop, "reallo": reallo, "stripped": stripped},
            "run_dir": run_dir, "cfg": cfg, "kernel": kernel_addr}


def rows_of(frames, pid, address, leaf=None):
    """Rows of one frame, innermost inline level first; ``leaf`` picks a role where the address has both."""
    return sorted((r for r in frames if r["pid"] == pid and r["address"] == address and leaf in (None, r["leaf"])),
                  key=lambda r: -r["inline_depth"])


def test_inline_chain_lines_and_files(scenario):
    rows = rows_of(scenario["frames"], 100, EXE_BASE + scenario["rva"]["inl"], leaf=True)
    assert [(r["function"], r["inline_depth"]) for r in rows] == [
        ("<u64>::wrapping_mul", 2), ("mycrate::hash::mix", 1), ("core::fmt::write", 0)]
    assert [r["raw_name"].split("(")[0] for r in rows] == [
        "_RNvMNtCs1234_4core3numy12wrapping_mul", "_ZN7mycrate4hash3mix17h1122334455667788E",
        "_ZN4core3fmt5write17h0123456789abcdefE"]
    assert all(Path(r["file"]).name == "rustnames.c" and r["line"] > 0 and r["resolved"] for r in rows)
    assert {r["module"] for r in rows} == {"fakerustc.exe"}
    assert {r["rva"] for r in rows} == {scenario["rva"]["inl"]}


def test_return_addresses_resolve_to_the_calling_function(scenario):
    (leaf,) = rows_of(scenario["frames"], 101, EXE_BASE + scenario["rva"]["rtc"])
    assert leaf["function"] == "_RTC_Initialize"          # a C name, never demangled as Rust
    inl = EXE_BASE + scenario["rva"]["inl"]
    as_leaf = rows_of(scenario["frames"], 100, inl, leaf=True)
    # the same address as a return address is looked up at address - 1, before the inlined call; each role
    # resolves the same in every process: pid 100 has it in both roles, pid 101 as a return address only
    as_return = rows_of(scenario["frames"], 101, inl)
    assert len(as_leaf) == 3 and 1 <= len(as_return) < 3 and not any(r["leaf"] for r in as_return)
    assert as_return[-1]["function"] == as_leaf[-1]["function"] == "core::fmt::write"
    strip = ("address", "pid", "image_load_ns", "image_unload_ns")
    assert ([{k: v for k, v in r.items() if k not in strip} for r in rows_of(scenario["frames"], 100, inl, leaf=False)]
            == [{k: v for k, v in r.items() if k not in strip} for r in as_return])
    (drop,) = rows_of(scenario["frames"], 100, EXE_BASE + scenario["rva"]["drop"] + 4)
    assert drop["function"] == "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop"


def test_reused_range_maps_by_time_and_missing_symbols_are_reported(scenario):
    frames, manifest = scenario["frames"], scenario["manifest"]
    (dll,) = rows_of(frames, 100, DLL_BASE + scenario["rva"]["reallo"])
    assert dll["module"] == "rustlib.dll" and dll["function"] == "rustlib::alloc::reallo"
    assert dll["raw_name"].startswith("_ZN7rustlib5alloc6reallo17habcdefabcdef0123E")
    assert dll["image_unload_ns"] == 1000
    (other,) = rows_of(frames, 100, DLL_BASE + scenario["rva"]["reallo"] + 1)
    assert other["module"] == "other.dll" and not other["resolved"]
    assert other["function"] == f"other.dll+0x{scenario['rva']['reallo'] + 1:x}"
    assert other["image_load_ns"] == 2000
    (kernel,) = rows_of(frames, 100, scenario["kernel"])
    assert kernel["module"] == "ntoskrnl.exe" and kernel["function"] == "ntoskrnl.exe+0x4321"
    (nowhere,) = rows_of(frames, 300, 0x1234)
    assert nowhere["module"] is None and nowhere["function"] == "0x1234" and nowhere["rva"] is None
    missing = {m["module"]: m for m in manifest["images_without_symbols"]}
    assert set(missing) == {"other.dll", "ntoskrnl.exe"}
    assert missing["ntoskrnl.exe"]["reason"].startswith("no debug id")
    assert missing["other.dll"]["reason"].startswith("not found")
    assert missing["other.dll"]["debug_id"] == "0badc0de-0000-0000-0000-000000000000-3"
    assert missing["other.dll"]["frames"] == 1


def test_stripped_pdb_demangles_publics(scenario):
    stripped = scenario["rva"]["stripped"]
    (leaf,) = rows_of(scenario["frames"], 200, EXE_BASE + stripped["_RTC_Initialize"])
    assert (leaf["function"], leaf["raw_name"], leaf["file"]) == ("_RTC_Initialize", "_RTC_Initialize", None)
    step = EXE_BASE + stripped["_RINvNtCs9I6RxzOjugb_7mycrate6worker12generic_stepmEB4_"] + 2
    (ret,) = rows_of(scenario["frames"], 200, step)
    assert ret["function"] == "mycrate::worker::generic_step::<u32>"


def test_manifest_rates_per_module(scenario):
    m = scenario["manifest"]
    mods = m["modules"]
    assert mods["fakerustc.exe"] == {"frames": 9, "resolved": 9, "rate": 1.0}   # inl and drop in both roles in pid 100
    assert mods["rustlib.dll"] == {"frames": 1, "resolved": 1, "rate": 1.0}
    assert mods["other.dll"]["rate"] == 0.0 and mods["(no image)"]["frames"] == 1
    assert m["frames"] == sum(v["frames"] for v in mods.values())
    assert scenario["summary"]["images_without_symbols"] == 2
    assert m["tables"]["frames"] == len(scenario["frames"])
    keys = [(r["pid"], r["address"], r["leaf"], r["image_load_ns"] or 0, r["inline_depth"]) for r in scenario["frames"]]
    assert keys == sorted(keys)
    schema = pq.read_schema(scenario["run_dir"] / "symbolized" / "frames.parquet")
    assert schema.names[:11] == ["address", "pid", "leaf", "module", "rva", "function", "raw_name", "inline_depth",
                                 "file", "line", "resolved"]


def test_rerun_uses_the_cache_only(scenario, dask_pool):
    cfg = scenario["cfg"].model_copy(deep=True)
    cfg.symbolize.symbol_path = ""  # nothing to search: every table must come from the cache
    run(scenario["run_dir"], cfg, dask_pool)
    again = read_table(scenario["run_dir"], "symbolized", "frames").to_pylist()
    assert again == scenario["frames"]
    m = read_manifest(scenario["run_dir"], "symbolized")
    assert all(d["cached"] for d in m["debug_ids"] if d["status"] == "ok")


def test_image_index_prefers_the_latest_load_when_an_unload_was_never_recorded():
    from pipeline.symbolize.images import ImageIndex

    big = np.iinfo(np.int64).max
    # pid 5 reused: a.exe loaded at 0 and never unloaded (the process died), b.exe at 100;
    # pid 0 holds a kernel image
    index = ImageIndex(pid=np.array([5, 5, 0]), base=np.array([0x400000, 0x400000, 0xFFFFF800_00000000], np.uint64),
                       size=np.array([0x10000, 0x8000, 0x1000], np.uint64), load_ns=np.array([0, 100, 0]),
                       unload_ns=np.array([big, big, big]))
    rows, count = index.find(np.array([5, 5, 5, 5, 7]),
                             np.array([0x401000, 0x401000, 0x409000, 0xFFFFF800_00000010, 0x401000], np.uint64),
                             np.array([50, 150, 150, 150, 150]))
    assert rows.tolist() == [0, 1, 0, 2, -1]   # a.exe, b.exe, only a.exe covers +0x9000, kernel, no images
    assert count.tolist() == [2, 2, 1, 1, 0]


def test_image_kernel_in_plain_python_matches_the_jit():
    """The numba kernel run as plain Python (as NUMBA_DISABLE_JIT=1 would) gives the same answers."""
    from pipeline.symbolize import images as im

    rng = np.random.default_rng(7)
    n_img = 40
    pid = rng.integers(0, 4, n_img)
    base = (rng.integers(1, 64, n_img) * 0x10000).astype(np.uint64)
    index = im.ImageIndex(pid, base, rng.integers(0x1000, 0x40000, n_img).astype(np.uint64),
                          rng.integers(0, 1000, n_img), rng.integers(1000, 3000, n_img))
    q_pid = rng.integers(0, 5, 2000)
    q_addr = rng.integers(0, 70 * 0x10000, 2000).astype(np.uint64)
    q_t = rng.integers(0, 4000, 2000)
    groups = index.group_of(q_pid)
    args = (groups, q_addr, q_t.astype(np.int64), index.group_start, index.group_stop, index.group_max_size,
            index.base, index.end, index.load, index.unload, index.kernel_group)
    jit_hit, jit_count = im.find_kernel(*args)
    saved = im._search_group
    im._search_group = saved.py_func  # the Python body calls the module-level name
    try:
        py_hit, py_count = im.find_kernel.py_func(*args)
    finally:
        im._search_group = saved
    assert np.array_equal(jit_hit, py_hit) and np.array_equal(jit_count, py_count)
    assert (jit_hit >= 0).sum() > 100 and (jit_hit < 0).sum() > 100


def test_image_candidates_weighed_at_a_time_agree_with_find():
    """The frames of reused ranges list their candidate images once (``ImageIndex.candidates``) and weigh
    them per occurrence (``mark_chosen``): the same image as ``find`` for every query, kernel images included,
    on random overlapping images (several pids, loads and unloads in any order, a kernel group)."""
    from pipeline.symbolize import images as im

    rng = np.random.default_rng(11)
    n_img = 60
    pid = rng.integers(0, 4, n_img)          # pid 0: the kernel's images, looked up when a pid's do not hold
    base = (rng.integers(1, 32, n_img) * 0x10000).astype(np.uint64)
    load = rng.integers(0, 1000, n_img)
    index = im.ImageIndex(pid, base, rng.integers(0x1000, 0x60000, n_img).astype(np.uint64), load,
                          load + rng.integers(1, 2000, n_img))
    n = 5000
    q_pid, q_addr, q_t = rng.integers(0, 5, n), rng.integers(0, 40 * 0x10000, n).astype(np.uint64), rng.integers(-500, 4000, n)
    rows, count = index.find(q_pid, q_addr, q_t)
    cands = index.candidates(q_pid, q_addr, int(count.max()))
    assert ((cands >= 0).sum(axis=1) == count).all()
    k = np.arange(n)

    def chosen(used):
        assert (used.sum(axis=1) == (count > 0)).all()          # (one image each, where there is one)
        slot = np.where(used.any(axis=1), used.argmax(axis=1), -1)
        return np.where(slot >= 0, index.rows(cands[k, np.maximum(slot, 0)]), -1)

    # each query an event of its own
    used = np.zeros(cands.shape, bool)
    index.mark_chosen(cands, k, k, np.ones(n), k, q_t, used)
    assert np.array_equal(chosen(used), rows)
    # the queries in groups of two (in reverse), each group one event at the time of its queries
    q_t2 = q_t.copy()
    q_t2[1::2] = q_t[0::2]
    rows, count = index.find(q_pid, q_addr, q_t2)
    used = np.zeros(cands.shape, bool)
    index.mark_chosen(cands, k[::-1], np.arange(0, n, 2), np.full(n // 2, 2), np.arange(n // 2)[::-1],
                      q_t2[0::2], used)
    assert np.array_equal(chosen(used), rows)
    # (the kernel as plain Python: the same marks)
    py_used = np.zeros(cands.shape, bool)
    im.mark_kernel.py_func(cands, k[::-1].copy(), np.arange(0, n, 2), np.full(n // 2, 2), np.arange(n // 2)[::-1].copy(),
                            q_t2[0::2].astype(np.int64), index.load, index.unload, py_used)
    assert np.array_equal(py_used, used)
    assert (count >= 2).sum() > 500 and (rows < 0).sum() > 100 and (count == 1).sum() > 500


def test_workers_start_only_for_symbol_files_to_find_and_read(scenario, tmp_path):
    """A lazy pool's cluster starts only when a symbol file must be found and read: not for tables in the
    cache, nor when there is nowhere to look; the frames are the same either way."""
    starts = []

    def lazy() -> Pool:
        starts.append(1)
        return Pool(None)

    cfg = scenario["cfg"].model_copy(deep=True)
    cfg.symbolize.symbol_path = ""
    run(scenario["run_dir"], cfg, Pool(start=lazy))
    assert starts == []
    assert read_table(scenario["run_dir"], "symbolized", "frames").to_pylist() == scenario["frames"]
    cfg.symbolize.cache_dir = tmp_path / "cold"
    run(scenario["run_dir"], cfg, Pool(start=lazy))
    assert starts == []         # (no symbol path, no cache: every image is missing, found nowhere)
    cfg.symbolize.symbol_path = scenario["cfg"].symbolize.symbol_path
    run(scenario["run_dir"], cfg, Pool(start=lazy))
    assert starts == [1]
    assert read_table(scenario["run_dir"], "symbolized", "frames").to_pylist() == scenario["frames"]


def test_symbol_path_from_the_environment(scenario, dask_pool, monkeypatch, tmp_path):
    cfg = scenario["cfg"].model_copy(deep=True)
    cfg.symbolize.symbol_path = None
    cfg.symbolize.cache_dir = tmp_path / "fresh-cache"
    root = built_images()
    monkeypatch.setenv("_NT_SYMBOL_PATH", f"{root / 'full'};{root / 'stripped'}")
    run(scenario["run_dir"], cfg, dask_pool)
    m = read_manifest(scenario["run_dir"], "symbolized")
    assert m["symbol_path"] == f"{root / 'full'};{root / 'stripped'}"
    assert not any(d["cached"] for d in m["debug_ids"])
    assert read_table(scenario["run_dir"], "symbolized", "frames").to_pylist() == scenario["frames"]
