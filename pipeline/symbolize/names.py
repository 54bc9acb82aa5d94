"""Function names as people read them: demangled Rust (legacy and v0) and MSVC C++, argument lists off.

Names reach us in three shapes:

* private PDB symbols (S_GPROC32, inlinees): already readable, but symbolic appends the CodeView
  argument list: ``mycrate::run(unsigned int)``, ``System.Xml.Foo.Bar(Int32)``;
* publics and Breakpad ``PUBLIC``/``FUNC`` names: mangled. symbolic's SymCache writer strips one
  leading underscore from undecorated PE names (x86 ``__cdecl``), so ``_ZN…E`` arrives as ``ZN…E``
  and ``_R…`` as ``R…``;
* plain C names (``_RTC_Initialize``, ``mainCRTStartup``), which must stay as they are.

Demangling is done by multi-demangle (Rust legacy + v0, MSVC, Itanium), which only claims a name
when it parses completely in one scheme, so a C name that merely starts with ``_R`` is left alone.
The Rust legacy hash (``::h0123456789abcdef``) is removed from the display name; it stays in the raw
name, and :func:`rust_hash` pulls it out.
"""

from __future__ import annotations

import re

import multi_demangle

_OPTIONS = multi_demangle.DemangleOptions.name_only()
_LEGACY_HASH = re.compile(r"17h([0-9a-f]{16})E(?:\.|$)")
_TRAILING_QUALIFIERS = re.compile(r"(?:\s+(?:const|volatile|&&|&|__ptr64|noexcept))+$")


def strip_arguments(name: str) -> str:
    """Remove a trailing balanced ``(...)`` argument list (and ``const``-like qualifiers after it).

    ``a::b<u32>(unsigned int, char*) const`` -> ``a::b<u32>``; ``operator()(int)`` -> ``operator()``;
    a name without a trailing argument list is returned unchanged.
    """
    if ")" not in name:
        return name
    text = _TRAILING_QUALIFIERS.sub("", name)
    if not text.endswith(")"):
        return name
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                head = text[:i].rstrip()
                return head if head else name
    return name


def is_mangled(name: str) -> bool:
    """True for a name multi-demangle recognizes as Rust, C++ (MSVC or Itanium) mangling."""
    return bool(name) and name.startswith(("?", "_Z", "ZN", "_R", "R", "__Z")) and (
        multi_demangle.detect_language(name) is not None
    )


def clean_name(raw: str) -> str:
    """Display name of one raw symbol name (see module doc)."""
    return clean_names([raw])[0]


def clean_names(raws: list[str]) -> list[str]:
    """Display names: argument lists stripped, then demangled in one batch call (multi-demangle
    returns a name it does not recognize completely unchanged, so C names pass through)."""
    stripped = [strip_arguments(r) if r else (r or "") for r in raws]
    return multi_demangle.demangle_symbols(stripped, _OPTIONS)


def rust_hash(raw: str) -> str | None:
    """The 16-hex-digit hash of a Rust legacy mangled name (``…17h<hash>E``), else None."""
    name = strip_arguments(raw) if raw else raw
    if not name:
        return None
    m = _LEGACY_HASH.search(name)
    if m and multi_demangle.detect_language(name) == "rust":
        return m.group(1)
    return None
