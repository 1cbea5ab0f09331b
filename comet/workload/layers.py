"""Op-level blocks of a Megatron-style transformer on one representative rank.

Each block is a small flat op graph (forward, backward or recompute of one layer; embedding; output
head) with compute kernels on the "compute" stream and collectives on per-group communication
streams, as the PyTorch profiler records a Megatron-LM step. Shapes follow Megatron-LM's tensor and
sequence parallelism (Shoeybi et al. 2019 Fig. 3; Korthikanti et al. 2022 Fig. 5): column-parallel QKV
and FC1, row-parallel projection and FC2; without sequence parallelism one all-reduce after each
row-parallel GEMM (forward) and after each column-parallel dgrad (backward); with it an all-gather
before and a reduce-scatter after, and the backward re-gathers the layer input for the weight gradient.
"""

from __future__ import annotations

import networkx as nx

from comet.config.model import ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Recompute, SelectivePolicy
from comet.graph.ir import Collective, GroupKind, Phase
from comet.workload.block_builder import ACT_BYTES, BlockBuilder, Dims, empty_block
from comet.workload.layer_parts import (attention_backward, attention_core, attention_forward, col_backward,
                                        dense_mlp_backward, dense_mlp_forward, dropout_add, grad_in, norm, tp_in,
                                        tp_out)

# HBM bytes per logit (tokens x vocab / tp) the loss moves: (forward, backward), by implementation
# (ParallelConfig.loss_impl; the bytes it keeps are comet/workload/memory.py LOSS_LOGIT_BYTES).
#  fused: one pass that reads the 16-bit logits and writes the fp32 softmax (2 + 4) plus a reduction
#    re-read (4); the backward reads it and writes the 16-bit gradient (4 + 2).
#  eager: PyTorch eager F.cross_entropy(pred.float()) (torchtitan before 0.1.0): cast (read 2, write 4),
#    log_softmax (4 + 4), nll_loss (a gather); backward: nll_loss_backward writes a zero fp32 gradient
#    (4), log_softmax_backward reads it and the saved output and writes a new one (4 + 4 + 4), and the
#    cast's backward returns 16 bits (4 + 2): 14 and 22.
#  megatron: Megatron-Core's unfused vocab_parallel_cross_entropy, its default (ModelParallelConfig
#    cross_entropy_loss_fusion = False; megatron-core 0.8.0 tensor_parallel/cross_entropy.py), one kernel
#    per line: logits.float() (2 + 4), max (4), in-place subtract of the max (4 + 4), exp (4 + 4), sum
#    (4), div_ by the sum to the saved softmax (4 + 4): 38; backward: the scatter at the targets, mul_ by
#    the output gradient (4 + 4) and the cast's backward to 16 bits (4 + 2): 14.
LOSS_HBM_BYTES = {"fused": (ACT_BYTES + 4 * 2, 4 + ACT_BYTES),
                  "eager": (ACT_BYTES + 4 + 4 * 2, 4 + 4 * 3 + 4 + ACT_BYTES),
                  "megatron": (ACT_BYTES + 4 + 4 + 4 * 2 + 4 * 2 + 4 + 4 * 2, 4 * 2 + 4 + ACT_BYTES)}


# perf: enum members bound once (a member read through its class is ~0.13 us on Python 3.11)
_ALL_GATHER, _ALL_REDUCE, _REDUCE_SCATTER = Collective.ALL_GATHER, Collective.ALL_REDUCE, Collective.REDUCE_SCATTER
_TP, _DP = GroupKind.TP, GroupKind.DP
_FORWARD, _BACKWARD, _RECOMPUTE = Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE
_WEIGHTS, _ACTIVATIONS = OffloadTarget.WEIGHTS, OffloadTarget.ACTIVATIONS
_FULL, _SELECTIVE, _ATTENTION_POLICY = Recompute.FULL, Recompute.SELECTIVE, SelectivePolicy.ATTENTION


# ------------------------------------------------------------------------------------------- blocks
def _layer_weight_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    return model.layer_params / par.tp * ACT_BYTES


