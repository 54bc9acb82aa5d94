"""Find the symbol file of a debug id along a symbol path in ``_NT_SYMBOL_PATH`` syntax.

Entries are separated by ``;`` and searched in order:

``DIR``
    a plain directory: ``DIR/name.pdb`` (flat), the symbol-store layout
    ``DIR/name.pdb/<GUID><AGE>/name.pdb``, and Breakpad stores ``DIR/name.pdb/<GUID><AGE>/name.sym``
    (also ``DIR/name.sym``).
``srv*[CACHE*]...*TARGET``
    a symbol server. TARGET is an ``http(s)://`` URL or a store directory; every CACHE before it
    is a local store that is searched first and receives a copy of whatever TARGET delivers.
    ``srv*URL`` (no cache) caches into ``<cache_dir>/downloads``. For a URL we request
    ``name.pdb/KEY/name.pdb``, then the compressed ``name.pdb/KEY/name.pd_`` (a CAB file), then
    ``name.pdb/KEY/name.sym``. A 404 for all three is remembered in the cache (``KEY/.missing``)
    so the next run does not ask again; other HTTP errors and timeouts are reported and retried
    next time.
``cache*DIR``
    symbols found by the entries after it are copied into ``DIR`` (store layout), and ``DIR`` is
    searched before them.

KEY is the GUID as 32 upper-case hex digits followed by the age in hex (``D1307F3D…2E1``).

Names from a trace are never trusted as paths: a symbol file name must be one plain file name (no
separator, not ``.`` or ``..``, no control character) and KEY hex digits, else the image is reported with
that reason and nothing is read or written (:func:`safe_name`). A download is streamed into the cache with a
size cap and a wall-clock deadline (:class:`Fetch`); a redirect to another host is refused unless that host
is listed in ``symbolize.redirect_hosts``; whatever a server does (an error status, a garbage status line, a
body cut short, a stall) ends that one image's search with a one-line reason.
"""

from __future__ import annotations

import fnmatch
import http.client
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import portable
from pipeline.errors import ConfigError
from pipeline.runs import atomic_write_bytes

MISSING_MARK = ".missing"
#: Bytes read from a server at a time.
CHUNK = 1 << 20


@dataclass(frozen=True)
class Fetch:
    """Limits of one symbol-file download (``symbolize`` config): the timeout of each socket operation, the
    wall-clock deadline of the whole file, the largest body accepted, and the hosts a server may redirect to
    (``fnmatch`` patterns, e.g. ``*.blob.core.windows.net``; the server's own host is always allowed)."""

    timeout_s: float = 30.0
    deadline_s: float = 600.0
    max_bytes: int = 4 << 30
    redirect_hosts: tuple[str, ...] = ()


_SAFE_KEY = re.compile(r"[0-9A-Fa-f]{1,64}")


def safe_name(name: str | None, key: str | None) -> str | None:
    """Why ``name`` (a symbol or binary file name from a trace) and ``key`` cannot be parts of a path, or None
    when they can."""
    if not name or name in (".", "..") or len(name) > 255 or any(c in name for c in "/\\:") or \
            any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return f"unsafe symbol file name {name!r}: not one plain file name; nothing searched"
    if not key or not _SAFE_KEY.fullmatch(key):
        return f"unsafe store key {key!r} for {name!r}: not hex digits; nothing searched"
    return None


@dataclass(frozen=True)
class Entry:
    kind: str                         # "dir" | "server" | "cache"
    target: str                       # directory or URL
    caches: tuple[str, ...] = ()      # local stores in front of a server


@dataclass
class Lookup:
    """What one search found: a file, or why not (``reason``), plus the places it tried."""

    path: Path | None = None
    source: str | None = None
    reason: str | None = None
    tried: list[str] = field(default_factory=list)
    requests: int = 0
    mismatch: str | None = None


def parse_symbol_path(text: str | None, default_cache: Path) -> list[Entry]:
    """Entries of a symbol path; ConfigError for an entry we cannot read."""
    entries: list[Entry] = []
    for raw in (text or "").split(";"):
        item = raw.strip()
        if not item:
            continue
        parts = item.split("*")
        head = parts[0].lower()
        if head in ("srv", "symsrv"):
            rest = parts[2:] if head == "symsrv" else parts[1:]  # symsrv*symsrv.dll*...
            rest = [p.strip() for p in rest]
            if not rest or not rest[-1]:
                raise ConfigError(f"symbol path entry {item!r}: srv* needs a server URL or store directory")
            caches = tuple(_local(c) if c else str(default_cache / "downloads") for c in rest[:-1])
            if not caches and _is_url(rest[-1]):
                caches = (str(default_cache / "downloads"),)
            entries.append(Entry("server", rest[-1] if _is_url(rest[-1]) else _local(rest[-1]), caches))
        elif head == "cache":
            target = parts[1].strip() if len(parts) > 1 and parts[1].strip() else str(default_cache / "downloads")
            entries.append(Entry("cache", _local(target)))
        elif len(parts) == 1:
            entries.append(Entry("dir", _local(item)))
        else:
            raise ConfigError(f"symbol path entry {item!r}: unknown form (expected DIR, srv*CACHE*URL or cache*DIR)")
    return entries


