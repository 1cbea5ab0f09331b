"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 sec. 2.1) as op blocks on one rank.

Shapes follow Megatron-Core's MLASelfAttention under tensor parallelism t: the down projections of the
query (h -> q_lora_rank) and of the joint key/value latent (h -> kv_lora_rank + qk_rope_head_dim) are
replicated on every TP rank (their input is the all-gathered layer input under sequence parallelism) and
are fused here into one GEMM; the up projections (q_lora -> heads*(nope+rope), kv_lora -> heads*(nope+v))
and the output projection (heads*v -> h) are split by heads over TP like ordinary attention. The core
attends with query/key head dim nope+rope and value head dim v.
"""

from __future__ import annotations

from comet.hardware.compute import FLASH_BWD_FLOP_RATIO
from comet.workload.block_builder import ACT_BYTES, BlockBuilder, Deps, Dims
from comet.workload.layer_parts import col_backward, row_backward, tp_in, tp_out


def _sizes(bb: BlockBuilder, D: Dims) -> tuple[int, int, int, int, int]:
    """(down width, q latent, kv latent, q-up width per rank, kv-up width per rank)."""
    m = bb.model.mla
    q_lat = m.q_lora_rank or 0
    down = q_lat + m.kv_lora_rank + m.qk_rope_head_dim
    q_up = D.heads * m.q_head_dim
    kv_up = D.heads * (m.qk_nope_head_dim + m.v_head_dim)
    return down, q_lat, m.kv_lora_rank, q_up, kv_up


def core_flops(bb: BlockBuilder, D: Dims, backward: bool) -> float:
    """QK^T over head dim nope+rope and PV over v_head_dim, causal (half the square), this rank's heads."""
    m = bb.model.mla
    fwd = 2.0 * D.heads * D.T * D.s * (m.q_head_dim + m.v_head_dim) * 0.5
    return fwd * (FLASH_BWD_FLOP_RATIO if backward else 1.0)


def up_projections(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    """Latent norms, q / kv up projections and RoPE: what Megatron-Core's `mla_up_proj` recompute module
    re-runs (multi_latent_attention.py qkv_up_checkpoint)."""
    m = bb.model.mla
    down, q_lat, kv_lat, q_up, kv_up = _sizes(bb, D)
    if m.q_lora_rank is not None:
        x = [bb.memory("q_norm", D.T * q_lat * ACT_BYTES * 2, x)]
        x = [bb.gemm("q_up", D.T, q_up, q_lat, x)]
    kv = [bb.memory("kv_norm", D.T * kv_lat * ACT_BYTES * 2, x)]
    kv = [bb.gemm("kv_up", D.T, kv_up, kv_lat, kv)]
    return [bb.memory("rope", D.T * (q_up + D.heads * m.qk_rope_head_dim) * ACT_BYTES * 2, x + kv)]


def forward(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    m = bb.model.mla
    down, q_lat, kv_lat, q_up, kv_up = _sizes(bb, D)
    if m.q_lora_rank is None:    # no query bottleneck: the query is a plain column-parallel projection
        x = tp_in(bb, D, "q_kv_down", D.T, q_up + m.kv_lora_rank + m.qk_rope_head_dim, D.h, x)
    else:
        x = tp_in(bb, D, "q_kv_down", D.T, down, D.h, x)
    x = up_projections(bb, D, x)
    x = [bb.attention("attention", core_flops(bb, D, False), (D.b * D.heads, D.T // D.b, D.s, m.q_head_dim), x)]
    return tp_out(bb, D, "proj", D.T, D.h, D.heads * m.v_head_dim, x)


def backward(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    m = bb.model.mla
    down, q_lat, kv_lat, q_up, kv_up = _sizes(bb, D)
    x = row_backward(bb, D, "proj", D.heads * m.v_head_dim, x)
    x = [bb.attention("attention.bwd", core_flops(bb, D, True), (D.b * D.heads, D.T // D.b, D.s, m.q_head_dim), x)]
    x = [bb.memory("rope.bwd", D.T * (q_up + D.heads * m.qk_rope_head_dim) * ACT_BYTES * 2, x)]
    kv_d = bb.gemm("kv_up.dgrad", D.T, kv_lat, kv_up, x)
    kv_w = bb.gemm("kv_up.wgrad", kv_up, kv_lat, D.T, [kv_d])
    ups = [kv_d, kv_w]
    if m.q_lora_rank is not None:
        q_d = bb.gemm("q_up.dgrad", D.T, q_lat, q_up, x)
        ups += [q_d, bb.gemm("q_up.wgrad", q_up, q_lat, D.T, [q_d])]
    x = [bb.memory("q_kv_norm.bwd", D.T * (q_lat + kv_lat) * ACT_BYTES * 3, ups)]
    # The replicated down projection's input gradient is partial per TP rank (each holds some heads):
    # reduced over TP like a column-parallel dgrad.
    n_down = down if m.q_lora_rank is not None else q_up + m.kv_lora_rank + m.qk_rope_head_dim
    return col_backward(bb, D, "q_kv_down", n_down, x)
