"""The event engine (comet/replay/engine.py) and the exposure split (comet/replay/blocks.py) compiled
with numba, over a block packed into arrays.

Same semantics and the same float operations in the same order as the Python engine, which stays the
reference (tests/replay/test_block_kernel.py: equal bit for bit on random graphs and on every block
of every shipped model): events ordered by (time, priority, sequence), one op at a time per (rank,
stream) taken in topological order, collectives starting when their last member arrives, compute
re-timed while a transfer is in flight on its rank.

A graph is packed once per block content (`pack`): one int64 array holding every structure the loop
reads, one float array of edge delays; a replay then passes three arrays and a float to the
compiled code (numba unboxes each argument on every call: few arguments, little overhead).
"""

from __future__ import annotations

import numpy as np

from comet.graph.ir import GroupKind, OpKind
from comet.graph.block import block_lists
from comet.graph.op_table import (GEMM_WIDTH, GROUP_CODES, GROUPS_PER_KIND, HEADER, KIND_CODES, KIND_GROUP, N_EDGES,
                                  N_GEMMS, N_OPS, PLACE, ROW_WIDTH, STREAMS_PER_RANK)
from comet.replay.compile import CompiledGraph, compile_graph
from comet.replay.kernels import HAVE_NUMBA, njit

# Exposure categories (blocks.exposure_parts): compute, expansion-tier copies, then communication by
# process group in the order exposed time is charged. PARTS: the parts dict's keys in its order.
PARTS = ("compute", "exposed_tp", "exposed_cp", "exposed_ep", "exposed_dp", "exposed_pp", "offload")
COMM_ORDER = (("exposed_tp", GroupKind.TP), ("exposed_tp", GroupKind.ETP), ("exposed_cp", GroupKind.CP),
              ("exposed_ep", GroupKind.EP), ("exposed_dp", GroupKind.DP), ("exposed_dp", GroupKind.EDP),
              ("exposed_pp", GroupKind.PP), ("exposed_dp", GroupKind.EMBEDDING))
_COMPUTE, _MEMCPY, _FIRST_COMM = 0, 1, 2
_CATEGORY = {kind: _FIRST_COMM + k for k, (_, kind) in enumerate(COMM_ORDER)}
_PART_OF_COMM = np.array([PARTS.index(key) for key, _ in COMM_ORDER], dtype=np.int64)
_OFFLOAD = PARTS.index("offload")
_N_PARTS, _N_COMM = len(PARTS), len(COMM_ORDER)

_HEADER = 6     # n, edges, groups, group members, resources, ranks
_FINISH, _READY = 0, 1


def pack(cg: CompiledGraph) -> tuple[np.ndarray, np.ndarray]:
    """(structure, edge delays) of a compiled graph. structure: header, then per op resource, dense
    rank, flags (1 compute, 2 communication), topological position, in-degree, exposure category
    (-1: none), matched group (-1: none); successor offsets (n + 1) and indices in the graph's edge
    order; group offsets and members."""
    n = len(cg)
    rank_of: dict = {}
    rank = [rank_of.setdefault(r, len(rank_of)) for r in cg.rank]
    flags = [int(c) | (2 * int(m)) for c, m in zip(cg.is_compute, cg.is_comm)]
    group_of: dict = {}
    group = [-1 if t is None else group_of.setdefault(id(t), (len(group_of), t))[0] for t in cg.match]
    members = [m for _, t in group_of.values() for m in t]
    group_ptr = np.cumsum([0] + [len(t) for _, t in group_of.values()]).tolist()
    succ_idx = [v for s in cg.succs for v, _ in s]
    succ_ptr = np.cumsum([0] + [len(s) for s in cg.succs]).tolist()
    head = [n, len(succ_idx), len(group_of), len(members), len(cg.resources), len(rank_of)]
    structure = np.array(head + cg.resource + rank + flags + cg.topo + [len(p) for p in cg.preds]
                         + [_category(op) for op in cg.ops] + group + succ_ptr + succ_idx + group_ptr + members,
                         dtype=np.int64)
    return structure, np.array([d for s in cg.succs for _, d in s], dtype=np.float64)


def pack_graph(g) -> tuple[np.ndarray, np.ndarray]:
    """pack(compile_graph(g)), straight from the lists of a built block where it can."""
    lists = block_lists(g)
    packed = pack_block(*lists) if lists is not None else None
    return packed if packed is not None else pack(compile_graph(g))


