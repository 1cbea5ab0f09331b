"""Replay each block of a StepGraph once on the cluster model; its time and where the time went are
reused for every occurrence (identical layers, identical micro-batches)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.block import block_lists, block_table
from comet.graph.ir import OpKind
from comet.graph.op_table import TableWriter
from comet.replay import block_kernel, cache, compute_costs
from comet.replay.block_exposure import COMM_ORDER, PARTS
from comet.replay.block_pack import pack_graph
from comet.replay.compile import compile_graph
from comet.replay.engine import Replay, replay, replay_graph
from comet.replay.timing import timed_s, transfer_call, transfer_s

# Exposed communication is charged to the first active category in this order.
_COMM_ORDER = COMM_ORDER


@dataclass
class BlockTiming:
    duration_s: float
    parts: dict[str, float]                       # compute, exposed_tp, ..., offload: sum = duration_s
    replay: Replay | None = field(default=None, repr=False)


def _measure(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _subtract(intervals, cover) -> list[tuple[float, float]]:
    """Parts of `intervals` (merged) not covered by `cover` (merged)."""
    out = []
    for a, b in intervals:
        cur = a
        for c, d in cover:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def _length(intervals) -> float:
    total = 0.0
    for a, b in intervals:    # left to right on every Python (3.12's sum() compensates), as the kernel adds
        total += b - a
    return total


def exposure_parts(rep: Replay) -> dict[str, float]:
    """Split a block's makespan: compute busy time, then communication not hidden behind compute
    (charged by _COMM_ORDER), then expansion-tier traffic not hidden by either."""
    ops = rep.compiled.ops
    # perf: one pass sorts every op's span into its category (compute, comm by group kind, offload)
    compute, memcpy, comm = [], [], {}
    for op, a, b in zip(ops, rep.start, rep.end):
        if op.kind is OpKind.COMPUTE:
            compute.append((a, b))
        elif op.kind is OpKind.MEMCPY:
            memcpy.append((a, b))
        elif op.is_comm:
            comm.setdefault(op.group_kind, []).append((a, b))
    covered = _measure(compute)
    parts = {"compute": _length(covered)}
    for key, kind in _COMM_ORDER:
        mine = _measure(comm.get(kind, []))
        exposed = _subtract(mine, covered)
        parts[key] = parts.get(key, 0.0) + _length(exposed)
        covered = _measure(covered + exposed)
    offload = _measure(memcpy)
    parts["offload"] = _length(_subtract(offload, covered))
    covered = _measure(covered + offload)
    parts["compute"] += max(0.0, rep.makespan - _length(covered))   # idle inside a block: kernel gaps
    return parts


# perf: one object for every empty block (read-only, like the cached ones), so caches keyed by the
# identities of a task's BlockTimings (step._blocks_parts, step._task_parts) hit across candidates
_EMPTY = BlockTiming(0.0, {"compute": 0.0})


def time_block(g: nx.DiGraph, cluster: ClusterSpec, precision: str, keep_replay: bool = False,
               context: "_Context | None" = None) -> BlockTiming:
    """`context`: what the shared path reads of (cluster, precision), where the caller times several
    blocks (time_blocks)."""
    if len(g) == 0:
        return _EMPTY if cache.enabled else BlockTiming(0.0, {"compute": 0.0})
    if cache.enabled and not keep_replay:
        return _time_block_shared(g, context or _Context(cluster, precision))
    # perf: a materialized or measured block has every duration already; the cost model runs only for the rest
    durations = {nid: timed_s(op, cluster, precision) for nid, op in g.nodes(data="op")}
    rep = replay_graph(g, durations, overlap_slowdown=cluster.efficiency.overlap_slowdown)
    return BlockTiming(rep.makespan, exposure_parts(rep), rep if keep_replay else None)


def time_blocks(blocks: dict, cluster: ClusterSpec, precision: str, keep_replays: bool = False) -> dict:
    """{name: time_block(g, cluster, precision, keep_replays)} for a graph's blocks.
    perf: the cluster's cache keys and compute constants are read once for all the blocks (a cold
    call times six; each read ~0.5-1 us)."""
    context = _Context(cluster, precision) if cache.enabled and not keep_replays else None
    return {name: time_block(g, cluster, precision, keep_replays, context) for name, g in blocks.items()}


class _Context:
    """What the shared path reads of (cluster, precision): the cluster's cache keys (cache.timing_key
    and its parts), the overlap slowdown, and the compiled compute model's constants (on first use)."""
    __slots__ = ("cluster", "precision", "timing", "compute", "network", "slowdown", "_constants")

    def __init__(self, cluster: ClusterSpec, precision: str):
        self.cluster, self.precision = cluster, precision
        self.timing = cache.timing_key(cluster)
        self.compute, self.network = self.timing     # (compute_key, network_key)
        self.slowdown = cluster.efficiency.overlap_slowdown
        self._constants = None

    def constants(self) -> np.ndarray:
        """compute_costs.constants, once per (what the compute models read of the cluster, precision)."""
        if self._constants is None:
            self._constants = cache.facts.get_or(("compute constants", self.compute, self.precision),
                                                 lambda: compute_costs.constants(self.cluster, self.precision))
        return self._constants


