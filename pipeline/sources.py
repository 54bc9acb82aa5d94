"""Where inputs are read from: a local path, or an fsspec URL (``http://``, ``https://``, ``s3://``, ``gs://``, ...).

An input given as a URL is read where it lies: the client reads the trace's headers, and each decode task reads
its own byte ranges of the trace from the URL, so that workers on other machines need no copy of it. A shared
filesystem needs no URL: its path is the same on every machine. HTTP(S) comes with bootprof (aiohttp); other
protocols need their fsspec package (``s3fs``, ``gcsfs``, ``adlfs``, ...) installed beside it, and take their
credentials from the usual places (environment, config files). ``file://`` URLs are local paths.

An input is a :class:`pathlib.Path` or, for a URL, a ``str``: :func:`parse` makes one from what a user typed.
What the stages need of an input is here: its size, its first bytes, byte ranges (:class:`Reader`), its whole
bytes (self-profiles), the self-profiles below a directory, and its fingerprint for the manifests. A URL's
fingerprint is its size and the store's word for its version (:func:`version`: the ETag of S3 and most HTTP
servers), not a sha256: hashing would read the whole trace on the client. What a store says of a URL is asked
once per process.
"""

from __future__ import annotations

import functools
import os
import re
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterable, Union
from urllib.parse import urlparse

from pipeline import portable
from pipeline.errors import InputError

if TYPE_CHECKING:
    from pipeline.contracts import InputRecord
    from pipeline.runs import RunLocation

Input = Union[Path, str]

#: A URL: a scheme, then ``://``.
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: How many headers of a trace one round of reads fetches from a URL (see :class:`Reader`).
PREFETCH = 256


def parse(raw: str | os.PathLike) -> Input:
    """A path as typed: a URL stays a string (``file://`` becomes a local path); anything else is a Path. An empty one
    (an unset variable in a CI script) is refused: it would name the working directory."""
    text = os.fspath(raw)
    if not text.strip():
        import argparse

        raise argparse.ArgumentTypeError("an empty path (an unset variable?): name a trace, a directory of "
                                         ".mm_profdata files, or a URL")
    if isinstance(raw, str) and URL.match(text):
        return Path(file_url_path(text)) if text.lower().startswith("file://") else text
    return Path(text)


def file_url_path(url: str, windows: bool = os.name == "nt") -> str:
    """The local path of a ``file://`` URL, as the system reads one: ``%20`` decoded, ``file:///C:/x`` as ``C:\\x``
    and ``file://host/share/x`` as the UNC path ``\\\\host\\share\\x`` on Windows; a host other than ``localhost``
    elsewhere is refused (no path reaches it)."""
    import argparse
    from urllib.request import url2pathname

    parts = urlparse(url)
    host, path = (parts.netloc if parts.netloc.lower() != "localhost" else ""), parts.path
    if not host and path.startswith("///"):         # (file://///host/share/x: a UNC path, as some tools write it)
        host, _, rest = path.lstrip("/").partition("/")
        path = "/" + rest
    if windows:
        if host and re.match(r"/[A-Za-z][:|]", path):
            raise argparse.ArgumentTypeError(f"{url}: a host ({host}) and a drive letter: name one of them")
        if os.name != "nt":     # (Windows' reading, elsewhere: its module, which 3.14 deprecates as a public one)
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                from nturl2path import url2pathname
        try:
            return url2pathname(f"//{host}{path}" if host else path)
        except OSError as exc:      # (nturl2path: a second ':' in the path)
            raise argparse.ArgumentTypeError(f"{url}: not a Windows path: {exc}") from None
    if host:
        raise argparse.ArgumentTypeError(f"{url}: a file:// URL of another host ({host}) names no path here: "
                                         "mount it and give the path")
    return url2pathname(path)


