"""Each pipeline stage's tail, after its last task: the once-per-step stage work of a step replay
(step.replay_step). Stages that share one StageSync, role and layer counts form a group (StageGroups):
what the network or the blocks give a group (the parameter gathers at the start of the step, the first
gradient bucket's and the tied-embedding all-reduce's seconds, the optimizer's, the buckets' readiness)
is computed once per group and spread to its stages. Then each stage's DP stream of gradient buckets on
the NIC port it shares with the backward's traffic (contention.py), the tied-embedding all-reduce
between the first and last stage, the optimizer and any parameter gathers after it: in one compiled
pass (tail_kernels.stage_tails) where each stage's buckets are one chunk's, else as rows of numpy
array computations per group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import is_

import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.ir import Collective, OpKind, StepGraph
from comet.hardware.network import collective_time_s
from comet.replay import cache
from comet.replay.contention import serial_shared
from comet.replay.kernels import HAVE_NUMBA
from comet.replay.cache import Signature
from comet.replay.pipeline import PipelineSummary
from comet.replay.tail_kernels import shared_bucket_stream, sorted_bucket_stream_end, stage_tails


class StageGroups:
    """Stages that share one StageSync object, role (first, last) and layer counts (_stage_groups): a
    group's stages are rows of one array computation. `rows[g]`: the group's stages (an index array,
    increasing), `first[g]`: its first stage, `syncs[g]`: their StageSync; `index[s]`: stage s's group
    (perf: a table with one row per group becomes the per-stage array in one take)."""
    __slots__ = ("embedding", "first", "index", "rows", "syncs")

    def __init__(self, rows: list, first: list, syncs: list, index: np.ndarray, embedding: tuple):
        self.rows, self.first, self.syncs, self.index = rows, first, syncs, index
        self.embedding = embedding   # the stages with a tied-embedding sync, in increasing order


def _stage_groups(graph: StepGraph) -> StageGroups:
    """The stage groups of a graph, in order of their first stage. A stage's role: its StageSync object,
    whether it is the first or the last stage, the layers of its chunks (c * pp + s, c < vpp)."""
    plan = graph.plan
    pp, layers, stages = plan.pp, plan.chunk_layers, graph.stages
    per_stage = layers if plan.vpp == 1 else list(zip(*(layers[c * pp:(c + 1) * pp] for c in range(plan.vpp))))
    # perf: stages alike come in runs (the middle stages): one dict update per run, not per stage; the
    # groups, their order and their stages are the per-stage loop's (tests/replay/test_stage_work.py).
    # perf (i18s-step): runs found by comparing each stage with its run's first, no role tuple per stage;
    # a group's stages an arange where they are one run: pp 64, 18.6 -> 9.3 us
    # perf (i20s-step): a run's ends found in one comprehension over neighbours (alike is transitive:
    # alike to the previous stage is alike to the run's first), a run broken after the first stage and
    # before the last; pp 64: ~30% less
    # perf (i22s-step): the middle stages one run (the builder's shared middle StageSync, even layers) told
    # by two C-level comparisons of neighbour slices, no per-stage step: the same ends
    middle, middle_layers = stages[1:pp - 1], per_stage[1:pp - 1]
    if all(map(is_, middle[1:], middle)) and middle_layers[1:] == middle_layers[:-1]:
        ends = []
    else:
        ends = [s for s in range(2, pp - 1) if stages[s] is not stages[s - 1] or per_stage[s] != per_stage[s - 1]]
    ends = ([1] if pp > 1 else []) + ends + ([pp - 1] if pp > 2 else []) + [pp]
    group_of: dict = {}
    runs, run_group, run_length = [], [], []
    start = 0
    for s in ends:
        g = group_of.setdefault((id(stages[start]), start == 0, s == pp, per_stage[start]), len(runs))
        if g == len(runs):
            runs.append([])
        runs[g].append(range(start, s))
        run_group.append(g)
        run_length.append(s - start)
        start = s
    # perf (i20s-step): a one-run group's stages a view of one arange (an arange per group and a repeat
    # before: numpy calls cost ~2 us each cold). perf (i22s-step): the stage -> group index filled run by
    # run (a few slice stores, not a list of pp numbers converted), the embedding stages read from the
    # runs' ranges (not from each group's array through tolist)
    ar = np.arange(pp)
    rows = [ar[r[0].start:r[0].stop] if len(r) == 1 else np.array([s for run in r for s in run]) for r in runs]
    first = [r[0].start for r in runs]
    syncs = [stages[f] for f in first]
    index = np.empty(pp, dtype=np.int64)
    start = 0
    for g, n in zip(run_group, run_length):
        index[start:start + n] = g
        start += n
    embedding = tuple(sorted([s for r, st in zip(runs, syncs) if st.embedding_sync is not None for run in r for s in run]))
    return StageGroups(rows, first, syncs, index, embedding)


def _stage_groups_shared(graph: StepGraph) -> StageGroups:
    plan = graph.plan
    return cache.facts.get_or(("stage groups", cache.object_key(graph.stages), plan.pp, plan.vpp, plan.chunk_layers),
                              lambda: _stage_groups(graph))


def _sync_times(graph: StepGraph, groups: StageGroups, t, cluster: ClusterSpec, events: list | None = None) -> tuple:
    """What the step's once-per-step collectives give each stage group, in one pass over the groups:
    (release of each (stage, chunk)'s first forward, end of each stage's parameter gathers at the start
    of the step, each group's first gradient bucket's seconds (0: none), each tied-embedding
    all-reduce's seconds (stages in increasing order)). Parameter all-gathers issued at the start of
    the step overlap the first forwards: each chunk's first forward waits for the buckets holding its
    first layer. `events`: per stage, the gathers' (name, start, end) appended (the timeline's), or
    None. perf (i20s-step): one pass (two before), and the collectives timed by _collective_op_s."""
    plan = graph.plan
    pp, vpp, chunk_layers = plan.pp, plan.vpp, plan.chunk_layers
    # perf (i18s-step): stages of a group have the same gathers: one row per group in Python floats,
    # spread to the stages in one take each (an indexed store per group and bucket set before)
    release_of, bucket_s = [], []   # per group: (each chunk's release, the gathers' end); the bucket's seconds
    for rows, s0, st in zip(groups.rows, groups.first, groups.syncs):
        release = [0.0] * vpp
        clock = 0.0
        if st.param_gathers and st.gather_before_forward:
            for bs in st.param_gathers:
                d = _collective_op_s(bs.op, t, cluster)
                first_layer = -(-bs.count // max(chunk_layers[bs.chunk * pp + s0], 1))
                release[bs.chunk] = clock + first_layer * d
                if events is not None:
                    for s in rows:
                        events[s] += [(f"{bs.op.name}[{k}]", clock + k * d, clock + (k + 1) * d)
                                      for k in range(bs.count)]
                clock += bs.count * d
        release.append(clock)
        release_of.append(release)
        bucket_s.append(_collective_op_s(st.grad_buckets[0].op, t, cluster) if st.grad_buckets else 0.0)
    stages = graph.stages
    # perf (i22s-step): the first and the last stage of a built graph share one embedding op: timed once
    emb_s, last_op, seconds = [], None, 0.0
    for s in groups.embedding:
        op = stages[s].embedding_sync
        if op is not last_op:
            last_op, seconds = op, _collective_op_s(op, t, cluster)
        emb_s.append(seconds)
    # perf (i22s-step): the releases and the gathers' ends spread to the stages in one take, as rows of one
    # (vpp + 1, pp) table (two tables and takes before); with one chunk the releases' (pp, 1) view is
    # contiguous, as before
    per_stage = np.take(np.array(release_of, dtype=float).T, groups.index, axis=1)
    return per_stage[:vpp].T, per_stage[vpp], np.array(bucket_s, dtype=float), np.array(emb_s, dtype=float)


_COLLECTIVE, _ALL_REDUCE = OpKind.COLLECTIVE, Collective.ALL_REDUCE


def _collective_op_s(op, t, cluster: ClusterSpec) -> float:
    """t(op) (replay.timing.timed_s: the measured duration, else the cost model) for a step sync op.
    perf (i20s-step): a modelled collective goes to network.collective_time_s directly (the
    arithmetic timing.collective_s caches, the same float): a sync collective's seconds are kept by
    the sync-times entry (replay_step), so the per-transfer key, look-up and insert bought nothing."""
    if op.kind is _COLLECTIVE and op.duration_s is None:
        return collective_time_s(op.collective or _ALL_REDUCE, op.msg_bytes, op.group_size, op.group_stride, cluster,
                                 op.flat_ring)
    return t(op)


@dataclass
class StageTail:
    compute_end: float        # last task
    optimizer_start: float
    optimizer_end: float
    dp_events: list = field(default_factory=list)   # (name, start, end) on the DP stream
    end: float = 0.0
    adam_s: float = 0.0
    offload_s: float = 0.0
    partner_wait: float = 0.0  # waiting for the other end of the tied-embedding all-reduce


class StageTails(Sequence):
    """Every stage's tail as arrays (pp,), a StageTail built per access (a timeline, a test): the step
    reads the arrays. Read-only by convention (`end` may be `optimizer_end` itself)."""
    __slots__ = ("adam", "compute_end", "end", "events", "offload", "optimizer_end", "optimizer_start", "partner_wait")

    def __init__(self, compute_end, optimizer_start, optimizer_end, end, adam, offload, partner_wait,
                 events: list | None):
        self.compute_end, self.optimizer_start, self.optimizer_end, self.end = compute_end, optimizer_start, optimizer_end, end
        self.adam, self.offload, self.partner_wait = adam, offload, partner_wait
        self.events = events

    def __len__(self) -> int:
        return len(self.end)

    def __getitem__(self, s):
        if isinstance(s, slice):
            return [self[i] for i in range(*s.indices(len(self)))]
        s = range(len(self))[s]
        return StageTail(float(self.compute_end[s]), float(self.optimizer_start[s]), float(self.optimizer_end[s]),
                         self.events[s] if self.events is not None else [], float(self.end[s]), float(self.adam[s]),
                         float(self.offload[s]), float(self.partner_wait[s]))


def _tails(graph: StepGraph, cluster: ClusterSpec, precision: str, groups: dict, summary: PipelineSummary,
           gather_end: np.ndarray, t, blocks, events: list | None = None, dp_rate: np.ndarray | None = None, *,
           blocks_key: tuple, sync_s: list | None = None, graph_key: Signature | None = None) -> StageTails:
    """Each stage's DP stream, tied-embedding sync and optimizer. `events`: per stage, the DP stream's
    (name, start, end) so far, extended here (for the timeline); None: not recorded. `sync_s`:
    _sync_times' last two of this graph and network, where known; `graph_key`: the graph's
    statics_key, where known."""
    plan = graph.plan
    pp = plan.pp
    last_b_start = summary.last_b_start                            # (stage, chunk)
    record = events is not None
    statics = _tail_statics(graph, groups, blocks, blocks_key, (cache.compute_key(cluster), precision), t,
                            graph_key or statics_key(groups, plan))
    if statics.fused is not None and sync_s is not None and dp_rate is not None and HAVE_NUMBA and not record:
        # perf: every stage's DP stream, embedding sync and optimizer in one compiled pass (the
        # arithmetic below, bit for bit; tests/replay/test_contention.py)
        group_i, group_f, emb = statics.fused
        in_order, out = stage_tails(last_b_start, summary.compute_end, gather_end, dp_rate, groups.index, group_i,
                                    group_f, sync_s[0], emb, sync_s[1])
        if in_order:
            optimizer_start, optimizer_end, partner_wait, offload, adam = out
            return StageTails(summary.compute_end, optimizer_start, optimizer_end,
                              _after_optimizer(statics, optimizer_end, t, None), adam, offload, partner_wait, None)
    adam, link = statics.per_stage(groups)
    # perf: stages sharing one StageSync object (every middle stage) and the same layer counts run
    # their DP streams, embedding sync and optimizer as rows of one array computation
    dp_end = gather_end.copy()
    fast = dp_rate is not None and HAVE_NUMBA and not record
    for rows, s0, st, terms in statics.groups:
        if not st.grad_buckets:
            continue
        if terms is not None and fast:
            # perf: one chunk's equal buckets on a shared port, offsets and stream in one compiled
            # pass (the generic path below, bit for bit; tests/replay/test_contention.py)
            bs = st.grad_buckets[0]
            ends, in_order = shared_bucket_stream(
                last_b_start[rows, bs.chunk], gather_end[rows], summary.compute_end[rows], dp_rate[rows], *terms,
                bs.count, bs.progressive, float(t(bs.op)))
            if in_order:
                dp_end[rows] = ends[:, -1]
                continue
        offsets, durs, chunk_of, in_bucket_order = _bucket_layout_shared(graph, blocks, blocks_key, s0, st, t)
        if in_bucket_order:
            # perf: one chunk's buckets, ready in bucket order on every row (row start + nondecreasing
            # offsets): the stable sort is the identity
            order = None
            ready = last_b_start[rows, chunk_of[0]][:, None] + offsets[None, :]
            in_order, durs_in_order = ready, durs
        elif fast:
            # perf: buckets of several chunks: readiness, stable sort and the shared port in one compiled
            # pass per row (the arithmetic below, bit for bit; tests/replay/test_contention.py)
            dp_end[rows] = sorted_bucket_stream_end(last_b_start, rows, chunk_of, offsets, durs, gather_end[rows],
                                                    summary.compute_end[rows], dp_rate[rows])
            continue
        else:
            ready = last_b_start[rows[:, None], chunk_of[None, :]] + offsets[None, :]
            order = np.argsort(ready, axis=1, kind="stable")
            in_order, durs_in_order = np.take_along_axis(ready, order, axis=1), durs[order]
        if dp_rate is None:
            ends = _serial(in_order, durs_in_order, gather_end[rows, None])
        else:   # the DP stream gets the NIC share the backward's traffic leaves until the stage's last backward ends
            ends = serial_shared(in_order, durs_in_order, gather_end[rows], summary.compute_end[rows], dp_rate[rows])
        dp_end[rows] = ends[:, -1]
        if record:
            names = [f"{bs.op.name}[{k}]" for bs in st.grad_buckets for k in range(bs.count)]
            for r, s in enumerate(rows):
                idx = range(len(names)) if order is None else order[r].tolist()
                events[s] += [(names[i], e - durs[i], e) for i, e in zip(idx, ends[r].tolist())]
    compute_end = summary.compute_end
    partner_wait = np.zeros(pp)
    # Tied-embedding gradient all-reduce between first and last stage: starts when both are ready; a
    # stage waiting for its partner is pipeline imbalance.
    emb = statics.emb
    if emb:
        ready_at = {s: max(float(compute_end[s]), float(dp_end[s])) for s in emb}
        start = max(ready_at.values())
        for s in emb:
            d = t(graph.stages[s].embedding_sync)
            partner_wait[s] = start - ready_at[s]
            if record:
                events[s].append(("embedding.grad_all_reduce", start, start + d))
            dp_end[s] = start + d
    offload = np.maximum(0.0, link - adam)
    optimizer_start = np.maximum(compute_end, dp_end)
    optimizer_end = optimizer_start + adam + offload
    end = _after_optimizer(statics, optimizer_end, t, events)
    return StageTails(compute_end, optimizer_start, optimizer_end, end, adam, offload, partner_wait, events)


def _after_optimizer(statics: _TailStatics, optimizer_end: np.ndarray, t, events: list | None) -> np.ndarray:
    """Each stage's end: parameter all-gathers issued after the optimizer (not overlapped with the next
    step's first forwards) follow it."""
    if not statics.gathers_after:
        # perf (i20s-step): no parameter gathers after the optimizer (every ZeRO-0 configuration, and
        # overlapped gathers): each stage ends with its optimizer, no copy and no walk over the groups
        return optimizer_end
    end = optimizer_end.copy()
    for rows, _, st, _ in statics.groups:
        if st.gather_before_forward:
            continue
        for bs in st.param_gathers:
            d = t(bs.op)
            if events is not None:
                for s in rows:
                    events[s].append((bs.op.name, float(end[s]), float(end[s] + bs.count * d)))
            end[rows] += bs.count * d
    return end


