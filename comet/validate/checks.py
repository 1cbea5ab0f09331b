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
    """Forward (GEMM, attention-core) FLOPs of one layer for one micro-batch on one TP rank."""
    from comet.workload.flops import attention_forward_flops_per_token, mlp_forward_flops_per_token
    T = par.micro_batch * model.seq_len / par.cp
    core = 4 * model.seq_len * model.q_hidden
    gemm = T * (attention_forward_flops_per_token(model) - core + mlp_forward_flops_per_token(model)) / par.tp
    attn = T * core / par.tp * (0.5 if par.flash_attention else 1.0)
    return gemm, attn


def layer_flop_check(model: ModelSpec, par: ParallelConfig) -> list[str]:
    """Messages for every block whose FLOPs differ from the analytical count by more than 1%."""
    exp_gemm, exp_attn = expected_layer_flops(model, par)
    bwd_attn = exp_attn * (FLASH_BWD_FLOP_RATIO if par.flash_attention else 2.0)
    problems = []
    for name, g, want in (("layer forward", layers.layer_forward(model, par), (exp_gemm, exp_attn)),
                          ("layer backward", layers.layer_backward(model, par), (2 * exp_gemm, bwd_attn))):
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
        # the analytical count covers dense MHA/GQA layers; MoE and MLA blocks have their own tests
        if c.skip_reason or c.model.moe is not None or c.model.mla is not None:
            continue
        try:
            par = c.parallel.resolve(c.model)
        except Exception:   # infeasible rows are reported by the prediction itself
            continue
        for msg in layer_flop_check(c.model, par):
            seen.setdefault(msg, None)
    return list(seen)
