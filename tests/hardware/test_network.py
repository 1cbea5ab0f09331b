"""The network model: properties every collective must have, and hand-computed answers on tiny
clusters for placement, topology, oversubscription, algorithms and NCCL's choice."""

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from comet.config.cluster import CollectiveAlgorithm, NetworkDim, Topology
from comet.graph.ir import Collective
from comet.hardware.network import (PROTOCOLS, algorithm_times, chosen_algorithm, collective_time_s, group_span,
                                    p2p_time_s)

ALGOS = list(CollectiveAlgorithm)
SIMPLE_BASE = PROTOCOLS["simple"][1]     # NCCL's fixed launch latency of the Simple protocol
GB = 1e9


def tiny(h100, node=4, node_GBps=100.0, fabric_GBps=10.0, topology=Topology.SWITCH, oversub=1.0, **fabric):
    """`node` GPUs per node at node_GBps, a fabric at fabric_GBps per GPU; no latency, no efficiency
    loss, so every answer is bytes / rate plus NCCL's fixed launch latency."""
    ideal = dict(latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    net = (NetworkDim("node", node, node_GBps, topology=topology, **ideal),
           NetworkDim("fabric", 0, fabric_GBps, oversubscription=oversub, **ideal, **fabric))
    return dataclasses.replace(h100, network=net)


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
    # rounding only: sums of per-level terms may differ in the last bit between two sizes 1 ulp apart
    assert 0.0 <= t_lo <= t_hi * (1 + 1e-12)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind", list(Collective))
def test_group_of_one_costs_nothing(h100, algo, kind):
    assert collective_time_s(kind, 1e9, 1, 1, with_algorithm(h100, algo)) == 0.0


def test_group_span_follows_megatron_rank_order(h100):
    assert group_span(8, 1, h100.network) == [8, 1]        # TP 8 inside a node
    assert group_span(64, 8, h100.network) == [1, 64]      # DP across nodes, one member per node
    assert group_span(16, 4, h100.network) == [2, 8]       # DP with TP 4: two members per node
    assert group_span(4, 1, h100.network) == [4, 1]


def test_ring_inside_a_switch_by_hand(h100):
    c = tiny(h100)
    # 4 GPUs of one node, 1 GB all-reduce: 2 * 3/4 * 1e9 B / 100 GB/s, plus the launch latency.
    assert collective_time_s(Collective.ALL_REDUCE, GB, 4, 1, c) == pytest.approx(SIMPLE_BASE + 1.5 * GB / 100e9)
    assert collective_time_s(Collective.ALL_GATHER, GB, 4, 1, c) == pytest.approx(SIMPLE_BASE + 0.75 * GB / 100e9)


def test_members_per_node_share_the_nodes_nics(h100):
    c = tiny(h100)
    # DP of 8 with one member per node (stride 4) gets one 10 GB/s NIC; with two members per node
    # (stride 2) the ring's node crossing has two NICs: twice the rate.
    one = collective_time_s(Collective.REDUCE_SCATTER, GB, 8, 4, c)
    two = collective_time_s(Collective.REDUCE_SCATTER, GB, 8, 2, c)
    assert one == pytest.approx(SIMPLE_BASE + 7 / 8 * GB / 10e9)
    assert two == pytest.approx(SIMPLE_BASE + 7 / 8 * GB / 20e9)


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_oversubscription_divides_the_crossing_rate_and_spares_the_node(h100, ratio):
    flat, over = tiny(h100), tiny(h100, oversub=ratio)
    across = collective_time_s(Collective.ALL_REDUCE, GB, 8, 4, over)
    assert across == pytest.approx(SIMPLE_BASE + 2 * 7 / 8 * GB / (10e9 / ratio))
    assert (across - SIMPLE_BASE) == pytest.approx(ratio * (collective_time_s(Collective.ALL_REDUCE, GB, 8, 4, flat)
                                                            - SIMPLE_BASE))
    # a group inside one node never crosses the oversubscribed tier
    assert collective_time_s(Collective.ALL_REDUCE, GB, 4, 1, over) == collective_time_s(Collective.ALL_REDUCE, GB, 4, 1, flat)


def test_fully_connected_node_gives_a_small_group_only_its_links(h100):
    # 4 GPUs, each with 3 direct links of 100/3 GB/s: a pair uses one link, the whole node all three.
    fc = tiny(h100, topology=Topology.FULLY_CONNECTED)
    assert collective_time_s(Collective.ALL_GATHER, GB, 2, 1, fc) == pytest.approx(SIMPLE_BASE + 0.5 * GB / (100e9 / 3))
    assert collective_time_s(Collective.ALL_GATHER, GB, 4, 1, fc) == pytest.approx(SIMPLE_BASE + 0.75 * GB / 100e9)


def test_ring_topology_strided_group_shares_hops_and_all_to_all_hits_the_bisection(h100):
    ring = tiny(h100, node=8, topology=Topology.RING)
    # members 2 apart: every logical hop is 2 physical hops shared with the interleaved group
    assert collective_time_s(Collective.ALL_GATHER, GB, 4, 2, ring) == pytest.approx(SIMPLE_BASE + 0.75 * GB / 50e9)
    # all-to-all over the 8-ring: n/4 = 2 average hops per byte, so half the switch's rate
    sw = tiny(h100, node=8)
    t_ring = collective_time_s(Collective.ALL_TO_ALL, GB, 8, 1, ring) - SIMPLE_BASE
    t_sw = collective_time_s(Collective.ALL_TO_ALL, GB, 8, 1, sw) - SIMPLE_BASE
    assert t_sw == pytest.approx(7 / 8 * GB / 100e9)
    assert t_ring == pytest.approx(2 * t_sw)


def test_all_to_all_across_nodes_runs_at_one_nic_per_gpu(h100):
    c = tiny(h100)
    # 8 ranks on 2 nodes: half of each buffer leaves the node through the GPU's own 10 GB/s NIC; the
    # 3/8 to node peers at 100 GB/s finish earlier.
    assert collective_time_s(Collective.ALL_TO_ALL, GB, 8, 1, c) == pytest.approx(SIMPLE_BASE + 0.5 * GB / 10e9)


def test_nvls_is_chosen_for_large_all_reduce_inside_the_nvlink_domain(h100):
    name, t = chosen_algorithm(Collective.ALL_REDUCE, 4 * GB, 8, 1, h100)
    assert name == "nvls"
    bus = 4 * GB * 2 * 7 / 8 / t / 1e9
    assert 440 < bus < 480                 # the measured NVLS plateau the spec states (480 GB/s)
    # without NVLS (NCCL_ALGO=Ring) the ring's bus rate is the NVLink rate times bus_efficiency
    ring = with_algorithm(h100, CollectiveAlgorithm.RING)
    name, t = chosen_algorithm(Collective.ALL_REDUCE, 4 * GB, 8, 1, ring)
    assert name == "ring" and 4 * GB * 2 * 7 / 8 / t / 1e9 == pytest.approx(450 * 0.82, rel=0.03)


def test_in_network_reduction_makes_all_reduce_independent_of_node_count(h100):
    sharp = tiny(h100, in_network_reduction=True)
    t16 = algorithm_times(Collective.ALL_REDUCE, GB, 16, 4, sharp)["sharp"]
    t64 = algorithm_times(Collective.ALL_REDUCE, GB, 64, 4, sharp)["sharp"]
    assert t16 == pytest.approx(SIMPLE_BASE + GB / 10e9) and t64 == pytest.approx(t16)
    assert chosen_algorithm(Collective.ALL_REDUCE, GB, 64, 4, sharp)[0] == "sharp"
    assert "sharp" not in algorithm_times(Collective.ALL_REDUCE, GB, 64, 4, tiny(h100))


def test_small_messages_pick_a_low_latency_protocol_and_large_ones_the_ring(h100):
    small = algorithm_times(Collective.ALL_REDUCE, 1024, 64, 8, h100)
    large = algorithm_times(Collective.ALL_REDUCE, 8 * GB, 64, 8, h100)
    # 1 KB over 64 nodes: the tree's 2 log2(64) hops beat the ring's 126 steps by far (well under a
    # millisecond); 8 GB: the ring's 2(n-1)/n beats the tree's 2x per direction
    assert min(small, key=small.get) == "tree" and small["tree"] < 200e-6 and small["tree"] < small["ring"] / 10
    assert min(large, key=large.get) == "ring"


def test_p2p_inside_and_across(h100):
    c = tiny(h100)
    assert p2p_time_s(GB, 1, c) == pytest.approx(SIMPLE_BASE + GB / 100e9)
    assert p2p_time_s(GB, 4, c) == pytest.approx(SIMPLE_BASE + GB / 10e9)
    assert p2p_time_s(GB, 4, tiny(h100, oversub=2.0)) == pytest.approx(SIMPLE_BASE + GB / 5e9)


def test_spine_oversubscription_of_a_tiered_fabric_spares_groups_inside_a_scalable_unit(h100):
    from comet.config.cluster import FabricTier
    flat = tiny(h100, tiers=(FabricTier(size=16),))                 # 4 nodes of 4 GPUs per leaf domain
    spine4 = tiny(h100, oversub=4.0, tiers=(FabricTier(size=16),))
    # DP of 4 with one member per node, all under one leaf: no spine crossing, unchanged
    assert collective_time_s(Collective.ALL_REDUCE, GB, 4, 4, spine4) == collective_time_s(Collective.ALL_REDUCE, GB, 4, 4, flat)
    # DP of 8 across two leaf domains: the ring leaves each domain through its 4 members' uplinks at
    # 1/4 of 10 GB/s each: 10 GB/s per domain, vs 10 GB/s per member at the leaf
    t = collective_time_s(Collective.ALL_REDUCE, GB, 8, 4, spine4)
    assert t == pytest.approx(SIMPLE_BASE + 2 * 7 / 8 * GB / (4 * 10e9 / 4))
    assert collective_time_s(Collective.ALL_REDUCE, GB, 8, 4, flat) == pytest.approx(SIMPLE_BASE + 2 * 7 / 8 * GB / 10e9)


def test_flat_ring_runs_the_whole_group_at_one_nic_per_gpu(h100):
    c = tiny(h100)
    # DP of 8 on two 4-GPU nodes (stride 1). Hierarchical: the node crossing uses the node's 4 NICs
    # together, 4 x 10 GB/s = 40 GB/s (NVLink 100 GB/s is faster). Flat (DeepSpeed-2021 ZeRO-3,
    # physics-notes.md): one ring whose node crossings get one 10 GB/s NIC: 7/8 * 1 GB / 10 GB/s.
    hier = collective_time_s(Collective.ALL_GATHER, GB, 8, 1, c)
    flat = collective_time_s(Collective.ALL_GATHER, GB, 8, 1, c, flat=True)
    assert hier == pytest.approx(SIMPLE_BASE + 7 / 8 * GB / 40e9)
    assert flat == pytest.approx(SIMPLE_BASE + 7 / 8 * GB / 10e9)
    assert collective_time_s(Collective.REDUCE_SCATTER, GB, 8, 1, c, flat=True) == pytest.approx(flat)
    # a group inside one node has no NIC to share: flat changes nothing
    assert collective_time_s(Collective.ALL_GATHER, GB, 4, 1, c, flat=True) == pytest.approx(
        collective_time_s(Collective.ALL_GATHER, GB, 4, 1, c))
    assert chosen_algorithm(Collective.ALL_GATHER, GB, 8, 1, c, flat=True)[0] == "flat_ring"


def test_cp_ring_spanning_nodes_runs_at_the_nic_rate_and_a_ring_inside_a_node_is_unchanged(h100):
    from comet.graph.ir import GroupKind, Op, OpKind
    from comet.hardware.network import ring_exchange_time_s
    from comet.replay.timing import op_time_s
    c = tiny(h100, node=8)        # 8 GPUs per node at 100 GB/s, a 10 GB/s NIC per GPU, ideal links
    # cp 16 (tp 1) over 2 nodes of 8: hops 7->8 and the wrapping hop 15->0 cross the fabric, so the
    # step (all hops at once) takes 1 GB / 10 GB/s; the member-stride p2p would say 1 GB / 100 GB/s
    assert ring_exchange_time_s(GB, 16, 1, c) == pytest.approx(SIMPLE_BASE + GB / 10e9)
    assert p2p_time_s(GB, 1, c) == pytest.approx(SIMPLE_BASE + GB / 100e9)
    # tp 8 x cp 2: both hops (0->8, 8->0) cross the fabric
    assert ring_exchange_time_s(GB, 2, 8, c) == pytest.approx(SIMPLE_BASE + GB / 10e9)
    # tp 2 x cp 4 inside one node: every hop (and the wrap 6->0) on NVLink, as the stride p2p said
    assert ring_exchange_time_s(GB, 4, 2, c) == pytest.approx(SIMPLE_BASE + GB / 100e9) == p2p_time_s(GB, 2, c)
    # the replay times a CP send with it; a pipeline send keeps the stride p2p
    cp_send = Op("attention.cp_exchange[0]", OpKind.SEND, msg_bytes=GB, group_kind=GroupKind.CP,
                 group_size=16, group_stride=1)
    pp_send = Op("pp.send", OpKind.SEND, msg_bytes=GB, group_kind=GroupKind.PP, group_size=2, group_stride=1)
    assert op_time_s(cp_send, c, "bf16") == pytest.approx(SIMPLE_BASE + GB / 10e9)
    assert op_time_s(pp_send, c, "bf16") == pytest.approx(SIMPLE_BASE + GB / 100e9)


def test_two_stage_algorithms_pipeline_in_rounds(h100):
    from comet.config.cluster import CollectiveAlgorithm
    from comet.hardware.network import PIPELINE_ROUND_BYTES, TREE_BUS_FACTOR, TREE_PROTOCOLS
    c = with_algorithm(tiny(h100), CollectiveAlgorithm.TREE)   # 2 nodes of 4: chain in the node, tree between
    base = TREE_PROTOCOLS["simple"][1]
    for msg in (GB, PIPELINE_ROUND_BYTES / 4):
        intra = msg / 100e9                                    # the node's chain at NVLink rate
        net = 2 * msg / (4 * 10e9 * TREE_BUS_FACTOR)           # 2x the buffer per direction over 4 NICs
        # a buffer larger than a round overlaps the stages but for the first round; one of a
        # quarter round runs them one after the other
        lost = min(1.0, PIPELINE_ROUND_BYTES / msg)
        assert collective_time_s(Collective.ALL_REDUCE, msg, 8, 1, c) == pytest.approx(base + net + intra * lost)
    assert lost == 1.0


def test_protocol_factor_slows_the_payload_not_the_fill(h100):
    # ring all-gather of 1 KiB over 4 GPUs at 100 GB/s, no latency, half efficiency at 1 MB per step:
    # the fill is 3 steps x 1 MB / 100 GB/s = 30 us for every protocol; LL moves the payload at 1/4 of
    # the rate and wins on its launch latency (6.6 us vs Simple's 8.4 us)
    c = tiny(h100)
    c = dataclasses.replace(c, network=(dataclasses.replace(c.network[0], half_efficiency_bytes=1e6),) + c.network[1:])
    ll_factor, ll_base = PROTOCOLS["ll"][:2]
    expected = ll_base + 0.75 * 1024 / (100e9 * ll_factor) + 3 * 1e6 / 100e9
    assert collective_time_s(Collective.ALL_GATHER, 1024, 4, 1, c) == pytest.approx(expected)


def test_a_tree_pays_one_chunk_per_stage_of_its_depth(h100):
    from comet.config.cluster import CollectiveAlgorithm
    from comet.hardware.network import PIPELINE_ROUND_BYTES, TREE_BUS_FACTOR, TREE_PROTOCOLS
    # 4 nodes of 4 GPUs; the fabric's step chunk is 1 MB (NVLink's 0): the tree between the 4 nodes is
    # 2 levels deep, so a chunk crosses 2 x 2 network stages (up and down) before the pipeline runs
    # full: 4 x 1 MB / 10 GB/s = 0.4 ms on top of the pipelined stages
    c = tiny(h100)
    fabric = dataclasses.replace(c.network[1], half_efficiency_bytes=1e6)
    c = with_algorithm(dataclasses.replace(c, network=(c.network[0], fabric)), CollectiveAlgorithm.TREE)
    intra = GB / 100e9
    net = 2 * (GB + 1e6) / (4 * 10e9 * TREE_BUS_FACTOR)       # eff(1 GB) = GB / (GB + 1 MB)
    stages = max(intra, net) + min(intra, net) * PIPELINE_ROUND_BYTES / GB
    expected = TREE_PROTOCOLS["simple"][1] + stages + 4 * 1e6 / 10e9
    assert collective_time_s(Collective.ALL_REDUCE, GB, 16, 1, c) == pytest.approx(expected)
    # a buffer smaller than the chunk is one chunk: 4 stages x 64 KB
    small = algorithm_times(Collective.ALL_REDUCE, 65536, 16, 1, c)["tree"]
    assert small > 4 * 65536 / 10e9 and small < 4 * 1e6 / 10e9