def _bucket_ready_terms(graph: StepGraph, blocks: dict, stage: int, bs,
                        layer_s: dict | None = None) -> tuple[float, float, float, int]:
    """(output head's backward, mean backward per layer, the chunk's whole backward, layers) of a
    chunk's last backward task: what bucket_ready_offsets reads of the blocks. `layer_s`: a memo of
    each layer kind's backward (+ recompute) seconds, shared by a graph's chunks, or None."""
    plan = graph.plan
    vs = bs.chunk * plan.pp + stage
    n = plan.chunk_layers[vs]
    head = blocks["head.bwd"].duration_s if vs == plan.pp * plan.vpp - 1 else 0.0
    kinds = plan.layer_kinds(vs)   # mean backward (+ recompute) per layer over the chunk's layer kinds
    layer_s = {} if layer_s is None else layer_s
    total = 0     # the sum of the layers' seconds in order, from 0 as sum() adds them
    for k in kinds:
        seconds = layer_s.get(k)
        if seconds is None:     # perf (i18s-step): each kind's block names and look-ups once per graph
            seconds = layer_s[k] = blocks[k + ".bwd"].duration_s + (
                blocks[k + ".recompute"].duration_s if plan.recompute_layers else 0.0)
        total += seconds
    per_layer = total / max(len(kinds), 1)
    all_compute = head + n * per_layer + (blocks["embedding.bwd"].duration_s if vs == 0 else 0.0)
    return float(head), float(per_layer), float(all_compute), int(n)


