"""The simulated machine and build: images with functions, call-stack templates, the process tree
of a stage-2 rustc bootstrap scheduled onto CPUs, and the heap and VirtualAlloc activity of every
rustc. Everything here is a plain description (numbers, names, numpy arrays) drawn from one seeded
generator; ``writer.py`` turns it into ETL bytes and ``truth.py`` into the expected answers.

Time is in raw QPC ticks (10 MHz). Tick classes keep stack association unambiguous: samples sit
on ticks = 0 (mod 4), heap and VirtualAlloc events on 2 (mod 4), a stack record one tick after its
event, and every generation window ends on a multiple of 4 (see ``writer.py``).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

import numpy as np

from pipeline.synth import layout as L

SAMPLE_PERIOD = L.PERF_FREQ // 1000        # 1 kHz per CPU
MARGIN = 200                               # ticks between a process edge and its first/last sample


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


SYSTEM32 = "\\Device\\HarddiskVolume3\\Windows\\System32\\"
SRC = "\\Device\\HarddiskVolume3\\src\\rust\\"
HOST = "x86_64-pc-windows-msvc"


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


# ------------------------------------------------------------------------------------------------
# Stack templates
# ------------------------------------------------------------------------------------------------
@dataclass
class Stacks:
    """Call-stack templates: frames leaf-first (addresses) and the function of each frame."""

    frames: list[np.ndarray] = field(default_factory=list)
    funcs: list[np.ndarray] = field(default_factory=list)
    kernel_only: list[bool] = field(default_factory=list)

    # a template whose leaf side runs in the kernel is logged as two StackWalk records (or two keys):
    # its kernel part and its user part, with the same event timestamp (etl-format §3.6)
    halves: dict[int, tuple[int, int]] = field(default_factory=dict)

    def add(self, cat: Catalog, rng, root_first: list[int], *, kernel_only=False, kernel_frames=0) -> int:
        f = cat.funcs
        addrs = []
        for k, fid in enumerate(root_first):
            leaf = k == len(root_first) - 1
            lo = 0 if leaf else 5                     # a return address lies after the call instruction
            addrs.append(f.start[fid] + int(rng.integers(lo, f.size[fid] - 1)))
        t = self._append(np.array(addrs[::-1], dtype=np.uint64), np.array(root_first[::-1], dtype=np.int64),
                         kernel_only)
        if kernel_frames:
            k = self._append(self.frames[t][:kernel_frames], self.funcs[t][:kernel_frames], True)
            u = self._append(self.frames[t][kernel_frames:], self.funcs[t][kernel_frames:], False)
            self.halves[t] = (k, u)
        return t

    def _append(self, frames, funcs, kernel_only) -> int:
        self.frames.append(frames)
        self.funcs.append(funcs)
        self.kernel_only.append(kernel_only)
        return len(self.frames) - 1

    def flat(self):
        """(frames_flat uint64, start int64, count int64) for the writer's kernels."""
        counts = np.array([len(x) for x in self.frames], dtype=np.int64)
        start = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=start[1:])
        return np.concatenate(self.frames), start, counts


def _walk(rng, layers: list[list[int]], recursive: set[int], min_depth: int) -> list[int]:
    """Random descent through layered call graphs: each step goes one or two layers deeper;
    recursive functions may repeat."""
    out: list[int] = []
    layer = 0
    while layer < len(layers):
        fid = layers[layer][int(rng.integers(len(layers[layer])))]
        out.append(fid)
        reps = int(rng.integers(2, 12)) if fid in recursive else 0
        for _ in range(reps):
            out.append(fid)
            helper = layers[layer][int(rng.integers(len(layers[layer])))]
            if helper != fid:
                out.append(helper)
        if len(out) >= min_depth and rng.random() < 0.15:
            break
        layer += 1 if rng.random() < 0.7 else 2
    return out


