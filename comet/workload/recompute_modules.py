"""Megatron-Core's per-module selective recompute (`recompute_granularity: selective` with
`--recompute-modules`, megatron/core/transformer/transformer_config.py, mcore >= 0.12): besides the
attention core, the listed submodules run under `CheckpointWithoutOutput`, which frees the output they
would keep for backward and re-runs them just before the backward needs it
(megatron/core/transformer/transformer_layer.py, multi_latent_attention.py, moe/experts.py).

What each module frees, per layer and micro-batch on one rank, in the terms comet's activation model
already counts (comet/workload/memory.py `_layer_activation_terms`, comet/workload/moe.py
`moe_layer_activation_bytes`), and what it re-runs:

  layernorm    the norm output feeding the attention, where the norm is its own module (MLA: TE fuses the
               norm into the QKV linear otherwise, so there is nothing to free), and the pre-MLP norm
               output of a MoE layer (the router and the permute read it); re-runs the norm(s).
  mla_up_proj  MLA's Q, K (after RoPE) and V, a*(2*(nope+rope) + v) per token over the TP heads (9x
               the hidden width for DeepSeek-V3): re-runs the q / kv up projections and RoPE.
  moe_act      the routed experts' activation output (the FC2 input); re-runs the activation.

A module the layer does not have is ignored, as Megatron-Core ignores it: `layernorm` recomputes only
norms that are not IdentityOp (transformer_layer.py), and the TE layer specs make the input norm a separate
TENorm only under MLA and the pre-MLP norm only in MoE layers (models/gpt/gpt_layer_specs.py, mcore 0.12.0).
"""

from __future__ import annotations

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Precision, Recompute, RecomputeModule, SelectivePolicy
from comet.workload import mla
from comet.workload.block_builder import ACT_BYTES, FP8_BYTES, BlockBuilder, Deps, Dims
from comet.workload.layer_parts import norm
from comet.workload.moe import FP8_SAVED_BYTES, expert_dims, routed_tokens


def can_add(par: ParallelConfig) -> bool:
    """Whether moving to selective recompute with every module is a change from `par`: no modules yet, not
    full recompute, and the attention-core selective policy they extend."""
    return (not par.recompute_modules and par.recompute is not Recompute.FULL
            and par.selective_policy is SelectivePolicy.ATTENTION)


def active(par: ParallelConfig) -> frozenset[RecomputeModule]:
    """The modules recomputed under this configuration (none unless Megatron-Core selective recompute)."""
    if par.recompute is not Recompute.SELECTIVE or par.selective_policy is not SelectivePolicy.ATTENTION:
        return frozenset()
    return frozenset(par.recompute_modules)


def _gemm_in_bytes(par: ParallelConfig) -> int:
    """Bytes per element of a saved GEMM input (Transformer Engine saves FP8 inputs under FP8), as the
    activation model counts it."""
    return FP8_BYTES if par.precision is Precision.FP8 and par.fp8_impl == "te" else ACT_BYTES


def freed_bytes(model: ModelSpec, par: ParallelConfig, moe_layer: bool) -> float:
    """Saved activations the recomputed modules free, one layer and micro-batch on one rank."""
    mods = active(par)
    if not mods:
        return 0.0
    sb = (model.seq_len // par.cp) * par.micro_batch
    h, t = model.hidden, par.tp
    split_outside = t if par.sp else 1     # norm outputs are sequence-sharded under SP (Korthikanti 4.2.2)
    freed = 0.0
    if RecomputeModule.LAYERNORM in mods:
        if model.mla is not None:   # the QKV (down projection) input
            freed += _gemm_in_bytes(par) * sb * h / split_outside
        if moe_layer:               # the router / permute input
            freed += _gemm_in_bytes(par) * sb * h / split_outside
    if RecomputeModule.MLA_UP_PROJ in mods and model.mla is not None:
        a, m = model.heads, model.mla
        freed += ACT_BYTES * sb * a * (2 * m.q_head_dim + m.v_head_dim) / t
    if RecomputeModule.MOE_ACT in mods and moe_layer:
        _, f_local, _, _ = expert_dims(model, par)
        fc2_in = FP8_SAVED_BYTES if par.precision is Precision.FP8 else ACT_BYTES   # as moe.py saves it
        freed += fc2_in * routed_tokens(model, par) * f_local
    return freed


def extra_forward_flops_per_token(model: ModelSpec, par: ParallelConfig) -> float:
    """GEMM FLOPs the recomputed modules add per token (whole model): MLA's up projections."""
    if RecomputeModule.MLA_UP_PROJ not in active(par) or model.mla is None:
        return 0.0
    m = model.mla
    q_up = model.heads * m.q_head_dim
    kv_up = model.heads * (m.qk_nope_head_dim + m.v_head_dim)
    q_lat = m.q_lora_rank or 0
    return model.layers * 2.0 * (q_lat * q_up + m.kv_lora_rank * kv_up)


def add_recompute_ops(bb: BlockBuilder, moe_layer: bool) -> None:
    """The forward work the recomputed modules re-run before the layer's backward, into `bb`."""
    mods = active(bb.par)
    model, D = bb.model, Dims.of(bb.model, bb.par)
    x: Deps = []
    if RecomputeModule.LAYERNORM in mods and model.mla is not None:
        x = norm(bb, D, "input_norm", x)
    if RecomputeModule.MLA_UP_PROJ in mods and model.mla is not None:
        x = mla.up_projections(bb, D, x)
    if RecomputeModule.LAYERNORM in mods and moe_layer:
        x = norm(bb, D, "mlp_norm", x)
    if RecomputeModule.MOE_ACT in mods and moe_layer:
        local, f_local, gate, m_e = expert_dims(model, bb.par)
        bb.memory(f"experts.{D.act}", m_e * local * f_local * ACT_BYTES * (gate + 1), x)
