"""The PT_LOAD segments of an ELF file: what turns an address of the file's load image into a file offset (the
frames of a perf run are file offsets of their mappings); and the ``[vdso]`` as a file. Read by the unwinder
(``cfi.py``, ``unwind.py``) and by symbolize (``pipeline/symbolize/elf.py``)."""

from __future__ import annotations

import struct
from pathlib import Path

PT_LOAD = 1
#: The kernel's virtual shared object that perf names by its build id (``clock_gettime`` and friends run there).
VDSO = "[vdso]"


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