def pack_block(ops: list, edges: list) -> tuple[np.ndarray, np.ndarray] | None:
    """pack(compile_graph(block)) from a built block's lists (graph/block.py) without the CompiledGraph:
    its edges run forward, sorted by source, none delayed; None when ops are matched across streams
    (comm_id), which pack() handles."""
    n = len(ops)
    res_of: dict = {}
    rank_of: dict = {}
    resource, rank, flags, cat = [], [], [], []
    for op in ops:
        if op.comm_id is not None:
            return None
        r = op.rank
        resource.append(res_of.setdefault((r, op.stream), len(res_of)))
        rank.append(rank_of.setdefault(r, len(rank_of)))
        f, c = _FLAGS_CATEGORY[op.kind, op.group_kind]
        flags.append(f)
        cat.append(c)
    indeg = [0] * n
    succ_end = [0] * (n + 1)          # edges are sorted by source: offsets from counts
    targets = []
    for u, v, _ in edges:
        indeg[v] += 1
        succ_end[u + 1] += 1
        targets.append(v)
    total = 0
    for i in range(n + 1):
        total += succ_end[i]
        succ_end[i] = total
    # perf: one list, one conversion (small numpy calls cost a microsecond each); unpacked into one
    # display instead of concatenating twelve lists (~15% of this function)
    structure = np.array([n, len(edges), 0, 0, len(res_of), len(rank_of), *resource, *rank, *flags, *range(n),
                          *indeg, *cat, *[-1] * n, *succ_end, *targets, 0], dtype=np.int64)
    return structure, np.zeros(len(edges))


def pack_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """pack_block(ops, edges) from a built block's table (graph/op_table.py: its ops' places and
    kind-groups, its edges) in one compiled pass (perf: pack_block is ~1 us of Python an op); None
    where the table marks an op the packing cannot read (pack() handles it). Equal to pack_block
    (tested on every block of every shipped model)."""
    structure = _pack_rows(table, _FLAGS_CATEGORY_CODES)
    if structure.shape[0] == 0:
        return None
    return structure, np.zeros(structure[1])


def pack_and_replay(table: np.ndarray, dur: np.ndarray, overlap_slowdown: float) -> tuple | None:
    """(pack_rows(table), replay_summary(*pack_rows(table), dur, overlap_slowdown)) in one compiled call:
    a block's first replay (perf: one numba dispatch instead of two, ~1.5 us hot and more on a cold
    call's CPU caches); None where pack_rows is None. Equal to the two calls (tests/replay/test_block_kernel.py)."""
    structure, delay, summary = _pack_and_replay(table, _FLAGS_CATEGORY_CODES, dur, overlap_slowdown)
    if structure.shape[0] == 0:
        return None
    return (structure, delay), summary


@njit(cache=True, nogil=True)
def _pack_and_replay(table, flags_category, dur, overlap_slowdown):
    structure = _pack_rows(table, flags_category)
    if structure.shape[0] == 0:
        return structure, np.zeros(0), np.zeros(0)
    delay = np.zeros(structure[1])
    return structure, delay, _summary(structure, delay, dur, overlap_slowdown)


@njit(inline="always")
def _dense(seen, count, x):
    """x's number in order of first appearance among seen[:count] (pack_block's dict.setdefault), and
    the new count."""
    k = 0
    while k < count and seen[k] != x:
        k += 1
    if k == count:
        seen[k] = x
        count += 1
    return k, count


@njit(cache=True, nogil=True)
def _pack_rows(table, flags_category):
    """The structure pack_block builds, from the table (edges forward, sorted by source); an empty
    array where an op's kind-group is -1."""
    n, m = int(table[N_OPS]), int(table[N_EDGES])
    edges = HEADER + n * ROW_WIDTH + int(table[N_GEMMS]) * GEMM_WIDTH
    out = np.empty(_HEADER + 8 * n + 1 + m + 1, dtype=np.int64)
    o = _HEADER
    places = np.empty(n)
    ranks = np.empty(n)
    n_res = n_ranks = 0
    for i in range(n):
        row = HEADER + i * ROW_WIDTH
        kg = int(table[row + KIND_GROUP])
        if kg < 0:
            return np.empty(0, dtype=np.int64)
        place = table[row + PLACE]
        r = place // STREAMS_PER_RANK
        res, n_res = _dense(places, n_res, place)
        rk, n_ranks = _dense(ranks, n_ranks, r)
        kind, group = kg // GROUPS_PER_KIND, kg % GROUPS_PER_KIND
        out[o + i] = res
        out[o + n + i] = rk
        out[o + 2 * n + i] = flags_category[kind, group, 0]
        out[o + 3 * n + i] = i
        out[o + 4 * n + i] = 0
        out[o + 5 * n + i] = flags_category[kind, group, 1]
        out[o + 6 * n + i] = -1
    ptr = o + 7 * n
    for i in range(n + 1):
        out[ptr + i] = 0
    for e in range(m):
        u, v = int(table[edges + e]), int(table[edges + m + e])
        out[o + 4 * n + v] += 1
        out[ptr + u + 1] += 1
        out[ptr + n + 1 + e] = v
    for i in range(n):
        out[ptr + i + 1] += out[ptr + i]
    out[ptr + n + 1 + m] = 0
    out[0], out[1], out[2], out[3], out[4], out[5] = n, m, 0, 0, n_res, n_ranks
    return out


