"""The collective models as they were computed per call before the per-group plans
(comet/hardware/collective_plans.py, branch i18s-step; main 1e0c0a7's network.algorithm_times and its
helpers, unchanged but for the placement, which is _views below built afresh (network._views and its
per-level view class as they were up to branch i22n-network), and the ring's hop latencies, main's
_ring_hops as it was): the reference the plans are checked against bit for bit
(test_collective_plans.py)."""

from __future__ import annotations

import math

from comet.config.cluster import CollectiveAlgorithm, Topology
from comet.graph.ir import Collective
from comet.hardware.collective_plans import (NVLS_BASE_LATENCY_S, PIPELINE_ROUND_BYTES, PROTOCOLS, TREE_BUS_FACTOR,
                                             TREE_PROTOCOLS)
from comet.hardware.network import members_in_domain
from comet.hardware.p2p_channels import net_p2p_rate_GBps, nvlink_p2p_rate_GBps

A = CollectiveAlgorithm


class _DimView:
    """One spanned dimension as the group sees it (network._DimView up to i22n-network)."""

    def __init__(self, dim, n, inner, stride, ports):
        self.dim, self.n, self.inner, self.stride, self.ports = dim, n, inner, stride, ports

    def rates(self, chunk_bytes, kind):
        d = self.dim
        plateau = self.inner * d.bandwidth * d.bus_efficiency * _topology_share(self, kind) / d.oversubscription
        return plateau * chunk_bytes / (chunk_bytes + d.half_efficiency_bytes), plateau


def _topology_share(v, kind):
    topo = v.dim.topology
    if topo is Topology.FULLY_CONNECTED:
        links = (v.ports or v.n) - 1
        return (v.n - 1) / links if links > 0 else 1.0
    if topo is Topology.RING:
        if kind == "direct":
            return min(1.0, 4.0 / v.n)
        if kind == "p2p":
            return 0.5 / v.stride
        return 1.0 / v.stride
    return 1.0


def group_span(size, stride, network):
    """network.group_span as it was up to i22n-network (now computed by network._Group in one pass)."""
    span = []
    remaining = size
    step = stride
    for dim in network:
        if remaining == 1:
            span.append(1)
            continue
        fit = members_in_domain(remaining, step, dim.size)
        span.append(fit)
        remaining //= fit
        step *= fit
    if remaining > 1:
        span[-1] *= remaining
    return span


