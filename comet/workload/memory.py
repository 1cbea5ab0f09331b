"""Per-GPU memory footprint of one training configuration: weights, gradients, optimizer state, saved
activations and workspace in HBM, plus what offload places in the expansion tier.

Sources:
  [K] Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023:
      Sec 4.1 (per-layer activations, term by term), Sec 4.2 (tensor and sequence parallelism),
      Sec 4.2.3 / 4.3 (pipeline in-flight micro-batches, embedding and output layer), Table 2.
  [T] Transformer Engine `_Linear.forward(weight, weight_fp8, weight_t_fp8, ...)` / `fp8_model_init`:
      FP8 weight and transpose caches, FP8 inputs saved for backward; Megatron-Core TE integration
      (the output layer and the embedding are not TE modules and stay BF16).
  [Z] Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC20,
      Sec 3.1 (mixed-precision Adam: 16 bytes per parameter) and Sec 5 (stages 1-3).

Every size is in bytes internally and in GB (1e9 bytes, like ClusterSpec.hbm_GB) in the result.
A configuration that does not fit is a result (fits=False, reason), never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.frozen import replace_fields
from comet.config.parallel import OffloadTarget, ParallelConfig, Precision, Recompute, Schedule, SelectivePolicy
from comet.workload import recompute_modules
from comet.workload.moe import (dispatcher_buffer_bytes, moe_layer_activation_bytes, stage_dense_layer_params,
                                stage_expert_params, stage_layer_indices)

GB = 1e9
ACT_BYTES = 2          # bf16/fp16 activations [K] Sec 4.1
MASK_BYTES = 1         # dropout masks, one byte per element [K] Sec 4.1
FP8_ACT_BYTES = 1      # TE saves FP8 GEMM inputs for the weight gradient [T]
# Bytes per logit (tokens x vocab / tp) live at the loss's peak, the start of the backward:
#  fused: 4. Megatron-Core `vocab_parallel_cross_entropy` casts the logits to fp32 and works in place (exp
#    saved for the backward, gradient written over it) [K] Sec 4.3; a torch.compile'd loss (torchtitan
#    0.1.0 components/loss.py `build_cross_entropy_loss` compiles it under --training.compile) saves the
#    bf16 logits and writes a bf16 gradient (2 + 2).
#  eager: 12. PyTorch eager `F.cross_entropy(pred.float(), labels)` (torchtitan's loss before 0.1.0,
#    whose train.py left `torch.compile(loss_fn)` commented out): log_softmax saves its fp32 output (4),
#    nll_loss's backward makes an fp32 gradient (4) and log_softmax's backward a new fp32 one (4) while
#    the saved output is still held.
#  megatron: as fused (Megatron-Core's unfused default runs the same in-place steps one kernel each).
LOSS_LOGIT_BYTES = {"fused": 4, "eager": 12, "megatron": 4}
WEIGHT_BYTES = 2       # bf16/fp16 weights
FP8_CACHE_BYTES = 2    # TE FP8 weight copy + its transpose cache, per GEMM weight [T]
GRAD_BYTES = {"fp32": 4, "bf16": 2}   # main-gradient buffer: fp32 (Megatron default) or bf16 where stated
# Adam state per parameter: fp32 master weights + m + v [Z] Sec 3.1; or all three in BF16 (NeMo
# `optim.dtype: bf16` -> Apex DistributedFusedAdam(dtype=bf16) keeps its param shard, exp_avg and
# exp_avg_sq in that dtype)
ADAM_BYTES = {"fp32": 12, "bf16": 6}
# FSDP (PyTorch FSDP1 flat parameters, FSDP2 `fully_shard` with MixedPrecisionPolicy(param_dtype=bf16)):
# the sharded parameter keeps the model's fp32 dtype and is what the optimizer steps, so it is the master
# copy; the bf16 copy exists only while a module is gathered (torch/distributed/fsdp/_fully_shard/
# _fsdp_param.py: `sharded_param` in orig dtype, `_unsharded_param` in param_dtype). 4 + 8 bytes per
# parameter instead of a bf16 shard + fp32 master + moments (2 + 12).
FSDP_SHARD_BYTES = 4
# The fit test's margin: a configuration fits when its predicted peak is within FIT_MARGIN of HBM.
# The memory model is a prediction with an error (docs/validation.md, memory rows: a few percent); a
# hard cut at exactly the capacity would turn a 3% memory error into a pruned configuration that
# really runs. Configurations inside the margin but over the nominal capacity are marked `tight`.
FIT_MARGIN = 0.05
PREFETCH_LAYERS = 2    # full layers of weights resident for ZeRO-3 gathers / weight offload streaming


@dataclass(frozen=True)
class MemoryEstimate:
    weights_GB: float
    gradients_GB: float
    optimizer_GB: float
    activations_GB: float
    workspace_GB: float
    expansion_GB: float      # GB per GPU placed in the expansion tier (offload; largest over stages)
    total_GB: float          # HBM footprint per GPU (worst pipeline stage): the five HBM parts above
    capacity_GB: float       # HBM capacity
    fits: bool
    reason: str              # "" when it fits
    tight: bool = False      # over the nominal HBM but within FIT_MARGIN: may not fit
    # Mixture of experts: routed experts' state (the weights/gradients/optimizer above are the rest of
    # the model) and the dispatcher's buffers. Zero and not listed for dense models.
    expert_weights_GB: float = 0.0
    expert_gradients_GB: float = 0.0
    expert_optimizer_GB: float = 0.0
    moe_dispatch_GB: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """Component -> GB. The HBM components add up to total_GB; `expansion` is outside HBM."""
        if not (self.expert_weights_GB or self.moe_dispatch_GB):
            # perf (i20g-glue): a dense model's in one literal (every result builds one: ~0.6 -> 0.3 us)
            return {"weights": self.weights_GB, "gradients": self.gradients_GB, "optimizer": self.optimizer_GB,
                    "activations": self.activations_GB, "workspace": self.workspace_GB,
                    "expansion": self.expansion_GB}
        out = {"weights": self.weights_GB, "gradients": self.gradients_GB, "optimizer": self.optimizer_GB}
        if self.expert_weights_GB:
            out.update({"expert_weights": self.expert_weights_GB, "expert_gradients": self.expert_gradients_GB,
                        "expert_optimizer": self.expert_optimizer_GB})
        out.update({"activations": self.activations_GB, "workspace": self.workspace_GB})
        if self.moe_dispatch_GB:
            out["moe_dispatch"] = self.moe_dispatch_GB
        out["expansion"] = self.expansion_GB
        return out


# ---------------------------------------------------------------------------------------- activations
def _layer_activation_terms(model: ModelSpec, par: ParallelConfig) -> tuple[float, float, float]:
    """Bytes saved by one layer for one micro-batch on one rank, before tensor parallelism, split as
    (outside the TP regions, inside them, attention-score terms), term by term as in [K] Sec 4.1.

    GPT (ffn = 4h, MHA, dropout) gives outside 10sbh, inside 24sbh, scores 5as^2b: sbh(34 + 5as/h).
    Today's stacks differ [T]: no dropout masks when dropout is 0; under FP8 Transformer Engine saves
    the GEMM inputs it needs for the weight gradient as FP8 (1 byte: QKV, projection, fc1, fc2
    inputs), while flash attention keeps Q, K, V and its output O in BF16 (plus fp32 softmax
    statistics, 4 bytes per head and token).
    """
    s, b, h = model.seq_len // par.cp, par.micro_batch, model.hidden
    kv, f, a = model.kv_hidden, model.ffn_hidden, model.heads
    q, k, v, o = model.q_hidden, kv, kv, model.q_hidden
    if model.mla is not None:   # MLA: per-head Q/K of nope+rope, V and output of v_head_dim
        q = k = a * model.mla.q_head_dim
        v = o = a * model.mla.v_head_dim
    sb = s * b
    gemm_in = FP8_ACT_BYTES if par.precision is Precision.FP8 and par.fp8_impl == "te" else ACT_BYTES
    masks = 2 * MASK_BYTES * sb * h if par.dropout else 0.0   # after attention projection and after fc2
    outside = (2 * ACT_BYTES * sb * h       # two layernorm inputs
               + gemm_in * sb * h           # QKV projection input
               + gemm_in * sb * h           # MLP fc1 input
               + masks)
    act_in = (2 if model.gated else 1) * ACT_BYTES * sb * f   # GeLU input, or the gate and up halves
    inside = (ACT_BYTES * sb * (q + k)      # Q and K (K is kv_heads * head_dim wide under GQA)
              + ACT_BYTES * sb * v          # V
              + gemm_in * sb * o            # attention output = projection input
              + act_in
              + gemm_in * sb * f)           # activation output = fc2 input
    if par.flash_attention:
        # flash keeps its output O (BF16) for the backward besides the FP8 projection input, and the
        # log-sum-exp statistics (fp32 per head and query) [Dao 2023, FlashAttention-2 Alg. 1/2].
        inside += (ACT_BYTES * sb * h if gemm_in != ACT_BYTES else 0.0) + 4 * sb * a
    # softmax output 2as^2b + its dropout mask as^2b + dropout output 2as^2b. Under context parallelism
    # each rank's s/cp queries attend to all seq_len keys.
    scores = (2 * ACT_BYTES + (MASK_BYTES if par.dropout else 0)) * a * s * model.seq_len * b
    return outside, inside, scores


def activation_bytes_per_layer(model: ModelSpec, par: ParallelConfig, moe_layer: bool = False) -> float:
    """Saved activations of one transformer layer for one micro-batch on one GPU, [K] Table 2:
    none sbh(10 + 24/t + 5as/(ht)); selective sbh(10 + 24/t); with SP sbh(34/t + 5as/(ht)) and
    sbh*34/t; full recompute 2sbh (2sbh/t with SP). Flash attention does not store the s^2 terms."""
    t = par.tp
    split_outside = t if par.sp else 1
    sbh = ACT_BYTES * (model.seq_len // par.cp) * par.micro_batch * model.hidden
    if par.recompute is Recompute.FULL:   # only the layer input is checkpointed [K] Sec 4.1
        return sbh / split_outside
    if par.recompute is Recompute.SELECTIVE and par.selective_policy is not SelectivePolicy.ATTENTION:
        return sbh / split_outside + _policy_saved_bytes(model, par) / t
    outside, inside, scores = _layer_activation_terms(model, par)
    keep_scores = par.recompute is Recompute.NONE and not par.flash_attention
    mlp = 0.0
    if moe_layer:   # the expert MLP replaces the dense one: drop its terms, add routed tokens' (moe.py)
        sb = (model.seq_len // par.cp) * par.micro_batch
        gemm_in = FP8_ACT_BYTES if par.precision is Precision.FP8 and par.fp8_impl == "te" else ACT_BYTES
        inside -= ((2 if model.gated else 1) * ACT_BYTES + gemm_in) * sb * model.ffn_hidden
        mlp = moe_layer_activation_bytes(model, par)
    kept = outside / split_outside + inside / t + (scores / t if keep_scores else 0.0) + mlp
    return kept - recompute_modules.freed_bytes(model, par, moe_layer)


def stage_layer_activation_bytes(model: ModelSpec, par: ParallelConfig, stage: int,
                                 per_layer: tuple[float, float] | None = None) -> float:
    """Saved activations of all of a stage's layers for one micro-batch (MoE and dense layers differ).
    `per_layer`: (dense, MoE) activation_bytes_per_layer where the caller has them (MoE: None for dense
    models)."""
    dense, sparse = per_layer or _per_layer_bytes(model, par)
    if model.moe is None:
        return par.stage_layers(model, stage) * dense
    return sum(sparse if model.is_moe_layer(i) else dense for i in stage_layer_indices(model, par, stage))


def _per_layer_bytes(model: ModelSpec, par: ParallelConfig) -> tuple[float, float | None]:
    """activation_bytes_per_layer of a dense layer and (MoE models) of an expert layer."""
    return (activation_bytes_per_layer(model, par),
            activation_bytes_per_layer(model, par, moe_layer=True) if model.moe is not None else None)


def _policy_saved_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """Tensors inside the TP region that a framework's selective policy keeps, per layer and micro-batch.
    torchtitan per-op SAC (torchtitan/models/llama3/parallelize.py `_save_list`, every second mm
    recomputed): outputs of wq, wv, w1, w2 (mm calls 1, 3, 5, 7 of wq wk wv wo w1 w3 w2) and of SDPA with
    its log-sum-exp. MaxText save_qkv_proj (maxtext layers/models.py remat policies): Q, K and V."""
    sb = (model.seq_len // par.cp) * par.micro_batch
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    if par.selective_policy is SelectivePolicy.OP_SAC:
        return ACT_BYTES * sb * (h + kv + f + h + h) + 4 * sb * model.heads
    return ACT_BYTES * sb * (h + 2 * kv)


def _recompute_working_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    """Full recompute re-runs a layer's forward before its backward, so one layer's complete
    activations (one micro-batch) are live on top of the checkpoints."""
    if par.recompute is Recompute.NONE or (par.recompute is Recompute.SELECTIVE
                                           and par.selective_policy is SelectivePolicy.ATTENTION):
        return 0.0
    return activation_bytes_per_layer(model, replace_fields(par, recompute=Recompute.NONE), moe_layer=model.moe is not None)


def in_flight_microbatches(par: ParallelConfig, stage: int) -> float:
    """Micro-batches whose activations pipeline stage `stage` holds at its peak, in units of one
    micro-batch through all of the stage's layers. 1F1B: min(pp - stage, m) ([K] Sec 4.2.3); GPipe: m.
    Interleaved: Megatron's warm-up of 2(pp - stage - 1) + (vpp - 1)pp + 1 model chunks of 1/vpp of the
    layers each, which for stage 0 is pp(1 + (pp - 1)/(pp*vpp)) ([K] Sec 4.2.3)."""
    m = par.num_microbatches
    if par.schedule is Schedule.GPIPE:
        return float(m)
    if par.schedule is Schedule.INTERLEAVED and par.vpp > 1:
        chunks = 2 * (par.pp - stage - 1) + (par.vpp - 1) * par.pp + 1
        return min(chunks, m * par.vpp) / par.vpp
    return float(min(par.pp - stage, m))


def memory_microbatches(par: ParallelConfig) -> int:
    """The micro-batch count as the estimate reads it (in_flight_microbatches, GPipe's held logits): the
    estimate is the same for every global batch of a configuration that gives this count. 1F1B holds
    min(pp - stage, m) micro-batches, so any m >= pp reads as pp; interleaved min(chunks, m * vpp) with
    at most stage 0's chunks; GPipe holds all m."""
    m = par.num_microbatches
    if par.schedule is Schedule.GPIPE:
        return m
    if par.schedule is Schedule.INTERLEAVED and par.vpp > 1:
        most = 2 * (par.pp - 1) + (par.vpp - 1) * par.pp + 1     # stage 0's warm-up chunks
        return min(m, -(-most // par.vpp))
    return min(m, par.pp)


def _edge_activation_bytes(model: ModelSpec, par: ParallelConfig, stage: int, in_flight: float | None = None) -> float:
    """Embedding and output-layer activations of the stage ([K] Sec 4.3). The first stage keeps the
    input dropout mask (sbh, /t with SP) for each in-flight micro-batch; the last keeps the final
    layernorm and output projection inputs (4sbh, /t with SP) and the loss's logits (LOSS_LOGIT_BYTES x sbV/t),
    for one micro-batch (its backward follows its forward at once) except under GPipe, which holds all m.
    `in_flight`: in_flight_microbatches(par, stage) where the caller has it."""
    s, b, h, t = model.seq_len // par.cp, par.micro_batch, model.hidden, par.tp
    split = t if par.sp else 1
    total = 0.0
    if stage == 0:
        if par.dropout:   # embedding dropout mask
            total += (in_flight_microbatches(par, 0) if in_flight is None else in_flight) * MASK_BYTES * s * b * h / split
    if stage == par.pp - 1:
        held = par.num_microbatches if par.schedule is Schedule.GPIPE else 1
        logits = LOSS_LOGIT_BYTES[par.loss_impl] * s * b * model.padded_vocab(t) / t
        total += held * (2 * ACT_BYTES * s * b * h / split + logits)
    return total


# ---------------------------------------------------------------------------------------- model state
def stage_params(model: ModelSpec, par: ParallelConfig, stage: int, layers: int | None = None) -> float:
    """Parameters held by one GPU of pipeline stage `stage`: layers/pp layers split by tp; the first
    stage adds the embedding (V*h/t), the last the final norm and the output layer (its own matrix
    when untied; a copy of the embedding when tied and pp > 1). MoE: the non-expert parameters only;
    the routed experts are `stage_expert_params` (sharded over ep and etp, reduced over expert-DP).
    `layers`: par.stage_layers(model, stage) where the caller has it."""
    if model.moe is not None:
        n = stage_dense_layer_params(model, par, stage)
    else:
        n = (par.stage_layers(model, stage) if layers is None else layers) * model.layer_params / par.tp
    vocab_rows = model.padded_vocab(par.tp) * model.hidden / par.tp
    if stage == 0:
        n += vocab_rows
    if stage == par.pp - 1:
        n += 2 * model.hidden
        if not model.tied_embeddings or par.pp > 1:
            n += vocab_rows
    return n


def _layer_params(model: ModelSpec, par: ParallelConfig, stage: int) -> float:
    """Parameters of the stage's transformer layers on one GPU (MoE: the non-expert part of them)."""
    if model.moe is not None:
        return stage_dense_layer_params(model, par, stage)
    return par.stage_layers(model, stage) * model.layer_params / par.tp


def _fsdp_fp32_shard(par: ParallelConfig) -> bool:
    """Whether the ZeRO-3 shard is an FSDP fp32 parameter that is also the optimizer's master copy: PyTorch
    FSDP (and JAX, whose fp32 parameters are cast to bf16 per use). Megatron-FSDP keeps a bf16 parameter
    shard and a separate fp32 main-weight shard (megatron/core/distributed/fsdp: `preserve_fp32_weights`),
    the byte count of the distributed optimizer."""
    return par.fsdp and par.fsdp_impl == "torch" and par.zero >= 3 and par.optimizer_dtype == "fp32"


def _weight_bytes(model: ModelSpec, par: ParallelConfig, stage: int, params: float) -> float:
    """Resident weight bytes of the stage's parameters: BF16, plus under FP8 the TE FP8 copy and its
    transpose of each layer GEMM weight; with fp8_params the GEMM weights exist only in FP8 [T]."""
    if par.precision is not Precision.FP8 or par.fp8_impl != "te":   # torchao keeps no FP8 weight cache
        return params * WEIGHT_BYTES
    gemm = _layer_params(model, par, stage)
    return (params - gemm) * WEIGHT_BYTES + gemm * (FP8_CACHE_BYTES + (0 if par.fp8_params else WEIGHT_BYTES))


def _state_bytes(model: ModelSpec, par: ParallelConfig, stage: int,
                 layers_here: int | None = None) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, prefetch buffer) bytes per GPU. ZeRO shards over the data-
    parallel group dp*cp (Megatron's distributed optimizer): stage 1 the optimizer state, stage 2 also
    the gradients, stage 3 also the weights, which then need ~2 gathered layers resident [Z] Sec 5.
    `layers_here`: par.stage_layers(model, stage) where the caller has it."""
    if layers_here is None:
        layers_here = par.stage_layers(model, stage)
    params = stage_params(model, par, stage, layers_here)
    shard = par.dp * par.cp
    weights = _weight_bytes(model, par, stage, params) / (shard if par.zero >= 3 else 1)
    grads = params * GRAD_BYTES[par.grad_dtype] / (shard if par.zero >= 2 else 1)
    optimizer = params * ADAM_BYTES[par.optimizer_dtype] / (shard if par.zero >= 1 else 1)
    buffer = min(PREFETCH_LAYERS, layers_here) * model.layer_params / par.tp * WEIGHT_BYTES
    if _fsdp_fp32_shard(par):
        weights = params * FSDP_SHARD_BYTES / shard
        optimizer = params * (ADAM_BYTES["fp32"] - FSDP_SHARD_BYTES) / shard    # Adam m and v
        # The root module (embedding, final norm, output layer: what is not in a wrapped layer) is not
        # resharded after the forward, its parameters being needed again at once by the backward (FSDP1
        # torch/distributed/fsdp/_runtime_utils.py `_post_forward_reshard`; FSDP2 _fsdp_state.py
        # `_lazy_init`: the root's post_forward_mesh_info is None): gathered in bf16 for the whole step.
        # PyTorch 2.13 does so only where reshard_after_forward is left unset (`_auto_reshard_after_forward`),
        # while torchtitan 0.1.0 passes True for the root: counted as in the torch 2.7/2.8 its rows ran.
        buffer += (params - _layer_params(model, par, stage)) * WEIGHT_BYTES
    if par.zero3_live_params is not None:   # DeepSpeed: per-module gathers up to the live budget; a larger
        # module is still gathered whole (deepspeed/runtime/zero/partitioned_param_coordinator.py)
        module = max(model.hidden * model.ffn_hidden * (2 if model.gated else 1),
                     model.hidden * (model.q_hidden + 2 * model.kv_hidden)) / par.tp
        buffer = min(buffer, max(par.zero3_live_params, module) * WEIGHT_BYTES)
    return weights, grads, optimizer, buffer


def _expert_state_bytes(model: ModelSpec, par: ParallelConfig, stage: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU of the stage's routed experts: split over ep and
    etp; ZeRO shards them over the expert-data-parallel group (Megatron-Core's distributed optimizer
    keeps a separate expert-DP shard of the expert parameters)."""
    if model.moe is None:
        return 0.0, 0.0, 0.0
    params = stage_expert_params(model, par, stage)
    shard = par.expert_dp
    per_param = WEIGHT_BYTES if par.precision is not Precision.FP8 else \
        FP8_CACHE_BYTES + (0 if par.fp8_params else WEIGHT_BYTES)     # every expert weight is a GEMM weight
    return (params * per_param / (shard if par.zero >= 3 else 1),
            params * GRAD_BYTES[par.grad_dtype] / (shard if par.zero >= 2 else 1),
            params * ADAM_BYTES[par.optimizer_dtype] / (shard if par.zero >= 1 else 1))


# ---------------------------------------------------------------------------------------- per stage
# perf (i21c-cache): a private record, not frozen (a frozen dataclass sets each field through
# object.__setattr__: 0.85 -> ~0.35 us, two a configuration)
@dataclass(slots=True)
class _Stage:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    expansion: float
    experts: tuple[float, float, float] = (0.0, 0.0, 0.0)   # routed experts' weights, gradients, optimizer
    dispatch: float = 0.0                                     # MoE dispatcher buffers

    def hbm(self, workspace: float) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations + workspace
                + sum(self.experts) + self.dispatch)


def _stage_memory(model: ModelSpec, par: ParallelConfig, stage: int, layer_bytes: tuple[float, float | None],
                  working: float, dispatch: float) -> _Stage:
    """Bytes per GPU of one pipeline stage, with offload moving parts to the expansion tier.
    `layer_bytes`: _per_layer_bytes; `working`: _recompute_working_bytes; `dispatch`:
    dispatcher_buffer_bytes (the same on every stage)."""
    # perf (i22g-glue): the stage's layer count and in-flight micro-batches read once and handed to the
    # parts that read them (each asked for them again: ~20 fewer calls an estimate); the same
    # expressions in the same order
    layers_here = par.stage_layers(model, stage)
    weights, grads, optimizer, buffer = _state_bytes(model, par, stage, layers_here)
    in_flight = in_flight_microbatches(par, stage)
    if model.moe is None:
        per_layer = layer_bytes[0]
        layer_acts = in_flight * (layers_here * per_layer)    # stage_layer_activation_bytes of a dense model
        experts = _NO_EXPERTS
    else:
        per_layer = layer_bytes[1]
        layer_acts = in_flight * stage_layer_activation_bytes(model, par, stage, layer_bytes)
        experts = _expert_state_bytes(model, par, stage)
    fixed_acts = _edge_activation_bytes(model, par, stage, in_flight) + working
    expansion = 0.0
    if OffloadTarget.OPTIMIZER in par.offload:       # fp32 master + Adam moments live off-HBM
        expansion += optimizer + experts[2]
        optimizer = 0.0
        experts = (experts[0], experts[1], 0.0)
    if OffloadTarget.WEIGHTS in par.offload:         # all but ~2 layers streamed in from the tier
        expansion += weights
        weights = min(buffer, weights) if par.zero < 3 else buffer
    elif par.zero >= 3:
        weights += buffer
    if OffloadTarget.ACTIVATIONS in par.offload:     # all but the in-flight layer's saved activations
        resident = min(per_layer, layer_acts)
        expansion += layer_acts - resident
        layer_acts = resident
    return _Stage(weights, grads, optimizer, layer_acts + fixed_acts, expansion, experts, dispatch)


_NO_EXPERTS = (0.0, 0.0, 0.0)    # _expert_state_bytes of a dense model


def _hbm_reason(stage: _Stage, workspace: float, capacity_GB: float, where: str) -> str:
    parts = (("weights", stage.weights), ("gradients", stage.gradients), ("optimizer", stage.optimizer),
             ("expert weights", stage.experts[0]), ("expert gradients", stage.experts[1]),
             ("expert optimizer", stage.experts[2]), ("activations", stage.activations),
             ("moe dispatch", stage.dispatch), ("workspace", workspace))
    parts = tuple((n, v) for n, v in parts if v or not n.startswith(("expert", "moe")))
    listed = ", ".join(f"{name} {value / GB:.1f}" for name, value in parts)
    return (f"needs {stage.hbm(workspace) / GB:.1f} GB per GPU{where} ({listed}) "
            f"but HBM holds {capacity_GB:g} GB (fit margin {FIT_MARGIN:.0%})")


def _expansion_reason(par: ParallelConfig, cluster: ClusterSpec, expansion: float) -> str:
    targets = ", ".join(t.value for t in par.offload)
    tier = cluster.memory_expansion
    if tier is None:
        return f"offload of {targets} needs a memory expansion tier, but cluster '{cluster.name}' has none"
    if expansion > tier.capacity_bytes:
        return (f"offload of {targets} puts {expansion / GB:.1f} GB per GPU in {tier.name} "
                f"but it holds {tier.capacity_bytes / GB:g} GB per GPU")
    return ""


def _memory_estimate(**fields) -> MemoryEstimate:
    """MemoryEstimate(**fields), every field given in declaration order (tests/workload/test_memory.py
    checks it equals the constructor's). perf (i21c-cache): the keyword dict becomes the object's
    __dict__; the frozen dataclass's __init__ sets its 15 fields one object.__setattr__ at a time
    (2.2 -> ~0.6 us, one a configuration)."""
    estimate = object.__new__(MemoryEstimate)
    object.__setattr__(estimate, "__dict__", fields)
    return estimate


def estimate_memory(model: ModelSpec, par: ParallelConfig, cluster: ClusterSpec) -> MemoryEstimate:
    """HBM footprint per GPU of the worst pipeline stage, and whether it fits. `par` is resolved.
    With an even split only the first and last stages can be the worst (middle stages hold fewer
    in-flight micro-batches than the first and neither the embedding nor the output layer); an uneven
    split moves layers off those two, so the second stage is checked too. MoE models place dense and
    expert layers unevenly over the stages: every stage is checked."""
    stages = sorted({0, min(1, par.pp - 1), par.pp - 1} if par.uneven else {0, par.pp - 1})
    if model.moe is not None:
        stages = list(range(par.pp))
    workspace = cluster.workspace_GB * GB
    # perf: a layer's activation bytes and the recompute working set are the same on every stage
    layer_bytes, working = _per_layer_bytes(model, par), _recompute_working_bytes(model, par)
    dispatch = dispatcher_buffer_bytes(model, par)
    per_stage = [_stage_memory(model, par, s, layer_bytes, working, dispatch) for s in stages]
    hbm = [st.hbm(workspace) for st in per_stage]
    worst_index = max(range(len(stages)), key=hbm.__getitem__)     # the first of the largest
    worst = per_stage[worst_index]
    expansion = max([st.expansion for st in per_stage])
    capacity = cluster.gpu.hbm_GB
    reasons = []
    total = hbm[worst_index]
    if total > cluster.gpu.hbm_bytes * (1 + FIT_MARGIN):
        where = f" on pipeline stage {stages[worst_index]} of {par.pp}" if par.pp > 1 else ""
        reasons.append(_hbm_reason(worst, workspace, capacity, where))
    if par.offload:
        reasons.append(_expansion_reason(par, cluster, expansion))
    reason = "; ".join(r for r in reasons if r)
    return _memory_estimate(
        weights_GB=worst.weights / GB, gradients_GB=worst.gradients / GB, optimizer_GB=worst.optimizer / GB,
        activations_GB=worst.activations / GB, workspace_GB=cluster.workspace_GB, expansion_GB=expansion / GB,
        total_GB=total / GB, capacity_GB=capacity, fits=not reason, reason=reason,
        tight=total > cluster.gpu.hbm_bytes and not reason,
        expert_weights_GB=worst.experts[0] / GB, expert_gradients_GB=worst.experts[1] / GB,
        expert_optimizer_GB=worst.experts[2] / GB, moe_dispatch_GB=worst.dispatch / GB)
