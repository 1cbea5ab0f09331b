"""FLOP accounting for MFU (Megatron-Core `num_floating_point_operations`, training.py).

Model FLOPs per step = 12 * B*s*L*h^2 * ((1 + kv/heads + s/h) + (ffn/h) * g) + 6 * B*s*h*V,
with g = 1.5 for gated (SwiGLU) MLPs, else 1: the forward, weight-gradient and data-gradient GEMMs
(3 passes), the attention scores and values over the full s x s square, and the logits; no recompute
term. For GPT shapes this is Korthikanti et al.'s 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL)).
"""

from __future__ import annotations

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Recompute, SelectivePolicy
from comet.workload import recompute_modules


def attention_forward_flops_per_token(model: ModelSpec, seq_len: int | None = None) -> float:
    """Projections plus scores/values of one layer per token, full s x s square (Megatron accounting).
    MLA (Megatron-Core's multi_latent_attention term): q_lora*(h + heads*q_head_dim) [+ h*heads*q_head_dim
    without a q bottleneck], kv_lora*(h + heads*(nope + v)), h*rope, heads*v*h, and s*heads*(q_head_dim + v)."""
    h, s = model.hidden, seq_len or model.seq_len
    if model.mla is not None:
        m, a = model.mla, model.heads
        q = h * a * m.q_head_dim if m.q_lora_rank is None else m.q_lora_rank * (h + a * m.q_head_dim)
        proj = q + m.kv_lora_rank * (h + a * (m.qk_nope_head_dim + m.v_head_dim)) + h * m.qk_rope_head_dim \
            + a * m.v_head_dim * h
        return 2 * proj + 2 * s * a * (m.q_head_dim + m.v_head_dim)
    q = model.q_hidden
    return 2 * (h * (q + 2 * model.kv_hidden) + q * h) + 4 * s * q   # QK^T and PV: 2 * 2 * s * q per token


def mlp_forward_flops_per_token(model: ModelSpec, layer: int = 0) -> float:
    """Dense MLP, or for a MoE layer the top-k routed experts plus the shared experts (Megatron-Core
    counts moe_ffn_hidden * topk + shared ffn; the router GEMM is not counted)."""
    mult = 3 if model.gated else 2
    if not model.is_moe_layer(layer):
        return 2 * model.hidden * model.ffn_hidden * mult
    m = model.moe
    return 2 * model.hidden * (m.expert_ffn_hidden * m.experts_per_token + m.shared_ffn_hidden) * mult


def layer_forward_flops_per_token(model: ModelSpec, seq_len: int | None = None, layer: int = 0) -> float:
    """Forward FLOPs of transformer layer `layer` per token: GEMMs plus attention scores/values."""
    return attention_forward_flops_per_token(model, seq_len) + mlp_forward_flops_per_token(model, layer)


def body_forward_flops_per_token(model: ModelSpec) -> float:
    """All transformer layers' forward FLOPs per token (MoE: dense and expert layers differ)."""
    if model.moe is None:
        return model.layers * layer_forward_flops_per_token(model)
    return sum(layer_forward_flops_per_token(model, layer=i) for i in range(model.layers))


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    return 2 * model.hidden * model.padded_vocab()   # Megatron counts args.padded_vocab_size


def model_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the layers and the logits (a step runs 3 passes of them)."""
    return body_forward_flops_per_token(model) + logits_forward_flops_per_token(model)


def recompute_flops_per_token(model: ModelSpec, par: ParallelConfig) -> float:
    """Forward FLOPs per token run again by recomputation (none of them read the global batch)."""
    extra = 0.0
    h, q, kv = model.hidden, model.q_hidden, model.kv_hidden
    if par.recompute is Recompute.FULL:
        extra = body_forward_flops_per_token(model)
    elif par.recompute is Recompute.SELECTIVE and par.selective_policy is SelectivePolicy.OP_SAC:
        extra = model.layers * 2 * h * (kv + q + model.ffn_hidden)   # wk, wo, w3 re-run (torchtitan SAC)
    elif par.recompute is Recompute.SELECTIVE and par.selective_policy is SelectivePolicy.SAVE_QKV:
        extra = body_forward_flops_per_token(model) - model.layers * 2 * h * (q + 2 * kv)   # all but QKV
    elif par.recompute is Recompute.SELECTIVE and not par.flash_attention:
        extra = model.layers * 4 * model.seq_len * model.q_hidden   # the attention core is recomputed
    return extra + recompute_modules.extra_forward_flops_per_token(model, par)   # Megatron-Core recompute modules


def step_flops(global_batch: int, seq_len: int, per_token: float, recomputed_per_token: float) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of a step from the per-token FLOPs: a step's FLOPs are linear in
    its tokens, so a search computes the per-token terms once per configuration (comet/evaluate.py)."""
    tokens = global_batch * seq_len
    model_flops = 3 * tokens * per_token
    return model_flops, model_flops + tokens * recomputed_per_token


def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """Megatron accounting: 3 passes, no recompute."""
    return step_flops(global_batch, model.seq_len, model_flops_per_token(model), 0.0)[0]


def hardware_flops_per_step(model: ModelSpec, par: ParallelConfig) -> float:
    """FLOPs actually executed: model FLOPs plus the recomputed forward passes."""
    return step_flops(par.global_batch, model.seq_len, model_flops_per_token(model),
                      recompute_flops_per_token(model, par))[1]
