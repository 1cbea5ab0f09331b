"""One suite every collective must pass, plus the hierarchical placement of groups."""

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from comet.config.cluster import CollectiveAlgorithm
from comet.graph.ir import Collective
from comet.hardware.network import collective_time_s, group_span, p2p_time_s

ALGOS = list(CollectiveAlgorithm)


def with_algorithm(cluster, algo):
    return dataclasses.replace(cluster, network=tuple(dataclasses.replace(d, algorithm=algo) for d in cluster.network))


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind", list(Collective))
@settings(max_examples=25, deadline=None)
@given(size=st.sampled_from([2, 4, 8, 16, 64, 512]), stride=st.sampled_from([1, 2, 8, 64]),
       a=st.floats(1, 1e10), b=st.floats(1, 1e10))
def test_collective_cost_is_non_negative_and_non_decreasing_in_bytes(h100, algo, kind, size, stride, a, b):
    c = with_algorithm(h100, algo)
    lo, hi = sorted((a, b))
    t_lo = collective_time_s(kind, lo, size, stride, c)
    t_hi = collective_time_s(kind, hi, size, stride, c)
    assert 0.0 <= t_lo <= t_hi


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind", list(Collective))
def test_group_of_one_costs_nothing(h100, algo, kind):
    assert collective_time_s(kind, 1e9, 1, 1, with_algorithm(h100, algo)) == 0.0


def test_group_span_follows_megatron_rank_order(h100):
    assert group_span(8, 1, h100.network) == [8, 1]        # TP 8 inside a node
    assert group_span(64, 8, h100.network) == [1, 64]      # DP across nodes, one member per node
    assert group_span(16, 4, h100.network) == [2, 8]       # DP with TP 4: two members per node
    assert group_span(4, 1, h100.network) == [4, 1]


def test_ring_all_reduce_large_message_by_hand(h100):
    # 8 GPUs on NVLink, 1 GB: 2 * 7/8 * 1e9 B / (450e9 B/s * eff) with eff -> bus_efficiency for large m.
    dim = h100.network[0]
    eff = dim.bus_efficiency * 1e9 / (1e9 + dim.half_efficiency_bytes)
    expected = 2 * 7 / 8 * 1e9 / (450e9 * eff) + 2 * 7 * dim.latency_s
    assert collective_time_s(Collective.ALL_REDUCE, 1e9, 8, 1, h100) == pytest.approx(expected)


def test_inter_node_is_slower_than_nvlink(h100):
    inside = collective_time_s(Collective.ALL_GATHER, 1e8, 8, 1, h100)
    across = collective_time_s(Collective.ALL_GATHER, 1e8, 8, 8, h100)
    assert across > 5 * inside
    assert p2p_time_s(1e8, 8, h100) > p2p_time_s(1e8, 1, h100)


def test_oversubscription_slows_scale_out(h100):
    net = list(h100.network)
    net[1] = dataclasses.replace(net[1], oversubscription=2.0)
    slow = dataclasses.replace(h100, network=tuple(net))
    t1 = collective_time_s(Collective.REDUCE_SCATTER, 1e9, 64, 8, h100)
    t2 = collective_time_s(Collective.REDUCE_SCATTER, 1e9, 64, 8, slow)
    assert 1.9 * t1 < t2 < 2 * t1      # the bandwidth term doubles, the latency term does not
