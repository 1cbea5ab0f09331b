"""A schedule's task level continued from a shorter one (replay/prefix.py) equals the whole replay bit for
bit, on every schedule, whatever order the micro-batch counts come in."""

from __future__ import annotations

import numpy as np
import pytest

from comet.replay import cache, pipeline, prefix
from comet.replay.kernels import HAVE_NUMBA, remainder_order

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed: the continuation is compiled only")


def _whole(schedule, pp, vpp, m, f, b, release):
    with cache.disabled():          # the sweep over the schedule, nothing recorded or continued
        return pipeline.summarize(schedule, pp, vpp, m, f, b, release)


def _continued(schedule, pp, vpp, m, f, b, release):
    dur, rel = np.stack((f, b), axis=1).ravel(), release.ravel()
    return prefix.summarize(schedule, pp, vpp, m, dur, rel, dur.tobytes(), rel.tobytes())


def _equal(a, b) -> None:
    for name in ("compute_end", "last_b_start", "bubble", "gather_wait"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("schedule,pp,vpp,ms", [
    ("1f1b", 4, 1, [8, 16, 24, 12, 40]), ("1f1b", 8, 1, [3, 9, 2, 20, 7, 21]), ("1f1b", 1, 1, [2, 5, 9]),
    ("gpipe", 3, 1, [4, 9, 6, 12]), ("interleaved_1f1b", 4, 2, [8, 16, 12, 32]),
    ("interleaved_1f1b", 2, 3, [4, 8, 6, 10]), ("interleaved_1f1b", 4, 1, [6, 12, 30])])
def test_continued_task_level_equals_the_whole_replay(schedule, pp, vpp, ms):
    cache.clear()
    rng = np.random.default_rng(pp * 100 + vpp)
    for durations in range(3):      # sets of durations share the shapes, not the states
        f, b = rng.uniform(0.5, 2.0, (pp, vpp)), rng.uniform(1.0, 4.0, (pp, vpp))
        release = np.where(rng.random((pp, vpp)) < 0.5, rng.uniform(0, 3, (pp, vpp)), 0.0)
        for m in ms:
            _equal(_continued(schedule, pp, vpp, m, f, b, release), _whole(schedule, pp, vpp, m, f, b, release))
    # the first set only records the shapes (a fresh process takes the sweep's figures); the others record
    # states, and schedules after a shorter one continue from it where the continuation holds
    assert len(cache.continuations) == 2
    continued = [k for k, v in cache.orders._d.items() if k[0] == "continuation" and k[3] is not None and v[0] is not None]
    if schedule != "interleaved_1f1b" or vpp == 1:
        assert continued


def test_1f1b_continues_from_the_shorter_schedule():
    # 1F1B: the state after the shared prefix is recorded, and the longer schedule replays only the rest
    cache.clear()
    pp, f, b, release = 8, np.full((8, 1), 1.0), np.full((8, 1), 2.0), np.zeros((8, 1))
    for m in (16, 32):
        _continued("1f1b", pp, 1, m, f, b, release)
    order, *_ = prefix._order((False, pp, 1, False, "1f1b"), "1f1b", pp, 1, 32, 16,
                              cache.orders.get((False, pp, 1, 32, False)))
    # stage s shares its 2 * 16 - w_s first tasks (w_s = pp - s - 1 warm-up forwards) with the shorter one
    assert list(prefix.prefix_lengths("1f1b", pp, 1, 16)) == [2 * 16 - (pp - s - 1) for s in range(pp)]
    assert len(order) == pp * 2 * 32 - sum(2 * 16 - (pp - s - 1) for s in range(pp))


def _task(src: int, stage: int) -> int:
    return src | ((stage * 2) << 34)        # a forward of chunk 0 (vpp 1): kernels' visit-order code


def test_a_prefix_that_is_not_closed_is_refused():
    # a dropped task of stage 0 waits on a kept task of stage 1
    assert not remainder_order(np.array([_task(2, 1), _task(0, 0)]), 2, 1, np.array([1, 0]))[1]
    # a kept task of stage 0 waits on stage 1's first task, dropped but not the last dropped one
    assert not remainder_order(np.array([_task(3, 1), _task(3, 1), _task(0, 0)]), 2, 1, np.array([0, 2]))[1]
    # waiting on the last dropped task of a stage is what a continuation holds
    order, ok = remainder_order(np.array([_task(3, 1), _task(3, 1), _task(1, 0)]), 2, 1, np.array([0, 2]))
    assert ok and list(order & 0xFFFFFFFF) == [1 + 1 + 1]     # end[n_kept + 1 + stage 1]
