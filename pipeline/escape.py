"""Text from a trace or a run (crate, query and run names, labels) escaped once for where it goes: a markdown code
span or text (a CI job summary), a terminal. HTML is escaped where pages are written (``pipeline/report/safe.py``).

A name may hold anything a build or a file name can: a backtick, ``](javascript:...)``, a newline, an escape
sequence that recolours a terminal or moves its cursor. None of it may act."""

from __future__ import annotations

import re

_BACKTICKS = re.compile(r"`+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&])")


def _flat(text: object) -> str:
    """One line: line breaks and other control characters as visible escapes (``\\n``, ``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def md_code(text: object) -> str:
    """``text`` as a markdown code span it cannot leave (CommonMark: a span opened by N backticks ends only at a run
    of exactly N): fenced by one backtick more than its longest run, padded when it starts or ends with one."""
    s = _flat(text)
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ") and s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_cell(text: object) -> str:
    """:func:`md_code` for a table cell: ``|`` escaped, which GFM tables split cells on even inside a code span."""
    return md_code(text).replace("|", "\\|")


def md_text(text: object) -> str:
    """``text`` as plain markdown text: every character markdown gives a meaning to is escaped."""
    return _MD_SPECIAL.sub(r"\\\1", _flat(text))


def terminal(text: object) -> str:
    """``text`` for a terminal: control characters (escape sequences, carriage returns, line breaks) shown as
    ``\\x1b``, ``\\r``, ``\\n``, not obeyed."""
    return _flat(text)
