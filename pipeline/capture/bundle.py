"""A run that travels with its symbols (as PerfView's ``/ZipEtl`` does): the PDBs of the build's own images, copied
at capture time, and one archive of the whole capture that any machine analyzes.

- :func:`collect_symbols`: the PDBs that the trace names (its ImageID and DbgID_RSDS records, in the decoded
  ``image_ids`` table) and that lie under the build's checkout (the rustc, std and tool binaries just built) go
  into ``RUN_DIR/symbols/`` in symbol-store layout (``NAME.pdb/GUIDAGE/NAME.pdb``), which the symbolize stage
  searches first. A PDB is taken only when its own GUID (the PDB info stream) is the one the trace names.
- :func:`pack`: ``bootprof pack RUN_DIR OUT`` writes one zip: the trace (``trace.etl``, or ``perf.data`` of a
  ``capture --perf``), the self-profiles, the symbols and the capture manifest, with ``bootprof-pack.json`` listing them.
- :func:`unpack_into`: ``bootprof run --trace OUT`` and ``bootprof decode OUT`` take such an archive on any system:
  its files go into the run directory, as the capture left them.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline import portable, sources
from pipeline.errors import BootprofError, InputError
from pipeline.stages import CAPTURED, DECODED

SYMBOLS = "symbols"
#: The member that makes a zip a bootprof pack.
PACK_MANIFEST = "bootprof-pack.json"
#: What a pack holds, as paths in the run directory: the recording (an ETL trace, or perf.data of ``capture --perf``).
PACKED = ("input/trace.etl", "input/perf.data", "selfprofile", SYMBOLS, "capture/_manifest.json")
#: Directories of a checkout never searched for PDBs.
SKIP_DIRS = {".git", ".hg", "node_modules", "__pycache__"}


def store_dir(name: str, guid: str, age: int) -> PurePosixPath:
    """Where a symbol store keeps a PDB: ``NAME/GUIDAGE/`` (GUID without dashes, upper case; age in hex)."""
    return PurePosixPath(name) / f"{guid.replace('-', '').upper()}{age:X}"


def collect_symbols(run_dir: Path, checkout: Path) -> list[dict[str, Any]]:
    """Copy the PDBs of the trace's images that lie under ``checkout`` into ``RUN_DIR/symbols``; what was copied
    (name, debug id, size, where it came from). Needs the run's decoded ``image_ids``."""
    from pipeline.runs import has_table, read_table
    from pipeline.symbolize.pdbpublics import pdb_guid

    if not has_table(run_dir, DECODED, "image_ids"):
        return []
    ids = read_table(run_dir, DECODED, "image_ids").select(["pdb_guid", "pdb_age", "pdb_name"]).to_pylist()
    wanted: dict[str, list[tuple[str, int]]] = {}
    for r in ids:
        if r["pdb_guid"] and r["pdb_name"] and r["pdb_age"] is not None:
            name = Path(r["pdb_name"].replace("\\", "/")).name
            pair = (r["pdb_guid"].lower(), int(r["pdb_age"]))
            if pair not in wanted.setdefault(name.lower(), []):
                wanted[name.lower()].append(pair)
    found: dict[str, list[Path]] = {}
    for dirpath, dirnames, filenames in os.walk(checkout):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            if f.lower() in wanted:
                found.setdefault(f.lower(), []).append(Path(dirpath) / f)
    copied = []
    dest_root = Path(run_dir) / SYMBOLS
    for key, paths in sorted(found.items()):
        guids = {p: pdb_guid(p) for p in paths}
        for guid, age in wanted[key]:
            source = next((p for p, g in guids.items() if g == guid), None)
            if source is None:
                continue
            dest = dest_root / store_dir(source.name, guid, age) / source.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
            shutil.copyfile(source, tmp)
            portable.replace(tmp, dest)
            copied.append({"name": source.name, "debug_id": f"{guid}-{age:x}", "size": dest.stat().st_size,
                           "source": str(source), "path": str(dest.relative_to(run_dir))})
    return copied


def pack(run_dir: Path, out: Path) -> dict[str, Any]:
    """``bootprof pack``: the capture of ``run_dir`` (trace, self-profiles, symbols, capture manifest) into one zip,
    written aside and renamed into place."""
    run_dir = Path(run_dir)
    if not (run_dir / CAPTURED / "_manifest.json").exists():
        raise InputError(f"{run_dir}: no capture here (bootprof capture ... --run {run_dir} makes one)")
    files = []
    for rel in PACKED:
        path = run_dir / rel
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    listing = [{"path": p.relative_to(run_dir).as_posix(), "size": p.stat().st_size} for p in files]
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as z:
            z.writestr(PACK_MANIFEST, json.dumps({"format": 1, "run": run_dir.name, "files": listing}, indent=1))
            for p, item in zip(files, listing):
                z.write(p, item["path"])
        portable.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"pack": str(out), "files": len(files), "bytes": out.stat().st_size,
            "symbols": sum(1 for i in listing if i["path"].startswith(SYMBOLS + "/"))}


