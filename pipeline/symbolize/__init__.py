"""Symbolize stage: every unique stack frame of a run -> module, function, inline chain, file:line.

Entry point: :func:`run`. Reads ``RUN_DIR/decoded/{stacks,images,image_ids}`` and every table whose rows
reference a stack (``STACK_SOURCES``: samples, VirtualAlloc, heap events, heap snapshot blocks, inline
event stacks) and writes ``RUN_DIR/symbolized/frames.parquet`` (see ``schema.md``). The steps:

1. **Frames.** Unique (pid, stack) pairs of those rows (*events*) are expanded into their frames, plus
   each sample's ``ip``; one row per unique (pid, address, role) with its first time. The role is
   *leaf* (frame 0 of a stack, or an ip: the instruction that ran) or *return address* (every other
   frame: the instruction after a call).
2. **Images.** Each frame is mapped to the image loaded at that address in that process at that
   time (:mod:`.images`). Only frames that two images of one process could both cover (a reused
   address range) are mapped again with the time of every event that holds them.
3. **Symbols.** The distinct debug ids of the images that occur go to the dask pool, one task
   each (:func:`.build.resolve_debug_id`): find the PDB or Breakpad file along the symbol path
   (downloading it into the cache once), build its sorted address table once per debug id.
4. **Lookups.** Per debug id, one ``searchsorted`` over the frames' RVAs (a leaf at its rva, a return
   address at rva - 1, inside its call) and gathers up the inline chains give one output row per frame
   and inline level. So one (image, offset, role) resolves to the same names in every process and view.

A missing or unusable symbol file is reported once per image, with its reason, in the manifest
(``images_without_symbols``); its frames stay visible as ``module+0xoffset``.
"""

from __future__ import annotations

import logging
import ntpath
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import ManifestError
from pipeline.progress import Status
from pipeline.runs import has_table, read_manifest, read_table, stage_output
from pipeline.stages import DECODED, SYMBOLIZED

if TYPE_CHECKING:
    from pipeline.contracts import ImageIdentity
    from pipeline.contracts import MissingSymbols, ModuleRate, SymbolizeSummary

STAGE = SYMBOLIZED

log = logging.getLogger("bootprof.symbolize")

INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max


def _column(table, name: str, where: str, fill=None) -> np.ndarray:
    import pyarrow.compute as pc

    if name not in table.column_names:
        raise ManifestError(f"{where}: column '{name}' is missing (has {', '.join(table.column_names)})")
    col = table.column(name)
    if fill is not None and col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy(zero_copy_only=False)


# -- 1. frames ---------------------------------------------------------------------------------


