"""Collective and point-to-point times on a multi-dimensional network, the way NCCL runs them.

Placement. A group of `size` ranks whose global ranks are `stride` apart spans the network dimensions
innermost first (Megatron's rank order tp, cp, ep, dp, pp puts TP innermost): as many members as fit in
one domain of a dimension share it, the rest spread over the next dimension (`group_span`). The
members of one domain share that domain's links to the next level: a DP group with one member per node
gets one NIC, a group with four members per node four NICs (`_Group`: a level's plateau per inner domain).

Topology of a dimension changes what a group gets of the per-GPU bandwidth (`collective_plans.topology_share`):
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
(LL 1/4, LL128 120/128) slows the payload, not the fill (collective_plans.fastest). The tree between
domains runs at 0.92 of its links (TREE_BUS_FACTOR, tuning.cc). Algorithms with a stage inside the
node and one between nodes (tree, nvls_tree, sharp) pipeline the two in rounds of
PIPELINE_ROUND_BYTES: a buffer of a round or less pays both stages, a large one the slower stage. A
tree also pays its depth: one chunk per stage up and down before its pipeline runs full
(collective_plans._between_domains). The arithmetic per size is in collective_plans.py, around constants
computed once per group placement.

Point-to-point: `p2p_time_s` sends one buffer over the innermost level holding both ranks, at the
port's rate or, where the communicator is given, at the rate of the NCCL channels it gets
(p2p_channels.py);
`ring_exchange_time_s` times one step of a ring exchange (context parallelism) at its slowest hop,
so a CP ring spanning nodes moves at the NIC rate.
"""

from __future__ import annotations

import math

from comet.config.cluster import ClusterSpec, NetworkDim, Topology
from comet.graph.ir import Collective
from comet.hardware.collective_plans import (NVLS_BASE_LATENCY_S, PIPELINE_ROUND_BYTES, PROTOCOLS,  # noqa: F401
                                             TREE_BUS_FACTOR, TREE_PROTOCOLS, fastest, protocol_constants,
                                             topology_share)
from comet.hardware.collective_plans import plan as collective_plan
from comet.hardware.p2p_channels import net_p2p_rate_GBps, nvlink_p2p_rate_GBps

_SWITCH = Topology.SWITCH


def group_span(size: int, stride: int, network: tuple[NetworkDim, ...]) -> list[int]:
    """Members of the group per network dimension; the product equals `size` (_Group computes it)."""
    return _Group(size, stride, network, False).span


