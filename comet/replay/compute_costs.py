"""A block's compute-kernel durations in one compiled call: the GEMM, flash-attention and memory-bound
cost models of comet/hardware/compute.py over the block's ops as one table.

compute.py stays the reference (and the path without numba): `kernel_times` runs its formulas with
the same float operations in the same order (integer shapes in int64, guarded against overflow and
against quotients a float cannot hold exactly), so durations are equal bit for bit
(tests/replay/test_compute_costs.py: random shapes and every op of every shipped model). The table
is graph/op_table.py's. An op it leaves out (a measured duration, a transfer, a copy, a shape that is
not plain ints) or that needs a cluster constant the Python model would reject has NaN here and is
timed by the Python model.

perf: a GEMM through compute.compute_op_time_s costs ~2.5-4 us of Python, a memory-bound kernel ~0.6;
the flagship's six blocks hold 37 compute ops (~80 us); one compiled call per block is ~2 us.
"""

from __future__ import annotations

import math

import numpy as np

from comet.config.cluster import ClusterSpec
from comet.errors import ConfigError
from comet.graph.op_table import (ATTENTION, BACKWARD, CODE, FA2, GEMM, GEMM_WIDTH, HEADER, MEMORY, N_EDGES, N_GEMMS,
                                  N_OPS, ROW_WIDTH, VALUE)
from comet.hardware.compute import MAX_SPLIT_K, SPLIT_K_MIN_SLICE
from comet.replay.kernels import HAVE_NUMBA, njit

# the constants' slots (`constants`)
(_PE16, _PE8, _HBM, _K_HALF, _OVERHEAD, _ATT_FWD, _ATT_BWD, _ATT_FA2, _TILE_M, _TILE_N, _SMS, _RUN_FP8,
 _MAX_SPLIT, _MIN_SLICE, _N_CONSTANTS) = range(15)

_LIMIT = 2.0 ** 52   # integer products kept below this: exact in int64 and in a float


def constants(cluster: ClusterSpec, precision: str) -> np.ndarray:
    """What the compute models read of the cluster for `precision`, computed as compute.py computes
    them; NaN where compute.py would raise (a missing peak) or could not be followed in int64 (tile
    sizes that are not ints): ops needing it fall back to the Python model."""
    gpu, eff = cluster.gpu, cluster.efficiency
    # perf: the values in a list, one conversion (numpy's item assignment is ~0.2 us each: 4.2 -> ~1.5 us)
    c = [math.nan] * _N_CONSTANTS
    fp8 = precision == "fp8"
    # a 16-bit GEMM (compute_op_time_s maps an FP8 run's 16-bit GEMM to bf16 / fp16; gemm_time_s then reads
    # bf16 where the GPU has it, else the precision)
    c[_PE16] = _peak(gpu, "bf16" if "bf16" in gpu.peak_tflops else ("fp16" if fp8 else precision), eff.gemm)
    c[_PE8] = _peak(gpu, "fp8", eff.gemm_fp8) if fp8 else math.nan
    c[_HBM] = gpu.hbm_bandwidth * eff.memory_bound
    c[_K_HALF] = eff.gemm_k_half
    c[_OVERHEAD] = eff.kernel_overhead_us * 1e-6
    att_peak = "bf16" if "bf16" in gpu.peak_tflops else "fp16"
    c[_ATT_FWD] = _peak(gpu, att_peak, eff.attention_fwd)
    c[_ATT_BWD] = _peak(gpu, att_peak, eff.attention_bwd)
    c[_ATT_FA2] = _peak(gpu, att_peak, eff.attention_fa2) if eff.attention_fa2 > 0 else -1.0
    if type(eff.gemm_tile_m) is int and type(eff.gemm_tile_n) is int and type(gpu.sms) is int:
        c[_TILE_M], c[_TILE_N], c[_SMS] = eff.gemm_tile_m, eff.gemm_tile_n, gpu.sms
    c[_RUN_FP8] = 1.0 if fp8 else 0.0
    # passed, not read as globals: numba's on-disk cache would keep a changed value compiled in
    c[_MAX_SPLIT], c[_MIN_SLICE] = MAX_SPLIT_K, SPLIT_K_MIN_SLICE
    return np.array(c, dtype=np.float64)


def _peak(gpu, precision: str, efficiency: float) -> float:
    """peak * efficiency as compute.py multiplies them; NaN where the GPU has no such peak."""
    try:
        return gpu.peak_flops(precision) * efficiency
    except ConfigError:
        return math.nan