def is_pack(path: Any) -> bool:
    """Whether ``path`` is a local file that is a bootprof pack."""
    try:
        if not Path(path).is_file() or not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as z:
            return PACK_MANIFEST in z.namelist()
    except (OSError, zipfile.BadZipFile, TypeError):
        return False


#: The pack formats this version reads (``bootprof-pack.json``'s ``format``).
PACK_FORMATS = (1,)
#: At most this many members in a pack.
MAX_MEMBERS = 100_000
#: A member larger than ``RATIO_FROM`` bytes may be at most ``MAX_RATIO`` times its compressed size (real ETL traces
#: deflate up to 112:1; a zip bomb is about 1,000:1).
MAX_RATIO, RATIO_FROM = 500, 16 << 20
#: What the unpacked files together may take, at most, beside the space left free on the run's disk.
KEEP_FREE = 1 << 30
#: A path component longer than this many bytes (UTF-8) is refused (every common file system's limit).
MAX_NAME_BYTES = 255


def _member_path(pack_path: Path, name: str, listed: set[str]) -> PurePosixPath:
    """The member's path in the run directory: a relative POSIX path of plain names under one of ``PACKED``, listed
    by the pack's manifest; anything else is an error naming it."""
    def refuse(why: str) -> InputError:
        return InputError(f"{pack_path}: member {name!r}: {why}")

    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(":" in p for p in parts):
        raise refuse("an absolute path, a drive or a backslash: not part of a capture")
    if any(p in ("", ".", "..") for p in parts):
        raise refuse("a path with an empty, '.' or '..' part: not part of a capture")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise refuse("a control character in its name")
    if any(len(p.encode("utf-8")) > MAX_NAME_BYTES for p in parts):
        raise refuse(f"a name longer than {MAX_NAME_BYTES} bytes")
    if name not in listed or not any(name == k or name.startswith(k + "/") for k in PACKED):
        raise refuse("not part of a capture")
    return PurePosixPath(name)