def _views(size, stride, network, flat=False):
    span = group_span(size, stride, network)
    views, inner, step, below = [], 1, stride, 1
    for n_members, dim_obj in zip(span, network):
        ports = dim_obj.size // below if dim_obj.size else 0
        if n_members > 1:
            views.append(_DimView(dim_obj, n_members, 1 if flat else inner, max(1, step // below), ports))
            inner *= n_members
            step *= n_members
        below = dim_obj.size or below
    return views


def ring_hops(views, n, passes):
    hops, outer_crossings, counted = [], 0, 0
    for v in reversed(views[1:]):
        k = n // v.inner
        hops.append((passes * (k - outer_crossings) * v.dim.latency_s, False))
        counted += k - outer_crossings
        outer_crossings = k
    hops.append((passes * max(0, n - 1 - counted) * views[0].dim.latency_s, True))
    return tuple(hops)


def _slowest(views, chunk_bytes, kind):
    rate, plateau = views[0].rates(chunk_bytes, kind)
    for v in views[1:]:
        r, p = v.rates(chunk_bytes, kind)
        if r < rate:
            rate = r
        if p < plateau:
            plateau = p
    return rate, plateau


class _Cost:
    def __init__(self, bandwidth_s, hops, nvls=False, tree=False, plateau_s=None):
        self.bandwidth_s, self.hops, self.nvls, self.tree, self.plateau_s = bandwidth_s, hops, nvls, tree, plateau_s

    def time(self):
        hops = self.hops
        if self.nvls:
            net = 0
            for h, inner in hops:
                if not inner:
                    net += h
            return NVLS_BASE_LATENCY_S + self.bandwidth_s + net
        payload = self.bandwidth_s if self.plateau_s is None else self.plateau_s
        fill = self.bandwidth_s - payload
        best = math.inf
        for factor, base, r_inner, r_net in (TREE_PROTOCOLS if self.tree else PROTOCOLS).values():
            lat = 0
            for h, inner in hops:
                lat += h * (r_inner if inner else r_net)
            t = base + lat + payload / factor + fill
            if t < best:
                best = t
        return best


def _ring(kind, msg, views):
    n = math.prod(v.n for v in views)
    passes = 2 if kind is Collective.ALL_REDUCE else 1
    rate, plateau = _slowest(views, msg / n, "ring")
    moved = passes * (n - 1) / n * msg
    return _Cost(moved / rate, ring_hops(views, n, passes), plateau_s=moved / plateau)


def _tree_between_domains(msg, outer, nvls):
    domains = math.prod(v.n for v in outer)
    per_direction = 1.0 if nvls and domains <= 2 else 2.0
    rate, plateau = _slowest(outer, msg, "tree")
    hops = [(2 * math.ceil(math.log2(v.n)) * v.dim.latency_s, False) for v in outer]
    moved = per_direction * msg / TREE_BUS_FACTOR
    return moved / rate, moved / plateau, hops


def _nvls_rate(dim, msg_bytes):
    n = dim.size
    ramp = msg_bytes / (msg_bytes + dim.nvls_half_efficiency_bytes)
    return dim.nvls_bus_GBps * 1e9 * n / (2 * (n - 1)) * ramp


def _pipelined(stage_a, stage_b, msg_bytes):
    overlap_lost = min(1.0, PIPELINE_ROUND_BYTES / msg_bytes) if msg_bytes > 0 else 1.0
    return max(stage_a, stage_b) + min(stage_a, stage_b) * overlap_lost


def _depth_fill_s(msg_bytes, between, chain, d0):
    def stage_s(dim):
        return min(msg_bytes, dim.half_efficiency_bytes) / (dim.bandwidth * dim.bus_efficiency)
    fill = sum(2 * math.ceil(math.log2(v.n)) * stage_s(v.dim) for v in between)
    return fill + (2 * (chain - 1) * stage_s(d0) if chain > 1 else 0.0)


def _allowed(dim, algo):
    return dim.algorithm in (A.AUTO, algo)


def algorithm_times(kind, msg_bytes, size, stride, cluster, flat=False):
    levels = cluster.levels
    views = _views(size, stride, levels, flat)
    if not views:
        return {"none": 0.0}
    if flat and kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE):
        return {"flat_ring": _ring(kind, msg_bytes, views).time()}
    if kind is Collective.BARRIER:
        return {"barrier": sum(2 * math.ceil(math.log2(v.n)) * v.dim.latency_s for v in views)}
    if kind is Collective.ALL_TO_ALL:
        t, plateau = 0.0, 0.0
        for v in views:
            outside = (v.inner * v.n - v.inner) / size
            rate, plateau_rate = v.rates(msg_bytes / size, "direct")
            t = max(t, outside * msg_bytes * v.inner / rate)
            plateau = max(plateau, outside * msg_bytes * v.inner / plateau_rate)
        hops = tuple(((v.n - 1) * v.dim.latency_s, v is views[0] and len(views) == 1) for v in views)
        return {"direct": _Cost(t, hops, plateau_s=plateau).time()}
    ring = _ring(kind, msg_bytes, views).time()
    out = {}
    top = views[-1].dim
    if _allowed(top, A.RING) and _allowed(views[0].dim, A.RING):
        out["ring"] = ring
    if kind is not Collective.ALL_REDUCE:
        return out or {"ring": ring}
    d0 = levels[0]
    domain = views[0] if views[0].dim is d0 else None
    between = views[1:] if domain else views
    in_domain = domain is not None and domain.n > 1
    has_nvls = in_domain and bool(d0.nvls_bus_GBps) and d0.size > 1 and _allowed(d0, A.NVLS)
    nvls_hops = ((2 * d0.latency_s, True),)
    if not between:
        if has_nvls:
            out["nvls"] = _Cost(msg_bytes / _nvls_rate(d0, msg_bytes), nvls_hops, nvls=True).time()
        return out or {"ring": ring}
    chain = ((2 * (domain.n - 1) * d0.latency_s, True),) if in_domain else ()
    intra, intra_plateau = (msg_bytes / r for r in domain.rates(msg_bytes, "ring")) if in_domain else (0.0, 0.0)
    if all(v.dim.in_network_reduction for v in between) and _allowed(top, A.SHARP):
        net, net_plateau = (msg_bytes / r for r in _slowest(between, msg_bytes, "tree"))
        hops = tuple((2 * v.dim.latency_s, False) for v in between)
        if has_nvls:
            out["sharp"] = _Cost(_pipelined(msg_bytes / _nvls_rate(d0, msg_bytes), net, msg_bytes), nvls_hops + hops,
                                 nvls=True).time()
        else:
            out["sharp"] = _Cost(_pipelined(intra, net, msg_bytes), chain + hops,
                                 plateau_s=_pipelined(intra_plateau, net_plateau, msg_bytes)).time()
    if _allowed(top, A.TREE):
        bw, bw_plateau, hops = _tree_between_domains(msg_bytes, between, nvls=False)
        fill = _depth_fill_s(msg_bytes, between, domain.n if in_domain else 1, d0)
        out["tree"] = _Cost(_pipelined(intra, bw, msg_bytes) + fill, chain + tuple(hops), tree=True,
                            plateau_s=_pipelined(intra_plateau, bw_plateau, msg_bytes)).time()
    if has_nvls and d0.algorithm is not A.RING and top.algorithm is not A.RING:
        bw, _, hops = _tree_between_domains(msg_bytes, between, nvls=True)
        fill = _depth_fill_s(msg_bytes, between, 1, d0)
        out["nvls_tree"] = _Cost(_pipelined(msg_bytes / _nvls_rate(d0, msg_bytes), bw, msg_bytes) + fill,
                                 nvls_hops + tuple(hops), nvls=True).time()
    return out or {"ring": ring}


def hop_time_s(msg_bytes, level, distance, levels, cap_Bps=math.inf):
    """network._hop_time_s as it was (one send over a level at one port's rate, or the channels' cap)."""
    below = levels[level - 1].size if level > 0 else 1
    dim = levels[level]
    ports = dim.size // below if dim.size else 0
    view = _DimView(dim, 2, 1, max(1, distance // below), ports)
    rate, plateau = view.rates(msg_bytes, "p2p")
    if plateau > cap_Bps:
        rate, plateau = rate * cap_Bps / plateau, cap_Bps
    return _Cost(msg_bytes / rate, ((dim.latency_s, level == 0),), plateau_s=msg_bytes / plateau).time()


def p2p_time_s(msg_bytes, distance, cluster, ranks=0, local_ranks=1):
    """network.p2p_time_s as it was up to i22n-network (the level found by next() over a generator,
    the hop above)."""
    if msg_bytes <= 0:
        return 0.0
    levels = cluster.levels
    level = next((i for i, dim in enumerate(levels) if dim.size == 0 or distance < dim.size), None)
    if level is None:
        level, distance = len(levels) - 1, 1
    dim = levels[level]
    if level > 0:
        cap = net_p2p_rate_GBps(dim.bandwidth / 1e9, ranks, local_ranks, msg_bytes) * 1e9
    else:
        cap = nvlink_p2p_rate_GBps(dim.bandwidth / 1e9, ranks if ranks <= local_ranks else 0, msg_bytes) * 1e9
    return hop_time_s(msg_bytes, level, distance, levels, cap)