def _category(op) -> int:
    if op.kind is OpKind.COMPUTE:
        return _COMPUTE
    if op.kind is OpKind.MEMCPY:
        return _MEMCPY
    if op.is_comm:
        return _CATEGORY.get(op.group_kind, -1)
    return -1


_COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
# (flags, exposure category) of an op by (kind, group kind)
_FLAGS_CATEGORY = {(kind, group): (int(kind is OpKind.COMPUTE) | 2 * int(kind in _COMM_KINDS),
                                   _COMPUTE if kind is OpKind.COMPUTE else _MEMCPY if kind is OpKind.MEMCPY
                                   else _CATEGORY.get(group, -1) if kind in _COMM_KINDS else -1)
                   for kind in OpKind for group in (None, *GroupKind)}
# the same by the op table's kind and group codes (graph/op_table.py KIND_CODES, GROUP_CODES), padded to
# GROUPS_PER_KIND groups
_FLAGS_CATEGORY_CODES = np.array([[_FLAGS_CATEGORY[kind, group] for group in GROUP_CODES]
                                  + [(0, -1)] * (GROUPS_PER_KIND - len(GROUP_CODES)) for kind in KIND_CODES],
                                 dtype=np.int64)


# ------------------------------------------------------------------------------------------ heaps
# A heap is rows (key, priority, sequence, op, version) of a float array from row `base` on (all
# integers here are far below 2**53), ordered by (key, priority, sequence). The event heap: key =
# time, sequences unique. A resource's ready queue: key = topological position (unique).
@njit(inline="always")
def _before(h, a, b) -> bool:
    if h[a, 0] != h[b, 0]:
        return h[a, 0] < h[b, 0]
    if h[a, 1] != h[b, 1]:
        return h[a, 1] < h[b, 1]
    return h[a, 2] < h[b, 2]


@njit(inline="always")
def _swap(h, a, b) -> None:
    for c in range(5):
        x = h[a, c]
        h[a, c] = h[b, c]
        h[b, c] = x


@njit(nogil=True)
def _push(h, base, size, key, prio, seq, i, v) -> int:
    """Add a row to the heap of `size` rows at `base`; returns the new size."""
    k = base + size
    h[k, 0] = key
    h[k, 1] = prio
    h[k, 2] = seq
    h[k, 3] = i
    h[k, 4] = v
    while k > base:
        p = base + (k - base - 1) // 2
        if not _before(h, k, p):
            break
        _swap(h, k, p)
        k = p
    return size + 1


@njit(nogil=True)
def _pop(h, base, size) -> int:
    """Move the first row to row base + size - 1 (read it there); returns the new size."""
    last = size - 1
    _swap(h, base, base + last)
    k = 0
    while True:
        a = 2 * k + 1
        if a >= last:
            break
        c = a + 1 if a + 1 < last and _before(h, base + a + 1, base + a) else a
        if not _before(h, base + c, base + k):
            break
        _swap(h, base + c, base + k)
        k = c
    return last


@njit(inline="always")
def _ints(w, k, size, fill):
    """w[k:k + size] set to `fill`, and the next offset."""
    v = w[k:k + size]
    v[:] = fill
    return v, k + size


# ------------------------------------------------------------------------------------ the engine
@njit(cache=True, nogil=True)
def replay_arrays(structure: np.ndarray, delay: np.ndarray, dur: np.ndarray, overlap_slowdown: float):
    """Replay a packed graph: (start, end, arrive, binding, ops done, exposure parts in PARTS order,
    makespan). Fewer ops done than the graph has: a deadlock (the caller raises)."""
    return _replay(structure, delay, dur, overlap_slowdown)


