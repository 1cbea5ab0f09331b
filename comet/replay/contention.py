"""Scale-out NIC sharing between a stage's DP gradient stream and the backward tasks it overlaps.

Megatron DDP (overlap_grad_reduce) reduces gradient buckets while the last backward passes still run.
Where the DP group leaves the scale-up (NVLink) domain, and so does traffic of those backward tasks
(a CP ring exchange or EP all-to-all spanning nodes, the pipeline send of the input gradient to the
previous stage), both cross the same NIC: one NIC per GPU, rails (DGX H100 SuperPOD reference
architecture), so a GPU's inter-node flows of every group share one port.

Model (fluid max-min fair sharing of one port, the equilibrium of competing flows on a link,
Bertsekas & Gallager "Data Networks" 6.5.2):
- in isolation the backward's own inter-node traffic keeps the port busy a share u of the task
  (u = its NIC-crossing communication seconds / the task's duration);
- while a DP bucket is in flight, each active flow gets half the port: the backward's bursts stretch
  to 2u of the time, the DP flow gets the whole port for 1 - 2u and half for 2u, i.e. rate 1 - u
  (the port's capacity minus the backward's bytes); for u >= 1/2 the backward is always active and
  DP gets 1/2. DP rate r = 1 - min(u, 1/2) until the stage's last backward ends, 1 after.
- a DP bucket whose time is d at the full port rate needs d of port-time at rate 1: it ends where the
  integral of the rate from its start reaches d.
Not modelled here: the backward's own traffic slowing in return while DP is active (it exposes more
of the backward where that traffic was not hidden), so the contended step is a lower bound.
Traffic that stays inside the scale-up domain never touches the NIC: r = 1, the step is unchanged.
"""

from __future__ import annotations

import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.block import block_ops
from comet.graph.ir import OpKind, StepGraph
from comet.hardware.network import members_in_domain
from comet.replay import cache
from comet.replay.cache import Signature
from comet.replay.kernels import HAVE_NUMBA
from comet.replay.tail_kernels import nic_rate, serial_shared_rows
from comet.replay.schedule import task_kinds
from comet.replay.timing import p2p_s


def crosses_nic(size: int, stride: int, cluster: ClusterSpec) -> bool:
    """A group of `size` ranks `stride` apart leaves the innermost (scale-up) domain."""
    if size <= 1 or len(cluster.network) < 2:
        return False
    # perf (i18s-step): the first level's count alone, not the span over every level
    return members_in_domain(size, stride, cluster.network[0].size) < size


def _p2p_crosses(distance: int, cluster: ClusterSpec) -> bool:
    inner = cluster.network[0].size
    return len(cluster.network) > 1 and inner > 0 and distance >= inner


_COMPUTE, _COLLECTIVE, _SEND, _RECV = OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV


def _block_nic_s(g, cluster: ClusterSpec, timed, crossing: dict | None = None) -> float:
    """Seconds one rank's NIC carries this block's communication (the busiest rank of the block).
    `crossing`: a memo of crosses_nic by (size, stride) shared between blocks, or None."""
    crossing = {} if crossing is None else crossing
    per_rank: dict[int, float] = {}
    # perf: the kind read directly, not through Op.is_comm (a property call per op): the seven cold-call
    # blocks 40 -> 30 us. perf (i18s-step): the compute ops (most of a block) dropped by one identity
    # test in a comprehension, the others told by identity, not looked up in a set (an Enum hashes in
    # Python: a call per op); crosses_nic memoized inline: 26 -> ~12 us
    for op in [op for op in block_ops(g) if op.kind is not _COMPUTE]:
        kind = op.kind
        if kind is not _COLLECTIVE and kind is not _SEND and kind is not _RECV:
            continue
        group = (op.group_size, op.group_stride)
        crosses = crossing.get(group)
        if crosses is None:
            # a block's collectives repeat a few (size, stride): placed once each
            crosses = crossing[group] = crosses_nic(op.group_size, op.group_stride, cluster)
        if op.collective is not None:
            # a collective leaving the domain is paced by its NIC hop (pipelined ring / tree)
            if crosses:
                per_rank[op.rank] = per_rank.get(op.rank, 0.0) + timed(op)
        elif _p2p_crosses(op.group_stride, cluster) or crosses:
            # a send to a peer in another domain, or a ring exchange (CP) whose ring spans domains: the
            # ranks at a domain's edge send through their NIC; the busiest rank is one of them
            nic_distance = max(op.group_stride, cluster.network[0].size)
            per_rank[op.rank] = per_rank.get(op.rank, 0.0) + p2p_s(op.msg_bytes, nic_distance, cluster)
    return max(per_rank.values(), default=0.0)


