"""Compiled kernels of the periodic task level (comet/replay/periodic.py): a pipeline shape's warm-up,
period and tail windows placed by stage position (position_windows, cut and checked by periodic_windows),
the transient up to a uniform per-period increment (periodic_transient) and the jump plus tail
(periodic_summary). Each window is replayed by kernels.replay_window, the task-by-task arithmetic."""

from __future__ import annotations

import numpy as np

from comet.replay.kernels import _NO_LAST, FIRST_FORWARD, LAST_BACKWARD, njit, replay_window, task_at


@njit(inline="always")
def task_position(interleaved: bool, pp: int, vpp: int, total: int, w: int, fwd: bool, c: int, b: int) -> int:
    """The position in its stage of the task (forward?, chunk, micro-batch): task_at's inverse."""
    index = b
    if interleaved:
        in_chunk = c if fwd else vpp - 1 - c
        index = (b // pp) * pp * vpp + in_chunk * pp + b % pp
    if fwd:
        return index if index < w else 2 * index - w
    j = w + 2 * index + 1
    return j if j < 2 * total - w else index + total


@njit(cache=True, nogil=True)
def position_windows(interleaved: bool, pp: int, vpp: int, m: int, warm: np.ndarray, bounds: np.ndarray,
                     max_depth: int):
    """Visit orders of a schedule's tasks without a sweep: by position in their stage, at a position the
    forwards down the stages then the backwards up. In 1F1B and GPipe a forward's input (the previous
    stage's forward of its micro-batch) sits at the same or an earlier position and a backward's (the
    next stage's) too, so this order is topological; it is checked task by task (ok False otherwise:
    interleaved schedules, whose inputs wrap from the last stage to the first, may fail it).

    The codes come cut into windows: window w holds each stage s's tasks at positions bounds[w, s] <= j
    < bounds[w + 1, s] (bounds[0] = 0, bounds[-1] = 2 m vpp), in that order with their own positions,
    concatenated (offsets), for replay_window from the history the windows before it left: a task
    waiting on the task b before the window on stage t reads end[len(window) + 1 + b * pp + t] (ok False
    where b >= max_depth, or where a task waits on a later window). Returns (codes, offsets, the count of
    each flag in each window (windows, 4), the history rows the windows read (depth), replay_window's
    `last` of each window (windows, max_depth, pp), ok)."""
    per = 2 * m * vpp
    total = m * vpp
    windows = bounds.shape[0] - 1
    # (position, stage) -> the task's index in its window (position-major: the inputs of the tasks at
    # one position are a few cache lines)
    place = np.full(per * pp, -1, dtype=np.int64)
    offsets = np.zeros(windows + 1, dtype=np.int64)
    for w in range(windows):
        offsets[w + 1] = offsets[w]
        for s in range(pp):
            offsets[w + 1] += bounds[w + 1, s] - bounds[w, s]
    code = np.empty(offsets[windows], dtype=np.int64)
    flags = np.zeros((max(windows, 1), 4), dtype=np.int64)
    last = np.empty((max(windows, 1), max_depth, pp), dtype=np.int64)
    depth = 1
    # the tasks at the current position: forwards in stage order from the front, backwards in reverse
    # stage order from the back
    todo = np.empty(pp, dtype=np.int64)
    chunks = np.empty(pp, dtype=np.int64)
    mbs = np.empty(pp, dtype=np.int64)
    # perf: window by window, its fill count and flag counts in registers (91 -> 76 us, GPT-3 1T pp 64)
    for w in range(windows):
        lo, hi = bounds[w], bounds[w + 1]
        size = offsets[w + 1] - offsets[w]
        out = code[offsets[w]:offsets[w + 1]]
        k = 0
        firsts = lasts = 0
        for j in range(lo.min(), hi.max()):
            nf = 0
            nb = pp
            for s in range(pp):
                if j < lo[s] or j >= hi[s]:
                    continue
                fwd, c, b = task_at(interleaved, pp, vpp, total, warm[s], j)
                chunks[s], mbs[s] = c, b
                if fwd:
                    todo[nf] = s
                    nf += 1
                else:
                    nb -= 1
                    todo[nb] = s
            for t in range(nf + pp - nb):
                s = todo[t if t < nf else nb + t - nf]
                fwd = t < nf
                c, b = chunks[s], mbs[s]
                ph = 0 if fwd else 1
                ns = size                                  # "no dependency"
                # the previous virtual stage (forward) or the next one (backward): vs = chunk * pp + stage
                if fwd:
                    ss, cc = (s - 1, c) if s > 0 else (pp - 1, c - 1)
                else:
                    ss, cc = (s + 1, c) if s < pp - 1 else (0, c + 1)
                if cc >= 0 and cc < vpp:
                    js = task_position(interleaved, pp, vpp, total, warm[ss], fwd, cc, b)
                    src = place[js * pp + ss]
                    if src < 0 or js >= hi[ss]:
                        return code, offsets, flags, depth, last, False  # its input comes later
                    if js < lo[ss]:                        # an earlier window's: history row `back`
                        back = lo[ss] - 1 - js
                        if back >= max_depth:
                            return code, offsets, flags, depth, last, False
                        depth = max(depth, back + 1)
                        src = size + 1 + back * pp + ss
                    ns = src
                flag = 0
                if fwd and b == 0:
                    flag = FIRST_FORWARD
                    firsts += 1
                elif not fwd and b == m - 1:
                    flag = LAST_BACKWARD
                    lasts += 1
                place[j * pp + s] = k
                out[k] = ns | (flag << 32) | (((s * 2 + ph) * vpp + c) << 34)
                k += 1
        flags[w, FIRST_FORWARD] = firsts
        flags[w, LAST_BACKWARD] = lasts
        flags[w, 0] = size - firsts - lasts
        for s in range(pp):                                # each stage's last tasks, for the history
            count = hi[s] - lo[s]
            for b in range(max_depth):
                last[w, b, s] = place[(hi[s] - 1 - b) * pp + s] if b < count else -1 - (b - count)
    return code, offsets, flags, depth, last, True


@njit(cache=True, nogil=True)
def periodic_windows(interleaved: bool, pp: int, vpp: int, m0: int, q: int, steady_warmup: int, per_stage: int,
                     max_depth: int):
    """periodic._windows' visit orders in one compiled call (perf: the Python around position_windows,
    the warm-up counts, bounds, slicing, checks and copies, cost ~20 us of a shape's ~100): the warm
    window, two periods and the tail (the last period and the drain) of the schedule of m0 + 3q
    micro-batches, cut where each stage's prefix in the schedule of k micro-batches ends (2 k vpp - its
    warm-up forwards: past m0 its drain starts there). Returns (ok, warm, warm_last, period, period_last,
    tail); ok False where the periods differ (same_window, or the history rows they leave), a period
    reads a release or a last backward, the warm window misses a release or the tail a last backward,
    or position_windows refuses the order."""
    big = m0 + 3 * q
    total = big * vpp
    warm_up = np.empty(pp, dtype=np.int64)
    for s in range(pp):
        warm_up[s] = min(steady_warmup - per_stage * s, total)
    bounds = np.empty((5, pp), dtype=np.int64)
    for s in range(pp):
        bounds[0, s] = 0
        for w in range(3):
            bounds[w + 1, s] = 2 * (m0 + w * q) * vpp - warm_up[s]
        bounds[4, s] = 2 * total
    orders, offsets, flags, depth, last, ok = position_windows(interleaved, pp, vpp, big, warm_up, bounds, max_depth)
    empty = np.empty(0, dtype=np.int64)
    no_last = np.empty((0, pp), dtype=np.int64)
    if not ok:
        return False, empty, no_last, empty, no_last, empty
    first, second = orders[offsets[1]:offsets[2]], orders[offsets[2]:offsets[3]]
    same = same_window(first, second, pp, vpp)
    for b in range(depth):
        for s in range(pp):
            if last[1, b, s] != last[2, b, s]:
                same = False
    # every release is read in the warm window, every last backward in the tail, none in a period
    kinds = pp * vpp
    if not same or flags[0, 1] != kinds or flags[3, 2] != kinds or flags[1, 1] != 0 or flags[1, 2] != 0:
        return False, empty, no_last, empty, no_last, empty
    return (True, orders[offsets[0]:offsets[1]].copy(), last[0, :depth].copy(), first.copy(), last[1, :depth].copy(),
            orders[offsets[3]:offsets[4]].copy())


@njit(cache=True, nogil=True)
def same_window(a: np.ndarray, b: np.ndarray, pp: int, vpp: int) -> bool:
    """Whether two windows of position_windows are the same subgraph, whatever order they were visited in:
    per stage, the same kinds and flags at the same positions, each waiting on the same (stage,
    position) in its window or on the same entry of the history before it."""
    n = a.shape[0]
    if b.shape[0] != n:
        return False
    mask = np.int64(0xFFFFFFFF)
    keys = np.empty((2, n, 3), dtype=np.int64)            # (stage, position) -> (kind | flags, src stage, src position)
    for w in range(2):
        x = a if w == 0 else b
        count = np.zeros(pp, dtype=np.int64)
        stage = np.empty(n, dtype=np.int64)
        pos = np.empty(n, dtype=np.int64)
        for i in range(n):
            s = (x[i] >> 34) // (2 * vpp)
            stage[i] = s
            pos[i] = count[s]
            count[s] += 1
        first = np.zeros(pp + 1, dtype=np.int64)
        for s in range(pp):
            first[s + 1] = first[s] + count[s]
        for i in range(n):
            src = x[i] & mask
            slot = first[stage[i]] + pos[i]
            keys[w, slot, 0] = x[i] >> 32
            if src < n:
                keys[w, slot, 1], keys[w, slot, 2] = stage[src], pos[src]
            elif src == n:
                keys[w, slot, 1], keys[w, slot, 2] = -1, -1
            else:
                keys[w, slot, 1], keys[w, slot, 2] = src - n - 1, -2
    for i in range(n):
        for c in range(3):
            if keys[0, i, c] != keys[1, i, c]:
                return False
    return True


@njit(cache=True, nogil=True)
def periodic_transient(warm: np.ndarray, warm_last: np.ndarray, period: np.ndarray, period_last: np.ndarray,
                       pp: int, vpp: int, dur: np.ndarray, f_release: np.ndarray, end: np.ndarray, max_periods: int,
                       tol_ulps: float, max_span: float):
    """The task level's state after the `warm` window and then up to max_periods replays of the
    one-period window `period`, stopping after the first period that advances every stage's history
    (its clock and the ends of the tasks before it that later windows read: warm_last's rows) by the
    same amount (within tol_ulps ulps of the largest clock, and the clocks within max_span periods of
    that amount: periodic.py says why this bounds the error). Returns (state (rows + 3, pp): the
    history rows, each stage's bubble, gather wait and the last period's bubble; the period's
    increment; periods replayed; whether the increment was uniform)."""
    rows = warm_last.shape[0]
    state = np.zeros((rows + 3, pp))
    history = state[:rows]
    bubble, gather_wait, step_bubble = state[rows], state[rows + 1], state[rows + 2]
    last_b_start = np.zeros(pp * vpp)
    replay_window(warm, pp, vpp, dur, f_release, end, history, bubble, gather_wait, last_b_start, warm_last)
    before = np.empty((rows, pp))
    step_wait = np.zeros(pp)
    for k in range(max_periods):
        before[:] = history
        step_bubble[:] = 0.0
        step_wait[:] = 0.0
        # a period's idle sums start from zero: its per-period bubble is exact, not a difference of sums
        replay_window(period, pp, vpp, dur, f_release, end, history, step_bubble, step_wait, last_b_start,
                      period_last)
        top = 0.0
        for s in range(pp):
            bubble[s] += step_bubble[s]
            gather_wait[s] += step_wait[s]
            if abs(history[0, s]) > top:
                top = abs(history[0, s])
        lam = history[0, 0] - before[0, 0]
        uniform = lam > 0.0 and top <= max_span * lam
        tol = tol_ulps * 2.220446049250313e-16 * top
        for s in range(pp):
            if step_wait[s] != 0.0:
                uniform = False
            for r in range(rows):
                if abs((history[r, s] - before[r, s]) - lam) > tol:
                    uniform = False
        if uniform:
            return state, lam, k + 1, True
    return state, 0.0, max_periods, False


@njit(cache=True, nogil=True)
def periodic_summary(tail: np.ndarray, pp: int, vpp: int, dur: np.ndarray, f_release: np.ndarray, end: np.ndarray,
                     state: np.ndarray, lam: float, jump: int):
    """The task level of a schedule from a transient's state (periodic_transient's), `jump` periods on:
    each history entry + jump * lam and each bubble + jump * its period's, then the tail window replayed.
    Returns (compute_end, last_b_start (pp, vpp), bubble, gather_wait), as pipeline_summary."""
    rows = state.shape[0] - 3
    history = state[:rows] + jump * lam
    bubble = state[rows] + jump * state[rows + 2]
    gather_wait = state[rows + 1].copy()
    last_b_start = np.zeros(pp * vpp)
    replay_window(tail, pp, vpp, dur, f_release, end, history, bubble, gather_wait, last_b_start, _NO_LAST)
    return history[0], last_b_start.reshape((pp, vpp)), bubble, gather_wait
