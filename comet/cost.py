"""Cost, power, energy and time-to-train of a training run on a provisioned cluster.

Inputs are the unit prices and watts of ClusterSpec.cost / ClusterSpec.power (cluster_specs/*.yaml,
with their sources there). One formula per function:

    nodes          = ceil(gpus / gpus_per_chassis)
    capex          = gpus * (gpu_usd + bf16_TFLOPs * gpu_usd_per_bf16_TFLOPs) + nodes * node_usd
                     + sum_d gpus * bandwidth_d[GB/s] * price_d[USD per GB/s per GPU] / oversubscription_d
                       (the scale-up dimension only where its domain spans more than one chassis)
                     + gpus * hbm_GB * hbm_usd_per_GB + gpus * expansion_GB * expansion_usd_per_GB
                     + gpus * expansion_GBps * expansion_usd_per_GBps
                       (expansion_GB / _GBps: each GPU's share of its tier, capacity and bandwidth / shared_by;
                       bandwidth is priced so designs that differ only in it do not tie on capex)
    power          = gpus * gpu_W + nodes * node_overhead_W + gpus * network_W_per_gpu
                     gpu_W from utilisation when the step's breakdown is known and the spec gives an idle
                     draw: idle + (busy - idle) * (f_compute + comm_activity * f_comm), f = share of step
                     time computing / with only communication or offload exposed; TDP x time otherwise
                     + gpus * expansion_GB * expansion_W_per_GB
    time_to_train  = job.total_tokens / tokens_per_s
    energy         = power * time_to_train * PUE
    cost_per_run   = capex * time_to_train / amortization period + energy * electricity price

Memory expansion is charged per GPU share of the tier (ClusterSpec.memory_expansion, shared_by GPUs).
"""

from __future__ import annotations

import math

from comet.config.cluster import ClusterSpec
from comet.config.job import JobSpec

SECONDS_PER_YEAR = 365.25 * 86400.0
J_PER_MWH = 3.6e9


def node_count(gpus: int, gpus_per_chassis: int) -> int:
    return math.ceil(gpus / max(1, gpus_per_chassis))


def expansion_GB(cluster: ClusterSpec) -> float:
    """Expansion capacity per GPU (its share of a shared tier)."""
    return cluster.memory_expansion.capacity_bytes / 1e9 if cluster.memory_expansion else 0.0


def expansion_GBps(cluster: ClusterSpec) -> float:
    """Expansion bandwidth per GPU (its share of a shared tier)."""
    return cluster.memory_expansion.bandwidth / 1e9 if cluster.memory_expansion else 0.0


def network_usd(cluster: ClusterSpec, gpus: int, gpus_per_chassis: int | None = None) -> float:
    """Per network dimension: price per GB/s per GPU times the link rate. The innermost (scale-up)
    dimension is charged only where its domain extends beyond one chassis: in-chassis NVLink is part of
    node_usd. An oversubscribed fabric (ratio r) is charged 1/r, a first-order model of fewer
    upper-tier switch ports."""
    prices = cluster.cost.network_usd_per_GBps
    chassis = gpus_per_chassis or cluster.gpus_per_node
    total = 0.0
    for i, dim in enumerate(cluster.network):
        price = prices[i] if i < len(prices) else 0.0
        if i == 0 and len(cluster.network) > 1 and 0 < dim.size <= chassis:
            continue
        total += gpus * dim.bandwidth_GBps * price / dim.oversubscription
    return total


def capex_usd(cluster: ClusterSpec, gpus: int, gpus_per_chassis: int | None = None) -> float:
    """Purchase price of the cluster: GPUs, chassis, network by dimension, HBM and expansion memory."""
    c = cluster.cost
    nodes = node_count(gpus, gpus_per_chassis or cluster.gpus_per_node)
    gpu_usd = c.gpu_usd + cluster.gpu.peak_tflops.get("bf16", 0.0) * c.gpu_usd_per_bf16_TFLOPs
    return (gpus * gpu_usd + nodes * c.node_usd + network_usd(cluster, gpus, gpus_per_chassis)
            + gpus * cluster.gpu.hbm_GB * c.hbm_usd_per_GB + gpus * expansion_GB(cluster) * c.expansion_usd_per_GB
            + gpus * expansion_GBps(cluster) * c.expansion_usd_per_GBps)


