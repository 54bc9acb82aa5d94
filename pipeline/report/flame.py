"""Helpers of the ETL report sections: flame graphs from folded stacks, exports, small HTML tables.

A flame graph page is one self-contained HTML file: the node table as JSON plus the inlined
``static/flamegraph.js``/``.css``. The tree is laid out here (depth first, children sorted by name,
each node's ``x`` = where it starts in the measure's unit), so the script only scales and draws.
Nodes narrower than ``MIN_FRACTION`` of the root are merged into their parent's self value: they
would be under a pixel wide unzoomed, and a real trace has millions of them.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Iterable

from pipeline.report.safe import csv_select, inline_json
from pipeline.runs import atomic_write_text, sql_path
from pipeline.stages import AGGREGATED

STATIC = Path(__file__).with_name("static")

#: Frames whose inclusive value is below this share of the total are not drawn (their value stays in
#: their parent's self value). 1e-4 keeps every frame at least 0.1 px wide on a 1000 px wide graph.
MIN_FRACTION = 1e-4


def build_tree(stacks: Iterable[tuple], columns: tuple[str, ...] = ()) -> dict[str, list]:
    """Folded stacks (``a;b;c``, value, *more) -> flat node arrays in depth-first order (see module doc). Each of
    ``columns`` names one more value per stack, summed per node like the width (inclusive) and written as its
    own array (the differential flame graph's baseline and run shares).

    Integer values (samples, bytes) are summed level by level with numpy (:func:`_build_tree_by_levels`); others
    (the differential graph's shares) node by node here, in the order the stacks come."""
    rows = stacks if isinstance(stacks, list) else list(stacks)
    if all(type(v) is int for r in rows for v in r[1:]):
        return _build_tree_by_levels(rows, columns)
    # A node is [value, {frame: child}, *more]. (A child is made only when the frame is new: a dict made for
    # every frame visit, as ``setdefault`` did, was most of the report stage on a large trace.)
    k = len(columns)
    root: list = [0, {}] + [0] * k
    for stack, value, *more in rows:
        if value <= 0:
            continue
        root[0] += value
        for j in range(k):
            root[2 + j] += more[j]
        node = root
        for frame in stack.split(";"):
            kids = node[1]
            node = kids.get(frame)
            if node is None:
                node = kids[frame] = [0, {}] + [0] * k
            node[0] += value
            for j in range(k):
                node[2 + j] += more[j]
    names: dict[str, int] = {"all": 0}
    out: dict[str, list] = {"n": [], "x": [], "w": [], "s": [], "d": [], **{c: [] for c in columns}}
    limit = root[0] * MIN_FRACTION
    todo = [("all", root, 0, 0)]
    while todo:
        name, node, x, depth = todo.pop()
        kids = sorted((k, c) for k, c in node[1].items() if c[0] >= limit)
        out["n"].append(names.setdefault(name, len(names)))
        out["x"].append(x)
        out["w"].append(node[0])
        out["s"].append(node[0] - sum(c[0] for _, c in kids))
        out["d"].append(depth)
        for j, c in enumerate(columns):
            out[c].append(node[2 + j])
        starts, at = [], x
        for k, c in kids:
            starts.append((k, c, at, depth + 1))
            at += c[0]
        todo.extend(reversed(starts))
    out["names"] = list(names)
    return out


def _build_tree_by_levels(rows: list[tuple], columns: tuple[str, ...]) -> dict[str, list]:
    """:func:`build_tree` of integer values, without a Python step per frame: the stacks are split and their frames
    numbered by pyarrow, then the tree is made one depth at a time (a node is a distinct (parent, frame) of that
    depth), summed, cut (``MIN_FRACTION``) and laid out in depth-first order with numpy: the same arrays as the walk
    node by node, without a Python step per frame."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    k = len(columns)
    rows = [r for r in rows if r[1] > 0]
    value = np.array([r[1] for r in rows], np.int64)
    more = [np.array([r[2 + j] for r in rows], np.int64) for j in range(k)]
    lists = pc.split_pattern(pa.array([r[0] for r in rows], pa.string()), ";")
    starts = lists.offsets.to_numpy()[:-1].astype(np.int64)
    lengths = np.diff(lists.offsets.to_numpy()).astype(np.int64)
    frames = pc.dictionary_encode(lists.flatten())
    codes = frames.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names = frames.dictionary.to_pylist()
    n_frames = max(len(names), 1)
    # Nodes one depth at a time: node 0 is the root; a node's parent, frame, depth, value and extra values.
    parent, frame, depth = [np.zeros(1, np.int64)], [np.full(1, -1, np.int64)], [np.zeros(1, np.int64)]
    w = [np.array([value.sum()], np.int64)]
    extra = [[np.array([m.sum()], np.int64)] for m in more]
    at = np.zeros(len(rows), np.int64)          # (each stack's node at the depth reached)
    count = 1
    for d in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(lengths > d)
        uniq, inv = np.unique(at[live] * n_frames + codes[starts[live] + d], return_inverse=True)
        parent.append(uniq // n_frames)
        frame.append(uniq % n_frames)
        depth.append(np.full(len(uniq), d + 1, np.int64))
        for sums, source in zip([w, *extra], [value, *more]):
            level = np.zeros(len(uniq), np.int64)
            np.add.at(level, inv, source[live])
            sums.append(level)
        at[live] = count + inv
        count += len(uniq)
    parent, frame, depth, w = (np.concatenate(a) for a in (parent, frame, depth, w))
    extra = [np.concatenate(e) for e in extra]
    # Nodes narrower than the limit are left out (a child is never wider than its parent: a kept node's parent is
    # kept); their value stays in the parent's self value.
    kept = w >= w[0] * MIN_FRACTION
    kept[0] = True
    child = np.flatnonzero(kept)[1:]
    self_value = w.copy()
    np.subtract.at(self_value, parent[child], w[child])
    # Depth-first order, children by name: each node's place and x follow from its parent's and from the sizes and
    # widths of the siblings before it, one depth at a time from the root.
    rank = np.empty(n_frames, np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    size = kept.astype(np.int64)
    for d in range(int(depth.max()), 0, -1):
        idx = child[depth[child] == d]
        np.add.at(size, parent[idx], size[idx])
    place, x = np.zeros(count, np.int64), np.zeros(count, np.int64)
    for d in range(1, int(depth.max()) + 1):
        idx = child[depth[child] == d]
        idx = idx[np.lexsort((rank[frame[idx]], parent[idx]))]
        p = parent[idx]
        group = np.r_[True, p[1:] != p[:-1]] if len(p) else np.zeros(0, bool)
        first = np.flatnonzero(group)
        before_size = np.cumsum(size[idx]) - size[idx]
        before_w = np.cumsum(w[idx]) - w[idx]
        at_first = np.repeat(first, np.diff(np.r_[first, len(idx)]))
        place[idx] = place[p] + 1 + before_size - before_size[at_first]
        x[idx] = x[p] + before_w - before_w[at_first]
    order = np.flatnonzero(kept)[np.argsort(place[kept], kind="stable")]
    # Names numbered as the walk meets them: "all" (the root) first.
    code = np.where(order == 0, -1, frame[order])
    if "all" in names:
        code[code == names.index("all")] = -1
    first_seen, inverse = np.unique(code, return_index=True, return_inverse=True)[1:]
    ids = np.argsort(np.argsort(first_seen, kind="stable"), kind="stable")
    labels = ["all" if c < 0 else names[c] for c in np.unique(code).tolist()]
    out: dict[str, list] = {"n": ids[inverse].tolist(), "x": x[order].tolist(), "w": w[order].tolist(),
                            "s": self_value[order].tolist(), "d": depth[order].tolist(),
                            **{c: extra[j][order].tolist() for j, c in enumerate(columns)}}
    out["names"] = [labels[i] for i in np.argsort(first_seen, kind="stable").tolist()]
    return out


#: (node, bin) cells that ``add_bins`` holds at once (64 MB of int64); more nodes than that over all bins are done
#: in ranges of bins.
CELLS = 1 << 23


def add_bins(tree: dict[str, list], rows, bins: int, t0_ns: int, span_ns: int) -> dict:
    """Give each node of ``tree`` its value per time bin from ``rows`` (bin, folded stack, value: a pyarrow table
    with those three columns, or tuples), so that the page can draw the flame graph of any range of bins: ``bo``
    (offsets into ``bb``/``bv``, one per node and one more), ``bb`` (bins, ascending per node) and ``bv``
    (values). A stack's value goes to the deepest node of its path that the tree kept (narrow frames are left
    out) and to every node above it. Bin k holds the times from ``t0_ns + k * span_ns / bins`` (ns since the
    trace start) to the next.

    Each distinct stack's deepest node is found once; numpy then adds the rows into a (node, bin) matrix and each
    depth of the tree into the one above, so no row's frames are walked in Python (the 1 GB synth trace: 409,000
    rows of 39,000 stacks into 9,800 nodes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(rows, pa.Table):
        rows = list(rows)
        rows = pa.table({"bin": pa.array([r[0] for r in rows], pa.int64()), "stack": pa.array([r[1] for r in rows], pa.string()),
                         "value": pa.array([r[2] for r in rows], pa.int64())})
    rows = rows.filter(pc.greater(rows.column(2), 0)).unify_dictionaries()
    n = len(tree["n"])
    depth = np.asarray(tree["d"], np.int64)
    parent = np.zeros(n, np.int64)
    last: list[int] = []
    for i in range(1, n):
        d = tree["d"][i]
        del last[d - 1:]
        parent[i] = last[-1] if last else 0
        last.append(i)
    stacks = rows.column(1)
    enc = (stacks if pa.types.is_dictionary(stacks.type) else pc.dictionary_encode(stacks)).combine_chunks()
    deepest = _deepest_nodes(enc.dictionary, parent, np.asarray(tree["n"], np.int64), tree["names"])
    node_of = deepest[enc.indices.to_numpy(zero_copy_only=False)] if len(enc.indices) else np.zeros(0, np.int64)
    b = rows.column(0).to_numpy().astype(np.int64)
    v = rows.column(2).to_numpy().astype(np.int64)
    levels = [np.flatnonzero(depth == d) for d in range(int(depth.max(initial=0)), 0, -1)]
    found = []
    width = max(1, CELLS // max(n, 1))
    for lo in range(0, bins, width):
        hi = min(bins, lo + width)
        m = np.zeros((n, hi - lo), np.int64)
        sel = (b >= lo) & (b < hi)
        np.add.at(m, (node_of[sel], b[sel] - lo), v[sel])
        for idx in levels:                          # (deepest first: each level adds into its parents)
            np.add.at(m, parent[idx], m[idx])
        node, col = np.nonzero(m)
        found.append((node, col + lo, m[node, col]))
    node = np.concatenate([f[0] for f in found])
    col = np.concatenate([f[1] for f in found])
    val = np.concatenate([f[2] for f in found])
    if len(found) > 1:                               # (ranges of bins: back into node, bin order)
        order = np.lexsort((col, node))
        node, col, val = node[order], col[order], val[order]
    bo = np.concatenate([[0], np.cumsum(np.bincount(node, minlength=n))])
    tree.update(bo=bo.tolist(), bb=col.tolist(), bv=val.tolist(), bins=bins, t0_ns=t0_ns, span_ns=span_ns)
    return tree


def _deepest_nodes(stacks, parent, name, names: list[str]):
    """For each folded stack (a pyarrow string array), the deepest node of the tree (``parent`` and ``name`` of
    each node, ``names``) on its path: its frames are followed from the root while the tree kept a child of that
    name. One depth at a time for every stack at once: a node's children are found by a sorted search of
    (parent, name) keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = pc.split_pattern(stacks, ";")
    starts = lists.offsets.to_numpy()[:-1].astype(np.int64)
    lengths = np.diff(lists.offsets.to_numpy()).astype(np.int64)
    frame = pc.index_in(lists.flatten(), value_set=pa.array(names, pa.string()))
    frame = pc.fill_null(frame, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    width = max(len(names), 1)
    keys = parent[1:] * width + name[1:]
    by_key = np.argsort(keys, kind="stable")
    keys, child = keys[by_key], by_key + 1
    node = np.zeros(len(stacks), np.int64)
    going = lengths > 0
    for d in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(going & (lengths > d))
        if not len(live):
            break
        f = frame[starts[live] + d]
        want = node[live] * width + f
        pos = np.minimum(np.searchsorted(keys, want), max(len(keys) - 1, 0))
        hit = (f >= 0) & (keys[pos] == want) if len(keys) else np.zeros(len(live), bool)
        node[live[hit]] = child[pos[hit]]
        going[live[~hit]] = False
    return node


#: Shares in a differential flame graph are parts per million of each run's samples.
PPM = 1_000_000


def diff_tree(baseline: Iterable[tuple[str, int]], run: Iterable[tuple[str, int]]) -> dict[str, list]:
    """The differential flame graph of two sets of folded stacks: every stack of either, each run normalized by
    its total samples. A node's ``a`` and ``b`` are its inclusive share of the baseline and of the run (ppm), so
    its change is right at every level; its width is the sum over its stacks of the larger of the two shares,
    so a frame that only one run has (added or removed) is drawn too, and children always fit their parent."""
    a, b = dict(baseline), dict(run)
    ta, tb = sum(a.values()) or 1, sum(b.values()) or 1
    rows = []
    for stack in sorted(set(a) | set(b)):
        pa, pb = a.get(stack, 0) * PPM / ta, b.get(stack, 0) * PPM / tb
        rows.append((stack, max(pa, pb), pa, pb))
    tree = build_tree(rows, ("a", "b"))
    for key in ("x", "w", "s", "a", "b"):
        tree[key] = [round(v) for v in tree[key]]
    return tree


def binned_tree(ctx, stacks: list[tuple[str, int]], table: str, measure: str, bins: dict | None) -> dict[str, list]:
    """``build_tree(stacks)`` with each node's value per time bin (``add_bins``) from the aggregated ``table`` (bin,
    stack, ``measure``), when the aggregate stage gave the bins' placement (``bins``: count, t0_ns, span_ns)."""
    tree = build_tree(stacks)
    if bins and ctx.has(AGGREGATED, table):
        add_bins(tree, ctx.read(AGGREGATED, table, ["bin", "stack", measure], dictionary=("stack",)), bins["count"],
                 bins["t0_ns"], bins["span_ns"])
    return tree


#: The time strip of a flame graph whose nodes have time bins (``add_bins``): drag on it to draw the graph of that
#: range only.
RANGE_HTML = """<div id="flame-range-box"><svg id="flame-range" xmlns="http://www.w3.org/2000/svg" height="44"></svg>
<div id="flame-range-text">Drag across the strip to draw only that part of the build. <button id="flame-range-all">whole
build</button></div></div>"""


def flame_page(title: str, stacks: Iterable[tuple[str, int]], unit: str, note: str = "", tree: dict | None = None,
               intro_html: str = "") -> str:
    """A self-contained interactive flame graph page (no external files, no network). ``tree`` (e.g. a
    :func:`diff_tree`) replaces the one ``stacks`` would give; ``intro_html`` (trusted, escaped by the caller)
    goes above the graph."""
    tree = build_tree(stacks) if tree is None else tree
    tree["unit"] = unit
    data = inline_json(tree)
    css = (STATIC / "flamegraph.css").read_text()
    js = (STATIC / "flamegraph.js").read_text()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{css}</style></head>
<body>
<div id="flame-head"><h1>{html.escape(title)}</h1>
<label>search <input id="flame-search" placeholder="regex, e.g. rustc_middle|hashbrown"></label>
<button id="flame-reset">reset zoom</button><label><input type="checkbox" id="flame-hide-idle"> hide Idle</label>
<span id="flame-matched"></span></div>
<p class="flame-note">Click a frame to zoom in (its callers and callees show below the graph), click it again to zoom out.{"" if unit == "ppm" else f" Total {tree['w'][0] if tree['w'] else 0:,} {html.escape(unit)}."}
{html.escape(note)}</p>
{intro_html}{RANGE_HTML if "bo" in tree else ""}
<div id="flame-box"><svg id="flame" xmlns="http://www.w3.org/2000/svg" width="1200" height="20"></svg></div>
<div id="flame-status"></div>
<div id="flame-butterfly"></div>{'<div id="flame-top"></div>' if "bo" in tree else ""}
<script type="application/json" id="flame-data">{data}</script>
<script>{js}</script>
</body></html>
"""


def tree_page(title: str, stacks: Iterable[tuple[str, int]], unit: str, note: str = "") -> str:
    """A self-contained drill-down tree of folded stacks (``static/tree.js``: children largest first, opened from
    the keyboard as WPA's stack views are)."""
    tree = build_tree(stacks)
    tree["unit"] = unit
    js = (STATIC / "tree.js").read_text()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>
body {{ font: 13px system-ui, sans-serif; margin: 0; }}
header {{ background: #222c36; color: #fff; padding: 8px 16px; }} header h1 {{ font-size: 17px; margin: 0; }}
p.note {{ color: #555; margin: 8px 16px; }}
#tree {{ font: 12px ui-monospace, monospace; margin: 0 16px 16px; border: 1px solid #dde3e8; outline: none; }}
#tree:focus {{ border-color: #5a8fd0; }}
#tree .row {{ display: flex; gap: 12px; padding: 1px 4px; cursor: pointer; white-space: nowrap; }}
#tree .row.selected {{ background: #dbe8fb; }}
#tree .name {{ flex: 1; overflow: hidden; text-overflow: ellipsis; }}
#tree .size {{ color: #333; min-width: 150px; text-align: right; }}
</style></head>
<body><header><h1>{html.escape(title)}</h1></header>
<p class="note">{html.escape(note)} Keyboard: Right opens the selected row, or goes to its largest child when it is
open; Left closes it or goes to its parent; Up and Down move; Enter opens and closes.</p>
<div id="tree" tabindex="0"></div>
<script type="application/json" id="tree-data">{inline_json(tree)}</script>
<script>{js}</script>
</body></html>
"""


def speedscope(name: str, stacks: list[tuple[str, int]], unit: str) -> dict:
    """A speedscope 'sampled' profile (https://www.speedscope.app/file-format-schema.json)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # (frames numbered as they first occur: pyarrow's dictionary keeps that order)
    lists = pc.split_pattern(pa.array([s for s, _ in stacks], pa.string()), ";")
    frames = pc.dictionary_encode(lists.flatten())
    samples = pa.ListArray.from_arrays(lists.offsets, frames.indices).to_pylist()
    weights = [int(v) for _, v in stacks]
    return {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": "bootprof", "name": name, "activeProfileIndex": 0,
        "shared": {"frames": [{"name": f} for f in frames.dictionary.to_pylist()]},
        "profiles": [{"type": "sampled", "name": name, "unit": unit, "startValue": 0,
                      "endValue": sum(weights), "samples": samples, "weights": weights}],
    }


class Writer:
    """Files of one report section: the names written, text files and CSV exports of parquet tables."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.files: list[str] = []
        self._con = None

    def text(self, name: str, text: str) -> str:
        atomic_write_text(self.ctx.out.path / name, text)
        self.files.append(name)
        return name

    def csv(self, stage: str, table: str) -> str:
        """``<table>.csv`` of a whole parquet table (DuckDB COPY, no rows through Python)."""
        from pipeline.runs import parquet_glob, table_path

        glob = parquet_glob(table_path(self.ctx.run_dir, stage, table))
        name = f"{table}.csv"
        con = self._connection()
        # (text cells that a spreadsheet would run as formulas are neutralized: pipeline.report.safe)
        con.execute(f"CREATE OR REPLACE TEMP VIEW export_source AS SELECT * FROM read_parquet({sql_path(glob)})")
        columns = [(r[0], r[1]) for r in con.execute("DESCRIBE export_source").fetchall()]
        con.execute(f"COPY (SELECT {csv_select(columns)} FROM export_source) TO {sql_path(self.ctx.out.path / name)} "
                    "(HEADER, DELIMITER ',')")
        self.files.append(name)
        return name

    def _connection(self):
        import duckdb

        if self._con is None:
            # Its own connection (the module-level default one is shared with whatever else ran in this
            # process), one for all the section's exports: opening one was most of a small export's time.
            self._con = duckdb.connect()
        return self._con

    def top(self, stage: str, table: str, order: str, limit: int, where: str = "true") -> list[dict]:
        """The first ``limit`` rows of a parquet table by ``order`` (SQL over its columns), as dicts, without
        reading the rest into Python."""
        from pipeline.runs import parquet_glob, table_path

        cur = self._connection().execute(
            f"SELECT * FROM read_parquet($1) WHERE {where} ORDER BY {order} LIMIT {int(limit)}",
            [parquet_glob(table_path(self.ctx.run_dir, stage, table))])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    def close(self) -> None:
        """Close the exports' connection (if any); the section's files are written."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def links(self) -> str:
        return '<p class="links">' + " &middot; ".join(f'<a href="{n}">{n}</a>' for n in self.files) + "</p>"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return ""
    n = int(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fmt_ms(ns: int | None) -> str:
    return "" if ns is None else f"{ns / 1e6:,.1f} ms"


#: Columns whose values a table's rows can be grouped by (a crate's stage and target, a rustc's crate type).
GROUPABLE = ("stage", "target", "crate_type")


def table(rows: list[dict], cols: list[tuple[str, str, Any]], cls: str = "", follow=None, limit: int | None = None) -> str:
    """An HTML table of the first ``limit`` of ``rows`` (all without one); ``cols`` = (key, title, format function or
    None for text). With ``follow`` (a :class:`~pipeline.report.timerange.Follow`), the table follows the picked time
    range: more ``rows`` are written as candidates (hidden beyond the first ``limit``), with their time bins beside
    the table."""
    from pipeline.report import timerange

    # (a table's rows can be grouped by these columns: static/tables.js)
    head = "".join(f"<th{' data-group=1' if k in GROUPABLE else ''}>{html.escape(t)}</th>" for k, t, _ in cols)
    shown = len(rows) if limit is None else limit
    rows = rows[:max(timerange.CANDIDATES, shown)] if follow is not None else rows[:shown]
    body = []
    for i, r in enumerate(rows):
        cells = []
        for key, _, fmt in cols:
            value = r.get(key)
            text = fmt(value) if fmt else ("" if value is None else str(value))
            # (a number's own value beside its formatted text, so that static/tables.js sorts by it)
            raw = f' data-v="{value}"' if fmt and isinstance(value, (int, float)) else ""
            kind = "num" if fmt else "txt cmd" if key in ("command_line", "cmd") else "txt"
            cells.append(f'<td class="{kind}"{raw}>{html.escape(text)}</td>')
        off = ' data-off="1" style="display:none"' if i >= shown else ""
        body.append(f"<tr{off}>" + "".join(cells) + "</tr>")
    out = f'<table class="{cls}"{" data-follow=1" if follow is not None else ""}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    if follow is not None:
        out += timerange.script(follow, [k for k, _, _ in cols], [FORMATS.get(f, "text") for _, _, f in cols], len(rows),
                                shown)
    return out


def count(v) -> str:
    return "" if v is None else f"{int(v):,}"


def pct(v) -> str:
    return "" if v is None else f"{v:.2f}%"


#: Names of the formats, for the tables whose numbers the page recomputes (static/range.js formats them alike).
FORMATS = {count: "count", pct: "pct", fmt_bytes: "bytes", fmt_ms: "ms"}
