"""The task level in O(warm-up + transient + drain) instead of O(micro-batches x stages): 1F1B's steady
state is periodic, so a schedule's figures are replayed up to where they repeat, then jumped to.

The static-order schedule is a max-plus linear system. Past its warm-up (once every stage's warm-up
forward count stops growing with the micro-batch count m), the schedule of m + q micro-batches runs the
tasks of the schedule of m, in the same order, plus one *period* per stage (1F1B: q = 1, the pair F(m),
B(m - w_s); interleaved: q = pp) before its drain; let x_k be the state after the tasks of each stage's
prefix in the schedule of k (the tasks before its drain): each stage's clock and the ends of the few
tasks before it that later tasks read (1F1B: the clock alone; interleaved: the last 3; at most
_MAX_DEPTH, checked by periodic_kernels.position_windows). Then x_{k+q} = Phi(x_k) with the same map Phi for every
k (checked: the period windows k -> k+q and k+q -> k+2q hold the same task kinds at the same positions
with the same dependencies; codes hold kinds and positions, not micro-batch numbers). Phi is built of max
and +, so it is monotone and homogeneous: Phi(x + c) = Phi(x) + c. Hence once x_{k+q} = x_k + lambda (the
same increment on every entry), x_{k+jq} = x_k + j * lambda for every j, and every period adds the same
gaps, so the idle sums grow by the same per-stage bubble each period. A schedule of m micro-batches is
then: the warm window (the prefix of m0, the first count past the warm-up), periods until the increment
is uniform (the transient: a function of the shape and the durations, not of m), a jump to x_{m-q}, and
the *tail* (the last period and the drain, whose codes are the same for every m: positions counted from
the schedule's end).

Exact up to rounding: Phi is nonexpansive in the max norm (||Phi(x) - Phi(y)|| <= ||x - y||), so if the
measured increments differ from lambda by at most e, every later period's does too, and after J periods
the clocks are off by at most J * e against the task-by-task replay, i.e. a relative e / lambda of clocks
about J * lambda. e is a few ulps of the largest clock X and X <= max_span * lambda (both checked), so
the relative error is below _TOL_ULPS * 2.2e-16 * _MAX_SPAN ~ 1e-12: the rounding the task-by-task sums
carry anyway is of that order. The per-period bubble is summed from zero over one period (not a
difference of large sums).

Where this does not apply the whole schedule is replayed (pipeline.summarize; bit for bit the sweep): m
below m0 + 3q, GPipe (its warm-up grows with m: every forward), a period reading further back than
_MAX_DEPTH tasks, or no uniform increment before m (cyclicity > 1, or a transient as long as the
schedule: the periods replayed are then the schedule itself). Tests: tests/replay/test_periodic.py (equal
to the whole replay at 1e-12 on random shapes and durations).

1F1B with one chunk (i18p-pipeline) needs no visit orders: its windows, and a short schedule whole (m >=
pp - 1, no warm-up capped), are replayed straight from the schedule's rule (periodic_1f1b.py), bit for
bit what the orders (or the sweep) give; tests/replay/test_periodic_1f1b.py.
"""

from __future__ import annotations

import numpy as np

from comet.replay import cache, pipeline
from comet.replay.periodic_1f1b import periodic_1f1b, whole_1f1b
from comet.replay.periodic_kernels import periodic_summary, periodic_transient, periodic_windows
from comet.replay.pipeline import PipelineSummary
from comet.replay.schedule import steady_warmup

_TOL_ULPS = 8.0       # increments equal within 8 ulps of the largest clock count as uniform
_MAX_SPAN = 500.0     # ... while the largest clock is at most 500 periods long: error <= 8 * 2.2e-16 * 500
_MAX_DEPTH = 4        # a window may read the ends of each stage's last 4 tasks before it (interleaved: 3)


def _period(schedule: str, pp: int, vpp: int) -> int:
    """Micro-batches a period adds: interleaved 1F1B repeats per group of pp micro-batches."""
    return pp if schedule == "interleaved_1f1b" and vpp > 1 else 1


