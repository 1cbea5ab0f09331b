"""Mixture-of-experts layers as op blocks on one rank, following Megatron-Core's MoELayer with the
all-to-all (or all-gather) token dispatcher (megatron/core/transformer/moe/token_dispatcher.py):

  router GEMM (h -> experts) and top-k -> permute (one copy of a token per chosen expert)
  -> dispatch: all-to-all over the EP group -> all-gather over the expert-TP group (etp > 1)
  -> sort the received rows by local expert (more than one local expert)
  -> grouped expert GEMMs (FC1, activation, FC2) of this rank's experts, each expert's FFN split over etp
  -> restore the source order -> reduce-scatter over etp -> combine: all-to-all back
  -> unpermute (weighted sum of the k copies)
  -> shared experts (an ordinary TP-split MLP on the rank's own tokens), added to the output.

Token counts per rank and micro-batch: the layer input holds n = T / tp tokens under sequence
parallelism (Megatron-Core requires SP when tp > 1 with MoE); n*k routed copies leave the rank and, with
balanced routing, n*k arrive for its num_experts/ep local experts (times etp after the ETP all-gather).
`load` scales what the busiest rank receives: the capacity factor when set (tokens beyond capacity are
dropped and experts padded to capacity, NeMo's moe_pad_expert_input_to_capacity), else the stated
imbalance (busiest EP rank / mean; 1 = balanced, as the force-balanced published benchmarks run).

The all-to-all is timed by comet.hardware.network.collective_time_s: inside a node over NVLink, across
nodes at about one NIC's bandwidth per GPU. Without overlap the next kernel waits for it (Megatron's
default: the collective blocks the compute stream); with `moe_overlap_a2a` (DeepEP / Megatron-Core's
1F1B all-to-all overlap, --overlap-moe-expert-parallel-comm) the dispatch and combine of one
micro-batch run beside another's compute, modelled as communication with no kernel waiting on it: only
what the layer's compute cannot cover is exposed.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from comet.config.model import ModelSpec
from comet.config.moe import Dispatcher
from comet.config.parallel import ParallelConfig, Precision
from comet.graph.ir import Collective, GroupKind, KernelClass, Op, OpKind
from comet.workload import layer_parts, layers
from comet.workload.block_builder import ACT_BYTES, FP8_BYTES, BlockBuilder, Deps, Dims

FP8_SAVED_BYTES = 1        # FP8 GEMM inputs saved for backward (Transformer Engine)
ROUTER_LOGIT_BYTES = 4      # router logits / probabilities kept in fp32 (Megatron-Core router: float32 softmax)


def load_factor(par: ParallelConfig) -> float:
    """Routed tokens arriving at the busiest EP rank over the balanced mean."""
    return par.moe_capacity_factor if par.moe_capacity_factor is not None else par.moe_imbalance


def tokens_in(model: ModelSpec, par: ParallelConfig) -> int:
    """Tokens entering a MoE layer on one rank per micro-batch (the SP shard when tp > 1)."""
    return Dims.of(model, par).Ts


def routed_tokens(model: ModelSpec, par: ParallelConfig) -> float:
    """Token copies this rank's experts process per micro-batch (after the ETP all-gather, busiest rank)."""
    return tokens_in(model, par) * model.moe.experts_per_token * par.expert_tp * load_factor(par)


def dispatch_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """The dispatch (and combine) all-to-all buffer per rank per micro-batch: n*k copies of h in bf16,
    scaled by the busiest rank's load."""
    return tokens_in(model, par) * model.moe.experts_per_token * model.hidden * ACT_BYTES * load_factor(par)


