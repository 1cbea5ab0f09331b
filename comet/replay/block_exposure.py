"""The exposure split of a replayed block (comet/replay/blocks.py exposure_parts) compiled with numba:
compute busy time, then communication not hidden behind compute (charged by process group in
COMM_ORDER), then expansion-tier copies hidden by neither; idle time inside the block counts as
compute. Called by the compiled engine (block_kernel.py) on each replay's op spans.

Each op belongs to one exposure category (`pack` writes it into the packed structure): COMPUTE,
MEMCPY, or FIRST_COMM + its group's position in COMM_ORDER; -1 for none.
"""

from __future__ import annotations

import numpy as np

from comet.graph.ir import GroupKind
from comet.replay.kernels import njit

# Exposure categories (blocks.exposure_parts): compute, expansion-tier copies, then communication by
# process group in the order exposed time is charged. PARTS: the parts dict's keys in its order.
PARTS = ("compute", "exposed_tp", "exposed_cp", "exposed_ep", "exposed_dp", "exposed_pp", "offload")
COMM_ORDER = (("exposed_tp", GroupKind.TP), ("exposed_tp", GroupKind.ETP), ("exposed_cp", GroupKind.CP),
              ("exposed_ep", GroupKind.EP), ("exposed_dp", GroupKind.DP), ("exposed_dp", GroupKind.EDP),
              ("exposed_pp", GroupKind.PP), ("exposed_dp", GroupKind.EMBEDDING))
COMPUTE, MEMCPY, FIRST_COMM = 0, 1, 2      # the exposure categories: kernels, copies, the first comm group
CATEGORY_OF_GROUP = {kind: FIRST_COMM + k for k, (_, kind) in enumerate(COMM_ORDER)}   # a comm op's, by group
_PART_OF_COMM = np.array([PARTS.index(key) for key, _ in COMM_ORDER], dtype=np.int64)
_OFFLOAD = PARTS.index("offload")
N_PARTS, _N_COMM = len(PARTS), len(COMM_ORDER)
# the categories in the order exposure charges them, and the part each is charged to
_CHARGE_ORDER = np.array([COMPUTE, *range(FIRST_COMM, FIRST_COMM + _N_COMM), MEMCPY], dtype=np.int64)
_CHARGED_PART = np.array([PARTS.index("compute"), *_PART_OF_COMM, _OFFLOAD], dtype=np.int64)


# -------------------------------------------------------------------------------- exposure split
# Interval lists are (starts, ends, count) in preallocated buffers. A union of intervals is kept as
# blocks._measure returns it: disjoint, in order, touching intervals joined, empty ones dropped; that
# form is unique, so building it by merging sorted lists gives the same floats as sorting their
# concatenation, and lengths are summed left to right as there.
@njit(inline="always")
def _by_span(start, end):
    """Op indices ordered by (start, end): a bottom-up merge sort."""
    n = start.shape[0]
    a = np.arange(n)
    b = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i >= mid or start[a[j]] < start[a[i]]
                               or (start[a[j]] == start[a[i]] and end[a[j]] < end[a[i]])):
                    b[k] = a[j]
                    j += 1
                else:
                    b[k] = a[i]
                    i += 1
        a, b = b, a
        width *= 2
    return a


@njit(inline="always")
def _add_interval(oa, ob, m, x, y) -> int:
    """Append [x, y) to the union (oa, ob, m) whose intervals start no later than x (blocks._measure)."""
    if y <= x:
        return m
    if m > 0 and x <= ob[m - 1]:
        if y > ob[m - 1]:
            ob[m - 1] = y
        return m
    oa[m] = x
    ob[m] = y
    return m + 1


@njit(inline="always")
def _union_of(order, start, end, cat, want, oa, ob) -> int:
    """The union of the spans of the ops of category `want`."""
    m = 0
    for i in order:
        if cat[i] == want:
            m = _add_interval(oa, ob, m, start[i], end[i])
    return m


@njit(inline="always")
def _union(a, b, ma, c, d, mc, oa, ob) -> int:
    """The union of two unions, merged in order of start."""
    i = j = m = 0
    while i < ma or j < mc:
        if j >= mc or (i < ma and a[i] <= c[j]):
            m = _add_interval(oa, ob, m, a[i], b[i])
            i += 1
        else:
            m = _add_interval(oa, ob, m, c[j], d[j])
            j += 1
    return m


@njit(inline="always")
def _subtract(a, b, ma, ca, cb, mc, oa, ob) -> int:
    """Parts of union (a, b) not covered by union (ca, cb) (blocks._subtract)."""
    m = 0
    for j in range(ma):
        cur = a[j]
        hi = b[j]
        for c in range(mc):
            if cb[c] <= cur or ca[c] >= hi:
                continue
            if ca[c] > cur:
                oa[m] = cur
                ob[m] = ca[c]
                m += 1
            if cb[c] > cur:
                cur = cb[c]
        if cur < hi:
            oa[m] = cur
            ob[m] = hi
            m += 1
    return m


@njit(inline="always")
def _length(a, b, m) -> float:
    total = 0.0
    for j in range(m):
        total += b[j] - a[j]
    return total


@njit(cache=True, nogil=True)
def exposure(start, end, cat, makespan):
    """blocks.exposure_parts on arrays: compute busy time, then communication not hidden behind
    compute (charged in COMM_ORDER), then copies hidden by neither; idle time inside the block counts
    as compute. Returns the values in PARTS order."""
    n = start.shape[0]
    order = _by_span(start, end)
    size = 2 * n + 1
    w = np.empty(8 * size)                        # perf: one allocation for the eight interval buffers
    ca, cb = w[:size], w[size:2 * size]           # covered so far
    ma, mb = w[2 * size:3 * size], w[3 * size:4 * size]   # one category's spans
    ea, eb = w[4 * size:5 * size], w[5 * size:6 * size]   # their exposed part
    ta, tb = w[6 * size:7 * size], w[7 * size:]           # the next covered
    parts = np.zeros(N_PARTS)
    mc = 0
    # perf: one loop over the categories, so each helper is compiled in once (numba inlines a copy per
    # call site). The copies' exposed part joins the covered time where exposure_parts joins their
    # whole spans: the same union, the same floats.
    for k in range(_CHARGE_ORDER.shape[0]):
        mm = _union_of(order, start, end, cat, _CHARGE_ORDER[k], ma, mb)
        if mm == 0:
            continue        # nothing exposed, nothing newly covered
        if mc == 0:         # nothing covered yet (compute): all exposed, all now covered
            parts[_CHARGED_PART[k]] += _length(ma, mb, mm)
            ca, cb, ma, mb, mc = ma, mb, ca, cb, mm
            continue
        me = _subtract(ma, mb, mm, ca, cb, mc, ea, eb)
        parts[_CHARGED_PART[k]] += _length(ea, eb, me)
        mc = _union(ca, cb, mc, ea, eb, me, ta, tb)
        ca, cb, ta, tb = ta, tb, ca, cb
    idle = makespan - _length(ca, cb, mc)
    parts[0] += idle if idle > 0.0 else 0.0
    return parts



__all__ = ["CATEGORY_OF_GROUP", "COMM_ORDER", "COMPUTE", "FIRST_COMM", "MEMCPY", "N_PARTS", "PARTS", "exposure"]
