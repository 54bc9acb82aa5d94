"""Run directories, stage manifests and atomic writes.

A run directory holds everything bootprof knows about one trace (or one set of self-profiles):

    RUN_DIR/
      input/                  inputs the pipeline made itself (the demo trace, its truth and symbols)
      capture/  decoded/  symbolized/  aggregated/  report/
                              one directory per stage; each holds parquet tables and _manifest.json

A stage never writes into its final directory. It writes into a hidden sibling (``.decoded.tmp-…``)
and, once everything including the manifest is on disk, swaps it into place. A reader that finds
``_manifest.json`` therefore sees a complete output; an interrupted stage leaves at most hidden
directories (its temporary output, a half-swapped old output, the aggregate's DuckDB spill), which the
next run of any stage removes once the process that made them is gone.

Each manifest records the sha256 of the manifests of the stages it read (``upstream``). A stage written
again changes its manifest, so every output made from the old one is *stale*: :func:`read_manifest`
refuses it, naming the stage to run again, instead of letting a report mix two decodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from pipeline import __version__, portable
from pipeline.checkpoints import checkpoint
from pipeline.errors import ManifestError
from pipeline.stages import DECODED, upstream_of

if TYPE_CHECKING:
    from pipeline.contracts import InputRecord, Manifest

#: Version of the on-disk layout of stage outputs (tables, columns, manifest fields). Readers refuse
#: outputs with a higher number; bump it whenever a column changes meaning or disappears.
SCHEMA_VERSION = 2

MANIFEST = "_manifest.json"


#: Bytes of one piece of :func:`sha256_tree`.
HASH_PIECE = 64 << 20


def sha256_tree(path: Path, piece: int = HASH_PIECE, threads: int | None = None) -> str:
    """The content hash of an input: sha256 over the concatenated sha256 digests (32 bytes each) of the file's
    ``piece``-byte pieces, in order (the last may be shorter; an empty file has no piece). The pieces hash at
    once on up to ``threads`` threads (default: every core, at most 8; hashlib releases the GIL), so a
    multi-GB trace's hash takes a fraction of one sha256 stream's wall time, beside a decode that needs every
    core. The same digest, in a shell: ``split -b 64M --filter='sha256sum | head -c64 | tr a-f A-F | basenc --base16 -d'
    FILE | sha256sum``."""
    path = Path(path)
    size = path.stat().st_size
    offsets = range(0, size, piece)

    def one(offset: int) -> bytes:
        h = hashlib.sha256()
        buf = memoryview(bytearray(min(1 << 20, piece)))
        fd = os.open(path, portable.READ_BINARY)
        try:
            end = min(offset + piece, size)
            while offset < end:
                n = portable.pread_into(fd, buf[:min(len(buf), end - offset)], offset)
                if n == 0:
                    break
                h.update(buf[:n])
                offset += n
        finally:
            os.close(fd)
        return h.digest()

    n = min(threads or min(os.cpu_count() or 1, 8), max(1, len(offsets)))
    if n == 1:
        digests = [one(o) for o in offsets]
    else:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix="bootprof-hash") as pool:
            digests = list(pool.map(one, offsets))
    return hashlib.sha256(b"".join(digests)).hexdigest()


def canonical_hash(obj: Any) -> str:
    """sha256 of the canonical JSON form of ``obj`` (sorted keys, no whitespace)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        portable.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def parquet_row_counts(directory: Path) -> dict[str, int]:
    """Rows per table for every ``<table>.parquet`` (file or dataset directory) in ``directory``."""
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    for entry in sorted(Path(directory).iterdir()):
        if not entry.name.endswith(".parquet"):
            continue
        files = [entry] if entry.is_file() else sorted(entry.rglob("*.parquet"))
        counts[entry.name[: -len(".parquet")]] = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return counts


class StageOutput:
    """The temporary directory a stage writes into, and the manifest it will carry."""

    def __init__(self, run_dir: Path, stage: str, tmp: Path):
        self.run_dir = run_dir
        self.stage = stage
        self.path = tmp
        self.manifest: dict[str, Any] = {}

    def table_path(self, table: str) -> Path:
        return self.path / f"{table}.parquet"

    def write_table(self, table: str, data, **kwargs) -> Path:
        """Write a pyarrow Table as ``<table>.parquet`` (zstd) in the stage directory."""
        import pyarrow.parquet as pq

        path = self.table_path(table)
        pq.write_table(data, path, compression=kwargs.pop("compression", "zstd"), **kwargs)
        return path