@dataclass
class Pools:
    """Template ids per use, with Zipf-like weights."""

    ids: dict[str, np.ndarray] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, name: str, ids: list[int], rng) -> None:
        ids_arr = np.array(ids, dtype=np.int64)
        w = 1.0 / np.arange(1, len(ids_arr) + 1) ** 0.9
        w = w[rng.permutation(len(w))]
        self.ids[name] = ids_arr
        self.weights[name] = w / w.sum()

    def draw(self, name: str, rng, n: int) -> np.ndarray:
        return self.ids[name][rng.choice(len(self.ids[name]), size=n, p=self.weights[name])]

    def favor(self, templates: set[int], factor: float) -> None:
        """Draw the ``templates`` ``factor`` times as often, in every pool that holds them (an injected change)."""
        for name, ids in self.ids.items():
            hit = np.isin(ids, list(templates))
            if hit.any() and not hit.all():
                w = np.where(hit, self.weights[name] * factor, self.weights[name])
                self.weights[name] = w / w.sum()


def templates_through(w: "Workload", name: str) -> set[int]:
    """Stack templates with a frame in a function named ``name`` (its plain, demangled name) in any image; a
    ConfigError when there is none, so that an injected change cannot miss silently."""
    from pipeline.errors import ConfigError

    fids = {fid for (_, plain), fid in w.catalog.by_name.items() if plain == name}
    out = {t for t, funcs in enumerate(w.stacks.funcs) if fids and np.isin(funcs, list(fids)).any()}
    if not out:
        raise ConfigError(f"synth.inject: no call stack goes through a function named {name!r}")
    return out


