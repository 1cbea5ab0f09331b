"""Replay each block of a StepGraph once on the cluster model; its time and where the time went are
reused for every occurrence (identical layers, identical micro-batches)."""

from __future__ import annotations

import math
from itertools import chain
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.block import block_lists, block_table
from comet.graph.ir import OpKind
from comet.graph.op_table import TableWriter, tables_of
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


def time_block(g: nx.DiGraph, cluster: ClusterSpec, precision: str, keep_replay: bool = False) -> BlockTiming:
    if len(g) == 0:
        return _EMPTY if cache.enabled else BlockTiming(0.0, {"compute": 0.0})
    if cache.enabled and not keep_replay:
        return _time_shared([g], _Context(cluster, precision))[0]
    # perf: a materialized or measured block has every duration already; the cost model runs only for the rest
    durations = {nid: timed_s(op, cluster, precision) for nid, op in g.nodes(data="op")}
    rep = replay_graph(g, durations, overlap_slowdown=cluster.efficiency.overlap_slowdown)
    return BlockTiming(rep.makespan, exposure_parts(rep), rep if keep_replay else None)


def time_blocks(blocks: dict, cluster: ClusterSpec, precision: str, keep_replays: bool = False) -> dict:
    """{name: time_block(g, cluster, precision, keep_replays)} for a graph's blocks.
    perf: the blocks are timed together (_time_shared): the cluster's cache keys and compute constants
    read once, and the compiled cost model and replay called once for all the blocks that miss."""
    if not cache.enabled or keep_replays:
        return {name: time_block(g, cluster, precision, keep_replays) for name, g in blocks.items()}
    shown = [g for g in blocks.values() if len(g)]
    timed = iter(_time_shared(shown, _Context(cluster, precision)) if shown else ())
    return {name: next(timed) if len(g) else _EMPTY for name, g in blocks.items()}


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


def _time_shared(graphs: list, context: _Context) -> list:
    """time_block of each (non-empty) block through the content-keyed caches (comet/replay/cache.py): op
    durations once per (block, what the cost models read of the cluster, precision), the event replay
    once per (block, durations). The blocks that miss are computed together: one compiled cost-model
    call and one compiled replay for all of them (perf: a cold call times six blocks; each compiled call
    costs a dispatch and a returned array, ~1.5-3 us hot and more on a cold call's CPU caches)."""
    # perf: look-ups, then one computation and one insert per miss, no closures; the durations are a
    # cache.Signature (hash computed once), so the replay key hashes three cached hashes, not 55 floats
    timing, precision, slowdown = context.timing, context.precision, context.slowdown
    sigs = [cache.block_signature(g) for g in graphs]
    durs = [cache.durations.get((sig, timing, precision)) for sig in sigs]
    tables: dict = {}     # signature -> its _OpTable, where this call needed it
    joint = None          # (the signatures, their tables and durations laid end to end) where computed so
    fresh: set = set()    # the signatures whose table was made here: not replayed before (perf: no look-up)
    missing = _distinct_misses(sigs, durs)
    if missing:
        made, joined, fresh = _tables([(graphs[i], sigs[i]) for i in missing])
        batch = [(graphs[i], sigs[i], table) for i, table in zip(missing, made)]
        computed = {}
        new, arrays = _durations(batch, context, joined)
        for (_, sig, table), dur in zip(batch, new):
            cache.durations.add((sig, timing, precision), dur)
            computed[sig] = dur
            tables[sig] = table
        durs = [computed[sig] if dur is None else dur for sig, dur in zip(sigs, durs)]
        if arrays is not None:
            joint = ([sig for _, sig, _ in batch], *arrays)
    timings = [None if id(sig) in fresh else cache.replays.get((sig, dur, slowdown)) for sig, dur in zip(sigs, durs)]
    missing = _distinct_misses(sigs, timings)
    if missing:
        batch = [(graphs[i], sigs[i], durs[i], tables.get(sigs[i]) or _table(graphs[i], sigs[i])) for i in missing]
        if joint is not None and joint[0] != [sig for _, sig, _, _ in batch]:
            joint = None
        computed = {}
        for (_, sig, dur, _), timed in zip(batch, _replayed(batch, slowdown, joint)):
            cache.replays.add((sig, dur, slowdown), timed)   # shared between candidates: read-only from here on
            computed[sig] = timed
        timings = [computed[sig] if timed is None else timed for sig, timed in zip(sigs, timings)]
    return timings


def _distinct_misses(sigs: list, values: list) -> list:
    """The positions of the None values, the first of each signature (equal blocks, interned to one
    signature object, are computed once and share the value)."""
    missing = [i for i, value in enumerate(values) if value is None]
    if len({id(sigs[i]) for i in missing}) < len(missing):
        first: dict = {}
        missing = sorted(set(first.setdefault(id(sigs[i]), i) for i in missing))
    return missing


