"""The task level of a longer schedule continued from a shorter one: exact, and proportional to the
micro-batches added.

A search varies the global batch with everything else fixed: the same pipeline shape and the same task
durations, m micro-batches or m' > m. Under 1F1B the first 2m - w_s tasks of stage s (w_s warm-up
forwards) are the same tasks in both schedules, in the same order, waiting on the same tasks; so they
end at the same times, bit for bit (each end is max then + of the same operands), and a stage's idle
sums over them are the same additions in the same order. The longer schedule starts from where each
stage stood after that prefix (its clock, its bubble and gather-wait sums) and replays the rest.

Nothing here assumes a schedule: the prefix of each stage is its common prefix with the schedule of m + 1
micro-batches, and a continuation is used only where it is checked to hold (the two schedules agree
on those tasks; no prefix task waits on a later one; a later task waits on a prefix task only if it is
the last of its stage, whose end the recorded clock is). Tested equal to the full replay on every
schedule (tests/replay/test_prefix.py).
"""

from __future__ import annotations

import numpy as np

from comet.replay import cache, pipeline
from comet.replay.kernels import cut_visits, remainder_order, replay_from, shared_prefix
from comet.replay.pipeline import PipelineSummary
from comet.replay.schedule import warmups

_STATES_PER_DURATIONS = 8   # micro-batch counts kept per (shape, durations): cache.continuations


@cache.memoized(256)
def prefix_lengths(schedule: str, pp: int, vpp: int, m: int) -> np.ndarray:
    """Per stage, the tasks before its drain (the backwards after its last forward): what a schedule of
    m micro-batches is expected to share with longer ones of its shape (1F1B and GPipe do; every use is
    checked first: _agree, kernels.remainder_order). Read-only."""
    cut = 2 * m * vpp - warmups(schedule, pp, vpp, m).astype(np.int64)
    cut.flags.writeable = False
    return cut


def _shared(schedule: str, pp: int, vpp: int, m_a: int, m_b: int) -> np.ndarray:
    interleaved = schedule == "interleaved_1f1b" and vpp > 1
    return shared_prefix(interleaved, pp, vpp, m_a, warmups(schedule, pp, vpp, m_a).astype(np.int64), m_b,
                         warmups(schedule, pp, vpp, m_b).astype(np.int64))


def _agree(schedule: str, pp: int, vpp: int, m: int, m_to: int, cut: np.ndarray) -> bool:
    """The schedules of m and m_to micro-batches run the same first cut[s] tasks on every stage s."""
    return bool((_shared(schedule, pp, vpp, m, m_to) >= cut).all())


def _order(shape: tuple, schedule: str, pp: int, vpp: int, m: int, m_from: int | None, full: np.ndarray):
    """(visit order, where to record the state for longer schedules, their stages), for the whole
    schedule of m (m_from None) or its tasks after the prefix shared with m_from; None where the
    continuation does not hold. Cached with the visit orders (8 B a task)."""
    key = ("continuation", shape, m, m_from)
    hit = cache.orders.get(key)
    if hit is not None:
        return hit if hit[0] is not None else None
    # perf: built once per (shape, m, m_from), on the candidate that first needs it (a numba pass and a
    # few numpy calls over the tasks)

    def build():
        if m_from is None:
            order, first = full, np.zeros(pp, dtype=np.int64)
        else:
            first = prefix_lengths(schedule, pp, vpp, m_from)
            if not _agree(schedule, pp, vpp, m_from, m, first):
                return None, None, None
            order, ok = remainder_order(full, pp, vpp, first)
            if not ok:
                return None, None, None
            order.flags.writeable = False
        at, stage = cut_visits(order, pp, vpp, first, prefix_lengths(schedule, pp, vpp, m))
        at.flags.writeable = stage.flags.writeable = False
        return order, at, stage

    value = build()
    cache.orders.put(key, value)
    return value if value[0] is not None else None


def summarize(schedule: str, pp: int, vpp: int, m: int, dur: np.ndarray, release: np.ndarray, dur_bits: bytes,
              release_bits: bytes) -> PipelineSummary:
    """pipeline.summarize (compiled), continued from the longest shorter schedule of the same shape and
    durations replayed before where there is one; records this schedule's state for longer ones.
    dur[(stage * 2 + phase) * vpp + chunk], release[stage * vpp + chunk] (float64, contiguous), and their
    bytes."""
    interleaved = schedule == "interleaved_1f1b" and vpp > 1
    order_key = (interleaved, pp, vpp, m, schedule == "gpipe")          # pipeline.summarize's
    full = cache.orders.get(order_key)
    if full is None:
        # the shape's first candidate: the sweep records its visit order. A process with no recorded state
        # yet (a one-off evaluation) takes the sweep's figures as they are; in a search, the state is
        # recorded here too (a replay of the recorded order), for the longer schedules that follow
        by_phase = dur.reshape(pp, 2, vpp)
        swept = pipeline.summarize(schedule, pp, vpp, m, by_phase[:, 0], by_phase[:, 1], release.reshape(pp, vpp))
        full = cache.orders.get(order_key)
        if full is None or not len(cache.continuations):
            return swept
    shape = (interleaved, pp, vpp, schedule == "gpipe", schedule)
    dkey = (shape, dur_bits, release_bits)
    known = cache.continuations.get(dkey)
    run = None
    shorter = [k for k in known if k < m] if known else []
    if shorter:
        m_from = max(shorter)
        run = _order(shape, schedule, pp, vpp, m, m_from, full)
        if run is not None:
            prev0, bubble0, wait0 = known[m_from]
    elif known is None:
        # perf: durations seen for the first time (another cluster): prepare the continuation of this
        # schedule from the longest shorter one recorded under other durations, which their later
        # candidates of this shape will want (built here once rather than on one of those)
        others = [k for key, states in cache.continuations.items() if key[0] == shape for k in states if k < m]
        if others:
            _order(shape, schedule, pp, vpp, m, max(others), full)
    if run is None:
        run = _order(shape, schedule, pp, vpp, m, None, full)
        prev0 = bubble0 = wait0 = np.zeros(pp)
    order, at, stage = run
    end = pipeline._scratch(len(order) + 2 + pp)
    end[len(order) + 1:len(order) + 1 + pp] = prev0        # a continued task waiting on a stage's last prefix task
    compute_end, last_b_start, bubble, wait, snap_prev, snap_bubble, snap_wait, recorded = replay_from(
        order, pp, vpp, dur, release, end, prev0, bubble0, wait0, at, stage)
    if recorded == pp and cache.enabled:
        if known is None:
            known = {}
            cache.continuations.put(dkey, known)
        known[m] = (snap_prev, snap_bubble, snap_wait)
        if len(known) > _STATES_PER_DURATIONS:
            del known[min(known)]
    return PipelineSummary(compute_end, last_b_start, bubble, wait)
