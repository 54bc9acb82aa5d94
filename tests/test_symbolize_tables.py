"""Address tables: binary layouts, agreement with symbolic's own lookup, the publics-only fallback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.symbolize import pdbpublics, pe, symc
from pipeline.symbolize.build import build_table, resolve_debug_id
from pipeline.symbolize.symbolpath import parse_symbol_path
from pipeline.symbolize.table import AddressTable, load_cached
from tests.conftest import fixture_path
from tests.test_symbolize_images import built_images, pe_identity


def test_layout_sizes_match_the_format_notes():
    # symbolic-symcache raw v9: 8-byte preamble + 72-byte header; File 24, Function 16,
    # SourceLocation 16, Range 4 bytes.
    assert symc.HEADER.itemsize == 80
    assert symc.FILE.itemsize == 24
    assert symc.FUNCTION.itemsize == 16
    assert symc.SOURCE_LOCATION.itemsize == 16
    assert symc.RANGE.itemsize == 4
    # MSF superblock 56 bytes, DBI header 64, section map entry 20, IMAGE_SECTION_HEADER 40,
    # S_PUB32 body (flags, offset, segment) 10.
    assert pdbpublics.SUPERBLOCK.itemsize == 56
    assert pdbpublics.DBI_HEADER.itemsize == 64
    assert pdbpublics.SECTION_MAP_ENTRY.itemsize == 20
    assert pdbpublics.IMAGE_SECTION_HEADER.itemsize == 40
    assert pdbpublics.PUB32_BODY.itemsize == 10
    # PE/COFF: COFF file header 20 bytes, IMAGE_DEBUG_DIRECTORY 28
    assert pe.COFF_HEADER.itemsize == 20
    assert pe.DEBUG_DIRECTORY.itemsize == 28


def _symbolic_frames(sc, rva, publics):
    """symbolic's answer, with the names our table may use instead: symbolic strips a leading "_"
    from 64-bit publics, and our table prefers the mangled public name at a function's entry."""
    out = []
    for loc in sc.lookup(rva):
        names = {loc.symbol, "_" + loc.symbol, publics.get(loc.sym_addr)}
        out.append((names, loc.full_path, loc.line))
    return out


@pytest.mark.parametrize("build", ["full", "stripped"])
def test_table_lookup_equals_symbolic_lookup_at_every_byte(build, tmp_path):
    from symbolic import Archive

    exe = built_images() / build / "fakerustc.exe"
    ident = pe_identity(exe)
    pdb = exe.with_suffix(".pdb")
    table, reason = build_table(pdb, ident["debug_id"], tmp_path)
    assert reason is None and table.meta["kind"] == "pdb"
    table = AddressTable.load(table.save(tmp_path / "t"))
    sc = Archive.open(str(pdb)).get_object(arch="x86_64").make_symcache()
    pub_rvas, pub_names, _ = pdbpublics.read_publics(pdb)
    publics = dict(zip(pub_rvas.tolist(), pub_names))

    rvas = np.arange(0, ident["size"] + 0x100, dtype=np.uint64)
    inner = table.innermost(rvas)
    query, loc, depth = table.chains(inner)
    ours: dict[int, list] = {}
    raw = table.raw_names.to_pylist()
    files = table.files.to_pylist()
    for q, l, d in zip(query.tolist(), loc.tolist(), depth.tolist()):
        rec = table.locations[l]
        f = int(rec["file"])
        name = raw[int(rec["function"])]
        ours.setdefault(q, []).append((name, files[f] if f != symc.NONE else None, int(rec["line"]), d))
    mismatches = 0
    covered = 0
    for i, rva in enumerate(rvas.tolist()):
        theirs = _symbolic_frames(sc, rva, publics)
        mine = ours.get(i, [])
        covered += bool(theirs)
        same = len(theirs) == len(mine) and all(
            n in t[0] and (fp or "") == (t[1] or "") and ln == t[2]
            for (n, fp, ln, _), t in zip(mine, theirs)
        )
        # innermost first, inline_depth counts down to 0 for the real function
        same = same and [d for *_, d in mine] == list(range(len(mine) - 1, -1, -1))
        mismatches += not same
    assert covered > 0x100
    assert mismatches == 0


