"""The periodic task level of 1F1B (one model chunk) straight from the schedule's rule: no visit orders.

periodic.py replays a shape's warm window, periods and tail from visit orders (codes) that
periodic_kernels.periodic_windows builds once per shape from a short schedule: ~9 ns a task over
~1.3 x the tasks it then replays, so a first call paid the windows and then the replay (GPT-3 1T, pp 64:
~85 us of ~110). In 1F1B every window is closed-form per stage: stage s runs w_s = pp - 1 - s warm-up
forwards, then forwards and backwards in turn, then drains; at a position j the stages are, from stage
0 up, a block of warm-up forwards (s < pp - 1 - j) or of drain backwards (j >= 2m - w_s), then steady
stages alternating forward and backward (forward where j - w_s is even). Each task waits on its
neighbour's task at position j or j - 1:
  warm-up forward F(s, j) and the first steady forward F(s, w_s)  <- F(s - 1, .) at j (a warm-up forward)
  other steady forwards                                           <- F(s - 1, .) at j - 1
  steady backwards                                                <- B(s + 1, .) at j - 1
  drain backwards                                                 <- B(s + 1, .) at j
so visiting each position's forwards down the stages, then its backwards up, is topological. No steady
task waits on a drain backward, and only warm-up forwards wait on warm-up forwards, so the warm-up
forwards are replayed first and the drain backwards last, each by diagonal (s + j, j - s: the tasks of a
diagonal are independent, where by position they chain along the stages), and every stage's tasks still
in order. A window that starts each stage on a forward (every window periodic.py cuts: its bounds are
2k - w_s) reads nothing before it but each stage's clock (the history of depth 1 that periodic_kernels.periodic_windows
finds for every 1F1B shape; tests/replay/test_periodic_1f1b.py checks pp 1..256). The arithmetic per
task is kernels.replay_window's, task by task, and the transient, jump and tail are periodic_kernels'
periodic_transient and periodic_summary with the windows replayed by rule, so the figures are the codes
path's bit for bit (tested on random shapes, durations and releases).
"""

from __future__ import annotations

import numpy as np

from comet.replay.kernels import first_forward_start, njit


