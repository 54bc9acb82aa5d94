"""A run directory given as a URL (``--run s3://bucket/runs/nightly-1``): the run is kept there, commands work on a copy.

Every stage reads and writes a local directory (DuckDB, memory maps, atomic renames), so a command whose ``--run`` is
a URL works in a *working copy* of it, ``runs.mirror_dir/<hash of the URL>/<its last name>`` (the last name stays the
run's id in the warehouse). Around the command, :func:`mirrored`:

* **fetches** (``pull``) every stage output of the URL (a directory there with a ``_manifest.json``) that the copy
  does not hold as it is there, byte for byte (manifests name their upstream by hash);
* **puts back** (``push``) every stage output the command made, once it ends, also when it failed (what a failed
  stage leaves is never an output: ``runs.stage_output``). On Ctrl-C nothing is put back; the next command on that
  URL from this copy puts it back.

**What a reader sees.** A stage output on the URL is whole or absent. A push removes the stage's manifest first,
writes its files, removes files of the old output, and writes the manifest last; a fetch reads the manifest, then the
files, then the manifest again, and takes the files only when it is unchanged (else it tries again, then fails). A
push cut short leaves files but no manifest: no output, which the next push of that stage replaces.

**Who changed what.** The copy records the manifest of each stage as last fetched or put back (its *synced* hash,
in ``.bootprof-mirror.json``). A stage changed on the URL since then is fetched; one changed only in the copy (a
command interrupted before its push) is kept and put back. Changed on both: the URL's wins, and the command says so.
One command at a time writes a stage of a run, as in a local run directory.

Stores are fsspec's (``s3://`` with ``s3fs``, ``gs://`` with ``gcsfs``, ...), credentials and endpoints from their
usual places (``FSSPEC_S3_ENDPOINT_URL``, ``AWS_*``). ``file://`` URLs are plain paths and get no copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Iterator

from pipeline import portable
from pipeline.errors import InputError
from pipeline.runs import MANIFEST, RunLocation, atomic_write_json, clean_leftovers, stage_dir, swap_into_place

#: What the working copy records of its URL and of the stages it synced (``stage -> sha256 of the manifest``).
STATE = ".bootprof-mirror.json"
#: A stage read while a push rewrote it is read again this many times before the command fails.
PULL_TRIES = 3
#: How long a fetch that finds a stage's manifest gone waits for the push that rewrites it to write the new one.
PUSH_WAIT_S = 2.0
#: How often it looks for that manifest meanwhile.
PUSH_POLL_S = 0.1


def working_copy(url: str, mirror_dir: str | os.PathLike) -> Path:
    """Where the working copy of ``url`` lies: a directory per URL, named as the run is."""
    url = url.rstrip("/")
    name = PurePosixPath(url.split("://", 1)[-1]).name or "run"
    return Path(mirror_dir).expanduser().absolute() / hashlib.sha256(url.encode()).hexdigest()[:16] / name


def location(run_dir: Path) -> str:
    """What a run directory is to a user: the URL a working copy is of, else its path."""
    try:
        return json.loads((Path(run_dir) / STATE).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return str(run_dir)


def placed_by(run_dir: Path) -> str:
    """What puts ``run_dir`` where it is, for a message: the ``--run`` path, or ``runs.mirror_dir`` for a working
    copy."""
    url = location(run_dir)
    return "the run directory" if url == str(run_dir) else f"runs.mirror_dir (the working copy of {url})"


class Mirror:
    """The working copy of the run at ``url`` (see the module's text)."""

    def __init__(self, url: str, mirror_dir: str | os.PathLike):
        import fsspec

        self.url = url.rstrip("/")
        self.path = working_copy(self.url, mirror_dir)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as exc:
            raise InputError(f"{self.url}: cannot use this URL as a run directory: {exc}") from None
        self.root = self.root.rstrip("/")
        self.path.mkdir(parents=True, exist_ok=True)
        self.synced: dict[str, str] = {}
        self.moved = 0          # bytes fetched and put back, for what the command says
        state = self.path / STATE
        if state.exists():
            try:
                saved = json.loads(state.read_text())
                if saved.get("url") == self.url:
                    self.synced = dict(saved.get("synced") or {})
            except (OSError, ValueError, AttributeError, TypeError):
                pass        # (a damaged record: every stage is compared with the URL's again)
        self._save()

    # -- what is where --------------------------------------------------------------------------------------------

    def _save(self) -> None:
        atomic_write_json(self.path / STATE, {"url": self.url, "synced": self.synced})

    def _local(self, stage: str) -> bytes | None:
        try:
            return (stage_dir(self.path, stage) / MANIFEST).read_bytes()
        except FileNotFoundError:
            return None

    def _remote_manifests(self) -> dict[str, bytes]:
        """The manifest of every stage output on the URL."""
        self.fs.invalidate_cache()
        found = self._io("list", self.fs.glob, f"{self.root}/*/{MANIFEST}")
        if not found:
            return {}
        # (a manifest gone since the listing: a push is rewriting that stage, which is then not there)
        data = self._io("read", self.fs.cat, list(found), on_error="omit")
        return {PurePosixPath(p).parent.name: b for p, b in data.items() if isinstance(b, bytes)}

    def _remote_manifest(self, stage: str) -> bytes | None:
        try:
            return self._io(f"read {stage}/{MANIFEST}", self.fs.cat_file, f"{self.root}/{stage}/{MANIFEST}")
        except FileNotFoundError:
            return None

    def _io(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - a store's errors are its own classes (botocore's are not OSErrors)
            raise InputError(f"{self.url}: cannot {what}: {exc}") from None

    # -- fetch and put back ---------------------------------------------------------------------------------------

    def pull(self) -> list[str]:
        """Fetch the stage outputs of the URL that changed there since this copy last synced; returns them."""
        clean_leftovers(self.path)
        remote = self._remote_manifests()
        fetched = []
        for stage in sorted(set(remote) | set(self.synced)):
            there, here, synced = remote.get(stage), self._local(stage), self.synced.get(stage)
            h_there, h_here = _hash(there), _hash(here)
            if h_there == h_here:
                self._mark(stage, h_there)
            elif h_there == synced:
                pass        # (changed here only: put back at the end)
            elif there is None:
                if h_here == synced:     # (removed there, unchanged here)
                    portable.remove_tree(stage_dir(self.path, stage))
                self._mark(stage, None)
            else:
                if here is not None and h_here != synced:
                    print(f"bootprof: {self.url}/{stage}/ changed there and in the working copy {self.path}: "
                          "taking the URL's", file=sys.stderr)
                self._fetch(stage, there)
                fetched.append(stage)
        self._save()
        return fetched

    def _fetch(self, stage: str, manifest: bytes) -> None:
        prefix = f"{self.root}/{stage}"
        for _ in range(PULL_TRIES):
            tmp = self.path / f".{stage}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                self.fs.invalidate_cache(prefix)
                files = [p for p in self._io("list", self.fs.find, prefix) if PurePosixPath(p).name != MANIFEST]
                targets = [str(tmp / PurePosixPath(p).relative_to(prefix)) for p in files]
                for t in targets:
                    Path(t).parent.mkdir(parents=True, exist_ok=True)
                if files:
                    self._io(f"fetch {stage}/", self.fs.get, files, targets)
                    self.moved += sum(Path(t).stat().st_size for t in targets)
                again = self._remote_manifest(stage)
                if again == manifest:
                    tmp.mkdir(exist_ok=True)
                    (tmp / MANIFEST).write_bytes(manifest)
                    swap_into_place(tmp, stage_dir(self.path, stage))
                    self._mark(stage, _hash(manifest))
                    return
                if again is None:       # (a push between removing the old manifest and writing the new one)
                    deadline = time.monotonic() + PUSH_WAIT_S
                    while again is None and time.monotonic() < deadline:
                        time.sleep(PUSH_POLL_S)
                        again = self._remote_manifest(stage)
                    if again is None:
                        raise InputError(f"{self.url}/{stage}/: removed while it was fetched (or a push of it was cut "
                                         "short: run that stage again)")
                manifest = again        # (rewritten meanwhile: read the new one)
            except FileNotFoundError:
                pass        # (a file went while it was fetched: a push rewrites the stage; try again)
            finally:
                if tmp.exists():
                    portable.remove_tree(tmp)
        raise InputError(f"{self.url}/{stage}/: rewritten while it was fetched, {PULL_TRIES} times "
                         "(another command writes this run); try again once it has ended")

    def push(self) -> list[str]:
        """Put back every stage output of the copy that changed here since it last synced; returns them."""
        put = []
        for stage in changed_here(self.path, self.synced):
            here = self._local(stage)
            there = self._remote_manifest(stage)
            if _hash(there) != _hash(here):
                self._put(stage, here)
                put.append(stage)
            self._mark(stage, _hash(here))
            self._save()
        return put

    def _put(self, stage: str, manifest: bytes) -> None:
        prefix = f"{self.root}/{stage}"
        local = stage_dir(self.path, stage)
        with contextlib.suppress(FileNotFoundError):
            self._io(f"remove {stage}/{MANIFEST}", self.fs.rm_file, f"{prefix}/{MANIFEST}")
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
        targets = [f"{prefix}/{p.relative_to(local).as_posix()}" for p in files]
        if files:
            self._io(f"write {stage}/", self.fs.put, [str(p) for p in files], targets)
            self.moved += sum(p.stat().st_size for p in files)
        self.fs.invalidate_cache(prefix)
        stale = set(self._io("list", self.fs.find, prefix)) - set(targets)
        if stale:
            self._io(f"remove old files of {stage}/", self.fs.rm, sorted(stale))
        self._io(f"write {stage}/{MANIFEST}", self.fs.pipe_file, f"{prefix}/{MANIFEST}", manifest)

    def _mark(self, stage: str, digest: str | None) -> None:
        if digest is None:
            self.synced.pop(stage, None)
        else:
            self.synced[stage] = digest


def changed_here(copy: Path, synced: dict[str, str]) -> list[str]:
    """The stage outputs of a working copy (its directories with a manifest) whose manifest is not the one it last
    synced (``synced``: stage -> hash): made here and not put back yet."""
    # (hashed here, not by ``runs.manifest_hash``: its cache keys on the file's time and size, and a manifest
    # rewritten within the clock's step with the same size must not pass for the one put back)
    return [d.name for d in sorted(copy.iterdir()) if d.is_dir() and not d.name.startswith(".")
            and (d / MANIFEST).is_file() and _hash((d / MANIFEST).read_bytes()) != synced.get(d.name)]


#: A working copy used this recently is never removed to make room (another command may be working in it).
IN_USE_S = 3600


def prune(mirror_dir: str | os.PathLike, max_bytes: int, keep: Path) -> tuple[list[Path], int]:
    """Remove working copies below ``mirror_dir``, the least recently used first (their record's time: each command
    writes it as it starts), until those left take at most ``max_bytes``; never ``keep``, a copy used in the last
    ``IN_USE_S``, or one holding a stage output not put back yet. Returns the copies removed and their bytes."""
    copies = []
    for state in Path(mirror_dir).expanduser().glob(f"*/*/{STATE}"):
        copy = state.parent
        try:
            synced = json.loads(state.read_text()).get("synced") or {}
            used = state.stat().st_mtime
            size = sum(f.stat().st_size for f in copy.rglob("*") if f.is_file() and not f.is_symlink())
            put_back = not changed_here(copy, synced)
        except (OSError, ValueError, AttributeError):
            continue            # (being written or removed by another command: left alone)
        copies.append((used, copy, size, put_back))
    total = sum(size for _, _, size, _ in copies)
    removed, freed = [], 0
    for used, copy, size, put_back in sorted(copies, key=lambda c: c[0]):
        if total <= max_bytes:
            break
        if copy == keep or not put_back or time.time() - used < IN_USE_S:
            continue
        portable.remove_tree(copy.parent)        # (its URL's directory, ``working_copy``)
        removed.append(copy)
        freed += size
        total -= size
    return removed, freed


def _hash(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def mirrored(run: RunLocation, runs) -> Iterator[Path]:
    """The directory a command works in for ``--run``: the path itself, or for a URL its working copy,
    fetched first and put back when the command ends (not on Ctrl-C); then the working copies beyond
    ``runs.mirror_max_bytes`` are removed (``runs``: the config's ``runs`` section)."""
    if run.url is None:
        yield Path(run.path)
        return
    mirror = Mirror(run.url, runs.mirror_dir)
    t0 = time.perf_counter()
    fetched = mirror.pull()
    print(f"bootprof: run {mirror.url}: working copy {mirror.path}"
          + (f" (fetched {', '.join(s + '/' for s in fetched)}: {_amount(mirror, t0)})" if fetched else ""),
          file=sys.stderr)
    try:
        yield mirror.path
    except BaseException as exc:
        from pipeline.errors import BootprofError, is_interrupt

        if isinstance(exc, KeyboardInterrupt) or is_interrupt(exc):
            print(f"bootprof: nothing put back to {mirror.url}: the next command on it from this working copy puts "
                  "back what this one made", file=sys.stderr)
            raise
        try:        # (what the stages that ended made; the command's own error is the one it reports)
            _put_back(mirror)
        except BootprofError as put_error:
            print(f"bootprof: {put_error}", file=sys.stderr)
        raise
    _put_back(mirror)
    removed, freed = prune(runs.mirror_dir, runs.mirror_max_bytes, keep=mirror.path)
    if removed:
        print(f"bootprof: removed {len(removed)} working cop{'y' if len(removed) == 1 else 'ies'} used least recently "
              f"({freed / 1e6:.1f} MB; runs.mirror_max_bytes {runs.mirror_max_bytes.text})", file=sys.stderr)


def _put_back(mirror: Mirror) -> None:
    t0, mirror.moved = time.perf_counter(), 0
    put = mirror.push()
    if put:
        print(f"bootprof: put back to {mirror.url}: {', '.join(s + '/' for s in put)} ({_amount(mirror, t0)})",
              file=sys.stderr)


def _amount(mirror: Mirror, t0: float) -> str:
    return f"{mirror.moved / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s"
