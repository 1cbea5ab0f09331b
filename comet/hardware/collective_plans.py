"""The collective algorithms' times as functions of the message size, one plan per group placement and
kind (network.algorithm_times; the physics is in network.py's module doc).

A collective's time on one placement is, per algorithm and protocol, a few size-dependent terms (bytes
over the ramped rate, bytes over the plateau rate, a tree's pipeline fill) around constants of the
placement: each protocol's base and per-hop latencies, the slowest level's plateau rate, the share of
the buffer a ring moves. `plan(group, kind, levels)` computes those constants once per group (they are
kept on the group: network._group), so a size costs its own floats only, computed by the same
expressions in the same order as the per-call model they replace (tests/hardware/test_collective_plans.py
checks them bit for bit against it on random networks, groups, kinds and sizes).
"""

from __future__ import annotations

import math

from comet.config.cluster import CollectiveAlgorithm
from comet.graph.ir import Collective

A = CollectiveAlgorithm

# NCCL's protocols (src/graph/tuning.cc, NCCL 2.18-2.21): LL moves 8-byte flag+data words (1/4 of the
# bus rate for all-reduce and multi-node), LL128 120 of every 128 bytes, Simple the full rate with
# the longest per-hop handshake. Fixed launch latency per protocol (baseLat, us) and per-hop latency
# as a fraction of Simple's (hwLat: NVLink ring LL 0.6 / LL128 1.9 / Simple 3.4 us; network
# LL 2.7 / LL128 4.0 / Simple 14 us). The spec's latency_us is the Simple per-hop latency.
PROTOCOLS = {  # name: (bandwidth factor, base latency s, hop latency ratio inner, hop latency ratio network)
    "ll": (1 / 4, 6.6e-6, 0.6 / 3.4, 2.7 / 14),
    "ll128": (120 / 128, 14e-6, 1.9 / 3.4, 4.0 / 14),
    "simple": (1.0, 8.4e-6, 1.0, 1.0),
}
# The tree's hops (hwLat Tree): NVLink LL 0.6 / LL128 1.25 / Simple 4 us, network LL 5.0 / LL128 8.5 /
# Simple 14 us, base LL 6.8 us: as fractions of the ring's Simple hop latency of the same dimension.
TREE_PROTOCOLS = {
    "ll": (1 / 4, 6.8e-6, 0.6 / 3.4, 5.0 / 14),
    "ll128": (120 / 128, 14e-6, 1.25 / 3.4, 8.5 / 14),
    "simple": (1.0, 8.4e-6, 4.0 / 3.4, 1.0),
}
# NCCL's tree bus bandwidth is 0.92 of the links' (tuning.cc "model refinements": busBw * .92 for
# Tree): applied to the double binary tree between domains, of plain Tree and of NVLSTree alike.
TREE_BUS_FACTOR = 0.92
NVLS_BASE_LATENCY_S = 25e-6   # NVLS / NVLSTree run Simple only, baseLat 25 us (tuning.cc)

# Two-stage algorithms (NVLS or the NVLink chain inside the node, a tree or SHARP between nodes) run
# their stages as a pipeline that moves one round of data at a time; NCCL's device loop moves
# channels x NVLS heads x chunk per round, of the order of 16 x 8 x 512 KiB = 64 MiB on a DGX H100
# (chunk: NCCL_BUFFSIZE 4 MiB / NCCL_STEPS 8 slots). The first round fills the pipeline: the faster
# stage's share of it adds to the slower stage's time, so a buffer of one round or less runs its
# stages one after the other and a large one overlaps them (time = slower stage + faster stage x
# round / buffer). nccl-tests on 2-4 nodes of 8 H100 (collectives.csv, nccl-tests#309) show this:
# at 64 MB NVLSTree takes about the NVLS time plus the network time, from 1 GB the slower of the two.
# Not fitted to the rows: 32, 64 and 128 MiB give 15.3, 15.1 and 15.1% MAPE on collectives.csv.
PIPELINE_ROUND_BYTES = 64 * 2**20


_ROWS = {False: tuple(PROTOCOLS.values()), True: tuple(TREE_PROTOCOLS.values())}


def protocol_constants(hops: tuple, tree: bool = False) -> tuple:
    """Per protocol (bandwidth factor, base latency + the hops' latency at that protocol): what a
    cost's time reads that does not depend on the size. `hops`: (hop latency s at Simple, is the
    innermost dimension)."""
    out = []
    for factor, base, r_inner, r_net in _ROWS[tree]:
        lat = 0     # the hops' latencies summed in order from 0
        for h, inner in hops:
            lat += h * (r_inner if inner else r_net)
        out.append((factor, base + lat))
    return tuple(out)