def _local(path: str) -> str:
    """A directory of the symbol path, absolute: the lookups may run in workers of another working directory. A
    Windows path (``C:\\sym``, ``\\\\server\\share``, from a copied ``_NT_SYMBOL_PATH``) stays as written."""
    if len(path) > 2 and (path[1] == ":" and path[2] in "\\/" or path.startswith("\\\\")):
        return path
    return os.path.abspath(os.path.expanduser(path))


def _is_url(text: str) -> bool:
    return text.lower().startswith(("http://", "https://"))


def store_key(guid: str, age: int) -> str:
    """``<GUID hex, no dashes, upper><age hex>``: the directory name of a PDB in a symbol store."""
    return guid.replace("-", "").replace("{", "").replace("}", "").upper() + f"{int(age):X}"


def _ci_path(root: Path, *parts: str) -> Path:
    """``root/parts...``, matching each part case-insensitively as Windows symbol stores do
    (stores copied to Linux keep whatever case they were written with)."""
    path = root
    for part in parts:
        exact = path / part
        if exact.exists() or not path.is_dir():
            path = exact
            continue
        low = part.lower()
        match = next((c for c in sorted(path.iterdir()) if c.name.lower() == low), None)
        path = match if match is not None else exact
    return path


def _candidates(root: Path, pdb_name: str, key: str) -> list[Path]:
    stem = pdb_name[:-4] if pdb_name.lower().endswith(".pdb") else pdb_name
    return [_ci_path(root, pdb_name, key, pdb_name), _ci_path(root, pdb_name, key, f"{stem}.sym"),
            _ci_path(root, pdb_name), _ci_path(root, f"{stem}.sym")]


def _search_dir(root: Path, pdb_name: str, key: str, out: Lookup, check=None) -> Path | None:
    """First candidate file under ``root`` that exists and passes ``check`` (path -> reason or None)."""
    for cand in _candidates(root, pdb_name, key):
        out.tried.append(str(cand))
        if cand.is_file():
            wrong = check(cand) if check else None
            if wrong is None:
                return cand
            out.mismatch = out.mismatch or wrong
    return None


def _store_copy(cache: Path, pdb_name: str, key: str, found: Path) -> Path:
    dest = cache / pdb_name / key / found.name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        shutil.copyfile(found, tmp)
        portable.replace(tmp, dest)
    return dest


def expand_cab(data: bytes, where: str) -> bytes:
    """The one file inside a CAB archive (a compressed ``.pd_``): MSZIP/stored via cabarchive,
    LZX via ``cabextract`` when it is installed."""
    import cabarchive

    try:
        arc = cabarchive.CabArchive(data)
        files = list(arc.values())
        if len(files) != 1:
            raise ValueError(f"{len(files)} files in the archive, expected 1")
        return files[0].buf
    except cabarchive.NotSupportedError as exc:
        tool = shutil.which("cabextract")
        if tool is None:
            raise ValueError(f"{exc} (install cabextract to expand LZX-compressed .pd_ files)") from None
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "in.cab"
            src.write_bytes(data)
            subprocess.run([tool, "-q", "-d", str(Path(tmp) / "out"), str(src)], check=True, capture_output=True)
            outs = [p for p in (Path(tmp) / "out").rglob("*") if p.is_file()]
            if len(outs) != 1:
                raise ValueError(f"cabextract produced {len(outs)} files, expected 1") from None
            return outs[0].read_bytes()
    except Exception as exc:  # noqa: BLE001 - any parse failure becomes a reason, named by where
        raise ValueError(f"{where}: not a readable CAB archive: {exc}") from None


