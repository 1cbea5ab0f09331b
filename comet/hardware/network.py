"""Collective and point-to-point times on a multi-dimensional network, the way NCCL runs them.

Placement. A group of `size` ranks whose global ranks are `stride` apart spans the network dimensions
innermost first (Megatron's rank order tp, cp, ep, dp, pp puts TP innermost): as many members as fit in
one domain of a dimension share it, the rest spread over the next dimension (`group_span`). The
members of one domain share that domain's links to the next level: a DP group with one member per node
gets one NIC, a group with four members per node four NICs (`_DimView.port_GBps`).

Topology of a dimension changes what a group gets of the per-GPU bandwidth (`_topology_share`):
  switch           every GPU reaches every other at its full port rate; an oversubscribed tier
                   (ratio r) gives 1/r of it to traffic that crosses that tier.
  fully_connected  the port rate is split over D-1 direct links (D GPUs per domain): a group of n
                   of them uses n-1 of those links (AMD MI300X xGMI, NVIDIA DGX-1 hybrid cube mesh).
  ring (torus)     two neighbour links: ring algorithms over consecutive members run at the full rate
                   (bidirectional rings), strided members share each physical hop with the
                   interleaved groups (1/stride), all-to-all is limited by the ring's bisection
                   (n/4 average hops per byte, Dally & Towles, "Principles and Practices of
                   Interconnection Networks", 2004, section 3.3).

Algorithms (NCCL 2.18-2.29, src/graph/tuning.cc, and the NCCL docs "Collective operations"), each with a
bandwidth term (bytes over the bottleneck rate) and a latency term (steps x per-hop latency):
  ring       all-reduce 2(n-1)/n of the buffer, all-gather / reduce-scatter (n-1)/n (Thakur, Rabenseifner
             & Gropp 2005). NCCL pipelines the ring across nodes, so the rate is the slowest hop, not
             a sum of per-dimension phases.
  tree       all-reduce over a double binary tree between domains (Sanders, Speck & Traeff 2009):
             log2(nodes) latency; a node interior in one tree and leaf in the other moves 2x the
             buffer per direction through its NICs (1x with two nodes).
  nvls       NVLink SHARP all-reduce inside an NVSwitch domain (H100 NVSwitch gen3): the switch
             reduces, each GPU moves the buffer once per direction, at the measured NVLS rate.
  nvls_tree  NVLS inside the domain, tree between domains (NCCL >= 2.18 multi-node default on H100):
             two pipelined stages (see below).
  sharp      in-network reduction on a fabric that has it (Quantum-2 SHARPv3, NCCL CollNet): each
             domain sends and receives the buffer once, whatever the node count.
  direct     all-to-all / pairwise: every member sends (n-1)/n of its buffer, peers in the same
             domain over the inner links, the rest through one port per GPU (nccl-tests#267: an
             inter-node all-to-all runs at one NIC's rate per GPU).
NCCL's choice among the allowed algorithms is the fastest by this model, as NCCL's own tuner picks by
its model (`algorithm: auto`); a dimension's `algorithm` other than auto restricts the choice as
NCCL_ALGO does.

Bus-bandwidth efficiency per dimension: eff(m) = bus_efficiency * m / (m + half_efficiency_bytes)
(chunk pipelining fill-in and per-message cost; nccl-tests curves rise to a plateau). That ramp is a
time per pipeline step (half_efficiency_bytes at the plateau rate), so a protocol's bandwidth factor
(LL 1/4, LL128 120/128) slows the payload, not the fill (_Cost). The tree between domains runs at
0.92 of its links (TREE_BUS_FACTOR, tuning.cc). Algorithms with a stage inside the node and one
between nodes (tree, nvls_tree, sharp) pipeline the two in rounds of PIPELINE_ROUND_BYTES: a
buffer of a round or less pays both stages, a large one the slower stage. A tree also pays its
depth: one chunk per stage up and down before its pipeline runs full (_depth_fill_s).

Point-to-point: `p2p_time_s` sends one buffer over the innermost level holding both ranks, at the
port's rate or, where the communicator is given, at the rate of the NCCL channels it gets
(p2p_channels.py);
`ring_exchange_time_s` times one step of a ring exchange (context parallelism) at its slowest hop,
so a CP ring spanning nodes moves at the NIC rate.
"""