@dataclass(frozen=True)
class RunLocation:
    """Where a run is, as the user named it, made once (``--run``, :func:`pipeline.sources.run_dir`; a job's
    ``runs_dir``): a directory (``path``) or a store's URL (``url``), where a command works in a working copy of it
    (:func:`pipeline.mirror.mirrored`, which gives every command its directory)."""

    path: Path | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.url is None):
            raise ValueError("a run is at a path or at a URL")

    def __str__(self) -> str:
        return self.url if self.url is not None else str(self.path)


def stage_dir(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / stage


#: Hidden leftovers of a stage killed before it finished: its temporary output (``.STAGE.tmp-PID-…``), the old
#: output of a swap cut in two (``.STAGE.old-PID-…``) and the aggregate's DuckDB spill (``.aggregate-spill-PID-…``),
#: PID the process that made them.
LEFTOVER = re.compile(r"^\.(?:(\w+)\.tmp|(\w+)\.old|aggregate-spill)-(?:(\d+)-)?")


def clean_leftovers(run_dir: Path) -> list[Path]:
    """Tidy what killed stages left in ``run_dir`` (``LEFTOVER``) once their process is gone; returns what was
    removed. A swap cut between its two renames (``swap_into_place``: the old output set aside, the new one not yet
    in place) is undone: the old output goes back."""
    removed = []
    try:            # (the owner note of a command that was killed: its lock went with its process)
        if not pid_alive(int(json.loads((Path(run_dir) / OWNER).read_text())["pid"])):
            (Path(run_dir) / OWNER).unlink(missing_ok=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for entry in sorted(Path(run_dir).iterdir()) if Path(run_dir).is_dir() else []:
        m = LEFTOVER.match(entry.name)
        if m is None or not entry.is_dir() or (m.group(3) and pid_alive(int(m.group(3)))):
            continue
        aside = m.group(2)
        if aside and not (entry.parent / aside).exists():
            portable.rename(entry, entry.parent / aside)
            continue
        portable.remove_tree(entry)
        removed.append(entry)
    return removed


pid_alive = portable.pid_alive


_hashes: dict[tuple[str, int, int], str] = {}


def manifest_hash(run_dir: Path, stage: str) -> str | None:
    """sha256 of a finished stage's ``_manifest.json`` (None when there is none); cached per file version."""
    path = stage_dir(run_dir, stage) / MANIFEST
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)     # (each write is a file of its own)
    if key not in _hashes:
        _hashes[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _hashes[key]


def upstream_hashes(run_dir: Path, stages: tuple[str, ...]) -> dict[str, str]:
    """The hashes of the manifests of ``stages`` that are present now (a manifest's ``upstream``)."""
    return {s: h for s in stages if (h := manifest_hash(run_dir, s)) is not None}


#: The lock a command holds on a run directory for as long as it works there, and who holds it.
LOCK = ".bootprof.lock"
OWNER = ".bootprof.owner.json"


@contextlib.contextmanager
def owned(run_dir: Path, command: str, timeout_s: float = 300.0) -> Iterator[None]:
    """Hold ``run_dir`` for one command (``command``, for the message another one gets): a second command on the
    same run directory waits up to ``timeout_s`` (``runs.lock_timeout_s``), then fails with one line that names
    the holder. Two commands in one run directory once mixed one trace's decode with another's aggregate."""
    import socket

    from filelock import FileLock, Timeout

    from pipeline.errors import InputError

    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot make the run directory: {exc.strerror or exc}") from None
    strangers = not_a_run(run_dir)
    if strangers:
        raise InputError(f"{run_dir}: not a bootprof run directory (it holds {', '.join(strangers[:3])}"
                         f"{', ...' if len(strangers) > 3 else ''}): name a new or empty directory for the run")
    lock = FileLock(str(run_dir / LOCK))
    checkpoint("runs.lock")
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        try:
            who = json.loads((run_dir / OWNER).read_text())
            holder = f"pid {who['pid']} on {who['host']} since {who['since']}: {who['command']}"
        except (OSError, ValueError, KeyError):
            holder = "a process that did not say which"
        raise InputError(f"{run_dir}: another bootprof command works in this run directory ({holder}); waited "
                         f"{timeout_s:g} s (runs.lock_timeout_s)") from None
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot lock the run directory: {exc.strerror or exc}") from None
    try:
        atomic_write_json(run_dir / OWNER, {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                                            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        yield
    finally:
        (run_dir / OWNER).unlink(missing_ok=True)
        lock.release()


#: What a run directory holds besides the stages' outputs (``stages.outputs()``): what capture records, the lock.
RUN_ENTRIES = {"input", "selfprofile", "symbols", LOCK, OWNER}


def not_a_run(run_dir: Path) -> list[str]:
    """The entries of ``run_dir`` that no run directory holds (none: it is a run directory, or empty). A command
    once wrote ``/decoded`` when given ``--run /``."""
    from pipeline import stages

    known = RUN_ENTRIES | set(stages.outputs())
    try:
        return sorted(e.name for e in Path(run_dir).iterdir() if e.name not in known and not e.name.startswith("."))
    except OSError:
        return []


def fresh_dir(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... : the first that did not exist, made now (two commands that start in
    the same second get two)."""
    for k in range(1, 10_000):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: no free name")


@contextlib.contextmanager
def stage_output(
    run_dir: Path,
    stage: str,
    *,
    inputs: list[InputRecord] | None = None,
    config: dict[str, Any] | None = None,
    upstream: tuple[str, ...] | None = None,
) -> Iterator[StageOutput]:
    """Give a stage a private directory; on success, add the manifest and swap it into ``RUN_DIR/stage``.

    The manifest always carries: schema and project version, stage, creation time, inputs (path, size,
    sha256), the resolved config and its hash, the hashes of the ``upstream`` outputs' manifests it was made from
    (those present now, as the stage reads them; by default those the registry's row of the stage names), and row
    counts per table. The stage adds its own
    counts (buffers skipped, events lost, ...) to ``out.manifest``.
    On an exception the temporary directory is removed and the previous output stays untouched.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    clean_leftovers(run_dir)
    if upstream is None:
        upstream = upstream_of(stage)
    made_from = upstream_hashes(run_dir, upstream)
    # (absolute: the stage's tasks may run in workers of another working directory, a standing dask cluster's)
    tmp = run_dir.absolute() / f".{stage}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    out = StageOutput(run_dir, stage, tmp)
    started = time.time()
    try:
        yield out
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "project_version": __version__,
            "stage": stage,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # (this write's own identity: two writes of the same output in one second differ by it, so that
            # what was made from the first is stale after the second, whatever the clock's resolution)
            "output_id": uuid.uuid4().hex,
            "elapsed_s": round(time.time() - started, 3),
            "inputs": inputs or [],
            "config": config or {},
            "config_hash": canonical_hash(config or {}),
            "upstream": made_from,
            "tables": parquet_row_counts(tmp),
        }
        manifest.update(out.manifest)
        atomic_write_json(tmp / MANIFEST, manifest)
        # (what the stage says it was made from: what was there as it started, or what it waited for and then
        # read, as the aggregate does beside a running symbolize)
        recorded = manifest["upstream"]
        now = upstream_hashes(run_dir, upstream)
        moved = sorted(s for s, h in now.items() if s in recorded and recorded[s] != h)
        if moved or set(recorded) - set(now):
            raise ManifestError(f"{run_dir}: {', '.join(moved) or 'an upstream output'} was written again while "
                                f"{stage} read it; {stage} is not kept: run it again")
        checkpoint(f"{stage}.swap")
        swap_into_place(tmp, stage_dir(run_dir, stage))
    except BaseException:
        portable.remove_tree(tmp)
        raise


def swap_into_place(tmp: Path, final: Path) -> None:
    """Make the directory ``tmp`` the directory ``final``: a reader finds the old one, none for a moment, or the new
    one; never a part of either. Two renames, as every system allows (Windows renames no directory over another):
    the old output aside, then the new one in place; a process that ends between them leaves the old one aside,
    which the next run puts back (:func:`clean_leftovers`)."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        portable.rename(final, old)
    try:
        portable.rename(tmp, final)
    except BaseException:
        if old is not None and not final.exists():
            portable.rename(old, final)         # (the new output could not go in place: the old one stays)
        raise
    if old is not None:
        portable.remove_tree(old)


def read_manifest(run_dir: Path, stage: str) -> Manifest:
    """The manifest of a finished stage; refuses missing, unreadable, malformed (:data:`pipeline.contracts.MANIFEST`)
    or newer-schema outputs, and outputs made from upstream outputs that were written again since."""
    path = stage_dir(run_dir, stage) / MANIFEST
    if not path.exists():
        raise ManifestError(f"{path}: no finished '{stage}' output in run {run_dir} (run that stage first)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: not a bootprof manifest: a JSON {type(manifest).__name__}, not an object")
    version = manifest.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: schema_version {version!r} is newer than this bootprof understands "
            f"({SCHEMA_VERSION}); upgrade bootprof (installed {__version__})"
        )
    from pydantic import ValidationError

    from pipeline.contracts import MANIFEST as COMMON_PART

    try:
        COMMON_PART.validate_python(manifest, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ManifestError(f"{path}: not a bootprof manifest: {'.'.join(map(str, first['loc'])) or 'the whole'}: "
                            f"{first['msg']}") from None
    made_from = manifest.get("upstream") or {}
    changed = [s for s, h in sorted(made_from.items()) if manifest_hash(run_dir, s) != h]
    if changed:
        raise ManifestError(
            f"{path}: stale: {', '.join(f'{s}/' for s in changed)} {'was' if len(changed) == 1 else 'were'} "
            f"written again after this '{stage}' output was made from {'it' if len(changed) == 1 else 'them'}; "
            f"run the '{stage}' stage again")
    return manifest


def table_path(run_dir: Path, stage: str, table: str) -> Path:
    return stage_dir(run_dir, stage) / f"{table}.parquet"


def parquet_glob(path: Path) -> str:
    """What DuckDB's ``read_parquet`` takes for a table: the file, or every part of a dataset directory (the
    directory's own name with its glob characters escaped: a run directory named ``dec[1]`` is no pattern)."""
    import glob

    return f"{glob.escape(str(path))}/**/*.parquet" if Path(path).is_dir() else glob.escape(str(path))


def sql_path(path) -> str:
    """A path as a DuckDB string literal, for the few places SQL takes no parameter (a view's ``read_parquet``, a
    ``COPY ... TO``): quoted, with its quotes doubled, so that no path (``dec'q``) can end the literal. Every
    other path goes into SQL as a bound parameter."""
    return "'" + str(path).replace("'", "''") + "'"


def decoded_input_bytes(run_dir: Path) -> int | None:
    """Bytes of the inputs the run's ``decoded/`` was made from (None when it has no finished decode)."""
    try:
        return sum(int(i.get("size") or 0) for i in read_manifest(run_dir, DECODED).get("inputs", []))
    except ManifestError:
        return None


def self_profile_bytes(run_dir: Path) -> int | None:
    """Bytes of the self-profiles among those inputs (0 for none; None when there is no finished decode): what
    the aggregate and report stages hand to workers (their query sections, one task per part). The ETL trace's
    sections run in DuckDB in the stage's own process, so its bytes do not make those stages start a cluster."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        read_manifest(run_dir, DECODED)
    except ManifestError:
        return None
    path = table_path(run_dir, DECODED, "self_profiles")
    if not path.exists():
        return 0
    return int(pc.sum(pq.read_table(path, columns=["size"]).column("size")).as_py() or 0)


def has_table(run_dir: Path, stage: str, table: str) -> bool:
    return table_path(run_dir, stage, table).exists()


def read_table(run_dir: Path, stage: str, table: str, columns: list[str] | None = None,
               dictionary: tuple[str, ...] = ()):
    """Read one table of a finished stage (file or dataset directory) as a pyarrow Table; the ``dictionary``
    columns as dictionary arrays, as parquet stores them (no string is hashed again)."""
    import pyarrow.dataset as ds

    read_manifest(run_dir, stage)
    path = table_path(run_dir, stage, table)
    if not path.exists():
        raise ManifestError(f"{path}: table '{table}' is not in the '{stage}' output of {run_dir}")
    fmt = ds.ParquetFileFormat(read_options={"dictionary_columns": list(dictionary)}) if dictionary else "parquet"
    return ds.dataset(path, format=fmt).to_table(columns=columns)