def test_full_pdb_resolves_inline_chain_and_lines(tmp_path):
    root = built_images()
    exe = root / "full" / "fakerustc.exe"
    table, _ = build_table(exe.with_suffix(".pdb"), pe_identity(exe)["debug_id"], tmp_path)
    names = table.names
    # an address inside the loop of core::fmt::write runs the two inlined helpers
    inline_rvas = [pc for pc in range(0x1000, 0x1400)
                   if len(table.chains(table.innermost(np.array([pc], dtype=np.uint64)))[0]) == 3]
    assert inline_rvas, "no address with a three-level inline chain"
    q, loc, depth = table.chains(table.innermost(np.array(inline_rvas[:1], dtype=np.uint64)))
    chain = [(names[int(table.locations[l]["function"])], int(d)) for l, d in zip(loc, depth)]
    assert chain == [("<u64>::wrapping_mul", 2), ("mycrate::hash::mix", 1), ("core::fmt::write", 0)]
    lines = [int(table.locations[l]["line"]) for l in loc]
    src = RUSTNAMES_LINES()
    assert lines == [src["return a * b + 7;"], src["u64 x = _RNvMNtCs1234"], src["for (u64 i = 0;"]]
    files = {table.files[int(table.locations[l]["file"])] for l in loc}
    assert {Path(f).name for f in files} == {"rustnames.c"}


def RUSTNAMES_LINES() -> dict[str, int]:
    from tests.test_symbolize_images import RUSTNAMES_C

    out = {}
    for n, text in enumerate(RUSTNAMES_C.splitlines(), start=1):  # 1-based source lines
        for key in ("return a * b + 7;", "u64 x = _RNvMNtCs1234", "for (u64 i = 0;"):
            if key in text:
                out[key] = n
    return out


def test_publics_reader_agrees_with_symbolic_on_function_starts(tmp_path):
    from symbolic import Archive

    pdb = built_images() / "stripped" / "fakerustc.pdb"
    rvas, names, facts = pdbpublics.read_publics(pdb)
    assert facts["layout"] == "section headers"
    sc = Archive.open(str(pdb)).get_object(arch="x86_64").make_symcache()
    assert len(rvas) >= 8
    for rva, name in zip(rvas.tolist(), names):
        (loc,) = sc.lookup(rva)
        assert loc.sym_addr == rva
        assert loc.symbol in (name, name[1:])
    assert "_RTC_Initialize" in names and "_ZN4core3fmt5write17h0123456789abcdefE" in names


# SizeOfImage of the three .NET native images in perfview-net45-x86/PerfViewData.etl (their
# Image/DCStart events): the section-map layout of their PDBs must give the same sizes.
NGEN_PDBS = {
    "mscorlib.ni.pdb/51e2934144ba15628ba5a31be2dae7dc1/mscorlib.ni.pdb": (0xFBF000, 45534),
    "System.ni.pdb/e40da7a49f8c3f0108e7c835b342f3821/System.ni.pdb": (0x979000, 22541),
    "System.Xml.ni.pdb/9ba07396ae369d010c5c3927a82ef4261/System.Xml.ni.pdb": (0x738000, 16676),
}


@pytest.mark.parametrize("rel", sorted(NGEN_PDBS))
def test_ngen_pdbs_fall_back_to_publics_with_the_traced_image_size(rel, tmp_path):
    pdb = fixture_path(f"etl/perfview-net45-x86/symbols/{rel}")
    size, count = NGEN_PDBS[rel]
    key = pdb.parent.name
    debug_id = f"{key[:8]}-{key[8:12]}-{key[12:16]}-{key[16:20]}-{key[20:32]}-{key[32:]}".lower()
    table, reason = build_table(pdb, debug_id, tmp_path)
    assert reason is None
    assert table.meta["kind"] == "pdb-publics"
    assert table.meta["image_size"] == size
    assert len(table.starts) == count
    assert np.all(np.diff(table.starts.astype(np.int64)) > 0)
    assert table.starts[0] >= 0x1000 and int(table.starts[-1]) < size
    assert not any(n.endswith(")") for n in table.names[:1000])