def _zero3_and_offload(bb: BlockBuilder, model: ModelSpec, D: Dims, backward: bool) -> list:
    """Per-layer traffic that overlaps the layer's compute in steady state: the ZeRO-3 gather of the
    next layer's weights (and, backward, the reduce-scatter of the previous layer's gradients), and
    expansion-tier streaming of weights / activations. They have no dependency inside the block: each
    stands for the prefetch issued one layer ahead; the block ends when they are done. Without
    forward prefetch (overlap_param_gather off; PyTorch FSDP's default forward_prefetch=False) the
    forward gathers the layer's own weights first: returns what the layer's first kernel waits for.
    FSDP SHARD_GRAD_OP (par.shard_grad_op) gathers in the forward (and a full recompute) the same way
    but keeps the weights through the backward: no backward gather, the gradients reduce-scattered."""
    par = bb.par
    weights = _layer_weight_bytes(model, par)
    first: list = []
    if par.per_module_dp_collectives and par.dp * par.cp > 1:
        flat = par.dp_collective == "flat"    # DeepSpeed-2021: one ring at one NIC per GPU (network.py)
        # Which passes gather the weights: every forward; the backward unless SHARD_GRAD_OP kept them from
        # the forward; a full recompute only where the framework's hooks fetch again (DeepSpeed ZeRO-3).
        # PyTorch FSDP checkpoints inside its unit (Composer dist_strategy.py applies activation
        # checkpointing after FSDP wrapping and skips FSDP modules; torchtitan wraps checkpointed blocks
        # with fully_shard), so the recompute runs on the weights the backward's gather brought in.
        gathers = not par.fsdp if bb.phase is _RECOMPUTE else not (backward and par.shard_grad_op)
        if gathers:
            ag = bb.collective("zero3.all_gather_params", _ALL_GATHER, weights, _DP, [], flat)
            if not backward and not par.overlap_param_gather:
                first = [ag]
        if backward:   # gradients reduced in the reduce dtype (FSDP MixedPrecision.reduce_dtype)
            grads = model.layer_params / par.tp * par.grad_reduce_bytes
            bb.collective("zero3.reduce_scatter_grads", _REDUCE_SCATTER, grads, _DP, [], flat)
    if _WEIGHTS in par.offload:
        bb.offload("offload.weights_in", weights, [])
    if _ACTIVATIONS in par.offload:
        from comet.workload.memory import activation_bytes_per_layer
        bb.offload("offload.activations_in" if backward else "offload.activations_out",
                   activation_bytes_per_layer(model, par), [])
    return first



def layer_forward(model: ModelSpec, par: ParallelConfig, phase: Phase = _FORWARD,
                  mlp_forward=dense_mlp_forward) -> nx.DiGraph:
    """One layer's forward; `mlp_forward` is the MLP (dense, or comet.workload.moe's expert layer)."""
    D = Dims.of(model, par)
    bb = BlockBuilder(phase, par, model)
    x = norm(bb, D, "input_norm", _zero3_and_offload(bb, model, D, backward=False))
    x = attention_forward(bb, D, x)
    x = dropout_add(bb, D, "attention.dropout_add", x)
    x = norm(bb, D, "mlp_norm", x)
    x = mlp_forward(bb, D, x)
    dropout_add(bb, D, "mlp.dropout_add", x)
    return bb.done()


def layer_backward(model: ModelSpec, par: ParallelConfig, mlp_backward=dense_mlp_backward) -> nx.DiGraph:
    D = Dims.of(model, par)
    bb = BlockBuilder(_BACKWARD, par, model)
    _zero3_and_offload(bb, model, D, backward=True)
    x = dropout_add(bb, D, "mlp.dropout_add.bwd", [])
    x = mlp_backward(bb, D, x)
    x = norm(bb, D, "mlp_norm.bwd", x, backward=True)
    x = dropout_add(bb, D, "attention.dropout_add.bwd", x)
    x = attention_backward(bb, D, x)
    x = norm(bb, D, "input_norm.bwd", x, backward=True)
    bb.memory("residual_grad_add", D.Ts * D.h * ACT_BYTES * 3, x)
    return bb.done()


def layer_recompute(model: ModelSpec, par: ParallelConfig, forward=layer_forward, moe_layer: bool = False) -> nx.DiGraph:
    """What runs again before a layer's backward: the whole forward (full), the attention core of an
    unfused implementation (selective, Korthikanti et al. sec. 5), or nothing (flash attention already
    recomputes its scores inside the backward kernel); plus Megatron-Core's recompute modules."""
    recompute = par.recompute
    if recompute is _FULL:
        return forward(model, par, phase=_RECOMPUTE)
    if recompute is _SELECTIVE and par.selective_policy is not _ATTENTION_POLICY:
        return _policy_recompute(model, par, par.selective_policy)
    if recompute is not _SELECTIVE or (par.flash_attention and not par.recompute_modules):
        # perf (i23b-blocks): nothing runs again (no attention core; no module: recompute_modules.active is
        # empty): the empty block, as the builder gives it, without a builder or the import below
        # (~3.6 -> ~0.9 us a cold call; tests/workload/test_builder.py)
        return empty_block()
    from comet.workload.recompute_modules import add_recompute_ops   # (it imports this module)
    bb = BlockBuilder(_RECOMPUTE, par, model)
    if par.recompute is _SELECTIVE and not par.flash_attention:
        attention_core(bb, Dims.of(model, par), [], backward=False)
    add_recompute_ops(bb, moe_layer)
    return bb.done()


