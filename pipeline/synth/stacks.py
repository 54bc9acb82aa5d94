"""Call-stack templates of the simulated build: random descents through layered call graphs of the catalog's
functions (``catalog.py``), kept as frame addresses leaf-first, and the pools that each kind of activity
(a rustc's main thread, its codegen workers, heap and VirtualAlloc calls, link.exe, cargo, python, the idle
loop) draws them from with Zipf-like weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.synth.catalog import (CODEGEN_PREFIX, LLVM_LAYERS, PYTHON, RUSTC_EXE, RUSTC_LAYERS, RUSTC_PREFIX,
                                    RUSTC_RECURSIVE, Catalog)


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


def templates_through(cat: Catalog, st: Stacks, name: str) -> set[int]:
    """Stack templates with a frame in a function named ``name`` (its plain, demangled name) in any image; a
    ConfigError when there is none, so that an injected change cannot miss silently."""
    from pipeline.errors import ConfigError

    fids = {fid for (_, plain), fid in cat.by_name.items() if plain == name}
    out = {t for t, funcs in enumerate(st.funcs) if fids and np.isin(funcs, list(fids)).any()}
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
