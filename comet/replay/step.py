"""Replay one training step of a StepGraph: time each block once (event engine), the pipeline tasks
(static-order solver), then each stage's tail (tails.py); produce the step time and its breakdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from comet.config.cluster import ClusterSpec
from comet.graph.ir import Op, StepGraph
from comet.replay import cache, periodic, pipeline
from comet.replay.blocks import BlockTiming, time_blocks
from comet.replay.contention import dp_nic_rate, nic_key
from comet.replay.pipeline import PipelineSummary, StagePrograms, summarize
from comet.replay.pipeline import run as run_pipeline
from comet.replay.schedule import task_kinds
from comet.replay.tails import StageTails, _stage_groups_shared, _sync_times, _tails, statics_key
from comet.replay.timing import p2p_s, timed_s
from comet.result import BREAKDOWN_KEYS


class TaskParts(Sequence):
    """[stage][chunk] -> parts dict of a task, from the distinct task kinds (schedule.task_kinds) and
    which kind each (stage, chunk) runs: no per-stage lists built unless asked for."""

    def __init__(self, parts_of: list[dict], kind: np.ndarray):
        self.parts_of, self.kind = parts_of, kind
        self._rows: dict = {}
        self._items: dict = {}

    def stage_items(self, other: TaskParts, s: int) -> tuple:
        """(part, seconds) of stage s's tasks in the order _breakdown adds them: per chunk, this
        object's (forward) parts then `other`'s (backward). perf: a forward TaskParts is built and
        cached with its backward one (step._task_parts), so the flat list is kept on it per stage
        (a cheap search candidate's _breakdown: nested loops and dict views each call before)."""
        items = self._items.get(s)
        if items is None:
            # perf (i24s-step): extended chunk by chunk (a generator resumed per item before: ~15 a cold call)
            items = []
            for f, b in zip(self[s], other[s]):
                items += f.items()
                items += b.items()
            items = self._items[s] = tuple(items)
        return items

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


def _kinds_block_parts(kinds: list, blocks: dict[str, BlockTiming]) -> list[dict]:
    """Per task kind, the parts of its blocks run one after another (each part summed in block order,
    keys in order of first appearance)."""
    out = []
    for keys, _ in kinds:
        parts: dict = {}
        get = parts.get
        for key in keys:
            for part, v in blocks[key].parts.items():
                parts[part] = get(part, 0.0) + v
        out.append(parts)
    return out


def _task_parts(graph: StepGraph, blocks: dict[str, BlockTiming], blocks_key: tuple, cluster: ClusterSpec,
                facts: _GraphFacts):
    """Durations and parts of every (stage, chunk) forward and backward task, and the durations in the
    task-level kernels' layout (_durations_layout); `facts`: the graph's (_graph_facts); `blocks_key`:
    _block_timings' identity key of `blocks`."""
    plan = graph.plan
    kinds, f_kind, b_kind = facts.kinds

    # the overlapped pipeline send's exposed seconds per send stride (builder.build_plan); perf (i21s-step):
    # the strides found once per graph (_GraphFacts), the pairs are the key
    sends = tuple([(stride, plan.p2p_exposed * p2p_s(plan.p2p_bytes, stride, cluster)) for stride in facts.send_strides])

    def per_kind() -> tuple:
        # perf (i18s-step): the kinds' block parts in one entry, read by every network (one entry per
        # kind before: six look-ups and key tuples on a cold call)
        block_parts = cache.facts.get_or(("kinds block parts", facts.kinds_key, blocks_key),
                                         lambda: _kinds_block_parts(kinds, blocks))
        parts_of, dur_of, send_of = [], [], dict(sends)
        for (_, stride), of_blocks in zip(kinds, block_parts):
            parts = dict(of_blocks)
            if stride is not None:
                parts["exposed_pp"] = parts.get("exposed_pp", 0.0) + send_of[stride]
            parts_of.append(parts)
            dur_of.append(sum(parts.values()))
        dur_of = np.array(dur_of)
        f_dur, b_dur = dur_of[f_kind], dur_of[b_kind]
        f_dur.flags.writeable = b_dur.flags.writeable = False   # shared: read-only from here on
        return f_dur, b_dur, TaskParts(parts_of, f_kind), TaskParts(parts_of, b_kind), _durations_layout(f_dur, b_dur)

    # perf: a task kind's parts are read from its BlockTimings (shared objects from cache.replays: clusters
    # that time a block alike give the same object) and the send; `blocks_key` holds the objects, so ids
    # stay unique. The (stage, chunk) durations and parts tables are shared too (read-only; `kinds` holds
    # the kind arrays), and with them the rows TaskParts builds for the breakdown.
    return cache.facts.get_or(("task kind parts", facts.kinds_key, blocks_key, sends), per_kind)


def _block_timings(graph: StepGraph, cluster: ClusterSpec, precision: str, keep_replays: bool) -> tuple[dict, tuple]:
    """Every block of the graph timed on the cluster, and the identity key of those BlockTimings (names
    and the shared objects: clusters that time a block alike share the object) for the caches below."""
    def timed() -> tuple[dict, tuple]:
        blocks = time_blocks(graph.blocks, cluster, precision, keep_replays)
        return blocks, (tuple(blocks), cache.objects_key(tuple(blocks.values())))

    if keep_replays:
        return timed()
    # perf: a block's timing reads its content, what the cost models read of the cluster and the
    # precision (blocks.py); shared (read-only) by the candidates that share the builder's blocks
    return cache.facts.get_or(("block timings", cache.object_key(graph.blocks), cache.timing_key(cluster), precision),
                              timed)


class _GraphFacts:
    """What the step reads of a graph alone: its task kinds (schedule.task_kinds), its stage groups
    (tails.StageGroups, the object the "stage groups" entry shares) and the graph's part of the keys of
    the entries below, built once. perf (i21s-step): a candidate on a known graph (a new network) makes
    one look-up here, where it made two and built six identity keys; the key parts are Signatures (their
    hash computed once: the plan's layer split is not hashed again per look-up)."""
    __slots__ = ("groups", "kinds", "kinds_key", "nic_key", "send_strides", "statics_key", "sync_key")

    def __init__(self, graph: StepGraph):
        plan = graph.plan
        self.kinds = kinds = task_kinds(plan)
        self.kinds_key = cache.object_key(kinds[0])
        # the pipeline sends' distinct strides, in the kinds' order (perf: no generators, ~9 resumptions)
        strides = dict.fromkeys([stride for _, stride in kinds[0]])
        strides.pop(None, None)
        self.send_strides = tuple(strides)
        self.groups = groups = _stage_groups_shared(graph)
        stages_key = cache.object_key(graph.stages)
        self.sync_key = cache.Signature((stages_key, plan.chunk_layers))
        self.nic_key = nic_key(graph, kinds)
        self.statics_key = statics_key(groups, plan)


def _graph_facts(graph: StepGraph) -> _GraphFacts:
    # perf: the graph is the cached one (read-only): its facts are looked up once per graph object
    return cache.facts.get_or(("step graph facts", cache.object_key(graph)), lambda: _GraphFacts(graph))


def replay_step(graph: StepGraph, cluster: ClusterSpec, precision: str, keep_block_replays: bool = False) -> StepReplay:
    blocks, blocks_key = _block_timings(graph, cluster, precision, keep_block_replays)
    plan = graph.plan
    pp, m = plan.pp, plan.num_microbatches
    facts = _graph_facts(graph)
    kinds = facts.kinds
    f_dur, b_dur, f_parts, b_parts, dur_layout = _task_parts(graph, blocks, blocks_key, cluster, facts)

    memo: dict = {}

    def t(op: Op) -> float:
        # perf: middle stages share their sync ops (builder.build_stages); time each object once
        key = id(op)
        if key not in memo:
            memo[key] = timed_s(op, cluster, precision)
        return memo[key]

    groups = facts.groups
    gather_events = [[] for _ in range(pp)] if keep_block_replays else None   # (name, start, end): the timeline's
    if keep_block_replays:
        f_release, gather_end = _sync_times(graph, groups, t, cluster, gather_events)[:2]
        sync_s = release_layout = None
    else:
        # perf: the sync collectives read the stage syncs, the plan's layer split and the network: shared
        # by the candidates whose configurations differ only in the global batch (evaluate._built shares
        # the stage syncs), read-only
        key = ("sync times", facts.sync_key, cache.network_key(cluster), precision)
        f_release, gather_end, *sync_s, release_layout = cache.facts.get_or(key, lambda: _sync_entry(graph, groups, t,
                                                                                                        cluster))
    summary = _summary_shared(plan, f_dur, b_dur, f_release, dur_layout, release_layout)
    # NIC shared by DP and backward traffic (contention.py)
    dp_rate = dp_nic_rate(graph, cluster, b_dur, t, precision, groups, kinds, facts.nic_key)
    tails = _tails(graph, cluster, precision, groups, summary, gather_end, t, blocks, gather_events, dp_rate=dp_rate,
                   blocks_key=blocks_key, sync_s=sync_s, graph_key=facts.statics_key)
    crit = int(tails.end.argmax())   # perf: the method, not np.argmax's dispatch (~1 us)
    breakdown = _breakdown(summary, m, tails, crit, f_parts, b_parts)
    return StepReplay(tails.end.item(crit), breakdown, crit, tails.end, blocks, tails, f_parts, b_parts, plan,
                      (f_dur, b_dur, f_release))


def _read_only(*arrays: np.ndarray) -> tuple:
    for a in arrays:
        a.flags.writeable = False
    return arrays


def _sync_entry(graph: StepGraph, groups, t, cluster: ClusterSpec) -> tuple:
    """_sync_times' arrays (read-only) and the releases in the task-level kernels' layout."""
    f_release, *rest = _read_only(*_sync_times(graph, groups, t, cluster))
    return (f_release, *rest, _release_layout(f_release))


# perf (i21s-step): the task-level kernels' layout of the durations and releases, and their bytes (the
# summary's key), built with the entries that hold the task durations and the releases, not per call:
# ~1.8 us of every candidate (a cheap search candidate's summary look-up: ~2.5 -> ~0.7 us on a hit)
def _durations_layout(f_dur: np.ndarray, b_dur: np.ndarray) -> tuple[np.ndarray, bytes]:
    """(stage, phase, chunk) durations, float64 and contiguous, and their bytes (one concatenate, not
    stack + astype). Shared: read-only by convention (left writable: the compiled task-level kernels are
    typed, and compiled, for a writable array here)."""
    dur = np.concatenate((f_dur, b_dur), axis=1, dtype=float).ravel()
    return dur, dur.tobytes()


def _release_layout(f_release: np.ndarray) -> tuple[np.ndarray, bytes]:
    """(stage, chunk) releases, float64 and contiguous, and their bytes."""
    release = np.ascontiguousarray(f_release, dtype=float).ravel()
    return release, release.tobytes()


def _summary_shared(plan, f_dur: np.ndarray, b_dur: np.ndarray, f_release: np.ndarray,
                    dur_layout: tuple | None = None, release_layout: tuple | None = None) -> PipelineSummary:
    """The task level's per-stage figures, shared by candidates whose task durations and releases are
    equal bit for bit (clusters that differ in HBM, prices, or a part of the network that no task, send or
    early parameter gather crosses): the summary reads nothing else (pipeline.summarize).
    `dur_layout`, `release_layout`: _durations_layout(f_dur, b_dur) and _release_layout(f_release),
    where the caller has them."""
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    dur, dur_bits = dur_layout or _durations_layout(f_dur, b_dur)
    release, release_bits = release_layout or _release_layout(f_release)

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


def _breakdown(summary: PipelineSummary, m: int, tails: StageTails, s: int, f_parts, b_parts) -> dict:
    """Where stage s's time went; the values add up to its end time. Every stage runs each chunk's
    forward and backward once per micro-batch, so task parts are counted (m times), not visited.
    perf (i21s-step): the tail's figures read from its arrays with item() (no StageTail built: ~1 us)."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    out["exposed_dp"] += summary.gather_wait.item(s)
    out["pipeline_bubble"] += summary.bubble.item(s)
    for k, v in f_parts.stage_items(b_parts, s):
        out[k] += m * v
    partner_wait = tails.partner_wait.item(s)
    out["pipeline_bubble"] += partner_wait
    out["exposed_dp"] += tails.optimizer_start.item(s) - summary.compute_end.item(s) - partner_wait
    out["optimizer"] += tails.adam.item(s)
    out["offload"] += tails.offload.item(s)
    out["exposed_dp"] += tails.end.item(s) - tails.optimizer_end.item(s)
    return out
