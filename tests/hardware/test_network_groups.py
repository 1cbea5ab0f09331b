"""The collective models' per-group placement and plan tables (network._GROUPS, _PLANS): a group's
sizes timed with the tables kept equal, bit for bit, the same sizes timed with the tables emptied before
every call (each call then builds its placement from scratch, as the model did before the tables), on
random networks, groups, kinds and sizes."""

import dataclasses

from hypothesis import given, settings, strategies as st

from comet.config.cluster import CollectiveAlgorithm, FabricTier, NetworkDim, Topology
from comet.graph.ir import Collective
from comet.hardware import network


@st.composite
def networks(draw):
    """A scale-up domain (maybe with NVLS) and one or two scale-out levels (maybe tiered, maybe SHARP)."""
    node = draw(st.sampled_from([2, 4, 8]))
    dims = [NetworkDim("node", node, draw(st.floats(50, 900)), draw(st.floats(0, 5)),
                       topology=draw(st.sampled_from(list(Topology))),
                       algorithm=draw(st.sampled_from(list(CollectiveAlgorithm))),
                       bus_efficiency=draw(st.floats(0.3, 1.0)), half_efficiency_bytes=draw(st.floats(0, 1e7)),
                       nvls_bus_GBps=draw(st.none() | st.floats(100, 600)),
                       nvls_half_efficiency_bytes=draw(st.floats(0, 1e8)))]
    outer = draw(st.sampled_from([0, node * 4, node * 16]))
    tiers = (FabricTier(node * 2, draw(st.floats(1, 4))),) if outer == 0 and draw(st.booleans()) else ()
    dims.append(NetworkDim("fabric", outer, draw(st.floats(5, 100)), draw(st.floats(0, 20)),
                           algorithm=draw(st.sampled_from(list(CollectiveAlgorithm))),
                           oversubscription=draw(st.floats(1, 4)), in_network_reduction=draw(st.booleans()),
                           half_efficiency_bytes=draw(st.floats(0, 1e7)), tiers=tiers))
    if outer:
        dims.append(NetworkDim("pod", 0, draw(st.floats(5, 100)), draw(st.floats(0, 20))))
    return tuple(dims)


@settings(max_examples=150, deadline=None)
@given(net=networks(), size=st.sampled_from([2, 3, 4, 8, 16, 32, 64, 128]),
       stride=st.sampled_from([1, 2, 4, 8, 16, 64]), flat=st.booleans(),
       kinds=st.lists(st.sampled_from(list(Collective)), min_size=1, max_size=4),
       sizes=st.lists(st.floats(1, 1e10), min_size=1, max_size=6))
def test_group_table_equals_a_fresh_placement_bit_for_bit(h100, net, size, stride, flat, kinds, sizes):
    cluster = dataclasses.replace(h100, network=net)
    calls = [(kind, msg) for kind in kinds for msg in sizes]
    network.clear_groups()
    kept = [network.algorithm_times(kind, msg, size, stride, cluster, flat) for kind, msg in calls]
    fresh = []
    for kind, msg in calls:
        network.clear_groups()
        fresh.append(network.algorithm_times(kind, msg, size, stride, cluster, flat))
    assert kept == fresh
    assert [network.chosen_algorithm(k, m, size, stride, cluster, flat) for k, m in calls] == \
        [(min(t, key=t.get), min(t.values())) for t in fresh]


def test_two_networks_keep_their_own_entries(h100):
    """The table is keyed by each network's levels (held by the entry): a group timed on one network
    and then on another with half the bandwidth reads its own placement, before and after emptying."""
    network.clear_groups()
    slow = dataclasses.replace(h100, network=tuple(dataclasses.replace(d, bandwidth_GBps=d.bandwidth_GBps / 2)
                                                   for d in h100.network))
    t_fast = network.collective_time_s(Collective.ALL_REDUCE, 1e9, 16, 1, h100)
    t_slow = network.collective_time_s(Collective.ALL_REDUCE, 1e9, 16, 1, slow)
    assert t_slow > t_fast
    network.clear_groups()
    assert network.collective_time_s(Collective.ALL_REDUCE, 1e9, 16, 1, slow) == t_slow