def fastest(constants: tuple, payload_s: float, fill_s: float) -> float:
    """The time at the fastest protocol: base + hops + payload at the protocol's bandwidth factor +
    the per-step fill. A protocol's factor slows the payload only: the fill (the time per pipeline
    step that the efficiency ramp stands for) is a time, not a share of the link, so it is added as it
    is (an LL step does not take four times as long to fill as a Simple one)."""
    best = math.inf
    for factor, fixed in constants:
        t = fixed + payload_s / factor + fill_s
        if t < best:
            best = t
    return best


def network_hops_s(hops: tuple):
    """The hops outside the innermost dimension (NVLS: the NVLink part of the path is in the base
    latency); 0 where there are none, as the sum it stands for."""
    net = 0
    for h, inner in hops:
        if not inner:
            net += h
    return net


def _pipelined(stage_a: float, stage_b: float, msg_bytes: float) -> float:
    """Time of two pipelined stages over a buffer of msg_bytes (see PIPELINE_ROUND_BYTES)."""
    overlap_lost = min(1.0, PIPELINE_ROUND_BYTES / msg_bytes) if msg_bytes > 0 else 1.0
    return max(stage_a, stage_b) + min(stage_a, stage_b) * overlap_lost


def _allowed(dim, algo: CollectiveAlgorithm) -> bool:
    return dim.algorithm in (A.AUTO, algo)


def _rates(views: list, kind: str) -> tuple:
    """Per view (plateau rate, half-efficiency bytes) of `kind` traffic, and the slowest plateau (the
    first smallest, as _DimView.rates' callers pick it)."""
    # perf (i20s-step): one loop, no generator
    rates, slowest = [], None
    for v in views:
        p = v.plateau(kind)
        rates.append((p, v.dim.half_efficiency_bytes))
        if slowest is None or p < slowest:
            slowest = p
    return tuple(rates), slowest


def _slowest_rate(rates: tuple, chunk_bytes: float) -> float:
    """The slowest view's rate when each step moves `chunk_bytes` (eff(chunk): _DimView.rates)."""
    rate = None
    for p, h in rates:
        r = p * chunk_bytes / (chunk_bytes + h)
        if rate is None or r < rate:
            rate = r
    return rate


def _ring(group, passes: int):
    """Ring all-gather / reduce-scatter (passes 1) or all-reduce (2) over the group's levels: NCCL
    pipelines the ring across nodes, so the rate is the slowest hop (Thakur, Rabenseifner & Gropp
    2005: each rank moves (n-1)/n of the buffer per pass). Built once per group and pass count (perf:
    a group's all-gathers and reduce-scatters share it)."""
    ring = group.plans.get(passes)
    if ring is None:
        ring = group.plans[passes] = _ring_seconds(group, passes)
    return ring


def _ring_seconds(group, passes: int):
    n = group.n
    rates, plateau = _rates(group.views, "ring")
    moved_share = passes * (n - 1) / n
    constants = protocol_constants(ring_hops(group.views, n, passes))

    def seconds(msg: float) -> float:
        rate = _slowest_rate(rates, msg / n)    # each ring step moves 1/n of the buffer
        moved = moved_share * msg
        bandwidth_s, payload_s = moved / rate, moved / plateau
        return fastest(constants, payload_s, bandwidth_s - payload_s)
    return seconds


def ring_hops(views: list, n: int, passes: int) -> tuple:
    """The ring's per-hop latencies. A ring visiting k sub-domains of a level crosses k boundaries per
    pass; a crossing counts at the outermost level it crosses (NCCL tuning.cc: nInterSteps = 2 * nNodes
    for all-reduce), the remaining of the n-1 steps per pass are inner hops."""
    hops, outer_crossings, counted = [], 0, 0
    for v in reversed(views[1:]):
        k = n // v.inner
        hops.append((passes * (k - outer_crossings) * v.dim.latency_s, False))
        counted += k - outer_crossings
        outer_crossings = k
    hops.append((passes * max(0, n - 1 - counted) * views[0].dim.latency_s, True))
    return tuple(hops)


