"""The names of the simulated machine and build: its images and their functions (with Rust mangling), the
crates of each bootstrap phase, and the command lines of its processes. Plain tables and one seeded
generator; ``stacks.py`` builds call-stack templates from these functions and ``workload.py`` schedules the
crates into processes.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple

SYSTEM32 = "\\Device\\HarddiskVolume3\\Windows\\System32\\"
SRC = "\\Device\\HarddiskVolume3\\src\\rust\\"
HOST = "x86_64-pc-windows-msvc"


# ------------------------------------------------------------------------------------------------
# Images and functions
# ------------------------------------------------------------------------------------------------
@dataclass
class Image:
    name: str
    path: str
    base: int
    size: int
    timedatestamp: int
    checksum: int
    pdb_guid: uuid.UUID
    pdb_age: int
    pdb_name: str
    kernel: bool = False
    func_ids: list[int] = field(default_factory=list)

    @property
    def debug_id(self) -> str:
        return self.pdb_guid.hex.upper() + format(self.pdb_age, "X")


@dataclass
class Functions:
    """Global function table; ids index these lists."""

    name: list[str] = field(default_factory=list)      # symbol name as in the .sym file (mangled for Rust)
    crate: list[str | None] = field(default_factory=list)
    image: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)     # absolute address
    size: list[int] = field(default_factory=list)


def _b62(n: int, width: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    for _ in range(width):
        n, r = divmod(n, 62)
        out += digits[r]
    return out


def _ident(s: str) -> str:
    return f"{len(s)}{s}"


def mangle_legacy(path: list[str], h: int) -> str:
    """Legacy Rust mangling: ``_ZN`` + length-prefixed components + ``17h<hash>E``."""
    return "_ZN" + "".join(_ident(c) for c in path) + f"17h{h & 0xFFFFFFFFFFFFFFFF:016x}E"


def _v0_ident(s: str) -> str:
    """A v0 identifier: its length, then ``_`` when it starts with a digit or ``_`` (so the length ends), then it."""
    return f"{len(s)}_{s}" if s[:1].isdigit() or s[:1] == "_" else f"{len(s)}{s}"


def mangle_v0(path: list[str], h: int) -> str:
    """Rust v0 mangling: ``_R`` + nested paths (``Nt`` modules/types, ``Nv`` the function) over ``Cs<dis>_<crate>``."""
    p = f"Cs{_b62(h, 10)}_" + _v0_ident(path[0])
    for comp in path[1:-1]:
        p = "Nt" + p + _v0_ident(comp)
    return "_RNv" + p + _v0_ident(path[-1])


def seeded_hash(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little")


# Function catalogs: (symbol path or plain name, is_rust). Rust paths are '::'-separated.
NTDLL = ["RtlUserThreadStart", "LdrInitializeThunk", "RtlAllocateHeap", "RtlpAllocateHeapInternal",
         "RtlpAllocateHeap", "RtlpLogHeapAllocateEvent", "RtlFreeHeap", "RtlpFreeHeapInternal",
         "RtlReAllocateHeap", "RtlpReAllocateHeapInternal", "NtAllocateVirtualMemory", "NtFreeVirtualMemory",
         "NtWaitForSingleObject", "NtReadFile", "NtWriteFile", "NtCreateUserProcess", "RtlpFindEntry"]
KERNEL32 = ["BaseThreadInitThunk", "CreateProcessW", "HeapAlloc"]
KERNELBASE = ["VirtualAlloc", "VirtualFree", "CreateProcessInternalW", "WaitForSingleObjectEx", "ReadFile",
              "WriteFile", "MapViewOfFile"]
UCRT = ["malloc", "free", "_register_onexit_function", "strlen"]
VCRT = ["memcpy", "memset", "memcmp", "memmove"]
NTOSKRNL = ["KiIdleLoop", "PoIdle", "PpmIdleExecuteTransition", "HalProcessorIdle", "KiSystemServiceCopyEnd",
            "NtAllocateVirtualMemory", "MiAllocateVirtualMemory", "MiReserveUserMemory", "KiPageFault",
            "MmAccessFault", "MiResolveDemandZeroFault", "KeZeroPages"]
RUSTC_EXE = ["mainCRTStartup", "__scrt_common_main_seh", "main", "rustc_main::main"]
LINK_EXE = ["wmainCRTStartup", "wmain", "LinkerMain", "IMAGE::BuildImage", "IMAGE::Pass1", "IMAGE::Pass2",
            "IMAGE::ResolveSymbols", "IMAGE::EmitRelocations", "CON::ReadObject", "SYMTAB::Lookup",
            "PDB::AddModule", "IncrBuildImage", "HashSymbol"]
PYTHON = ["wmain", "Py_Main", "pymain_run_python", "_PyEval_EvalFrameDefault", "PyObject_Vectorcall",
          "subprocess_fork_exec", "_winapi_CreateProcess", "_winapi_WaitForSingleObject", "PyDict_GetItem"]
CARGO = ["cargo::main", "cargo::cli::main", "cargo::ops::cargo_compile::compile_ws",
         "cargo::core::compiler::job_queue::JobQueue::execute", "cargo::core::compiler::job_queue::DrainState::drain_the_queue",
         "cargo::core::resolver::resolve", "cargo::core::resolver::activate_deps_loop",
         "cargo::util::toml::read_manifest", "cargo_util::process_builder::ProcessBuilder::exec_with_streaming",
         "jobserver::imp::Client::acquire", "toml_edit::parser::parse_document", "serde_json::de::from_str",
         "std::process::Command::spawn", "std::sys::pal::windows::process::Command::spawn"]
BUILD_SCRIPT = ["build_script_build::main", "cc::Build::compile", "cc::Build::try_compile", "cc::Build::run",
                "cc::Build::get_compiler", "std::process::Command::output", "std::env::var_os",
                "std::sys::pal::windows::process::Command::spawn"]
STD_DLL = ["std::rt::lang_start_internal", "std::sys::pal::windows::thread::Thread::new::thread_start",
           "std::sys::backtrace::__rust_begin_short_backtrace", "std::sys::alloc::windows::process_heap_alloc",
           "std::sys::alloc::windows::process_heap_realloc", "std::alloc::__default_lib_allocator::__rdl_alloc",
           "alloc::raw_vec::RawVecInner::finish_grow", "alloc::raw_vec::RawVecInner::reserve_and_handle",
           "core::slice::sort::stable::drift::sort", "std::io::Write::write_all", "std::fs::File::read_to_end"]
# rustc_driver-*.dll: driver and query plumbing (layer 0-2), analyses (3-4), leaves (5)
RUSTC_PREFIX = ["rustc_driver_impl::main", "rustc_driver_impl::run_compiler",
                "rustc_interface::interface::run_compiler", "rustc_span::create_session_globals_then"]
RUSTC_LAYERS = [
    ["rustc_interface::passes::analysis", "rustc_interface::passes::run_required_analyses",
     "rustc_interface::passes::parse", "rustc_interface::passes::resolver_for_lowering",
     "rustc_metadata::rmeta::encoder::encode_metadata", "rustc_interface::passes::start_codegen"],
    ["rustc_query_impl::plugin_impl::query_impl::typeck::get_query_non_incr",
     "rustc_query_impl::plugin_impl::query_impl::mir_borrowck::get_query_non_incr",
     "rustc_query_impl::plugin_impl::query_impl::optimized_mir::get_query_non_incr",
     "rustc_resolve::Resolver::resolve_crate", "rustc_parse::parser::Parser::parse_item",
     "rustc_ast_lowering::LoweringContext::lower_item", "rustc_codegen_ssa::base::codegen_crate",
     "rustc_metadata::rmeta::encoder::EncodeContext::encode_crate_root"],
    ["rustc_query_system::query::plumbing::try_execute_query", "rustc_middle::ty::context::TyCtxt::type_of",
     "rustc_middle::query::plumbing::query_get_at", "rustc_codegen_llvm::base::compile_codegen_unit",
     "rustc_monomorphize::collector::collect_crate_mono_items"],
    ["rustc_hir_typeck::typeck", "rustc_borrowck::do_mir_borrowck", "rustc_mir_transform::run_optimization_passes",
     "rustc_trait_selection::traits::select::SelectionContext::select", "rustc_infer::infer::InferCtxt::probe",
     "rustc_mir_build::builder::build_mir", "rustc_codegen_ssa::mir::codegen_mir",
     "rustc_lint::late::check_crate"],
    ["rustc_hir_typeck::fn_ctxt::FnCtxt::check_expr_with_expectation",
     "rustc_borrowck::type_check::TypeChecker::typeck_mir", "rustc_mir_transform::inline::Inliner::try_inlining",
     "rustc_mir_dataflow::framework::engine::Engine::iterate_to_fixpoint",
     "rustc_trait_selection::traits::fulfill::FulfillProcessor::process_obligation",
     "rustc_middle::ty::fold::TypeFoldable::fold_with", "rustc_codegen_llvm::builder::Builder::call",
     "rustc_parse::lexer::StringReader::next_token"],
    ["hashbrown::raw::RawTable::reserve_rehash", "hashbrown::map::HashMap::insert",
     "rustc_middle::ty::context::CtxtInterners::intern_ty", "rustc_data_structures::sharded::Sharded::lock_shard_by_hash",
     "rustc_arena::DroplessArena::grow", "smallvec::SmallVec::reserve_one_unchecked",
     "rustc_span::symbol::Interner::intern", "rustc_serialize::opaque::FileEncoder::flush"],
]
RUSTC_RECURSIVE = {"rustc_hir_typeck::fn_ctxt::FnCtxt::check_expr_with_expectation",
                   "rustc_middle::ty::fold::TypeFoldable::fold_with"}
CODEGEN_PREFIX = ["rustc_codegen_ssa::back::write::spawn_work", "rustc_codegen_llvm::back::write::codegen",
                  "LLVMRustOptimize"]
LLVM_LAYERS = [
    ["llvm::legacy::PassManagerImpl::run", "llvm::PassManager::run", "llvm::FPPassManager::runOnFunction"],
    ["llvm::SelectionDAGISel::runOnMachineFunction", "llvm::InstCombinerImpl::run", "llvm::MachineFunctionPass::runOnFunction",
     "llvm::RAGreedy::runOnMachineFunction", "llvm::AsmPrinter::emitFunctionBody", "llvm::GVNPass::run"],
    ["llvm::SelectionDAG::Combine", "llvm::ScheduleDAGRRList::Schedule", "llvm::LiveIntervals::computeVirtRegs",
     "llvm::InstCombinerImpl::visitCallInst", "llvm::MCObjectStreamer::emitInstruction"],
    ["llvm::SmallPtrSetImplBase::insert_imp_big", "llvm::DenseMapBase::grow", "llvm::StringMapImpl::LookupBucketFor",
     "llvm::MallocAllocator::Allocate"],
]


@dataclass
class Catalog:
    """Images (per stage of the compiler, plus system and tools) and the function table."""

    pointer_size: int
    images: list[Image] = field(default_factory=list)
    funcs: Functions = field(default_factory=Functions)
    by_name: dict[tuple[int, str], int] = field(default_factory=dict)   # (image, plain name) -> func id

    def add_image(self, rng, name, path, base, entries, *, rust_style=None, kernel=False, pdb=None) -> int:
        idx = len(self.images)
        img = Image(name=name, path=path, base=base, size=0, timedatestamp=0, checksum=0, pdb_guid=uuid.UUID(int=0),
                    pdb_age=1, pdb_name=pdb or name.rsplit(".", 1)[0] + ".pdb", kernel=kernel)
        rva = 0x1000
        for k, plain in enumerate(entries):
            size = int(rng.integers(0x40, 0x600)) & ~0xF
            rust = "::" in plain and not plain.startswith("llvm::") and not plain[0].isupper()
            if rust:
                comps = plain.split("::")
                hh = seeded_hash(path, plain)
                style = rust_style if rust_style else ("v0" if hh % 2 else "legacy")
                sym = mangle_v0(comps, hh) if style == "v0" else mangle_legacy(comps, hh)
                crate = comps[0]
            else:
                sym, crate = plain, None
            fid = len(self.funcs.name)
            self.funcs.name.append(sym)
            self.funcs.crate.append(crate)
            self.funcs.image.append(idx)
            self.funcs.start.append(base + rva)
            self.funcs.size.append(size)
            self.by_name[(idx, plain)] = fid
            img.func_ids.append(fid)
            rva += size + (int(rng.integers(1, 8)) << 4)
        img.size = (rva + 0xFFFF) & ~0xFFFF
        # The binary's identity (PDB GUID and age, TimeDateStamp, checksum) follows its contents, as a real
        # build's does: traces of other seeds or sizes lay the same image out differently, and a symbol cache
        # keyed by debug id must never hand one of them the other's table.
        h = seeded_hash(path, *((self.funcs.name[f], self.funcs.start[f] - base, self.funcs.size[f])
                                 for f in img.func_ids))
        img.pdb_guid = uuid.UUID(bytes=h.to_bytes(8, "little") + seeded_hash(path, h, "g").to_bytes(8, "little"))
        img.pdb_age, img.timedatestamp, img.checksum = 1 + h % 3, 0x60000000 + (h % 0x8000000), (h >> 8) & 0xFFFFFF
        self.images.append(img)
        return idx

    def fid(self, image: int, plain: str) -> int:
        return self.by_name[(image, plain)]



def build_catalog(rng, p: int) -> tuple[Catalog, dict[str, int]]:
    """All images of the simulated system; returns the catalog and a name -> image index map."""
    cat = Catalog(pointer_size=p)
    ids: dict[str, int] = {}
    if p == 8:
        sysbase, appbase, kbase = 0x7FFB_A000_0000, 0x7FF6_1000_0000, 0xFFFF_F806_2000_0000
    else:
        sysbase, appbase, kbase = 0x7700_0000, 0x0040_0000, 0x8240_0000
    step = 0x0100_0000 if p == 8 else 0x0040_0000
    for k, (name, entries) in enumerate([("ntdll.dll", NTDLL), ("kernel32.dll", KERNEL32),
                                         ("KernelBase.dll", KERNELBASE), ("ucrtbase.dll", UCRT),
                                         ("vcruntime140.dll", VCRT)]):
        ids[name] = cat.add_image(rng, name, SYSTEM32 + name, sysbase + k * step, entries)
    ids["ntoskrnl.exe"] = cat.add_image(rng, "ntoskrnl.exe", "\\SystemRoot\\system32\\ntoskrnl.exe", kbase,
                                        NTOSKRNL, kernel=True)
    ids["python.exe"] = cat.add_image(rng, "python.exe", "\\Device\\HarddiskVolume3\\Python311\\python.exe",
                                      appbase, PYTHON)
    ids["cargo.exe"] = cat.add_image(rng, "cargo.exe", SRC + f"build\\{HOST}\\stage0\\bin\\cargo.exe",
                                     appbase, CARGO, rust_style="legacy")
    ids["link.exe"] = cat.add_image(
        rng, "link.exe", "\\Device\\HarddiskVolume3\\Program Files\\Microsoft Visual Studio\\2022\\BuildTools\\VC"
        "\\Tools\\MSVC\\14.40.33807\\bin\\Hostx64\\x64\\link.exe", appbase, LINK_EXE)
    for stage in ("stage0", "stage1"):
        tag = seeded_hash(stage) & 0xFFFFFFFFFFFFFFFF
        bindir = SRC + f"build\\{HOST}\\{stage}\\bin\\"
        ids[f"rustc.exe/{stage}"] = cat.add_image(rng, "rustc.exe", bindir + "rustc.exe", appbase, RUSTC_EXE,
                                                  rust_style="legacy", pdb="rustc_main.pdb")
        drv = f"rustc_driver-{tag:016x}.dll"
        flat = RUSTC_PREFIX + [f for layer in RUSTC_LAYERS for f in layer] + CODEGEN_PREFIX + \
            [f for layer in LLVM_LAYERS for f in layer]
        # stage0 (the downloaded beta) uses legacy names, the freshly built stage1 compiler uses v0
        ids[f"rustc_driver/{stage}"] = cat.add_image(rng, drv, bindir + drv, appbase + 0x1000_0000 * (p // 4),
                                                     flat, rust_style="legacy" if stage == "stage0" else "v0",
                                                     pdb=drv.rsplit(".", 1)[0] + ".pdb")
        stdn = f"std-{seeded_hash(stage, 'std') & 0xFFFFFFFFFFFFFFFF:016x}.dll"
        ids[f"std/{stage}"] = cat.add_image(rng, stdn, bindir + stdn, appbase + 0x0800_0000 * (p // 4), STD_DLL,
                                            rust_style="legacy" if stage == "stage0" else "v0",
                                            pdb=stdn.rsplit(".", 1)[0] + ".pdb")
    return cat, ids


def build_script_image(rng, cat: Catalog, crate: str, phase: str, p: int) -> int:
    """The ``build-script-build.exe`` of ``crate``, built in ``phase``; returns its image index."""
    h = seeded_hash("build", crate)
    path = SRC + f"build\\{HOST}\\{phase}\\release\\build\\{crate}-{h & 0xFFFFFFFFFFFF:012x}\\build-script-build.exe"
    return cat.add_image(rng, "build-script-build.exe", path, 0x7FF7_2000_0000 if p == 8 else 0x0050_0000,
                         BUILD_SCRIPT, rust_style="legacy", pdb=f"build_script_build-{h & 0xFFFFFFFF:08x}.pdb")


# ------------------------------------------------------------------------------------------------
# Crates and phases of the bootstrap
# ------------------------------------------------------------------------------------------------
class Crate(NamedTuple):
    name: str
    weight: int         # its work relative to the other crates (nominal units)
    kind: str           # lib | lib+build | dylib | dylib+build | bin | proc-macro ("+build": has a build script)


class Phase(NamedTuple):
    """One ``cargo build`` of the bootstrap."""

    name: str           # stage0-std, ...: the directory under build/<host>/ it writes
    stage: str          # the compiler that builds it (stage0, stage1)
    crates: list[Crate]


STD_CRATES = [Crate(*c) for c in [
    ("core", 6, "lib"), ("compiler_builtins", 3, "lib+build"), ("alloc", 3, "lib"), ("libc", 2, "lib+build"),
    ("cfg_if", 1, "lib"), ("hashbrown", 2, "lib"), ("std", 6, "dylib+build"), ("panic_unwind", 1, "lib"),
    ("panic_abort", 1, "lib"), ("unwind", 1, "lib+build"), ("rustc_demangle", 1, "lib"),
    ("getopts", 1, "lib"), ("proc_macro", 2, "lib"), ("test", 2, "lib"), ("addr2line", 1, "lib")]]
RUSTC_CRATES = [Crate(*c) for c in [
    ("proc_macro2", 1, "lib+build"), ("quote", 1, "lib"), ("syn", 4, "lib"), ("serde", 2, "lib+build"),
    ("serde_derive", 2, "proc-macro"), ("smallvec", 1, "lib"), ("indexmap", 1, "lib"),
    ("tracing", 1, "lib"), ("rustc_span", 3, "lib"), ("rustc_data_structures", 3, "lib"),
    ("rustc_ast", 3, "lib"), ("rustc_parse", 3, "lib"), ("rustc_hir", 3, "lib"),
    ("rustc_macros", 2, "proc-macro"), ("rustc_middle", 10, "lib"), ("rustc_llvm", 2, "lib+build"),
    ("rustc_infer", 3, "lib"), ("rustc_trait_selection", 5, "lib"), ("rustc_hir_typeck", 4, "lib"),
    ("rustc_borrowck", 4, "lib"), ("rustc_mir_transform", 4, "lib"), ("rustc_codegen_ssa", 3, "lib"),
    ("rustc_codegen_llvm", 5, "lib"), ("rustc_resolve", 3, "lib"), ("rustc_metadata", 3, "lib"),
    ("rustc_interface", 2, "lib"), ("rustc_driver_impl", 2, "lib"), ("rustc_driver", 2, "dylib"),
    ("rustc_main", 1, "bin")]]
PHASES = [Phase("stage0-std", "stage0", STD_CRATES), Phase("stage0-rustc", "stage0", RUSTC_CRATES),
          Phase("stage1-std", "stage1", STD_CRATES), Phase("stage1-rustc", "stage1", RUSTC_CRATES)]
LINKED_KINDS = ("dylib", "dylib+build", "bin")      # crates whose rustc runs link.exe


# ------------------------------------------------------------------------------------------------
# Command lines
# ------------------------------------------------------------------------------------------------
PYTHON_CMDLINE = "python.exe x.py build --stage 2 compiler/rustc library/std"


def cargo_cmdline(phase: Phase, cpus: int) -> str:
    manifest_dir = "library" if "std" in phase.name else "compiler\\rustc"
    return (f"C:\\src\\rust\\build\\{HOST}\\stage0\\bin\\cargo.exe build --release --target {HOST} "
            f"-Zbinary-dep-depinfo -j {cpus} --manifest-path C:\\src\\rust\\{manifest_dir}\\Cargo.toml")


def rustc_cmdline(crate: Crate, phase: Phase, h: int) -> str:
    """Without ``--extern``: ``workload.link_phase`` adds those once the phase is scheduled."""
    ctype = {"lib": "lib", "lib+build": "lib", "dylib+build": "dylib", "dylib": "dylib", "bin": "bin",
             "proc-macro": "proc-macro"}[crate.kind]
    out = f"build\\{HOST}\\{phase.name}\\release\\deps"
    src = f"library\\{crate.name}\\src\\lib.rs" if "std" in phase.name else f"compiler\\{crate.name}\\src\\lib.rs"
    return (f"C:\\src\\rust\\build\\{HOST}\\{phase.stage}\\bin\\rustc.exe --crate-name {crate.name} --edition=2021 "
            f"{src} --crate-type {ctype} --emit=dep-info,metadata,link -C opt-level=3 -C embed-bitcode=no "
            f"-C metadata={h:016x} -C extra-filename=-{h:016x} --out-dir C:\\src\\rust\\{out} "
            f"--target {HOST} -L dependency=C:\\src\\rust\\{out} -Z unstable-options --cfg bootstrap")


def link_cmdline(crate: Crate, phase: Phase, h: int) -> str:
    return (f"link.exe /NOLOGO /NXCOMPAT /LARGEADDRESSAWARE \"/OUT:C:\\src\\rust\\build\\{HOST}\\{phase.name}\\release"
            f"\\deps\\{crate.name}-{h:016x}.{'exe' if crate.kind == 'bin' else 'dll'}\" /DEBUG /OPT:REF,ICF")


def extern_args(phase: Phase, crates: list[str]) -> str:
    """``--extern`` arguments naming each crate's library of ``phase`` (``lib<crate><extra-filename>.rlib``)."""
    out = f"C:\\src\\rust\\build\\{HOST}\\{phase.name}\\release\\deps"
    return "".join(f" --extern {c}={out}\\lib{c}-{seeded_hash(phase.name, c):016x}.rlib" for c in crates)
