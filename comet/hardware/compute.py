"""Kernel times on one GPU: roofline with a few physical efficiency parameters.

GEMM:   t = 2mnk / (peak * e_gemm * u_wave * k'/(k' + k_half)), at least the HBM time of its operands.
        u_wave is wave quantization: the output is cut into tile_m x tile_n tiles spread over the SMs in
        waves, and the last wave runs part-empty (NVIDIA "Matrix Multiplication Background" user guide,
        sec. "Wave Quantization"). k'/(k' + k_half) is the fixed prologue/epilogue cost of each tile's
        main loop relative to its k'-long accumulation. When the output has too few tiles to fill the
        GPU, the library splits the k loop into s slices (cuBLAS split-K; stream-K, Osama et al. PPoPP'23)
        so that tiles * s work units fill the SMs: k' = k / s, and the fp32 partial sums cost s*m*n*8
        bytes of extra HBM traffic (written and read once). The split with the shortest time is used.
Flash attention: 4 * b*heads * sq * skv * d FLOPs forward (QK^T and PV), halved under a causal mask
        (FlashAttention-2, Dao 2023, sec. 3.1: masked blocks are skipped); backward does 2.5x the forward
        matmul work (recomputed QK^T plus dQ, dK, dV, dP). Timed at attention_fwd / attention_bwd of peak
        for the fused Hopper kernels Transformer Engine / cuDNN and FlashAttention-3 provide (warp-specialised
        wgmma + TMA pipelines), and at attention_fa2 for FlashAttention-2-class kernels (PyTorch SDPA's flash
        backend, the flash-attn 2 package: Ampere mma.sync code that "achieves only 35% utilization on
        H100", Shah et al. 2024, FlashAttention-3, abstract) where the cluster sets it.
Memory-bound kernels (norms, activations, dropout, Adam): bytes / (HBM bandwidth * e_mem).
Every kernel pays kernel_overhead_us (launch and tail).
"""

from __future__ import annotations

import math

from comet.config.cluster import ClusterSpec
from comet.graph.ir import KernelClass, Op, Phase

FLASH_BWD_FLOP_RATIO = 2.5   # FlashAttention-2 backward / forward matmul FLOPs (5 vs 2 matmuls)
MAX_SPLIT_K = 16             # most k slices the library uses to fill the SMs
SPLIT_K_MIN_SLICE = 256      # no slice shorter than this (4 k-tiles of 64)


def wave_utilization(m: int, n: int, tile_m: int, tile_n: int, sms: int, split: int = 1) -> float:
    """Fraction of SM-waves doing useful tiles; the library picks the better tile orientation. With a
    k split every output tile is `split` work units."""
    return _best_utilization(_tile_grids(m, n, tile_m, tile_n), sms, split)


def _tile_grids(m: int, n: int, tile_m: int, tile_n: int) -> tuple:
    """Per tile orientation: (output tiles, useful area / computed area). Partial tiles at the matrix
    edge also waste work."""
    grids = []
    for tm, tn in ((tile_m, tile_n), (tile_n, tile_m)):
        # perf: integer ceilings (-(-a // b)): equal to math.ceil(a / b) for the integer shapes here
        # (a quotient a / b < 2**53 is never rounded up to the next integer), without two float divisions
        rows, cols = -(-m // tm), -(-n // tn)
        grids.append((rows * cols, (m * n) / (rows * tm * cols * tn)))
    return grids


def _best_utilization(grids, sms: int, split: int) -> float:
    best = 0.0
    for tiles, area in grids:
        tiles = tiles * split
        u = tiles / (-(-tiles // sms) * sms) * area   # -(-tiles // sms): the waves
        if u > best:
            best = u
    return best


def gemm_time_s(m: int, n: int, k: int, cluster: ClusterSpec, precision: str, dtype_bytes: int = 2,
                batch: int = 1) -> float:
    gpu, eff = cluster.gpu, cluster.efficiency
    fp8 = precision == "fp8"
    peak = gpu.peak_flops("fp8" if fp8 else ("bf16" if "bf16" in gpu.peak_tflops else precision))
    e = eff.gemm_fp8 if fp8 else eff.gemm
    flops = 2.0 * m * n * k * batch
    operand_bytes = (m * k + k * n + m * n) * batch * (1 if fp8 else dtype_bytes)
    hbm = gpu.hbm_bandwidth * eff.memory_bound
    best = math.inf
    # perf: the loop's cluster constants read once (attribute look-ups were a third of its time); the
    # tile grids do not depend on the split: computed once per GEMM, not once per split tried; min/max
    # as comparisons (the same choice of operand, without two builtin calls). The float operations are
    # those of the formula, in its order (tests/hardware/test_compute.py: equal bit for bit).
    tile_m, tile_n, sms, k_half = eff.gemm_tile_m, eff.gemm_tile_n, gpu.sms, eff.gemm_k_half
    grids = _tile_grids(m, n * batch, tile_m, tile_n)
    pe = peak * e
    for split in range(1, MAX_SPLIT_K + 1):
        if split > 1 and k // split < SPLIT_K_MIN_SLICE:
            break
        u = _best_utilization(grids, sms, split)
        k_slice = k / split
        compute = flops / (pe * u * k_slice / (k_slice + k_half))
        partials = (split * m * n * batch * 8) if split > 1 else 0.0   # fp32 partial sums, written + read
        memory = (operand_bytes + partials) / hbm
        if memory > compute:
            compute = memory
        if compute < best:
            best = compute
        if u >= 0.95:   # the GPU is already full: more slices only add fixed cost
            break
    return best + eff.kernel_overhead_us * 1e-6


def attention_time_s(flops: float, backward: bool, cluster: ClusterSpec, variant: str = "") -> float:
    gpu, eff = cluster.gpu, cluster.efficiency
    peak = gpu.peak_flops("bf16" if "bf16" in gpu.peak_tflops else "fp16")   # attention stays in 16-bit
    e = eff.attention_bwd if backward else eff.attention_fwd
    if variant == "fa2" and eff.attention_fa2 > 0:   # FA2-class kernel on a GPU where it is not the native one
        e = eff.attention_fa2
    return flops / (peak * e) + eff.kernel_overhead_us * 1e-6


def memory_time_s(nbytes: float, cluster: ClusterSpec) -> float:
    eff = cluster.efficiency
    return nbytes / (cluster.gpu.hbm_bandwidth * eff.memory_bound) + eff.kernel_overhead_us * 1e-6


def offload_time_s(nbytes: float, cluster: ClusterSpec) -> float:
    tier = cluster.memory_expansion
    if tier is None or nbytes <= 0:
        return 0.0
    return nbytes / (tier.bandwidth * cluster.efficiency.offload)


def compute_op_time_s(op: Op, cluster: ClusterSpec, precision: str) -> float:
    """Time of one compute kernel from its class and shape (the op's measured duration is not used)."""
    if op.kernel is KernelClass.GEMM:
        m, n, k = op.shape[:3]
        batch = op.shape[3] if len(op.shape) > 3 else 1
        if precision == "fp8" and op.dtype_bytes >= 2:   # a 16-bit GEMM inside an FP8 run (output layer)
            precision = "bf16" if "bf16" in cluster.gpu.peak_tflops else "fp16"
        return gemm_time_s(m, n, k, cluster, precision, op.dtype_bytes, batch)
    if op.kernel is KernelClass.ATTENTION:
        return attention_time_s(op.flops, op.phase in (Phase.BACKWARD,), cluster, op.variant)
    if op.kernel is KernelClass.MEMORY:
        return memory_time_s(op.bytes, cluster)
    return op.duration_s or 0.0
