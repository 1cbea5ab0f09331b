"""The collective algorithms' times as functions of the message size, one plan per group placement and
kind (network.algorithm_times; the physics is in network.py's module doc).

A collective's time on one placement is, per algorithm and protocol, a few size-dependent terms (bytes
over the ramped rate, bytes over the plateau rate, a tree's pipeline fill) around constants of the
placement: each protocol's base and per-hop latencies, the slowest level's plateau rate, the share of
the buffer a ring moves. `plan(group, kind, levels)` computes those constants once per group (they are
kept on the group and in network._PLANS), so a size costs its own floats only, computed by the same
expressions in the same order as the per-call model they replace (tests/hardware/test_collective_plans.py
checks them bit for bit against it on random networks, groups, kinds and sizes).
"""

from __future__ import annotations

import math

from comet.config.cluster import CollectiveAlgorithm, Topology
from comet.graph.ir import Collective

A = CollectiveAlgorithm
_INF = math.inf
_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER

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
    is (an LL step does not take four times as long to fill as a Simple one). The ring's plan inlines
    this loop (perf: one frame per size of the most asked collectives)."""
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


def topology_share(topology: Topology, n: int, stride: int, ports: int, kind: str) -> float:
    """Fraction of a port's rate a group's `kind` traffic (ring, tree, direct, p2p) gets on a
    dimension's topology, for `n` members `stride` ports apart in a domain of `ports` (0: unbounded)
    (network.py's module doc). Ring and tree traffic get the same share on every topology."""
    if topology is Topology.FULLY_CONNECTED:
        links = (ports or n) - 1
        return (n - 1) / links if links > 0 else 1.0
    if topology is Topology.RING:
        if kind == "direct":
            return min(1.0, 4.0 / n)             # bisection: n/4 average hops per byte
        if kind == "p2p":
            return 0.5 / stride                  # one of the two neighbour links, shared over the hops
        return 1.0 / stride                      # strided sub-rings share each physical hop
    return 1.0


# the algorithm settings that allow each algorithm (`auto` or that one, as NCCL_ALGO)
_RING_OK, _TREE_OK, _NVLS_OK, _SHARP_OK = ((A.AUTO, A.RING), (A.AUTO, A.TREE), (A.AUTO, A.NVLS), (A.AUTO, A.SHARP))


# perf (i22n-network): the closures below inline what every size reads (the slowest level's ramped rate,
# the two pipelined stages, the ring's fastest protocol) rather than calling helpers, and their
# builders read the levels in one pass (a tree and SHARP share one builder, so do NVLSTree and SHARP
# with NVLS): a collective's first call on a group was 16-34 Python calls, a later size 4-8; now
# 10-16 and 2 (network.py's tables included). The expressions and their order are those of the
# helpers they replace (tests/hardware/test_collective_plans.py: bit for bit against the per-call
# model): the slowest rate is the first smallest of p * c / (c + h); two pipelined stages a, b
# (PIPELINE_ROUND_BYTES) take max(a, b) + min(a, b) x lost, max / min written `b if b > a else a` /
# `b if b < a else a` (the builtins' first-wins rule) and lost = min(1, round / msg) (1 for msg <= 0)
# written `round / msg if msg > round else 1.0` (round / msg < 1 exactly when msg > round, and equals
# 1.0 where the two forms differ); a stage without depth adds a fill of 0.0 (x + 0.0 is x for the
# non-negative times here); the properties latency_s and bandwidth read as their products.

def _ring(group, passes: int):
    """Ring all-gather / reduce-scatter (passes 1) or all-reduce (2) over the group's levels: NCCL
    pipelines the ring across nodes, so the rate is the slowest hop (Thakur, Rabenseifner & Gropp
    2005: each rank moves (n-1)/n of the buffer per pass). Built once per group and pass count (perf:
    a group's all-gathers and reduce-scatters share it)."""
    ring = group.rings.get(passes)
    if ring is not None:
        return ring
    n, views = group.n, group.views
    rates, plateau = [], None     # per level (plateau, half-efficiency bytes); the first smallest plateau
    for dim, _, _, _, _, p in views:
        rates.append((p, dim.half_efficiency_bytes))
        if plateau is None or p < plateau:
            plateau = p
    moved_share = passes * (n - 1) / n
    # the hops: a ring visiting k sub-domains of a level crosses k boundaries per pass; a crossing
    # counts at the outermost level it crosses (NCCL tuning.cc: nInterSteps = 2 * nNodes for
    # all-reduce), the remaining of the n-1 steps per pass are inner hops
    hops, outer_crossings, counted = [], 0, 0
    for dim, _, inner, _, _, _ in reversed(views[1:]):
        k = n // inner
        hops.append((passes * (k - outer_crossings) * (dim.latency_us * 1e-6), False))
        counted += k - outer_crossings
        outer_crossings = k
    hops.append((passes * max(0, n - 1 - counted) * (views[0][0].latency_us * 1e-6), True))
    constants = protocol_constants(hops)

    def seconds(msg: float) -> float:
        chunk = msg / n     # each ring step moves 1/n of the buffer
        rate = None
        for p, h in rates:
            r = p * chunk / (chunk + h)
            if rate is None or r < rate:
                rate = r
        moved = moved_share * msg
        payload_s = moved / plateau
        fill_s = moved / rate - payload_s
        best = _INF
        for factor, fixed in constants:
            t = fixed + payload_s / factor + fill_s
            if t < best:
                best = t
        return best
    group.rings[passes] = seconds
    return seconds


def _all_to_all(group, size: int):
    """Direct all-to-all: each member sends (n-1)/n of its buffer, the part for peers outside its
    sub-domain of a level through that level (nccl-tests#267: an inter-node all-to-all runs at one
    NIC's rate per GPU)."""
    views = group.views
    # per level: the share of the buffer sent through it (peers not inside the sub-domain below)
    levels = tuple([((inner * n - inner) / size, inner,
                     inner * dim.bandwidth * dim.bus_efficiency * topology_share(dim.topology, n, stride, ports, "direct")
                     / dim.oversubscription, dim.half_efficiency_bytes)
                    for dim, n, inner, stride, ports, _ in views])
    constants = protocol_constants(tuple([((n - 1) * dim.latency_s, len(views) == 1) for dim, n, *_ in views]))

    def seconds(msg: float) -> float:
        t, plateau, chunk = 0.0, 0.0, msg / size
        for outside, inner, p, h in levels:
            rate = p * chunk / (chunk + h)
            t = max(t, outside * msg * inner / rate)
            plateau = max(plateau, outside * msg * inner / p)
        return fastest(constants, plateau, t - plateau)
    return seconds


def _links_between(between) -> tuple:
    """What the algorithms between domains read of their levels, in one pass: per level (plateau,
    half-efficiency bytes) and the slowest plateau (the first smallest); the domains; the double
    binary tree's hops (Sanders, Speck & Traeff 2009: 2 log2(n) per level, up and down) and its depth
    stages (_tree); SHARP's hops (2 per level) and whether every level reduces in the network."""
    rates, plateau, domains, tree_hops, stages, sharp_hops, sharp = [], None, 1, [], [], [], True
    for dim, n, _, _, _, p in between:
        rates.append((p, dim.half_efficiency_bytes))
        if plateau is None or p < plateau:
            plateau = p
        domains *= n
        latency_s = dim.latency_us * 1e-6
        depth = 2 * math.ceil(math.log2(n))
        tree_hops.append((depth * latency_s, False))
        stages.append((depth, dim.half_efficiency_bytes, dim.bandwidth_GBps * 1e9 * dim.bus_efficiency))
        sharp_hops.append((2 * latency_s, False))
        sharp = sharp and dim.in_network_reduction
    return rates, plateau, domains, tuple(tree_hops), stages, tuple(sharp_hops), sharp


def _between_domains(links: tuple, intra, chain: tuple, chain_members: int, d0, tree: bool):
    """A double binary tree (tree) or SHARP between domains, pipelined with the NVLink chain inside the
    domain (intra: its (plateau, half), None where the group has no members there; chain: its hops).
    The tree (Sanders, Speck & Traeff 2009): NCCL's plain tree runs at half its bus rate whatever the
    node count (tuning.cc: tree algorithm bandwidth = busBw / 2), so each domain's NICs carry the
    buffer twice per direction, at TREE_BUS_FACTOR of the links; its depth: a buffer pipelined
    through a tree in chunks reaches the far end after one chunk has crossed every stage on the way
    up and down (T = (chunks + depth - 1) x per-chunk time), so the depth adds one chunk per stage at
    one link's rate: 2 log2(domains) network stages and 2 (chain - 1) NVLink stages of the chain
    inside the node; the chunk is the dimension's step (half_efficiency_bytes), or the whole buffer
    when that is smaller. SHARP: the switches reduce, each domain sends and receives the buffer once,
    whatever the node count (no depth: its fill is 0.0, which adds exactly nothing)."""
    rates, plateau, _, tree_hops, stages, sharp_hops, _ = links
    chain_stage = None
    if tree:
        if chain_members > 1:
            chain_stage = (2 * (chain_members - 1), d0.half_efficiency_bytes,
                           d0.bandwidth_GBps * 1e9 * d0.bus_efficiency)
        constants = protocol_constants(chain + tree_hops, tree=True)
    else:
        stages, constants = (), protocol_constants(chain + sharp_hops)
    intra_plateau, intra_half = intra or (None, None)

    def seconds(msg: float) -> float:
        if intra is None:
            a, a_plateau = 0.0, 0.0
        else:
            a, a_plateau = msg / (intra_plateau * msg / (msg + intra_half)), msg / intra_plateau
        moved = 2.0 * msg / TREE_BUS_FACTOR if tree else msg
        rate = None
        for p, h in rates:
            r = p * msg / (msg + h)
            if rate is None or r < rate:
                rate = r
        b, b_plateau = moved / rate, moved / plateau
        fill = 0
        for count, chunk, link in stages:
            fill += count * ((chunk if chunk < msg else msg) / link)
        if chain_stage is None:
            fill = fill + 0.0
        else:
            count, chunk, link = chain_stage
            fill = fill + count * ((chunk if chunk < msg else msg) / link)
        lost = PIPELINE_ROUND_BYTES / msg if msg > PIPELINE_ROUND_BYTES else 1.0
        payload_s = (b_plateau if b_plateau > a_plateau else a_plateau) + \
            (b_plateau if b_plateau < a_plateau else a_plateau) * lost
        return fastest(constants, payload_s, (((b if b > a else a) + (b if b < a else a) * lost) + fill) - payload_s)
    return seconds


def _nvls_between_domains(links: tuple, nvls: tuple, nvls_hops: tuple, tree: bool):
    """NVLS inside the domain (nvls: its rate's (full, half), _all_reduce) pipelined with a tree
    (NVLSTree, NCCL >= 2.18 multi-node default on H100) or SHARP between domains. The tree: each
    domain's NICs carry the buffer once per direction between two domains, twice with more (a node is
    interior in one of the two trees), at TREE_BUS_FACTOR of the links; its depth stages as
    _between_domains' (the NVLS stage's own fill is in its ramp). SHARP: the buffer once, no depth."""
    rates, _, domains, tree_hops, stages, sharp_hops, _ = links
    per_direction = 1.0 if domains <= 2 else 2.0
    if not tree:
        stages = ()
    net = network_hops_s(nvls_hops + (tree_hops if tree else sharp_hops))
    full, half = nvls

    def seconds(msg: float) -> float:
        moved = per_direction * msg / TREE_BUS_FACTOR if tree else msg
        rate = None
        for p, h in rates:
            r = p * msg / (msg + h)
            if rate is None or r < rate:
                rate = r
        a, b = msg / (full * (msg / (msg + half))), moved / rate
        fill = 0
        for count, chunk, link in stages:
            fill += count * ((chunk if chunk < msg else msg) / link)
        lost = PIPELINE_ROUND_BYTES / msg if msg > PIPELINE_ROUND_BYTES else 1.0
        return NVLS_BASE_LATENCY_S + (((b if b > a else a) + (b if b < a else a) * lost) + (fill + 0.0)) + net
    return seconds


def _all_reduce(group, levels: tuple, ring) -> tuple:
    """All-reduce: the part inside the scale-up domain (if the group has members there) and the part
    between domains, each with its own algorithms (network.py's module doc): (name, seconds) of each
    allowed one, in NCCL's order."""
    views = group.views
    out = []
    top = views[-1][0]
    if top.algorithm in _RING_OK and views[0][0].algorithm in _RING_OK:
        out.append(("ring", ring))
    d0 = levels[0]
    domain = views[0] if views[0][0] is d0 else None
    between = views[1:] if domain is not None else views
    in_domain = domain is not None and domain[1] > 1
    has_nvls = in_domain and bool(d0.nvls_bus_GBps) and d0.size > 1 and d0.algorithm in _NVLS_OK
    nvls_hops = ((2 * (d0.latency_us * 1e-6), True),)
    # NVLS all-reduce's algorithm bandwidth full x msg / (msg + half): the measured bus bandwidth at a
    # full domain converted with nccl-tests' busbw = algbw * 2(n-1)/n (each GPU moves the buffer once
    # per direction, so the rate does not depend on how many members take part), reached by large
    # buffers only
    nvls = (d0.nvls_bus_GBps * 1e9 * d0.size / (2 * (d0.size - 1)), d0.nvls_half_efficiency_bytes) \
        if has_nvls else None
    if not between:
        if has_nvls:
            net = network_hops_s(nvls_hops)
            full, half = nvls
            out.append(("nvls", lambda msg: NVLS_BASE_LATENCY_S + msg / (full * (msg / (msg + half))) + net))
        return tuple(out) or (("ring", ring),)
    links = _links_between(between)
    chain = ((2 * (domain[1] - 1) * (d0.latency_us * 1e-6), True),) if in_domain else ()
    intra = (domain[5], d0.half_efficiency_bytes) if in_domain else None
    chain_members = domain[1] if in_domain else 1
    if links[6] and top.algorithm in _SHARP_OK:
        out.append(("sharp", _nvls_between_domains(links, nvls, nvls_hops, tree=False) if has_nvls else
                    _between_domains(links, intra, chain, chain_members, d0, tree=False)))
    if top.algorithm in _TREE_OK:
        out.append(("tree", _between_domains(links, intra, chain, chain_members, d0, tree=True)))
    if has_nvls and d0.algorithm is not A.RING and top.algorithm is not A.RING:
        out.append(("nvls_tree", _nvls_between_domains(links, nvls, nvls_hops, tree=True)))
    return tuple(out) or (("ring", ring),)


def plan(group, kind: Collective, levels: tuple, flat: bool) -> tuple:
    """(name, seconds(msg_bytes)) of every algorithm NCCL could run for `kind` on this placement, in
    NCCL's order (network.algorithm_times)."""
    views = group.views
    if not views:
        return (("none", lambda msg: 0.0),)
    if kind is _ALL_REDUCE:
        return (("flat_ring", _ring(group, 2)),) if flat else _all_reduce(group, levels, _ring(group, 2))
    if kind is _ALL_GATHER or kind is _REDUCE_SCATTER:
        return (("flat_ring" if flat else "ring", _ring(group, 1)),)
    if kind is Collective.BARRIER:
        barrier_s = sum(2 * math.ceil(math.log2(n)) * (dim.latency_us * 1e-6) for dim, n, *_ in views)
        return (("barrier", lambda msg: barrier_s),)
    if kind is Collective.ALL_TO_ALL:
        return (("direct", _all_to_all(group, group.size)),)
    return (("ring", _ring(group, 1)),)