def _all_to_all(group, size: int):
    """Direct all-to-all: each member sends (n-1)/n of its buffer, the part for peers outside its
    sub-domain of a level through that level (nccl-tests#267: an inter-node all-to-all runs at one
    NIC's rate per GPU)."""
    views = group.views
    # per level: the share of the buffer sent through it (peers not inside the sub-domain below)
    levels = tuple(((v.inner * v.n - v.inner) / size, v.inner, v.plateau("direct"), v.dim.half_efficiency_bytes)
                   for v in views)
    constants = protocol_constants(tuple(((v.n - 1) * v.dim.latency_s, v is views[0] and len(views) == 1)
                                         for v in views))

    def seconds(msg: float) -> float:
        t, plateau, chunk = 0.0, 0.0, msg / size
        for outside, inner, p, h in levels:
            rate = p * chunk / (chunk + h)
            t = max(t, outside * msg * inner / rate)
            plateau = max(plateau, outside * msg * inner / p)
        return fastest(constants, plateau, t - plateau)
    return seconds


def _tree_between_domains(between: list, nvls: bool):
    """A double-binary-tree all-reduce between the domains of `between` (Sanders, Speck & Traeff
    2009): (bandwidth time, the same at the plateau rate) of a size, and the hops. With NVLS inside
    the domain each domain's NICs carry the buffer once per direction between two domains, twice with
    more (a node is interior in one of the two trees); NCCL's plain tree runs at half its bus rate
    whatever the node count (tuning.cc: tree algorithm bandwidth = busBw / 2); the tree's links at
    TREE_BUS_FACTOR."""
    domains = math.prod(v.n for v in between)
    per_direction = 1.0 if nvls and domains <= 2 else 2.0
    rates, plateau = _rates(between, "tree")
    hops = tuple([(2 * math.ceil(math.log2(v.n)) * v.dim.latency_s, False) for v in between])

    def seconds(msg: float) -> tuple[float, float]:
        moved = per_direction * msg / TREE_BUS_FACTOR
        return moved / _slowest_rate(rates, msg), moved / plateau
    return seconds, hops


def _depth_fill(between: list, chain: int, d0):
    """Pipeline fill of a tree: a buffer pipelined through a tree in chunks reaches the far end after
    one chunk has crossed every stage on the way up and down (Sanders, Speck & Traeff 2009:
    T = (chunks + depth - 1) x per-chunk time), so the depth adds one chunk per stage at one link's
    rate: 2 log2(domains) network stages, and for the plain tree 2 (chain - 1) NVLink stages of the
    chain inside the node. The chunk is the dimension's step (half_efficiency_bytes), or the whole
    buffer when that is smaller."""
    stages = tuple([(2 * math.ceil(math.log2(v.n)), v.dim.half_efficiency_bytes, v.dim.bandwidth * v.dim.bus_efficiency)
                    for v in between])
    chain_stages = 2 * (chain - 1)
    chain_half, chain_rate = d0.half_efficiency_bytes, d0.bandwidth * d0.bus_efficiency

    def seconds(msg: float) -> float:
        fill = 0
        for count, half, rate in stages:
            fill += count * (min(msg, half) / rate)
        return fill + (chain_stages * (min(msg, chain_half) / chain_rate) if chain > 1 else 0.0)
    return seconds


def _nvls_rate(d0):
    """Algorithm bandwidth of NVLS all-reduce at a size: the measured bus bandwidth at a full domain,
    converted with nccl-tests' busbw = algbw * 2(n-1)/n (each GPU moves the buffer once per direction,
    so the rate does not depend on how many members take part), reached by large buffers only."""
    n = d0.size
    full = d0.nvls_bus_GBps * 1e9 * n / (2 * (n - 1))
    half = d0.nvls_half_efficiency_bytes
    return lambda msg: full * (msg / (msg + half))


def _intra(domain):
    """The stage inside the scale-up domain of a two-stage all-reduce: (time, time at the plateau
    rate) of a size, (0, 0) where the group has no members there."""
    if domain is None:
        return lambda msg: (0.0, 0.0)
    ((plateau, half),), _ = _rates([domain], "ring")
    return lambda msg: (msg / (plateau * msg / (msg + half)), msg / plateau)


def _sharp(between: list, intra, chain: tuple, nvls_rate, nvls_hops: tuple):
    """SHARP between domains: the switches reduce, each domain sends and receives the buffer once,
    whatever the node count; pipelined with NVLS (nvls_rate: its rate of a size) or the NVLink chain
    inside the domain."""
    rates, plateau = _rates(between, "tree")
    hops = tuple((2 * v.dim.latency_s, False) for v in between)
    if nvls_rate is not None:
        net = network_hops_s(nvls_hops + hops)
        return lambda msg: (NVLS_BASE_LATENCY_S + _pipelined(msg / nvls_rate(msg), msg / _slowest_rate(rates, msg), msg)
                            + net)
    constants = protocol_constants(chain + hops)

    def seconds(msg: float) -> float:
        (a, a_plateau), b, b_plateau = intra(msg), msg / _slowest_rate(rates, msg), msg / plateau
        payload_s = _pipelined(a_plateau, b_plateau, msg)
        return fastest(constants, payload_s, _pipelined(a, b, msg) - payload_s)
    return seconds