class _RedirectGuard(urllib.request.HTTPRedirectHandler):
    """Follows a redirect within the server's host, or to a host ``Fetch.redirect_hosts`` allows; refuses others."""

    def __init__(self, fetch: Fetch):
        super().__init__()
        self.fetch = fetch

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urllib.parse.urlsplit(req.full_url).hostname, urllib.parse.urlsplit(newurl).hostname
        if new != old and not any(fnmatch.fnmatch(new or "", pat) for pat in self.fetch.redirect_hosts):
            raise urllib.error.URLError(f"redirect (HTTP {code}) from host {old} to host {new} refused "
                                        "(allow it with symbolize.redirect_hosts)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch(url: str, dest: Path, fetch: Fetch) -> None:
    """Stream ``url`` into ``dest`` (atomically), within ``fetch``'s limits; raises OSError, ValueError or an
    http.client.HTTPException (urllib's HTTPError for a status) with what went wrong."""
    t0 = time.monotonic()
    opener = urllib.request.build_opener(_RedirectGuard(fetch))
    with opener.open(url, timeout=fetch.timeout_s) as resp:
        declared = resp.headers.get("Content-Length")
        size = int(declared) if declared and declared.isdigit() else None
        if size is not None and size > fetch.max_bytes:
            raise ValueError(f"{size} bytes is more than symbolize.download_max_bytes ({fetch.max_bytes})")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
        got = 0
        try:
            with open(tmp, "wb") as out:
                while True:
                    if time.monotonic() - t0 > fetch.deadline_s:
                        raise TimeoutError(f"not done after symbolize.download_deadline_s ({fetch.deadline_s:g} s): "
                                           f"{got} bytes")
                    chunk = resp.read1(CHUNK)     # (what has arrived: a trickling server cannot hold one read)
                    if not chunk:
                        break
                    got += len(chunk)
                    if got > fetch.max_bytes:
                        raise ValueError(f"more than symbolize.download_max_bytes ({fetch.max_bytes}) bytes")
                    out.write(chunk)
            if size is not None and got != size:
                raise ValueError(f"body cut short: {got} of {size} bytes")
            portable.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def _download(url: str, cache: Path, pdb_name: str, key: str, fetch: Fetch, out: Lookup) -> Path | None:
    """Fetch one debug file from a symbol server into ``cache`` (store layout)."""
    stem = pdb_name[:-4] if pdb_name.lower().endswith(".pdb") else pdb_name
    keyed = cache / pdb_name / key
    if (keyed / MISSING_MARK).exists() and url in (keyed / MISSING_MARK).read_text().splitlines():
        out.tried.append(f"{url} (known missing, {keyed / MISSING_MARK})")
        return None
    base = url.rstrip("/") + f"/{urllib.parse.quote(pdb_name)}/{key}/"
    names = [pdb_name, pdb_name[:-1] + "_", f"{stem}.sym"]
    errors = []
    for name in names:
        full = base + urllib.parse.quote(name)
        out.tried.append(full)
        out.requests += 1
        part = keyed / f".{name}.download"
        try:
            _fetch(full, part, fetch)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue
            errors.append(f"{full}: HTTP {exc.code} {exc.reason}")
            break
        except urllib.error.URLError as exc:
            errors.append(f"{full}: {exc.reason}")
            break
        except (OSError, ValueError, http.client.HTTPException) as exc:
            errors.append(f"{full}: {type(exc).__name__}: {exc}" if not isinstance(exc, (ValueError, TimeoutError))
                          else f"{full}: {exc}")
            break
        target = name
        if name.endswith("_"):
            try:
                data = expand_cab(part.read_bytes(), full)
            except ValueError as exc:
                errors.append(str(exc))
                part.unlink(missing_ok=True)
                break
            part.unlink(missing_ok=True)
            dest = keyed / pdb_name
            atomic_write_bytes(dest, data)
            return dest
        dest = keyed / target
        portable.replace(part, dest)
        return dest
    if errors:
        # (one line, whatever a server sent: a garbage status line carries its own line breaks)
        out.reason = "download failed: " + "; ".join(" ".join(e.split()) for e in errors)
    else:
        keyed.mkdir(parents=True, exist_ok=True)
        with open(keyed / MISSING_MARK, "a", encoding="utf-8") as f:
            f.write(url + "\n")
    return None


def locate(entries: list[Entry], pdb_name: str, key: str, fetch: Fetch | float, check=None) -> Lookup:
    """Search ``entries`` in order for ``pdb_name`` under store key ``key`` (:func:`store_key` for a
    PDB, ``pe.code_key`` for a binary; ``pdb_name`` is then the binary's file name). ``fetch``: the download
    limits (a number: the timeout, other limits as default).

    ``check(path)`` returns None for a file of the right identity, else the reason (a GUID
    mismatch); such files are skipped and, if nothing else is found, their reason is reported.
    """
    out = Lookup()
    if not isinstance(fetch, Fetch):
        fetch = Fetch(timeout_s=float(fetch))
    unsafe = safe_name(pdb_name, key)
    if unsafe is not None:
        out.reason = unsafe
        return out
    active_cache: Path | None = None
    for entry in entries:
        if entry.kind == "cache":
            active_cache = Path(entry.target)
            found = _search_dir(active_cache, pdb_name, key, out, check)
            if found:
                out.path, out.source = found, f"cache {active_cache}"
                return out
            continue
        found = None
        source = ""
        if entry.kind == "dir":
            found = _search_dir(Path(entry.target), pdb_name, key, out, check)
            source = f"dir {entry.target}"
        else:
            for cache in entry.caches:
                found = _search_dir(Path(cache), pdb_name, key, out, check)
                if found:
                    source = f"cache {cache}"
                    break
            if not found:
                first_cache = Path(entry.caches[0]) if entry.caches else None
                if _is_url(entry.target):
                    found = _download(entry.target, first_cache, pdb_name, key, fetch, out)
                    source = f"server {entry.target}"
                else:
                    found = _search_dir(Path(entry.target), pdb_name, key, out, check)
                    source = f"store {entry.target}"
                if found:
                    for cache in entry.caches:
                        found = _store_copy(Path(cache), pdb_name, key, found)
        if found:
            if active_cache is not None and entry.kind != "cache":
                found = _store_copy(active_cache, pdb_name, key, found)
            out.path, out.source = found, source
            out.reason = None
            return out
    if out.reason is None:
        out.reason = out.mismatch or f"not found ({len(out.tried)} places searched)"
    return out