def run_dir(text: str) -> RunLocation:
    """A run directory as typed on the command line: a path, made absolute (the stage's tasks may run in workers
    of another working directory), or a store's URL (the command works in a copy of it). Workers on other machines
    need the path (or the copy) on a filesystem they share (NFS, a cluster filesystem)."""
    import argparse

    from pipeline.runs import RunLocation

    if URL.match(text) and not text.lower().startswith("file://"):
        if text.lower().startswith(("http://", "https://")):
            raise argparse.ArgumentTypeError(f"{text}: a run directory is written to, and HTTP(S) is read-only here; "
                                             "give a path or a store's URL (s3://, gs://, abfs://, ...)")
        return RunLocation(url=text)
    path = (Path(file_url_path(text)) if text.lower().startswith("file://") else Path(text)).absolute()
    if os.sep != "\\" and "\\" in str(path):
        # (DuckDB reads a stage's tables by a glob below the run directory, and there a backslash escapes)
        raise argparse.ArgumentTypeError(f"{path}: a run directory's path cannot hold a backslash here (DuckDB "
                                         "reads it as a glob escape); name the run without one")
    return RunLocation(path=path)


def local_run_dir(text: str) -> Path:
    """``run_dir`` for ``bootprof capture``, which records into files beside its stage output (the build's trace and
    self-profiles): a path; a URL is refused, saying what to do instead."""
    import argparse

    run = run_dir(text)
    if run.path is None:
        raise argparse.ArgumentTypeError(
            f"{text}: capture records into a local run directory; capture into a path, then keep the run at the URL "
            "with `bootprof run JOB --run URL --trace RUN_DIR/input/trace.etl --trace RUN_DIR/selfprofile`")
    return run.path


def is_url(x: Input) -> bool:
    return isinstance(x, str)