class _TailStatics:
    """What a graph's stage tails read that the network does not change: per stage the optimizer's
    compute and host-link seconds; per stage group (rows, first stage, its StageSync, and for one
    chunk's buckets the readiness terms of _bucket_ready_terms); the stages with a tied-embedding sync.
    Read-only by convention (shared from cache.facts); perf (i18s-step): a slotted class, not a frozen
    dataclass (a setattr call per field)."""
    __slots__ = ("adam_link", "emb", "fused", "gathers_after", "groups")

    def __init__(self, adam_link: list, groups: tuple, emb: tuple, fused: tuple | None = None):
        self.adam_link = adam_link   # per group (optimizer seconds, host-link seconds)
        self.groups, self.emb = groups, emb
        self.fused = fused   # tail_kernels.stage_tails' per-group inputs, where it applies
        # whether some stage gathers parameters after its optimizer (_after_optimizer)
        self.gathers_after = any([st.param_gathers and not st.gather_before_forward for _, _, st, _ in groups])

    def per_stage(self, groups: StageGroups) -> np.ndarray:
        """Per stage (optimizer seconds, host-link seconds): rows of one table, each contiguous (the
        generic path's; the fused kernel spreads them itself)."""
        return np.take(np.array(self.adam_link, dtype=float).T, groups.index, axis=1)


