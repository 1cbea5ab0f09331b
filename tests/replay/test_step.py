"""The hierarchical step replay: a hand-computed 2-stage pipeline, and the fast path against the event
engine on the fully expanded op graph."""

import dataclasses

import numpy as np
import pytest

from comet.config.parallel import ParallelConfig, Recompute, Schedule
from comet.evaluate import evaluate, resolve
from comet.graph.expand import expand
from comet.replay.engine import replay_graph
from comet.replay.pipeline import build_programs, solve
from comet.replay.step import replay_step
from comet.replay.timing import modelled_durations
from comet.result import BREAKDOWN_KEYS
from comet.workload.builder import build_step_graph


def test_two_stage_1f1b_by_hand():
    # forward 1 s, backward 2 s, 2 micro-batches. Stage 0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9];
    # stage 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]. The step ends at 9 = (M + p - 1) * (f + b).
    f = np.ones((2, 1))
    b = 2 * np.ones((2, 1))
    prog = build_programs("1f1b", 2, 1, 2, f, b)
    end = solve(prog)
    assert end[:4].tolist() == [1.0, 2.0, 6.0, 9.0]
    assert end[4:].tolist() == [2.0, 4.0, 5.0, 7.0]


@pytest.mark.parametrize("schedule,vpp,m,p", [("1f1b", 1, 8, 4), ("gpipe", 1, 8, 4), ("interleaved_1f1b", 2, 8, 4),
                                             ("1f1b", 1, 3, 4), ("interleaved_1f1b", 3, 4, 2)])
def test_uniform_pipeline_matches_textbook_bubble(schedule, vpp, m, p):
    # Uniform stages: 1F1B / GPipe take (m + p - 1)(f + b); interleaving divides the bubble by vpp
    # (Narayanan et al. SC21 eq. for t_pb), exactly when p2p is free.
    f, b = 1.0 / vpp, 2.0 / vpp
    prog = build_programs(schedule, p, vpp, m, np.full((p, vpp), f), np.full((p, vpp), b))
    step = solve(prog).max()
    bubble = (p - 1) * (f + b)
    if schedule == "interleaved_1f1b":
        assert step == pytest.approx(m * 3.0 + bubble)
    else:
        assert step == pytest.approx(m * 3.0 + (p - 1) * 3.0)


CONFIGS = [
    dict(tp=2, pp=2, gpus=8, global_batch=8),
    dict(tp=1, pp=4, gpus=8, global_batch=8, recompute=Recompute.FULL),
    dict(tp=2, pp=2, gpus=8, global_batch=16, vpp=2, schedule=Schedule.INTERLEAVED),
    dict(tp=2, pp=2, gpus=8, global_batch=8, zero=0, overlap_grad_reduce=False),
    dict(tp=2, pp=2, gpus=8, global_batch=8, overlap_param_gather=False),
    dict(tp=4, pp=1, gpus=8, global_batch=8, overlap_tp_comm=True),
    dict(tp=2, pp=2, cp=2, gpus=8, global_batch=4),
    dict(tp=1, pp=1, gpus=8, global_batch=16, zero=3),
    dict(tp=2, pp=4, gpus=8, global_batch=8, schedule=Schedule.GPIPE, micro_batch=2),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{getattr(v, 'value', v)}" for k, v in c.items()))
def test_fast_replay_equals_event_engine_on_expanded_graph(cfg, tiny_model, h100):
    """With the overlap slowdown off, block reuse + the pipeline solver must reproduce the event engine
    on every op of the step exactly."""
    cluster = dataclasses.replace(h100, efficiency=dataclasses.replace(h100.efficiency, overlap_slowdown=0.0))
    par = resolve(tiny_model, cluster, ParallelConfig(**cfg))
    graph = build_step_graph(tiny_model, par)
    fast = replay_step(graph, cluster, par.precision.value)
    flat = expand(graph)
    full = replay_graph(flat, modelled_durations(flat, cluster, par.precision.value))
    assert fast.step_time_s == pytest.approx(full.makespan, rel=1e-9)
    for s, t_end in full.rank_end.items():
        assert fast.stage_end[s] == pytest.approx(t_end, rel=1e-9)


@pytest.mark.parametrize("cfg", CONFIGS[:4])
def test_fast_replay_close_to_event_engine_with_overlap_slowdown(cfg, tiny_model, h100):
    par = resolve(tiny_model, h100, ParallelConfig(**cfg))
    graph = build_step_graph(tiny_model, par)
    fast = replay_step(graph, h100, "bf16")
    flat = expand(graph)
    full = replay_graph(flat, modelled_durations(flat, h100, "bf16"), h100.efficiency.overlap_slowdown)
    assert fast.step_time_s == pytest.approx(full.makespan, rel=0.02)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_breakdown_adds_up_to_step_time(cfg, tiny_model, h100):
    res = evaluate(tiny_model, h100, ParallelConfig(**cfg))
    assert res.feasible, res.reason
    assert set(res.breakdown) == set(BREAKDOWN_KEYS)
    assert all(v >= -1e-12 for v in res.breakdown.values())
    assert sum(res.breakdown.values()) == pytest.approx(res.step_time_s, rel=1e-9)


def test_more_microbatches_amortize_the_bubble(tiny_model, h100):
    small = evaluate(tiny_model, h100, ParallelConfig(tp=1, pp=4, gpus=8, global_batch=8))
    large = evaluate(tiny_model, h100, ParallelConfig(tp=1, pp=4, gpus=8, global_batch=64))
    assert large.breakdown["pipeline_bubble"] / large.step_time_s < small.breakdown["pipeline_bubble"] / small.step_time_s
    assert large.mfu > small.mfu