def nic_key(graph: StepGraph, kinds: tuple) -> Signature:
    """The graph's part of the backward NIC seconds' key (dp_nic_rate)."""
    return Signature((cache.object_key(graph.stages), cache.object_key(graph.blocks), cache.object_key(kinds),
                      graph.plan.p2p_bytes))


def dp_nic_rate(graph: StepGraph, cluster: ClusterSpec, b_dur: np.ndarray, timed, precision: str = "",
                groups=None, kinds: tuple | None = None, graph_key: Signature | None = None) -> np.ndarray | None:
    """Per stage, the share of the NIC left to its DP stream while its backward tasks run (see the
    module doc); None where no stage's DP stream and backward traffic meet on the NIC. `timed(op)`:
    the op's duration (replay.timing.timed_s on this cluster and precision); `b_dur[stage, chunk]`:
    backward task durations; `groups`: stages sharing one StageSync (tails.StageGroups), or None (each
    stage on its own); `kinds`: schedule.task_kinds(plan) when the caller has it, `graph_key`: its
    nic_key (step._GraphFacts keeps it per graph)."""
    plan = graph.plan
    kinds = kinds or task_kinds(plan)
    # perf: the backward's NIC seconds read the stage syncs (which buckets cross the NIC), the blocks and
    # the task kinds (their ops carry any measured duration), the pipeline message, the network and the
    # precision: a search evaluates one configuration on many clusters and many global batches, and
    # clusters that differ outside the network share them (read-only array)
    key = ("backward NIC seconds", graph_key or nic_key(graph, kinds), cache.network_key(cluster), precision)
    nic = cache.facts.get_or(key, lambda: _read_only(_backward_nic_s(graph, cluster, timed, precision, groups, kinds)))
    if nic is None:
        return None
    # perf: the rate reads the NIC seconds and the backward durations alone
    return cache.facts.get_or(("DP NIC rate", key, b_dur.tobytes()), lambda: _rate(nic, b_dur))


def _rate(nic: np.ndarray, b_dur: np.ndarray) -> np.ndarray | None:
    # perf (i22s-step): one chunk per stage: a row's sum is its one value (numpy's reduction starts from
    # the first element: the same bits), a view, not a reduction (~2 us of a cold call)
    busy = b_dur.reshape(len(b_dur)) if b_dur.shape[1] == 1 else b_dur.sum(axis=1)
    if HAVE_NUMBA:
        # perf (i18s-step): the share, its cap and the any() in one compiled pass (six numpy calls
        # before), the same arithmetic (tests/replay/test_stage_work.py)
        rate, shared = nic_rate(nic, busy)
        return _read_only(rate) if shared else None
    u = np.divide(nic, busy, out=np.zeros_like(nic), where=busy > 0)
    # perf: min(min(u, 1), 1/2) is min(u, 1/2) for every u >= 0, inf and NaN included: one numpy
    # call fewer
    rate = 1.0 - np.minimum(u, 0.5)
    return _read_only(rate) if (rate < 1.0).any() else None


def _read_only(a: np.ndarray | None) -> np.ndarray | None:
    if a is not None:
        a.flags.writeable = False
    return a


def _dp_crosses(st, cluster: ClusterSpec, placed: dict) -> bool:
    """A stage's DP gradient buckets leave the innermost domain. `placed`: a memo of crosses_nic by
    (size, stride), shared with _block_nic_s."""
    for bs in st.grad_buckets:
        group = (bs.op.group_size, bs.op.group_stride)
        crosses = placed.get(group)
        if crosses is None:
            crosses = placed[group] = crosses_nic(*group, cluster)
        if crosses:
            return True
    return False


