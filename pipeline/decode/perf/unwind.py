"""User stacks of ``perf record --call-graph dwarf`` samples, unwound with the images' call frame information.

Such a sample holds the user registers (``REGS_USER``) and a copy of the top of the user stack from ``$rsp``
(``STACK_USER``, its filled size ``dyn_size``); its callchain holds the kernel frames only. From the user
``$rip``, ``$rsp`` and ``$rbp`` the kernel :func:`unwind` steps frame by frame (x86-64): the mapping of the pid that
holds the address at the sample's time gives the file offset, the image's rows (``cfi.RULES``, by file offset;
the address minus one for a return address, which may lie past its call's function) the canonical frame address,
the saved return address and ``$rbp`` in the stack copy. It stops at an address no mapping or row covers, a rule
it cannot follow, a read outside the copy, a zero return address, a CFA that does not grow, or ``MAX_DEPTH``.
Like ``kernels.walk`` it runs twice, counting then filling arrays the caller allocated, and reads only inside them.

:func:`user_stacks` does the Python part: which images to read, the arrays, and the frames each sample ends
with (its callchain's kernel frames, then the user frames).
"""

from __future__ import annotations

from pathlib import Path

import numba as nb
import numpy as np

from pipeline.decode.etl.kernels import read_u64
from pipeline.decode.perf import cfi as C
from pipeline.decode.perf.elfload import VDSO, bundled_copy, image_file, path_key, vdso_file

JIT = dict(nogil=True, cache=True)
#: User frames at most per sample (perf's own limit for DWARF unwinding is 127 by default).
MAX_DEPTH = 256
#: perf_event_attr's x86-64 register numbers (``arch/x86/include/uapi/asm/perf_regs.h``) of the three the unwinder
#: starts from; a sample stores the registers of ``sample_regs_user`` in bit order.
REG_BP, REG_SP, REG_IP = 6, 7, 8
FAR = np.int64(1 << 62)     # an image's unload time when it was never unloaded
#: A stack address at or above this is no user-space one (x86-64 user space ends at 2^47; 5-level paging 2^56).
USER_LIMIT = np.int64(1 << 57)


@nb.njit(**JIT)
def _image(pid, t, pc, pid_lo, pid_hi, img_base, img_end, img_load, img_unload):
    """The mapping of ``pid`` that holds ``pc`` at time ``t`` (the latest loaded), or -1."""
    best = -1
    for k in range(pid_lo, pid_hi):
        if img_base[k] <= pc < img_end[k] and img_load[k] <= t < img_unload[k]:
            if best < 0 or img_load[k] >= img_load[best]:
                best = k
    return best


@nb.njit(**JIT)
def _row(starts, lo, hi, off):
    """The last row of ``starts[lo:hi]`` at or below ``off``, or -1."""
    a, b = lo, hi
    while a < b:
        m = (a + b) // 2
        if starts[m] <= off:
            a = m + 1
        else:
            b = m
    return a - 1 if a > lo else -1


@nb.njit(**JIT)
def unwind(data, spid, stime, sregs, sstack, ssize, i_ip, i_sp, i_bp, pid_of, pid_lo, pid_hi, img_base, img_end,
           img_pgoff, img_load, img_unload, img_table, tab_lo, tab_hi, r_start, r_reg, r_cfa, r_ra, r_bp, fill,
           out_off, out, counts):
    """For each sample ``s`` whose registers and stack copy lie at ``sregs[s]``/``sstack[s]`` in ``data``: its
    user frames (leaf first) into ``out[out_off[s]:]`` with ``fill``; ``counts[s]`` how many. ``pid_of[s]`` is the
    index of its pid in ``pid_lo``/``pid_hi`` (the pid's rows of the image arrays), -1 when it has none."""
    n = spid.shape[0]
    for s in range(n):
        counts[s] = 0
        ra = sregs[s]
        if ra < 0 or ra + 8 * (max(i_ip, max(i_sp, i_bp)) + 1) > data.shape[0] or i_ip < 0 or i_sp < 0:
            continue
        pc = read_u64(data, ra + 8 * i_ip)
        # (stack addresses as int64, user space lies below 2^47: no arithmetic here wraps, compiled or not)
        sp = np.int64(read_u64(data, ra + 8 * i_sp))
        bp = np.int64(read_u64(data, ra + 8 * i_bp)) if i_bp >= 0 else np.int64(0)
        base = sp
        st = sstack[s]
        size = ssize[s] if st >= 0 and st + ssize[s] <= data.shape[0] else 0
        if fill:
            out[out_off[s]] = pc
        k = 1
        p = pid_of[s]
        while p >= 0 and k < MAX_DEPTH:
            look = pc - np.uint64(1) if k > 1 else pc
            im = _image(spid[s], stime[s], look, pid_lo[p], pid_hi[p], img_base, img_end, img_load, img_unload)
            if im < 0 or img_table[im] < 0:
                break
            tb = img_table[im]
            off = look - img_base[im] + img_pgoff[im]
            r = _row(r_start, tab_lo[tb], tab_hi[tb], off)
            if r < 0 or r_reg[r] == C.UNSUPPORTED or r_ra[r] == C.NO_OFFSET:
                break
            frame = sp if r_reg[r] == C.RSP else bp
            if frame <= 0 or frame >= USER_LIMIT:
                break
            cfa = frame + np.int64(r_cfa[r])
            at = cfa + np.int64(r_ra[r])
            if at < base or at - base + 8 > size:
                break
            ret = read_u64(data, st + (at - base))
            if r_bp[r] != C.NO_OFFSET:
                bat = cfa + np.int64(r_bp[r])
                if bat < base or bat - base + 8 > size:
                    bp = np.int64(0)
                else:
                    bp = np.int64(read_u64(data, st + (bat - base)))
            if ret == 0 or cfa <= sp:
                break
            sp = cfa
            pc = ret
            if fill:
                out[out_off[s] + k] = pc
            k += 1
        counts[s] = k
    return counts