@njit(cache=True, nogil=True)
def replay_summary(structure: np.ndarray, delay: np.ndarray, dur: np.ndarray, overlap_slowdown: float) -> np.ndarray:
    """[ops done, makespan, exposure parts in PARTS order] of replay_arrays: what a block's timing
    keeps (perf: numba boxes each returned array on every call; one instead of five)."""
    return _summary(structure, delay, dur, overlap_slowdown)


@njit(nogil=True)
def _summary(structure, delay, dur, overlap_slowdown):
    _, _, _, _, done, parts, makespan = _replay(structure, delay, dur, overlap_slowdown)
    out = np.empty(2 + parts.shape[0])
    out[0] = done
    out[1] = makespan
    out[2:] = parts
    return out


@njit(nogil=True)
def _replay(structure, delay, dur, overlap_slowdown):
    n, n_edges, n_groups, n_members, n_res, n_ranks = (structure[0], structure[1], structure[2], structure[3],
                                                       structure[4], structure[5])
    o = _HEADER
    resource = structure[o:o + n]
    rank = structure[o + n:o + 2 * n]
    flags = structure[o + 2 * n:o + 3 * n]
    topo = structure[o + 3 * n:o + 4 * n]
    cat = structure[o + 5 * n:o + 6 * n]
    group = structure[o + 6 * n:o + 7 * n]
    o += 7 * n
    succ_ptr = structure[o:o + n + 1]
    succ_idx = structure[o + n + 1:o + n + 1 + n_edges]
    o += n + 1 + n_edges
    group_ptr = structure[o:o + n_groups + 1]
    members = structure[o + n_groups + 1:o + n_groups + 1 + n_members]

    # perf: the state arrays are views of one integer and one float allocation (~40 arrays allocated
    # apart cost ~1 us a replay); each is initialized as np.zeros / np.full would
    iw = np.empty(7 * n + 4 * n_ranks + n_groups + 5 * n_res + 1, dtype=np.int64)
    k = 0
    binding, k = _ints(iw, k, n, -1)
    version, k = _ints(iw, k, n, 0)
    # a running compute op (overlap slowdown): remaining work, rate, since, version
    ver, k = _ints(iw, k, n, 0)
    # per rank, the compute ops running, in the order they started (a doubly linked list)
    nxt, k = _ints(iw, k, n, -1)
    prv, k = _ints(iw, k, n, -1)
    linked, k = _ints(iw, k, n, 0)               # 0 / 1
    head, k = _ints(iw, k, n_ranks, -1)
    tail, k = _ints(iw, k, n_ranks, -1)
    comm_active, k = _ints(iw, k, n_ranks, 0)
    arrived, k = _ints(iw, k, n_groups, 0)
    busy, k = _ints(iw, k, n_res, 0)             # 0 / 1
    last_on_res, k = _ints(iw, k, n_res, -1)
    # ready queues: resource r's heap lives in q[lo[r]:lo[r+1]] (each op is queued once)
    lo, k = _ints(iw, k, n_res + 1, 0)
    for i in range(n):
        lo[resource[i] + 1] += 1
    for r in range(n_res):
        lo[r + 1] += lo[r]
    qsize, k = _ints(iw, k, n_res, 0)
    # events: n ready + n finish + one per running compute op at each of at most 2 re-timings per
    # communication op (its rank's transfers going from none to some, and back)
    compute_streams, k = _ints(iw, k, n_ranks, 0)
    seen_res, k = _ints(iw, k, n_res, 0)         # 0 / 1
    indeg = iw[k:k + n]
    indeg[:] = structure[_HEADER + 4 * n:_HEADER + 5 * n]
    n_comm = 0
    for i in range(n):
        if flags[i] & 2 != 0:
            n_comm += 1
        if flags[i] & 1 != 0 and seen_res[resource[i]] == 0:
            seen_res[resource[i]] = 1
            compute_streams[rank[i]] += 1
    most = 0
    for r in range(n_ranks):
        most = max(most, compute_streams[r])
    n_events = 2 * n + 2 * n_comm * most + 1
    fw = np.empty(7 * n + 5 * n + 5 * n_events)
    fw[:7 * n] = 0.0
    ready_t, start, end, arrive = fw[:n], fw[n:2 * n], fw[2 * n:3 * n], fw[3 * n:4 * n]
    rem, rate_of, since = fw[4 * n:5 * n], fw[5 * n:6 * n], fw[6 * n:7 * n]
    q = fw[7 * n:12 * n].reshape((n, 5))
    ev = fw[12 * n:].reshape((n_events, 5))
    size = 0
    seq = 0
    slow = 1.0 / (1.0 + overlap_slowdown)

    for i in range(n):
        if indeg[i] == 0:
            size = _push(ev, 0, size, 0.0, _READY, seq, i, 0)
            seq += 1
    done = 0
    # pending work of try_start / begin_transfer / retime, run inline below (numba has no closures
    # over mutable state): a resource to try, or a rank to re-time
    while size > 0:
        size = _pop(ev, 0, size)
        t = ev[size, 0]
        prio = int(ev[size, 1])
        i = int(ev[size, 3])
        v = int(ev[size, 4])
        if prio == _READY:
            res = resource[i]
            qsize[res] = _push(q, lo[res], qsize[res], topo[i], 0, 0, i, 0)
        else:
            if v != version[i]:
                continue   # a re-timed compute op: this finish time is stale
            end[i] = t
            done += 1
            r = rank[i]
            if linked[i]:    # a compute op running under the overlap slowdown
                linked[i] = 0
                if prv[i] >= 0:
                    nxt[prv[i]] = nxt[i]
                else:
                    head[r] = nxt[i]
                if nxt[i] >= 0:
                    prv[nxt[i]] = prv[i]
                else:
                    tail[r] = prv[i]
            if flags[i] & 2 != 0:
                comm_active[r] -= 1
                if overlap_slowdown != 0.0 and comm_active[r] == 0:
                    size, seq = _retime(r, t, comm_active, head, nxt, rem, rate_of, since, ver, version, slow,
                                        ev, size, seq)
            res = resource[i]
            busy[res] = 0
            for e in range(succ_ptr[i], succ_ptr[i + 1]):
                s = succ_idx[e]
                rt = t + delay[e]
                if rt >= ready_t[s]:
                    ready_t[s] = rt
                    binding[s] = i
                indeg[s] -= 1
                if indeg[s] == 0:
                    size = _push(ev, 0, size, t if t > ready_t[s] else ready_t[s], _READY, seq, s, 0)
                    seq += 1
        # try_start(res, t)
        if busy[res] or qsize[res] == 0:
            continue
        qsize[res] = _pop(q, lo[res], qsize[res])
        i = int(q[lo[res] + qsize[res], 3])
        busy[res] = 1
        arrive[i] = t
        prev = last_on_res[res]
        if prev >= 0 and end[prev] >= ready_t[i]:
            binding[i] = prev
        last_on_res[res] = i
        g = group[i]
        if g >= 0:
            arrived[g] += 1
            if arrived[g] == group_ptr[g + 1] - group_ptr[g]:
                size, seq = _begin_transfer(members[group_ptr[g]:group_ptr[g + 1]], t, dur, arrive, topo, start,
                                            binding, rank, comm_active, overlap_slowdown, head, nxt, rem, rate_of,
                                            since, ver, version, slow, ev, size, seq, -1)
            continue
        start[i] = t
        if flags[i] & 2 != 0:
            size, seq = _begin_transfer(members[0:0], t, dur, arrive, topo, start, binding, rank, comm_active,
                                        overlap_slowdown, head, nxt, rem, rate_of, since, ver, version, slow, ev,
                                        size, seq, i)
        elif flags[i] & 1 != 0 and overlap_slowdown != 0.0:
            r = rank[i]
            rate = slow if comm_active[r] != 0 else 1.0
            rem[i] = dur[i]
            rate_of[i] = rate
            since[i] = t
            ver[i] = 0
            linked[i] = 1
            prv[i] = tail[r]
            nxt[i] = -1
            if tail[r] >= 0:
                nxt[tail[r]] = i
            else:
                head[r] = i
            tail[r] = i
            size = _push(ev, 0, size, t + dur[i] / rate, _FINISH, seq, i, 0)
            seq += 1
        else:
            size = _push(ev, 0, size, t + dur[i], _FINISH, seq, i, 0)
            seq += 1
    makespan = 0.0
    for i in range(n):
        if i == 0 or end[i] > makespan:
            makespan = end[i]
    parts = exposure(start, end, cat, makespan)
    return start, end, arrive, binding, done, parts, makespan