def _grouped_gemm(bb: BlockBuilder, name: str, m: float, n: int, k: float, experts: int, deps: Deps) -> int:
    """`experts` GEMMs of m x n x k each as one grouped kernel (TE/CUTLASS grouped GEMM). Small per-expert
    shapes pay their wave-quantization and k-loop overheads in the GEMM model; FP8 applies to it as to
    the dense GEMMs, with the same fused cast + transpose of the m x k operand (not for the wgrad)."""
    m_i, k_i = max(1, round(m)), max(1, round(k))
    fp8 = bb.par.precision is Precision.FP8
    if fp8 and not name.endswith(".wgrad"):   # TE GroupedLinear: fused multi cast + transpose, as BlockBuilder.gemm
        deps = [bb.memory(f"{name}.fp8_cast_transpose", m_i * k_i * experts * (ACT_BYTES + 2 * FP8_BYTES), deps)]
    return bb._add(Op.unchecked(name, OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=(m_i, n, k_i, experts),
                      flops=2.0 * m_i * n * k_i * experts, dtype_bytes=1 if fp8 else 2, phase=bb.phase), deps)


def sort_chunks_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """HBM bytes of one "permutation 2" of the all-to-all dispatcher: with more than one local expert, the
    received (and ETP-gathered) rows arrive grouped by source rank and are copied into per-expert order
    before the grouped GEMM, and back into source order before the combine (Megatron-Core
    token_dispatcher.py MoEAlltoAllTokenDispatcher: `sort_chunks_by_idxs` by `sort_input_by_local_experts` /
    `restore_output_by_local_experts`; under drop-and-pad the equivalent reshape-transpose-contiguous of
    the [ep, local experts, capacity] buffer). A memory-bound gather: every routed row read and written
    once, in bf16. Its autograd backward is the inverse copy of the same size. The all-gather dispatcher
    permutes the gathered tokens directly in expert order, so it has no second sort."""
    local = model.moe.num_experts // par.ep
    if local <= 1 or par.moe_dispatcher is not Dispatcher.ALLTOALL:
        return 0.0
    return 2 * routed_tokens(model, par) * model.hidden * ACT_BYTES


def _sort_chunks(bb: BlockBuilder, name: str, model: ModelSpec, deps: Deps) -> Deps:
    nbytes = sort_chunks_bytes(model, bb.par)
    return [bb.memory(name, nbytes, deps)] if nbytes else deps


def expert_dims(model: ModelSpec, par: ParallelConfig) -> tuple[int, int, int, float]:
    """(local experts, FFN width per expert per rank, gate factor, tokens per local expert)."""
    moe = model.moe
    local = moe.num_experts // par.ep
    return local, moe.expert_ffn_hidden // par.expert_tp, 2 if model.gated else 1, routed_tokens(model, par) / local


# The exchanges that move tokens towards the experts: the dispatch, and the gradient of the combine (the
# autograd backward of a reduce-scatter is an all-gather, of an all-gather a reduce-scatter).
_TOWARDS_EXPERTS = ("dispatch", "combine.bwd")


def _exchange(bb: BlockBuilder, name: str, model: ModelSpec, deps: Deps) -> Deps:
    """Dispatch or combine (or their gradients) over EP and expert-TP, in Megatron-Core's order
    (token_dispatcher.py MoEAlltoAllTokenDispatcher): towards the experts the EP all-to-all, then the ETP
    all-gather; back from them the ETP reduce-scatter, then the all-to-all. Backward runs each exchange
    reversed, so the gradient of the combine gathers and that of the dispatch reduce-scatters. Returns
    what the next kernel waits for."""
    par = bb.par
    msg = dispatch_bytes(model, par)
    gather = name in _TOWARDS_EXPERTS
    out = deps

    def ep(out: Deps) -> Deps:
        if par.ep <= 1:
            return out
        if par.moe_dispatcher is Dispatcher.ALLTOALL:
            return [bb.collective(f"moe.{name}.all_to_all", Collective.ALL_TO_ALL, msg, GroupKind.EP, out)]
        # allgather dispatcher: every rank gathers all EP peers' tokens, reduce-scatters the outputs
        kind = Collective.ALL_GATHER if gather else Collective.REDUCE_SCATTER
        n = tokens_in(model, par) * model.hidden * ACT_BYTES * par.ep
        return [bb.collective(f"moe.{name}.{kind.value}", kind, n, GroupKind.EP, out)]

    def etp(out: Deps) -> Deps:
        if par.expert_tp <= 1:
            return out
        kind = Collective.ALL_GATHER if gather else Collective.REDUCE_SCATTER
        return [bb.collective(f"moe.{name}.etp_{kind.value}", kind, msg * par.expert_tp, GroupKind.ETP, out)]

    out = etp(ep(out)) if gather else ep(etp(out))
    if par.moe_overlap_a2a and out is not deps:
        return deps          # overlapped: the next kernel does not wait (see the module docstring)
    return out


