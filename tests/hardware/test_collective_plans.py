"""The collective models' per-group plans (comet/hardware/collective_plans.py: constants of a placement
computed once, a size costing its own floats) against the per-call model they replace
(reference_collectives.py, main 1e0c0a7's arithmetic), bit for bit, on random networks (NVLS, SHARP,
tiers, ring and fully connected topologies, restricted algorithms), groups, kinds and sizes."""

import dataclasses
import math

from hypothesis import given, settings, strategies as st
from reference_collectives import algorithm_times as reference_times
from reference_collectives import group_span as reference_group_span
from reference_collectives import hop_time_s as reference_hop_time_s
from reference_collectives import p2p_time_s as reference_p2p_time_s
from test_network_groups import networks

from comet.graph.ir import Collective
from comet.hardware import network


@settings(max_examples=400, deadline=None)
@given(net=networks(), size=st.sampled_from([2, 3, 4, 6, 8, 16, 32, 64, 128, 1024]),
       stride=st.sampled_from([1, 2, 3, 4, 8, 16, 64, 4032]), flat=st.booleans(),
       kinds=st.lists(st.sampled_from(list(Collective)), min_size=1, max_size=4),
       sizes=st.lists(st.floats(1, 1e11) | st.sampled_from([1.0, 2.0**26, 2.0**26 + 1, 8192.0]), min_size=1,
                      max_size=6))
def test_plans_equal_the_per_call_model_bit_for_bit(h100, net, size, stride, flat, kinds, sizes):
    cluster = dataclasses.replace(h100, network=net)
    network.clear_groups()
    for kind in kinds:
        for msg in sizes:
            want = reference_times(kind, msg, size, stride, cluster, flat)
            got = network.algorithm_times(kind, msg, size, stride, cluster, flat)
            assert list(got.items()) == list(want.items())     # the same algorithms, order and floats
            name = min(want, key=want.get)
            assert network.chosen_algorithm(kind, msg, size, stride, cluster, flat) == (name, want[name])
            assert network.collective_time_s(kind, msg, size, stride, cluster, flat) == want[name]


@settings(max_examples=400, deadline=None)
@given(net=networks(), size=st.sampled_from([4, 16, 64, 128]), stride=st.sampled_from([1, 2, 4]),
       sizes=st.lists(st.floats(1, 1e11), min_size=1, max_size=4))
def test_all_reduce_plans_across_domains_equal_the_per_call_model(h100, net, size, stride, sizes):
    # all-reduce groups that leave the node: ring, tree, SHARP (with and without NVLS), NVLS tree
    cluster = dataclasses.replace(h100, network=net)
    network.clear_groups()
    for msg in sizes:
        want = reference_times(Collective.ALL_REDUCE, msg, size, stride, cluster)
        assert list(network.algorithm_times(Collective.ALL_REDUCE, msg, size, stride, cluster).items()) == \
            list(want.items())


@settings(max_examples=200, deadline=None)
@given(net=networks(), msg=st.floats(1, 1e11), distance=st.sampled_from([1, 2, 8, 64, 4096]),
       cap=st.sampled_from([math.inf, 1e9, 5e10]))
def test_hop_time_equals_the_per_call_cost(h100, net, msg, distance, cap):
    levels = dataclasses.replace(h100, network=net).levels
    for level in range(len(levels)):
        assert network._hop_time_s(msg, level, distance, levels, cap) == reference_hop_time_s(msg, level, distance,
                                                                                             levels, cap)


@settings(max_examples=300, deadline=None)
@given(net=networks(), size=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 64, 128, 1024]),
       stride=st.sampled_from([1, 2, 3, 4, 8, 16, 64, 4032]), bounded=st.booleans())
def test_group_span_equals_the_per_level_count(h100, net, size, stride, bounded):
    # network._Group computes the span with its views in one pass; bounded: every level bounded, so
    # members may be left over for the outermost one
    if bounded:
        net = tuple(dataclasses.replace(d, size=d.size or 64) for d in net)
    levels = dataclasses.replace(h100, network=net).levels
    assert network.group_span(size, stride, levels) == reference_group_span(size, stride, levels)


@settings(max_examples=300, deadline=None)
@given(net=networks(), msg=st.floats(0, 1e11), distance=st.sampled_from([1, 2, 3, 8, 64, 4096, 10**6]),
       ranks=st.sampled_from([0, 2, 8, 16, 80]), local_ranks=st.sampled_from([1, 2, 4, 8]), bounded=st.booleans())
def test_p2p_time_equals_the_per_call_cost(h100, net, msg, distance, ranks, local_ranks, bounded):
    if bounded:     # a distance beyond every level: the outermost one, at distance 1
        net = tuple(dataclasses.replace(d, size=d.size or 64) for d in net)
    cluster = dataclasses.replace(h100, network=net)
    assert network.p2p_time_s(msg, distance, cluster, ranks, local_ranks) == \
        reference_p2p_time_s(msg, distance, cluster, ranks, local_ranks)