def _table(g, sig) -> "_OpTable":
    """The block's _OpTable, cached once per content."""
    return _tables([(g, sig)])[0][0]


def _tables(blocks: list) -> tuple[list, np.ndarray | None, set]:
    """The _OpTable of each (block, signature), cached once per content; their arrays laid end to end
    where every one was made here (they are views of it: graph/op_table.tables_of converts the new ones
    in one call); the ids of the signatures whose table was made here."""
    tables, new, fresh = [], [], set()
    for g, sig in blocks:
        key = (sig, "table")
        table = cache.compiled.get(key)
        if table is None:
            table = _OpTable(g, sig.ops)
            cache.compiled.add(key, table)
            new.append(table)
            fresh.add(id(sig))
        tables.append(table)
    if not new or not compute_costs.HAVE_NUMBA:
        return tables, None, fresh
    joined, starts = tables_of([table.source for table in new])
    ends = starts[1:] + [len(joined)]
    for table, start, end in zip(new, starts, ends):
        table.array = joined[start:end]
        table.source = None
    return tables, joined if len(new) == len(tables) else None, fresh


def _durations(batch: list, context: _Context, joined: np.ndarray | None = None) -> tuple:
    """Every op's duration in node order (a cache.Signature of the tuple) of each (block, signature,
    _OpTable) of `batch` (`joined`: their tables' arrays laid end to end, where at hand); and, where the compiled model timed every block of the batch in one call,
    (their tables, their durations) as arrays laid end to end, which the replay reads. Kernel and copy
    times read only the GPU side of the cluster: clusters that differ in the network share them (kept
    with the block's table; NaN there where an op is a transfer timed by the network-keyed cache,
    replay/timing.py)."""
    key = (context.compute, context.precision)
    local = [table.gpu_times.get(key) for _, _, table in batch]
    todo = [k for k, times in enumerate(local) if times is None]
    arrays = None
    if todo:
        computed, arrays = _on_gpu([batch[k] for k in todo], context, joined if len(todo) == len(batch) else None)
        for k, times in zip(todo, computed):
            local[k] = times
            batch[k][2].keep_gpu_times(key, times)
        if len(todo) < len(batch):
            arrays = None
    # perf: each distinct transfer of a block is timed once (a GPT layer's backward repeats its TP
    # collectives), the others copy its seconds
    network, cluster = context.network, context.cluster
    out, first = [], 0
    for (_, _, table), times in zip(batch, local):
        every = list(times)
        for head, cost, where in table.transfers:
            d = float(transfer_s(head, cost, network, cluster))
            for i in where:
                every[i] = d
                if arrays is not None:
                    arrays[1][first + i] = d
        out.append(cache.Signature(tuple(every)))
        first += table.n_ops
    return out, arrays


def _on_gpu(batch: list, context: _Context, joined: np.ndarray | None = None) -> tuple:
    """The durations (a tuple each) of the ops the GPU side of the cluster times, NaN for the network's
    transfers, of each (block, signature, _OpTable) of `batch`: the compute kernels in one compiled call
    for all the tables (replay/compute_costs.py, equal bit for bit to hardware/compute.py), the rest
    (measured, copies, what the compiled model leaves out) by timed_s; and (the tables, the durations)
    as arrays laid end to end (the transfers' entries to be filled), where the compiled model ran."""
    cluster, precision = context.cluster, context.precision
    tables = [table for _, _, table in batch]
    if any(table.array is None for table in tables):    # without numba
        lefts, arrays = [(table.on_gpu(), [math.nan] * table.n_ops) for table in tables], None
    else:
        if joined is None:
            joined = _joined([table.array for table in tables])
        out = compute_costs.kernel_times(joined, context.constants())
        times = out.tolist()
        # perf: the rows the compiled model leaves out are known per block (none in a GPT layer); a
        # row it could not time (a size out of int64's reach, a constant the Python model rejects)
        # is rare: then every NaN that is not a transfer
        missed = times.pop()
        lefts, first = [], 0
        for table in tables:
            mine = times[first:first + table.n_ops]
            first += table.n_ops
            lefts.append((table.left_out if not missed else [i for i in table.on_gpu() if mine[i] != mine[i]], mine))
        arrays = (joined, out[:first])
    result, first = [], 0
    for (left, times), (_, sig, table) in zip(lefts, batch):
        ops = sig.ops
        for i in left:
            times[i] = d = float(timed_s(ops[i], cluster, precision))
            if arrays is not None:
                arrays[1][first + i] = d
        result.append(tuple(times))
        first += table.n_ops
    return result, arrays


_GPU_TIMES_KEPT = 8


