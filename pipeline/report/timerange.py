"""Tables of ``index.html`` that follow the time range picked on the process timeline (``static/range.js``).

A following table is written with more rows than it shows (the candidates, up to ``CANDIDATES``, ranked by
the table's measure over the whole build) and, beside it, the time bins of each row's numbers as JSON. When a
range is picked, the page sums each number over the bins the range covers, hides
the rows with nothing in it (and rows whose lifetime does not overlap it), ranks the rest by the table's
measure and shows the first ``limit``. Percent columns become shares of the range's total. "whole build"
puts every row back as it was written.

Bins are those of the aggregate stage (``sections.cpu.time_bins``: ``count``, ``t0_ns``, ``span_ns``), so a
range is widened to whole bins, as the flame graphs widen it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from pipeline.stages import AGGREGATED

#: At most this many rows of a table follow a range (the largest over the whole build).
CANDIDATES = 400
#: The tables' time bins: the aggregate stage's bins merged to this many (1% of the span each), which keeps a
#: page's numbers small; the flame graphs keep the finer bins.
TABLE_BINS = 100


@dataclass
class Follow:
    """How one table follows the range. ``series[key][i]`` is row i's {bin: value} for column ``key``;
    ``members[key][i]`` a list of such series, counted (the column is how many of them have a value in the
    range, e.g. a crate's processes); ``pct[key] = (of, total)``: column ``key`` is column ``of`` as a percent
    of ``total`` ({bin: value}, or None for the sum of the rows); ``alive[i]`` = (start_ns, end_ns) of row i
    (None: always), and a row with a lifetime is in a range while it lives, even with nothing counted there;
    ``sort``: the column ranked by (largest first; None: the rows keep their order). The series go to ``pool``,
    which a section writes once after its tables (tables that share a series share its copy)."""
    pool: "Pool"
    sort: str | None
    series: dict[str, list[dict[int, int]]] = field(default_factory=dict)
    members: dict[str, list[list[dict[int, int]]]] = field(default_factory=dict)
    pct: dict[str, tuple[str, dict[int, int] | None]] = field(default_factory=dict)
    alive: list[tuple[int | None, int | None] | None] | None = None


class Pool:
    """The time series of one section's following tables, each written once: ``bins`` are the aggregate stage's
    (``count``, ``t0_ns``, ``span_ns``), merged to ``TABLE_BINS``; a range's value is the sum of its bins."""

    def __init__(self, name: str, bins: dict[str, int]):
        self.name = name
        self.merge = bins["count"] // TABLE_BINS if bins["count"] % TABLE_BINS == 0 and bins["count"] > TABLE_BINS else 1
        self.bins = {**bins, "count": bins["count"] // self.merge}
        self.flat: list[list[int]] = []
        self.index: dict[int, int] = {}
        self.kept: list[dict] = []          # (the series themselves, so that no id is reused while the pool lives)

    def add(self, series: dict[int, int]) -> int:
        if id(series) not in self.index:
            merged: dict[int, int] = defaultdict(int)
            for b, v in series.items():
                merged[b // self.merge] += v
            self.index[id(series)] = len(self.flat)
            self.flat.append(_dense(merged))
            self.kept.append(series)
        return self.index[id(series)]

    def script(self) -> str:
        """The pool as the page reads it: ``bins`` and per series [first bin, value, value, ...]."""
        return _json_script("follow-pool", {"bins": self.bins, "series": self.flat},
                            f' data-pool="{self.name}"')


def cpu_bins(ctx) -> dict[str, int] | None:
    """Where the aggregate stage's CPU time bins lie (``sections.cpu.time_bins``), None for a run without them."""
    from pipeline.runs import read_manifest

    return read_manifest(ctx.run_dir, AGGREGATED)["sections"].get("cpu", {}).get("time_bins")


def binned(rows: Iterable[dict], key, measure: str, bin_col: str = "bin") -> dict[Any, dict[int, int]]:
    """{key(row): {bin: measure}} of a table split by time bin (``key`` a function of the row)."""
    out: dict[Any, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        if r[measure]:
            out[key(r)][r[bin_col]] += r[measure]
    return out


def total(series: Iterable[dict[int, int]]) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for s in series:
        for b, v in s.items():
            out[b] += v
    return dict(out)


def _dense(s: dict[int, int]) -> list[int]:
    """A series as [first bin, its value, the next bin's value, ...] up to its last bin (zeros between)."""
    if not s:
        return []
    lo, hi = min(s), max(s)
    return [int(lo)] + [int(s.get(b, 0)) for b in range(lo, hi + 1)]


def _json_script(cls: str, doc: Any, attrs: str = "") -> str:
    from pipeline.report.safe import inline_json

    return f'<script type="application/json" class="{cls}"{attrs}>{inline_json(doc)}</script>'


def script(follow: Follow, columns: list[str], fmts: list[str], rows: int, limit: int) -> str:
    """The JSON that ``static/range.js`` reads for a table with ``rows`` rows, ``limit`` of them shown, and these
    column keys: per column
    the pool's series of each row (``s``), the lists of series counted (``m``), or the column a percent is of
    (``of``) and the pool's series of its total (``t``)."""
    index = {c: i for i, c in enumerate(columns)}
    pool = follow.pool
    cols: dict[int, Any] = {}
    for key, per_row in follow.series.items():
        cols[index[key]] = {"s": [pool.add(s) for s in per_row[:rows]]}
    for key, per_row in follow.members.items():
        cols[index[key]] = {"m": [[pool.add(s) for s in members] for members in per_row[:rows]]}
    for key, (of, tot) in follow.pct.items():
        cols[index[key]] = {"of": index[of], **({"t": pool.add(tot)} if tot is not None else {})}
    for i, c in cols.items():
        c["f"] = fmts[i]
    doc = {"pool": pool.name, "sort": None if follow.sort is None else index[follow.sort], "limit": limit, "cols": cols,
           **({"alive": [list(a) if a else None for a in follow.alive[:rows]]} if follow.alive is not None else {})}
    return _json_script("follow-data", doc)
