"""PyTorch FSDP's ZeRO-2 (SHARD_GRAD_OP) as it issues its collectives: per-module weight gathers before
each forward, kept through the backward, gradients reduce-scattered per module; hand-computed times on
an ideal one-node cluster (no latency, no efficiency loss, no compute slowdown under communication)."""

import dataclasses

import pytest

from comet.config.cluster import NetworkDim
from comet.config.parallel import ParallelConfig, Recompute
from comet.errors import ConfigError
from comet.evaluate import evaluate
from comet.graph.ir import Collective, GroupKind, OpKind
from comet.hardware.network import PROTOCOLS
from comet.replay.blocks import time_block
from comet.workload.builder import build_step_graph

NODE_GBPS = 100.0
LAUNCH = PROTOCOLS["simple"][1]      # NCCL's fixed launch latency of the Simple protocol (network.py)


@pytest.fixture(scope="module")
def ideal(h100):
    """Four GPUs on one switch at 100 GB/s per GPU and no fabric loss; compute is not slowed by
    communication in flight, so an exposed collective adds exactly its own time."""
    node = NetworkDim("node", 4, NODE_GBPS, latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    fabric = dataclasses.replace(node, name="fabric", size=0)
    return dataclasses.replace(h100, network=(node, fabric),
                               efficiency=dataclasses.replace(h100.efficiency, overlap_slowdown=0.0))


def _par(model, **kw):
    base = dict(tp=1, pp=1, gpus=4, global_batch=4, micro_batch=1, overlap_param_gather=False, reduce_dtype="bf16")
    return ParallelConfig(**(base | kw)).resolve(model)


def _dp_ops(block):
    ops = [block.nodes[n]["op"] for n in block.nodes]
    return [op for op in ops if op.kind is OpKind.COLLECTIVE and op.group_kind is GroupKind.DP]


def _gather_s(model) -> float:
    """Ring all-gather of one layer's bf16 weights over the 4 GPUs: 3/4 of the bytes at 100 GB/s."""
    return LAUNCH + 0.75 * model.layer_params * 2 / (NODE_GBPS * 1e9)


def _kinds(graph) -> dict:
    return {name: [op.collective for op in _dp_ops(graph.blocks[name])]
            for name in ("layer.fwd", "layer.recompute", "layer.bwd")}


AG, RS = Collective.ALL_GATHER, Collective.REDUCE_SCATTER


def test_shard_grad_op_gathers_in_forward_and_reduces_in_backward(tiny_model):
    par = _par(tiny_model, zero=2, fsdp=True, shard_grad_op=True, recompute=Recompute.FULL)
    graph = build_step_graph(tiny_model, par)
    # weights kept from the forward: neither the recompute nor the backward gathers again
    assert _kinds(graph) == {"layer.fwd": [AG], "layer.recompute": [], "layer.bwd": [RS]}
    weights = tiny_model.layer_params * 2
    assert all(op.msg_bytes == weights and op.group_size == 4
               for name in ("layer.fwd", "layer.bwd") for op in _dp_ops(graph.blocks[name]))
    # nothing left for the step-level buckets of Megatron's distributed optimizer
    assert graph.stages[0].grad_buckets == () and graph.stages[0].param_gathers == ()


def test_full_recompute_gathers_again_only_outside_pytorch_fsdp(tiny_model):
    """FULL_SHARD: the backward gathers (for the recompute and the backward together); DeepSpeed-style
    ZeRO-3 hooks fetch again when the checkpointed forward re-runs."""
    fsdp = build_step_graph(tiny_model, _par(tiny_model, zero=3, fsdp=True, recompute=Recompute.FULL))
    assert _kinds(fsdp) == {"layer.fwd": [AG], "layer.recompute": [], "layer.bwd": [AG, RS]}
    hooks = build_step_graph(tiny_model, _par(tiny_model, zero=3, recompute=Recompute.FULL))
    assert _kinds(hooks) == {"layer.fwd": [AG], "layer.recompute": [AG], "layer.bwd": [AG, RS]}


@pytest.mark.parametrize("grad_dtype,reduce_dtype,nbytes", [("fp32", None, 4), ("bf16", None, 2),
                                                             ("fp32", "bf16", 2), ("fp32", "fp16", 2)])
def test_gradients_reduce_scatter_in_the_reduce_dtype(tiny_model, grad_dtype, reduce_dtype, nbytes):
    for kw in (dict(zero=3, fsdp=True), dict(zero=2, fsdp=True, shard_grad_op=True)):
        par = _par(tiny_model, grad_dtype=grad_dtype, reduce_dtype=reduce_dtype, **kw)
        (rs,) = [op for op in _dp_ops(build_step_graph(tiny_model, par).blocks["layer.bwd"]) if op.collective is RS]
        assert rs.msg_bytes == tiny_model.layer_params * nbytes


def test_shard_grad_op_and_reduce_dtype_rules(tiny_model):
    for kw in (dict(zero=3, fsdp=True), dict(zero=2, fsdp=False), dict(zero=1, fsdp=True)):
        with pytest.raises(ConfigError, match="shard_grad_op"):
            _par(tiny_model, shard_grad_op=True, **kw)
    with pytest.raises(ConfigError, match="reduce_dtype"):
        _par(tiny_model, reduce_dtype="fp8")


def test_forward_waits_for_its_gather_by_hand(tiny_model, ideal):
    """Without forward prefetch the layer's first kernel waits for its own gather: the forward is the
    zero-1 forward plus the gather; the backward's reduce-scatter hides behind the backward's compute."""
    sgo = build_step_graph(tiny_model, _par(tiny_model, zero=2, fsdp=True, shard_grad_op=True)).blocks
    plain = build_step_graph(tiny_model, _par(tiny_model, zero=1)).blocks
    fwd, fwd0 = (time_block(b["layer.fwd"], ideal, "bf16") for b in (sgo, plain))
    assert fwd.duration_s == pytest.approx(fwd0.duration_s + _gather_s(tiny_model), rel=1e-9)
    assert fwd.parts["exposed_dp"] == pytest.approx(_gather_s(tiny_model), rel=1e-9)
    bwd, bwd0 = (time_block(b["layer.bwd"], ideal, "bf16") for b in (sgo, plain))
    reduce_s = _gather_s(tiny_model)        # a reduce-scatter moves the same 3/4 of the bytes
    assert bwd0.duration_s > reduce_s
    assert bwd.duration_s == pytest.approx(bwd0.duration_s, rel=1e-9)


def test_step_exposes_one_gather_per_layer_and_micro_batch(tiny_model, ideal):
    """Two micro-batches: FSDP re-gathers every layer before each forward (SHARD_GRAD_OP reshards after
    the backward), so the step exposes 2 x layers gathers and no step-level reduction."""
    par = _par(tiny_model, zero=2, fsdp=True, shard_grad_op=True, global_batch=8)
    assert par.num_microbatches == 2
    res = evaluate(tiny_model, ideal, par)
    assert res.feasible
    expected = 2 * tiny_model.layers * _gather_s(tiny_model)
    assert res.breakdown["exposed_dp"] == pytest.approx(expected, rel=1e-9)
