"""Replay each block of a StepGraph once on the cluster model; its time and where the time went are
reused for every occurrence (identical layers, identical micro-batches)."""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.ir import OpKind
from comet.replay import block_kernel, cache
from comet.replay.compile import compile_graph
from comet.replay.engine import Replay, replay, replay_graph
from comet.replay.timing import op_time_s, timed_s

_NETWORK_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)   # timed by comet/hardware/network.py

# Exposed communication is charged to the first active category in this order.
_COMM_ORDER = block_kernel.COMM_ORDER


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


def time_block(g: nx.DiGraph, cluster: ClusterSpec, precision: str, keep_replay: bool = False) -> BlockTiming:
    if len(g) == 0:
        return _EMPTY if cache.enabled else BlockTiming(0.0, {"compute": 0.0})
    if cache.enabled and not keep_replay:
        return _time_block_shared(g, cluster, precision)
    # perf: a materialized or measured block has every duration already; the cost model runs only for the rest
    durations = {nid: timed_s(op, cluster, precision) for nid, op in g.nodes(data="op")}
    rep = replay_graph(g, durations, overlap_slowdown=cluster.efficiency.overlap_slowdown)
    return BlockTiming(rep.makespan, exposure_parts(rep), rep if keep_replay else None)


def _time_block_shared(g: nx.DiGraph, cluster: ClusterSpec, precision: str) -> BlockTiming:
    """time_block through the content-keyed caches (comet/replay/cache.py): op durations once per
    (block, what the cost models read of the cluster, precision), the event replay once per (block,
    durations)."""
    # perf: look-ups, then one computation and one insert per miss, no closures; the durations are a
    # cache.Signature (hash computed once), so the replay key hashes three cached hashes, not 55 floats
    sig = cache.block_signature(g)
    key = (sig, cache.timing_key(cluster), precision)
    dur = cache.durations.get(key)
    if dur is None:
        dur = cache.Signature(_durations(sig, cluster, precision))
        cache.durations.add(key, dur)
    key = (sig, dur, cluster.efficiency.overlap_slowdown)
    timing = cache.replays.get(key)
    if timing is None:   # shared between candidates: read-only from here on
        timing = _replayed(g, sig, dur.value, key[2])
        cache.replays.add(key, timing)
    return timing


def _durations(sig, cluster: ClusterSpec, precision: str) -> tuple:
    """Every op's duration in node order. Kernel and copy times read only the GPU side of the cluster:
    clusters that differ in the network share them (None in that entry where an op is a transfer
    timed by the network-keyed cache, replay/timing.py)."""
    ops = sig.ops
    key = (sig, "on GPU", cache.compute_key(cluster), precision)
    local = cache.durations.get(key)
    if local is not None:
        return tuple([float(timed_s(op, cluster, precision)) if d is None else d for d, op in zip(local, ops)])
    # perf: one pass computes both entries on a miss; timed_s written out (one call less an op)
    local, every = [], []
    for op in ops:
        measured = op.duration_s
        d = float(op_time_s(op, cluster, precision) if measured is None else measured)
        every.append(d)
        local.append(None if measured is None and op.kind in _NETWORK_KINDS else d)
    cache.durations.add(key, tuple(local))
    return tuple(every)


def _replayed(g: nx.DiGraph, sig, dur: tuple, slowdown: float) -> BlockTiming:
    """The block's duration and exposure parts: the compiled engine (block_kernel.py) where numba is
    installed, equal bit for bit to the Python engine and exposure_parts (tested), else those."""
    if not block_kernel.HAVE_NUMBA:
        rep = replay(cache.compiled.get_or(sig, lambda: compile_graph(g)), list(dur), overlap_slowdown=slowdown)
        return BlockTiming(rep.makespan, exposure_parts(rep))
    key = (sig, "packed")
    packed = cache.compiled.get(key)
    if packed is None:
        packed = block_kernel.pack_graph(g)
        cache.compiled.add(key, packed)
    structure, delay = packed
    done, makespan, *parts = block_kernel.replay_summary(structure, delay, np.array(dur, dtype=np.float64),
                                                         slowdown).tolist()
    if done != len(dur):   # a deadlock: the Python engine names the ops that never ran
        replay(compile_graph(g), list(dur), overlap_slowdown=slowdown)
    return BlockTiming(makespan, dict(zip(block_kernel.PARTS, parts)))
