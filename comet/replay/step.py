"""Replay one training step of a StepGraph: time each block once (event engine), the pipeline tasks
(static-order solver), then each stage's tail; produce the step time and its breakdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby, repeat

import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.ir import Op, OpKind, StepGraph
from comet.replay import cache, periodic, pipeline
from comet.replay.blocks import BlockTiming, time_block
from comet.replay.contention import dp_nic_rate, serial_shared
from comet.replay.kernels import HAVE_NUMBA
from comet.replay.tail_kernels import shared_bucket_stream, sorted_bucket_stream_end, stage_tails
from comet.replay.pipeline import PipelineSummary, StagePrograms, summarize
from comet.replay.pipeline import run as run_pipeline
from comet.replay.schedule import task_kinds
from comet.replay.timing import p2p_s, timed_s
from comet.result import BREAKDOWN_KEYS


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
    reads the arrays."""

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


class TaskParts(Sequence):
    """[stage][chunk] -> parts dict of a task, from the distinct task kinds (schedule.task_kinds) and
    which kind each (stage, chunk) runs: no per-stage lists built unless asked for."""

    def __init__(self, parts_of: list[dict], kind: np.ndarray):
        self.parts_of, self.kind = parts_of, kind
        self._rows: dict = {}

    def __len__(self) -> int:
        return len(self.kind)

    def __getitem__(self, s) -> list[dict]:
        row = self._rows.get(s)
        if row is None:     # a timeline reads a stage's row once per task
            row = self._rows[s] = [self.parts_of[k] for k in self.kind[s].tolist()]
        return row


@dataclass
class StepReplay:
    step_time_s: float
    breakdown: dict[str, float]
    critical_stage: int
    stage_end: np.ndarray
    blocks: dict[str, BlockTiming]
    tails: StageTails        # [stage] -> StageTail
    f_parts: TaskParts       # [stage][chunk] -> parts dict of a forward task
    b_parts: TaskParts
    plan: object = None      # the PipelinePlan replayed
    task_durations: tuple = ()   # (f_dur, b_dur, f_release) per (stage, chunk): the task level's inputs
    _tasks: tuple | None = field(default=None, repr=False)

    def tasks(self) -> tuple[StagePrograms, np.ndarray]:
        """Every task (StagePrograms) and its end time; built on demand (a timeline), the step itself
        needs only the per-stage summary."""
        if self._tasks is None:
            plan = self.plan
            # writable copies: the durations are shared read-only arrays (a compiled kernel is typed by
            # the arrays' writability; these are the types it is compiled for)
            durations = (np.array(a, dtype=float) for a in self.task_durations)
            self._tasks = run_pipeline(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches, *durations)
        return self._tasks

    @property
    def programs(self) -> StagePrograms:
        return self.tasks()[0]

    @property
    def task_end(self) -> np.ndarray:
        return self.tasks()[1]


def _scaled(parts: dict, k: float, into: dict) -> None:
    for key, v in parts.items():
        into[key] = into.get(key, 0.0) + k * v


def _blocks_parts(keys: tuple, blocks: dict[str, BlockTiming]) -> dict:
    """The parts of blocks `keys` run one after another (summed in order). Shared between candidates
    whose blocks are the same (cached) BlockTiming objects; the key holds them, so ids stay unique."""
    held = tuple(blocks[k] for k in dict.fromkeys(keys))

    def total() -> tuple[dict, tuple]:
        parts: dict = {}
        for key in keys:
            _scaled(blocks[key].parts, 1, parts)
        return parts, held

    return cache.facts.get_or(("blocks parts", keys, tuple(map(id, held))), total)[0]