@njit(inline="always")
def _utilization(tiles_a, area_a, tiles_b, area_b, sms, split):
    """compute._best_utilization of the two tile orientations."""
    best = 0.0
    t = tiles_a * split
    u = t / (-(-t // sms) * sms) * area_a
    if u > best:
        best = u
    t = tiles_b * split
    u = t / (-(-t // sms) * sms) * area_b
    if u > best:
        best = u
    return best


@njit(inline="always")
def _gemm(m, n, k, batch, dtype_bytes, fp8, c):
    """compute.gemm_time_s in the same float operations; NaN where int64 could not follow Python's ints."""
    tile_m, tile_n, sms = c[_TILE_M], c[_TILE_N], c[_SMS]
    pe = c[_PE8] if fp8 else c[_PE16]
    if np.isnan(pe) or np.isnan(sms):
        return np.nan
    tm, tn, s = int(tile_m), int(tile_n), int(sms)
    nb = float(n) * float(batch)
    # guards: every integer product below 2**52 (the float estimates are off by far less than the margin)
    if (float(m) + tm + tn) * (nb + tm + tn) >= _LIMIT \
            or (float(m) * k + float(k) * n + float(m) * n) * batch * dtype_bytes >= _LIMIT \
            or c[_MAX_SPLIT] * 8.0 * float(m) * nb >= _LIMIT or float(k) >= _LIMIT:
        return np.nan
    flops = 2.0 * m * n * k * batch
    operand_bytes = (m * k + k * n + m * n) * batch * (1 if fp8 else dtype_bytes)
    hbm = c[_HBM]
    k_half = c[_K_HALF]
    nn = n * batch
    # compute._tile_grids: both orientations
    rows, cols = -(-m // tm), -(-nn // tn)
    tiles_a, area_a = rows * cols, (m * nn) / (rows * tm * cols * tn)
    rows, cols = -(-m // tn), -(-nn // tm)
    tiles_b, area_b = rows * cols, (m * nn) / (rows * tn * cols * tm)
    best = np.inf
    min_slice = int(c[_MIN_SLICE])
    for split in range(1, int(c[_MAX_SPLIT]) + 1):
        if split > 1 and k // split < min_slice:
            break
        u = _utilization(tiles_a, area_a, tiles_b, area_b, s, split)
        k_slice = k / split
        compute = flops / (pe * u * k_slice / (k_slice + k_half))
        partials = split * m * n * batch * 8 if split > 1 else 0
        memory = (operand_bytes + partials) / hbm
        if memory > compute:
            compute = memory
        if compute < best:
            best = compute
        if u >= 0.95:
            break
    return best + c[_OVERHEAD]


@njit(cache=True, nogil=True)
def kernel_times(tables: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Seconds of each op of one or more blocks' tables laid end to end (graph/op_table.py; each table's
    header gives its length) on the constants `c`, in order, NaN where the Python model times an op;
    then the number of GEMM, attention and memory ops left NaN (a size or a constant out of reach).
    perf: one call for all the blocks a graph sees for the first time (a dispatch and a returned array
    each: ~1.5 us hot, more on a cold call's CPU caches)."""
    total = 0
    pos = 0
    while pos < tables.shape[0]:
        n = int(tables[pos + N_OPS])
        total += n
        pos += HEADER + n * ROW_WIDTH + int(tables[pos + N_GEMMS]) * GEMM_WIDTH + 2 * int(tables[pos + N_EDGES])
    out = np.full(total + 1, np.nan)
    run_fp8 = c[_RUN_FP8] != 0.0
    missed = 0
    pos = 0
    first = 0      # the first op of this table in `out`
    while pos < tables.shape[0]:
        n = int(tables[pos + N_OPS])
        gemms = pos + HEADER + n * ROW_WIDTH
        for j in range(n):
            i = first + j
            row = pos + HEADER + j * ROW_WIDTH
            code = tables[row + CODE]
            value = tables[row + VALUE]
            if code == GEMM:
                g = gemms + int(value) * GEMM_WIDTH
                m, nn, k, batch, dtype = tables[g], tables[g + 1], tables[g + 2], tables[g + 3], tables[g + 4]
                if m < _LIMIT and nn < _LIMIT and k < _LIMIT and batch < _LIMIT:   # exact in the float table
                    dtype_bytes = int(dtype)
                    out[i] = _gemm(int(m), int(nn), int(k), int(batch), dtype_bytes, run_fp8 and dtype_bytes < 2, c)
            elif ATTENTION <= code <= ATTENTION + BACKWARD + FA2:
                flags = int(code) - ATTENTION
                if flags & FA2 and c[_ATT_FA2] > 0:
                    pe = c[_ATT_FA2]
                else:
                    pe = c[_ATT_BWD] if flags & BACKWARD else c[_ATT_FWD]
                out[i] = value / pe + c[_OVERHEAD]
            elif code == MEMORY:
                out[i] = value / c[_HBM] + c[_OVERHEAD]
            else:
                continue
            if np.isnan(out[i]):
                missed += 1
        first += n
        pos = gemms + int(tables[pos + N_GEMMS]) * GEMM_WIDTH + 2 * int(tables[pos + N_EDGES])
    out[total] = missed
    return out


__all__ = ["HAVE_NUMBA", "constants", "kernel_times"]
