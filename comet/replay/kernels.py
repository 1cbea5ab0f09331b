"""Compiled inner loops of the step replay (numba when installed; callers keep a numpy fallback).

The static-order pipeline schedule is a DAG whose longest path is the step: a task ends at
max(its stage's previous task, the task it waits for on another stage, its release) + duration.
`longest_path` visits every task once, in an order that respects both kinds of dependencies: each
stage advances as far as its cross-stage inputs allow, round-robin over stages (Kahn's algorithm
specialised to one chain per stage, sweeping down then up). The arithmetic per task is the event engine's (`max` then `+`),
so with overlap slowdown off the end times are bit-identical to replaying every op.
"""

from __future__ import annotations

import numpy as np

try:  # numba is optional: without it the pipeline solver uses vectorised numpy (comet/replay/pipeline.py)
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is not installed
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        def wrap(fn):
            return fn
        return wrap if not (args and callable(args[0])) else args[0]


@njit(inline="always")
def task_at(interleaved: bool, pp: int, vpp: int, total: int, w: int, j: int):
    """(forward?, chunk, micro-batch) of a stage's task j (schedule.all_stage_tasks, element by element):
    w warm-up forwards, then one forward and one backward in turn, then the remaining backwards; total
    = micro-batches x chunks. Interleaved: Megatron's get_model_chunk_id / microbatch id."""
    if j < w:
        fwd, index = True, j
    elif j < 2 * total - w:
        q = j - w
        if q & 1 == 0:
            fwd, index = True, w + (q >> 1)
        else:
            fwd, index = False, q >> 1
    else:
        fwd, index = False, j - total
    if interleaved:
        group = index // (pp * vpp)
        in_group = index % (pp * vpp)
        c = in_group // pp if fwd else vpp - 1 - in_group // pp
        b = group * pp + in_group % pp
    else:
        c, b = 0, index
    return fwd, c, b


@njit(cache=True, nogil=True)
def longest_path(src: np.ndarray, dur: np.ndarray, release: np.ndarray, offset: np.ndarray):
    """End time of every task, and whether every task could be scheduled (False: a dependency cycle).
    src[i] = global index of the task i waits for on another stage (n: none); stage s owns
    [offset[s], offset[s+1])."""
    n = dur.shape[0]
    pp = offset.shape[0] - 1
    end = np.zeros(n + 1)
    done = np.zeros(n + 1, dtype=np.bool_)
    done[n] = True
    ptr = offset[:-1].copy()
    left = n
    down = True
    while left > 0:
        progressed = False
        for k in range(pp):
            s = k if down else pp - 1 - k      # forwards flow down the pipeline, backwards up
            i = ptr[s]
            hi = offset[s + 1]
            prev = end[i - 1] if i > offset[s] else 0.0
            while i < hi and done[src[i]]:
                t = end[src[i]]
                if release[i] > t:
                    t = release[i]
                if prev > t:
                    t = prev
                prev = t + dur[i]
                end[i] = prev
                done[i] = True
                i += 1
            if i != ptr[s]:
                left -= i - ptr[s]
                ptr[s] = i
                progressed = True
        if not progressed:
            return end[:n], False
        down = not down
    return end[:n], True


@njit(cache=True, nogil=True)
def serial_stream(ready: np.ndarray, dur: np.ndarray, t0: float) -> np.ndarray:
    """End times of ops run one after another on one stream in ready order (stable), each starting no
    earlier than its ready time nor t0. Same arithmetic as the event engine."""
    order = np.argsort(ready, kind="mergesort")
    ends = np.empty(ready.shape[0])
    t = t0
    for k in range(order.shape[0]):
        i = order[k]
        if ready[i] > t:
            t = ready[i]
        t = t + dur[i]
        ends[k] = t
    return ends


