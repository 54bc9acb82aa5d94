"""A perf run that travels with its ELF files (``bootprof capture --perf --symbols``): each image that had samples,
copied into ``RUN_DIR/symbols/elf/<key>/`` after the recording, so that ``bootprof pack`` carries it and symbolize
reads it on a machine without the build's toolchain.

``<key>`` is the image's identity key in symbolize (:func:`pipeline.symbolize.elf.identities`): ``elf-<build id>``,
or for a file without a build id (rustup's ``librustc_driver-*.so`` has none) ``elf-path-<hash of the path>-<size>-
<mtime>`` of the file as it was when the build ended. The directory holds the mapped file under its own name (its
program headers turn symbol addresses into file offsets) and, when the distribution has one, its detached debug file
(``/usr/lib/debug/.build-id/ab/cdef….debug``) as ``<name>.debug``.

Images are taken most frames first (distinct sampled addresses in them) while their files fit in ``max_bytes`` together; what was left, and why (over
the limit, not on this machine, replaced since the recording, a kernel or pseudo file), is listed beside what was
copied, in the capture manifest. Only what can be an ELF image is opened (``elfload.image_file``, as symbolize and
the unwinder do): a recording names any path.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import portable
from pipeline.units import Size

#: Where the ELF files go, under the run's ``symbols/`` (the PDBs of an ETW run use the rest of it).
ELF_DIR = "elf"
#: ``--symbols-max``'s default: rustup's librustc_driver alone is ~150 MB, a distribution's libc with its debug file
#: ~10 MB; a build of a rust checkout with debug info may be several times that.
DEFAULT_MAX = Size("1GB")


def _own_build_id(path: Path) -> tuple[str | None, str | None]:
    """The file's GNU build id (lowercase hex, None when it has none), or why it cannot be read."""
    try:
        from symbolic import Archive

        obj = next(iter(Archive.open(str(path)).iter_objects()), None)
    except ImportError:
        return None, "reading ELF files needs the `symbolic` package"
    except Exception as exc:  # noqa: BLE001 - an unreadable file is a reason in the manifest, not a crash
        return None, f"unreadable ELF file: {type(exc).__name__}: {exc}"
    return (str(obj.code_id).lower() if obj is not None and obj.code_id else None), None


def sampled_images(run_dir: Path) -> list[dict[str, Any]]:
    """The distinct files of the decoded images that frames of the run fall in, most frames first: file name, build
    id (None: perf had none), frames, pid 0 for the kernel."""
    from pipeline.runs import read_table
    from pipeline.stages import DECODED
    from pipeline.symbolize import collect_frames, map_images

    images = read_table(run_dir, DECODED, "images")
    image = map_images(collect_frames(run_dir), images)["image"]
    rows, counts = np.unique(image[image >= 0], return_counts=True)
    names = images.column("file_name").to_pylist()
    bids = images.column("build_id").to_pylist()
    pids = images.column("pid").to_pylist()
    out: dict[tuple, dict[str, Any]] = {}
    for row, n in zip(rows.tolist(), counts.tolist()):
        kernel = pids[row] == 0
        key = ("kernel",) if kernel else (names[row], bids[row])
        entry = out.setdefault(key, {"file": "[kernel]" if kernel else names[row], "build_id": None if kernel else
                                     bids[row], "kernel": kernel, "frames": 0})
        entry["frames"] += int(n)
    return sorted(out.values(), key=lambda e: (-e["frames"], e["file"] or ""))


def collect_elf_symbols(run_dir: Path, max_bytes: int = DEFAULT_MAX) -> dict[str, Any]:
    """Copy the files of the sampled images (:func:`sampled_images`) into ``RUN_DIR/symbols/elf``; what was copied
    (``copied``: name, key, build id, size, source, path in the run), what was not (``skipped``, with the reason)
    and the bytes copied. Needs the run's decoded ``images`` and stacks."""
    from pipeline.capture.bundle import SYMBOLS
    from pipeline.symbolize.elf import debug_file, image_file, path_key

    run_dir = Path(run_dir)
    root = run_dir / SYMBOLS / ELF_DIR
    copied: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    total = 0
    done: set[str] = set()
    for img in sampled_images(run_dir):
        name, bid = img["file"], img["build_id"]

        def skip(why: str, size: int | None = None) -> None:
            skipped.append({"name": name, "build_id": bid, "frames": img["frames"], "size": size, "reason": why})

        if img["kernel"]:
            skip("the kernel: symbolize names its frames [kernel]")
            continue
        if not name or not name.startswith("/"):
            skip("not a file (a pseudo mapping such as [vdso] or //anon)")
            continue
        found, why = image_file(name)
        if found is None:
            skip(why)
            continue
        source = Path(name)
        own, why = _own_build_id(source)
        if why:
            skip(why)
            continue
        if bid and own != bid.lower():
            skip(f"replaced since the recording: the file has build id {own or '(none)'}")
            continue
        key = f"elf-{bid.lower()}" if bid else path_key(name)
        if key in done:
            continue
        files = [(source, source.name)]
        detached = debug_file(bid) if bid else None
        if detached is not None:
            files.append((detached, f"{source.name}.debug"))
        size = sum(f.stat().st_size for f, _ in files)
        if total + size > max_bytes:
            skip(f"over --symbols-max ({max_bytes:,} bytes; {total:,} copied before it)", size)
            continue
        dest_dir = root / key
        dest_dir.mkdir(parents=True, exist_ok=True)
        for src, dest_name in files:
            dest = dest_dir / dest_name
            tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
            try:
                shutil.copyfile(src, tmp)
                portable.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            copied.append({"name": dest_name, "debug_id": key, "build_id": bid, "frames": img["frames"],
                           "size": dest.stat().st_size, "source": str(src),
                           "path": dest.relative_to(run_dir).as_posix()})
        total += size
        done.add(key)
    return {"copied": copied, "skipped": skipped, "bytes": total, "max_bytes": int(max_bytes)}
