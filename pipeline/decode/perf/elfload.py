"""ELF files of a perf run's images, as both the unwinder (``cfi.py``, ``unwind.py``) and symbolize
(``pipeline/symbolize/elf.py``) read them:

- which file an image is read from: the run's own copy (``capture --perf --symbols``: :func:`bundled_copy`, under
  the image's key, :func:`path_key` for a file without a build id), else the path its MMAP record names;
- whether that file may be opened at all (:func:`image_file`): a perf.data names any path, and a made-up one may name
  ``/proc/self/environ``, ``/dev/zero`` (which never ends), a FIFO (whose open waits for a writer) or a file of
  gigabytes that is no ELF image;
- the PT_LOAD segments, which turn an address of the file's load image into a file offset (the frames of a perf run
  are file offsets of their mappings);
- the ``[vdso]`` as a file.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from pathlib import Path

PT_LOAD = 1
#: The kernel's virtual shared object that perf names by its build id (``clock_gettime`` and friends run there).
VDSO = "[vdso]"
#: Where no image file is: the kernel's pseudo file systems, whose files are made as they are read (or wait).
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
ELF_MAGIC = b"\x7fELF"
#: Where a run keeps the ELF files that ``capture --perf --symbols`` copied, under its ``symbols/``: one directory per
#: identity key, holding the mapped file under its own name and its detached debug file as ``<name>.debug``
#: (:mod:`pipeline.capture.elfsymbols`).
BUNDLED_DIR = "elf"
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def image_file(name: str | Path) -> tuple[Path | None, str | None]:
    """The file at ``name`` (a path an MMAP record names, or the run's copy of one), its links resolved, when it can
    be an ELF image: a regular file outside ``PSEUDO_ROOTS``, not empty, that starts with the ELF magic; else None
    and why. Of the file only those 4 bytes are read, and nothing else is opened: a device or FIFO is told by its
    ``stat``, and the open does not wait (a FIFO swapped in meanwhile is refused by the ``fstat`` of what was
    opened)."""
    from pipeline import portable

    shown = str(name)
    if shown.startswith(("//", "\\\\")):
        # (on Windows a UNC name: even its stat would reach that server, with the user's credentials)
        return None, f"{shown}: a network path, not read"
    try:
        path = Path(name).resolve(strict=True)
        if str(path) != shown:
            shown = f"{name} ({path})"
        under = next((r for r in PSEUDO_ROOTS if path.is_relative_to(r)), None)
        if under is not None:
            return None, f"{shown}: under {under}, where no image file is (not read)"

        def refused(st: os.stat_result) -> str | None:
            kind = next((k for test, k in _KINDS if test(st.st_mode)), None)
            if kind is not None or not stat.S_ISREG(st.st_mode):
                return f"{shown}: {kind or 'no regular file'}, no image file (not read)"
            return f"{shown}: an empty file" if st.st_size == 0 else None

        why = refused(path.stat())
        if why:
            return None, why
        fd = os.open(path, portable.READ_NOWAIT)
        with open(fd, "rb") as f:
            why = refused(os.fstat(fd))
            head = b"" if why else f.read(len(ELF_MAGIC))
    except FileNotFoundError:
        return None, (f"{name}: not on this machine (where it was recorded it is; `capture --perf --symbols` "
                      "carries it with the run)")
    except (OSError, RuntimeError) as exc:      # (RuntimeError: a loop of links, before Python 3.13)
        return None, f"{shown}: {getattr(exc, 'strerror', None) or exc}"
    if why:
        return None, why
    if head != ELF_MAGIC:
        return None, f"{shown}: not an ELF file (it starts with {head!r})"
    return path, None


def path_key(name: str) -> str:
    """The key of a file without a build id: its path, and its size and time now when it is here (a file replaced
    since the last run gets a key of its own)."""
    key = f"elf-path-{hashlib.sha1(name.encode('utf-8')).hexdigest()[:20]}"
    try:
        st = Path(name).stat()
    except OSError:
        return key
    return f"{key}-{st.st_size:x}-{st.st_mtime_ns:x}"


def bundled_copy(symbols_dir: Path, elf_path: str, build_id: str | None) -> Path | None:
    """The run's own copy of the file ``elf_path`` (``symbols_dir/elf/<key>/<its name>``), searched before the
    recorded path: by build id, or for a file without one by its recorded path (the directory named for the path,
    its size and its time when it was copied, which is the copy's key: the directory's name), else by its file name
    when one copy alone has that name. None when the run has no copy of it."""
    root = Path(symbols_dir) / BUNDLED_DIR
    name = Path(elf_path).name
    if not elf_path.startswith("/") or not name or not root.is_dir():
        return None
    if build_id:
        where = root / f"elf-{build_id.lower()}"
    else:
        prefix = path_key(elf_path).split("-")[:3]      # ("elf", "path", hash of the path)
        dirs = sorted(d for d in root.glob("-".join(prefix) + "-*") if (d / name).is_file())
        if not dirs:        # (the same file recorded under another directory: taken when its name is unique)
            dirs = [d for d in root.glob("elf-path-*") if (d / name).is_file()]
            if len(dirs) != 1:
                return None
        where = dirs[-1]
    return where / name if (where / name).is_file() else None


def load_segments(path: Path) -> list[tuple[int, int, int]]:
    """(p_offset, p_vaddr, p_filesz) of each PT_LOAD of a 64-bit little-endian ELF file, in file order."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF":
            raise ValueError(f"{path} is not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: only 64-bit little-endian ELF files are read")
        phoff, = struct.unpack_from("<Q", ident, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
        if phentsize < 56 or phnum > 4096:
            raise ValueError(f"{path}: program headers of {phentsize} bytes x {phnum} cannot be")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    out = []
    for k in range(len(table) // phentsize):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", table, k * phentsize)
        if p_type == PT_LOAD:
            if p_vaddr + p_filesz >= 1 << 64 or p_offset + p_filesz >= 1 << 64:
                raise ValueError(f"{path}: program header {k} (byte offset {phoff + k * phentsize}): a PT_LOAD of "
                                 f"{p_filesz} bytes at {p_vaddr:#x} (file offset {p_offset}) cannot be")
            out.append((p_offset, p_vaddr, p_filesz))
    return out


def vdso_file(build_id: str, cache: Path) -> tuple[Path | None, str | None]:
    """The ``[vdso]`` whose build id perf recorded, as a file: perf's own copy (its build-id cache,
    ``~/.debug/[vdso]/<build id>/vdso``), else this process's vdso when the kernel is the one recorded (same build
    id), written into ``cache``; or why there is none."""
    import sys

    saved = Path.home() / ".debug" / VDSO / build_id / "vdso"
    if saved.is_file():
        return saved, None
    if not sys.platform.startswith("linux"):
        return None, f"{VDSO} {build_id}: not in perf's build-id cache ({saved}) and this is no Linux machine"
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            line = next((ln for ln in f if ln.rstrip().endswith(VDSO)), None)
    except OSError as exc:
        return None, f"{VDSO}: /proc/self/maps: {exc}"
    if line is None:
        return None, f"{VDSO}: this process has none"
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    image = ctypes.string_at(lo, hi - lo)       # (the kernel's vdso image is one readable mapping)
    own = _build_id(image)
    if own != build_id.lower():
        return None, (f"{VDSO} {build_id}: not in perf's build-id cache ({saved}), and this kernel's is another "
                      f"({own or 'without a build id'}): recorded on another kernel")
    out = cache / f"vdso-{build_id}.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

    # (a name of its own for the copy being written, then swapped in: two decodes at once write the same bytes)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with open(fd, "wb") as f:
        f.write(image)
    Path(tmp).replace(out)
    return out, None


def _build_id(image: bytes) -> str | None:
    """The GNU build id of an ELF image in memory, as hex (None when it has none or cannot be read)."""
    try:
        import symbolic

        obj = next(iter(symbolic.Archive.from_bytes(image).iter_objects()), None)
        return str(obj.code_id).lower() if obj is not None and obj.code_id else None
    except Exception:  # noqa: BLE001 - any reading error means: no build id to trust
        return None