def _pid_ranges(img_pid: np.ndarray, sample_pid: np.ndarray):
    pids = np.unique(img_pid)
    lo = np.searchsorted(img_pid, pids, "left")
    hi = np.searchsorted(img_pid, pids, "right")
    at = np.searchsorted(pids, sample_pid)
    at = np.minimum(at, max(len(pids) - 1, 0))
    pid_of = np.where((len(pids) > 0) & (pids[at] == sample_pid) if len(pids) else np.zeros(len(sample_pid), bool),
                      at, -1).astype(np.int64)
    return pid_of, lo.astype(np.int64), hi.astype(np.int64)


def user_stacks(rec, images, symbols_dir: Path, cache_dir: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """The frames of each of ``rec``'s samples as the kernel's callchain part then the unwound user part (sample
    order): ``(counts, frames)``, and what it read (images with rows, their reasons when none, frames unwound).
    ``images`` is the decoded ``images`` table (its raw load and unload times). An image's rows are read from the
    run's copy of its file (``symbols_dir``, as symbolize reads it: ``elfload.bundled_copy``), else from the file at
    the recorded path, each only when it can be an ELF image (``elfload.image_file``); those of this machine's files
    are kept in ``cache_dir`` (``cfi.cached_rules``)."""
    from pipeline.decode.perf import kernels as K

    s = rec.samples
    hdr = rec.header
    mask = hdr.attrs[0].sample_regs_user
    index = {r: bin(mask & ((1 << r) - 1)).count("1") if mask >> r & 1 else -1 for r in (REG_IP, REG_SP, REG_BP)}
    has = (s[:, K.S_REGS] >= 0) & (s[:, K.S_STACK] >= 0)
    img = images.to_pydict()
    order = np.argsort(np.array(img["pid"], np.int64), kind="stable")
    img_pid = np.array(img["pid"], np.int64)[order]
    base = np.array(img["base"], np.uint64)[order]
    end = base + np.array(img["size"], np.uint64)[order]
    pgoff = np.array(img["pgoff"], np.uint64)[order]
    load = np.array([x or 0 for x in img["load_timestamp"]], np.int64)[order]
    unload = np.array([x or FAR for x in img["unload_timestamp"]], np.int64)[order]
    names = [img["file_name"][i] for i in order.tolist()]
    bids = [img["build_id"][i] for i in order.tolist()]
    wanted = set(np.unique(s[has, K.S_PID]).tolist())
    tables: dict[str, int] = {}
    rules: list[np.ndarray] = []
    reasons: dict[str, str] = {}
    copied: set[str] = set()        # (images read from the run's copies)
    img_table = np.full(len(names), -1, np.int64)
    for k, name in enumerate(names):
        if int(img_pid[k]) not in wanted or not (name.startswith("/") or (name == VDSO and bids[k])):
            continue
        if name == VDSO:        # (clock_gettime: perf's copy of the [vdso], or this process's on the same kernel)
            name = f"{VDSO} {bids[k]}"
        if name not in tables and name not in reasons:
            path, key, why, copy = _image_path(name, bids[k], symbols_dir, cache_dir)
            rows, why = _image_rules(path, key, bids[k], cache_dir, copy) if path is not None else (None, why)
            if rows is None:
                reasons[name] = why or f"{name}: no call frame information"
                continue
            if copy:
                copied.add(name)
            tables[name] = len(rules)
            rules.append(rows)
        img_table[k] = tables.get(name, -1)
    all_rules = np.concatenate(rules) if rules else np.zeros(0, C.RULES)
    sizes = np.array([len(r) for r in rules], np.int64)
    tab_hi = np.cumsum(sizes)
    tab_lo = tab_hi - sizes
    pid_of, pid_lo, pid_hi = _pid_ranges(img_pid, s[:, K.S_PID])
    sregs = np.where(has, s[:, K.S_REGS], -1)
    args = (rec.data, s[:, K.S_PID].copy(), s[:, K.S_TIME].copy(), sregs, s[:, K.S_STACK].copy(),
            s[:, K.S_STACK_SIZE].copy(), index[REG_IP], index[REG_SP], index[REG_BP], pid_of, pid_lo, pid_hi, base,
            end, pgoff, load, unload, img_table, tab_lo, tab_hi, np.ascontiguousarray(all_rules["start"]),
            np.ascontiguousarray(all_rules["cfa_reg"]), np.ascontiguousarray(all_rules["cfa_off"]),
            np.ascontiguousarray(all_rules["ra_off"]), np.ascontiguousarray(all_rules["bp_off"]))
    user = np.zeros(len(s), np.int64)
    unwind(*args, False, np.zeros(len(s), np.int64), np.zeros(0, np.uint64), user)
    user_off = np.zeros(len(s) + 1, np.int64)
    np.cumsum(user, out=user_off[1:])
    user_frames = np.zeros(int(user_off[-1]), np.uint64)
    unwind(*args, True, user_off[:-1].copy(), user_frames, user)
    # each sample: its callchain (the kernel's frames), then its user frames
    chain = s[:, K.S_FRAMES]
    chain_off = np.zeros(len(s) + 1, np.int64)
    np.cumsum(chain, out=chain_off[1:])
    counts = chain + user
    frames = np.zeros(int(counts.sum()), np.uint64)
    at = 0
    for i in range(len(s)):
        a, b = chain_off[i], chain_off[i + 1]
        frames[at:at + b - a] = rec.frames[a:b]
        at += b - a
        frames[at:at + user[i]] = user_frames[user_off[i]:user_off[i + 1]]
        at += user[i]
    info = {"cfi_rows_by_image": {name: len(rules[k]) for name, k in tables.items()}, "user_frames": int(user.sum()),
            "samples_unwound": int((user > 1).sum()), "images_without_cfi": sorted(reasons.values()),
            "from_run_symbols": sorted(copied)}
    return counts, frames, info


def merged_info(infos: list[dict]) -> dict:
    """What the parts' :func:`user_stacks` read, as the manifest says it: images with rows (each counted once), of
    them those read from the run's copies, their rows, frames unwound, the first 20 reasons of images without."""
    rows: dict[str, int] = {}
    reasons: set[str] = set()
    copied: set[str] = set()
    for info in infos:
        rows.update(info["cfi_rows_by_image"])
        reasons.update(info["images_without_cfi"])
        copied.update(info["from_run_symbols"])
    return {"images_with_cfi": len(rows), "images_from_run_symbols": len(copied), "cfi_rows": sum(rows.values()),
            "user_frames": sum(i["user_frames"] for i in infos),
            "samples_unwound": sum(i["samples_unwound"] for i in infos), "images_without_cfi": sorted(reasons)[:20]}


def _image_path(name: str, build_id: str | None, symbols_dir: Path, cache_dir: Path
                ) -> tuple[Path | None, str, str | None, bool]:
    """The file to read the image ``name`` (``[vdso] <build id>`` for the vdso) from, its key (``cfi.cached_rules``),
    or why there is none; and whether it is the run's copy: the run's copy first, then the recorded path."""
    if name.startswith(VDSO):
        bid = name.split()[1]
        path, why = vdso_file(bid, Path(cache_dir).expanduser() / "vdso")
        return path, f"elf-{bid.lower()}", why, False
    copy = bundled_copy(symbols_dir, name, build_id)
    reasons = []
    for candidate in ([copy] if copy is not None else []) + [Path(name)]:
        path, why = image_file(candidate)
        if path is not None:
            key = copy.parent.name if candidate is copy else f"elf-{build_id.lower()}" if build_id else path_key(name)
            return path, key, None, candidate is copy
        reasons.append(why)
    return None, "", "; ".join(reasons), False


_RULES: dict[tuple[str, str, int, int], tuple[np.ndarray | None, str | None]] = {}


def _image_rules(path: Path, key: str, build_id: str | None, cache_dir: Path, copy: bool
                 ) -> tuple[np.ndarray | None, str | None]:
    """``cfi.cached_rules``, once per file (and its key, size and time) in a process: each part of a file that a
    worker unwinds asks for the same images. Rows of a run's ``copy`` of a file are not written to the cache."""
    st = path.stat()
    memo = (key, str(path), st.st_size, st.st_mtime_ns)
    if memo not in _RULES:
        _RULES[memo] = C.cached_rules(path, key, build_id, cache_dir, keep=not copy)
    return _RULES[memo]
