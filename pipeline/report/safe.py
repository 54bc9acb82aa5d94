"""Trace-derived text (process and image names, command lines, function names, query labels) made safe for
each place a report puts it. Anything a trace says may be hostile: a process named ``<!--<script>`` once
blanked every flame-graph page.

* HTML text and attributes: ``html.escape`` (quotes too), at every use.
* Data inside ``<script type="application/json">``: :func:`inline_json` writes ``<``, ``>``, ``&`` and the
  line separators U+2028/U+2029 as JSON ``\\u`` escapes, so no ``</script``, ``<!--`` or ``<script`` can
  appear in the element and ``JSON.parse`` of its text gives the data back unchanged.
* SVG built in the browser: the page's JavaScript escapes ``&``, ``<``, ``>`` and quotes before it writes
  markup (``esc`` in ``static/flamegraph.js``), or sets ``textContent``.
* CSV: :data:`CSV_FORMULA_SQL` prefixes a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
  carriage return with ``'``, as OWASP advises, so a spreadsheet shows it as text instead of running it as a
  formula. Only text columns: numbers (negative ones included) are written as they are.
"""

from __future__ import annotations

import json
from typing import Any

_INLINE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}

#: DuckDB SQL of a text cell ``{col}`` as a CSV export writes it (see the module doc).
CSV_FORMULA_SQL = """CASE WHEN regexp_matches({col}, '^[=+\\-@\\t\\r]') THEN '''' || {col} ELSE {col} END"""


def inline_json(data: Any) -> str:
    """JSON of ``data`` for a ``<script type="application/json">`` element (see the module doc)."""
    return json.dumps(data, separators=(",", ":")).translate(_INLINE)


def csv_select(columns: list[tuple[str, str]]) -> str:
    """The select list of a CSV export of a table with ``columns`` (name, DuckDB type): text columns through
    :data:`CSV_FORMULA_SQL`, the rest as they are, every name quoted."""
    out = []
    for name, typ in columns:
        q = '"' + name.replace('"', '""') + '"'
        out.append(f"{CSV_FORMULA_SQL.format(col=q)} AS {q}" if typ.upper() == "VARCHAR" else q)
    return ", ".join(out) or "*"