@njit(cache=True, nogil=True)
def replay_rule_window(pp: int, m: int, low: int, high: int, dur: np.ndarray, f_release: np.ndarray,
                       table: np.ndarray, prev: np.ndarray, bubble: np.ndarray, gather_wait: np.ndarray,
                       last_b_start: np.ndarray) -> None:
    """Replay, in place from each stage's clock prev[s], stage s's tasks at positions lo_s <= j < hi_s of
    the 1F1B schedule of m >= pp - 1 micro-batches, lo_s = max(0, low - w_s), hi_s = min(2m, high - w_s),
    w_s = pp - 1 - s: the warm window (low 0, high 2(pp - 1)), a period (low = 2k >= 2(pp - 1), high =
    low + 2), the tail (low = 2(m - 1), high = 2m + pp - 1) or the whole schedule (low 0, high 2m + pp -
    1). dur[stage * 2 + phase], f_release[stage]; table: scratch of (positions + 1) x pp floats (each
    task's end by position, position-major). The arithmetic is kernels.replay_window's, whose
    FIRST_FORWARD tasks are the forwards at position 0 here and whose LAST_BACKWARD ones the backwards at
    2m - 1; each stage's tasks in order, so its idle sums add up in the same order."""
    j0 = max(0, low - pp + 1)
    j1 = min(2 * m, high)
    base = j0 - 1                                  # table row 0: the position before the window
    for s in range(1, pp):                         # a steady backward may read its neighbour's clock: its
        lo = low - (pp - 1 - s)                    # last task before the window, at lo - 1
        if lo > 0:
            table[(lo - 1 - base) * pp + s] = prev[s]
    if j0 == 0 and j1 > 0:
        # the warm-up forwards (j < w_s), first. Position 0: every stage's first forward (micro-batch 0),
        # waiting on the one above and on its parameter gathers
        t = 0.0
        for s in range(pp):
            p = prev[s]
            start, gathered = first_forward_start(p, t, f_release[s])
            if gathered:
                gather_wait[s] += start - p
            else:
                bubble[s] += start - p
            t = prev[s] = table[pp + s] = start + dur[2 * s]
        # then F(s, j) waits on F(s - 1, j) and F(s, j - 1): perf: by diagonal s + j, whose tasks are
        # independent (by position they chain down the stages)
        for d in range(1, pp - 1):
            for s in range(d):
                at = (d - s + 1) * pp + s
                t = table[at - 1] if s > 0 else 0.0
                p = prev[s]
                start = p if p > t else t
                bubble[s] += start - p
                p = start + dur[2 * s]
                prev[s] = p
                table[at] = p
        j0 = 1
    # the steady tasks by position: forwards down the stages, F(s - 1) at j - 1 (at j for the first
    # steady forward, j = w_s, which reads a warm-up forward), then backwards up, B(s + 1) at j - 1
    for j in range(j0, j1):
        row = (j - base) * pp
        sa = max(0, j - high + pp)                 # hi_s > j
        sb = min(pp, j - low + pp)                 # lo_s <= j
        steady = max(sa, pp - 1 - j, pp - 2 * m + j)   # w_s <= j < 2m - w_s: forward where j - w_s is even
        odd = (j - pp + 1 + steady) & 1
        for s in range(steady + odd, sb, 2):
            t = 0.0
            if s > 0:
                t = table[row + s - 1] if s == pp - 1 - j else table[row - pp + s - 1]
            p = prev[s]
            start = p if p > t else t
            bubble[s] += start - p
            p = start + dur[2 * s]
            prev[s] = p
            table[row + s] = p
        b0 = steady + 1 - odd
        for i in range(max(0, (sb - b0 + 1) // 2)):
            s = b0 + 2 * ((sb - b0 + 1) // 2 - 1 - i)
            t = table[row - pp + s + 1] if s < pp - 1 else 0.0
            p = prev[s]
            start = p if p > t else t
            bubble[s] += start - p
            if j == 2 * m - 1:
                last_b_start[s] = start
            p = start + dur[2 * s + 1]
            prev[s] = p
            table[row + s] = p
    if high >= 2 * m + pp - 1:
        # the drain backwards (j >= 2m - w_s), last: B(s, j) waits on B(s + 1, j) and B(s, j - 1)
        # (the first of a stage on steady tasks): perf: by diagonal j - s, whose tasks are independent
        for e in range(2 * m - pp + 1, 2 * m):
            for s in range(min(pp - 1, 2 * m - e)):
                at = (e + s - base) * pp + s
                t = table[at + 1]
                p = prev[s]
                start = p if p > t else t
                bubble[s] += start - p
                if e + s == 2 * m - 1:
                    last_b_start[s] = start
                p = start + dur[2 * s + 1]
                prev[s] = p
                table[at] = p


@njit(cache=True, nogil=True)
def replay_period(pp: int, dur: np.ndarray, before: np.ndarray, prev: np.ndarray, bubble: np.ndarray) -> None:
    """replay_rule_window on a period past the warm-up (low = 2k >= 2(pp - 1), high = low + 2): each
    stage's forward F(s, k), which waits on F(s - 1, k) just replayed, then its backward B(s, k - w_s),
    which waits on stage s + 1's task before the period (its clock `before`). perf: one pass down the
    stages, not pp + 1 positions (a period of pp 64: ~1.5 -> ~0.3 us; m 128 replays up to 64 of them)."""
    t = 0.0
    for s in range(pp):
        p = prev[s]
        start = p if p > t else t
        bubble[s] += start - p
        t = start + dur[2 * s]
        src = before[s + 1] if s < pp - 1 else 0.0
        start = t if t > src else src
        bubble[s] += start - t
        prev[s] = start + dur[2 * s + 1]


@njit(cache=True, nogil=True)
def periodic_1f1b(pp: int, m: int, m0: int, dur: np.ndarray, f_release: np.ndarray, periods: int, tol_ulps: float,
                  max_span: float, known: np.ndarray, known_lam: float, known_replayed: int, out: np.ndarray):
    """periodic_kernels.periodic_transient then periodic_summary for 1F1B, their windows replayed by rule
    (replay_rule_window) in one call: the warm window (each stage's tasks before the drains of m0
    micro-batches), periods until a uniform increment (at most `periods`), the jump to m - 1 and the tail.
    known: a transient's state from an earlier call with these durations (empty: replay it). Writes out
    (8, pp): rows 0-3 the summary (compute_end, last_b_start, bubble, gather_wait, as periodic_summary),
    rows 4-7 the transient's state (periodic_transient's with one history row; known's copied). Returns
    (lam, periods replayed, uniform). perf (i20g-glue): the caller's one array, not five returned (each
    boxed on the way out: ~1.8 us of a ~8 us call)."""
    table = np.empty((max(2 * m0, pp) + 3) * pp)
    last_b_start = out[1]
    state = out[4:]
    if known.shape[0] > 0:
        state[:] = known
        lam, replayed, uniform = known_lam, known_replayed, True
    else:
        state[:] = 0.0
        clock, bubble, gather_wait, step_bubble = state[0], state[1], state[2], state[3]
        replay_rule_window(pp, m, 0, 2 * m0, dur, f_release, table, clock, bubble, gather_wait, last_b_start)
        before = np.empty(pp)
        lam, replayed, uniform = 0.0, periods, False
        for k in range(periods):
            before[:] = clock
            step_bubble[:] = 0.0
            # a period's idle sums start from zero: its per-period bubble is exact, not a difference of sums
            # (and it holds no first forward: no gather wait)
            replay_period(pp, dur, before, clock, step_bubble)
            top = 0.0
            for s in range(pp):
                bubble[s] += step_bubble[s]
                if abs(clock[s]) > top:
                    top = abs(clock[s])
            step_lam = clock[0] - before[0]
            flat = step_lam > 0.0 and top <= max_span * step_lam
            tol = tol_ulps * 2.220446049250313e-16 * top
            for s in range(pp):
                if abs((clock[s] - before[s]) - step_lam) > tol:
                    flat = False
            if flat:
                lam, replayed, uniform = step_lam, k + 1, True
                break
    # the jump (0 periods where no uniform increment was found: the periods replayed are the schedule's)
    jump = periods - replayed
    history, bubble, gather_wait = out[0], out[2], out[3]
    history[:] = state[0] + jump * lam
    bubble[:] = state[1] + jump * state[3]
    gather_wait[:] = state[2]
    last_b_start[:] = 0.0
    replay_rule_window(pp, m, 2 * (m - 1), 2 * m + pp - 1, dur, f_release, table, history, bubble, gather_wait,
                       last_b_start)
    return lam, replayed, uniform


@njit(cache=True, nogil=True)
def whole_1f1b(pp: int, m: int, dur: np.ndarray, f_release: np.ndarray):
    """Every task of the 1F1B schedule of m >= pp - 1 micro-batches replayed by rule (one window from
    position 0 to the end): kernels.pipeline_summary's figures bit for bit (the same arithmetic per task,
    each stage's tasks in order), without its sweep or visit order. Returns (compute_end, last_b_start
    (pp, 1), bubble, gather_wait)."""
    table = np.empty((2 * m + 2) * pp)
    clock, bubble, gather_wait, last_b_start = np.zeros(pp), np.zeros(pp), np.zeros(pp), np.zeros(pp)
    replay_rule_window(pp, m, 0, 2 * m + pp - 1, dur, f_release, table, clock, bubble, gather_wait, last_b_start)
    return clock, last_b_start.reshape((pp, 1)), bubble, gather_wait