def _tree(between: list, intra, chain: tuple, chain_members: int, d0):
    """A double binary tree between domains, pipelined with the NVLink chain inside the domain."""
    tree_s, hops = _tree_between_domains(between, nvls=False)
    fill_s = _depth_fill(between, chain_members, d0)
    constants = protocol_constants(chain + hops, tree=True)

    def seconds(msg: float) -> float:
        (a, a_plateau), (b, b_plateau) = intra(msg), tree_s(msg)
        bandwidth_s = _pipelined(a, b, msg) + fill_s(msg)
        payload_s = _pipelined(a_plateau, b_plateau, msg)
        return fastest(constants, payload_s, bandwidth_s - payload_s)
    return seconds


def _nvls_tree(between: list, d0, nvls_rate, nvls_hops: tuple):
    """NVLS inside the domain, a tree between domains (NCCL >= 2.18 multi-node default on H100)."""
    tree_s, hops = _tree_between_domains(between, nvls=True)
    fill_s = _depth_fill(between, 1, d0)    # the NVLS stage's own fill is in its ramp
    net = network_hops_s(nvls_hops + hops)
    return lambda msg: NVLS_BASE_LATENCY_S + (_pipelined(msg / nvls_rate(msg), tree_s(msg)[0], msg) + fill_s(msg)) + net


def _all_reduce(group, levels: tuple, ring) -> list:
    """All-reduce: the part inside the scale-up domain (if the group has members there) and the part
    between domains, each with its own algorithms (network.py's module doc): (name, seconds) of each
    allowed one, in NCCL's order."""
    views = group.views
    out = []
    top = views[-1].dim
    if _allowed(top, A.RING) and _allowed(views[0].dim, A.RING):
        out.append(("ring", ring))
    d0 = levels[0]
    domain = views[0] if views[0].dim is d0 else None
    between = views[1:] if domain is not None else views
    in_domain = domain is not None and domain.n > 1
    has_nvls = in_domain and bool(d0.nvls_bus_GBps) and d0.size > 1 and _allowed(d0, A.NVLS)
    nvls_hops = ((2 * d0.latency_s, True),)
    nvls_rate = _nvls_rate(d0) if has_nvls else None
    if not between:
        if has_nvls:
            net = network_hops_s(nvls_hops)
            out.append(("nvls", lambda msg: NVLS_BASE_LATENCY_S + msg / nvls_rate(msg) + net))
        return out or [("ring", ring)]
    chain = ((2 * (domain.n - 1) * d0.latency_s, True),) if in_domain else ()
    intra = _intra(domain if in_domain else None)
    if all(v.dim.in_network_reduction for v in between) and _allowed(top, A.SHARP):
        out.append(("sharp", _sharp(between, intra, chain, nvls_rate, nvls_hops)))
    if _allowed(top, A.TREE):
        out.append(("tree", _tree(between, intra, chain, domain.n if in_domain else 1, d0)))
    if has_nvls and d0.algorithm is not A.RING and top.algorithm is not A.RING:
        out.append(("nvls_tree", _nvls_tree(between, d0, nvls_rate, nvls_hops)))
    return out or [("ring", ring)]


def plan(group, kind: Collective, levels: tuple, flat: bool) -> tuple:
    """(name, seconds(msg_bytes)) of every algorithm NCCL could run for `kind` on this placement, in
    NCCL's order (network.algorithm_times)."""
    views = group.views
    if not views:
        return (("none", lambda msg: 0.0),)
    if flat and kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE):
        return (("flat_ring", _ring(group, 2 if kind is Collective.ALL_REDUCE else 1)),)
    if kind is Collective.BARRIER:
        barrier_s = sum(2 * math.ceil(math.log2(v.n)) * v.dim.latency_s for v in views)
        return (("barrier", lambda msg: barrier_s),)
    if kind is Collective.ALL_TO_ALL:
        return (("direct", _all_to_all(group, group.size)),)
    ring = _ring(group, 2 if kind is Collective.ALL_REDUCE else 1)
    if kind is not Collective.ALL_REDUCE:
        return (("ring", ring),)
    return tuple(_all_reduce(group, levels, ring))
