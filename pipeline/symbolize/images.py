"""Which image holds a frame: (pid, address, time) -> row of the ``images`` table.

Images are sorted by (pid, base) and cut into one group per pid. For one query the kernel binary
searches the pid's group for the last image with ``base <= address`` and walks back over images
that could still reach the address (``base > address - largest image size of the pid``), so
overlapping and reused address ranges are all seen:

    pid 42:  [---- a.dll 0x1000..0x5000, loaded 0..100 ----]
             [-- b.dll 0x1000..0x3000, loaded 200..∞ --]          address 0x2000 at t=250 -> b.dll

Among the images covering the address, one whose lifetime ``[load_ns, unload_ns)`` holds the
query time wins, the most recently loaded if several do (an image whose unload was never recorded
stays "loaded" forever, so a later load at the same place must win over it); if none does (a sample
just before its image's load event, a rundown that started late), the candidate whose lifetime is
nearest in time is used. The kernel also counts distinct
candidates, so the caller knows which frames need per-sample times and which do not.

Addresses that no image of the process covers are looked up among the images of the kernel
group (pid 0, or 4 = System when pid 0 has none): kernel frames appear in every process's stacks.
"""

from __future__ import annotations

import numba
import numpy as np

#: pids whose images are the kernel's (loaded drivers), in order of preference
KERNEL_PIDS = (0, 4)
NEVER = np.iinfo(np.int64).max


