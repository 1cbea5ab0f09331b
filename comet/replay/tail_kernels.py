"""Compiled kernels of the stage tails (comet/replay/tails.py, contention.py): a stage's data-parallel stream
of gradient buckets on a NIC port it shares with the backward's inter-node traffic (contention.serial_shared's
arithmetic, bit for bit), and every stage's tail (DP stream, tied-embedding sync, optimizer) in one pass."""

from __future__ import annotations

import numpy as np

from comet.replay.kernels import njit


@njit(inline="always")
def _port_end(ready: float, prev: float, window_end: float, rate: float, need: float) -> float:
    """End of a transfer of `need` port-seconds on a stream free at `prev`, ready at `ready`, at `rate`
    of the port before `window_end` and the full port after (contention.serial_shared's arithmetic)."""
    start = ready if ready > prev else prev
    shared = window_end - start
    if shared < 0.0:
        shared = 0.0
    done_in_window = shared * rate
    if need <= done_in_window:
        return start + need / rate
    return start + shared + (need - done_in_window)


@njit(cache=True, nogil=True)
def serial_shared_rows(ready: np.ndarray, dur: np.ndarray, t0: np.ndarray, window_end: np.ndarray,
                       rate: np.ndarray) -> np.ndarray:
    """contention.serial_shared, row by row (the same arithmetic). dur: (rows, cols) or (1, cols);
    t0, window_end, rate: (rows,) or (1,)."""
    rows, cols = ready.shape
    ends = np.empty((rows, cols))
    for r in range(rows):
        prev = t0[r if t0.shape[0] > 1 else 0]
        w = window_end[r if window_end.shape[0] > 1 else 0]
        q = rate[r if rate.shape[0] > 1 else 0]
        d = r if dur.shape[0] > 1 else 0
        for k in range(cols):
            prev = _port_end(ready[r, k], prev, w, q, dur[d, k])
            ends[r, k] = prev
    return ends


@njit(cache=True, nogil=True)
def nic_rate(nic: np.ndarray, busy: np.ndarray):
    """Per stage the DP stream's share of the port, 1 - min(u, 1/2) with u = nic / busy (0 where
    busy <= 0), and whether any stage's share is below 1 (contention._rate's numpy arithmetic: NaN
    stays NaN as np.minimum keeps it)."""
    rate = np.empty(nic.shape[0])
    shared = False
    for s in range(nic.shape[0]):
        u = nic[s] / busy[s] if busy[s] > 0 else 0.0
        rate[s] = 1.0 - (0.5 if u >= 0.5 else u)
        if rate[s] < 1.0:
            shared = True
    return rate, shared


@njit(inline="always")
def _ready_offset(k: int, count: int, head: float, per_layer: float, all_compute: float, n: int,
                  progressive: bool) -> float:
    """Bucket k's tails.bucket_ready_offsets (the same arithmetic): the first ceil((k+1) n / count)
    layers' backward after the head, the last bucket (or every bucket, where not progressive) at the
    chunk's whole backward."""
    if progressive and n > 0 and k < count - 1:
        return head + np.ceil(((k + 1) * n) / count) * per_layer
    return all_compute


@njit(cache=True, nogil=True)
def shared_bucket_stream(start: np.ndarray, t0: np.ndarray, window_end: np.ndarray, rate: np.ndarray, head: float,
                         per_layer: float, all_compute: float, n: int, count: int, progressive: bool, dur: float):
    """The DP stream of stages (rows) whose gradient buckets are one chunk's `count` equal buckets of
    `dur` seconds: bucket k is ready at start[r] + tails.bucket_ready_offsets (the same arithmetic), the
    stream shares the port as serial_shared_rows. Returns (ends (rows, count), True), or (empty,
    False) when the offsets are not in bucket order (the caller sorts them)."""
    offsets = np.empty(count)
    for k in range(count):
        offsets[k] = _ready_offset(k, count, head, per_layer, all_compute, n, progressive)
    for k in range(1, count):
        if offsets[k] < offsets[k - 1]:
            return np.empty((0, count)), False
    rows = start.shape[0]
    ends = np.empty((rows, count))
    for r in range(rows):
        prev = t0[r]
        w = window_end[r]
        q = rate[r]
        for k in range(count):
            prev = _port_end(start[r] + offsets[k], prev, w, q, dur)
            ends[r, k] = prev
    return ends, True