def _explode(pids: np.ndarray, stack_ids: np.ndarray, times: np.ndarray, stack_keys: np.ndarray,
             stack_starts: np.ndarray, stack_stops: np.ndarray,
             values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Frames of each (pid, stack_id, time): (pid, address, is_leaf, time, owner) per frame, vectorized;
    ``owner`` is the index of the (pid, stack_id, time) the frame came from."""
    if len(stack_keys) == 0 or len(stack_ids) == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z.astype(np.uint64), z.astype(bool), z, z
    pos = np.searchsorted(stack_keys, stack_ids)
    pos = np.minimum(pos, len(stack_keys) - 1)
    known = np.flatnonzero(stack_keys[pos] == stack_ids)
    pids, pos, times = pids[known], pos[known], times[known]
    starts = stack_starts[pos]
    lengths = stack_stops[pos] - starts
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(pos)), lengths)
    first = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64) - np.repeat(first, lengths)
    address = values[np.repeat(starts, lengths) + within]
    return pids[owner], address.astype(np.uint64), within == 0, times[owner], known[owner]


def _firsts(pid: np.ndarray, t: np.ndarray, ip: np.ndarray, stack: np.ndarray) -> tuple[tuple[np.ndarray, ...], ...]:
    """The distinct (pid, stack) of the events that have a stack and the distinct (pid, ip) of those that have an
    instruction pointer, each with its first time: DuckDB group-bys over the events where they lie (6.5 M events
    of the 1 GB synth trace: 49,848 pairs and 39,725 ips), so that no column of the events is copied for them and
    the frames' own group-by is not of every sample."""
    import duckdb
    import pyarrow as pa

    con = duckdb.connect()
    con.register("events", pa.table({"pid": pid, "t": t, "ip": ip, "stack": stack}))
    pairs = con.execute("SELECT pid, stack, min(t) AS t FROM events WHERE stack >= 0 GROUP BY pid, stack").fetchnumpy()
    ips = con.execute("SELECT pid, ip, min(t) AS t FROM events WHERE ip <> 0 GROUP BY pid, ip").fetchnumpy()
    i64 = lambda a: np.asarray(a, np.int64)  # noqa: E731
    return ((i64(pairs["pid"]), i64(pairs["stack"]), i64(pairs["t"])),
            (i64(ips["pid"]), np.asarray(ips["ip"], np.uint64), i64(ips["t"])))


def _unique_frames(pid, address, leaf, t):
    """One row per (pid, address, role): the role is leaf or return address; time = min."""
    import pyarrow as pa

    tbl = pa.table({"pid": pid, "address": address, "leaf": leaf, "t": t})
    g = tbl.group_by(["pid", "address", "leaf"], use_threads=True).aggregate([("t", "min")])
    return (g.column("pid").to_numpy(), g.column("address").to_numpy(),
            g.column("leaf").to_numpy(zero_copy_only=False), g.column("t_min").to_numpy())


#: Decoded tables whose rows reference stacks, with the SQL that gives their (pid, timestamp_ns, ip, stack_id):
#: every frame of every one of them is symbolized, so a stack reads the same in the CPU, commit and heap views.
#: Heap-snapshot blocks share their snapshot's time, so one row per (pid, time, stack) stands for them all;
#: inline event stacks (``event_stacks``) take the pid of their event's header.
STACK_SOURCES = {
    "samples": "SELECT pid, timestamp_ns, ip, stack_id FROM {samples}",
    "virtual_allocs": "SELECT pid, timestamp_ns, NULL::UBIGINT AS ip, stack_id FROM {virtual_allocs} WHERE stack_id IS NOT NULL",
    "heap_events": "SELECT pid, timestamp_ns, NULL::UBIGINT AS ip, stack_id FROM {heap_events} WHERE stack_id IS NOT NULL",
    "heap_snapshot_blocks": """SELECT DISTINCT pid, timestamp_ns, NULL::UBIGINT AS ip, stack_id FROM {heap_snapshot_blocks}
                               WHERE stack_id IS NOT NULL""",
    "event_stacks": """SELECT e.pid, s.timestamp_ns, NULL::UBIGINT AS ip, s.stack_id FROM {event_stacks} s
                       JOIN {events} e USING (timestamp, cpu, stream_pos) WHERE s.stack_id IS NOT NULL AND e.pid >= 0""",
}


def stack_events(run_dir: Path) -> tuple[tuple[np.ndarray, ...], dict[str, int]]:
    """(pid, time, ip, stack_id) of every row of the decoded tables that references a stack (``STACK_SOURCES``;
    ip 0 = none, stack_id -1 = none), and the number of rows taken from each table.

    One DuckDB query over all of them gives each column once, in its final type (6.5 M rows on the 1 GB synth
    trace: every copy of a column is ~50 MB of fresh memory)."""
    import duckdb

    from pipeline.runs import parquet_glob, table_path

    selects, params, names = [], [], []
    for name, sql in STACK_SOURCES.items():
        needs = re.findall(r"\{(\w+)\}", sql)
        if not all(has_table(run_dir, DECODED, t) for t in needs):
            continue
        # (paths are bound as parameters, never pasted into the SQL)
        views = {t: f"read_parquet(${len(params) + i + 1})" for i, t in enumerate(needs)}
        params += [parquet_glob(table_path(run_dir, DECODED, t)) for t in needs]
        selects.append(f"""SELECT {len(names)}::UTINYINT AS source, coalesce(pid, 0)::BIGINT AS pid,
                                  coalesce(timestamp_ns, 0)::BIGINT AS t, coalesce(ip, 0)::UBIGINT AS ip,
                                  coalesce(stack_id, -1)::BIGINT AS stack_id
                           FROM ({sql.format(**views)})""")
        names.append(name)
    if not selects:
        z = np.zeros(0, np.int64)
        return (z, z, z.astype(np.uint64), z), {}
    cols = duckdb.connect().execute(" UNION ALL ".join(selects), params).fetchnumpy()
    counts = np.bincount(np.asarray(cols["source"]), minlength=len(names))
    events = tuple(np.ascontiguousarray(cols[c], dtype=t) for c, t in
                   (("pid", np.int64), ("t", np.int64), ("ip", np.uint64), ("stack_id", np.int64)))
    return events, {name: int(n) for name, n in zip(names, counts.tolist())}


def collect_frames(run_dir: Path) -> dict[str, np.ndarray]:
    """Unique (pid, address, role) frames of the run with their first time; plus what refinement needs. The role
    (``leaf``) is leaf (frame 0 of a stack, or an ip) or return address (every other frame).

    The frames are those of every stack a decoded table references (``STACK_SOURCES``) and every sample's
    ``ip``; each row of those tables is an *event* here."""
    import pyarrow as pa
    import pyarrow.compute as pc

    (s_pid, s_t, s_ip, s_stack), sources = stack_events(run_dir)

    stacks = read_table(run_dir, DECODED, "stacks", columns=["stack_id", "frames"])
    keys = _column(stacks, "stack_id", f"{run_dir}/{DECODED}/stacks.parquet").astype(np.int64)
    lists = stacks.column("frames")
    lists = lists.combine_chunks() if lists.num_chunks else pa.array([], pa.list_(pa.uint64()))
    if isinstance(lists, pa.ChunkedArray):
        lists = pa.concat_arrays(lists.chunks)
    if lists.null_count:
        lists = pc.fill_null(lists, pa.scalar([], lists.type))
    offsets = lists.offsets.to_numpy().astype(np.int64)  # absolute positions in lists.values
    values = lists.values.to_numpy(zero_copy_only=False).astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    stack_index = (keys[order], offsets[:-1][order], offsets[1:][order], values)

    # the distinct (pid, stack) pairs and (pid, ip) of the events, each with its first time
    (p_pid, p_stack, p_t), (i_pid, i_ip, i_t) = _firsts(s_pid, s_t, s_ip, s_stack)
    f_pid, f_addr, f_leaf, f_t, f_pair = _explode(p_pid, p_stack, p_t, *stack_index)
    pid = np.concatenate([f_pid, i_pid])
    address = np.concatenate([f_addr, i_ip])
    leaf = np.concatenate([f_leaf, np.ones(len(i_ip), dtype=bool)])
    t = np.concatenate([f_t, i_t])
    u_pid, u_addr, u_leaf, u_t = _unique_frames(pid, address, leaf, t)
    return {
        "pid": u_pid.astype(np.int64), "address": u_addr.astype(np.uint64), "leaf": u_leaf.astype(bool),
        "t": u_t.astype(np.int64),
        "events": (s_pid, s_t, s_ip, s_stack), "sources": sources,
        # the distinct (pid, stack) pairs of the events and their frames (pair, pid, address, is_leaf), for
        # the frames of reused address ranges (``map_images``)
        "pairs": (p_pid, p_stack), "pair_frames": (f_pair, f_pid, f_addr, f_leaf),
    }


# -- 2. images ---------------------------------------------------------------------------------


def map_images(frames: dict, images) -> dict[str, np.ndarray]:
    """Add ``image`` (row of the images table, -1 none) to the frames; split reused ranges by time."""
    from pipeline.symbolize.images import ImageIndex

    where = "decoded/images.parquet"
    index = ImageIndex(
        _column(images, "pid", where, 0).astype(np.int64),
        _column(images, "base", where, 0).astype(np.uint64),
        _column(images, "size", where, 0).astype(np.uint64),
        _column(images, "load_ns", where, INT64_MIN).astype(np.int64),
        _column(images, "unload_ns", where, INT64_MAX).astype(np.int64),
    )
    rows, count = index.find(frames["pid"], frames["address"], frames["t"])
    out = {k: frames[k] for k in ("pid", "address", "leaf")}
    out["image"] = rows
    ambiguous = count >= 2
    out["reused_range_frames"] = int(ambiguous.sum())
    if not ambiguous.any():
        return out
    # Frames two images could hold: every occurrence of them in an event is weighed with the event's own time.
    a_pid, a_addr, a_leaf = out["pid"][ambiguous], out["address"][ambiguous], out["leaf"][ambiguous]
    cands = index.candidates(a_pid, a_addr, int(count[ambiguous].max()))
    used = np.zeros(cands.shape, bool)
    for occurrences in _occurrences(frames, a_pid, a_addr, a_leaf):
        index.mark_chosen(cands, *occurrences, used)
    a_row, a_slot = np.nonzero(used)
    keep = ~ambiguous
    out["pid"] = np.concatenate([out["pid"][keep], a_pid[a_row]])
    out["address"] = np.concatenate([out["address"][keep], a_addr[a_row]])
    out["leaf"] = np.concatenate([out["leaf"][keep], a_leaf[a_row]])
    out["image"] = np.concatenate([out["image"][keep], index.rows(cands[a_row, a_slot])])
    return out


def _occurrences(frames: dict, a_pid: np.ndarray, a_addr: np.ndarray,
                 a_leaf: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """Every occurrence in an event of the frames (``a_pid``, ``a_addr``, ``a_leaf``), as groups of frames given to
    events (what :meth:`.images.ImageIndex.mark_chosen` takes): ``(members, first, count, group, times)``, where
    event ``j`` at ``times[j]`` holds the frames ``members[first[g]:first[g] + count[g]]`` of its group
    ``g = group[j]``. From the events' stacks (a group: a distinct (pid, stack) pair's ambiguous frames) and the
    samples' instruction pointers (a group of one frame each).

    The frames are found once per distinct (pid, stack) pair that holds one, then given to that pair's
    samples, which are never expanded into their occurrences one by one: on the 1 GB synth trace (89,994 such
    frames in 8.7 M occurrences) the expansion alone was 5 arrays of 8.7 M rows."""
    import pyarrow as pa

    s_pid, s_t, s_ip, s_stack = frames["events"]
    p_pid, p_stack = frames["pairs"]
    f_pair, f_pid, f_addr, f_leaf = frames["pair_frames"]
    amb = pa.table({"pid": a_pid, "address": a_addr, "leaf": a_leaf, "a": np.arange(len(a_pid), dtype=np.int64)})
    # (pair, frame) of the pairs' frames that are ambiguous, grouped by pair
    hits = pa.table({"pid": f_pid, "address": f_addr, "leaf": f_leaf, "pair": f_pair}).join(
        amb, keys=["pid", "address", "leaf"], join_type="inner")
    h_pair, h_a = hits.column("pair").to_numpy(), hits.column("a").to_numpy()
    order = np.argsort(h_pair, kind="stable")
    h_pair, h_a = h_pair[order], h_a[order]
    flagged, first, n = np.unique(h_pair, return_index=True, return_counts=True)
    # the samples of those pairs, each given its pair's ambiguous frames
    affected = np.isin(s_pid, np.unique(a_pid))
    mine = np.flatnonzero(affected & (s_stack >= 0))
    matched = pa.table({"pid": s_pid[mine], "stack_id": s_stack[mine], "t": s_t[mine]}).join(
        pa.table({"pid": p_pid[flagged], "stack_id": p_stack[flagged], "fp": np.arange(len(flagged), dtype=np.int64)}),
        keys=["pid", "stack_id"], join_type="inner")
    groups = [(h_a, first, n, matched.column("fp").to_numpy(), matched.column("t").to_numpy())]
    # instruction pointers (leaf frames) that are ambiguous
    ips = np.flatnonzero(affected & (s_ip != 0))
    if len(ips):
        ip_hits = pa.table({"pid": s_pid[ips], "address": s_ip[ips], "leaf": np.ones(len(ips), bool),
                            "t": s_t[ips]}).join(amb, keys=["pid", "address", "leaf"], join_type="inner")
        k = np.arange(ip_hits.num_rows, dtype=np.int64)
        groups.append((ip_hits.column("a").to_numpy(), k, np.ones(len(k), np.int64), k, ip_hits.column("t").to_numpy()))
    return [tuple(np.ascontiguousarray(a, dtype=np.int64) for a in g) for g in groups]


def _sorted(mapped: dict, images) -> dict:
    """Frames in output order: pid, address, role (return address first), then the image's load time."""
    loads = _column(images, "load_ns", "decoded/images.parquet", INT64_MIN).astype(np.int64)
    load = np.where(mapped["image"] >= 0, loads[np.maximum(mapped["image"], 0)] if len(loads) else 0, INT64_MIN)
    order = np.lexsort((load, mapped["leaf"], mapped["address"], mapped["pid"]))
    return {k: (v[order] if isinstance(v, np.ndarray) else v) for k, v in mapped.items()}


def image_debug_ids(images, image_ids) -> list[ImageIdentity | None]:
    """Symbol identity of each images row: a dict with ``key`` (what the lookup task is keyed by),
    or None when neither a DbgID record nor the binary's TimeDateStamp is known.

    A DbgID record (``guid``, ``age``, ``pdb_name``, ``debug_id``; key = debug id) belongs to the
    image with the same (pid, base); when a range was reused and several loads share that key, the
    record's ``timestamp_ns`` (if the table has it) picks the latest load at or before it. An image
    without its own record borrows the one of another load of the same file name (the same file
    has the same PDB). Failing that, an image with a TimeDateStamp gets the binary's identity
    (``code_file``, ``code_key``; key = ``pe:<name>/<code key>``): the task fetches the binary and
    reads its PDB identity from it.
    """
    from pipeline.symbolize.build import debug_id_of

    n = images.num_rows
    ids: list[ImageIdentity | None] = [None] * n
    if image_ids is not None and image_ids.num_rows:
        _dbgid_identities(images, image_ids, ids, debug_id_of)
    names = images.column("file_name").to_pylist()
    by_name = {names[i].lower(): ident for i, ident in enumerate(ids) if ident is not None and names[i]}
    stamps = (_column(images, "time_date_stamp", "decoded/images.parquet", 0).tolist()
              if "time_date_stamp" in images.column_names else [0] * n)
    sizes = _column(images, "size", "decoded/images.parquet", 0).tolist()
    for i in range(n):
        if ids[i] is None and names[i] and names[i].lower() in by_name:
            ids[i] = by_name[names[i].lower()]
        elif ids[i] is None and stamps[i] and names[i]:
            from pipeline.symbolize.pe import code_key

            file = module_name(names[i])
            ck = code_key(stamps[i], sizes[i])
            ids[i] = {"key": f"pe:{file}/{ck}", "code_file": file, "code_key": ck, "debug_id": None,
                      "pdb_name": None}
    return ids


def _dbgid_identities(images, image_ids, ids: list, debug_id_of) -> None:
    """Fill ``ids`` from the trace's DbgID records (see :func:`image_debug_ids`)."""
    where = "decoded/image_ids.parquet"
    img_pid = _column(images, "pid", "decoded/images.parquet", 0).tolist()
    img_base = _column(images, "base", "decoded/images.parquet", 0).tolist()
    img_load = _column(images, "load_ns", "decoded/images.parquet", INT64_MIN).tolist()
    loads_of: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(img_pid, img_base)):
        loads_of.setdefault(key, []).append(i)
    n_ids = image_ids.num_rows
    times = (_column(image_ids, "timestamp_ns", where, 0).tolist() if "timestamp_ns" in image_ids.column_names
             else [None] * n_ids)
    kinds = (image_ids.column("debug_kind").to_pylist() if "debug_kind" in image_ids.column_names
             else [None] * n_ids)
    records = sorted(
        zip(_column(image_ids, "pid", where, 0).tolist(), _column(image_ids, "base", where, 0).tolist(),
            image_ids.column("pdb_guid").to_pylist(), image_ids.column("pdb_age").to_pylist(),
            image_ids.column("pdb_name").to_pylist(), times, kinds),
        # a native image's own PDB (RSDS) wins over the IL assembly's (ILRSDS) of the same load:
        # it is applied last
        key=lambda r: r[6] == "RSDS",
    )
    for pid, base, guid, age, name, ts, _kind in records:
        rows = loads_of.get((int(pid), int(base)))
        if not guid or age is None or not name or not rows:
            continue
        if len(rows) > 1 and ts is not None:
            before = [r for r in rows if img_load[r] <= ts]
            rows = [max(before, key=lambda r: img_load[r])] if before else [min(rows, key=lambda r: img_load[r])]
        debug_id = debug_id_of(str(guid), int(age))
        ident = {"key": debug_id, "guid": str(guid), "age": int(age),
                 "pdb_name": ntpath.basename(name.replace("/", "\\")), "debug_id": debug_id}
        for r in rows:
            ids[r] = ident


def module_name(file_name: str | None) -> str | None:
    if not file_name:
        return None
    return ntpath.basename(file_name.replace("/", "\\")) or file_name


# -- 3 + 4. symbols and lookups ----------------------------------------------------------------


def run(run_dir: Path, config, pool, inputs: list[Path] | None = None) -> SymbolizeSummary:
    """Symbolize ``RUN_DIR/decoded`` into ``RUN_DIR/symbolized``; returns the stage's summary."""
    from pipeline.cluster import Pool
    from pipeline.symbolize.build import resolve_debug_id
    from pipeline.symbolize.symbolpath import parse_symbol_path
    from pipeline.symbolize.table import is_cached

    run_dir = Path(run_dir)
    cfg = config.symbolize
    t0 = time.perf_counter()
    decoded = read_manifest(run_dir, DECODED)
    if not (has_table(run_dir, DECODED, "stacks") and has_table(run_dir, DECODED, "images")):
        # A run of self-profiles only has no stacks: the stage finishes with nothing to resolve, so a
        # job's later stages run as usual.
        with stage_output(run_dir, STAGE, inputs=decoded.get("inputs", []), config=config.resolved(),
                          upstream=(DECODED,)) as out:
            out.manifest["skipped"] = "no ETL stacks or images in decoded/"
        return {"frames": 0, "skipped": "no ETL stacks or images in decoded/"}
    cache_dir = Path(cfg.cache_dir).expanduser().absolute()
    symbol_path = cfg.symbol_path if cfg.symbol_path is not None else os.environ.get("_NT_SYMBOL_PATH", "")
    bundled = run_dir / "symbols"
    if bundled.is_dir():        # (the PDBs that capture copied with the run: searched first)
        symbol_path = f"{bundled.absolute()};{symbol_path}" if symbol_path else str(bundled.absolute())
    entries = parse_symbol_path(symbol_path, cache_dir)

    frames = collect_frames(run_dir)
    images = read_table(run_dir, DECODED, "images")
    image_ids = read_table(run_dir, DECODED, "image_ids") if has_table(run_dir, DECODED, "image_ids") else None
    mapped = _sorted(map_images(frames, images), images)
    t_frames = time.perf_counter()

    ids = image_debug_ids(images, image_ids)
    used = np.unique(mapped["image"][mapped["image"] >= 0])
    wanted: dict[str, ImageIdentity] = {}
    for row in used.tolist():
        if ids[row] is not None:
            wanted.setdefault(ids[row]["key"], ids[row])
    descs = [wanted[k] for k in sorted(wanted)]
    # Workers only for the symbol files to find and read: a table in the cache, or an image with nowhere to
    # look (no symbol path), takes milliseconds here, and a lazy pool then starts no cluster.
    todo = [d for d in descs if entries and (d.get("code_file") or not is_cached(cache_dir, d["debug_id"]))]
    here = [d for d in descs if d not in todo]
    # (on a terminal: how many symbol files are resolved, read or downloaded, out of how many)
    if todo:        # (the tasks write the symbol tables there, and this process reads them)
        cache_dir.mkdir(parents=True, exist_ok=True)
        pool.require_shared(cache_dir, "symbolize.cache_dir")
    missing_reader = symbolic_missing()
    if missing_reader:
        # (no symbol file can be read: every image stays unresolved, and the run goes on)
        print(f"bootprof: symbolize: {missing_reader}", file=sys.stderr)
        results = [{"key": d["key"], "status": "missing", "reason": missing_reader} for d in descs]
        todo = here = []
    with Status("symbolize", len(descs), unit="symbol files") as shown:
        shared = dict(on_result=lambda _: shown.advance(1), entries=entries, cache_dir=str(cache_dir),
                      fetch=fetch_limits(cfg))
        # (a map of nothing starts no cluster)
        results = (results if missing_reader else []) + Pool(None).map(resolve_debug_id, here, **shared) \
            + pool.map(resolve_debug_id, todo, **shared)
    status = {r["key"]: r for r in results}
    t_symbols = time.perf_counter()

    frames_table, stats = assemble(mapped, images, ids, status)
    t_lookup = time.perf_counter()

    with stage_output(run_dir, STAGE, inputs=decoded.get("inputs", []), config=config.resolved(),
                      upstream=(DECODED,)) as out:
        # string columns are dictionary arrays in memory; without the stored Arrow schema, readers see
        # plain strings (the parquet column is dictionary-encoded either way)
        out.write_table("frames", frames_table, store_schema=False)
        out.manifest.update(stats)
        out.manifest["symbol_path"] = symbol_path
        out.manifest["cache_dir"] = str(cache_dir)
        out.manifest["symbolic_missing"] = missing_reader
        out.manifest["debug_ids"] = sorted(
            ({k: v for k, v in r.items() if k != "tried"} for r in results), key=lambda r: r["key"])
        out.manifest["http_requests"] = int(sum(r.get("requests", 0) for r in results))
        out.manifest["reused_range_frames"] = mapped["reused_range_frames"]
        out.manifest["stack_sources"] = frames["sources"]
        out.manifest["timings_s"] = {
            "frames_and_images": round(t_frames - t0, 3),
            "symbol_files": round(t_symbols - t_frames, 3),
            "lookups": round(t_lookup - t_symbols, 3),
        }
    for img in stats["images_without_symbols"]:
        log.info("no symbols for %s (%s): %s", img["module"], img["debug_id"], img["reason"])
    if stats["images_without_symbols"]:
        log.warning("%d images without symbols (reasons in %s/%s/_manifest.json, images_without_symbols)",
                    len(stats["images_without_symbols"]), run_dir, STAGE)
    return {
        "frames": stats["frames"],
        "rows": frames_table.num_rows,
        "resolved_frames": stats["resolved_frames"],
        "resolution_rate": stats["resolution_rate"],
        "images_without_symbols": len(stats["images_without_symbols"]),
    }


#: What symbolize says when it cannot read symbol files: ``symbolic`` has wheels for Linux and macOS, not for
#: Windows, where pip builds it from its sdist with a Rust toolchain.
SYMBOLIC_MISSING = ("the `symbolic` package is not installed, so no symbol file can be read and frames stay "
                    "unresolved (module+0xoffset); with a Rust toolchain (https://rustup.rs), `pip install symbolic` "
                    "builds it from its sdist")


def symbolic_missing() -> str | None:
    """Why symbol files cannot be read here (``SYMBOLIC_MISSING``), or None when they can."""
    import importlib.util

    return SYMBOLIC_MISSING if importlib.util.find_spec("symbolic") is None else None


def fetch_limits(cfg):
    """The download limits of the ``symbolize`` config section."""
    from pipeline.config import parse_size
    from pipeline.symbolize.symbolpath import Fetch

    return Fetch(timeout_s=cfg.download_timeout_s, deadline_s=cfg.download_deadline_s,
                 max_bytes=parse_size(cfg.download_max_bytes), redirect_hosts=tuple(cfg.redirect_hosts))


def assemble(mapped: dict, images, ids: list, status: dict[str, dict]):
    """Build ``frames.parquet`` rows and the manifest statistics from mapped frames and tables."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.symbolize.table import NONE, AddressTable

    n = len(mapped["address"])
    image = mapped["image"]
    bases = _column(images, "base", "images", 0).astype(np.uint64)
    loads = images.column("load_ns")
    unloads = images.column("unload_ns")
    modules = [module_name(f) for f in images.column("file_name").to_pylist()]
    has_image = image >= 0
    safe = np.maximum(image, 0)
    rva = np.where(has_image, mapped["address"] - bases[safe], 0).astype(np.uint64)
    # identity keys as small integer codes: code 0 = none, k = keys[k]
    keys = [None] + sorted({i["key"] for i in ids if i})
    code_of = {name: k for k, name in enumerate(keys)}
    image_code = np.array([code_of[i["key"]] if i else 0 for i in ids] + [0], dtype=np.int64)
    # the debug id shown per key: from the trace, or learned from the binary
    shown = [None] + [(status.get(k, {}).get("debug_id") or status.get(k, {}).get("learned_debug_id"))
                      for k in keys[1:]]
    frame_code = image_code[np.where(has_image, image, len(ids))]
    lookup_rva = rva - np.where(mapped["leaf"] | (rva == 0), 0, 1).astype(np.uint64)
    by_code = np.argsort(frame_code, kind="stable")
    bounds = np.searchsorted(frame_code[by_code], np.arange(len(keys) + 1))

    # Every string column is built as a dictionary array: per-row int indices into one dictionary
    # (the concatenated names / files of all tables), gathered with numpy. No string is copied per
    # row in Python or Arrow; the parquet writer stores the strings (see write_frames).
    parts: list[dict[str, np.ndarray]] = []
    names_dict: list = []       # pa arrays: each table's display names, then the unresolved names
    raw_dict: list = []
    files_dict: list = []
    n_names = n_files = 0
    resolved = np.zeros(n, dtype=bool)
    for key, res in sorted(status.items()):
        if res.get("status") != "ok":
            continue
        code = code_of.get(key)
        if code is None:
            continue
        sel = by_code[bounds[code] : bounds[code + 1]]
        if len(sel) == 0:
            continue
        table = AddressTable.load(Path(res["table_dir"]))
        query, loc, depth = table.chains(table.innermost(lookup_rva[sel]))
        if len(query) == 0:
            continue
        locs = table.locations[loc]
        file_idx = locs["file"].astype(np.int64)
        has_file = (file_idx != NONE) & (file_idx < len(table.files))
        line = locs["line"].astype(np.int64)
        resolved[sel[query]] = True
        parts.append({
            "frame": sel[query], "inline_depth": depth, "name": n_names + locs["function"].astype(np.int64),
            "file": np.where(has_file, n_files + file_idx, -1), "line": line,
        })
        names_dict.extend(table.names.chunks)
        raw_dict.extend(table.raw_names.chunks)
        files_dict.extend(table.files.chunks)
        n_names += len(table.names)
        n_files += len(table.files)
    unres = np.flatnonzero(~resolved)
    if len(unres):
        labels = [
            f"{modules[int(image[k])] or '?'}+0x{int(rva[k]):x}" if image[k] >= 0 else f"0x{int(mapped['address'][k]):x}"
            for k in unres.tolist()
        ]
        names_dict.append(pa.array(labels, pa.string()))
        parts.append({
            "frame": unres, "inline_depth": np.zeros(len(unres), dtype=np.int64),
            "name": n_names + np.arange(len(unres), dtype=np.int64), "file": np.full(len(unres), -1, np.int64),
            "line": np.zeros(len(unres), dtype=np.int64),
        })

    def gather(key):
        return np.concatenate([p[key] for p in parts]) if parts else np.zeros(0, dtype=np.int64)

    frame, depth = gather("frame"), gather("inline_depth")
    order = np.lexsort((depth, frame))
    frame, depth = frame[order], depth[order]
    name_idx, file_idx, line = gather("name")[order], gather("file")[order], gather("line")[order]
    img = image[frame]

    def dictionary(indices: np.ndarray, values: list, valid: np.ndarray | None = None):
        """Rows ``values[indices]``; null where ``valid`` is false or the value itself is null."""
        values = pa.concat_arrays([v.cast(pa.string()) for v in values]) if values else pa.array([], pa.string())
        safe_idx = np.where(indices >= 0, indices, 0).astype(np.int32)
        ok = np.ones(len(indices), dtype=bool) if valid is None else valid.copy()
        if values.null_count:
            present = values.is_valid().to_numpy(zero_copy_only=False)
            ok &= present[safe_idx] if len(values) else False
            values = pc.fill_null(values, "")
        if len(values) == 0:
            values = pa.array([""], pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(safe_idx, mask=~ok), values)

    def per_image(col):
        vals = col.take(pa.array(np.maximum(img, 0))) if len(col) else pa.nulls(len(frame), pa.int64())
        return pc.if_else(pa.array(img < 0), pa.scalar(None, vals.type), vals)

    is_resolved = resolved[frame]
    table = pa.table({
        "address": pa.array(mapped["address"][frame], pa.uint64()),
        "pid": pa.array(mapped["pid"][frame], pa.uint32()),
        "leaf": pa.array(mapped["leaf"][frame]),
        "module": dictionary(img, [pa.array(modules, pa.string())], img >= 0),
        "rva": pa.array(rva[frame], pa.uint64(), mask=img < 0),
        "function": dictionary(name_idx, names_dict),
        "raw_name": dictionary(name_idx, raw_dict, is_resolved),
        "inline_depth": pa.array(depth, pa.uint16()),
        "file": dictionary(file_idx, files_dict, file_idx >= 0),
        "line": pa.array(line, pa.uint32(), mask=line <= 0),
        "resolved": pa.array(is_resolved),
        "debug_id": dictionary(frame_code[frame], [pa.array(shown, pa.string())], frame_code[frame] > 0),
        "image_load_ns": per_image(loads),
        "image_unload_ns": per_image(unloads),
    })
    stats = _statistics(mapped, image, modules, ids, status, resolved)
    return table, stats


def _statistics(mapped, image, modules, ids, status, resolved) -> dict[str, Any]:
    """Resolution rate per module and one entry per image without symbols (with its reason)."""
    n = len(image)
    names = sorted({m or "?" for m in modules}) + ["(no image)"]
    code_of = {name: i for i, name in enumerate(names)}
    image_code = np.array([code_of[m or "?"] for m in modules] + [len(names) - 1], dtype=np.int64)
    frame_code = image_code[np.where(image >= 0, image, len(modules))]
    frames_per = np.bincount(frame_code, minlength=len(names))
    resolved_per = np.bincount(frame_code, weights=resolved.astype(np.int64), minlength=len(names)).astype(np.int64)
    per_module: dict[str, ModuleRate] = {
        names[i]: {"frames": int(frames_per[i]), "resolved": int(resolved_per[i]),
                   "rate": round(int(resolved_per[i]) / int(frames_per[i]), 6)}
        for i in np.flatnonzero(frames_per).tolist()
    }
    missing: dict[tuple[str, str], MissingSymbols] = {}
    used, counts = np.unique(image[image >= 0], return_counts=True)
    for row, count in zip(used.tolist(), counts.tolist()):
        ident = ids[row]
        if ident is None:
            reason, debug_id = ("no debug id: the trace has no DbgID_RSDS record and no TimeDateStamp "
                                "for this image"), ""
        else:
            res = status.get(ident["key"], {})
            debug_id = ident["debug_id"] or res.get("learned_debug_id") or ident["key"]
            if res.get("status") == "ok":
                continue
            reason = res.get("reason") or "not found"
        module = modules[row] or "?"
        entry = missing.setdefault((module, debug_id), {"module": module, "debug_id": debug_id or None,
                                                         "pdb_name": ident["pdb_name"] if ident else None,
                                                         "reason": reason, "frames": 0})
        entry["frames"] += count
    total_resolved = int(resolved.sum())
    return {
        "frames": n,
        "resolved_frames": total_resolved,
        "resolution_rate": round(total_resolved / n, 6) if n else 0.0,
        "modules": per_module,
        "images_without_symbols": sorted(missing.values(), key=lambda e: (e["module"], e["debug_id"] or "")),
    }


def headline(summary: SymbolizeSummary) -> str:
    """The stage's line in a job's output."""
    if summary.get("skipped"):
        return f"nothing to resolve: {summary['skipped']}"
    missing = summary.get("images_without_symbols", 0)
    return (f"{summary.get('frames', 0):,} frames, {100 * summary.get('resolution_rate', 0):.1f} % resolved"
            + (f" ({missing:,} images without symbols)" if missing else ""))
