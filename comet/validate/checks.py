"""Structural self-checks: the FLOPs of the built layer blocks must equal the analytical count of the
same layer (Megatron-Core `num_floating_point_operations`, Korthikanti et al. eq. 7 terms), so that a
validation error can be read as physics (efficiencies), not as a wrong op graph.

Per micro-batch of T = b*s/cp tokens on one TP rank, forward:
  GEMMs      2*T*(h*(h + 2*kv) + h*h + g*h*f) / tp        (g = 3 for SwiGLU, else 2)
  attention  4*T*s*h / tp, halved under the causal mask for flash attention (masked blocks skipped)
Backward: 2x the forward GEMMs; flash attention backward 2.5x its forward.
"""

from __future__ import annotations

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.graph.ir import KernelClass
from comet.hardware.compute import FLASH_BWD_FLOP_RATIO
from comet.workload import layers

TOLERANCE = 0.01


def _block_flops(g) -> tuple[float, float]:
    """(layer GEMM FLOPs, attention-core FLOPs) of a block graph."""
    gemm = attn = 0.0
    for _, op in g.nodes(data="op"):
        if op.kernel is KernelClass.ATTENTION or (op.kernel is KernelClass.GEMM and op.name.startswith("attention")):
            attn += op.flops
        elif op.kernel is KernelClass.GEMM:
            gemm += op.flops
    return gemm, attn


def expected_layer_flops(model: ModelSpec, par: ParallelConfig) -> tuple[float, float]:
    """Forward (GEMM, attention-core) FLOPs of one dense layer for one micro-batch on one TP rank. Q and
    the attention output are heads*head_dim wide; MLA's down projections run replicated on every TP rank
    (comet/workload/mla.py), its core uses head dims nope+rope (QK) and v (PV) and is always causal-fused."""
    h, kv, f, q = model.hidden, model.kv_hidden, model.ffn_hidden, model.q_hidden
    T = par.micro_batch * model.seq_len / par.cp
    mlp = (3 if model.gated else 2) * h * f
    if model.mla is not None:
        m, a = model.mla, model.heads
        down = h * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim)
        up = (m.q_lora_rank or h) * a * m.q_head_dim + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
        gemm = 2 * T * (down + (up + a * m.v_head_dim * h + mlp) / par.tp)
        return gemm, 2 * T * model.seq_len * a * (m.q_head_dim + m.v_head_dim) / par.tp * 0.5
    gemm = 2 * T * (h * (q + 2 * kv) + q * h + mlp) / par.tp
    attn = 4 * T * model.seq_len * q / par.tp * (0.5 if par.flash_attention else 1.0)
    return gemm, attn


def expected_moe_mlp_flops(model: ModelSpec, par: ParallelConfig) -> float:
    """Forward GEMM FLOPs a MoE layer adds on one rank instead of the dense MLP: router on the rank's
    n tokens, the routed copies through the local experts (each split over etp), the shared experts."""
    from comet.workload.moe import routed_tokens, tokens_in
    h, moe, g = model.hidden, model.moe, 3 if model.gated else 2
    T = par.micro_batch * model.seq_len / par.cp
    return (2 * tokens_in(model, par) * moe.num_experts * h
            + 2 * routed_tokens(model, par) * g * h * moe.expert_ffn_hidden / par.expert_tp
            + 2 * T * g * h * moe.shared_ffn_hidden / par.tp)


def layer_flop_check(model: ModelSpec, par: ParallelConfig) -> list[str]:
    """Messages for every block whose FLOPs differ from the analytical count by more than 1%."""
    exp_gemm, exp_attn = expected_layer_flops(model, par)
    bwd_attn = exp_attn * (FLASH_BWD_FLOP_RATIO if par.flash_attention or model.mla else 2.0)
    blocks = [("layer forward", layers.layer_forward(model, par), (exp_gemm, exp_attn)),
              ("layer backward", layers.layer_backward(model, par), (2 * exp_gemm, bwd_attn))]
    if model.moe is not None:
        from comet.workload import moe
        T = par.micro_batch * model.seq_len / par.cp
        moe_gemm = exp_gemm - 2 * T * (3 if model.gated else 2) * model.hidden * model.ffn_hidden / par.tp \
            + expected_moe_mlp_flops(model, par)
        built = moe.moe_blocks(model, par)
        blocks += [("MoE layer forward", built["moe_layer.fwd"], (moe_gemm, exp_attn)),
                   ("MoE layer backward", built["moe_layer.bwd"], (2 * moe_gemm, bwd_attn))]
    problems = []
    for name, g, want in blocks:
        got = _block_flops(g)
        for what, a, b in (("GEMM", got[0], want[0]), ("attention", got[1], want[1])):
            if b > 0 and abs(a / b - 1) > TOLERANCE:
                problems.append(f"{name} {what} FLOPs are {a / b:.3g}x the analytical count "
                                f"(micro-batch {par.micro_batch}, tp {par.tp}, "
                                f"{'flash' if par.flash_attention else 'unfused'} attention)")
    return problems


def structural_warnings(cases) -> list[str]:
    """Unique layer-FLOP mismatches over the modelled cases (resolved configurations)."""
    seen: dict[str, None] = {}
    for c in cases:
        if c.skip_reason:
            continue
        try:
            par = c.parallel.resolve(c.model)
        except Exception:   # infeasible rows are reported by the prediction itself
            continue
        for msg in layer_flop_check(c.model, par):
            seen.setdefault(msg, None)
    return list(seen)