@njit(cache=True, nogil=True)
def sorted_bucket_stream_end(last_b_start: np.ndarray, rows: np.ndarray, chunk_of: np.ndarray, offsets: np.ndarray,
                             durs: np.ndarray, t0: np.ndarray, window_end: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """The end of each row's DP stream when its buckets span chunks: bucket k is ready at
    last_b_start[rows[r], chunk_of[k]] + offsets[k], the buckets run in stable order of readiness (a
    merge sort: numpy's stable argsort) and share the port as serial_shared_rows (tails._tails' generic
    path, the same arithmetic; tests/replay/test_contention.py)."""
    n, cols = rows.shape[0], offsets.shape[0]
    out = np.empty(n)
    ready = np.empty(cols)
    for r in range(n):
        for k in range(cols):
            ready[k] = last_b_start[rows[r], chunk_of[k]] + offsets[k]
        order = np.argsort(ready, kind="mergesort")
        prev = t0[r]
        for k in range(cols):
            i = order[k]
            prev = _port_end(ready[i], prev, window_end[r], rate[r], durs[i])
        out[r] = prev
    return out


@njit(cache=True, nogil=True)
def stage_tails(last_b_start: np.ndarray, compute_end: np.ndarray, gather_end: np.ndarray, rate: np.ndarray,
                group_of: np.ndarray, group_i: np.ndarray, group_f: np.ndarray, g_dur: np.ndarray,
                emb: np.ndarray, emb_dur: np.ndarray):
    """Every stage's tail in one pass, where each stage's gradient buckets are one chunk's equal buckets
    ready in bucket order. Stage s is in group g = group_of[s]; group_i[g] = (chunk, count, layers,
    progressive) (count 0: no buckets) and group_f[g] = (head, per_layer, all_compute, optimizer
    seconds, host-link seconds), the first three tails._bucket_ready_terms' (they give the offsets of
    tails.bucket_ready_offsets); g_dur[g] a bucket's seconds. The DP stream on the shared port
    (_port_end's arithmetic), the tied-embedding all-reduce of stages `emb` (it starts when both ends
    are ready), the optimizer (tails._tails' arithmetic, in the same order).
    Returns (in bucket order, rows (optimizer_start, optimizer_end, partner_wait, offload, optimizer
    seconds) per stage); where a group's buckets are not ready in bucket order, (False, an empty table)
    and the caller takes the generic path. perf (i20s-step): one table returned, one work table for the
    lanes below (each array a kernel allocates or returns costs ~0.1-0.3 us), the per-group optimizer
    seconds spread to the stages here (a numpy take per graph before)."""
    pp = compute_end.shape[0]
    groups = group_i.shape[0]
    buckets = 0
    for g in range(groups):
        if group_i[g, 1] > buckets:
            buckets = group_i[g, 1]
    # perf (i18s-step): the offsets from each group's readiness terms here, not a table built in numpy
    # per graph (tails._fused_statics: ~30 small numpy calls, ~45 us of a cold call)
    offsets = np.zeros((groups, buckets))
    for g in range(groups):
        count = group_i[g, 1]
        for k in range(count):
            offsets[g, k] = _ready_offset(k, count, group_f[g, 0], group_f[g, 1], group_f[g, 2], group_i[g, 2],
                                          group_i[g, 3] != 0)
            if k > 0 and offsets[g, k] < offsets[g, k - 1]:
                return False, np.empty((5, 0))
    dp_end = gather_end.copy()
    # perf (i16g-glue): the stream of one stage is a chain of dependent float operations (latency-bound,
    # ~5 ns a bucket); walking the buckets outside and the stages inside runs the stages' independent
    # chains side by side. perf (i20s-step): the stages of a group gathered into contiguous lanes
    # (a counting sort by group), so the inner loop reads one group's offset and seconds as scalars and
    # the lanes' inputs as unit-stride arrays, with no per-stage branch: LLVM runs it as SIMD lanes
    # (GPT-3 1T, pp 64, 50 buckets: ~4.5 -> ~1.5 us). Each stage's operations and their order are
    # those of _port_end; the bucket's seconds at the contended rate (need / rate, the same float)
    # are divided once per stage.
    first = np.zeros(groups + 1, dtype=np.int64)      # group g's lanes: first[g]..first[g + 1]
    for s in range(pp):
        if group_i[group_of[s], 1] > 0:
            first[group_of[s] + 1] += 1
    for g in range(groups):
        first[g + 1] += first[g]
    lanes = first[groups]
    stage = np.empty(lanes, dtype=np.int64)
    fill = first[:groups].copy()
    for s in range(pp):
        g = group_of[s]
        if group_i[g, 1] > 0:
            stage[fill[g]] = s
            fill[g] += 1
    work = np.empty((5, lanes))
    start, prev, window, share, need_at_rate = work[0], work[1], work[2], work[3], work[4]
    for g in range(groups):
        for i in range(first[g], first[g + 1]):
            s = stage[i]
            start[i] = last_b_start[s, group_i[g, 0]]
            prev[i] = dp_end[s]
            window[i] = compute_end[s]
            share[i] = rate[s]
            need_at_rate[i] = g_dur[g] / rate[s]
    for g in range(groups):
        need = g_dur[g]
        lo, hi = first[g], first[g + 1]
        # slices indexed from 0: no negative-index wraparound per access (it stops the SIMD lanes)
        g_start, g_prev, g_window, g_share, g_nar = (start[lo:hi], prev[lo:hi], window[lo:hi], share[lo:hi],
                                                     need_at_rate[lo:hi])
        for k in range(group_i[g, 1]):
            offset = offsets[g, k]
            for i in range(hi - lo):
                ready = g_start[i] + offset
                p = g_prev[i]
                begin = ready if ready > p else p
                shared = g_window[i] - begin
                shared = 0.0 if shared < 0.0 else shared
                done_in_window = shared * g_share[i]
                within = begin + g_nar[i]                       # both computed: a select, not a branch
                after = begin + shared + (need - done_in_window)
                g_prev[i] = within if need <= done_in_window else after
    for i in range(lanes):
        dp_end[stage[i]] = prev[i]
    out = np.empty((5, pp))
    optimizer_start, optimizer_end, partner_wait, offload, adam = out[0], out[1], out[2], out[3], out[4]
    partner_wait[:] = 0.0
    if emb.shape[0] > 0:
        both = -np.inf
        for i in range(emb.shape[0]):
            s = emb[i]
            ready = compute_end[s] if compute_end[s] >= dp_end[s] else dp_end[s]
            if ready > both:
                both = ready
        for i in range(emb.shape[0]):
            s = emb[i]
            ready = compute_end[s] if compute_end[s] >= dp_end[s] else dp_end[s]
            partner_wait[s] = both - ready
            dp_end[s] = both + emb_dur[i]
    for s in range(pp):
        adam[s] = group_f[group_of[s], 3]
        extra = group_f[group_of[s], 4] - adam[s]
        offload[s] = extra if extra > 0.0 else 0.0
        optimizer_start[s] = compute_end[s] if compute_end[s] >= dp_end[s] else dp_end[s]
        optimizer_end[s] = optimizer_start[s] + adam[s] + offload[s]
    return True, out
