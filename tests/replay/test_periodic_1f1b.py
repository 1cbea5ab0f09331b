"""1F1B's periodic task level replayed by rule (replay/periodic_1f1b.py) equals the replay of the visit
orders periodic_kernels.periodic_windows builds (periodic._summarize_by_windows) bit for bit, and the
windows it assumes (a depth-1 history, every check passed) are what periodic_windows finds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comet.replay import cache, periodic
from comet.replay.kernels import HAVE_NUMBA

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed: the periodic solver is compiled only")

FIELDS = ("compute_end", "last_b_start", "bubble", "gather_wait")


def test_every_1f1b_shape_has_windows_with_a_clock_only_history():
    # the rule path replays without periodic_windows' checks: they pass on every pipeline depth
    for pp in range(1, 257):
        m0 = periodic._first_steady("1f1b", pp, 1, 0)
        windows = periodic._windows("1f1b", pp, 1, m0)
        assert windows is not None, pp
        warm, warm_last, period, period_last, tail = windows
        assert warm_last.shape[0] == period_last.shape[0] == 1, pp
        assert len(period) == 2 * pp


def _by_windows(schedule, pp, m, dur, release):
    m0 = periodic._first_steady(schedule, pp, 1, 0)
    with cache.disabled():
        return periodic._summarize_by_windows(("periodic", schedule, pp, 1, m0), schedule, pp, 1, m, m0, dur, release,
                                              dur.tobytes(), release.tobytes())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.sampled_from(["1f1b", "interleaved_1f1b"]), pp=st.integers(1, 40),
       extra=st.lists(st.integers(3, 400), min_size=1, max_size=4), seed=st.integers(0, 2 ** 32 - 1),
       kind=st.sampled_from(["random", "equal", "heavy_ends"]), releases=st.booleans())
def test_the_rule_replay_equals_the_windows_replay(schedule, pp, extra, seed, kind, releases):
    rng = np.random.default_rng(seed)
    if kind == "random":           # mostly no uniform increment: every period replayed
        dur = rng.uniform(0.5, 4.0, 2 * pp)
    else:                          # a uniform increment within a few periods, then the jump
        dur = np.tile([1.0, rng.uniform(1.5, 2.5)], pp)
        if kind == "heavy_ends":   # embedding on the first stage, the output head and loss on the last
            dur[0] *= 1.7
            dur[-2:] *= (3.0, 2.5)
    release = np.where(rng.random(pp) < 0.5, rng.uniform(0, 3, pp), 0.0) if releases else np.zeros(pp)
    cache.clear()
    m0 = periodic._first_steady(schedule, pp, 1, 0)
    for m in (m0 + e for e in extra):          # the transient cached by the first, reused by the others
        got = periodic.summarize(schedule, pp, 1, m, dur, release, dur.tobytes(), release.tobytes())
        want = _by_windows(schedule, pp, m, dur, release)
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.sampled_from(["1f1b", "interleaved_1f1b"]), pp=st.integers(1, 70), short=st.integers(0, 3),
       seed=st.integers(0, 2 ** 32 - 1), releases=st.booleans())
def test_short_schedules_replayed_by_rule_equal_the_sweep(schedule, pp, short, seed, releases):
    # m below m0 + 3 (no periodic jump): the whole schedule by rule where no warm-up is capped (m >= pp
    # - 1), else the sweep itself; either way the sweep's figures bit for bit
    from comet.replay import pipeline
    rng = np.random.default_rng(seed)
    m = max(pp + 1 - short, 1)
    f, b = rng.uniform(0.5, 2.0, (pp, 1)), rng.uniform(1.0, 4.0, (pp, 1))
    release = np.where(rng.random((pp, 1)) < 0.5, rng.uniform(0, 3, (pp, 1)), 0.0) if releases else np.zeros((pp, 1))
    dur, rel = np.stack((f, b), axis=1).ravel(), release.ravel()
    with cache.disabled():
        want = pipeline.summarize(schedule, pp, 1, m, f, b, release)
    got = periodic.summarize(schedule, pp, 1, m, dur, rel, dur.tobytes(), rel.tobytes())
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