def build_stacks(rng, cat: Catalog, ids: dict[str, int], scale: int) -> tuple[Stacks, Pools]:
    st, pools = Stacks(), Pools()
    nt, k32, kb, vc = ids["ntdll.dll"], ids["kernel32.dll"], ids["KernelBase.dll"], ids["vcruntime140.dll"]
    thread_root = [cat.fid(nt, "RtlUserThreadStart"), cat.fid(k32, "BaseThreadInitThunk")]
    kr = ids["ntoskrnl.exe"]
    idle = []
    for chain in (["KiIdleLoop", "PoIdle", "PpmIdleExecuteTransition", "HalProcessorIdle"],
                  ["KiIdleLoop", "PoIdle", "PpmIdleExecuteTransition"], ["KiIdleLoop", "PoIdle"],
                  ["KiIdleLoop", "KeZeroPages"]):
        idle.append(st.add(cat, rng, [cat.fid(kr, c) for c in chain], kernel_only=True))
    pools.add("idle", idle, rng)
    heap_tail = [cat.fid(nt, n) for n in ("RtlAllocateHeap", "RtlpAllocateHeapInternal", "RtlpLogHeapAllocateEvent")]
    va_tail = [cat.fid(kb, "VirtualAlloc"), cat.fid(nt, "NtAllocateVirtualMemory")] + \
        [cat.fid(kr, n) for n in ("KiSystemServiceCopyEnd", "NtAllocateVirtualMemory", "MiAllocateVirtualMemory",
                                  "MiReserveUserMemory")]
    for stage in ("stage0", "stage1"):
        exe, drv, std = ids[f"rustc.exe/{stage}"], ids[f"rustc_driver/{stage}"], ids[f"std/{stage}"]
        main_root = thread_root + [cat.fid(exe, n) for n in RUSTC_EXE] + \
            [cat.fid(std, "std::rt::lang_start_internal")] + [cat.fid(drv, n) for n in RUSTC_PREFIX]
        worker_root = thread_root + [cat.fid(std, n) for n in (
            "std::sys::pal::windows::thread::Thread::new::thread_start",
            "std::sys::backtrace::__rust_begin_short_backtrace")] + [cat.fid(drv, n) for n in CODEGEN_PREFIX]
        layers = [[cat.fid(drv, n) for n in layer] for layer in RUSTC_LAYERS]
        leaves = layers[-1] + [cat.fid(vc, "memcpy"), cat.fid(vc, "memcmp"), cat.fid(nt, "RtlpFindEntry"),
                               cat.fid(std, "core::slice::sort::stable::drift::sort")]
        rec = {cat.fid(drv, n) for n in RUSTC_RECURSIVE}
        llvm = [[cat.fid(drv, n) for n in layer] for layer in LLVM_LAYERS]
        main = [st.add(cat, rng, main_root + _walk(rng, layers[:-1] + [leaves], rec, 4)) for _ in range(40 * scale)]
        # page faults on fresh memory: samples taken in the kernel, logged as kernel part + user part
        fault = [cat.fid(kr, n) for n in ("KiPageFault", "MmAccessFault", "MiResolveDemandZeroFault", "KeZeroPages")]
        main += [st.add(cat, rng, main_root + _walk(rng, layers[:-1] + [leaves], rec, 4) + fault, kernel_frames=4)
                 for _ in range(3 * scale)]
        worker = [st.add(cat, rng, worker_root + _walk(rng, llvm, set(), 2)) for _ in range(15 * scale)]
        pools.add(f"rustc_main/{stage}", main, rng)
        pools.add(f"rustc_codegen/{stage}", worker, rng)
        alloc = [cat.fid(std, n) for n in ("alloc::raw_vec::RawVecInner::reserve_and_handle",
                                           "alloc::raw_vec::RawVecInner::finish_grow",
                                           "std::alloc::__default_lib_allocator::__rdl_alloc",
                                           "std::sys::alloc::windows::process_heap_alloc")]
        heap = [st.add(cat, rng, main_root + _walk(rng, layers[:-1], rec, 3) + alloc + heap_tail)
                for _ in range(12 * scale)]
        pools.add(f"rustc_heap/{stage}", heap, rng)
        # VirtualAlloc: the LLVM codegen path commits most, the arena and heap growth the rest
        va_codegen = [st.add(cat, rng, worker_root + _walk(rng, llvm[:-1], set(), 2) +
                             [cat.fid(drv, "llvm::MallocAllocator::Allocate")] + va_tail, kernel_frames=4)
                      for _ in range(6)]
        va_other = [st.add(cat, rng, main_root + _walk(rng, layers[:-1], rec, 3) +
                           [cat.fid(drv, "rustc_arena::DroplessArena::grow")] + alloc + va_tail, kernel_frames=4)
                    for _ in range(10)]
        pools.add(f"va_codegen/{stage}", va_codegen, rng)
        pools.add(f"va_other/{stage}", va_other, rng)
    ln = ids["link.exe"]
    link_root = thread_root + [cat.fid(ln, n) for n in ("wmainCRTStartup", "wmain", "LinkerMain")]
    link_layers = [[cat.fid(ln, n) for n in ("IMAGE::BuildImage", "IncrBuildImage")],
                   [cat.fid(ln, n) for n in ("IMAGE::Pass1", "IMAGE::Pass2", "IMAGE::ResolveSymbols")],
                   [cat.fid(ln, n) for n in ("IMAGE::EmitRelocations", "CON::ReadObject", "SYMTAB::Lookup",
                                             "PDB::AddModule")],
                   [cat.fid(ln, "HashSymbol"), cat.fid(vc, "memcpy"), cat.fid(kb, "ReadFile")]]
    pools.add("link", [st.add(cat, rng, link_root + _walk(rng, link_layers, set(), 2)) for _ in range(30)], rng)
    cg = ids["cargo.exe"]
    cargo_root = thread_root + [cat.fid(cg, n) for n in ("cargo::main", "cargo::cli::main",
                                                          "cargo::ops::cargo_compile::compile_ws")]
    cargo_layers = [[cat.fid(cg, n) for n in ("cargo::core::compiler::job_queue::JobQueue::execute",
                                              "cargo::core::resolver::resolve", "cargo::util::toml::read_manifest")],
                    [cat.fid(cg, n) for n in ("cargo::core::compiler::job_queue::DrainState::drain_the_queue",
                                              "cargo::core::resolver::activate_deps_loop",
                                              "toml_edit::parser::parse_document")],
                    [cat.fid(cg, n) for n in ("cargo_util::process_builder::ProcessBuilder::exec_with_streaming",
                                              "jobserver::imp::Client::acquire", "serde_json::de::from_str",
                                              "std::process::Command::spawn")],
                    [cat.fid(cg, "std::sys::pal::windows::process::Command::spawn"),
                     cat.fid(kb, "CreateProcessInternalW"), cat.fid(kb, "WaitForSingleObjectEx")]]
    pools.add("cargo", [st.add(cat, rng, cargo_root + _walk(rng, cargo_layers, set(), 2)) for _ in range(20)], rng)
    py = ids["python.exe"]
    py_funcs = [cat.fid(py, n) for n in PYTHON]
    py_stacks = []
    for _ in range(12):
        depth = int(rng.integers(3, 7))
        chain = py_funcs[:3] + [py_funcs[3]] * depth + [py_funcs[int(rng.integers(4, len(py_funcs)))]]
        py_stacks.append(st.add(cat, rng, thread_root + chain))
    pools.add("python", py_stacks, rng)
    return st, pools


