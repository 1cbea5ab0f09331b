"""FLOP accounting for MFU (Megatron-Core `num_floating_point_operations`, training.py).

Model FLOPs per step = 12 * B*s*L*h^2 * ((1 + kv/heads + s/h) + (ffn/h) * g) + 6 * B*s*h*V,
with g = 1.5 for gated (SwiGLU) MLPs, else 1: the forward, weight-gradient and data-gradient GEMMs
(3 passes), the attention scores and values over the full s x s square, and the logits; no recompute
term. For GPT shapes this is Korthikanti et al.'s 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL)).
"""

from __future__ import annotations

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Recompute


def layer_forward_flops_per_token(model: ModelSpec, seq_len: int | None = None) -> float:
    """Forward FLOPs of one transformer layer per token: GEMMs plus attention scores/values."""
    h, f, s = model.hidden, model.ffn_hidden, seq_len or model.seq_len
    gemm = 2 * (h * (h + 2 * model.kv_hidden) + h * h + h * f * (3 if model.gated else 2))
    attention = 4 * s * h          # QK^T and PV: 2 * 2 * s * h per token, full square (Megatron accounting)
    return gemm + attention


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    return 2 * model.hidden * model.padded_vocab()   # Megatron counts args.padded_vocab_size


def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """Megatron accounting: 3 passes, no recompute."""
    tokens = global_batch * model.seq_len
    per_token = model.layers * layer_forward_flops_per_token(model) + logits_forward_flops_per_token(model)
    return 3 * tokens * per_token


def hardware_flops_per_step(model: ModelSpec, par: ParallelConfig) -> float:
    """FLOPs actually executed: model FLOPs plus the recomputed forward passes."""
    tokens = par.global_batch * model.seq_len
    layer_fwd = layer_forward_flops_per_token(model)
    extra = 0.0
    if par.recompute is Recompute.FULL:
        extra = layer_fwd
    elif par.recompute is Recompute.SELECTIVE and not par.flash_attention:
        extra = 4 * model.seq_len * model.hidden   # the attention core is recomputed
    return model_flops_per_step(model, par.global_batch) + tokens * model.layers * extra