# Megatron-Core's TEGroupedMLP builds linear_fc2 with skip_bias_add=True and adds the FC2 expert bias,
# weighted by each row's routing probability, in a Python loop over the local experts (`_apply_bias`,
# megatron/core/transformer/moe/experts.py, megatron-core 0.16.0): per expert `b * p` (rows x h written)
# and `t + b*p` (two read, one written), then `torch.cat` of the results (read + written). Backward,
# per expert, the bias gradient (g * p).sum(0) and the probability gradient (g * b).sum(-1) (a product
# written and reduced each), and the split's gradient concatenated. The FC1 bias is added inside the
# grouped GEMM (skip_bias_add=False). Passes of one expert's rows x h in bf16, per kernel:
_FC2_BIAS_KERNELS = ((".mul", 1), (".add", 3))
_FC2_BIAS_GRAD_KERNELS = ((".bias_grad.mul", 2), (".bias_grad.sum", 1), (".prob_grad.mul", 2), (".prob_grad.sum", 1))


def _expert_fc2_bias(bb: BlockBuilder, model: ModelSpec, deps: Deps, backward: bool) -> Deps:
    """The FC2 expert bias of a biased MoE (gpt-oss) as Megatron-Core applies it; nothing without biases."""
    if not model.linear_bias:
        return deps
    local, _, _, m_e = expert_dims(model, bb.par)
    rows_h = m_e * model.hidden * ACT_BYTES
    x = deps
    for _ in range(local):     # one kernel per expert and step: the loop launches them one by one
        for suffix, passes in (_FC2_BIAS_GRAD_KERNELS if backward else _FC2_BIAS_KERNELS):
            x = [bb.memory(f"experts.fc2_bias{suffix}", passes * rows_h, x)]
    return [bb.memory("experts.fc2_bias.cat", 2 * local * rows_h, x)]


def _shared_dims(model: ModelSpec, par: ParallelConfig) -> Dims:
    return replace(Dims.of(model, par), f=model.moe.shared_ffn_hidden)


def _expert_weight_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """bf16 weights of this rank's experts of one layer (E/ep experts, each split over etp)."""
    return routed_expert_params(model) / (par.ep * par.expert_tp) * ACT_BYTES


def _fsdp_experts(bb: BlockBuilder, model: ModelSpec, backward: bool) -> Deps:
    """ZeRO-3 / FSDP over expert-DP: the layer's expert weights are all-gathered (prefetched one layer ahead,
    like the dense weights in layers._zero3_and_offload) and, backward, their gradients reduce-scattered.
    Returns what the first expert GEMM waits for (the gather, when it is not prefetched)."""
    par = bb.par
    if par.zero < 3 or par.expert_dp <= 1:
        return []
    w = _expert_weight_bytes(model, par)
    ag = bb.collective("zero3.expert_all_gather", Collective.ALL_GATHER, w, GroupKind.EDP, [])
    if backward:
        bb.collective("zero3.expert_reduce_scatter", Collective.REDUCE_SCATTER, w, GroupKind.EDP, [])
    return [ag] if not backward and not par.overlap_param_gather else []