def build_script_stacks(rng, cat: Catalog, st: Stacks, pools: Pools, ids: dict[str, int], img: int, name: str):
    nt, k32, kb = ids["ntdll.dll"], ids["kernel32.dll"], ids["KernelBase.dll"]
    root = [cat.fid(nt, "RtlUserThreadStart"), cat.fid(k32, "BaseThreadInitThunk"),
            cat.fid(img, "build_script_build::main")]
    layers = [[cat.fid(img, n) for n in ("cc::Build::compile", "std::env::var_os")],
              [cat.fid(img, n) for n in ("cc::Build::try_compile", "cc::Build::get_compiler")],
              [cat.fid(img, n) for n in ("cc::Build::run", "std::process::Command::output")],
              [cat.fid(img, "std::sys::pal::windows::process::Command::spawn"), cat.fid(kb, "CreateProcessInternalW")]]
    pools.add(name, [st.add(cat, rng, root + _walk(rng, layers, set(), 1)) for _ in range(8)], rng)


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------
STD_CRATES = [("core", 6, "lib"), ("compiler_builtins", 3, "lib+build"), ("alloc", 3, "lib"), ("libc", 2, "lib+build"),
              ("cfg_if", 1, "lib"), ("hashbrown", 2, "lib"), ("std", 6, "dylib+build"), ("panic_unwind", 1, "lib"),
              ("panic_abort", 1, "lib"), ("unwind", 1, "lib+build"), ("rustc_demangle", 1, "lib"),
              ("getopts", 1, "lib"), ("proc_macro", 2, "lib"), ("test", 2, "lib"), ("addr2line", 1, "lib")]
RUSTC_CRATES = [("proc_macro2", 1, "lib+build"), ("quote", 1, "lib"), ("syn", 4, "lib"), ("serde", 2, "lib+build"),
                ("serde_derive", 2, "proc-macro"), ("smallvec", 1, "lib"), ("indexmap", 1, "lib"),
                ("tracing", 1, "lib"), ("rustc_span", 3, "lib"), ("rustc_data_structures", 3, "lib"),
                ("rustc_ast", 3, "lib"), ("rustc_parse", 3, "lib"), ("rustc_hir", 3, "lib"),
                ("rustc_macros", 2, "proc-macro"), ("rustc_middle", 10, "lib"), ("rustc_llvm", 2, "lib+build"),
                ("rustc_infer", 3, "lib"), ("rustc_trait_selection", 5, "lib"), ("rustc_hir_typeck", 4, "lib"),
                ("rustc_borrowck", 4, "lib"), ("rustc_mir_transform", 4, "lib"), ("rustc_codegen_ssa", 3, "lib"),
                ("rustc_codegen_llvm", 5, "lib"), ("rustc_resolve", 3, "lib"), ("rustc_metadata", 3, "lib"),
                ("rustc_interface", 2, "lib"), ("rustc_driver_impl", 2, "lib"), ("rustc_driver", 2, "dylib"),
                ("rustc_main", 1, "bin")]
PHASES = [("stage0-std", "stage0", STD_CRATES), ("stage0-rustc", "stage0", RUSTC_CRATES),
          ("stage1-std", "stage1", STD_CRATES), ("stage1-rustc", "stage1", RUSTC_CRATES)]


@dataclass
class Proc:
    pid: int
    ppid: int
    name: str
    cmdline: str
    start: int                      # raw ticks
    end: int
    tids: list[int]
    images: list[int]               # image indices loaded at start
    kind: str                       # python | cargo | rustc | link | build
    cpu: int                        # CPU its events are logged on
    stage: str = "stage0"
    rundown: bool = False           # running before the trace started (DCStart) / after it stopped (DCEnd)
    crate: str | None = None
    #: The crates of the same phase whose libraries this rustc reads (``--extern``): each ended before it started;
    #: the first is the one that ended last (what it waited for).
    externs: list[str] = field(default_factory=list)
    index: int = 0                  # position in Workload.procs
    work: float = 1.0               # its work relative to the original build (a re-run's noise, an injected change)


