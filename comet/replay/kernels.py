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

    from comet.replay import kernel_cache
    kernel_cache.install()      # cached kernels stamped with every source they compile in
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


@njit(nogil=True)
def first_forward_start(p: float, t: float, r: float) -> tuple[float, bool]:
    """A micro-batch's first forward on a stage free at p, its input there at t, its parameters gathered
    at r (0: none): its start, and whether it waited on the gather (it starts at r, its input there
    earlier: gather wait, not bubble)."""
    src_end = t
    if r > t:
        t = r
    start = p if p > t else t
    return start, r > 0.0 and start == r and src_end < start


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
            start, gathered = first_forward_start(p, t, f_release[chunk_of[kind]])
            if gathered:
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
