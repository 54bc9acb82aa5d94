"""Real PE+PDB test images, built here with clang (cl mode) and lld-link, and checks of their identity.

Other symbolize tests import :func:`built_images`. The sources give functions Rust-mangled names
(legacy with hash, v0), an MSVC C++ function, a plain C name that starts like a Rust one
(``_RTC_Initialize``), and always-inline helpers that become S_INLINESITE records. ``full`` images
carry private symbols (``/Z7``), ``stripped`` ones only publics, like Microsoft's public PDBs.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

RUSTNAMES_C = r"""
typedef unsigned long long u64;
static inline __attribute__((always_inline)) u64 _RNvMNtCs1234_4core3numy12wrapping_mul(u64 a, u64 b) {
  return a * b + 7;
}
static inline __attribute__((always_inline)) u64 _ZN7mycrate4hash3mix17h1122334455667788E(u64 a, u64 b) {
  u64 x = _RNvMNtCs1234_4core3numy12wrapping_mul(a, b);
  return x ^ (x >> 13);
}
__declspec(noinline) u64 _ZN4core3fmt5write17h0123456789abcdefE(const unsigned char *p, u64 n) {
  u64 h = 0;
  for (u64 i = 0; i < n; i++) h = _ZN7mycrate4hash3mix17h1122334455667788E(h, p[i]);
  return h;
}
__declspec(noinline) u64 _RNvCs1234_7mycrate4main(u64 n) {
  unsigned char buf[16];
  for (int i = 0; i < 16; i++) buf[i] = (unsigned char)(n + i);
  return _ZN4core3fmt5write17h0123456789abcdefE(buf, 16);
}
u64 legacy_drop(u64) __asm__("_ZN70_$LT$alloc..vec..Vec$LT$T$C$A$GT$$u20$as$u20$core..ops..drop..Drop$GT$4drop17h5f2a7c8e9b1d3f40E");
__declspec(noinline) u64 legacy_drop(u64 x) { return x * 3 + 1; }
u64 generic_step(u64) __asm__("_RINvNtCs9I6RxzOjugb_7mycrate6worker12generic_stepmEB4_");
__declspec(noinline) u64 generic_step(u64 x) { return x * 5 + 2; }
__declspec(noinline) u64 _RTC_Initialize(u64 x) { return x + 11; }
"""

CPPNAMES_CPP = r"""
namespace rustc_codegen_llvm { namespace back {
struct ModuleBuffer { unsigned long long a; };
__declspec(noinline) unsigned long long optimize(ModuleBuffer *m, int k) { return m->a * k + 5; }
} }
extern "C" unsigned long long call_cpp(unsigned long long x) {
  rustc_codegen_llvm::back::ModuleBuffer b{x};
  return rustc_codegen_llvm::back::optimize(&b, 3);
}
"""

ENTRY_C = r"""
typedef unsigned long long u64;
u64 _RNvCs1234_7mycrate4main(u64 n);
u64 call_cpp(u64 x);
u64 legacy_drop(u64) __asm__("_ZN70_$LT$alloc..vec..Vec$LT$T$C$A$GT$$u20$as$u20$core..ops..drop..Drop$GT$4drop17h5f2a7c8e9b1d3f40E");
u64 generic_step(u64) __asm__("_RINvNtCs9I6RxzOjugb_7mycrate6worker12generic_stepmEB4_");
u64 _RTC_Initialize(u64 x);
int mainCRTStartup(void) {
  return (int)((_RNvCs1234_7mycrate4main(3) + call_cpp(4) + legacy_drop(5) + generic_step(6)
                + _RTC_Initialize(1)) & 0x7f);
}
"""

DLL_C = r"""
typedef unsigned long long u64;
__declspec(dllexport) __declspec(noinline) u64 _ZN7rustlib5alloc6reallo17habcdefabcdef0123E(u64 x) { return x * 9 + 4; }
int _DllMainCRTStartup(void *h, unsigned r, void *p) { return 1; }
"""

CFLAGS = ["/nologo", "/c", "/O2", "/GS-", "/GR-", "/Gs9999999", "-fno-builtin", "--target=x86_64-pc-windows-msvc"]


def _tool(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"none of {names} is installed (make system-deps installs clang-16 and lld-16)")


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")


def _build(out: Path, debug: bool) -> None:
    clang = _tool("clang-cl-16", "clang-cl", "clang-16")
    link = _tool("lld-link-16", "lld-link")
    cl = [clang] + ([] if "clang-cl" in Path(clang).name else ["--driver-mode=cl"])
    flags = CFLAGS + (["/Z7"] if debug else [])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("rustnames.c", RUSTNAMES_C), ("cppnames.cpp", CPPNAMES_CPP), ("entry.c", ENTRY_C),
                       ("rustlib.c", DLL_C)):
        (out / name).write_text(text)
        _run(cl + flags + [name, f"/Fo{Path(name).stem}.obj"], out)
    _run([link, "/nologo", "/DLL", "/NODEFAULTLIB", "/ENTRY:_DllMainCRTStartup", "/DEBUG:FULL", "/PDB:rustlib.pdb",
          "/OUT:rustlib.dll", "rustlib.obj"], out)
    _run([link, "/nologo", "/NODEFAULTLIB", "/ENTRY:mainCRTStartup", "/SUBSYSTEM:CONSOLE", "/DEBUG:FULL",
          "/PDB:fakerustc.pdb", "/OUT:fakerustc.exe", "entry.obj", "rustnames.obj", "cppnames.obj"], out)


@functools.cache
def built_images() -> Path:
    """Directory with ``full/`` and ``stripped/`` builds (fakerustc.exe/.pdb, rustlib.dll/.pdb)."""
    root = Path(tempfile.mkdtemp(prefix="bootprof-symimg-"))
    atexit.register(shutil.rmtree, root, True)
    _build(root / "full", debug=True)
    _build(root / "stripped", debug=False)
    return root


def pe_identity(path: Path) -> dict:
    """Debug id, GUID, age, SizeOfImage and TimeDateStamp of a built PE, read by symbolic."""
    from symbolic import Archive

    obj = Archive.open(str(path)).get_object(arch="x86_64")
    debug_id = obj.debug_id
    guid, age = debug_id[:36], int(debug_id[37:], 16)
    stamp, size = int(obj.code_id[:8], 16), int(obj.code_id[8:], 16)
    return {"debug_id": debug_id, "guid": guid, "age": age, "size": size, "time_date_stamp": stamp,
            "pdb_name": path.with_suffix(".pdb").name}


def test_images_carry_matching_debug_ids():
    from symbolic import Archive

    root = built_images()
    for build in ("full", "stripped"):
        for name in ("fakerustc.exe", "rustlib.dll"):
            pe = pe_identity(root / build / name)
            pdb = Archive.open(str(root / build / name.replace(".exe", ".pdb").replace(".dll", ".pdb")))
            assert pdb.get_object(arch="x86_64").debug_id == pe["debug_id"]
            assert pe["debug_id"].endswith("-44205044422e-1")  # lld's "LLD PDB." GUID tail, age 1
            assert pe["size"] % 0x1000 == 0 and pe["size"] >= 0x2000
