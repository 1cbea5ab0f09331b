"""The stage work's fast paths (comet/replay/tails.py, contention.py; branch i17s-stage) against the
per-stage / per-element reference they replace, on random inputs."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.cluster import NetworkDim
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Schedule
from comet.errors import ConfigError
from comet.evaluate import resolve
from comet.hardware.network import group_span
from comet.replay import contention
from comet.replay import tails as tails_mod
from comet.replay.tails import _stage_groups, _sync_times
from comet.replay.timing import timed_s
from comet.workload.builder import build_step_graph


def _stage_groups_per_stage(graph) -> dict:
    """The per-stage loop _stage_groups replaced (d9b5000)."""
    plan, pp = graph.plan, graph.plan.pp
    groups: dict = {}
    layers, n = plan.chunk_layers, plan.pp * plan.vpp
    for s, stage in enumerate(graph.stages):
        role = (id(stage), s == 0, s == pp - 1, tuple(layers[s:n:pp]))
        groups.setdefault(role, []).append(s)
    return {role: np.array(stages) for role, stages in groups.items()}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_stage_groups_equal_per_stage_loop(data):
    pp = data.draw(st.integers(1, 12))
    vpp = data.draw(st.integers(1, 3))
    # a few shared sync objects, in runs or interleaved; layer counts that sometimes differ
    syncs = [SimpleNamespace(embedding_sync=data.draw(st.sampled_from([None, "all-reduce"])))
             for _ in range(data.draw(st.integers(1, 4)))]
    stages = tuple(syncs[i] for i in data.draw(st.lists(st.integers(0, len(syncs) - 1), min_size=pp, max_size=pp)))
    layers = tuple(data.draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp)))
    graph = SimpleNamespace(plan=SimpleNamespace(pp=pp, vpp=vpp, chunk_layers=layers), stages=stages)
    got, want = _stage_groups(graph), _stage_groups_per_stage(graph)
    assert len(got.rows) == len(want)     # the same groups, in the same order
    for g, rows in enumerate(want.values()):
        assert got.rows[g].dtype == rows.dtype and got.rows[g].tolist() == rows.tolist()
        assert got.first[g] == rows[0] and type(got.first[g]) is int and got.syncs[g] is stages[rows[0]]
        assert (got.index[rows] == g).all()
    assert got.index.dtype == np.int64 and len(got.index) == pp
    assert got.embedding == tuple(s for s in range(pp) if stages[s].embedding_sync is not None)


_times = st.floats(0.0, 1e3, allow_nan=False) | st.just(0.0) | st.just(np.inf)


@pytest.mark.parametrize("compiled", [True, False])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_rate_equals_nested_minimum(compiled, data):
    pp, vpp = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 4))
    nic = np.array(data.draw(st.lists(_times, min_size=pp, max_size=pp)), dtype=float)
    b_dur = np.array(data.draw(st.lists(_times, min_size=pp * vpp, max_size=pp * vpp)), dtype=float).reshape(pp, vpp)
    busy = np.sum(b_dur, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):   # the draws include subnormal durations and inf
        u = np.divide(nic, busy, out=np.zeros_like(nic), where=busy > 0)
        want = 1.0 - np.minimum(np.minimum(u, 1.0), 0.5)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(contention, "HAVE_NUMBA", compiled)    # tail_kernels.nic_rate, or the numpy calls
            got = contention._rate(nic, b_dur)
    if not (want < 1.0).any():
        assert got is None
    else:
        assert got.tobytes() == want.tobytes()


@settings(max_examples=500, deadline=None)
@given(size=st.integers(1, 4096), stride=st.integers(1, 4096), inner=st.integers(1, 512), levels=st.integers(1, 3))
def test_crosses_nic_reads_the_first_level_of_the_span(size, stride, inner, levels):
    # contention.crosses_nic counts the members inside one innermost domain, not the span over every level
    network = tuple(NetworkDim(f"l{i}", (inner * 4 ** i) if i < levels - 1 else 0, 100.0, 1.0) for i in range(levels))
    cluster = SimpleNamespace(network=network)
    want = size > 1 and levels > 1 and group_span(size, stride, network)[0] < size
    assert contention.crosses_nic(size, stride, cluster) == want


_SMALL = ModelSpec(name="small", layers=12, hidden=2048, heads=16, vocab=32000, seq_len=2048)


def random_graph(data, h100, zero_max: int = 1, batches=st.just(2)) -> tuple:
    """A small model's step graph on a random (tp, pp, dp, ZeRO, interleaving) configuration, on the H100
    spec's network or the same network with one NIC per 4 GPUs; (None, None) where it does not resolve.
    `batches`: micro-batches per pipeline stage and DP rank (no interleaving)."""
    tp, pp, dp = data.draw(st.sampled_from([1, 2, 8])), data.draw(st.integers(1, 5)), data.draw(st.sampled_from([1, 2, 4, 16]))
    par = dict(tp=tp, pp=pp, gpus=tp * pp * dp, global_batch=dp * pp * data.draw(batches),
               zero=data.draw(st.integers(0, zero_max)), overlap_param_gather=data.draw(st.booleans()))
    if pp > 1 and data.draw(st.booleans()):
        par.update(vpp=2, schedule=Schedule.INTERLEAVED, global_batch=dp * pp * 4)
    model = dataclasses.replace(_SMALL, tied_embeddings=data.draw(st.booleans()))
    cluster = h100 if data.draw(st.booleans()) else dataclasses.replace(
        h100, network=(dataclasses.replace(h100.network[0], size=4),) + h100.network[1:])
    try:
        return build_step_graph(model, resolve(model, cluster, ParallelConfig(**par))), cluster
    except ConfigError:
        return None, None


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_sync_times_direct_collectives_equal_timed_ops(h100, data):
    # _sync_times times a modelled sync collective by network.collective_time_s directly (i20s-step); the
    # reference is every op through replay.timing.timed_s (the per-transfer network cache): bit for bit,
    # on the H100 spec's network (NVLS, a fat-tree tier) and the same network with one NIC per 4 GPUs
    graph, cluster = random_graph(data, h100)
    if graph is None:
        return
    pp = graph.plan.pp
    groups = _stage_groups(graph)
    t = lambda op: timed_s(op, cluster, "bf16")    # noqa: E731
    events = [[] for _ in range(pp)]
    got = _sync_times(graph, groups, t, cluster, events)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tails_mod, "_collective_op_s", lambda op, t, cluster: t(op))
        want_events = [[] for _ in range(pp)]
        want = _sync_times(graph, groups, t, cluster, want_events)
    for a, b in zip(got, want):
        assert a.tobytes() == b.tobytes()
    assert events == want_events