def _policy_recompute(model: ModelSpec, par: ParallelConfig, policy) -> nx.DiGraph:
    """The forward work a framework's selective policy re-runs before the layer's backward (see
    comet.workload.memory._policy_saved_bytes for what each keeps). op_sac: the norms, the recomputed
    mm's wk (kv wide), wo and w3 (f wide) and the activation; save_qkv: everything after the QKV GEMM."""
    D = Dims.of(model, par)
    bb = BlockBuilder(_RECOMPUTE, par, model)
    x = norm(bb, D, "input_norm", [])
    if policy is SelectivePolicy.OP_SAC:
        x = [bb.gemm("wk", D.T, D.kv // D.t, D.h, x)]
        x = tp_out(bb, D, "proj", D.T, D.h, D.h // D.t, x)
        x = norm(bb, D, "mlp_norm", x)
        x = [bb.gemm("w3", D.T, D.f // D.t, D.h, x)]
        bb.memory(D.act, D.T * D.f // D.t * ACT_BYTES * (D.gate + 1), x)
        return bb.done()
    x = attention_core(bb, D, x, backward=False)
    x = tp_out(bb, D, "proj", D.T, D.h, D.h // D.t, x)
    x = dropout_add(bb, D, "attention.dropout_add", x)
    x = norm(bb, D, "mlp_norm", x)
    x = tp_in(bb, D, "fc1", D.T, D.gate * D.f // D.t, D.h, x)
    x = [bb.memory(D.act, D.T * D.f // D.t * ACT_BYTES * (D.gate + 1), x)]
    tp_out(bb, D, "fc2", D.T, D.h, D.f // D.t, x)
    return bb.done()


def embedding_forward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    """Vocab-parallel embedding lookup: each TP rank writes its rows, the partial embeddings are summed
    over the TP group (reduce-scattered under SP), then embedding dropout."""
    D = Dims.of(model, par)
    bb = BlockBuilder(_FORWARD, par, model)
    x = [bb.memory("embedding.lookup", D.T * D.h * ACT_BYTES * 2, [])]
    if D.t > 1:
        kind = _REDUCE_SCATTER if D.sp else _ALL_REDUCE
        x = [bb.collective(f"embedding.{kind._value_}", kind, D.T * D.h * ACT_BYTES, _TP, x)]
    bb.memory("embedding.dropout", D.Ts * D.h * (2 * ACT_BYTES + 1), x)
    return bb.done()


def embedding_backward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    D = Dims.of(model, par)
    bb = BlockBuilder(_BACKWARD, par, model)
    x = [bb.memory("embedding.dropout.bwd", D.Ts * D.h * (2 * ACT_BYTES + 1), [])]
    x = grad_in(bb, D, "embedding", x)
    # F.embedding's weight gradient is dense: a zero V/t x h tensor in the weight's 16-bit dtype with the
    # T gradient rows accumulated into it (torch/_decomp/decompositions.py embedding_dense_backward:
    # new_zeros + index_put accumulate): write 2 B per weight; read 2 per row element, read + write 2 + 2
    x = [bb.memory("embedding.grad_scatter_add", D.V // D.t * D.h * ACT_BYTES + D.T * D.h * ACT_BYTES * 3, x)]
    if not (par.fsdp and par.fsdp_impl == "torch"):
        # Megatron-Core's DDP hook adds it into the fp32 main gradient each micro-batch
        # (megatron-core 0.8.0 distributed/distributed_data_parallel.py _make_param_hook:
        # param.main_grad.add_(param.grad.data)): read 4 + 2, write 4 per weight. PyTorch FSDP hands the
        # 16-bit gradient to its reduce-scatter instead.
        bb.memory("embedding.main_grad_add", D.V // D.t * D.h * (4 + ACT_BYTES + 4), x)
    return bb.done()


def head_forward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    """Final norm, vocab-parallel logits GEMM and cross-entropy (fp32 softmax over V/t columns with
    three small all-reduces over TP: max, sum of exponentials, target logit; Megatron
    vocab_parallel_cross_entropy)."""
    D = Dims.of(model, par)
    bb = BlockBuilder(_FORWARD, par, model)
    x = norm(bb, D, "final_norm", [])
    x = tp_in(bb, D, "logits", D.T, D.V // D.t, D.h, x)
    x = [bb.memory("cross_entropy", D.T * D.V // D.t * LOSS_HBM_BYTES[par.loss_impl][0], x)]
    if D.t > 1:
        for what in ("max", "sum_exp", "target"):
            x = [bb.collective(f"cross_entropy.all_reduce_{what}", _ALL_REDUCE, D.T * 4, _TP, x)]
    return bb.done()


def head_backward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    D = Dims.of(model, par)
    bb = BlockBuilder(_BACKWARD, par, model)
    x = [bb.memory("cross_entropy.bwd", D.T * D.V // D.t * LOSS_HBM_BYTES[par.loss_impl][1], [])]
    x = col_backward(bb, D, "logits", D.V // D.t, x)
    norm(bb, D, "final_norm.bwd", x, backward=True)
    return bb.done()