@njit(nogil=True)
def _retime(r, t, comm_active, head, nxt, rem, rate_of, since, ver, version, slow, ev, size, seq):
    """Rank r's running compute ops continue at the rate its transfers in flight allow from t."""
    rate = slow if comm_active[r] != 0 else 1.0
    i = head[r]
    while i >= 0:
        rem[i] -= (t - since[i]) * rate_of[i]
        rate_of[i] = rate
        since[i] = t
        ver[i] += 1
        version[i] = ver[i]
        left = rem[i] if not (0.0 > rem[i]) else 0.0
        size = _push(ev, 0, size, t + left / rate, _FINISH, seq, i, ver[i])
        seq += 1
        i = nxt[i]
    return size, seq


@njit(nogil=True)
def _begin_transfer(members, t, dur, arrive, topo, start, binding, rank, comm_active, overlap_slowdown, head, nxt,
                    rem, rate_of, since, ver, version, slow, ev, size, seq, single):
    """Every member starts at t and ends after the longest member's duration; each rank involved
    counts one more transfer in flight (in the order its first member is listed). `single`: an
    unmatched communication op instead of `members`."""
    k = members.shape[0] if single < 0 else 1
    d = 0.0
    last = -1
    for j in range(k):
        m = members[j] if single < 0 else single
        if j == 0 or dur[m] > d:
            d = dur[m]
        if j == 0 or arrive[m] > arrive[last] or (arrive[m] == arrive[last] and topo[m] > topo[last]):
            last = m
    for j in range(k):
        m = members[j] if single < 0 else single
        start[m] = t
        if m != last:
            binding[m] = last
        size = _push(ev, 0, size, t + d, _FINISH, seq, m, 0)
        seq += 1
    for j in range(k):
        m = members[j] if single < 0 else single
        r = rank[m]
        first = True
        for jj in range(j):
            if rank[members[jj]] == r:
                first = False
                break
        if not first:
            continue
        comm_active[r] += 1
        if overlap_slowdown != 0.0 and comm_active[r] == 1:
            size, seq = _retime(r, t, comm_active, head, nxt, rem, rate_of, since, ver, version, slow, ev, size, seq)
    return size, seq