class ImageIndex:
    """The images table sorted by (pid, base), with per-pid group bounds."""

    def __init__(self, pid: np.ndarray, base: np.ndarray, size: np.ndarray, load_ns: np.ndarray, unload_ns: np.ndarray):
        order = np.lexsort((base, pid))
        self.order = order
        self.pid = np.ascontiguousarray(pid[order], dtype=np.int64)
        self.base = np.ascontiguousarray(base[order], dtype=np.uint64)
        self.end = self.base + np.ascontiguousarray(size[order], dtype=np.uint64)
        self.load = np.ascontiguousarray(load_ns[order], dtype=np.int64)
        self.unload = np.ascontiguousarray(unload_ns[order], dtype=np.int64)
        self.group_pids, starts = np.unique(self.pid, return_index=True)
        self.group_start = starts.astype(np.int64)
        self.group_stop = np.append(starts[1:], len(self.pid)).astype(np.int64)
        sizes = (self.end - self.base).astype(np.uint64)
        self.group_max_size = np.array(
            [sizes[a:b].max() if b > a else 0 for a, b in zip(self.group_start, self.group_stop)], dtype=np.uint64
        )
        self.kernel_group = -1
        for kp in KERNEL_PIDS:
            hit = np.flatnonzero(self.group_pids == kp)
            if len(hit):
                self.kernel_group = int(hit[0])
                break

    def group_of(self, pids: np.ndarray) -> np.ndarray:
        """Group index of each pid, -1 for a pid with no images."""
        pids = np.asarray(pids, dtype=np.int64)
        if len(self.group_pids) == 0:
            return np.full(len(pids), -1, dtype=np.int64)
        g = np.searchsorted(self.group_pids, pids)
        g = np.minimum(g, len(self.group_pids) - 1)
        return np.where(self.group_pids[g] == pids, g, -1).astype(np.int64)

    def find(self, pids: np.ndarray, addresses: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row (in the caller's original images order) of each query, -1 if none; and candidate counts."""
        groups = self.group_of(pids)
        addresses = np.ascontiguousarray(addresses, dtype=np.uint64)
        times = np.ascontiguousarray(times, dtype=np.int64)
        hit, count = find_kernel(
            groups, addresses, times, self.group_start, self.group_stop, self.group_max_size,
            self.base, self.end, self.load, self.unload, self.kernel_group,
        )
        return self.rows(hit), count

    def candidates(self, pids: np.ndarray, addresses: np.ndarray, most: int) -> np.ndarray:
        """(n, ``most``) array: per query the images ``find`` chooses among, in the order it weighs them
        (indices of this index, not rows: see ``rows``), -1 padded. ``most``: the largest count ``find``
        gave for these queries."""
        out = np.full((len(addresses), max(int(most), 1)), -1, np.int64)
        candidates_kernel(self.group_of(pids), np.ascontiguousarray(addresses, dtype=np.uint64), self.group_start,
                           self.group_stop, self.group_max_size, self.base, self.end, self.kernel_group, out)
        return out

    def mark_chosen(self, cands: np.ndarray, members: np.ndarray, first: np.ndarray, count: np.ndarray,
                    group: np.ndarray, times: np.ndarray, used: np.ndarray) -> None:
        """Mark in ``used`` (shaped as ``cands``) the slot of the image ``find`` picks for each occurrence: event
        ``j`` at ``times[j]`` holds the queries (rows of ``cands``) ``members[first[g]:first[g] + count[g]]``,
        ``g = group[j]``. One pass over the few candidates of each, instead of a search of the pid's images, and
        no array of the occurrences one by one."""
        i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
        mark_kernel(cands, i64(members), i64(first), i64(count), i64(group), i64(times), self.load, self.unload,
                     used)

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """Rows (in the caller's original images order) of indices of this index; -1 stays -1."""
        return np.where(indices >= 0, self.order[np.maximum(indices, 0)], -1).astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _last_at_or_below(lo, hi, base, addr):
    """The last index in [lo, hi) whose base is at most ``addr`` (lo - 1 when none)."""
    a, b = lo, hi
    while a < b:
        m = (a + b) // 2
        if base[m] <= addr:
            a = m + 1
        else:
            b = m
    return a - 1


@numba.njit(cache=True, nogil=True)
def _walk_from(g, addr, group_start, group_stop, group_max, base):
    """Where the walk over group g's images for ``addr`` starts: (its lowest index, its first index, the lowest
    base an image covering ``addr`` can have); the first index is below the lowest when there is nothing to
    walk. The walk goes down from the last image whose base is at most ``addr``."""
    lo = group_start[g]
    hi = group_stop[g]
    if lo >= hi or lo < 0 or hi > base.shape[0]:
        return np.int64(0), np.int64(-1), np.uint64(0)
    limit = np.uint64(0)
    if addr > group_max[g]:
        limit = addr - group_max[g]
    return lo, _last_at_or_below(lo, hi, base, addr), limit


@numba.njit(cache=True, nogil=True)
def _gap(i, t, load, unload):
    """How far time ``t`` lies outside the lifetime of image ``i`` (0 inside it)."""
    if load[i] <= t and t < unload[i]:
        return np.int64(0)
    if t < load[i]:
        return load[i] - t
    return t - unload[i]


@numba.njit(cache=True, nogil=True)
def _better(i, gap, best, best_gap, load):
    """Whether candidate ``i`` at ``gap`` beats the best so far (candidates come in ``_search_group``'s order)."""
    return best < 0 or gap < best_gap or (gap == best_gap and gap == 0 and load[i] > load[best])


@numba.njit(cache=True, nogil=True)
def _search_group(g, addr, t, group_start, group_stop, group_max, base, end, load, unload):
    """Best image of group g covering addr at time t: (index or -1, number of candidates)."""
    lo, i, limit = _walk_from(g, addr, group_start, group_stop, group_max, base)
    best = -1
    best_gap = np.int64(0)
    count = 0
    while i >= lo and base[i] >= limit:
        if addr < end[i]:
            count += 1
            gap = _gap(i, t, load, unload)
            if _better(i, gap, best, best_gap, load):
                best = i
                best_gap = gap
        if base[i] == 0:
            break
        i -= 1
    return best, count


@numba.njit(cache=True, nogil=True)
def _list_group(g, addr, group_start, group_stop, group_max, base, end, out, row):
    """The images of group g covering addr, in ``_search_group``'s order, into ``out[row]`` (as many as fit);
    returns how many there are."""
    lo, i, limit = _walk_from(g, addr, group_start, group_stop, group_max, base)
    count = 0
    while i >= lo and base[i] >= limit:
        if addr < end[i]:
            if count < out.shape[1]:
                out[row, count] = i
            count += 1
        if base[i] == 0:
            break
        i -= 1
    return count


@numba.njit(cache=True, nogil=True)
def candidates_kernel(groups, addresses, group_start, group_stop, group_max, base, end, kernel_group, out):
    """Per query, the images ``find_kernel`` chooses among (its pid's group, else the kernel's), -1 padded."""
    for k in range(addresses.shape[0]):
        g = groups[k]
        n = 0
        if g >= 0 and g < group_start.shape[0]:
            n = _list_group(g, addresses[k], group_start, group_stop, group_max, base, end, out, k)
        if n == 0 and kernel_group >= 0 and kernel_group != g:
            _list_group(kernel_group, addresses[k], group_start, group_stop, group_max, base, end, out, k)


@numba.njit(cache=True, nogil=True)
def _best_slot(cands, row, t, load, unload):
    """The slot of ``cands[row]`` that ``_search_group`` picks at time ``t`` (-1 when the row has none)."""
    best = -1
    best_slot = -1
    best_gap = np.int64(0)
    for s in range(cands.shape[1]):
        i = cands[row, s]
        if i < 0:
            break
        gap = _gap(i, t, load, unload)
        if _better(i, gap, best, best_gap, load):
            best = i
            best_slot = s
            best_gap = gap
    return best_slot


@numba.njit(cache=True, nogil=True)
def mark_kernel(cands, members, first, count, group, times, load, unload, used):
    """For each event j, each query of its group: mark the slot ``_search_group`` picks at the event's time."""
    for j in range(group.shape[0]):
        g = group[j]
        for k in range(first[g], first[g] + count[g]):
            row = members[k]
            s = _best_slot(cands, row, times[j], load, unload)
            if s >= 0:
                used[row, s] = True


@numba.njit(cache=True, nogil=True)
def find_kernel(groups, addresses, times, group_start, group_stop, group_max, base, end, load, unload, kernel_group):
    n = addresses.shape[0]
    hit = np.full(n, -1, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    if groups.shape[0] != n or times.shape[0] != n:
        return hit, count
    for k in range(n):
        g = groups[k]
        if g >= 0 and g < group_start.shape[0]:
            hit[k], count[k] = _search_group(g, addresses[k], times[k], group_start, group_stop, group_max,
                                             base, end, load, unload)
        if hit[k] < 0 and kernel_group >= 0 and kernel_group != g:
            hit[k], count[k] = _search_group(kernel_group, addresses[k], times[k], group_start, group_stop,
                                             group_max, base, end, load, unload)
    return hit, count
