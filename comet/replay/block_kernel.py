"""The event engine (comet/replay/engine.py) and the exposure split (comet/replay/blocks.py) compiled
with numba, over a block packed into arrays.

Same semantics and the same float operations in the same order as the Python engine, which stays the
reference (tests/replay/test_block_kernel.py: equal bit for bit on random graphs and on every block
of every shipped model): events ordered by (time, priority, sequence), one op at a time per (rank,
stream) taken in topological order, collectives starting when their last member arrives, compute
re-timed while a transfer is in flight on its rank.

A block is packed into arrays (block_pack.py): one int64 array holding every structure the loop reads,
one float array of edge delays. `replay_tables` packs and replays the blocks built with their op tables,
several in one call; `replay_summary` replays a block packed from its ops (packed once per content, the
structure kept by the caller). The exposure split of each replay is block_exposure.py's, compiled
apart (called once a block). The engine's helpers are inlined (`inline="always"`): called as functions,
numba counts references on every array argument. numba inlines a copy at every call site, nested, and
compile time grows with them (inlining exposure and both _begin_transfer sites doubled the first
compile, 36 -> 64 s): each helper has one call site where it can (docs/cold-path.md, i24k).

The entry points here compile in helpers of block_pack.py and block_exposure.py; numba's on-disk cache
is stamped with all of comet's replay, graph and hardware sources (kernel_cache.py), so editing those
recompiles these.
"""

from __future__ import annotations

import numpy as np

from comet.graph.op_table import N_OPS
from comet.replay.block_exposure import N_PARTS, exposure
from comet.replay.block_pack import FLAGS_CATEGORY_CODES, STRUCTURE_HEADER, structure_of_rows, table_length
from comet.replay.kernels import HAVE_NUMBA, njit

_FINISH, _READY = 0, 1


def replay_tables(tables: np.ndarray, dur: np.ndarray, overlap_slowdown: float) -> np.ndarray:
    """replay_summary(*pack_rows(table), its ops' durations, overlap_slowdown) of each of the blocks'
    tables laid end to end (graph/op_table.py; `dur`: their ops' durations in the same order), one row
    a table; a row's ops done is -1 where pack_rows is None (the caller packs that block from its ops).
    perf: one compiled call for all the blocks a graph replays for the first time (a dispatch and a
    returned array each: ~3 us hot a block before, more on a cold call's CPU caches); the packing is
    redone on each replay, in compiled code (~0.05 us an op), rather than kept. Equal to the two calls
    (tests/replay/test_block_kernel.py)."""
    return _replay_tables(tables, FLAGS_CATEGORY_CODES, dur, overlap_slowdown)


@njit(cache=True, nogil=True)
def _replay_tables(tables, flags_category, dur, overlap_slowdown):
    n_tables = 0
    pos = 0
    while pos < tables.shape[0]:
        n_tables += 1
        pos += table_length(tables, pos)
    out = np.empty((n_tables, 2 + N_PARTS))
    pos = first = 0
    for b in range(n_tables):
        length = table_length(tables, pos)
        n = int(tables[pos + N_OPS])
        structure = structure_of_rows(tables[pos:pos + length], flags_category)
        if structure.shape[0] == 0:
            out[b, :] = 0.0
            out[b, 0] = -1.0
        else:
            _summary_into(out[b], structure, np.zeros(structure[1]), dur[first:first + n], overlap_slowdown)
        pos += length
        first += n
    return out


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


@njit(inline="always")
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


@njit(inline="always")
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
    out = np.empty(2 + N_PARTS)
    _summary_into(out, structure, delay, dur, overlap_slowdown)
    return out


@njit(inline="always")
def _summary_into(out, structure, delay, dur, overlap_slowdown) -> None:
    _, _, _, _, done, parts, makespan = _replay(structure, delay, dur, overlap_slowdown)
    out[0] = done
    out[1] = makespan
    out[2:] = parts


@njit(cache=True, nogil=True)
def _replay(structure, delay, dur, overlap_slowdown):
    n, n_edges, n_groups, n_members, n_res, n_ranks = (structure[0], structure[1], structure[2], structure[3],
                                                       structure[4], structure[5])
    o = STRUCTURE_HEADER
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
    indeg[:] = structure[STRUCTURE_HEADER + 4 * n:STRUCTURE_HEADER + 5 * n]
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
        if g >= 0 or flags[i] & 2 != 0:
            # a transfer: a matched group's once its last member arrives, else this op's alone (perf: one
            # call site, so one inlined copy of _begin_transfer and the re-timing in it)
            if g >= 0:
                arrived[g] += 1
                if arrived[g] != group_ptr[g + 1] - group_ptr[g]:
                    continue
                first_member, end_member, single = group_ptr[g], group_ptr[g + 1], -1
            else:
                first_member, end_member, single = 0, 0, i
            size, seq = _begin_transfer(members[first_member:end_member], t, dur, arrive, topo, start, binding, rank,
                                        comm_active, overlap_slowdown, head, nxt, rem, rate_of, since, ver, version,
                                        slow, ev, size, seq, single)
            continue
        start[i] = t
        finish = t + dur[i]
        if flags[i] & 1 != 0 and overlap_slowdown != 0.0:
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
            finish = t + dur[i] / rate
        size = _push(ev, 0, size, finish, _FINISH, seq, i, 0)
        seq += 1
    makespan = 0.0
    for i in range(n):
        if i == 0 or end[i] > makespan:
            makespan = end[i]
    parts = exposure(start, end, cat, makespan)
    return start, end, arrive, binding, done, parts, makespan


@njit(inline="always")
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


@njit(inline="always")
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



__all__ = ["HAVE_NUMBA", "replay_arrays", "replay_summary", "replay_tables"]