COMPUTE_PARTS = ("compute", "optimizer")
COMM_PARTS = ("exposed_tp", "exposed_cp", "exposed_dp", "exposed_pp", "exposed_ep", "offload")


def utilisation(breakdown: dict, step_s: float) -> dict[str, float] | None:
    """Shares of the step time spent computing and with only communication / offload exposed; the rest
    (pipeline bubble, waiting) is idle."""
    if not breakdown or not step_s > 0:
        return None
    compute = sum(breakdown.get(k, 0.0) for k in COMPUTE_PARTS) / step_s
    comm = sum(breakdown.get(k, 0.0) for k in COMM_PARTS) / step_s
    return {"compute": min(1.0, compute), "comm": min(1.0 - min(1.0, compute), comm)}


def gpu_power_W(cluster: ClusterSpec, busy: dict[str, float] | None = None) -> float:
    """Average GPU draw: TDP-class draw while computing, the idle draw while waiting, and a share of the
    dynamic range while only communication runs (GPU power follows SM and HBM activity, Patel et al.
    "Characterizing Power Management Opportunities for LLMs in the Cloud", ASPLOS 2024)."""
    p = cluster.power
    active = p.gpu_W if p.gpu_W is not None else cluster.gpu.power_W
    if busy is None or p.gpu_idle_W is None:
        return active
    dynamic = active - p.gpu_idle_W
    return p.gpu_idle_W + dynamic * (busy["compute"] + p.comm_activity * busy["comm"])


def power_W(cluster: ClusterSpec, gpus: int, gpus_per_chassis: int | None = None,
            busy: dict[str, float] | None = None) -> float:
    """Average IT power of the cluster while training (before PUE)."""
    p = cluster.power
    gpu_W = gpu_power_W(cluster, busy)
    nodes = node_count(gpus, gpus_per_chassis or cluster.gpus_per_node)
    return (gpus * gpu_W + nodes * p.node_overhead_W + gpus * p.network_W_per_gpu
            + gpus * expansion_GB(cluster) * p.expansion_W_per_GB)


def power_floor_W(cluster: ClusterSpec, gpus: int, gpus_per_chassis: int | None = None) -> float:
    """The least IT power any step can average: every GPU at its idle draw (nothing busy); with no idle
    draw in the spec, power does not depend on utilisation and this is the power itself."""
    return power_W(cluster, gpus, gpus_per_chassis, {"compute": 0.0, "comm": 0.0})


def time_to_train_s(tokens_per_s: float, job: JobSpec) -> float:
    if not tokens_per_s > 0:
        return math.inf
    return job.total_tokens / tokens_per_s


def energy_MWh(power_watts: float, seconds: float, pue: float) -> float:
    return power_watts * seconds * pue / J_PER_MWH


def run_costs(tokens_per_s: float, cluster: ClusterSpec, gpus: int, job: JobSpec,
              gpus_per_chassis: int | None = None, busy: dict[str, float] | None = None) -> dict[str, float]:
    """Every cost figure of one run, as the flat dict stored in Result.extra. `busy`: utilisation()."""
    c = cluster.cost
    seconds = time_to_train_s(tokens_per_s, job)
    capex = capex_usd(cluster, gpus, gpus_per_chassis)
    watts = power_W(cluster, gpus, gpus_per_chassis, busy)
    mwh = energy_MWh(watts, seconds, c.pue)
    energy_usd = mwh * 1000.0 * c.electricity_usd_per_kWh
    amortized = capex * seconds / (c.amortization_years * SECONDS_PER_YEAR)
    return {
        "time_to_train_s": seconds,
        "time_to_train_days": seconds / 86400.0,
        "capex_usd": capex,
        "power_kW": watts / 1000.0,
        "energy_MWh": mwh,
        "energy_cost_usd": energy_usd,
        "amortized_capex_usd": amortized,
        "cost_per_run_usd": amortized + energy_usd,
        "tokens_per_joule": tokens_per_s / (watts * c.pue) if watts > 0 else 0.0,   # perf per W
    }