def _time_block_shared(g: nx.DiGraph, context: _Context) -> BlockTiming:
    """time_block through the content-keyed caches (comet/replay/cache.py): op durations once per
    (block, what the cost models read of the cluster, precision), the event replay once per (block,
    durations)."""
    # perf: look-ups, then one computation and one insert per miss, no closures; the durations are a
    # cache.Signature (hash computed once), so the replay key hashes three cached hashes, not 55 floats
    sig = cache.block_signature(g)
    key = (sig, context.timing, context.precision)
    dur = cache.durations.get(key)
    table = array = None
    if dur is None:
        table = _table(g, sig)
        every, array = _durations(table, sig, context)
        dur = cache.Signature(every)
        cache.durations.add(key, dur)
    key = (sig, dur, context.slowdown)
    timing = cache.replays.get(key)
    if timing is None:   # shared between candidates: read-only from here on
        timing = _replayed(g, sig, dur.value, key[2], table, array)
        cache.replays.add(key, timing)
    return timing


def _durations(table: "_OpTable", sig, context: _Context) -> tuple:
    """Every op's duration in node order, as a tuple and (where the compiled model ran) an array.
    Kernel and copy times read only the GPU side of the cluster: clusters that differ in the network
    share them (NaN in that entry where an op is a transfer timed by the network-keyed cache,
    replay/timing.py)."""
    key = (sig, "on GPU", context.compute, context.precision)
    local = cache.durations.get(key)
    array = None
    if local is None:
        local, array = _on_gpu(table, sig.ops, context)
        cache.durations.add(key, local)
    # perf: each distinct transfer of the block is timed once (a GPT layer's backward repeats its
    # TP collectives), the others copy its seconds
    every = list(local)
    network, cluster = context.network, context.cluster
    for head, cost, where in table.transfers:
        d = float(transfer_s(head, cost, network, cluster))
        for i in where:
            every[i] = d
            if array is not None:
                array[i] = d
    return tuple(every), array


def _on_gpu(table: "_OpTable", ops: list, context: _Context) -> tuple:
    """The durations of the ops the GPU side of the cluster times (NaN for the network's transfers),
    and an array of them (the transfers' entries to be filled): the compute kernels in one compiled
    call (replay/compute_costs.py, equal bit for bit to hardware/compute.py), the rest (measured,
    copies, what the compiled model leaves out) by timed_s."""
    if table.array is None:    # without numba
        times, left, array = [math.nan] * len(ops), table.on_gpu(), None
    else:
        out = compute_costs.kernel_times(table.array, context.constants())
        times = out.tolist()
        # perf: the rows the compiled model leaves out are known per block (none in a GPT layer); a
        # row it could not time (a size out of int64's reach, a constant the Python model rejects)
        # is rare: then every NaN that is not a transfer
        left = table.left_out if not times.pop() else [i for i in table.on_gpu() if times[i] != times[i]]
        array = out[:len(ops)]
    cluster, precision = context.cluster, context.precision
    for i in left:
        d = times[i] = float(timed_s(ops[i], cluster, precision))
        if array is not None:
            array[i] = d
    return tuple(times), array


