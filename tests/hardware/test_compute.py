"""Kernel cost model: roofline, wave quantization, attention and memory-bound kernels."""

import pytest

from comet.hardware.compute import attention_time_s, gemm_time_s, memory_time_s, wave_utilization


def test_large_gemm_runs_near_calibrated_efficiency(h100):
    t = gemm_time_s(8192, 8192, 8192, h100, "bf16")
    achieved = 2 * 8192**3 / t / 1e12
    assert 0.6 * 989.4 < achieved < 0.95 * 989.4


def test_fp8_is_faster_than_bf16(h100):
    assert gemm_time_s(8192, 8192, 8192, h100, "fp8") < 0.7 * gemm_time_s(8192, 8192, 8192, h100, "bf16")


def test_wave_quantization_by_hand():
    # 128x256 tiles of a 128 x (256*133) output: 133 tiles on 132 SMs -> 2 waves, 133/264 useful.
    assert wave_utilization(128, 256 * 133, 128, 256, 132) == pytest.approx(133 / 264)
    assert wave_utilization(128, 256 * 132, 128, 256, 132) == pytest.approx(1.0)


def test_small_gemm_is_dominated_by_fixed_costs(h100):
    # 8 kFLOP: microseconds of launch overhead and one partly-filled tile, nowhere near peak.
    t = gemm_time_s(16, 16, 16, h100, "bf16")
    overhead = h100.efficiency.kernel_overhead_us * 1e-6
    assert overhead < t < 3 * overhead
    assert 2 * 16**3 / t < 1e-3 * 989.4e12


def test_memory_bound_kernel_by_hand(h100):
    nbytes = 1e9
    expected = nbytes / (3.35e12 * h100.efficiency.memory_bound) + h100.efficiency.kernel_overhead_us * 1e-6
    assert memory_time_s(nbytes, h100) == pytest.approx(expected)


def test_attention_backward_slower_per_flop(h100):
    assert attention_time_s(1e12, True, h100) > attention_time_s(1e12, False, h100)


def _wave_utilization_by_float_ceil(m, n, tile_m, tile_n, sms, split=1):
    """The formula as first written (math.ceil of float quotients): the reference for the integer form."""
    import math
    best = 0.0
    for tm, tn in ((tile_m, tile_n), (tile_n, tile_m)):
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * split
        waves = math.ceil(tiles / sms)
        area = (m * n) / (math.ceil(m / tm) * tm * math.ceil(n / tn) * tn)
        best = max(best, tiles / (waves * sms) * area)
    return best


def test_wave_utilization_integer_ceilings_equal_the_float_formula_bit_for_bit():
    import random
    rng = random.Random(15)
    for _ in range(5000):
        m, n = rng.randint(1, 1 << rng.randint(1, 20)), rng.randint(1, 1 << rng.randint(1, 20))
        args = (m, n, rng.choice((64, 128, 256)), rng.choice((64, 128, 256)), rng.choice((108, 114, 132, 144)),
                rng.randint(1, 16))
        assert wave_utilization(*args) == _wave_utilization_by_float_ceil(*args)
        # shapes read from a CSV may be floats
        assert wave_utilization(float(m), float(n), *args[2:]) == _wave_utilization_by_float_ceil(float(m), float(n), *args[2:])


def _gemm_time_by_formula(m, n, k, cluster, precision, dtype_bytes=2, batch=1):
    """gemm_time_s as first written (wave_utilization per split, min / max): the reference for the
    form that computes the tile grids once per GEMM."""
    import math
    from comet.hardware.compute import MAX_SPLIT_K, SPLIT_K_MIN_SLICE
    gpu, eff = cluster.gpu, cluster.efficiency
    fp8 = precision == "fp8"
    peak = gpu.peak_flops("fp8" if fp8 else ("bf16" if "bf16" in gpu.peak_tflops else precision))
    e = eff.gemm_fp8 if fp8 else eff.gemm
    flops = 2.0 * m * n * k * batch
    operand_bytes = (m * k + k * n + m * n) * batch * (1 if fp8 else dtype_bytes)
    hbm = gpu.hbm_bandwidth * eff.memory_bound
    best = math.inf
    for split in range(1, MAX_SPLIT_K + 1):
        if split > 1 and k // split < SPLIT_K_MIN_SLICE:
            break
        u = _wave_utilization_by_float_ceil(m, n * batch, eff.gemm_tile_m, eff.gemm_tile_n, gpu.sms, split)
        k_slice = k / split
        compute = flops / (peak * e * u * k_slice / (k_slice + eff.gemm_k_half))
        partials = (split * m * n * batch * 8) if split > 1 else 0.0
        best = min(best, max(compute, (operand_bytes + partials) / hbm))
        if u >= 0.95:
            break
    return best + eff.kernel_overhead_us * 1e-6


def test_gemm_time_equals_the_formula_bit_for_bit(h100, a100):
    import random
    rng = random.Random(16)
    for _ in range(3000):
        m, n, k = (rng.randint(1, 1 << rng.randint(1, 17)) for _ in range(3))
        cluster = rng.choice((h100, a100))
        args = (m, n, k, cluster, rng.choice(tuple(cluster.gpu.peak_tflops)), rng.choice((1, 2, 4)),
                rng.choice((1, 1, 2, 7)))
        assert gemm_time_s(*args) == _gemm_time_by_formula(*args)
        # shapes read from a CSV may be floats
        floats = (float(m), float(n), float(k)) + args[3:]
        assert gemm_time_s(*floats) == _gemm_time_by_formula(*floats)