@dataclass
class Segment:
    """A lane (CPU) runs ``proc`` with thread ``tids`` and stack pool ``pool`` in [start, end)."""

    cpu: int
    start: int
    end: int
    proc: int
    pool: str


def _cmdline_rustc(crate: str, kind: str, stage: str, phase: str, h: int) -> str:
    ctype = {"lib": "lib", "lib+build": "lib", "dylib+build": "dylib", "dylib": "dylib", "bin": "bin",
             "proc-macro": "proc-macro"}[kind]
    out = f"build\\{HOST}\\{phase}\\release\\deps"
    src = f"library\\{crate}\\src\\lib.rs" if "std" in phase else f"compiler\\{crate}\\src\\lib.rs"
    return (f"C:\\src\\rust\\build\\{HOST}\\{stage}\\bin\\rustc.exe --crate-name {crate} --edition=2021 {src} "
            f"--crate-type {ctype} --emit=dep-info,metadata,link -C opt-level=3 -C embed-bitcode=no "
            f"-C metadata={h:016x} -C extra-filename=-{h:016x} --out-dir C:\\src\\rust\\{out} "
            f"--target {HOST} -L dependency=C:\\src\\rust\\{out} -Z unstable-options --cfg bootstrap")


@dataclass
class Workload:
    cpus: int
    pointer_size: int
    t0: int                                    # raw timestamp of the logfile header event
    t_end: int                                 # last event tick
    catalog: Catalog
    ids: dict[str, int]
    stacks: Stacks
    pools: Pools
    procs: list[Proc]
    segments: list[Segment]
    duration_s: float = 0.0                    # simulated duration the schedule was scaled to


#: Run-to-run noise by size, fitted to real rustc builds on a 2-core VM (``scripts/real_history.py``,
#: ``bench/HISTORY.md``): a job of ``s`` seconds varies by ``sqrt(noise^2 + (NOISE_ABSOLUTE_S / s)^2)`` (relative
#: standard deviation of one run; 0.08 and 0.023 s fit there), the whole machine by ``noise`` a night. A job's
#: seconds: its weight against the median rustc job's, which stands for ``MEDIAN_JOB_S`` of a real build.
NOISE_ABSOLUTE_S = 0.023
MEDIAN_JOB_S = 1.0


@dataclass(frozen=True)
class Rerun:
    """A re-run of the build (``SynthConfig.rerun``, ``noise``, ``inject``): each job's work is scaled by its own
    noise (larger for a smaller job, ``NOISE_ABSOLUTE_S``), the machine's, and the injected factors of its crate;
    the trace's size target only sets the time scale of the original build, so a slower re-run takes longer
    instead of being scaled back."""

    index: int = 0
    noise: float = 0.0
    crates: tuple[tuple[str, float], ...] = ()

    def factors(self, seed: int, jobs: list) -> np.ndarray:
        out = np.ones(len(jobs))
        if self.index:
            rng = np.random.default_rng([seed, 101, self.index])
            weights = np.array([j[3] for j in jobs])
            median = float(np.median([j[3] for j in jobs if j[1] == "rustc"] or [1.0]))
            seconds = weights / median * MEDIAN_JOB_S
            spread = np.sqrt(self.noise ** 2 + (NOISE_ABSOLUTE_S / seconds) ** 2) if self.noise else np.zeros(len(jobs))
            out *= np.exp(rng.normal(0.0, self.noise)) * np.exp(rng.normal(0.0, 1.0, len(jobs)) * spread)
        for crate, factor in self.crates:
            out *= np.array([factor if j[1] == "rustc" and j[2] == crate else 1.0 for j in jobs])
        return out


