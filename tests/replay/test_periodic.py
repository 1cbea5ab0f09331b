"""The task level through the periodic steady state (replay/periodic.py) equals the task-by-task replay
(relative 1e-12: the jump x + j * lambda rounds differently from j additions), on every schedule, with
unequal and heavy end stages and releases, cached or not, whatever order the micro-batch counts come in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comet.replay import cache, periodic, pipeline
from comet.replay.kernels import HAVE_NUMBA

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed: the periodic solver is compiled only")

FIELDS = ("compute_end", "last_b_start", "bubble", "gather_wait")


def _whole(schedule, pp, vpp, m, f, b, release):
    with cache.disabled():          # the sweep over the whole schedule, task by task
        return pipeline.summarize(schedule, pp, vpp, m, f, b, release)


def _periodic(schedule, pp, vpp, m, f, b, release):
    dur, rel = np.stack((f, b), axis=1).ravel(), np.ascontiguousarray(release, float).ravel()
    return periodic.summarize(schedule, pp, vpp, m, dur, rel, dur.tobytes(), rel.tobytes())


def _close(a, b, rtol=1e-12) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        # absolute floor: a bubble that is zero task by task may be a few ulps of the clock after the jump
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * float(np.abs(b.compute_end).max()), err_msg=name)


def _durations(rng, pp, vpp, heavy_ends: bool, releases: bool):
    f, b = rng.uniform(0.5, 2.0, (pp, vpp)), rng.uniform(1.0, 4.0, (pp, vpp))
    if heavy_ends:                   # embedding on the first stage, the output head and loss on the last
        f[0] *= 1.7
        b[-1] *= 2.5
        f[-1] *= 3.0
    if not releases:
        return f, b, np.zeros((pp, vpp))
    return f, b, np.where(rng.random((pp, vpp)) < 0.5, rng.uniform(0, 3, (pp, vpp)), 0.0)


@pytest.mark.parametrize("schedule,pp,vpp,ms", [
    ("1f1b", 4, 1, [8, 16, 24, 12, 40]), ("1f1b", 8, 1, [3, 9, 2, 20, 7, 21, 200]), ("1f1b", 1, 1, [2, 5, 9]),
    ("1f1b", 2, 1, [3, 4, 50]), ("gpipe", 3, 1, [4, 9, 6, 12]), ("interleaved_1f1b", 4, 2, [8, 16, 12, 32]),
    ("interleaved_1f1b", 2, 3, [4, 8, 6, 10, 40]), ("interleaved_1f1b", 4, 1, [6, 12, 30]),
    ("1f1b", 16, 1, [15, 16, 17, 18, 64, 333])])
def test_periodic_task_level_equals_the_whole_replay(schedule, pp, vpp, ms):
    rng = np.random.default_rng(pp * 100 + vpp)
    for cached in (True, False):
        cache.clear()
        for trial in range(4):       # sets of durations share the windows, not the transients
            f, b, release = _durations(rng, pp, vpp, heavy_ends=trial % 2 == 1, releases=trial >= 2)
            for m in ms:
                if cached:
                    got = _periodic(schedule, pp, vpp, m, f, b, release)
                else:
                    with cache.disabled():
                        got = _periodic(schedule, pp, vpp, m, f, b, release)
                _close(got, _whole(schedule, pp, vpp, m, f, b, release))


def test_1f1b_jumps_over_the_steady_state():
    # pp 8, equal stages: the steady state is reached within a few periods, and 1000 micro-batches
    # replay the warm-up, those periods and the drain only
    cache.clear()
    pp, f, b, release = 8, np.full((8, 1), 1.0), np.full((8, 1), 2.0), np.zeros((8, 1))
    _close(_periodic("1f1b", pp, 1, 1000, f, b, release), _whole("1f1b", pp, 1, 1000, f, b, release))
    (key, state), = cache.transients.items()
    assert state[3] and state[2] < 10 and state[1] == 3.0      # uniform after a few periods of f + b
    assert not len(cache.orders)                                 # 1F1B's windows are replayed by rule (periodic_1f1b)
    warm, _, period, _, tail = periodic._windows("1f1b", pp, 1, key[0][-1])
    assert len(period) == 2 * pp                                 # one forward and one backward per stage
    assert len(warm) + len(tail) < 3 * pp * pp


def test_the_cached_transient_is_what_every_micro_batch_count_computes():
    # cached and uncached agree bit for bit, in any order of micro-batch counts (a pure function)
    rng = np.random.default_rng(3)
    f, b, release = _durations(rng, 6, 1, heavy_ends=True, releases=True)
    ms = [40, 7, 12, 300, 11, 64]
    cache.clear()
    cached = [_periodic("1f1b", 6, 1, m, f, b, release) for m in ms]
    for m, got in zip(ms, cached):
        with cache.disabled():
            fresh = _periodic("1f1b", 6, 1, m, f, b, release)
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(got, name), getattr(fresh, name), err_msg=name)


def test_no_uniform_increment_replays_every_period(monkeypatch):
    # a tolerance no increment meets: the solver replays every period up to the tail, still equal
    monkeypatch.setattr(periodic, "_MAX_SPAN", 0.0)
    cache.clear()
    rng = np.random.default_rng(5)
    f, b, release = _durations(rng, 5, 1, heavy_ends=True, releases=True)
    for m in (9, 31, 120):
        _close(_periodic("1f1b", 5, 1, m, f, b, release), _whole("1f1b", 5, 1, m, f, b, release))
    assert not len(cache.transients)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.sampled_from(["1f1b", "interleaved_1f1b", "gpipe"]), pp=st.integers(1, 12),
       vpp=st.integers(1, 3), groups=st.integers(1, 30), seed=st.integers(0, 2 ** 32 - 1),
       heavy=st.booleans(), releases=st.booleans())
def test_periodic_equals_the_whole_replay_on_random_shapes(schedule, pp, vpp, groups, seed, heavy, releases):
    vpp = vpp if schedule == "interleaved_1f1b" else 1
    m = groups * pp if schedule == "interleaved_1f1b" and vpp > 1 else groups * 3
    rng = np.random.default_rng(seed)
    f, b, release = _durations(rng, pp, vpp, heavy, releases)
    _close(_periodic(schedule, pp, vpp, m, f, b, release), _whole(schedule, pp, vpp, m, f, b, release))


def test_windows_that_do_not_continue_from_the_history_are_refused():
    from comet.replay.periodic_kernels import position_windows
    pp, m = 3, 4
    warm = np.array([2, 1, 0])

    def closed(cut, max_depth=1):
        bounds = np.array([[0] * pp, cut, [2 * m] * pp], dtype=np.int64)
        return position_windows(False, pp, 1, m, warm, bounds, max_depth)[-1]

    assert closed([2 * m - w for w in warm])         # each stage's prefix (before its drain): closed
    # stage 1's forwards F(1), F(2) wait on stage 0's, in the later window
    assert not closed([1, 4, 2 * m], max_depth=4)
    # stage 1's F(2) (its position 3) waits on stage 0's F(2) (position 2): the second last task before
    # the window, read from a history of two rows, not one
    assert not closed([4, 3, 2])
    assert closed([4, 3, 2], max_depth=2)


def test_interleaved_periods_read_three_tasks_back():
    # interleaved 1F1B: a period waits on the last three tasks of a stage before it (the windows carry
    # that history), and jumps like 1F1B
    m0 = periodic._first_steady("interleaved_1f1b", 4, 2, 0)
    warm, warm_last, *_ = periodic._windows("interleaved_1f1b", 4, 2, m0)
    assert warm_last.shape == (3, 4)
    cache.clear()
    rng = np.random.default_rng(9)
    f, b, release = _durations(rng, 4, 2, heavy_ends=True, releases=True)
    for m in (40, 200):
        got = _periodic("interleaved_1f1b", 4, 2, m, f, b, release)
        _close(got, _whole("interleaved_1f1b", 4, 2, m, f, b, release))
    assert any(state[3] for _, state in cache.transients.items())


@pytest.mark.parametrize("cfg", [dict(tp=1, pp=4, gpus=8, global_batch=32), dict(tp=2, pp=2, gpus=8, global_batch=20),
                                 dict(tp=1, pp=4, gpus=8, global_batch=24, recompute="full", zero=0)])
def test_periodic_step_equals_the_event_engine_on_the_expanded_graph(cfg, tiny_model, h100):
    # the whole step through the jump (checked to be taken) against every op replayed by the event engine
    import dataclasses

    from comet.config.parallel import ParallelConfig, Recompute
    from comet.evaluate import resolve
    from comet.graph.expand import expand
    from comet.replay.engine import replay_graph
    from comet.replay.step import replay_step
    from comet.replay.timing import modelled_durations
    from comet.workload.builder import build_step_graph

    cfg = dict(cfg, recompute=Recompute(cfg["recompute"])) if "recompute" in cfg else cfg
    cluster = dataclasses.replace(h100, efficiency=dataclasses.replace(h100.efficiency, overlap_slowdown=0.0))
    par = resolve(tiny_model, cluster, ParallelConfig(**cfg))
    graph = build_step_graph(tiny_model, par)
    cache.clear()
    fast = replay_step(graph, cluster, par.precision.value)
    assert any(state[3] for _, state in cache.transients.items())      # the jump was taken
    flat = expand(graph)
    full = replay_graph(flat, modelled_durations(flat, cluster, par.precision.value))
    assert fast.step_time_s == pytest.approx(full.makespan, rel=1e-9)
    for s, t_end in full.rank_end.items():
        assert fast.stage_end[s] == pytest.approx(t_end, rel=1e-9)


def _windows_cut_in_python(schedule, pp, vpp, m0):
    """The windows as periodic._windows cut them before periodic_kernels.periodic_windows (d9b5000): warm-up
    counts from schedule.warmups, position_windows, then the checks and slices in numpy."""
    from comet.replay.periodic_kernels import position_windows, same_window
    from comet.replay.schedule import warmups
    q = periodic._period(schedule, pp, vpp)
    big = periodic._swept(m0, q)
    warm_up = warmups(schedule, pp, vpp, big).astype(np.int64)
    bounds = np.empty((5, pp), dtype=np.int64)
    bounds[0] = 0
    for w, k in enumerate((m0, m0 + q, m0 + 2 * q)):
        bounds[w + 1] = 2 * k * vpp - warm_up
    bounds[4] = 2 * big * vpp
    interleaved = schedule == "interleaved_1f1b" and vpp > 1
    orders, offsets, flags, depth, last, ok = position_windows(interleaved, pp, vpp, big, warm_up, bounds, 4)
    warm, first, second, tail = (orders[offsets[w]:offsets[w + 1]] for w in range(4))
    if not (ok and same_window(first, second, pp, vpp) and np.array_equal(last[1, :depth], last[2, :depth])):
        return None
    kinds = pp * vpp
    if flags[0, 1] != kinds or flags[3, 2] != kinds or flags[1, 1] or flags[1, 2]:
        return None
    return warm, last[0, :depth], first, last[1, :depth], tail


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["1f1b", "interleaved_1f1b"]), st.integers(1, 24), st.integers(1, 4), st.integers(0, 23))
def test_compiled_windows_equal_the_python_cut(schedule, pp, vpp, residue):
    vpp = vpp if schedule == "interleaved_1f1b" else 1
    m0 = periodic._first_steady(schedule, pp, vpp, residue % periodic._period(schedule, pp, vpp))
    want, got = _windows_cut_in_python(schedule, pp, vpp, m0), periodic._windows(schedule, pp, vpp, m0)
    assert (want is None) == (got is None)
    if want is not None:
        assert len(got) == len(want) == 5
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
            assert not a.flags.writeable