def _fs(url: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise InputError(f"{url}: cannot read this URL: {exc}") from exc


def _call(url: str, fn, *args, **kwargs):
    """``fn(path, ...)`` of the URL's filesystem; a failure is an InputError naming the URL."""
    fs, path = _fs(url)
    try:
        return getattr(fs, fn)(path, *args, **kwargs)
    except FileNotFoundError as exc:
        raise InputError(f"{url}: no such file or directory") from exc
    except (OSError, ValueError, RuntimeError) as exc:       # (aiohttp's errors are OSErrors or RuntimeErrors)
        raise InputError(f"{url}: cannot read: {exc}") from exc


def name(x: Input) -> str:
    """The last part of the path (a URL's query and fragment left out)."""
    return PurePosixPath(urlparse(x).path).name if is_url(x) else Path(x).name


def stem(x: Input) -> str:
    return PurePosixPath(name(x)).stem


@functools.lru_cache(maxsize=4096)
def _info(url: str) -> dict:
    """What the store says of a URL (size, type, ETag, ...), asked once per process."""
    return dict(_call(url, "info"))


def exists(x: Input) -> bool:
    if not is_url(x):
        return Path(x).exists()
    try:
        _info(x)
        return True
    except InputError:
        return False


def is_dir(x: Input) -> bool:
    """A local directory; a URL ending in ``/`` or that its store calls a directory (an S3 prefix, say)."""
    if not is_url(x):
        return Path(x).is_dir()
    return x.endswith("/") or _info(x).get("type") == "directory"


def size(x: Input) -> int:
    if not is_url(x):
        return Path(x).stat().st_size
    n = _info(x).get("size")
    if n is None:
        raise InputError(f"{x}: the server does not say the file's size (needed to read parts of it)")
    return int(n)


def version(x: str) -> str | None:
    """The store's word for a URL's version: its ETag (S3, GCS, most HTTP servers), else its modification time;
    None when it says neither (a changed file of the same size then goes unnoticed)."""
    info = _info(x)
    for key in ("ETag", "etag", "md5Hash", "Last-Modified", "LastModified", "mtime", "last_modified"):
        if info.get(key):
            return f"{key}:{info[key]}"
    return None


def profiles_below(x: Input) -> list[Input]:
    """The ``*.mm_profdata`` files below a directory, sorted; what is named so but is no regular file (a FIFO, a
    device) is left out, with a warning (reading it could wait forever)."""
    if not is_url(x):
        found = sorted(Path(x).rglob("*.mm_profdata"))
        special = [p for p in found if not p.is_file()]
        if special and str(Path(x).absolute()) not in _warned:
            _warned.add(str(Path(x).absolute()))
            import logging

            logging.getLogger("bootprof").warning("%s: left out %d entries that are no regular files: %s", x,
                                                  len(special), ", ".join(p.name for p in special[:5]))
        return [p for p in found if p.is_file()]
    fs, _ = _fs(x)
    return sorted(fs.unstrip_protocol(p) for p in _call(x.rstrip("/") + "/**/*.mm_profdata", "glob"))


def traces_in(x: Input) -> list[Input]:
    """The ``*.etl`` files directly in a directory, sorted."""
    if not is_url(x):
        return sorted(p for p in Path(x).iterdir() if p.suffix.lower() == ".etl" and p.is_file())
    fs, _ = _fs(x)
    return sorted(fs.unstrip_protocol(p) for p in _call(x, "ls", detail=False) if p.lower().endswith(".etl"))


def read_head(x: Input, n: int) -> bytes:
    """The first ``n`` bytes (fewer if the file is shorter)."""
    if not is_url(x):
        try:
            with open(x, "rb") as f:
                return f.read(n)
        except OSError as exc:
            raise InputError(f"{x}: cannot read: {exc.strerror or exc}") from exc
    return bytes(_call(x, "cat_file", start=0, end=min(n, size(x))))


def read_bytes(x: Input) -> bytes:
    if not is_url(x):
        return Path(x).read_bytes()
    return bytes(_call(x, "cat_file"))


def read_range(x: Input, lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of a URL's file (fewer at its end)."""
    return bytes(_call(x, "cat_file", start=lo, end=hi))


def input_bytes(inputs: Iterable[Input]) -> int:
    """Bytes of the inputs a command works on (files, and the .mm_profdata files of directories)."""
    total = 0
    for x in inputs:
        files = profiles_below(x) if is_dir(x) else [x]
        total += sum(size(f) for f in files if exists(f))
    return total


def fingerprint(x: Input) -> InputRecord:
    """Path, size and content hash (:func:`pipeline.runs.sha256_tree`) of a local input; URL, size and the store's
    version (:func:`version`) of a URL."""
    if not is_url(x):
        from pipeline.runs import sha256_tree

        path = Path(x).resolve()
        try:
            st = path.stat()
            # (once per file version in a process: ``bootprof run`` checks whether the decode is up to date, then
            # the decode records the same hashes)
            key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _hashed:
                _hashed[key] = sha256_tree(path)
        except OSError as exc:      # (an unreadable file: the decode skips and counts it; its print says why)
            return {"path": str(path), "size": None, "sha256_tree": None, "error": exc.strerror or str(exc)}
        return {"path": str(path), "size": st.st_size, "sha256_tree": _hashed[key]}
    return {"path": x, "size": size(x), "sha256_tree": None, "version": version(x)}


def pin(x: Input) -> tuple:
    """What says an input is still the file that was opened: a local file's device, file id, size and modification
    time; a URL's size and version as its store says them now (asked again, not from the cache)."""
    if is_url(x):
        info = _call(x, "info")
        return (info.get("size"),) + tuple(info.get(k) for k in ("ETag", "etag", "md5Hash", "Last-Modified",
                                                                    "LastModified", "mtime", "last_modified"))
    try:
        st = Path(x).stat()
    except OSError as exc:
        return ("gone", exc.errno)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def changed(pins: dict[Input, tuple]) -> list[Input]:
    """The inputs of ``pins`` (from :func:`pin`) that are no longer the files they were."""
    return [x for x, before in pins.items() if pin(x) != before]


#: Directories whose special entries were warned of (once per process, not at every listing).
_warned: set[str] = set()

#: Content hashes of local inputs this process computed, by (path, device, inode, size, mtime).
_hashed: dict[tuple, str] = {}


class Reader:
    """Reads byte ranges of an input: ``pread(n, offset)`` as :func:`pipeline.portable.pread`, and ``size``.

    For a URL each read is a ranged request, and the walk over a trace's buffer headers (0x48 bytes every
    BufferSize) would cost a round trip per buffer. Two ways avoid that, and the reader takes the faster:
    - headers: a small read at an offset not fetched yet fetches, in one concurrent round (``cat_ranges``), the
      header-sized ranges at that offset and the next ``PREFETCH - 1`` strides (``stride``: the session's buffer
      size, set by the walk). A trace whose buffers have that size (uncompressed, as WPR writes them) costs a
      round per ``PREFETCH`` buffers and transfers its headers only; a header elsewhere starts a new round there.
    - blocks: ``BLOCK`` bytes at a time; the walk transfers the whole trace once more.
    After its first round, the reader reads one block and keeps whichever covered the file faster (a store far
    away answers many small requests at once better; a server close by streams blocks faster). Headers that
    are seldom where the stride says (compressed buffers have sizes of their own) mean blocks."""

    BLOCK = 4 << 20

    def __init__(self, x: Input):
        self.input, self.stride, self.url = x, 0, is_url(x)
        self._small: dict[int, bytes] = {}
        self._block: tuple[int, bytes] = (0, b"")
        self._strided, self._hits, self._misses = True, 0, 0
        self._rates: dict[str, float] = {}      # file bytes covered per second: "headers", "blocks"
        if self.url:
            self.size = size(x)
        else:
            try:
                self._fd = os.open(x, portable.READ_BINARY)
            except OSError as exc:
                raise InputError(f"{x}: cannot read: {exc.strerror or exc}") from exc
            self.size = os.fstat(self._fd).st_size

    @property
    def mode(self) -> str:
        """How the walk reads a URL now: ``headers`` or ``blocks``."""
        return "headers" if self._strided else "blocks"

    def pread(self, n: int, offset: int) -> bytes:
        if not self.url:
            return portable.pread(self._fd, n, offset)
        end = min(offset + n, self.size)
        if end <= offset:
            return b""
        hit = self._small.get(offset)
        if hit is not None and len(hit) >= end - offset:
            self._hits += 1
            return hit[:end - offset]
        lo, block = self._block
        if lo <= offset and end <= lo + len(block):
            return block[offset - lo:end - lo]
        if n > 0x1000 or self.stride <= 0:
            return read_range(self.input, offset, end)
        if self._strided and self._small:
            if min(self._small) <= offset <= max(self._small):
                # A miss inside a round: a buffer of another size (the header buffer may be one) moved the rest;
                # the next round starts here. Buffers that seldom follow the stride: read blocks instead.
                self._misses += 1
                self._strided = self._misses <= 2 + self._hits // 64
            elif "blocks" not in self._rates:
                return self._read_block(offset, end)        # (once: how fast blocks come)
        if self._strided:
            return self._prefetch(n, offset, end)
        return self._read_block(offset, end)

    def _read_block(self, offset: int, end: int) -> bytes:
        t = time.perf_counter()
        data = read_range(self.input, offset, min(self.size, offset + self.BLOCK))
        self._rates.setdefault("blocks", len(data) / max(time.perf_counter() - t, 1e-6))
        if self._strided and self._rates["blocks"] > self._rates.get("headers", 0.0):
            self._strided = False
        self._block = (offset, data)
        return data[:end - offset]

    def _prefetch(self, n: int, offset: int, end: int) -> bytes:
        fs, path = _fs(self.input)
        starts = list(range(offset, min(self.size, offset + PREFETCH * self.stride), self.stride))
        ends = [min(s + max(n, 0x48), self.size) for s in starts]
        t = time.perf_counter()
        try:
            got = fs.cat_ranges([path] * len(starts), starts, ends, on_error="raise")
        except (OSError, ValueError, RuntimeError) as exc:
            raise InputError(f"{self.input}: cannot read bytes {offset}-{end}: {exc}") from exc
        self._rates.setdefault("headers", len(starts) * self.stride / max(time.perf_counter() - t, 1e-6))
        self._small = {s: bytes(data) for s, data in zip(starts, got)}
        return self._small[offset][:end - offset]

    def close(self) -> None:
        if not self.url:
            os.close(self._fd)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