class _OpTable:
    """What the duration and packing passes read of a block, built once per block content: its table
    (graph/op_table.py: as the builder wrote it, or derived from the ops) as an array, the ops the
    compiled cost model leaves out, the transfers: (head, cost, node ids) per distinct network
    cost-model call (timing.transfer_call), and the packed structure once replayed. `with_edges`: built
    from a Block's lists, so the table holds the edges the packing reads (a materialized graph of the
    same content has the same signature)."""
    __slots__ = ("array", "transfers", "left_out", "n_ops", "with_edges", "packed")

    def __init__(self, g, ops: list):
        writer = block_table(g)
        if writer is None:
            writer = TableWriter.of(ops)
        lists = block_lists(g)
        self.with_edges = lists is not None
        self.packed = None     # block_pack's (structure, delays), set by the block's first replay
        self.array = writer.array_of_edges(lists[1] if lists is not None else ()) if compute_costs.HAVE_NUMBA \
            else None
        self.n_ops = len(ops)
        self.left_out = writer.left_out      # timed by timed_s (the writer is not written to again)
        # perf: the writer noted its transfers' node ids: no pass over every op (~4 us a GPT layer)
        same: dict = {}
        for i in writer.transfers:    # (a collective, send or recv without a measured duration)
            head, cost = transfer_call(ops[i])
            same.setdefault(head, (head, cost, []))[2].append(i)
        self.transfers = tuple(same.values())

    def on_gpu(self) -> list:
        """The node ids of every op but the transfers (the GPU side of the cluster times them)."""
        transfers = {i for _, _, where in self.transfers for i in where}
        return [i for i in range(self.n_ops) if i not in transfers]


def _table(g, sig) -> _OpTable:
    key = (sig, "table")
    table = cache.compiled.get(key)
    if table is None:
        table = _OpTable(g, sig.ops)
        cache.compiled.add(key, table)
    return table


def _replayed(g: nx.DiGraph, sig, dur: tuple, slowdown: float, table: "_OpTable | None" = None,
              array: np.ndarray | None = None) -> BlockTiming:
    """The block's duration and exposure parts: the compiled engine (block_kernel.py) where numba is
    installed, equal bit for bit to the Python engine and exposure_parts (tested), else those.
    `table`: the block's _OpTable where the caller has it; `array`: `dur` as an array, where
    _durations made one."""
    if not block_kernel.HAVE_NUMBA:
        rep = replay(cache.compiled.get_or(sig, lambda: compile_graph(g)), list(dur), overlap_slowdown=slowdown)
        return BlockTiming(rep.makespan, exposure_parts(rep))
    if table is None:
        table = _table(g, sig)
    if array is None:
        array = np.array(dur, dtype=np.float64)
    packed, summary = table.packed, None
    if packed is None:
        # perf: a built block is packed from its table and replayed in one compiled call on its first
        # replay (block_kernel.pack_and_replay); the packed structure is kept with the table, which the
        # cache holds once per content (one entry and one dispatch a block fewer than packing apart)
        fused = block_kernel.pack_and_replay(table.array, array, slowdown) if table.with_edges else None
        if fused is None:
            packed = pack_graph(g)
        else:
            packed, summary = fused
        table.packed = packed
    if summary is None:
        summary = block_kernel.replay_summary(*packed, array, slowdown)
    done, makespan, *parts = summary.tolist()
    if done != len(dur):   # a deadlock: the Python engine names the ops that never ran
        replay(compile_graph(g), list(dur), overlap_slowdown=slowdown)
    return BlockTiming(makespan, dict(zip(PARTS, parts)))