def moe_mlp_forward(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    model, par = bb.model, bb.par
    moe = model.moe
    n = D.Ts
    local, f_local, gate, m_e = expert_dims(model, par)
    gathered = _fsdp_experts(bb, model, backward=False)
    start = x
    x = [bb.gemm("router", n, moe.num_experts, D.h, x)]
    x = [bb.memory("router.topk_softmax", n * moe.num_experts * ROUTER_LOGIT_BYTES * 3, x)]
    x = [bb.memory("moe.permute", n * D.h * ACT_BYTES * (1 + moe.experts_per_token), x)]
    x = _exchange(bb, "dispatch", model, x)
    x = _sort_chunks(bb, "moe.sort_by_expert", model, x)
    rows = m_e * local
    x = [_grouped_gemm(bb, "experts.fc1", m_e, gate * f_local, D.h, local, x + gathered)]
    x = [bb.memory(f"experts.{D.act}", rows * f_local * ACT_BYTES * (gate + 1), x)]
    x = [_grouped_gemm(bb, "experts.fc2", m_e, D.h, f_local, local, x)]
    x = _expert_fc2_bias(bb, model, x, backward=False)
    x = _sort_chunks(bb, "moe.restore_order", model, x)
    x = _exchange(bb, "combine", model, x)
    x = [bb.memory("moe.unpermute", n * D.h * ACT_BYTES * (1 + moe.experts_per_token), x)]
    if moe.shared_ffn_hidden:
        # Shared experts run on the layer input; overlapped with dispatch only when the framework does it.
        shared = layer_parts.dense_mlp_forward(bb, _shared_dims(model, par), start if par.moe_overlap_a2a else x,
                                          name="shared_expert.")
        x = x + shared
    return x


def moe_mlp_backward(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    model, par = bb.model, bb.par
    moe = model.moe
    n = D.Ts
    local, f_local, gate, m_e = expert_dims(model, par)
    _fsdp_experts(bb, model, backward=True)
    start = x
    x = [bb.memory("moe.unpermute.bwd", n * D.h * ACT_BYTES * (1 + moe.experts_per_token), x)]
    x = _exchange(bb, "combine.bwd", model, x)      # gradient of the combine: all-to-all to the experts
    x = _sort_chunks(bb, "moe.restore_order.bwd", model, x)
    x = _expert_fc2_bias(bb, model, x, backward=True)
    rows = m_e * local
    d2 = _grouped_gemm(bb, "experts.fc2.dgrad", m_e, f_local, D.h, local, x)
    w2 = _grouped_gemm(bb, "experts.fc2.wgrad", f_local, D.h, m_e, local, [d2])
    x = [bb.memory(f"experts.{D.act}.bwd",
                   rows * f_local * ACT_BYTES * (2 * gate + 1), [d2])]
    d1 = _grouped_gemm(bb, "experts.fc1.dgrad", m_e, D.h, gate * f_local, local, x)
    w1 = _grouped_gemm(bb, "experts.fc1.wgrad", gate * f_local, D.h, m_e, local, [d1])
    # The grouped GEMM's backward (dgrad and wgrad) is one autograd node: the all-to-all back waits for
    # both, unless the 1F1B all-to-all overlap splits the wgrad off (Megatron-Core delay_wgrad_compute).
    x = _sort_chunks(bb, "moe.sort_by_expert.bwd", model, [d1] if par.moe_overlap_a2a else [d1, w1])
    x = _exchange(bb, "dispatch.bwd", model, x)
    x = [bb.memory("moe.permute.bwd", n * D.h * ACT_BYTES * (1 + moe.experts_per_token), x)]
    rd = bb.gemm("router.dgrad", n, D.h, moe.num_experts, x)
    rw = bb.gemm("router.wgrad", moe.num_experts, D.h, n, [rd])
    out = [rd, rw, w1, w2]
    if moe.shared_ffn_hidden:
        out += layer_parts.dense_mlp_backward(bb, _shared_dims(model, par), start if par.moe_overlap_a2a else out,
                                         name="shared_expert.")
    return out


def moe_layer_forward(model: ModelSpec, par: ParallelConfig, phase=None) -> nx.DiGraph:
    if phase is None:
        return layers.layer_forward(model, par, mlp_forward=moe_mlp_forward)
    return layers.layer_forward(model, par, phase=phase, mlp_forward=moe_mlp_forward)


def moe_blocks(model: ModelSpec, par: ParallelConfig) -> dict:
    """The "moe_layer.*" blocks of a MoE model (its dense layers use the ordinary "layer.*" blocks)."""
    return {"moe_layer.fwd": moe_layer_forward(model, par),
            "moe_layer.bwd": layers.layer_backward(model, par, mlp_backward=moe_mlp_backward),
            "moe_layer.recompute": layers.layer_recompute(model, par, forward=moe_layer_forward,
                                                           moe_layer=True)}


def chunk_layer_kinds(model: ModelSpec, chunk_layers: tuple[int, ...]) -> tuple[tuple[str, ...], ...]:
    """Block prefix of every layer of every model chunk (chunk index = vchunk * pp + stage): layers are
    assigned to virtual stages in order, as Megatron-Core does (the first chunk gets the first layers)."""
    out, first = [], 0
    for n in chunk_layers:
        out.append(tuple("moe_layer" if model.is_moe_layer(i) else "layer" for i in range(first, first + n)))
        first += n
    return tuple(out)


# ------------------------------------------------------------------------------------------ model state
def stage_layer_indices(model: ModelSpec, par: ParallelConfig, stage: int) -> list[int]:
    """Global indices of the transformer layers on pipeline stage `stage` (its vpp model chunks; chunks hold
    consecutive layers in virtual-stage order, even or uneven as the configuration splits them)."""
    counts = par.chunk_layers(model)
    starts = [sum(counts[:vs]) for vs in range(len(counts))]
    return [i for c in range(par.vpp) for vs in (c * par.pp + stage,) for i in range(starts[vs], starts[vs] + counts[vs])]


def routed_expert_params(model: ModelSpec) -> int:
    """Weights of all routed experts of one MoE layer."""
    m = model.moe
    return m.num_experts * model.hidden * m.expert_ffn_hidden * (3 if model.gated else 2)


def stage_expert_params(model: ModelSpec, par: ParallelConfig, stage: int) -> float:
    """Routed-expert parameters held by one GPU of the stage: num_experts/ep experts per MoE layer, each
    split over etp (sharded over expert-DP only by ZeRO)."""
    moe_layers = sum(model.is_moe_layer(i) for i in stage_layer_indices(model, par, stage))
    return moe_layers * routed_expert_params(model) / (par.ep * par.expert_tp)


def stage_dense_layer_params(model: ModelSpec, par: ParallelConfig, stage: int) -> float:
    """Non-expert parameters of the stage's transformer layers per GPU (attention, norms, router,
    shared experts, dense MLPs), split over tp."""
    idx = stage_layer_indices(model, par, stage)
    return sum(model.params_of_layer(i) - (routed_expert_params(model) if model.is_moe_layer(i) else 0)
               for i in idx) / par.tp


def moe_layer_activation_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """What a MoE layer's MLP saves for backward per micro-batch on one rank, replacing the dense MLP's
    activation input and FC2 input: the permuted expert inputs (routed copies, top-k per token), the
    expert activation input and FC2 input, the expert outputs kept for the weighted unpermute, and the
    fp32 router probabilities; plus the shared experts' MLP terms (split over tp)."""
    moe, h = model.moe, model.hidden
    rows = routed_tokens(model, par)
    local, f_local, gate, _ = expert_dims(model, par)
    n = tokens_in(model, par)
    # Under FP8, Transformer Engine saves the quantized GEMM inputs (1 byte) for the weight gradient
    # instead of the bf16 tensors (TE Linear/GroupedLinear save the FP8 input for backward).
    gemm_in = FP8_SAVED_BYTES if par.precision is Precision.FP8 else ACT_BYTES
    routed = (gemm_in * rows * (h + f_local)              # expert FC1 input (permuted tokens), FC2 input
              + ACT_BYTES * rows * (gate * f_local + h)    # activation input, expert output for the unpermute
              + ROUTER_LOGIT_BYTES * n * moe.num_experts)
    T = Dims.of(model, par).T
    shared = ACT_BYTES * T * (gate + 1) * moe.shared_ffn_hidden / par.tp
    return routed + shared


def dispatcher_buffer_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """Transient dispatch/combine buffers of the largest in-flight exchange: send and receive of the
    all-to-all (and the ETP-gathered tokens), one micro-batch."""
    if model.moe is None or (par.ep == 1 and par.expert_tp == 1):
        return 0.0
    return dispatch_bytes(model, par) * (2 + (par.expert_tp if par.expert_tp > 1 else 0))