# -------------------------------------------------------------------------------- exposure split
# Interval lists are (starts, ends, count) in preallocated buffers. A union of intervals is kept as
# blocks._measure returns it: disjoint, in order, touching intervals joined, empty ones dropped; that
# form is unique, so building it by merging sorted lists gives the same floats as sorting their
# concatenation, and lengths are summed left to right as there.
@njit(nogil=True)
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


@njit(nogil=True)
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


@njit(nogil=True)
def _union_of(order, start, end, cat, want, oa, ob) -> int:
    """The union of the spans of the ops of category `want`."""
    m = 0
    for i in order:
        if cat[i] == want:
            m = _add_interval(oa, ob, m, start[i], end[i])
    return m


@njit(nogil=True)
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


@njit(nogil=True)
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


@njit(nogil=True)
def _length(a, b, m) -> float:
    total = 0.0
    for j in range(m):
        total += b[j] - a[j]
    return total


@njit(nogil=True)
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
    parts = np.zeros(_N_PARTS)
    mc = _union_of(order, start, end, cat, _COMPUTE, ca, cb)
    parts[0] = _length(ca, cb, mc)
    for k in range(_N_COMM):
        mm = _union_of(order, start, end, cat, _FIRST_COMM + k, ma, mb)
        if mm == 0:
            continue        # nothing exposed, nothing newly covered
        me = _subtract(ma, mb, mm, ca, cb, mc, ea, eb)
        parts[_PART_OF_COMM[k]] += _length(ea, eb, me)
        mc = _union(ca, cb, mc, ea, eb, me, ta, tb)
        ca, cb, ta, tb = ta, tb, ca, cb
    mo = _union_of(order, start, end, cat, _MEMCPY, ma, mb)
    me = _subtract(ma, mb, mo, ca, cb, mc, ea, eb)
    parts[_OFFLOAD] = _length(ea, eb, me)
    mc = _union(ca, cb, mc, ma, mb, mo, ta, tb)
    idle = makespan - _length(ta, tb, mc)
    parts[0] += idle if idle > 0.0 else 0.0
    return parts


__all__ = ["HAVE_NUMBA", "PARTS", "exposure", "pack", "pack_and_replay", "pack_block", "pack_graph", "pack_rows",
           "replay_arrays", "replay_summary"]
