"""Collective and point-to-point times on a multi-dimensional network (alpha-beta per dimension).

A group of `size` ranks whose global ranks are `stride` apart spans the network dimensions innermost
first: as many members as fit in one scale-up domain share it, the rest are spread over the next
dimension (Megatron orders ranks tp, cp, dp, pp, so TP groups are innermost).

Hierarchical algorithms (as NCCL and ASTRA-sim's multi-dimensional collectives do): an all-reduce is a
reduce-scatter inside each dimension going out, then an all-gather coming back, each dimension moving
the data left by the dimensions inside it. A ring over n members moves (n-1)/n of the buffer per
direction (Thakur, Rabenseifner, Gropp 2005, "Optimization of Collective Communication Operations in
MPICH", ring all-gather / reduce-scatter); all-reduce twice that. Bus-bandwidth efficiency depends on
message size: eff(m) = bus_efficiency * m / (m + half_efficiency_bytes) (nccl-tests bus bandwidth curves
rise from latency-bound to a plateau). NVLS all-reduce runs at the measured NVLS bus bandwidth.
"""

from __future__ import annotations

import math

from comet.config.cluster import ClusterSpec, CollectiveAlgorithm, NetworkDim
from comet.graph.ir import Collective


def group_span(size: int, stride: int, network: tuple[NetworkDim, ...]) -> list[int]:
    """Members of the group per network dimension; the product equals `size`."""
    span = []
    remaining = size
    step = stride
    for dim in network:
        if remaining == 1:
            span.append(1)
            continue
        # dim.size counts the GPUs (consecutive global ranks) of one domain at this level; 0 = unbounded.
        ranks_per_domain = dim.size if dim.size else math.inf
        if step >= ranks_per_domain:
            span.append(1)
        else:
            fit = int(min(remaining, max(1, ranks_per_domain // step)))
            while remaining % fit:
                fit -= 1
            span.append(fit)
            remaining //= fit
            step *= fit
    if remaining > 1:   # only reachable if every dimension is bounded and too small
        span[-1] *= remaining
    return span


def _bus_time(nbytes: float, dim: NetworkDim) -> float:
    if nbytes <= 0:
        return 0.0
    eff = dim.bus_efficiency * nbytes / (nbytes + dim.half_efficiency_bytes)
    return nbytes / (dim.bandwidth / dim.oversubscription * eff)


def _steps_latency(n: int, dim: NetworkDim, passes: int) -> float:
    if n <= 1:
        return 0.0
    steps = math.ceil(math.log2(n)) if dim.algorithm is CollectiveAlgorithm.TREE else n - 1
    return passes * steps * dim.latency_s


def _all_to_all_time(msg_bytes: float, size: int, span: list[int], cluster: ClusterSpec) -> float:
    """Each member sends msg/size to every member. The share addressed to peers inside its level-i
    domain but outside its level-(i-1) domain, (prod(span[:i+1]) - prod(span[:i])) / size of the buffer,
    crosses level i's links; the levels' links work at the same time, so the slowest level sets the time
    (an inter-node all-to-all runs at about one NIC's bandwidth per GPU, nccl-tests#267). Bus efficiency
    follows the buffer size as for the other collectives; latency is one step per peer on the outermost
    level."""
    worst, inner, outer = 0.0, 1, 0
    for i, (n, dim) in enumerate(zip(span, cluster.network)):
        if n <= 1:
            continue
        crossing = msg_bytes * (inner * n - inner) / size
        eff = dim.bus_efficiency * msg_bytes / (msg_bytes + dim.half_efficiency_bytes)
        worst = max(worst, crossing / (dim.bandwidth / dim.oversubscription * eff))
        inner *= n
        outer = i
    return worst + _steps_latency(size, cluster.network[outer], 1)


def collective_time_s(kind: Collective, msg_bytes: float, size: int, stride: int, cluster: ClusterSpec) -> float:
    """Time of one collective; msg_bytes is the full buffer per rank (the gathered size for all-gather,
    the input size for reduce-scatter and all-reduce), as NCCL reports `size`."""
    if size <= 1 or msg_bytes <= 0:
        return 0.0
    span = group_span(size, stride, cluster.network)
    if kind is Collective.ALL_TO_ALL:
        return _all_to_all_time(msg_bytes, size, span, cluster)
    if kind is Collective.BARRIER:
        return sum(_steps_latency(n, d, 2) for n, d in zip(span, cluster.network))
    passes = 2 if kind is Collective.ALL_REDUCE else 1
    total = 0.0
    data = float(msg_bytes)      # bytes each member still holds going outwards
    for n, dim in zip(span, cluster.network):
        if n <= 1:
            continue
        if (kind is Collective.ALL_REDUCE and dim.algorithm is CollectiveAlgorithm.NVLS
                and dim.nvls_bus_GBps and dim is cluster.network[0]):
            total += 2 * (n - 1) / n * data / (dim.nvls_bus_GBps * 1e9) + _steps_latency(n, dim, 1)
        else:
            total += passes * (n - 1) / n * _bus_time(data, dim) + _steps_latency(n, dim, passes)
        data /= n
    return total


def p2p_time_s(msg_bytes: float, distance: int, cluster: ClusterSpec) -> float:
    """Send `msg_bytes` to a rank `distance` global ranks away (pipeline neighbours: tp*cp*dp)."""
    if msg_bytes <= 0:
        return 0.0
    for dim in cluster.network:
        if dim.size == 0 or distance < dim.size:
            return _bus_time(msg_bytes, dim) + dim.latency_s
    dim = cluster.network[-1]
    return _bus_time(msg_bytes, dim) + dim.latency_s