def read_pack_manifest(z: zipfile.ZipFile, pack_path: Path) -> dict[str, Any]:
    """``bootprof-pack.json``, checked: a known format and a list of files, each a path and a size."""
    bad = f"{pack_path}: not a readable bootprof pack"
    try:
        manifest = json.loads(z.read(PACK_MANIFEST))
    except (KeyError, ValueError, zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
        raise InputError(f"{bad}: {PACK_MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list) or \
            not all(isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)
                    and not isinstance(f.get("size"), bool) and f["size"] >= 0 for f in manifest["files"]):
        raise InputError(f"{bad}: {PACK_MANIFEST} is not an object with a list of files, each a path and a size")
    if manifest.get("format") not in PACK_FORMATS:
        raise InputError(f"{bad}: its format {manifest.get('format')!r} is not one this bootprof reads "
                         f"({', '.join(map(str, PACK_FORMATS))}): unpack it with the bootprof that packed it")
    return manifest


def unpack_into(pack_path: Path, run_dir: Path) -> None:
    """The files of a pack into ``run_dir``, where the capture had them. Every member is checked before the first
    is written: a name that would leave the run directory, collide with another or is not one the pack lists; a
    member encrypted or compressed in a way zip readers differ on; more members, bytes or a higher ratio than
    a capture has. Each is written aside and renamed into place (an interrupt leaves no part of one)."""
    run_dir = Path(run_dir)
    try:
        with zipfile.ZipFile(pack_path) as z:
            manifest = read_pack_manifest(z, pack_path)
            listed = {f["path"] for f in manifest["files"]}
            members = [i for i in z.infolist() if i.filename != PACK_MANIFEST and not i.is_dir()]
            if len(members) > MAX_MEMBERS:
                raise InputError(f"{pack_path}: {len(members):,} members, more than a capture has ({MAX_MEMBERS:,})")
            plan: dict[str, tuple[zipfile.ZipInfo, PurePosixPath]] = {}
            dirs: set[str] = set()
            for info in members:
                rel = _member_path(pack_path, info.filename, listed)
                if info.flag_bits & 0x1:
                    raise InputError(f"{pack_path}: member {info.filename!r} is encrypted")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise InputError(f"{pack_path}: member {info.filename!r} is compressed with method "
                                     f"{info.compress_type}; a pack's members are stored or deflated")
                if info.file_size > RATIO_FROM and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                    raise InputError(f"{pack_path}: member {info.filename!r} would unpack to {info.file_size:,} bytes "
                                     f"from {info.compress_size:,} (over {MAX_RATIO}:1): not a capture")
                key = rel.as_posix().casefold()          # (one name on a file system that ignores case)
                if key in plan or key in dirs:
                    raise InputError(f"{pack_path}: member {info.filename!r} collides with another member")
                plan[key] = (info, rel)
                dirs.update(p.as_posix().casefold() for p in rel.parents if p != PurePosixPath("."))
            clash = next((plan[k][1] for k in plan if k in dirs), None)
            if clash is not None:
                raise InputError(f"{pack_path}: member {clash.as_posix()!r} is a file and a directory of another member")
            total = sum(info.file_size for info, _ in plan.values())
            run_dir.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(run_dir).free
            if total > free - KEEP_FREE:
                raise InputError(f"{pack_path}: unpacks to {total:,} bytes; {run_dir} has {free:,} free "
                                 f"(and keeps {KEEP_FREE >> 30} GiB free)")
            for info, rel in plan.values():
                _unpack_member(z, info, run_dir / rel, pack_path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError) as exc:
        raise InputError(f"{pack_path}: not a readable bootprof pack: {exc}") from None


def _unpack_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, pack_path: Path) -> None:
    """One member to ``target``, written aside and renamed into place; never more bytes than it declares."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        left = info.file_size
        with z.open(info) as src, open(tmp, "wb") as dst:
            while chunk := src.read(min(1 << 20, left + 1)):
                left -= len(chunk)
                if left < 0:
                    raise InputError(f"{pack_path}: member {info.filename!r} holds more than the "
                                     f"{info.file_size:,} bytes it declares")
                dst.write(chunk)
        portable.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def unpacked(traces: list[sources.Input], run_dir: Path) -> list[sources.Input]:
    """``traces``, with a pack (``bootprof pack``'s zip) unpacked into ``run_dir`` and taken as its capture: its
    trace and self-profiles (and its symbols, which symbolize searches first)."""
    packs = [t for t in traces if not sources.is_url(t) and is_pack(t)]
    if not packs:
        return traces
    if len(traces) > 1:
        raise BootprofError(f"{packs[0]}: a pack is a whole capture: give it alone as --trace")
    from pipeline.capture.paths import PROFILE_DIR, RECORDINGS
    from pipeline.runs import MANIFEST, stage_dir

    unpack_into(Path(packs[0]), run_dir)
    # (the unpacked files alone: the capture manifest's paths are those of the machine that captured, or whatever
    # the pack's maker wrote there)
    traces = [run_dir / t for t in RECORDINGS if (run_dir / t).is_file()]
    if len(traces) > 1:
        raise BootprofError(f"{packs[0]}: the pack holds an ETL trace and a perf.data file; a capture records one")
    found = traces + [p for p in (run_dir / PROFILE_DIR,) if p.exists()]
    if not (stage_dir(run_dir, CAPTURED) / MANIFEST).is_file() or not found:
        raise BootprofError(f"{packs[0]}: the pack holds no capture (no capture manifest, trace or self-profiles): "
                            "make one with `bootprof pack RUN_DIR OUT.zip` of a run that `bootprof capture` recorded")
    localize_capture(run_dir)
    print(f"inputs: the capture packed in {packs[0]}")
    return found


def localize_capture(run_dir: Path) -> None:
    """The capture manifest of an unpacked pack names the files where they are now, in ``run_dir`` (a later run of
    that directory without ``--trace`` reads those, not the paths of the machine that captured)."""
    from pipeline.capture.paths import PROFILE_DIR, RECORDINGS
    from pipeline.runs import MANIFEST, atomic_write_json, stage_dir

    path = stage_dir(run_dir, CAPTURED) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BootprofError(f"{path}: the pack's capture manifest is not readable JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BootprofError(f"{path}: the pack's capture manifest is not a JSON object")
    recording = manifest.get("recording")
    trace = next((run_dir / t for t in RECORDINGS if (run_dir / t).is_file()), None)
    if not isinstance(recording, dict) and trace is not None:     # (a trace the manifest did not name)
        recording = manifest["recording"] = {}
    if isinstance(recording, dict):
        recording["path"] = str(trace) if trace is not None else None
    if manifest.get("profile_dir") is not None:
        manifest["profile_dir"] = str(run_dir / PROFILE_DIR) if (run_dir / PROFILE_DIR).is_dir() else None
    atomic_write_json(path, manifest)
