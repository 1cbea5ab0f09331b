"""Cost-model properties the calibration relies on (comet/hardware/compute.py): split-K fills the SMs
when a GEMM has few output tiles, and the large-GEMM bound the fit enforces."""

import pytest

from comet.hardware.compute import gemm_time_s, wave_utilization
from comet.validate.calibrate import LARGE_GEMM_RANGE, large_gemm_fraction


def test_split_counts_k_slices_as_work_units():
    # 4 x 11 = 44 output tiles of 128x256 on 132 SMs: one third of a wave; split in 3 -> one full wave
    # (times the edge waste of 2688 / 2816 columns).
    assert wave_utilization(512, 2688, 128, 256, 132) == pytest.approx(44 / 132 * 2688 / 2816)
    assert wave_utilization(512, 2688, 128, 256, 132, split=3) == pytest.approx(2688 / 2816)


def test_few_tile_gemm_is_split_and_stays_physical(h100):
    """A 512 x 2688 x 7168 GEMM (one chunk of Megatron's TP-overlapped QKV at tp 8) runs far faster with
    split-K than its single-wave, one-third-full tiling allows, but never above the large-GEMM rate."""
    eff = h100.efficiency
    flops = 2 * 512 * 2688 * 7168
    t = gemm_time_s(512, 2688, 7168, h100, "bf16")
    unsplit = flops / (989.4e12 * eff.gemm * wave_utilization(512, 2688, 128, 256, 132) * 7168 / (7168 + eff.gemm_k_half))
    assert t < 0.6 * unsplit
    assert flops / t < eff.gemm * 989.4e12


def test_short_k_is_not_split(h100):
    # k = 256 cannot be cut below the minimum slice: same time as the plain wave model.
    eff = h100.efficiency
    t = gemm_time_s(128, 256, 256, h100, "bf16")
    plain = 2 * 128 * 256 * 256 / (989.4e12 * eff.gemm * wave_utilization(128, 256, 128, 256, 132) * 256 / (256 + eff.gemm_k_half))
    assert t == pytest.approx(max(plain, (128 * 256 + 256 * 256 + 128 * 256) * 2 / (3.35e12 * eff.memory_bound))
                              + eff.kernel_overhead_us * 1e-6)


def test_shipped_specs_keep_a_large_gemm_within_physical_bounds(h100, a100):
    for spec in (h100, a100):
        assert LARGE_GEMM_RANGE[0] - 1e-3 <= large_gemm_fraction(spec) <= LARGE_GEMM_RANGE[1]
