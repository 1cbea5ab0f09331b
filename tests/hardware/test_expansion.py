"""Memory expansion tiers: shared tiers divide capacity and bandwidth among their GPUs; capacity and
bandwidth are both priced, so designs that differ only in expansion bandwidth do not tie on capex."""

import dataclasses

import pytest

from comet import cost
from comet.config.cluster import MemoryTier
from comet.hardware.compute import offload_time_s


def with_tier(h100, **tier):
    return dataclasses.replace(h100, memory_expansion=MemoryTier("cxl", **tier))


def test_a_node_shared_tier_gives_each_gpu_its_share(h100):
    own = with_tier(h100, capacity_GB=512, bandwidth_GBps=64)
    node = with_tier(h100, capacity_GB=4096, bandwidth_GBps=512, shared_by=8)
    # 8 GPUs behind one 512 GB/s, 4 TB tier: 64 GB/s and 512 GB each, as a per-GPU 64 GB/s device
    assert node.memory_expansion.capacity_bytes == own.memory_expansion.capacity_bytes == 512e9
    assert offload_time_s(1e9, node) == pytest.approx(offload_time_s(1e9, own))
    assert offload_time_s(1e9, own) == pytest.approx(1e9 / (64e9 * h100.efficiency.offload))
    pooled = with_tier(h100, capacity_GB=4096, bandwidth_GBps=512, shared_by=32)
    assert offload_time_s(1e9, pooled) == pytest.approx(4 * offload_time_s(1e9, node))


def test_expansion_bandwidth_has_a_price(h100):
    slow = with_tier(h100, capacity_GB=512, bandwidth_GBps=100)
    fast = with_tier(h100, capacity_GB=512, bandwidth_GBps=200)
    price = h100.cost.expansion_usd_per_GBps
    assert price > 0
    assert cost.capex_usd(fast, 1024) - cost.capex_usd(slow, 1024) == pytest.approx(1024 * 100 * price)
    none = dataclasses.replace(h100, memory_expansion=None)
    assert cost.capex_usd(slow, 1024) - cost.capex_usd(none, 1024) == pytest.approx(
        1024 * (512 * h100.cost.expansion_usd_per_GB + 100 * price))


def test_power_follows_utilisation(h100):
    busy = cost.utilisation({"compute": 6.0, "exposed_dp": 2.0, "pipeline_bubble": 2.0}, 10.0)
    assert busy == {"compute": 0.6, "comm": 0.2}
    p = h100.power
    expected = p.gpu_idle_W + (700 - p.gpu_idle_W) * (0.6 + p.comm_activity * 0.2)
    assert cost.gpu_power_W(h100, busy) == pytest.approx(expected)
    assert cost.gpu_power_W(h100, None) == 700            # no breakdown: TDP
    all_compute = cost.utilisation({"compute": 10.0}, 10.0)
    assert cost.gpu_power_W(h100, all_compute) == pytest.approx(700)


def test_a_faster_part_costs_more_when_compute_is_priced(h100):
    priced = h100.with_changes(cost=dataclasses.replace(h100.cost, gpu_usd=12000, gpu_usd_per_bf16_TFLOPs=16.0))
    fast = priced.with_changes(gpu=dataclasses.replace(h100.gpu, peak_tflops={k: 2.25 * v for k, v in h100.gpu.peak_tflops.items()}))
    assert cost.capex_usd(fast, 8) - cost.capex_usd(priced, 8) == pytest.approx(8 * 1.25 * 989.4 * 16.0)