from __future__ import annotations

import math

from comet.config.cluster import ClusterSpec, CollectiveAlgorithm, NetworkDim, Topology
from comet.graph.ir import Collective
from comet.hardware.p2p_channels import net_p2p_rate_GBps, nvlink_p2p_rate_GBps

A = CollectiveAlgorithm


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
        ranks_per_domain = dim.size
        if ranks_per_domain and step >= ranks_per_domain:
            span.append(1)
        else:
            # perf: integer arithmetic (an unbounded domain holds all that remain)
            fit = int(min(remaining, max(1, ranks_per_domain // step)) if ranks_per_domain else remaining)
            while remaining % fit:
                fit -= 1
            span.append(fit)
            remaining //= fit
            step *= fit
    if remaining > 1:   # only reachable if every dimension is bounded and too small
        span[-1] *= remaining
    return span


class _DimView:
    """One spanned dimension as the group sees it (read-only by convention; perf: a slotted class, a
    frozen dataclass's __init__ costs a setattr call per field on every collective's cost model)."""
    __slots__ = ("dim", "n", "inner", "stride", "ports", "plateaus")

    def __init__(self, dim: NetworkDim, n: int, inner: int, stride: int, ports: int):
        self.dim = dim
        self.n = n                 # group members along this dimension
        self.inner = inner         # group members inside one domain of the level below (share its ports)
        self.stride = stride       # distance between consecutive members, in ports of this dimension
        self.ports = ports         # ports (GPUs or sub-domains) of one domain of this dimension; 0 = unbounded
        self.plateaus: dict[str, float] = {}   # traffic kind -> plateau rate (size-independent, see rates)

    def rates(self, chunk_bytes: float, kind: str) -> tuple[float, float]:
        """(rate, plateau rate): bytes per second the group's traffic gets through this dimension, per
        inner domain, when each step moves `chunk_bytes` per rank (pipelining and per-message
        overheads: eff(chunk)), and the same without the per-step fill."""
        d = self.dim
        # perf (i17n-network): the plateau reads the placement and the kind of traffic, not the size:
        # computed once per view (views are shared by every size of a group: _group), the same expression
        plateau = self.plateaus.get(kind)
        if plateau is None:
            plateau = self.plateaus[kind] = (self.inner * d.bandwidth * d.bus_efficiency * _topology_share(self, kind)
                                             / d.oversubscription)
        return plateau * chunk_bytes / (chunk_bytes + d.half_efficiency_bytes), plateau


def _slowest(views: list[_DimView], chunk_bytes: float, kind: str) -> tuple[float, float]:
    """(rate, plateau rate) of the slowest of `views`."""
    rate, plateau = views[0].rates(chunk_bytes, kind)
    for v in views[1:]:   # perf: one pass (min over each column, as min() of the lists picks)
        r, p = v.rates(chunk_bytes, kind)
        if r < rate:
            rate = r
        if p < plateau:
            plateau = p
    return rate, plateau


def _topology_share(v: _DimView, kind: str) -> float:
    """Fraction of a port's rate the group's pattern gets on this dimension's topology (module doc)."""
    topo = v.dim.topology
    if topo is Topology.FULLY_CONNECTED:
        links = (v.ports or v.n) - 1
        return (v.n - 1) / links if links > 0 else 1.0
    if topo is Topology.RING:
        if kind == "direct":
            return min(1.0, 4.0 / v.n)             # bisection: n/4 average hops per byte
        if kind == "p2p":
            return 0.5 / v.stride                  # one of the two neighbour links, shared over the hops
        return 1.0 / v.stride                      # strided sub-rings share each physical hop
    return 1.0


def _views(size: int, stride: int, network: tuple[NetworkDim, ...], flat: bool = False) -> list[_DimView]:
    """The spanned dimensions; `flat`: the group's traffic leaves each domain through one port, not
    through all of its members' ports together (inner = 1 at every level)."""
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


class _Group:
    """A group's placement on one network: what its collectives' times read that does not depend on
    the message size, computed once per (network, size, stride, flat) by _group: the spanned levels
    (whose plateau rates fill in per traffic kind on first use), the member count and the ring's
    hops per pass count. Read-only by convention once built."""
    __slots__ = ("levels", "views", "n", "ring_hops")

    def __init__(self, levels: tuple[NetworkDim, ...], views: list[_DimView]):
        self.levels = levels   # held: the table is keyed by its id
        self.views = views
        self.n = math.prod(v.n for v in views)
        self.ring_hops: dict[int, tuple] = {}   # passes -> the ring's hops (_ring)


# perf (i17n-network): (id(levels), size, stride, flat) -> _Group. A cold GPT-3 1T call times ten
# collectives on three groups, a search the same few groups at many sizes: the placement (group_span,
# the views, their plateau rates, the ring's hops) is built once per group, a size costs the size's
# floats only. Bounded (emptied when full, rebuilt equal); the levels tuple is per network
# (ClusterSpec.levels, network_levels' cache) and held by its entry, so its id is not reused while the
# entry lives. clear_groups() empties it (replay/cache.clear).
_GROUPS: dict[tuple, _Group] = {}
_GROUP_ENTRIES = 4096


def _group(size: int, stride: int, levels: tuple[NetworkDim, ...], flat: bool = False) -> _Group:
    key = (id(levels), size, stride, flat)
    group = _GROUPS.get(key)
    if group is None or group.levels is not levels:
        if len(_GROUPS) >= _GROUP_ENTRIES:
            _GROUPS.clear()
        group = _GROUPS[key] = _Group(levels, _views(size, stride, levels, flat))
    return group


def clear_groups() -> None:
    """Empty the per-group placement table (a cold-start benchmark, tests)."""
    _GROUPS.clear()


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


class _Cost:
    """One algorithm: bytes-over-rate time at the full (Simple) rate, and its per-hop latencies.
    `plateau_s`: the same bytes at the plateau rate, without the per-step fill (bandwidth_s -
    plateau_s). A protocol's bandwidth factor slows the payload only: the fill (the time per
    pipeline step that eff(chunk) stands for) is a time, not a share of the link, so it is added as
    it is (an LL step does not take four times as long to fill as a Simple one)."""
    __slots__ = ("bandwidth_s", "hops", "nvls", "tree", "plateau_s")   # perf: see _DimView

    def __init__(self, bandwidth_s: float, hops: tuple[tuple[float, bool], ...], nvls: bool = False,
                 tree: bool = False, plateau_s: float | None = None):
        self.bandwidth_s = bandwidth_s
        self.hops = hops          # (hop latency s at Simple, is the innermost dimension)
        self.nvls = nvls
        self.tree = tree
        self.plateau_s = plateau_s

    def time(self) -> float:
        # perf: plain loops instead of generator sums (the same additions, left to right)
        hops = self.hops
        if self.nvls:   # the NVLS part of the path is in the base latency; only network hops add
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


def _ring(kind: Collective, msg: float, group: _Group) -> _Cost:
    views, n = group.views, group.n
    passes = 2 if kind is Collective.ALL_REDUCE else 1
    rate, plateau = _slowest(views, msg / n, "ring")    # each ring step moves 1/n of the buffer
    hops = group.ring_hops.get(passes)
    if hops is None:
        hops = group.ring_hops[passes] = _ring_hops(views, n, passes)
    moved = passes * (n - 1) / n * msg
    return _Cost(moved / rate, hops, plateau_s=moved / plateau)


def _ring_hops(views: list[_DimView], n: int, passes: int) -> tuple:
    """The ring's per-hop latencies. A ring visiting k sub-domains of a level crosses k boundaries per
    pass; a crossing counts at the outermost level it crosses (NCCL tuning.cc: nInterSteps = 2 * nNodes
    for all-reduce), the remaining of the n-1 steps per pass are inner hops."""
    hops, outer_crossings, counted = [], 0, 0
    for v in reversed(views[1:]):
        k = n // v.inner
        hops.append((passes * (k - outer_crossings) * v.dim.latency_s, False))
        counted += k - outer_crossings
        outer_crossings = k
    hops.append((passes * max(0, n - 1 - counted) * views[0].dim.latency_s, len(views) == 1 or True))
    return tuple(hops)


def _tree_between_domains(msg: float, outer: list[_DimView], nvls: bool) -> tuple[float, float, list]:
    """(bandwidth time, the same at the plateau rate, hops) of a double-binary-tree all-reduce
    between the domains of `outer`. With NVLS inside the domain each domain's NICs carry the buffer
    once per direction between two domains, twice with more (a node is interior in one of the two
    trees); NCCL's plain tree runs at half its bus rate whatever the node count (tuning.cc: tree
    algorithm bandwidth = busBw / 2); the tree's links at TREE_BUS_FACTOR."""
    domains = math.prod(v.n for v in outer)
    per_direction = 1.0 if nvls and domains <= 2 else 2.0
    rate, plateau = _slowest(outer, msg, "tree")
    hops = [(2 * math.ceil(math.log2(v.n)) * v.dim.latency_s, False) for v in outer]
    moved = per_direction * msg / TREE_BUS_FACTOR
    return moved / rate, moved / plateau, hops


def _nvls_rate(dim: NetworkDim, msg_bytes: float) -> float:
    """Algorithm bandwidth of NVLS all-reduce: the measured bus bandwidth at a full domain, converted
    with nccl-tests' busbw = algbw * 2(n-1)/n (each GPU moves the buffer once per direction, so the rate
    does not depend on how many members take part), reached by large buffers only."""
    n = dim.size
    ramp = msg_bytes / (msg_bytes + dim.nvls_half_efficiency_bytes)
    return dim.nvls_bus_GBps * 1e9 * n / (2 * (n - 1)) * ramp


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


def _pipelined(stage_a: float, stage_b: float, msg_bytes: float) -> float:
    """Time of two pipelined stages over a buffer of msg_bytes (see PIPELINE_ROUND_BYTES)."""
    overlap_lost = min(1.0, PIPELINE_ROUND_BYTES / msg_bytes) if msg_bytes > 0 else 1.0
    return max(stage_a, stage_b) + min(stage_a, stage_b) * overlap_lost


def _depth_fill_s(msg_bytes: float, between: list[_DimView], chain: int, d0: NetworkDim) -> float:
    """Pipeline fill of a tree: a buffer pipelined through a tree in chunks reaches the far end
    after one chunk has crossed every stage on the way up and down (Sanders, Speck & Traeff 2009:
    T = (chunks + depth - 1) x per-chunk time), so the depth adds one chunk per stage at one link's
    rate: 2 log2(domains) network stages, and for the plain tree 2 (chain - 1) NVLink stages of the
    chain inside the node. The chunk is the dimension's step (half_efficiency_bytes), or the whole
    buffer when that is smaller."""
    def stage_s(dim: NetworkDim) -> float:
        return min(msg_bytes, dim.half_efficiency_bytes) / (dim.bandwidth * dim.bus_efficiency)
    fill = sum(2 * math.ceil(math.log2(v.n)) * stage_s(v.dim) for v in between)
    return fill + (2 * (chain - 1) * stage_s(d0) if chain > 1 else 0.0)


def _allowed(dim: NetworkDim, algo: CollectiveAlgorithm) -> bool:
    return dim.algorithm in (A.AUTO, algo)


def algorithm_times(kind: Collective, msg_bytes: float, size: int, stride: int,
                    cluster: ClusterSpec, flat: bool = False) -> dict[str, float]:
    """Time of every algorithm NCCL could run for this collective on this placement (seconds), each at
    its fastest protocol. `flat`: a single ring over the whole group whose cross-domain hops get one
    port per GPU, not the domain's ports together. DeepSpeed-2021 ZeRO-3 issues its per-module
    all-gathers / reduce-scatters over the whole DP group this way: Narayanan et al. SC21 Table 2 steps
    stay flat as GPUs double, communication-bound at about one HDR NIC per GPU (~21-25 GB/s; see
    ../shared/docs/physics-notes.md "DeepSpeed ZeRO-3 (2021)"); a hierarchical ring using all 8 NICs
    of a node would be 8x faster. Time = (n-1)/n * buffer / min(port rate) for all-gather and
    reduce-scatter, 2x for all-reduce (Thakur, Rabenseifner & Gropp 2005)."""
    levels = cluster.levels
    group = _group(size, stride, levels, flat)
    views = group.views
    if not views:
        return {"none": 0.0}
    if flat and kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE):
        return {"flat_ring": _ring(kind, msg_bytes, group).time()}
    if kind is Collective.BARRIER:
        return {"barrier": sum(2 * math.ceil(math.log2(v.n)) * v.dim.latency_s for v in views)}
    if kind is Collective.ALL_TO_ALL:
        t, plateau = 0.0, 0.0
        for v in views:
            # bytes each member sends to peers reached through this dimension (not inside its sub-domain)
            outside = (v.inner * v.n - v.inner) / size
            rate, plateau_rate = v.rates(msg_bytes / size, "direct")
            t = max(t, outside * msg_bytes * v.inner / rate)
            plateau = max(plateau, outside * msg_bytes * v.inner / plateau_rate)
        hops = tuple(((v.n - 1) * v.dim.latency_s, v is views[0] and len(views) == 1) for v in views)
        return {"direct": _Cost(t, hops, plateau_s=plateau).time()}
    ring = _ring(kind, msg_bytes, group).time()
    out = {}
    top = views[-1].dim
    if _allowed(top, A.RING) and _allowed(views[0].dim, A.RING):
        out["ring"] = ring
    if kind is not Collective.ALL_REDUCE:
        return out or {"ring": ring}
    # all-reduce: the part inside the scale-up domain (if the group has members there) and the part
    # between domains, each with its own algorithms
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
        # the switches reduce: each domain sends and receives the buffer once, whatever the node count
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
        fill = _depth_fill_s(msg_bytes, between, 1, d0)    # the NVLS stage's own fill is in its ramp
        out["nvls_tree"] = _Cost(_pipelined(msg_bytes / _nvls_rate(d0, msg_bytes), bw, msg_bytes) + fill,
                                 nvls_hops + tuple(hops), nvls=True).time()
    return out or {"ring": ring}


def chosen_algorithm(kind: Collective, msg_bytes: float, size: int, stride: int,
                     cluster: ClusterSpec, flat: bool = False) -> tuple[str, float]:
    """NCCL's choice: the fastest allowed algorithm by the model (tuning.cc picks by its model)."""
    times = algorithm_times(kind, msg_bytes, size, stride, cluster, flat)
    name = min(times, key=times.get)
    return name, times[name]


def collective_time_s(kind: Collective, msg_bytes: float, size: int, stride: int, cluster: ClusterSpec,
                      flat: bool = False) -> float:
    """Time of one collective; msg_bytes is the full buffer per rank (the gathered size for all-gather,
    the input size for reduce-scatter and all-reduce, the send buffer for all-to-all), as nccl-tests
    reports `size`. `flat`: one ring over the whole group at one port per GPU (algorithm_times)."""
    if size <= 1 or msg_bytes <= 0:
        return 0.0
    return chosen_algorithm(kind, msg_bytes, size, stride, cluster, flat)[1]


def _hop_time_s(msg_bytes: float, level: int, distance: int, levels: tuple[NetworkDim, ...],
                cap_Bps: float = math.inf) -> float:
    """One send over network level `level` (index into `levels`, the cluster's) at one port's rate; `distance`
    (global ranks between sender and receiver) sets the topology share on a ring dimension; `cap_Bps`:
    the rate the send's NCCL channels are sized for, where lower than the port's (p2p_channels.py)."""
    below = levels[level - 1].size if level > 0 else 1
    dim = levels[level]
    ports = dim.size // below if dim.size else 0
    view = _DimView(dim, 2, 1, max(1, distance // below), ports)
    rate, plateau = view.rates(msg_bytes, "p2p")
    if plateau > cap_Bps:
        rate, plateau = rate * cap_Bps / plateau, cap_Bps
    return _Cost(msg_bytes / rate, ((dim.latency_s, level == 0),), plateau_s=msg_bytes / plateau).time()


def _level_holding(a: int, b: int, levels: tuple[NetworkDim, ...]) -> int:
    """Index of the innermost level whose domain holds both global ranks a and b."""
    for i, dim in enumerate(levels):
        if dim.size == 0 or a // dim.size == b // dim.size:
            return i
    return len(levels) - 1


def p2p_time_s(msg_bytes: float, distance: int, cluster: ClusterSpec, ranks: int = 0,
               local_ranks: int = 1) -> float:
    """Send `msg_bytes` to a rank `distance` global ranks away (pipeline neighbours: tp*cp*ep*dp): over
    the innermost dimension whose domain holds both ranks, at one port's rate or the rate of the NCCL
    channels the send gets, which depend on the communicator: `ranks` of them, `local_ranks` per node
    (p2p_channels.py). ranks 0 = not known: as many channels as the port needs, so the port's rate."""
    if msg_bytes <= 0:
        return 0.0
    levels = cluster.levels
    level = next((i for i, dim in enumerate(levels) if dim.size == 0 or distance < dim.size), None)
    if level is None:
        level, distance = len(levels) - 1, 1
    dim = levels[level]
    if level > 0:
        cap = net_p2p_rate_GBps(dim.bandwidth / 1e9, ranks, local_ranks, msg_bytes) * 1e9
    else:   # inside the NVLink domain: the channels of a single-node communicator (p2p_channels.py)
        cap = nvlink_p2p_rate_GBps(dim.bandwidth / 1e9, ranks if ranks <= local_ranks else 0, msg_bytes) * 1e9
    return _hop_time_s(msg_bytes, level, distance, levels, cap)


def ring_exchange_time_s(msg_bytes: float, size: int, stride: int, cluster: ClusterSpec) -> float:
    """One step of a ring exchange (context-parallel ring attention, Megatron-Core CP): each of the
    `size` members, `stride` global ranks apart, sends `msg_bytes` to the next and the last to the
    first, all at once; the step ends with its slowest hop. A hop runs over the innermost level whose
    domain holds both of its ends: a ring that spans nodes crosses a node boundary at least twice (the
    boundary between consecutive members and the wrapping hop), and those hops go through the NIC. A
    ring inside one domain is one p2p hop at the member stride, as before. The group is placed as
    Megatron's rank order places the group of rank 0 (members 0, stride, ..., (size-1) stride); every
    other group of the same shape crosses the same boundaries when domains are multiples of the
    stride's block, as they are for tp dividing the node."""
    if msg_bytes <= 0 or size <= 1:
        return 0.0
    members = [i * stride for i in range(size)]
    levels = cluster.levels
    crossed = {_level_holding(a, b, levels) for a, b in zip(members, members[1:] + members[:1])}
    return max(_hop_time_s(msg_bytes, level, stride, levels) for level in crossed)