def _first_steady(schedule: str, pp: int, vpp: int, residue: int) -> int | None:
    """m0: the smallest micro-batch count (congruent to `residue` modulo the period) whose warm-up forward
    counts are those of every larger count; None for GPipe (its warm-up is every forward)."""
    if schedule == "gpipe":
        return None
    q = _period(schedule, pp, vpp)
    m0 = max(-(-steady_warmup(schedule, pp, vpp) // vpp), 1)
    return m0 + (residue - m0) % q


def _swept(m0: int, q: int) -> int:
    """The micro-batches of the short schedule a shape's windows are taken from: the smallest m jumped to."""
    return m0 + 3 * q


def _windows(schedule: str, pp: int, vpp: int, m0: int):
    """(warm, period, tail) visit orders of the shape, from one pass over the schedule of m0 + 3q
    micro-batches (the two periods compared end before its last one, which holds a last backward); None
    where the period structure is not shift-invariant or a period needs more state than the clocks."""
    interleaved = schedule == "interleaved_1f1b" and vpp > 1
    # perf: orders by position, not a sweep, and of the short schedule only (GPT-3 1T, pp 64, m 192: the
    # windows ~80 us where the sweep of the whole schedule took ~250 us); cut and checked in the same
    # compiled call (periodic_kernels.periodic_windows)
    ok, *windows = periodic_windows(interleaved, pp, vpp, m0, _period(schedule, pp, vpp),
                                    steady_warmup(schedule, pp, vpp), 2 if interleaved else 1, _MAX_DEPTH)
    if not ok:
        return None
    for a in windows:
        a.flags.writeable = False
    return tuple(windows)


def summarize(schedule: str, pp: int, vpp: int, m: int, dur: np.ndarray, release: np.ndarray, dur_bits: bytes,
              release_bits: bytes) -> PipelineSummary:
    """pipeline.summarize (compiled) through the periodic steady state where it applies: a pure function
    of (schedule, pp, vpp, m, durations, releases), cached or not. dur[(stage * 2 + phase) * vpp +
    chunk], release[stage * vpp + chunk] (float64, contiguous), and their bytes."""
    q = _period(schedule, pp, vpp)
    m0 = _first_steady(schedule, pp, vpp, m % q)
    if m0 is None or m < _swept(m0, q):
        return _whole(schedule, pp, vpp, m, dur, release)
    shape = ("periodic", schedule, pp, vpp, m0)
    if vpp == 1:       # 1F1B (interleaved with one chunk is 1F1B): its windows are closed-form
        return _summarize_by_rule(shape, pp, m, m0, dur, release, dur_bits, release_bits)
    return _summarize_by_windows(shape, schedule, pp, vpp, m, m0, dur, release, dur_bits, release_bits)


def _whole(schedule: str, pp: int, vpp: int, m: int, dur: np.ndarray, release: np.ndarray) -> PipelineSummary:
    """Every task of the schedule (pipeline.summarize's sweep, or its figures bit for bit)."""
    if schedule != "gpipe" and vpp == 1 and m >= pp - 1:
        # perf: 1F1B with no warm-up capped by rule, no sweep (pp 64, m 64: 89 us on a first call, 28 us
        # over the recorded order, 15 us by rule; periodic_1f1b.whole_1f1b)
        return PipelineSummary(*whole_1f1b(pp, m, dur, release))
    by_phase = dur.reshape(pp, 2, vpp)
    return pipeline.summarize(schedule, pp, vpp, m, by_phase[:, 0], by_phase[:, 1], release.reshape(pp, vpp))


def _summarize_by_windows(shape: tuple, schedule: str, pp: int, vpp: int, m: int, m0: int, dur: np.ndarray,
                          release: np.ndarray, dur_bits: bytes, release_bits: bytes) -> PipelineSummary:
    """summarize from the shape's visit orders (periodic_windows, built once per shape and cached)."""
    q = _period(schedule, pp, vpp)
    windows = cache.orders.get(shape)
    if windows is None:
        windows = _windows(schedule, pp, vpp, m0) or ()
        cache.orders.put(shape, windows)
    if not windows:
        return _whole(schedule, pp, vpp, m, dur, release)
    warm, warm_last, period, period_last, tail = windows
    periods = (m - q - m0) // q                       # periods from the warm window to the tail
    end = pipeline._scratch(max(len(warm), len(period), len(tail)) + 1 + len(warm_last) * pp)
    key = (shape, dur_bits, release_bits)
    known = cache.transients.get(key)
    if known is None or known[2] > periods:
        # a pure function of the shape and durations while a uniform increment appears within `periods`
        known = periodic_transient(warm, warm_last, period, period_last, pp, vpp, dur, release, end, periods,
                                   _TOL_ULPS, _MAX_SPAN)
        if known[3]:
            known[0].flags.writeable = False
            cache.transients.put(key, known)
    state, lam, replayed, _ = known
    # 0 periods to jump where no uniform increment was found: the periods replayed are the schedule's
    return PipelineSummary(*periodic_summary(tail, pp, vpp, dur, release, end, state, lam, periods - replayed))


_NO_STATE = (np.zeros((0, 0)), 0.0, 0)     # no known transient: replay it


def _summarize_by_rule(shape: tuple, pp: int, m: int, m0: int, dur: np.ndarray, release: np.ndarray, dur_bits: bytes,
                       release_bits: bytes) -> PipelineSummary:
    """summarize for 1F1B with one chunk: the same transient, jump and tail with the windows replayed
    straight from the schedule's rule in one compiled call (periodic_1f1b.py; bit for bit the codes'
    replay). perf: no visit orders to build (GPT-3 1T, pp 64, m 192, a first call: 118 -> 23 us)."""
    periods = m - 1 - m0                              # periods from the warm window to the tail
    key = (shape, dur_bits, release_bits)
    known = cache.transients.get(key)
    if known is not None and known[2] > periods:
        known = None
    out = np.empty((8, pp))     # the summary's rows, then the transient's state (periodic_1f1b)
    lam, replayed, uniform = periodic_1f1b(pp, m, m0, dur, release, periods, _TOL_ULPS, _MAX_SPAN,
                                           *((known[0], known[1], known[2]) if known is not None else _NO_STATE),
                                           out)
    out.flags.writeable = False     # shared (cached) from here on, with every view of it
    if known is None and uniform:
        cache.transients.put(key, (out[4:], lam, replayed, uniform))
    return PipelineSummary(out[0], out[1].reshape(pp, 1), out[2], out[3])
