"""Provisioning changes the step time of a candidate that depends on it by the physical amount, and
leaves a candidate that does not depend on it unchanged (hand-computed on a tiny cluster)."""

import dataclasses

import pytest

from comet.config.cluster import MemoryTier, NetworkDim, Topology
from comet.config.model import ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig
from comet.evaluate import evaluate, resolve
from comet.graph.ir import Collective, OpKind
from comet.hardware.network import PROTOCOLS
from comet.replay.timing import op_time_s
from comet.workload.builder import build_step_graph

GB = 1e9
SIMPLE_BASE = PROTOCOLS["simple"][1]     # NCCL's fixed launch latency of the Simple protocol


def tiny_cluster(h100, oversub=1.0, node_topology=Topology.SWITCH, expansion_GBps=None):
    """4 GPUs per node at 100 GB/s, a 10 GB/s fabric; no latency or efficiency loss on the links."""
    ideal = dict(latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    net = (NetworkDim("node", 4, 100.0, topology=node_topology, **ideal),
           NetworkDim("fabric", 0, 10.0, oversubscription=oversub, **ideal))
    tier = MemoryTier("cxl", 1000.0, expansion_GBps) if expansion_GBps else None
    return dataclasses.replace(h100, network=net, memory_expansion=tier)


def step(model, cluster, **par):
    r = evaluate(model, cluster, ParallelConfig(**par))
    assert r.status.value == "ok", r.reason
    return r.step_time_s


# DP gradients reduced after the backward, nothing overlapped: the step ends with every bucket in turn
EXPOSED_DP = dict(tp=1, pp=1, gpus=8, global_batch=8, zero=0, overlap_grad_reduce=False)


def dp_bucket_bytes(model, cluster, **par):
    graph = build_step_graph(model, resolve(model, cluster, ParallelConfig(**par)))
    return [(bs.op.msg_bytes, bs.count, bs.op.group_size, bs.op.group_stride) for bs in graph.stages[0].grad_buckets]


def test_oversubscription_adds_exactly_the_slower_crossing_to_a_dp_bound_candidate(tiny_model, h100):
    flat, over = tiny_cluster(h100), tiny_cluster(h100, oversub=4.0)
    buckets = dp_bucket_bytes(tiny_model, flat, **EXPOSED_DP)
    assert buckets and all(n == 8 and stride == 1 for _, _, n, stride in buckets)   # 2 nodes x 4 GPUs
    # ring all-reduce over 8 ranks on 2 nodes: the node crossing carries 2*7/8 of the buffer through
    # the node's 4 NICs (40 GB/s, or 10 GB/s at 4:1): delta = 2*7/8*S*(1/10 - 1/40) per bucket
    expected = sum(count * 2 * 7 / 8 * s * (1 / 10e9 - 1 / 40e9) for s, count, _, _ in buckets)
    delta = step(tiny_model, over, **EXPOSED_DP) - step(tiny_model, flat, **EXPOSED_DP)
    assert delta == pytest.approx(expected, rel=1e-6)


def test_oversubscription_leaves_a_single_node_candidate_unchanged(tiny_model, h100):
    par = dict(tp=2, pp=1, gpus=4, global_batch=8, zero=0, overlap_grad_reduce=False)
    assert step(tiny_model, tiny_cluster(h100, oversub=4.0), **par) == step(tiny_model, tiny_cluster(h100), **par)


def test_fully_connected_node_slows_a_tp2_group_by_its_one_link(h100):
    # TP=2 inside a 4-GPU node: a switch gives the pair 100 GB/s, a full mesh one of three links
    # (33.3 GB/s): every TP collective's bandwidth time triples; a TP=4 group uses all three links.
    # Activations of 2048 x 4096 x 2 B = 16 MB per collective: bandwidth-bound, launch latency < 1%.
    model = ModelSpec(name="wide", layers=2, hidden=4096, heads=32, vocab=4096, seq_len=2048)
    par2 = dict(tp=2, pp=1, gpus=2, global_batch=8, overlap_tp_comm=False)
    par4 = dict(tp=4, pp=1, gpus=4, global_batch=8, overlap_tp_comm=False)
    sw, fc = tiny_cluster(h100), tiny_cluster(h100, node_topology=Topology.FULLY_CONNECTED)
    graph = build_step_graph(model, resolve(model, sw, ParallelConfig(**par2)))
    tp_ops = [op for g in graph.blocks.values() for _, op in g.nodes(data="op")
              if op.kind is OpKind.COLLECTIVE and op.group_size == 2 and op.msg_bytes >= 1e6]
    assert tp_ops
    for op in tp_ops:   # pair ring: (n-1)/n of the buffer per pass, at 100 GB/s or one 33.3 GB/s link
        moved = (2 if op.collective is Collective.ALL_REDUCE else 1) * 0.5 * op.msg_bytes
        assert op_time_s(op, sw, "bf16") == pytest.approx(SIMPLE_BASE + moved / 100e9)
        assert op_time_s(op, fc, "bf16") == pytest.approx(SIMPLE_BASE + moved / (100e9 / 3))
    r_sw, r_fc = evaluate(model, sw, ParallelConfig(**par2)), evaluate(model, fc, ParallelConfig(**par2))
    # the replay exposes the slower collectives: exposed TP time grows at least by the blocking part
    assert r_fc.breakdown["exposed_tp"] > 2.9 * r_sw.breakdown["exposed_tp"]
    assert r_fc.step_time_s > r_sw.step_time_s + 2 * r_sw.breakdown["exposed_tp"] * 0.95
    assert step(model, fc, **par4) == pytest.approx(step(model, sw, **par4), rel=1e-9)


def test_expansion_bandwidth_sets_the_offloaded_optimizer_time(tiny_model, h100):
    par = dict(tp=1, pp=1, gpus=1, global_batch=8, offload=(OffloadTarget.OPTIMIZER,))
    slow, fast = tiny_cluster(h100, expansion_GBps=0.5), tiny_cluster(h100, expansion_GBps=1.0)
    graph = build_step_graph(tiny_model, resolve(tiny_model, slow, ParallelConfig(**par)))
    link_bytes = sum(op.bytes for op in graph.stages[0].optimizer if op.kind is OpKind.MEMCPY)
    e = h100.efficiency.offload
    # the link time exceeds the Adam kernels at both rates, so the step moves by the link time difference
    expected = link_bytes / (0.5e9 * e) - link_bytes / (1.0e9 * e)
    assert step(tiny_model, slow, **par) - step(tiny_model, fast, **par) == pytest.approx(expected, rel=1e-6)
    # a candidate that does not offload does not see the expansion tier
    plain = dict(tp=1, pp=1, gpus=1, global_batch=8)
    assert step(tiny_model, slow, **plain) == step(tiny_model, fast, **plain)