def _backward_nic_s(graph: StepGraph, cluster: ClusterSpec, timed, precision: str,
                    groups, task_kinds_: tuple | None) -> np.ndarray | None:
    """Per stage whose DP stream crosses the NIC, the NIC seconds of all its backward tasks (one per
    chunk); None when no stage's does."""
    # perf (i18s-step): once per stage group; spread to the stages only where some group's DP stream
    # stays inside the domain (np.where(True, x, 0.0) is x)
    placed: dict = {}     # crosses_nic by (size, stride): the groups' buckets share a few DP groups
    crossing = [_dp_crosses(st, cluster, placed) for st in (graph.stages if groups is None else groups.syncs)]
    if not any(crossing):
        return None
    plan = graph.plan
    kinds, _, b_kind = task_kinds_ or task_kinds(plan)
    # NIC seconds read only communication: collective and send times (network-keyed, replay/timing.py) and
    # placement; clusters that differ in compute, memory or prices share them
    ckey = cache.network_key(cluster)

    def per_kind() -> np.ndarray:
        # perf: each distinct block walked once (kinds repeat them), sums in Python floats (the same
        # additions, in the same order, as numpy's element updates). perf (i18s-step): no entry per
        # block (a block's walk costs about its look-up; the kinds' entry below is what a search hits),
        # one crossing memo for all blocks, each send stride's seconds looked up once
        # perf (i18s-step): only the kinds a backward task runs (the forward kinds' blocks are never read).
        # perf (i23s-step): one pass over those kinds, each block's and each send stride's seconds
        # memoized on first use (three comprehensions and a generator before); each kind's additions in
        # the same order as before (its blocks, then its send): the same bits
        of_block: dict = {}
        send_s: dict = {}
        kind_nic = np.zeros(len(kinds))
        for k in dict.fromkeys(b_kind.ravel().tolist()):
            keys, stride = kinds[k]
            total = 0.0
            for key in keys:
                block_s = of_block.get(key)
                if block_s is None:
                    block_s = of_block[key] = _block_nic_s(graph.blocks[key], cluster, timed, placed)
                total += block_s
            if stride is not None:
                if stride not in send_s:
                    send_s[stride] = p2p_s(plan.p2p_bytes, stride, cluster) if _p2p_crosses(stride, cluster) else None
                if send_s[stride] is not None:
                    total += send_s[stride]
            kind_nic[k] = total
        return _read_only(kind_nic)     # shared: read-only from here on

    # perf: shared by the candidates that share the builder's blocks (cache.blocks) and plan shape
    kind_nic = cache.facts.get_or(("NIC per task kind", cache.object_key(graph.blocks), cache.object_key(kinds), ckey,
                                   precision, plan.p2p_bytes), per_kind)
    # perf (i20s-step): one chunk per stage (vpp 1): each stage's sum is its one kind's value
    nic = kind_nic[b_kind[:, 0]] if b_kind.shape[1] == 1 else kind_nic[b_kind].sum(axis=1)
    if all(crossing):
        return nic
    mask = np.array(crossing, dtype=bool)
    return np.where(mask if groups is None else mask[groups.index], nic, 0.0)


def serial_shared(ready: np.ndarray, dur: np.ndarray, t0: np.ndarray, window_end: np.ndarray,
                  rate: np.ndarray) -> np.ndarray:
    """End times of transfers run one after another on one stream (rows: stages), each no earlier than
    its ready time, at `rate` of the port before `window_end` and the full port after."""
    if HAVE_NUMBA:
        # perf: rows x buckets in compiled code (the numpy loop below costs ~5 us a bucket); per-row
        # arguments of length 1 and a 1-D dur (one per column) broadcast inside the kernel
        row = lambda a: np.ascontiguousarray(np.atleast_1d(a), dtype=float)   # noqa: E731
        return serial_shared_rows(np.ascontiguousarray(ready, float), np.ascontiguousarray(
            np.atleast_2d(dur), float), row(t0), row(window_end), row(rate))
    t0 = np.broadcast_to(np.asarray(t0, dtype=float), ready.shape[:1])
    ends = np.empty_like(ready, dtype=float)
    prev = t0.copy()
    for k in range(ready.shape[1]):
        start = np.maximum(ready[:, k], prev)
        shared = np.maximum(window_end - start, 0.0)          # time left in the contended window
        done_in_window = shared * rate
        need = dur[k] if np.ndim(dur) == 1 else dur[:, k]
        end = np.where(need <= done_in_window, start + need / rate, start + shared + (need - done_in_window))
        ends[:, k] = end
        prev = end
    return ends


__all__ = ["crosses_nic", "dp_nic_rate", "serial_shared"]
