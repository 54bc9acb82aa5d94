"""A run that travels with its symbols (as PerfView's ``/ZipEtl`` does): the PDBs of the build's own images, copied
at capture time, and one archive of the whole capture that any machine analyzes.

- :func:`collect_symbols`: the PDBs that the trace names (its ImageID and DbgID_RSDS records, in the decoded
  ``image_ids`` table) and that lie under the build's checkout (the rustc, std and tool binaries just built) go
  into ``RUN_DIR/symbols/`` in symbol-store layout (``NAME.pdb/GUIDAGE/NAME.pdb``), which the symbolize stage
  searches first. A PDB is taken only when its own GUID (the PDB info stream) is the one the trace names.
- :func:`pack`: ``bootprof pack RUN_DIR OUT`` writes one zip: the trace, the self-profiles, the symbols and the
  capture manifest, with ``bootprof-pack.json`` listing them.
- :func:`unpack_into`: ``bootprof run --trace OUT`` and ``bootprof decode OUT`` take such an archive on any system:
  its files go into the run directory, as the capture left them.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.errors import InputError
from pipeline.stages import CAPTURED, DECODED

SYMBOLS = "symbols"
#: The member that makes a zip a bootprof pack.
PACK_MANIFEST = "bootprof-pack.json"
#: What a pack holds, as paths in the run directory.
PACKED = ("input/trace.etl", "selfprofile", SYMBOLS, "capture/_manifest.json")
#: Directories of a checkout never searched for PDBs.
SKIP_DIRS = {".git", ".hg", "node_modules", "__pycache__"}


def pdb_guid(path: Path) -> str | None:
    """The GUID a PDB carries (its info stream), as lowercase canonical text; None when it is not a PDB 7."""
    from pipeline import portable
    from pipeline.symbolize.pdbpublics import Msf

    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            # (a compiler's PDB is GBs: only the blocks read are paged in; the map goes with its last view)
            info = bytes(Msf(portable.map_read(f.fileno()), str(path)).stream(1))
    except (InputError, OSError, IndexError, ValueError):
        return None
    if len(info) < 28:
        return None
    return str(uuid.UUID(bytes_le=info[12:28]))


def store_dir(name: str, guid: str, age: int) -> PurePosixPath:
    """Where a symbol store keeps a PDB: ``NAME/GUIDAGE/`` (GUID without dashes, upper case; age in hex)."""
    return PurePosixPath(name) / f"{guid.replace('-', '').upper()}{age:X}"


def collect_symbols(run_dir: Path, checkout: Path) -> list[dict[str, Any]]:
    """Copy the PDBs of the trace's images that lie under ``checkout`` into ``RUN_DIR/symbols``; what was copied
    (name, debug id, size, where it came from). Needs the run's decoded ``image_ids``."""
    from pipeline.runs import has_table, read_table

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
            os.replace(tmp, dest)
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
        os.replace(tmp, out)
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


def unpack_into(pack_path: Path, run_dir: Path) -> None:
    """The files of a pack into ``run_dir``, where the capture had them (a member that would land outside it, or
    one the pack does not list, is an error naming it)."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()
    try:
        with zipfile.ZipFile(pack_path) as z:
            listed = {f["path"] for f in json.loads(z.read(PACK_MANIFEST))["files"]}
            for info in z.infolist():
                if info.filename == PACK_MANIFEST or info.is_dir():
                    continue
                target = (run_dir / info.filename).resolve()
                if info.filename not in listed or not target.is_relative_to(root) or \
                        not any(info.filename == p or info.filename.startswith(p + "/") for p in PACKED):
                    raise InputError(f"{pack_path}: member {info.filename!r} is not part of a capture")
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
                with z.open(info) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(tmp, target)
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise InputError(f"{pack_path}: not a readable bootprof pack: {exc}") from None