def build_workload(seed: int, cpus: int, p: int, target_bytes: int, stack_caching: bool = False,
                   stack_variety: int | None = None, rerun: Rerun = Rerun()) -> Workload:
    """Schedule the build so that the trace comes out near ``target_bytes``: a first pass with an
    estimated duration, then a second one scaled by what the first pass's schedule would write.
    ``stack_variety`` multiplies the call-stack templates (default: 1 to 8 by size). ``rerun`` changes the work
    of the jobs after the time scale is set (the original build's)."""
    w, per_busy_s, per_idle_s = _build(seed, cpus, p, target_bytes, stack_caching, None, stack_variety)
    span_s = (w.t_end - w.t0) / L.PERF_FREQ
    busy_s = sum(s.end - s.start for s in w.segments) / L.PERF_FREQ
    estimate = busy_s * per_busy_s + max(0.0, cpus * span_s - busy_s) * per_idle_s
    # bytes that do not scale with time: process/thread/image records with their ImageID/DbgID, heap
    # snapshots, and the part-filled last buffer of every CPU in each of the (at least 3) windows
    fixed = sum(600 * len(q.images) + 250 * len(q.tids) + 1200 for q in w.procs) + \
        sum(12_000 for q in w.procs if q.kind == "rustc") + 3 * cpus * 32_768
    scaled = max(target_bytes - fixed, target_bytes / 4)
    return _build(seed, cpus, p, target_bytes, stack_caching, w.duration_s * scaled / max(estimate, 1.0),
                  stack_variety, rerun)[0]