def _fused_statics(groups: StageGroups, terms_of: list, adam_link: list, emb: tuple) -> tuple | None:
    """tail_kernels.stage_tails' inputs that the network does not change: per group (chunk, buckets,
    layers, progressive) (0 buckets: none) and (the readiness terms of its buckets: head, per layer,
    whole backward, see _bucket_ready_terms; the optimizer's and host link's seconds), the
    tied-embedding stages; None where a group's buckets span several sets (the generic path sorts
    them). Each stage's group is groups.index."""
    floats, ints = [], []
    for st, terms, (adam, link) in zip(groups.syncs, terms_of, adam_link):
        if not st.grad_buckets:
            floats.append((0.0, 0.0, 0.0, adam, link))
            ints.append((0, 0, 0, 0))
            continue
        if terms is None:
            return None
        bs = st.grad_buckets[0]
        floats.append((terms[0], terms[1], terms[2], adam, link))
        ints.append((bs.chunk, bs.count, terms[3], int(bs.progressive)))
    # perf (i18s-step): the kernel computes the ready offsets from these terms (a table of
    # _ready_offsets was built here: ~30 small numpy calls)
    return np.array(ints, dtype=np.int64), np.array(floats, dtype=float), np.array(emb, dtype=np.int64)


def statics_key(groups: StageGroups, plan) -> Signature:
    """The graph's part of the tail statics' key (_tail_statics)."""
    return Signature((cache.object_key(groups), plan.recompute_layers, plan.chunk_layer_kinds))


