"""Steps 1 and 2 of the symbolize stage: every unique frame of the stacks that a decoded table's rows reference
(``STACK_SOURCES``), each with its first time and role (leaf or return address), and the image each falls in."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pipeline.errors import ManifestError
from pipeline.runs import has_table, read_table
from pipeline.stages import DECODED


INT64_MIN = np.iinfo(np.int64).min


INT64_MAX = np.iinfo(np.int64).max


def column(table, name: str, where: str, fill=None) -> np.ndarray:
    import pyarrow.compute as pc

    if name not in table.column_names:
        raise ManifestError(f"{where}: column '{name}' is missing (has {', '.join(table.column_names)})")
    col = table.column(name)
    if fill is not None and col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy(zero_copy_only=False)


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


def _firsts(events: "StackEvents") -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The distinct (pid, stack) of the events that have a stack and the distinct (pid, ip) of those that have an
    instruction pointer, each with its first time: DuckDB group-bys over the decoded tables where they lie (6.5 M
    events of the 1 GB synth trace: 49,848 pairs and 39,725 ips), so that no column of the events is fetched for
    them (their arrays were 200 MB at 1 GB) and the frames' own group-by is not of every sample."""
    i64 = lambda a: np.asarray(a, np.int64)  # noqa: E731
    pairs = events.query("SELECT pid, stack_id, min(t) AS t FROM ev WHERE stack_id >= 0 GROUP BY pid, stack_id")
    ips = events.query("SELECT pid, ip, min(t) AS t FROM ev WHERE ip <> 0 GROUP BY pid, ip")
    return ((i64(pairs["pid"]), i64(pairs["stack_id"]), i64(pairs["t"])),
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


class StackEvents:
    """Every row of the decoded tables that references a stack (``STACK_SOURCES``), as one DuckDB view ``ev`` of
    (source, pid, t, ip, stack_id) over their parquet (ip 0 = none, stack_id -1 = none): read where they lie, by
    group-bys (:func:`_firsts`) and, for the few processes whose frames two images could hold, row by row
    (:meth:`of_pids`). ``sources``: the rows taken from each table."""

    def __init__(self, run_dir: Path):
        import duckdb

        from pipeline.runs import parquet_glob, sql_path, table_path

        selects, names = [], []
        for name, sql in STACK_SOURCES.items():
            needs = re.findall(r"\{(\w+)\}", sql)
            if not all(has_table(run_dir, DECODED, t) for t in needs):
                continue
            views = {t: f"read_parquet({sql_path(parquet_glob(table_path(run_dir, DECODED, t)))})" for t in needs}
            selects.append(f"""SELECT {len(names)}::UTINYINT AS source, coalesce(pid, 0)::BIGINT AS pid,
                                      coalesce(timestamp_ns, 0)::BIGINT AS t, coalesce(ip, 0)::UBIGINT AS ip,
                                      coalesce(stack_id, -1)::BIGINT AS stack_id
                               FROM ({sql.format(**views)})""")
            names.append(name)
        self.con = duckdb.connect()
        if not selects:
            selects = ["SELECT 0::UTINYINT AS source, 0::BIGINT AS pid, 0::BIGINT AS t, 0::UBIGINT AS ip, "
                       "-1::BIGINT AS stack_id WHERE false"]
        self.con.execute(f"CREATE VIEW ev AS {' UNION ALL '.join(selects)}")
        counts = dict(self.con.execute("SELECT source, count(*) FROM ev GROUP BY source").fetchall())
        self.sources = {name: int(counts.get(k, 0)) for k, name in enumerate(names)}

    def query(self, sql: str, params: list | None = None) -> dict[str, np.ndarray]:
        return self.con.execute(sql, params or []).fetchnumpy()

    def of_pids(self, pids: np.ndarray) -> tuple[np.ndarray, ...]:
        """(pid, time, ip, stack_id) of the events of ``pids``."""
        # (a semi-join on the pids, not a search of the list for every event)
        cols = self.query("SELECT pid, t, ip, stack_id FROM ev WHERE pid IN (SELECT unnest($1::BIGINT[]))",
                          [[int(p) for p in np.unique(pids)]])
        return tuple(np.ascontiguousarray(cols[c], dtype=t) for c, t in
                     (("pid", np.int64), ("t", np.int64), ("ip", np.uint64), ("stack_id", np.int64)))


def collect_frames(run_dir: Path) -> dict[str, np.ndarray]:
    """Unique (pid, address, role) frames of the run with their first time; plus what refinement needs. The role
    (``leaf``) is leaf (frame 0 of a stack, or an ip) or return address (every other frame).

    The frames are those of every stack a decoded table references (``STACK_SOURCES``) and every sample's
    ``ip``; each row of those tables is an *event* here."""
    import pyarrow as pa
    import pyarrow.compute as pc

    events = StackEvents(run_dir)

    stacks = read_table(run_dir, DECODED, "stacks", columns=["stack_id", "frames"])
    keys = column(stacks, "stack_id", f"{run_dir}/{DECODED}/stacks.parquet").astype(np.int64)
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
    (p_pid, p_stack, p_t), (i_pid, i_ip, i_t) = _firsts(events)
    f_pid, f_addr, f_leaf, f_t, f_pair = _explode(p_pid, p_stack, p_t, *stack_index)
    pid = np.concatenate([f_pid, i_pid])
    address = np.concatenate([f_addr, i_ip])
    leaf = np.concatenate([f_leaf, np.ones(len(i_ip), dtype=bool)])
    t = np.concatenate([f_t, i_t])
    u_pid, u_addr, u_leaf, u_t = _unique_frames(pid, address, leaf, t)
    return {
        "pid": u_pid.astype(np.int64), "address": u_addr.astype(np.uint64), "leaf": u_leaf.astype(bool),
        "t": u_t.astype(np.int64),
        "events": events, "sources": events.sources,
        # the distinct (pid, stack) pairs of the events and their frames (pair, pid, address, is_leaf), for
        # the frames of reused address ranges (``map_images``)
        "pairs": (p_pid, p_stack), "pair_frames": (f_pair, f_pid, f_addr, f_leaf),
    }


def map_images(frames: dict, images) -> dict[str, np.ndarray]:
    """Add ``image`` (row of the images table, -1 none) to the frames; split reused ranges by time."""
    from pipeline.symbolize.images import ImageIndex

    where = "decoded/images.parquet"
    index = ImageIndex(
        column(images, "pid", where, 0).astype(np.int64),
        column(images, "base", where, 0).astype(np.uint64),
        column(images, "size", where, 0).astype(np.uint64),
        column(images, "load_ns", where, INT64_MIN).astype(np.int64),
        column(images, "unload_ns", where, INT64_MAX).astype(np.int64),
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

    s_pid, s_t, s_ip, s_stack = frames["events"].of_pids(a_pid)
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
    # (the events are those of the processes with ambiguous frames alone: ``StackEvents.of_pids``)
    mine = np.flatnonzero(s_stack >= 0)
    matched = pa.table({"pid": s_pid[mine], "stack_id": s_stack[mine], "t": s_t[mine]}).join(
        pa.table({"pid": p_pid[flagged], "stack_id": p_stack[flagged], "fp": np.arange(len(flagged), dtype=np.int64)}),
        keys=["pid", "stack_id"], join_type="inner")
    groups = [(h_a, first, n, matched.column("fp").to_numpy(), matched.column("t").to_numpy())]
    # instruction pointers (leaf frames) that are ambiguous
    ips = np.flatnonzero(s_ip != 0)
    if len(ips):
        ip_hits = pa.table({"pid": s_pid[ips], "address": s_ip[ips], "leaf": np.ones(len(ips), bool),
                            "t": s_t[ips]}).join(amb, keys=["pid", "address", "leaf"], join_type="inner")
        k = np.arange(ip_hits.num_rows, dtype=np.int64)
        groups.append((ip_hits.column("a").to_numpy(), k, np.ones(len(k), np.int64), k, ip_hits.column("t").to_numpy()))
    return [tuple(np.ascontiguousarray(a, dtype=np.int64) for a in g) for g in groups]


def sorted_frames(mapped: dict, images) -> dict:
    """Frames in output order: pid, address, role (return address first), then the image's load time."""
    loads = column(images, "load_ns", "decoded/images.parquet", INT64_MIN).astype(np.int64)
    load = np.where(mapped["image"] >= 0, loads[np.maximum(mapped["image"], 0)] if len(loads) else 0, INT64_MIN)
    order = np.lexsort((load, mapped["leaf"], mapped["address"], mapped["pid"]))
    return {k: (v[order] if isinstance(v, np.ndarray) else v) for k, v in mapped.items()}