def members_in_domain(size: int, stride: int, ranks_per_domain: int) -> int:
    """How many members of a group of `size` ranks `stride` apart one domain of `ranks_per_domain`
    consecutive global ranks holds (0: unbounded): the largest divisor of `size` that fits."""
    if ranks_per_domain and stride >= ranks_per_domain:
        return 1
    # perf: integer arithmetic (an unbounded domain holds all that remain)
    fit = int(min(size, max(1, ranks_per_domain // stride)) if ranks_per_domain else size)
    while size % fit:
        fit -= 1
    return fit


class _Group:
    """A group's placement on one network: what its collectives' times read that does not depend on
    the message size, computed once per (network, size, stride, flat) (_new_plan): the spanned
    levels, the member count, and the ring per pass count that its kinds' plans share (_PLANS holds
    the plans). Read-only by convention once built.

    `views`, the spanned levels innermost first: per level (dim, n, inner, stride, ports, plateau): the
    group's members along it, its members inside one domain of the level below (they share that
    domain's ports), the distance between consecutive members in ports of this level, the ports of
    one of its domains (0: unbounded), and the bytes per second ring and tree traffic gets through it
    per inner domain at the plateau (large steps; collective_plans.py reads them). `flat`: the group's
    traffic leaves each domain through one port, not through all of its members' ports together
    (inner = 1 at every level).
    perf (i22n-network): the span and the views (tuples) built in this one pass (no object, no plateau
    memo per level; the property bandwidth read as its product, bandwidth_GBps * 1e9)."""
    __slots__ = ("levels", "span", "views", "n", "size", "rings")

    def __init__(self, size: int, stride: int, levels: tuple[NetworkDim, ...], flat: bool):
        self.levels = levels   # held: the table is keyed by its id
        # the span (group_span): as many of the remaining members as one domain of a level holds share
        # it, the rest spread over the next level
        span, views, inner, step, below, remaining, last = [], [], 1, stride, 1, size, len(levels) - 1
        for i, dim in enumerate(levels):
            n_members = 1
            if remaining > 1:
                n_members = members_in_domain(remaining, step, dim.size)
                remaining //= n_members
                if remaining > 1 and i == last:   # only reachable if every dimension is bounded and too small
                    n_members *= remaining
            span.append(n_members)
            ports = dim.size // below if dim.size else 0
            if n_members > 1:
                shared = 1 if flat else inner
                hop = step // below or 1    # max(1, step // below): strides are positive
                topology = dim.topology
                share = 1.0 if topology is _SWITCH else topology_share(topology, n_members, hop, ports, "ring")
                views.append((dim, n_members, shared, hop, ports,
                              shared * (dim.bandwidth_GBps * 1e9) * dim.bus_efficiency * share / dim.oversubscription))
                inner *= n_members
                step *= n_members
            below = dim.size or below
        self.span = span
        self.views = tuple(views)
        self.n = inner          # the members: the product of the spanned levels' counts
        self.size = size
        self.rings: dict = {}   # passes -> the ring's seconds(msg) (collective_plans._ring: shared by kinds)


# perf (i17n-network): (id(levels), size, stride, flat) -> _Group. A cold GPT-3 1T call times ten
# collectives on three groups, a search the same few groups at many sizes: the placement (group_span,
# the views, their plateau rates, the ring's hops) is built once per group, a size costs the size's
# floats only. Bounded (emptied when full, rebuilt equal); the levels tuple is per network
# (ClusterSpec.levels, network_levels' cache) and held by its entry, so its id is not reused while the
# entry lives. clear_groups() empties it (replay/cache.clear).
_GROUPS: dict[tuple, _Group] = {}
_GROUP_ENTRIES = 4096
# perf (i22n-network): (id(levels), size, stride, flat, kind) -> (levels, plan): a collective's plan in
# one look-up (was _plan -> _group -> the group's plans by kind). Bounded and emptied with _GROUPS.
_PLANS: dict[tuple, tuple] = {}


def clear_groups() -> None:
    """Empty the per-group placement and plan tables (a cold-start benchmark, tests)."""
    _GROUPS.clear()
    _PLANS.clear()


def _new_plan(kind: Collective, size: int, stride: int, levels: tuple[NetworkDim, ...], flat: bool) -> tuple:
    """The algorithms' plans of `kind` on this placement (collective_plans.plan), built once per group
    and kind and entered in _PLANS."""
    if len(_PLANS) >= 4 * _GROUP_ENTRIES or len(_GROUPS) >= _GROUP_ENTRIES:
        clear_groups()
    key = (id(levels), size, stride, flat)
    group = _GROUPS.get(key)
    if group is None or group.levels is not levels:
        group = _GROUPS[key] = _Group(size, stride, levels, flat)
    plan = collective_plan(group, kind, levels, flat)
    _PLANS[(id(levels), size, stride, flat, kind)] = (levels, plan)
    return plan


def _plan(kind: Collective, size: int, stride: int, cluster: ClusterSpec, flat: bool) -> tuple:
    """The algorithms' plans of `kind` on this placement: (name, seconds(msg_bytes)) per algorithm."""
    levels = cluster.levels
    entry = _PLANS.get((id(levels), size, stride, flat, kind))
    return entry[1] if entry is not None and entry[0] is levels else _new_plan(kind, size, stride, levels, flat)


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
    return {name: seconds(msg_bytes) for name, seconds in _plan(kind, size, stride, cluster, flat)}


def chosen_algorithm(kind: Collective, msg_bytes: float, size: int, stride: int,
                     cluster: ClusterSpec, flat: bool = False) -> tuple[str, float]:
    """NCCL's choice: the fastest allowed algorithm by the model (tuning.cc picks by its model); the
    first of the fastest, in algorithm_times' order."""
    best_name, best = None, None
    for name, seconds in _plan(kind, size, stride, cluster, flat):
        t = seconds(msg_bytes)
        if best is None or t < best:
            best_name, best = name, t
    return best_name, best


def collective_time_s(kind: Collective, msg_bytes: float, size: int, stride: int, cluster: ClusterSpec,
                      flat: bool = False) -> float:
    """Time of one collective; msg_bytes is the full buffer per rank (the gathered size for all-gather,
    the input size for reduce-scatter and all-reduce, the send buffer for all-to-all), as nccl-tests
    reports `size`. `flat`: one ring over the whole group at one port per GPU (algorithm_times)."""
    if size <= 1 or msg_bytes <= 0:
        return 0.0
    # perf (i18s-step): the plans' times compared as they come, no dict of them (chosen_algorithm);
    # (i22n-network) _plan's look-up inline (one frame fewer a call)
    levels = cluster.levels
    entry = _PLANS.get((id(levels), size, stride, flat, kind))
    best = None
    for _, seconds in entry[1] if entry is not None and entry[0] is levels else \
            _new_plan(kind, size, stride, levels, flat):
        t = seconds(msg_bytes)
        if best is None or t < best:
            best = t
    return best


def _hop_time_s(msg_bytes: float, level: int, distance: int, levels: tuple[NetworkDim, ...],
                cap_Bps: float = math.inf) -> float:
    """One send over network level `level` (index into `levels`, the cluster's) at one port's rate; `distance`
    (global ranks between sender and receiver) sets the topology share on a ring dimension; `cap_Bps`:
    the rate the send's NCCL channels are sized for, where lower than the port's (p2p_channels.py)."""
    below = levels[level - 1].size if level > 0 else 1
    dim = levels[level]
    topology = dim.topology
    share = 1.0 if topology is _SWITCH else \
        topology_share(topology, 2, max(1, distance // below), dim.size // below if dim.size else 0, "p2p")
    # one port (inner 1) at the plateau and at the ramped rate eff(msg_bytes)
    plateau = 1 * (dim.bandwidth_GBps * 1e9) * dim.bus_efficiency * share / dim.oversubscription
    rate = plateau * msg_bytes / (msg_bytes + dim.half_efficiency_bytes)
    if plateau > cap_Bps:
        rate, plateau = rate * cap_Bps / plateau, cap_Bps
    payload_s = msg_bytes / plateau
    fill_s = msg_bytes / rate - payload_s
    # perf (i22n-network): fastest(protocol_constants(((latency_s, innermost),)), payload_s, fill_s)
    # inline, the same sums in the same order
    latency_s, innermost, best = dim.latency_us * 1e-6, level == 0, math.inf
    for factor, base, r_inner, r_net in PROTOCOLS.values():
        lat = 0
        lat += latency_s * (r_inner if innermost else r_net)
        t = base + lat + payload_s / factor + fill_s
        if t < best:
            best = t
    return best


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
    # perf (i22n-network): the innermost level holding both ranks by a loop (was next() over a generator)
    level = 0
    for dim in levels:
        if dim.size == 0 or distance < dim.size:
            break
        level += 1
    else:
        level, distance = len(levels) - 1, 1
    dim = levels[level]
    port_GBps = dim.bandwidth_GBps * 1e9 / 1e9     # dim.bandwidth / 1e9, as before
    if level > 0:
        cap = net_p2p_rate_GBps(port_GBps, ranks, local_ranks, msg_bytes) * 1e9
    else:   # inside the NVLink domain: the channels of a single-node communicator (p2p_channels.py)
        cap = nvlink_p2p_rate_GBps(port_GBps, ranks if ranks <= local_ranks else 0, msg_bytes) * 1e9
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