def _tail_statics(graph: StepGraph, groups: StageGroups, blocks: dict, blocks_key: tuple, compute_key: tuple,
                  t, graph_key: Signature) -> _TailStatics:
    """_TailStatics, shared by the candidates of one graph whose blocks are timed alike (the same cached
    BlockTiming objects, held by `blocks_key`) on GPUs alike (`compute_key`: (cache.compute_key,
    precision)); compute and copy kernel times read only that (cache.COMPUTE_FIELDS), so clusters that
    differ in their network share it."""
    def build() -> _TailStatics:
        adam_link, rows_of, terms_of, layer_s = [], [], [], {}
        for stages, s0, st in zip(groups.rows, groups.first, groups.syncs):
            adam = link = 0     # the sums start at 0, as sum() does
            for op in st.optimizer:
                if op.kind is OpKind.COMPUTE:
                    adam += t(op)
                elif op.kind is OpKind.MEMCPY:
                    link += t(op)
            adam_link.append((adam, link))
            terms = (_bucket_ready_terms(graph, blocks, s0, st.grad_buckets[0], layer_s) if len(st.grad_buckets) == 1
                     else None)
            rows_of.append((stages, s0, st, terms))
            terms_of.append(terms)
        emb = groups.embedding
        return _TailStatics(adam_link, tuple(rows_of), emb, _fused_statics(groups, terms_of, adam_link, emb))

    # perf: keyed by what it reads (the stage syncs, shared by configurations equal but for the global
    # batch, and the plan's layer split), not by the graph object. perf (i20s-step): the stage syncs and
    # the split (pp, vpp, layers) through the StageGroups object, which the "stage groups" entry keeps
    # per (stage syncs, pp, vpp, layers): one identity, not the 64-entry split hashed again; `graph_key`:
    # statics_key(groups, plan), a Signature (its hash computed once per graph, i21s-step)
    return cache.facts.get_or(("tail statics", graph_key, blocks_key, compute_key), build)


