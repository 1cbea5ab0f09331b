"""NIC contention in the replay (comet/replay/contention.py): a stage's DP gradient stream shares the
scale-out NIC with its backward's own inter-node traffic (here a CP ring that spans nodes) while both
are in flight; traffic that stays inside the NVLink domain leaves the step unchanged."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.cluster import NetworkDim
from comet.config.model import ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Schedule
from comet.evaluate import resolve
from comet.replay import contention, tail_kernels
from comet.replay import step as step_mod
from comet.replay import tails as tails_mod
from comet.replay.step import replay_step
from comet.replay.tails import bucket_ready_offsets
from comet.replay.timing import timed_s
from comet.workload.builder import build_step_graph

GB = 1e9


def test_fluid_sharing_by_hand():
    # three 1 s buckets ready at 0, 1, 2 s; the backward ends at 3 s and leaves DP half the port:
    # [0, 3] moves 1.5 s of port work (bucket 1 ends at 2, bucket 2 has 0.5 done at 3), the remaining
    # 1.5 s run at the full port after 3: ends 2, 3.5, 4.5 (1, 2, 3 without contention)
    ends = contention.serial_shared(np.array([[0.0, 1.0, 2.0]]), np.array([[1.0, 1.0, 1.0]]), np.array([0.0]),
                                    np.array([3.0]), np.array([0.5]))
    assert ends.tolist() == [[2.0, 3.5, 4.5]]
    # at the full rate it is the plain serial stream
    ends = contention.serial_shared(np.array([[0.0, 1.0, 2.0]]), np.array([[1.0, 1.0, 1.0]]), np.array([0.0]),
                                    np.array([3.0]), np.array([1.0]))
    assert ends.tolist() == [[1.0, 2.0, 3.0]]


def test_compiled_sharing_equals_the_numpy_loop(monkeypatch):
    rng = np.random.default_rng(7)
    ready = np.sort(rng.uniform(0, 5, (4, 9)), axis=1)
    dur, t0, window, rate = rng.uniform(0.1, 1, (4, 9)), rng.uniform(0, 1, 4), rng.uniform(2, 6, 4), rng.uniform(0.5, 1, 4)
    compiled = contention.serial_shared(ready, dur, t0, window, rate)
    monkeypatch.setattr(contention, "HAVE_NUMBA", False)
    np.testing.assert_array_equal(compiled, contention.serial_shared(ready, dur, t0, window, rate))


@pytest.fixture
def two_tier(h100):
    """4 GPUs per node at 100 GB/s, one 10 GB/s NIC per GPU; ideal links so the numbers are exact."""
    ideal = dict(latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    return dataclasses.replace(h100, network=(NetworkDim("node", 4, 100.0, **ideal),
                                              NetworkDim("fabric", 0, 10.0, **ideal)))


MID = ModelSpec(name="mid", layers=8, hidden=4096, heads=32, vocab=4096, seq_len=2048)


def _replays(cluster, monkeypatch, **par):
    par = dict(pp=1, gpus=16, global_batch=8, zero=0, overlap_grad_reduce=True, **par)
    graph = build_step_graph(MID, resolve(MID, cluster, ParallelConfig(**par)))
    shared = replay_step(graph, cluster, "bf16")
    monkeypatch.setattr(step_mod, "dp_nic_rate", lambda *a: None)   # the same step without NIC sharing
    alone = replay_step(graph, cluster, "bf16")
    monkeypatch.undo()
    return graph, shared, alone


def test_dp_and_cp_on_one_nic_slow_the_step_by_the_shared_port(two_tier, monkeypatch):
    # tp 2 x cp 4 = 8 ranks: the CP ring spans two nodes, the DP pair (stride 8) too
    graph, shared, alone = _replays(two_tier, monkeypatch, tp=2, cp=4)
    assert graph.plan.pp == 1 and graph.plan.vpp == 1
    # the backward's NIC load by hand: per layer 3 ring steps of the K/V gradient exchange, each at the
    # 10 GB/s NIC; u = NIC seconds / backward task time; DP gets 1 - min(u, 1/2)
    sends = [op for _, op in graph.blocks["layer.bwd"].nodes(data="op") if op.is_comm and op.group_kind.value == "cp"]
    assert len(sends) == 3
    nic_s = MID.layers * sum(op.msg_bytes for op in sends) / (10 * GB)
    b_task = float(shared.task_durations[1][0, 0])
    rate = 1.0 - min(nic_s / b_task, 0.5)
    got = contention.dp_nic_rate(graph, two_tier, shared.task_durations[1], lambda op: timed_s(op, two_tier, "bf16"))
    assert got[0] == pytest.approx(rate, rel=1e-12) and rate < 1.0
    # the DP stream by hand (scalar loop): buckets fill during the last backward (it ends the stage's
    # compute at `window`) and move at `rate` until then, at the full port after
    window = alone.tails[0].compute_end
    last_b_start = window - b_task
    ready, dur = [], []
    for bs in graph.stages[0].grad_buckets:
        ready += list(last_b_start + bucket_ready_offsets(graph, shared.blocks, 0, bs))
        dur += [timed_s(bs.op, two_tier, "bf16")] * bs.count
    t_alone = t_shared = 0.0
    for k in np.argsort(ready, kind="stable"):
        t_alone = max(ready[k], t_alone) + dur[k]
        start = max(ready[k], t_shared)
        shared_s = max(window - start, 0.0)
        t_shared = start + dur[k] / rate if dur[k] <= shared_s * rate else start + shared_s + dur[k] - shared_s * rate
    assert shared.tails[0].compute_end == window and t_alone > window   # the DP tail is exposed in both
    assert shared.step_time_s - alone.step_time_s == pytest.approx(t_shared - t_alone, rel=1e-9)
    assert shared.step_time_s > alone.step_time_s * 1.005   # a visible share of the step, not rounding


def test_traffic_inside_nvlink_leaves_the_step_unchanged(two_tier, monkeypatch):
    # tp 1 x cp 4: the CP ring stays in one node; only DP leaves it, so nothing shares the NIC
    graph, shared, alone = _replays(two_tier, monkeypatch, tp=1, cp=4)
    assert contention.dp_nic_rate(graph, two_tier, shared.task_durations[1],
                                  lambda op: timed_s(op, two_tier, "bf16")) is None
    assert shared.step_time_s == alone.step_time_s and shared.breakdown == alone.breakdown


def _compiled_equals_generic(two_tier, monkeypatch, par: dict, kernel_name: str) -> None:
    """The step with the compiled kernel `kernel_name` (which must run) and with the generic numpy path
    (offsets, sort, serial_shared) give the same figures bit for bit."""
    par = {"global_batch": 8, "zero": 0, "overlap_grad_reduce": True, **par}
    graph = build_step_graph(MID, resolve(MID, two_tier, ParallelConfig(**par)))
    calls = []
    kernel = getattr(tails_mod, kernel_name)
    monkeypatch.setattr(tails_mod, kernel_name, lambda *a: calls.append(1) or kernel(*a))
    compiled = replay_step(graph, two_tier, "bf16")
    assert calls, f"the compiled path ({kernel_name}) did not run"
    monkeypatch.setattr(tails_mod, "HAVE_NUMBA", False)
    generic = replay_step(graph, two_tier, "bf16")
    assert compiled.step_time_s == generic.step_time_s and compiled.breakdown == generic.breakdown
    np.testing.assert_array_equal(compiled.tails.end, generic.tails.end)


@pytest.mark.parametrize("par", [dict(tp=2, cp=4, pp=1, gpus=16), dict(tp=2, cp=2, pp=2, gpus=32)])
def test_fused_bucket_stream_equals_the_generic_path(two_tier, monkeypatch, par):
    # one chunk's buckets on a shared port run in one compiled pass (tail_kernels.shared_bucket_stream), where
    # the tails are not fused (a stage group's buckets span several sets: tail_kernels.stage_tails does not apply)
    monkeypatch.setattr(tails_mod, "_fused_statics", lambda *a: None)
    _compiled_equals_generic(two_tier, monkeypatch, par, "shared_bucket_stream")


@pytest.mark.parametrize("par", [dict(tp=2, cp=4, pp=1, gpus=16), dict(tp=2, cp=2, pp=2, gpus=32),
                                 dict(tp=2, cp=2, pp=4, gpus=64, zero=1, global_batch=16),
                                 dict(tp=2, cp=2, pp=4, gpus=64, overlap_grad_reduce=False, global_batch=16),
                                 dict(tp=2, cp=2, pp=2, gpus=32, offload=(OffloadTarget.OPTIMIZER,))])
def test_fused_stage_tails_equal_the_generic_path(two_tier, monkeypatch, par):
    # every stage's DP stream, tied-embedding sync and optimizer in one compiled pass (tail_kernels.stage_tails)
    _compiled_equals_generic(two_tier, monkeypatch, par, "stage_tails")


@pytest.mark.parametrize("par", [dict(tp=2, cp=2, pp=2, vpp=2, gpus=32, schedule=Schedule.INTERLEAVED),
                                 dict(tp=2, cp=4, pp=2, vpp=2, gpus=32, schedule=Schedule.INTERLEAVED, zero=1)])
def test_compiled_sorted_bucket_stream_equals_the_generic_path(two_tier, monkeypatch, par):
    # buckets of several chunks (interleaved pipeline) on a shared port: readiness, stable sort and the
    # stream in one compiled pass per row (tail_kernels.sorted_bucket_stream_end)
    _compiled_equals_generic(two_tier, monkeypatch, par, "sorted_bucket_stream_end")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_stage_tails_kernel_equals_the_numpy_stream_on_random_stages(data):
    # tail_kernels.stage_tails walks the buckets outer and the stages inner (independent chains side by side),
    # computes each group's ready offsets from its readiness terms and divides a bucket's seconds by the
    # rate once per stage: each stage's stream must still be contention.serial_shared's numpy loop over
    # tails._ready_offsets bit for bit, then the tied-embedding sync and the optimizer as tails._tails
    # computes them; a group whose offsets are out of bucket order sends the caller to the generic path
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    pp, vpp, n_groups = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    group_of = rng.integers(-1, n_groups, pp)
    counts = rng.integers(1, 13, n_groups)
    layers = rng.integers(0, 9, n_groups)
    progressive = rng.random(n_groups) < 0.7
    head, per_layer = rng.uniform(0, 0.5, n_groups), rng.uniform(0, 0.3, n_groups)
    all_compute = head + layers * per_layer + np.where(rng.random(n_groups) < 0.3, rng.uniform(0, 0.2, n_groups), 0.0)
    if data.draw(st.booleans()):   # sometimes a whole backward shorter than its layers: out of bucket order
        all_compute = all_compute * rng.uniform(0, 1, n_groups)
    terms = np.stack([head, per_layer, all_compute], axis=1)
    group_i = np.stack([rng.integers(0, vpp, n_groups), counts, layers, progressive], axis=1).astype(np.int64)
    offsets = [tails_mod._ready_offsets((head[g], per_layer[g], all_compute[g], int(layers[g])),
                                       SimpleNamespace(count=int(counts[g]), progressive=bool(progressive[g])))
               for g in range(n_groups)]
    g_dur = rng.uniform(0.01, 0.5, n_groups)
    last_b_start, compute_end = rng.uniform(0, 3, (pp, vpp)), rng.uniform(1, 6, pp)
    gather_end = np.where(rng.random(pp) < 0.5, 0.0, rng.uniform(0, 2, pp))
    rate = np.where(rng.random(pp) < 0.3, 1.0, rng.uniform(0.5, 1, pp))
    emb = np.sort(rng.choice(pp, size=min(pp, data.draw(st.integers(0, 2))), replace=False)).astype(np.int64)
    # the kernel's stage -> group index: a stage without buckets is in a group of 0 buckets (the last)
    adam_g, link_g = rng.uniform(0, 1, n_groups + 1), rng.uniform(0, 1.5, n_groups + 1)
    index = np.where(group_of < 0, n_groups, group_of)
    adam, link = adam_g[index], link_g[index]
    group_f = np.concatenate([np.vstack([terms, np.zeros((1, 3))]), np.stack([adam_g, link_g], axis=1)], axis=1)
    emb_dur = rng.uniform(0, 0.2, len(emb))
    in_order, got = tail_kernels.stage_tails(last_b_start, compute_end, gather_end, rate, index,
                                              np.vstack([group_i, np.zeros((1, 4), dtype=np.int64)]), group_f,
                                              np.append(g_dur, rng.uniform(0.01, 0.5)), emb, emb_dur)
    assert in_order == all(bool((o[1:] >= o[:-1]).all()) for o in offsets)
    if not in_order:
        return

    dp_end = gather_end.copy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contention, "HAVE_NUMBA", False)
        for s, g in enumerate(group_of):
            if g >= 0:
                ready = last_b_start[s, group_i[g, 0]] + offsets[g]
                dp_end[s] = contention.serial_shared(ready[None, :], np.full(counts[g], g_dur[g]), gather_end[s:s + 1],
                                                     compute_end[s:s + 1], rate[s:s + 1])[0, -1]
    partner_wait = np.zeros(pp)
    if len(emb):
        ready_at = {s: max(float(compute_end[s]), float(dp_end[s])) for s in emb}
        both = max(ready_at.values())
        for i, s in enumerate(emb):
            partner_wait[s] = both - ready_at[s]
            dp_end[s] = both + emb_dur[i]
    offload = np.maximum(0.0, link - adam)
    optimizer_start = np.maximum(compute_end, dp_end)
    for a, b in zip(got, (optimizer_start, optimizer_start + adam + offload, partner_wait, offload, adam), strict=True):
        np.testing.assert_array_equal(a, b)