def test_resolve_task_caches_by_debug_id_and_reports_missing(tmp_path):
    root = built_images() / "full"
    ident = pe_identity(root / "rustlib.dll")
    entries = parse_symbol_path(str(root), tmp_path / "cache")
    desc = {k: ident[k] for k in ("debug_id", "guid", "age", "pdb_name")}
    desc["key"] = desc["debug_id"]
    first = resolve_debug_id(desc, entries, str(tmp_path / "cache"), 5.0)
    assert first["status"] == "ok" and not first["cached"] and first["functions"] >= 2
    second = resolve_debug_id(desc, [], str(tmp_path / "cache"), 5.0)
    assert second["status"] == "ok" and second["cached"]
    assert load_cached(tmp_path / "cache", ident["debug_id"]) is not None

    other = dict(desc, guid="00000000-0000-0000-0000-000000000001", debug_id="00000000-0000-0000-0000-000000000001-1",
                 key="00000000-0000-0000-0000-000000000001-1")
    missing = resolve_debug_id(other, entries, str(tmp_path / "cache"), 5.0)
    # the flat rustlib.pdb in the directory has another GUID
    assert missing["status"] == "missing" and missing["reason"].startswith("GUID mismatch")
    nothing = resolve_debug_id(dict(other, pdb_name="absent.pdb"), entries, str(tmp_path / "cache"), 5.0)
    assert nothing["status"] == "missing" and nothing["reason"].startswith("not found")


def test_a_table_of_another_version_is_neither_read_nor_replaced(tmp_path):
    """A table built by an older version was never replaced: each run built it again, the save kept the old one
    (taken for a concurrent worker's), and the lookup read the old one. Each version now has its own directory:
    the old table (of the old layout, or of another version beside this one) is not read, and stays as it was
    (another install sharing the cache may have it mapped)."""
    import json
    import shutil

    from pipeline.symbolize.table import table_dir

    root = built_images() / "full"
    ident = pe_identity(root / "rustlib.dll")
    entries = parse_symbol_path(str(root), tmp_path / "fresh")
    desc = dict({k: ident[k] for k in ("debug_id", "guid", "age", "pdb_name")}, key=ident["debug_id"])
    assert resolve_debug_id(desc, entries, str(tmp_path / "fresh"), 5.0)["status"] == "ok"
    good = np.load(table_dir(tmp_path / "fresh", ident["debug_id"]) / "starts.npy").copy()
    # (what older versions left: the old layout, and a table of another version)
    here = tmp_path / "cache" / "tables" / ident["debug_id"]
    for old in (here, here / "v0-0.0.1"):
        shutil.copytree(table_dir(tmp_path / "fresh", ident["debug_id"]), old, dirs_exist_ok=True)
        np.save(old / "starts.npy", good[:1])
        meta = json.loads((old / "meta.json").read_text(encoding="utf-8"))
        (old / "meta.json").write_text(json.dumps(dict(meta, table_version=0)), encoding="utf-8")
    found = resolve_debug_id(desc, entries, str(tmp_path / "cache"), 5.0)
    assert found["status"] == "ok" and not found["cached"]
    assert np.array_equal(AddressTable.load(found["table_dir"]).starts, good)
    for old in (here, here / "v0-0.0.1"):
        assert len(np.load(old / "starts.npy")) == 1        # (left as they were)


def test_batched_strings_equal_one_by_one_including_long_and_unicode_names(tmp_path):
    import io

    from symbolic import Archive

    long_name = "_ZN" + "".join(f"{len(p)}{p}" for p in ["segment_number_%03d" % i for i in range(12)]) + "E"
    names = ["short", long_name, "ünïcödé::名前", "x" * 127, "y" * 128]
    lines = ["MODULE windows x86_64 0000000100004000800000000000000A1 x.pdb", "FILE 0 C:\\src\\lib.rs"]
    for k, name in enumerate(names):
        lines.append(f"FUNC {0x1000 + 0x100 * k:x} 80 0 {name}")
    sym = tmp_path / "x.sym"
    sym.write_text("\n".join(lines) + "\n", encoding="utf-8")
    buf = io.BytesIO()
    list(Archive.open(str(sym)).iter_objects())[0].make_symcache().dump_into(buf)
    parsed = symc.SymcFile(buf.getvalue())
    one_by_one = [parsed.string(int(o)) for o in parsed.functions["name"]]
    assert parsed.function_names() == one_by_one
    assert sorted(one_by_one) == sorted(names)
    assert parsed.strings_at(np.array([symc.NONE])) == [None]