def _task_parts(graph: StepGraph, blocks: dict[str, BlockTiming], blocks_key: tuple, cluster: ClusterSpec,
                task_kinds_):
    """Durations and parts of every (stage, chunk) forward and backward task; `task_kinds_`:
    schedule.task_kinds(graph.plan); `blocks_key`: _block_timings' identity key of `blocks`."""
    plan = graph.plan
    kinds, f_kind, b_kind = task_kinds_

    # the overlapped pipeline send's exposed seconds per send stride (builder.build_plan)
    sends = {stride: plan.p2p_exposed * p2p_s(plan.p2p_bytes, stride, cluster)
             for stride in dict.fromkeys(stride for _, stride in kinds) if stride is not None}

    def per_kind() -> tuple:
        parts_of, dur_of = [], []
        for keys, stride in kinds:
            parts = dict(_blocks_parts(keys, blocks))
            if stride is not None:
                parts["exposed_pp"] = parts.get("exposed_pp", 0.0) + sends[stride]
            parts_of.append(parts)
            dur_of.append(sum(parts.values()))
        dur_of = np.array(dur_of)
        f_dur, b_dur = dur_of[f_kind], dur_of[b_kind]
        f_dur.flags.writeable = b_dur.flags.writeable = False   # shared: read-only from here on
        return f_dur, b_dur, TaskParts(parts_of, f_kind), TaskParts(parts_of, b_kind)

    # perf: a task kind's parts are read from its BlockTimings (shared objects from cache.replays: clusters
    # that time a block alike give the same object) and the send; the key holds the objects, so ids stay
    # unique. The (stage, chunk) durations and parts tables are shared too (read-only; `kinds` holds the
    # kind arrays), and with them the rows TaskParts builds for the breakdown.
    return cache.facts.get_or(("task kind parts", cache.object_key(kinds), blocks_key, tuple(sends.items())), per_kind)


def _block_timings(graph: StepGraph, cluster: ClusterSpec, precision: str, keep_replays: bool) -> tuple[dict, tuple]:
    """Every block of the graph timed on the cluster, and the identity key of those BlockTimings (names
    and the shared objects: clusters that time a block alike share the object) for the caches below."""
    def timed() -> tuple[dict, tuple]:
        blocks = {k: time_block(g, cluster, precision, keep_replays) for k, g in graph.blocks.items()}
        return blocks, (tuple(blocks), cache.objects_key(tuple(blocks.values())))

    if keep_replays:
        return timed()
    # perf: a block's timing reads its content, what the cost models read of the cluster and the
    # precision (blocks.py); shared (read-only) by the candidates that share the builder's blocks
    return cache.facts.get_or(("block timings", cache.object_key(graph.blocks), cache.timing_key(cluster), precision),
                              timed)


def _serial(ready: np.ndarray, dur: np.ndarray, t0) -> np.ndarray:
    """End times of ops run one after another on one stream, each no earlier than its ready time (along
    the last axis: one stream per row)."""
    if dur.shape[-1] == 0:
        return dur
    c = np.cumsum(dur, axis=-1)
    return c + np.maximum.accumulate(np.maximum(ready, t0) - (c - dur), axis=-1)


def replay_step(graph: StepGraph, cluster: ClusterSpec, precision: str, keep_block_replays: bool = False) -> StepReplay:
    blocks, blocks_key = _block_timings(graph, cluster, precision, keep_block_replays)
    plan = graph.plan
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    # perf: the plan is the cached graph's (read-only); its task kinds are looked up once per plan object
    kinds = cache.facts.get_or(("task kinds", cache.object_key(plan)), lambda: task_kinds(plan))
    f_dur, b_dur, f_parts, b_parts = _task_parts(graph, blocks, blocks_key, cluster, kinds)

    memo: dict = {}

    def t(op: Op) -> float:
        # perf: middle stages share their sync ops (builder.build_stages); time each object once
        key = id(op)
        if key not in memo:
            memo[key] = timed_s(op, cluster, precision)
        return memo[key]

    groups = _stage_groups_shared(graph)
    gather_events = [[] for _ in range(pp)] if keep_block_replays else None   # (name, start, end): the timeline's
    if keep_block_replays:
        f_release, gather_end = _early_gathers(graph, groups, t, gather_events)
        sync_s = None
    else:
        # perf: the sync collectives read the stage syncs, the plan's layer split and the network: shared
        # by the candidates whose configurations differ only in the global batch (evaluate._built shares
        # the stage syncs), read-only
        key = ("sync times", cache.object_key(graph.stages), plan.chunk_layers, cache.network_key(cluster), precision)
        f_release, gather_end, *sync_s = cache.facts.get_or(key, lambda: _read_only(
            *_early_gathers(graph, groups, t), *_sync_collective_s(graph, groups, t)))
    summary = _summary_shared(plan, f_dur, b_dur, f_release)
    dp_rate = dp_nic_rate(graph, cluster, b_dur, t, precision, groups, kinds)   # NIC shared by DP and backward traffic (contention.py)
    tails = _tails(graph, cluster, precision, groups, summary, gather_end, t, blocks, gather_events, dp_rate=dp_rate,
                   blocks_key=blocks_key, sync_s=sync_s)
    crit = int(np.argmax(tails.end))
    breakdown = _breakdown(summary, m, tails[crit], crit, f_parts, b_parts)
    return StepReplay(float(tails.end[crit]), breakdown, crit, tails.end, blocks, tails, f_parts, b_parts, plan,
                      (f_dur, b_dur, f_release))