@njit(cache=True, nogil=True)
def pipeline_tasks(interleaved: bool, pp: int, vpp: int, m: int, warm: np.ndarray, f_dur: np.ndarray,
                   b_dur: np.ndarray, f_release: np.ndarray):
    """The whole task level in one pass: each stage's task order (schedule.all_stage_tasks, element by
    element: warm-up forwards, 1F1B pairs, drain), the cross-stage dependencies, and the end times
    (as longest_path). Returns the StagePrograms arrays (phase, chunk, mb, dur, src, release), the end
    times, the global index of the last backward of every (stage, chunk), and whether every task was
    scheduled (False: a dependency cycle)."""
    per = 2 * m * vpp
    n = pp * per
    total = m * vpp
    last_vs = pp * vpp - 1
    phase = np.empty(n, dtype=np.int64)
    chunk = np.empty(n, dtype=np.int64)
    mb = np.empty(n, dtype=np.int64)
    src = np.empty(n, dtype=np.int64)
    dur = np.empty(n)
    release = np.zeros(n)
    end = np.empty(n)
    pos = np.full((pp, 2, vpp, m), -1, dtype=np.int64)     # (stage, phase, chunk, mb) -> global index
    ptr = np.zeros(pp, dtype=np.int64)
    prev = np.zeros(pp)
    left = n
    down = True
    while left > 0:
        progressed = False
        for k in range(pp):
            s = k if down else pp - 1 - k
            j = ptr[s]
            w = warm[s]
            while j < per:
                fwd, c, b = task_at(interleaved, pp, vpp, total, w, j)
                ph = 0 if fwd else 1
                vs = c * pp + s
                sv = vs - 1 if fwd else vs + 1
                t = 0.0
                sidx = n
                if sv >= 0 and sv <= last_vs:
                    sidx = pos[sv % pp, ph, sv // pp, b]
                    if sidx < 0:
                        break                              # its input is not computed yet
                    t = end[sidx]
                g = s * per + j
                if fwd and b == 0:
                    release[g] = f_release[s, c]
                    if release[g] > t:
                        t = release[g]
                if prev[s] > t:
                    t = prev[s]
                d = f_dur[s, c] if fwd else b_dur[s, c]
                prev[s] = t + d
                end[g] = prev[s]
                dur[g] = d
                src[g] = sidx
                phase[g] = ph
                chunk[g] = c
                mb[g] = b
                pos[s, ph, c, b] = g
                j += 1
            if j != ptr[s]:
                left -= j - ptr[s]
                ptr[s] = j
                progressed = True
        if not progressed:
            break
        down = not down
    last_b = pos[:, 1, :, m - 1].copy()
    return phase, chunk, mb, dur, src, release, end, last_b, left == 0


# A task's code in a visit order (pipeline_summary records it, replay_in_order reads it): the visit
# position of the task it waits for on another stage (n: none) in the low 32 bits, 2 flag bits, then
# its kind (stage * 2 + phase) * vpp + chunk from bit 34.
FIRST_FORWARD, LAST_BACKWARD = 1, 2


@njit(cache=True, nogil=True)
def pipeline_summary(interleaved: bool, pp: int, vpp: int, m: int, warm: np.ndarray, f_dur: np.ndarray,
                     b_dur: np.ndarray, f_release: np.ndarray):
    """pipeline_tasks without the per-task arrays: what the step replay reads of the task level.
    Returns, per stage, the end of its last task, the start of every chunk's last backward (pp, vpp),
    the idle time waiting for other stages (bubble) and waiting for a parameter all-gather (a first
    forward that starts at its release, its input having arrived earlier); whether every task was
    scheduled; and the visit order's codes (the schedule's DAG does not depend on durations, so
    replay_in_order replays another candidate of this shape from them). The same order and arithmetic
    as pipeline_tasks, task by task."""
    per = 2 * m * vpp
    total = m * vpp
    n = pp * per
    at = np.full((pp, 2, vpp, m), -1, dtype=np.int64)     # (stage, phase, chunk, mb) -> visit position
    end = np.empty(n + 1)
    end[n] = 0.0                                           # "no dependency"
    code = np.empty(n, dtype=np.int64)
    ptr = np.zeros(pp, dtype=np.int64)
    prev = np.zeros(pp)
    last_b_start = np.zeros((pp, vpp))
    bubble = np.zeros(pp)
    gather_wait = np.zeros(pp)
    i = 0
    down = True
    while i < n:
        progressed = False
        for k in range(pp):
            s = k if down else pp - 1 - k
            j = ptr[s]
            w = warm[s]
            while j < per:
                fwd, c, b = task_at(interleaved, pp, vpp, total, w, j)
                ph = 0 if fwd else 1
                # the previous virtual stage (forward) or the next one (backward): vs = chunk * pp + stage
                if fwd:
                    ss, cc = (s - 1, c) if s > 0 else (pp - 1, c - 1)
                else:
                    ss, cc = (s + 1, c) if s < pp - 1 else (0, c + 1)
                src = n
                if cc >= 0 and cc < vpp:
                    src = at[ss, ph, cc, b]
                    if src < 0:
                        break                              # its input is not computed yet
                t = end[src]
                src_end = t
                r = f_release[s, c] if (fwd and b == 0) else 0.0
                if r > t:
                    t = r
                start = prev[s] if prev[s] > t else t
                gap = start - prev[s]
                if r > 0.0 and start == r and src_end < start:
                    gather_wait[s] += gap
                else:
                    bubble[s] += gap
                flag = 0
                if fwd and b == 0:
                    flag = FIRST_FORWARD
                elif not fwd and b == m - 1:
                    flag = LAST_BACKWARD
                    last_b_start[s, c] = start
                prev[s] = start + (f_dur[s, c] if fwd else b_dur[s, c])
                end[i] = prev[s]
                code[i] = src | (flag << 32) | (((s * 2 + ph) * vpp + c) << 34)
                at[s, ph, c, b] = i
                i += 1
                j += 1
            if j != ptr[s]:
                ptr[s] = j
                progressed = True
        if not progressed:
            break
        down = not down
    return prev, last_b_start, bubble, gather_wait, i == n, code


@njit(cache=True, nogil=True)
def replay_in_order(code: np.ndarray, pp: int, vpp: int, dur: np.ndarray, f_release: np.ndarray,
                    end: np.ndarray):
    """pipeline_summary over the visit order it recorded for this shape: one pass, no schedule logic. The
    same arithmetic per task as pipeline_summary, and each stage's tasks in the same order, so the
    results are equal bit for bit. dur[(stage * 2 + phase) * vpp + chunk]: task durations;
    f_release[stage * vpp + chunk]; end: scratch of at least len(code) + 1 + pp.
    Returns (compute_end, last_b_start (pp, vpp), bubble, gather_wait)."""
    history, bubble, gather_wait = np.zeros((1, pp)), np.zeros(pp), np.zeros(pp)
    last_b_start = np.zeros(pp * vpp)
    replay_window(code, pp, vpp, dur, f_release, end, history, bubble, gather_wait, last_b_start, _NO_LAST)
    return history[0], last_b_start.reshape((pp, vpp)), bubble, gather_wait


_NO_LAST = np.zeros((0, 0), dtype=np.int64)     # replay_window with a history of one row: nothing to carry


@njit(cache=True, nogil=True)
def replay_window(code: np.ndarray, pp: int, vpp: int, dur: np.ndarray, f_release: np.ndarray, end: np.ndarray,
                  history: np.ndarray, bubble: np.ndarray, gather_wait: np.ndarray, last_b_start: np.ndarray,
                  last: np.ndarray) -> None:
    """Replay the tasks of a visit order (a window of position_windows', or a whole schedule's) from a
    state, in place. history[b, s]: the end of stage s's (b + 1)-th last task before the window (row 0:
    its clock, which advances over its tasks); bubble[s] / gather_wait[s]: its idle sums; a chunk's last
    backward writes its start to last_b_start[stage * vpp + chunk]. A task waiting on the task b before
    the window on stage t reads end[len(code) + 1 + b * pp + t], set here from history. With more than one
    row, history's rows 1.. are then carried over the window: last[b, s] is the window position of stage
    s's (b + 1)-th last task in it, or -1 - r for history row r (position_windows; empty: not carried,
    the last window). end: scratch of at least len(code) + 1 + history rows x pp."""
    n = code.shape[0]
    depth = history.shape[0]
    end[n] = 0.0                                           # "no dependency"
    for b in range(depth):
        for s in range(pp):
            end[n + 1 + b * pp + s] = history[b, s]
    prev = history[0]
    # perf: a kind's stage and (stage, chunk) from tables, not integer divisions per task
    stage_of = np.empty(pp * 2 * vpp, dtype=np.int64)
    chunk_of = np.empty(pp * 2 * vpp, dtype=np.int64)
    for kind in range(pp * 2 * vpp):
        stage_of[kind] = kind // (2 * vpp)
        chunk_of[kind] = stage_of[kind] * vpp + kind % vpp
    # perf: each task reads and writes its stage's clock and sums in the arrays: the periodic windows'
    # order (by position) changes stage at every task, where keeping the current stage's in registers
    # (a store and reload at each change) cost ~25% (warm window of GPT-3 1T's pp 64: 23 -> 17 us)
    for i in range(n):
        x = code[i]
        kind = x >> 34
        flag = (x >> 32) & 3
        s = stage_of[kind]
        p = prev[s]
        t = end[x & 0xFFFFFFFF]
        if flag == FIRST_FORWARD:
            src_end = t
            r = f_release[chunk_of[kind]]
            if r > t:
                t = r
            start = p if p > t else t
            if r > 0.0 and start == r and src_end < start:
                gather_wait[s] += start - p
            else:
                bubble[s] += start - p
        else:
            start = p if p > t else t
            bubble[s] += start - p
            if flag == LAST_BACKWARD:
                last_b_start[chunk_of[kind]] = start
        p = start + dur[kind]
        end[i] = p
        prev[s] = p
    for b in range(1, depth if last.shape[0] > 0 else 1):
        for s in range(pp):
            at = last[b, s]
            history[b, s] = end[at] if at >= 0 else end[n + 1 + (-1 - at) * pp + s]


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
def shared_bucket_stream(start: np.ndarray, t0: np.ndarray, window_end: np.ndarray, rate: np.ndarray, head: float,
                         per_layer: float, all_compute: float, n: int, count: int, progressive: bool, dur: float):
    """The DP stream of stages (rows) whose gradient buckets are one chunk's `count` equal buckets of
    `dur` seconds: bucket k is ready at start[r] + step.bucket_ready_offsets (the same arithmetic), the
    stream shares the port as serial_shared_rows. Returns (ends (rows, count), True), or (empty,
    False) when the offsets are not in bucket order (the caller sorts them)."""
    offsets = np.empty(count)
    for k in range(count):
        if progressive and n > 0 and k < count - 1:
            offsets[k] = head + np.ceil(((k + 1) * n) / count) * per_layer
        else:
            offsets[k] = all_compute
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
    merge sort: numpy's stable argsort) and share the port as serial_shared_rows (step._tails' generic
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
                group_of: np.ndarray, offsets: np.ndarray, group_i: np.ndarray, g_dur: np.ndarray,
                emb: np.ndarray, emb_dur: np.ndarray, adam: np.ndarray, link: np.ndarray):
    """Every stage's tail in one pass, where each stage's gradient buckets are one chunk's equal buckets
    ready in bucket order (group g of stage s = group_of[s], -1: no buckets; offsets[g, :count] =
    step.bucket_ready_offsets of the group's chunk, group_i[g] = (chunk, count), g_dur[g] a bucket's
    seconds): the DP stream on the shared port (_port_end's arithmetic), the tied-embedding all-reduce
    of stages `emb` (it starts when both ends are ready), the optimizer (step._tails' arithmetic, in the
    same order). Returns (optimizer_start, optimizer_end, partner_wait, offload) per stage."""
    pp = compute_end.shape[0]
    dp_end = gather_end.copy()
    # perf (i16g-glue): the stream of one stage is a chain of dependent float operations (latency-bound,
    # ~5 ns a bucket); walking the buckets in the outer loop and the stages in the inner one runs the
    # stages' independent chains side by side. Each stage's own operations and their order are those of
    # _port_end; the bucket's seconds at the contended rate (need / rate, the same float) are divided
    # once per stage and the offsets read from a table.
    start = np.empty(pp)
    need_at_rate = np.empty(pp)
    buckets = 0
    for s in range(pp):
        g = group_of[s]
        if g >= 0:
            start[s] = last_b_start[s, group_i[g, 0]]
            need_at_rate[s] = g_dur[g] / rate[s]
            if group_i[g, 1] > buckets:
                buckets = group_i[g, 1]
    for k in range(buckets):
        for s in range(pp):
            g = group_of[s]
            if g < 0 or k >= group_i[g, 1]:
                continue
            need, window_end, r, prev = g_dur[g], compute_end[s], rate[s], dp_end[s]
            ready = start[s] + offsets[g, k]
            begin = ready if ready > prev else prev
            shared = window_end - begin
            shared = 0.0 if shared < 0.0 else shared
            done_in_window = shared * r
            within = begin + need_at_rate[s]                    # both computed: a select, not a branch
            after = begin + shared + (need - done_in_window)
            dp_end[s] = within if need <= done_in_window else after
    partner_wait = np.zeros(pp)
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
    optimizer_start = np.empty(pp)
    optimizer_end = np.empty(pp)
    offload = np.empty(pp)
    for s in range(pp):
        extra = link[s] - adam[s]
        offload[s] = extra if extra > 0.0 else 0.0
        optimizer_start[s] = compute_end[s] if compute_end[s] >= dp_end[s] else dp_end[s]
        optimizer_end[s] = optimizer_start[s] + adam[s] + offload[s]
    return optimizer_start, optimizer_end, partner_wait, offload