def _joined(arrays: list) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class _OpTable:
    """What the duration and replay passes read of a block, built once per block content: its table
    (graph/op_table.py: as the builder wrote it, or derived from the ops) as an array, the ops the
    compiled cost model leaves out, the transfers: (head, cost, node ids) per distinct network
    cost-model call (timing.transfer_call), and, for a block the compiled replay cannot pack from its
    table, the packed structure once replayed. `with_edges`: built from a Block's lists, so the table
    holds the edges the packing reads (a materialized graph of the same content has the same signature)."""
    __slots__ = ("array", "source", "transfers", "left_out", "n_ops", "with_edges", "packed", "gpu_times")

    def __init__(self, g, ops: list):
        writer = block_table(g)
        if writer is None:
            writer = TableWriter.of(ops)
        lists = block_lists(g)
        self.with_edges = lists is not None
        self.packed = None     # block_pack's (structure, delays), where the table cannot be replayed
        self.gpu_times: dict = {}   # (cache.compute_key, precision) -> the ops' durations on the GPU side
        # the array: converted by _tables, with the other new blocks' (None without numba)
        self.array, self.source = None, (writer, lists[1] if lists is not None else ())
        self.n_ops = len(ops)
        self.left_out = writer.left_out      # timed by timed_s (the writer is not written to again)
        # perf: the writer noted its transfers' node ids: no pass over every op (~4 us a GPT layer)
        same: dict = {}
        for i in writer.transfers:    # (a collective, send or recv without a measured duration)
            head, cost = transfer_call(ops[i])
            entry = same.get(head)
            if entry is None:
                entry = same[head] = (head, cost, [])
            entry[2].append(i)
        self.transfers = tuple(same.values())

    def keep_gpu_times(self, key: tuple, times: tuple) -> None:
        """Keep the durations the GPU side of a cluster gives the ops (NaN for the transfers), for clusters
        that differ only in their network. perf: with the table, not an entry of their own in
        cache.durations (a look-up and an insert a block fewer on first sight); bounded, as the table's
        cache entry is: a few compute models a table."""
        if len(self.gpu_times) >= _GPU_TIMES_KEPT:
            self.gpu_times.clear()
        self.gpu_times[key] = times

    def on_gpu(self) -> list:
        """The node ids of every op but the transfers (the GPU side of the cluster times them)."""
        transfers = {i for _, _, where in self.transfers for i in where}
        return [i for i in range(self.n_ops) if i not in transfers]


def _replayed(batch: list, slowdown: float, joint: tuple | None = None) -> list:
    """The BlockTiming (duration and exposure parts) of each (block, signature, durations, _OpTable) of
    `batch` (`joint`: (signatures, tables, durations) laid end to end, where _durations made them for
    these blocks in this order):
    the compiled engine (block_kernel.py) where numba is installed, equal bit for bit to the Python
    engine and exposure_parts (tested), else those. The blocks built with their tables are packed
    from them and replayed in one compiled call (block_kernel.replay_tables); the others are packed
    from their ops once (the structure kept with the table)."""
    if not block_kernel.HAVE_NUMBA:
        return [_python_replayed(g, sig, dur.value, slowdown) for g, sig, dur, _ in batch]
    out: list = [None] * len(batch)
    fused = [k for k, (_, _, _, table) in enumerate(batch) if table.with_edges]
    if fused:
        if joint is not None and len(fused) == len(batch):
            _, tables, dur = joint
        else:
            tables = _joined([batch[k][3].array for k in fused])
            dur = np.fromiter(chain.from_iterable(batch[k][2].value for k in fused), dtype=np.float64)
        for k, row in zip(fused, block_kernel.replay_tables(tables, dur, slowdown).tolist()):
            if row[0] >= 0:
                out[k] = _timing_of(row, batch[k][0], batch[k][2], slowdown)
    for k, timed in enumerate(out):
        if timed is None:
            g, sig, dur, table = batch[k]
            if table.packed is None:
                table.packed = pack_graph(g)
            row = block_kernel.replay_summary(*table.packed, np.array(dur.value, dtype=np.float64), slowdown)
            out[k] = _timing_of(row.tolist(), g, dur, slowdown)
    return out


def _timing_of(summary: list, g, dur, slowdown: float) -> BlockTiming:
    """A BlockTiming from a compiled replay's [ops done, makespan, parts in PARTS order]."""
    done, makespan, *parts = summary
    if done != len(dur.value):   # a deadlock: the Python engine names the ops that never ran
        replay(compile_graph(g), list(dur.value), overlap_slowdown=slowdown)
    return BlockTiming(makespan, dict(zip(PARTS, parts)))


def _python_replayed(g, sig, dur: tuple, slowdown: float) -> BlockTiming:
    rep = replay(cache.compiled.get_or(sig, lambda: compile_graph(g)), list(dur), overlap_slowdown=slowdown)
    return BlockTiming(rep.makespan, exposure_parts(rep))
