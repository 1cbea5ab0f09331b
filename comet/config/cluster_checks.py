"""Cross-field rules of a cluster spec file, checked where the file enters (load_cluster).

Each was accepted silently before and gave a number from an impossible machine: inner network domains
that do not nest in the outer ones, and a per-tier price list shorter than the tiers (the missing tier
was priced at 0).
"""

from __future__ import annotations

from comet.config.cluster import ClusterSpec
from comet.errors import ConfigError


def check_cluster(spec: ClusterSpec, source: str) -> ClusterSpec:
    dims = spec.network
    for i in range(1, len(dims)):
        inner, outer = dims[i - 1], dims[i]
        if outer.size and outer.size % inner.size:
            raise ConfigError(f"a {outer.name} domain of {outer.size} GPUs must hold whole {inner.name} domains of "
                              f"{inner.size} (network dimensions nest, innermost first)", source=source,
                              field=f"network[{i}].size")
    prices = spec.cost.network_usd_per_GBps
    for i, price in enumerate(prices):
        if price < 0:
            raise ConfigError(f"must be >= 0, got {price}", source=source, field=f"cost.network_usd_per_GBps[{i}]")
    if prices and len(prices) != len(dims):
        raise ConfigError(f"lists {len(prices)} prices for {len(dims)} network dimensions "
                          f"({', '.join(d.name for d in dims)}); give one per dimension (0 for one that is "
                          "included in the node price)", source=source, field="cost.network_usd_per_GBps")
    return spec


def check_job_fits_domains(spec: ClusterSpec, gpus: int) -> None:
    """A job spans whole scale-up / scale-out domains once it outgrows one (3-GPU NVLink domains cannot
    hold a 64-GPU job's ranks evenly, so its collectives would be modelled on a machine that cannot exist)."""
    for dim in spec.network:
        if dim.size and gpus > dim.size and gpus % dim.size:
            raise ConfigError(f"gpus ({gpus}) must be a multiple of the {dim.name} domain size ({dim.size}) "
                              "once the job spans more than one domain", field="gpus")