def bucket_ready_offsets(graph: StepGraph, blocks: dict, stage: int, bs) -> np.ndarray:
    """When each of a chunk's gradient buckets is complete, measured from the start of the chunk's last
    backward task: bucket k holds the first ceil((k+1) * n / count) layers in backward order, and is
    ready when that layer's backward is done (Megatron DDP fills buckets as wgrads finish)."""
    return _ready_offsets(_bucket_ready_terms(graph, blocks, stage, bs), bs)


def _ready_offsets(terms: tuple, bs) -> np.ndarray:
    """bucket_ready_offsets from the chunk's _bucket_ready_terms."""
    head, per_layer, all_compute, n = terms
    if not bs.progressive or n == 0:
        return np.full(bs.count, all_compute)
    layers_done = np.ceil(np.arange(1, bs.count + 1) * n / bs.count)
    ready = head + layers_done * per_layer
    ready[-1] = all_compute
    return ready


def _bucket_layout(graph: StepGraph, blocks: dict, stage: int, st, t) -> tuple:
    """A stage's gradient buckets, all chunks in a row: (ready offsets from the start of their chunk's
    last backward, durations, chunk of each, whether one chunk's buckets are ready in bucket order)."""
    offsets = np.concatenate([bucket_ready_offsets(graph, blocks, stage, bs) for bs in st.grad_buckets])
    durs = np.concatenate([np.full(bs.count, t(bs.op)) for bs in st.grad_buckets])
    chunk_of = np.concatenate([np.full(bs.count, bs.chunk) for bs in st.grad_buckets])
    in_bucket_order = len(st.grad_buckets) == 1 and bool((offsets[1:] >= offsets[:-1]).all())
    return offsets, durs, chunk_of, in_bucket_order


def _bucket_layout_shared(graph: StepGraph, blocks: dict, blocks_key: tuple, stage: int, st, t) -> tuple:
    """_bucket_layout, shared (read-only arrays) by candidates of one graph (cache.graphs) whose blocks
    are timed alike (the same cached BlockTiming objects) and whose bucket collectives take as long."""
    bucket_s = tuple(t(bs.op) for bs in st.grad_buckets)
    key = ("bucket layout", cache.object_key(graph), stage, blocks_key, bucket_s)
    return cache.facts.get_or(key, lambda: _bucket_layout(graph, blocks, stage, st, t))


def _serial(ready: np.ndarray, dur: np.ndarray, t0) -> np.ndarray:
    """End times of ops run one after another on one stream, each no earlier than its ready time (along
    the last axis: one stream per row)."""
    if dur.shape[-1] == 0:
        return dur
    c = np.cumsum(dur, axis=-1)
    return c + np.maximum.accumulate(np.maximum(ready, t0) - (c - dur), axis=-1)
