"""Cost, power and energy against hand-computed numbers for the DGX H100 spec."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from comet import cost
from comet.config.cluster import load_cluster
from comet.config.job import JobSpec
from comet.search.context import apply_provisioning

from search_fakes import ROOT


@pytest.fixture
def dgx():
    return load_cluster(ROOT / "cluster_specs" / "h100_dgx.yaml")


def test_capex_power_energy_by_hand(dgx):
    # 16 GPUs = 2 DGX nodes: 16 x 30k GPU + 2 x 100k node + 16 GPUs x 50 GB/s x 60 USD IB; NVLink in the node
    assert cost.capex_usd(dgx, 16) == pytest.approx(16 * 30000 + 2 * 100000 + 16 * 50 * 60)
    # 16 x 700 W + 2 x 3700 W + 16 x 60 W
    assert cost.power_W(dgx, 16) == pytest.approx(19560.0)
    out = cost.run_costs(1e6, dgx, 16, JobSpec(total_tokens=300e9))
    seconds = 300e9 / 1e6
    assert out["time_to_train_s"] == pytest.approx(seconds)
    assert out["time_to_train_days"] == pytest.approx(seconds / 86400)
    mwh = 19560 * seconds * 1.2 / 3.6e9                       # PUE 1.2
    assert out["energy_MWh"] == pytest.approx(mwh)
    amortized = 728000 * seconds / (4 * 365.25 * 86400)        # 4-year amortization
    assert out["cost_per_run_usd"] == pytest.approx(amortized + mwh * 1000 * 0.08)


def test_provisioning_changes_cost(dgx):
    dgx = replace(dgx, cost=replace(dgx.cost, network_usd_per_GBps=(8.0, 60.0)))
    base = cost.capex_usd(dgx, 64)
    # a 32-GPU NVLink domain spans four chassis: its 450 GB/s per GPU is charged at 8 USD per GB/s
    nvl32 = apply_provisioning(dgx, {"scaleup_size": 32})
    assert cost.capex_usd(nvl32, 64, gpus_per_chassis=8) == pytest.approx(base + 64 * 450 * 8.0)
    # 2:1 oversubscribed fabric: half the IB charge
    over = apply_provisioning(dgx, {"oversubscription": 2.0})
    assert cost.capex_usd(over, 64) == pytest.approx(base - 64 * 50 * 60 / 2)
    # 512 GB expansion per GPU at 5 USD/GB and 100 GB/s at 40 USD per GB/s, 0.375 W/GB
    exp = apply_provisioning(dgx, {"expansion_GB": 512.0, "expansion_bandwidth_GBps": 100.0})
    assert cost.capex_usd(exp, 64) == pytest.approx(base + 64 * 512 * 5.0 + 64 * 100 * 40.0)
    assert cost.power_W(exp, 64) == pytest.approx(cost.power_W(dgx, 64) + 64 * 512 * 0.375)


def test_no_throughput_means_infinite_time(dgx):
    out = cost.run_costs(0.0, dgx, 8, JobSpec())
    assert math.isinf(out["time_to_train_s"]) and math.isinf(out["cost_per_run_usd"])