def _build(seed: int, cpus: int, p: int, target_bytes: int, stack_caching: bool, duration: float | None,
           stack_variety: int | None = None, rerun: Rerun = Rerun()):
    rng = np.random.default_rng(seed)
    scale = stack_variety or int(np.clip(target_bytes // (64 << 20), 1, 8))
    cat, ids = build_catalog(rng, p)
    st, pools = build_stacks(rng, cat, ids, scale)
    # build scripts: one executable per crate that has one
    build_imgs = {}
    for phase, stage, crates in PHASES:
        for crate, _, kind in crates:
            if "build" in kind and crate not in build_imgs:
                h = seeded_hash("build", crate)
                path = SRC + f"build\\{HOST}\\{phase}\\release\\build\\{crate}-{h & 0xFFFFFFFFFFFF:012x}\\build-script-build.exe"
                img = cat.add_image(rng, "build-script-build.exe", path, 0x7FF7_2000_0000 if p == 8 else 0x0050_0000,
                                    BUILD_SCRIPT, rust_style="legacy", pdb=f"build_script_build-{h & 0xFFFFFFFF:08x}.pdb")
                build_script_stacks(rng, cat, st, pools, ids, img, f"build/{crate}")
                build_imgs[crate] = img
    # bytes per CPU-second: one sample (profile + stack) per ms plus heap and VirtualAlloc events
    mean_frames = int(np.mean([len(f) for f in st.frames]))
    # (with stack caching an event carries a 24-byte key reference; definitions are few)
    per_stack = L.aligned(16 + 16 + p) if stack_caching else L.aligned(16 + 16 + p * mean_frames)
    per_sample = 32 + per_stack
    per_cpu_second = 1000 * per_sample + (HEAP_RATE + VA_RATE) * (40 + per_stack + 6 * p * (not stack_caching))
    t0 = 40_000_000 + int(rng.integers(0, 1_000_000)) * 4
    start = t0 + 20_000
    # nominal schedule (arbitrary units), then scaled to the duration
    sys_images = [ids[n] for n in ("ntdll.dll", "kernel32.dll", "KernelBase.dll", "ucrtbase.dll", "vcruntime140.dll")]
    pid_pool = iter(rng.permutation(np.arange(1000, 40000, 4)).tolist())
    tid_next = [60000]
    exited_tids: list[tuple[int, int]] = []     # (tid, exit time) of finished processes' threads

    def tids(n, at=0):
        """Thread ids for a process starting at ``at``; like process ids, ids of threads that exited
        earlier come back now and then (the decoder must map a thread to its process by time)."""
        out = []
        for _ in range(n):
            i = next((k for k, (_, when) in enumerate(exited_tids) if when + 100_000 < at), None)
            if i is not None and rng.random() < 0.15:
                out.append(exited_tids.pop(i)[0])
            else:
                out.append(tid_next[0])
                tid_next[0] += 4 * int(rng.integers(1, 6))
        return out

    def exits(q):
        exited_tids.extend((tid, q.end) for tid in q.tids)

    jobs = []           # (phase_index, kind, crate, weight)
    for k, (phase, stage, crates) in enumerate(PHASES):
        for crate, weight, kind in crates:
            if "build" in kind:
                jobs.append((k, "build", crate, 0.3 * float(rng.uniform(0.5, 1.5)), kind, 1.0))
            jobs.append((k, "rustc", crate, weight * float(rng.uniform(0.6, 1.4)), kind, 1.0))
    # makespan of the list schedule in weight units; with more CPUs than the build can use, lanes idle
    nominal = 0.0
    for k in range(len(PHASES)):
        lanes = np.zeros(cpus)
        for job in (j for j in jobs if j[0] == k):
            lanes[int(np.argmin(lanes))] += job[3]
        nominal += float(lanes.max())
    busy = sum(j[3] for j in jobs) / nominal            # mean busy CPUs
    idle_sample = 32 + (L.aligned(16 + 16 + p) if stack_caching else L.aligned(16 + 16 + 4 * p))
    rate = busy * per_cpu_second + max(0.0, cpus - busy) * 1000 * idle_sample
    duration_s = max(0.5, target_bytes / (rate * 1.1)) if duration is None else max(0.5, duration)
    unit = (duration_s * L.PERF_FREQ) / (nominal * 1.25)
    if rerun != Rerun():
        jobs = [(*j[:3], j[3] * f, j[4], f) for j, f in zip(jobs, rerun.factors(seed, jobs))]
    procs: list[Proc] = []
    segments: list[Segment] = []
    python = Proc(pid=next(pid_pool), ppid=int(next(pid_pool)), name="python.exe",
                  cmdline="python.exe x.py build --stage 2 compiler/rustc library/std", start=t0 - 30_000_000,
                  end=0, tids=tids(2), images=[ids["python.exe"]] + sys_images, kind="python", cpu=0, rundown=True)
    procs.append(python)
    lane_free = np.full(cpus, start, dtype=np.int64)
    exited: list[tuple[int, int]] = []          # (pid, exit time) for PID reuse

    def new_pid(at: int) -> int:
        # Windows hands out freed process ids again: now and then, reuse the oldest one
        if rng.random() < 0.12:
            for i, (pid, when) in enumerate(exited):
                if when + 100_000 < at:
                    exited.pop(i)
                    return pid
        return int(next(pid_pool))

    t = start
    for k, (phase, stage, crates) in enumerate(PHASES):
        gap = max(t, int(lane_free.max()))
        t = gap + 200_000
        segments.append(Segment(0, gap + MARGIN, t - MARGIN, 0, "python"))
        manifest_dir = "library" if "std" in phase else "compiler\\rustc"
        resolve = int(0.02 * unit * 10) + 20_000
        cargo = Proc(pid=new_pid(t), ppid=python.pid, name="cargo.exe",
                     cmdline=f"C:\\src\\rust\\build\\{HOST}\\stage0\\bin\\cargo.exe build --release --target {HOST} "
                             f"-Zbinary-dep-depinfo -j {cpus} --manifest-path "
                             f"C:\\src\\rust\\{manifest_dir}\\Cargo.toml",
                     start=t, end=0, tids=tids(3, t), images=[ids["cargo.exe"]] + sys_images, kind="cargo", cpu=0,
                     stage=stage)
        procs.append(cargo)
        segments.append(Segment(0, t + MARGIN, t + resolve - MARGIN, len(procs) - 1, "cargo"))
        lane_free[:] = t + resolve
        for ph, kind, crate, weight, ckind, work in [j for j in jobs if j[0] == k]:
            c = int(np.argmin(lane_free))
            s = int(lane_free[c]) + 4 * int(rng.integers(200, 4000))
            dur = max(4 * MARGIN + 8 * SAMPLE_PERIOD, int(weight * unit))
            h = seeded_hash(phase, crate)
            if kind == "build":
                img = build_imgs[crate]
                pr = Proc(pid=new_pid(s), ppid=cargo.pid, name="build-script-build.exe",
                          cmdline=cat.images[img].path.replace("\\Device\\HarddiskVolume3\\", "C:\\"),
                          start=s, end=s + dur, tids=tids(1, s), images=[img] + sys_images, kind="build", cpu=c,
                          stage=stage, crate=crate)
                procs.append(pr)
                segments.append(Segment(c, s + MARGIN, s + dur - MARGIN, len(procs) - 1, f"build/{crate}"))
            else:
                pr = Proc(pid=new_pid(s), ppid=cargo.pid, name="rustc.exe",
                          cmdline=_cmdline_rustc(crate, ckind, stage, phase, h), start=s, end=s + dur,
                          tids=tids(int(rng.integers(2, 5)), s),
                          images=[ids[f"rustc.exe/{stage}"], ids[f"rustc_driver/{stage}"], ids[f"std/{stage}"]]
                          + sys_images, kind="rustc", cpu=c, stage=stage, crate=crate, work=work)
                procs.append(pr)
                ri = len(procs) - 1
                link = ckind in ("dylib", "dylib+build", "bin")
                compute_end = s + int(dur * (0.8 if link else 1.0))
                split = s + int((compute_end - s) * 0.6)
                segments.append(Segment(c, s + MARGIN, split, ri, f"rustc_main/{stage}"))
                segments.append(Segment(c, split, compute_end - MARGIN, ri, f"rustc_codegen/{stage}"))
                if link:
                    ls, le = compute_end + 4 * 50, s + dur - 4 * 100
                    lk = Proc(pid=new_pid(ls), ppid=pr.pid, name="link.exe",
                              cmdline=f"link.exe /NOLOGO /NXCOMPAT /LARGEADDRESSAWARE \"/OUT:C:\\src\\rust\\build\\"
                                      f"{HOST}\\{phase}\\release\\deps\\{crate}-{h:016x}."
                                      f"{'exe' if ckind == 'bin' else 'dll'}\" /DEBUG /OPT:REF,ICF",
                              start=ls, end=le, tids=tids(1, ls), images=[ids["link.exe"]] + sys_images, kind="link",
                              cpu=c, stage=stage, crate=crate)
                    procs.append(lk)
                    segments.append(Segment(c, ls + MARGIN, le - MARGIN, len(procs) - 1, "link"))
                    exited.append((lk.pid, le))
                    exits(lk)
            exited.append((pr.pid, pr.end))
            exits(pr)
            lane_free[c] = s + dur
        _link_phase(seed, k, phase, [q for q in procs if q.kind == "rustc" and q.ppid == cargo.pid])
        cargo.end = int(lane_free.max()) + 4 * 500
        exited.append((cargo.pid, cargo.end))
        exits(cargo)
        t = cargo.end
    t_end = t + 40_000
    python.end = t_end + 10_000_000       # still running when the trace stops (DCEnd)
    segments.append(Segment(0, t + MARGIN, t_end - MARGIN, 0, "python"))
    old = list(procs)
    procs.sort(key=lambda q: (q.start, q.pid))
    for i, q in enumerate(procs):
        q.index = i
    for seg in segments:
        seg.proc = old[seg.proc].index
    segments.sort(key=lambda s_: (s_.cpu, s_.start))
    w = Workload(cpus=cpus, pointer_size=p, t0=t0, t_end=t_end, catalog=cat, ids=ids, stacks=st,
                 pools=pools, procs=procs, segments=segments, duration_s=duration_s)
    return w, per_cpu_second, 1000 * idle_sample


def _link_phase(seed: int, k: int, phase: str, rustcs: list[Proc]) -> None:
    """A dependency graph the phase's schedule keeps: each rustc reads (``--extern``) the library of the crate of its
    phase that ended last before it started, and now and then one more that ended before it; its command line names
    them by the files they wrote (``--out-dir``, ``lib<crate><extra-filename>.rlib``). Its own generator: the
    schedule's random numbers stay as they were."""
    rng = np.random.default_rng([seed, 43, k])
    out = f"C:\\src\\rust\\build\\{HOST}\\{phase}\\release\\deps"
    for pr in sorted(rustcs, key=lambda q: q.start):
        done = sorted((q for q in rustcs if q.end <= pr.start and q.crate != pr.crate), key=lambda q: -q.end)
        if not done:
            continue
        pr.externs = [done[0].crate]
        if len(done) > 1 and rng.random() < 0.5:
            pr.externs.append(done[1 + int(rng.integers(0, len(done) - 1))].crate)
        pr.cmdline += "".join(f" --extern {c}={out}\\lib{c}-{seeded_hash(phase, c):016x}.rlib" for c in pr.externs)


HEAP_RATE = 300          # heap operations per second of rustc CPU time
VA_RATE = 40             # VirtualAlloc calls per second of rustc CPU time