def _early_gathers(graph: StepGraph, groups: dict, t, events: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Parameter all-gathers issued at the start of the step (overlapping the first forwards): each
    chunk's first forward waits for the buckets holding its first layer. Returns (release of each
    (stage, chunk)'s first forward, end of each stage's gathers); `events`: per stage, the gathers'
    (name, start, end) appended (the timeline's), or None."""
    plan = graph.plan
    pp = plan.pp
    gather_end = np.zeros(pp)
    f_release = np.zeros((pp, plan.vpp))
    for stages in groups.values():      # perf: stages of a group have the same gathers (rows of one array)
        st = graph.stages[stages[0]]
        if not (st.param_gathers and st.gather_before_forward):
            continue
        clock = 0.0
        for bs in st.param_gathers:
            d = t(bs.op)
            first_layer = -(-bs.count // max(plan.chunk_layers[bs.chunk * pp + stages[0]], 1))
            f_release[stages, bs.chunk] = clock + first_layer * d
            if events is not None:
                for s in stages:
                    events[s] += [(f"{bs.op.name}[{k}]", clock + k * d, clock + (k + 1) * d) for k in range(bs.count)]
            clock += bs.count * d
        gather_end[stages] = clock
    return f_release, gather_end


def _sync_collective_s(graph: StepGraph, groups: dict, t) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of each stage group's first gradient bucket (0: none) and of each tied-embedding
    all-reduce (stages in increasing order): what tail_kernels.stage_tails reads of the network."""
    bucket_s = np.array([t(graph.stages[rows[0]].grad_buckets[0].op) if graph.stages[rows[0]].grad_buckets else 0.0
                         for rows in groups.values()])
    emb_s = np.array([t(graph.stages[s].embedding_sync) for s in _embedding_stages(graph, groups)])
    return bucket_s, emb_s


def _embedding_stages(graph: StepGraph, groups: dict) -> tuple:
    return tuple(sorted(int(s) for stages in groups.values() if graph.stages[stages[0]].embedding_sync is not None
                        for s in stages))


def _read_only(*arrays: np.ndarray) -> tuple:
    for a in arrays:
        a.flags.writeable = False
    return arrays


def _summary_shared(plan, f_dur: np.ndarray, b_dur: np.ndarray, f_release: np.ndarray) -> PipelineSummary:
    """The task level's per-stage figures, shared by candidates whose task durations and releases are
    equal bit for bit (clusters that differ in HBM, prices, or a part of the network that no task, send or
    early parameter gather crosses): the summary reads nothing else (pipeline.summarize)."""
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    # perf: the kernels' layout, (stage, phase, chunk) durations and (stage, chunk) releases, built once
    # and read as bytes for the keys (one concatenate, not stack + astype: ~6 -> 2 us)
    dur = np.concatenate((f_dur, b_dur), axis=1, dtype=float).ravel()
    release = np.ascontiguousarray(f_release, dtype=float).ravel()
    dur_bits, release_bits = dur.tobytes(), release.tobytes()

    def run() -> PipelineSummary:
        if pipeline.HAVE_NUMBA:
            # perf: compiled, through the schedule's periodic steady state (periodic.py: O(warm-up + drain)
            # tasks, not O(m x pp); the same function of the durations cached or not)
            summary = periodic.summarize(plan.schedule, pp, vpp, m, dur, release, dur_bits, release_bits)
        else:
            summary = summarize(plan.schedule, pp, vpp, m, f_dur, b_dur, f_release)
        for a in (summary.compute_end, summary.last_b_start, summary.bubble, summary.gather_wait):
            a.flags.writeable = False     # shared: read-only from here on
        return summary

    # the solver is part of the key: the numpy fallback equals the compiled one to 1e-12, not bit for bit
    key = (pipeline.HAVE_NUMBA, plan.schedule, pp, vpp, m, dur_bits, release_bits)
    return cache.summaries.get_or(key, run)


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=float).tobytes()


def _bucket_ready_terms(graph: StepGraph, blocks: dict, stage: int, bs) -> tuple[float, float, float, int]:
    """(output head's backward, mean backward per layer, the chunk's whole backward, layers) of a
    chunk's last backward task: what bucket_ready_offsets reads of the blocks."""
    plan = graph.plan
    vs = bs.chunk * plan.pp + stage
    n = plan.chunk_layers[vs]
    head = blocks["head.bwd"].duration_s if vs == plan.pp * plan.vpp - 1 else 0.0
    kinds = plan.layer_kinds(vs)   # mean backward (+ recompute) per layer over the chunk's layer kinds
    per_layer = sum(blocks[f"{k}.bwd"].duration_s + (blocks[f"{k}.recompute"].duration_s if plan.recompute_layers
                                                       else 0.0) for k in kinds) / max(len(kinds), 1)
    all_compute = head + n * per_layer + (blocks["embedding.bwd"].duration_s if vs == 0 else 0.0)
    return float(head), float(per_layer), float(all_compute), int(n)


@dataclass(frozen=True)
class _TailStatics:
    """What a graph's stage tails read that the network does not change: per stage the optimizer's
    compute and host-link seconds; per stage group (rows, first stage, its StageSync, and for one
    chunk's buckets the readiness terms of _bucket_ready_terms); the stages with a tied-embedding sync."""
    adam: np.ndarray
    link: np.ndarray
    groups: tuple
    emb: tuple
    fused: tuple | None = None   # tail_kernels.stage_tails' per-stage / per-group inputs, where it applies


def _fused_statics(statics_groups: list, pp: int, emb: tuple) -> tuple | None:
    """tail_kernels.stage_tails' inputs that the network does not change: each stage's group (-1: no
    buckets), per group the bucket ready offsets (bucket_ready_offsets, a row of a table) and (chunk,
    buckets), the tied-embedding stages; None where a group's buckets are not one chunk's buckets ready
    in bucket order (the generic path sorts them)."""
    group_of = np.full(pp, -1, dtype=np.int64)
    offsets_of, group_i = [], []
    for g, (rows, _, st, terms) in enumerate(statics_groups):
        if not st.grad_buckets:
            offsets_of.append(())
            group_i.append((0, 0))
            continue
        if terms is None:
            return None
        bs = st.grad_buckets[0]
        offsets = _ready_offsets(terms, bs)
        if (offsets[1:] < offsets[:-1]).any():   # not ready in bucket order
            return None
        group_of[rows] = g
        offsets_of.append(offsets)
        group_i.append((bs.chunk, bs.count))
    table = np.zeros((len(offsets_of), max(map(len, offsets_of), default=0)))
    for g, offsets in enumerate(offsets_of):
        table[g, :len(offsets)] = offsets
    return group_of, table, np.array(group_i, dtype=np.int64).reshape(-1, 2), np.array(emb, dtype=np.int64)


def _tail_statics(graph: StepGraph, groups: dict, blocks: dict, blocks_key: tuple, compute_key: tuple,
                  t) -> _TailStatics:
    """_TailStatics, shared by the candidates of one graph whose blocks are timed alike (the same cached
    BlockTiming objects, held by `blocks_key`) on GPUs alike (`compute_key`: (cache.compute_key,
    precision)); compute and copy kernel times read only that (cache.COMPUTE_FIELDS), so clusters that
    differ in their network share it."""
    def build() -> _TailStatics:
        pp = graph.plan.pp
        adam, link = np.zeros(pp), np.zeros(pp)
        rows_of = []
        for stages in groups.values():
            s0 = int(stages[0])
            st = graph.stages[s0]
            adam[stages] = sum(t(op) for op in st.optimizer if op.kind is OpKind.COMPUTE)
            link[stages] = sum(t(op) for op in st.optimizer if op.kind is OpKind.MEMCPY)
            terms = (_bucket_ready_terms(graph, blocks, s0, st.grad_buckets[0]) if len(st.grad_buckets) == 1
                     else None)
            rows_of.append((stages, s0, st, terms))
        emb = _embedding_stages(graph, groups)
        adam.flags.writeable = link.flags.writeable = False
        return _TailStatics(adam, link, tuple(rows_of), emb, _fused_statics(rows_of, pp, emb))

    # perf: keyed by what it reads (the stage syncs, shared by configurations equal but for the global
    # batch, and the plan's layer split), not by the graph object
    plan = graph.plan
    key = ("tail statics", cache.object_key(graph.stages), plan.pp, plan.vpp, plan.chunk_layers, plan.recompute_layers,
           plan.chunk_layer_kinds, blocks_key, compute_key)
    return cache.facts.get_or(key, build)


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


def _stage_groups(graph: StepGraph) -> dict:
    """Stages that share one StageSync object and the same role and layer counts (rows of one
    array computation in _tails)."""
    plan, pp = graph.plan, graph.plan.pp
    layers = plan.chunk_layers
    # a stage's role: (its StageSync's id, first, last, layers of its chunks c * pp + s, c < vpp)
    chunk_layers = zip(*(layers[c * pp:(c + 1) * pp] for c in range(plan.vpp)))
    roles = list(zip(map(id, graph.stages), repeat(False), repeat(False), chunk_layers))
    roles[0] = (roles[0][0], True, pp == 1, roles[0][3])
    roles[-1] = (roles[-1][0], len(roles) == 1, True, roles[-1][3])
    # perf: stages alike come in runs (the middle stages): one dict update per run, not per stage
    # (pp 64: 24 -> ~10 us); the groups, their order and their stages are the per-stage loop's
    groups: dict = {}
    s = 0
    for role, run in groupby(roles):
        n = sum(1 for _ in run)
        groups.setdefault(role, []).extend(range(s, s + n))
        s += n
    return {role: np.array(stages) for role, stages in groups.items()}   # index arrays (read-only)


def _stage_groups_shared(graph: StepGraph) -> dict:
    plan = graph.plan
    return cache.facts.get_or(("stage groups", cache.object_key(graph.stages), plan.pp, plan.vpp, plan.chunk_layers),
                              lambda: _stage_groups(graph))


def _tails(graph: StepGraph, cluster: ClusterSpec, precision: str, groups: dict, summary: PipelineSummary,
           gather_end: np.ndarray, t, blocks, events: list | None = None, dp_rate: np.ndarray | None = None, *,
           blocks_key: tuple, sync_s: list | None = None) -> StageTails:
    """Each stage's DP stream, tied-embedding sync and optimizer. `events`: per stage, the DP stream's
    (name, start, end) so far, extended here (for the timeline); None: not recorded. `sync_s`:
    _sync_collective_s of this graph and network, where known."""
    plan = graph.plan
    pp = plan.pp
    last_b_start = summary.last_b_start                            # (stage, chunk)
    record = events is not None
    statics = _tail_statics(graph, groups, blocks, blocks_key, (cache.compute_key(cluster), precision), t)
    adam, link = statics.adam, statics.link
    if statics.fused is not None and sync_s is not None and dp_rate is not None and HAVE_NUMBA and not record:
        # perf: every stage's DP stream, embedding sync and optimizer in one compiled pass (the
        # arithmetic below, bit for bit; tests/replay/test_contention.py)
        group_of, offsets, group_i, emb = statics.fused
        optimizer_start, optimizer_end, partner_wait, offload = stage_tails(
            last_b_start, summary.compute_end, gather_end, dp_rate, group_of, offsets, group_i, sync_s[0], emb,
            sync_s[1], adam, link)
        return StageTails(summary.compute_end, optimizer_start, optimizer_end,
                          _after_optimizer(statics, optimizer_end, t, None), adam, offload, partner_wait, None)
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


def _breakdown(summary: PipelineSummary, m: int, tail: StageTail, s: int, f_parts, b_parts) -> dict:
    """Where stage s's time went; the values add up to its end time. Every stage runs each chunk's
    forward and backward once per micro-batch, so task parts are counted (m times), not visited."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    out["exposed_dp"] += float(summary.gather_wait[s])
    out["pipeline_bubble"] += float(summary.bubble[s])
    f_row, b_row = f_parts[s], b_parts[s]
    for c in range(len(f_row)):
        for parts in (f_row[c], b_row[c]):
            for k, v in parts.items():
                out[k] += m * v
    out["pipeline_bubble"] += tail.partner_wait
    out["exposed_dp"] += tail.optimizer_start - float(summary.compute_end[s]) - tail.partner_wait
    out["optimizer"] += tail.adam_s
    out["offload"] += tail.offload_s
    out["exposed_dp"] += tail.end - tail.optimizer_end
    return out
