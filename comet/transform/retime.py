"""The machinery every transformation shares: read a StepGraph's configuration, re-time an op by the
cost model's ratio, and carry a block's measured ops over to the block of another configuration.

Re-timing rule (design.md "Transform, then replay"): an op the transformation changes gets
    new_duration = measured_duration * cost(new op, new cluster) / cost(old op, old cluster),
so a calibration error of the cost model on that kind of op cancels; an op it does not change keeps
its measured duration exactly. An op with no counterpart in the base graph (a structural change adds
it) is timed by the cost model on the graph's cluster, or left to the replay (duration None) when the
graph was never materialized.

Carrying a block over (`carry_block`): the target block's ops and dependencies are those the builder
(comet/workload/layers.py) emits for the target configuration; each is matched by role (op name and
occurrence) to the base block and takes that op's measured duration, re-timed. Base ops the builder
does not emit for the base configuration ("foreign" ops, e.g. extra kernels of an annotated trace) are
kept with their duration and their dependencies on the ops that remain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.errors import GraphError
from comet.graph.ir import KernelClass, Op, OpKind, StepGraph
from comet.replay.timing import op_time_s

# Fields that decide an op's cost; an op whose fields all match its counterpart is "not touched".
_PHYSICS = ("kind", "stream", "kernel", "flops", "bytes", "shape", "dtype_bytes", "collective", "msg_bytes",
            "group_size", "group_stride", "flat_ring", "group_kind", "phase")
_INDEX = re.compile(r"\[[^\]]*\]$")


@dataclass(frozen=True)
class Timing:
    """Where the durations come from (old) and where they go (new). cluster None: not materialized."""
    old_cluster: ClusterSpec | None
    old_precision: str
    new_cluster: ClusterSpec | None
    new_precision: str

    def __post_init__(self):
        # perf: compare the clusters once (a deep dataclass comparison), not per op
        same = self.old_cluster is self.new_cluster or self.old_cluster == self.new_cluster
        object.__setattr__(self, "same_cluster", same)

    def touches(self, op: Op) -> bool:
        """Whether the hardware / precision change alters this op's cost: the precision only matters
        for GEMMs (comet/hardware/compute.py: attention and memory-bound kernels stay 16-bit)."""
        if not self.same_cluster:
            return True
        return self.old_precision != self.new_precision and op.kernel is KernelClass.GEMM

    def fresh_s(self, op: Op) -> float | None:
        """Duration of an op with no measured counterpart: the cost model, if the graph is timed."""
        return None if self.new_cluster is None else op_time_s(op, self.new_cluster, self.new_precision)

    def retime_s(self, src: Op, new: Op, same_physics: bool) -> float | None:
        """src's measured duration carried to `new` by the cost-model ratio."""
        if src.duration_s is None:
            return None
        if (same_physics and not self.touches(src)) or measured_only(src):
            return src.duration_s
        if self.old_cluster is None or self.new_cluster is None:
            raise GraphError(f"op {src.name!r} has a measured duration but the graph records no cluster to "
                             "re-time it against: materialize() the graph or set meta['cluster']")
        old = op_time_s(src, self.old_cluster, self.old_precision)
        nw = op_time_s(new, self.new_cluster, self.new_precision)
        if old > 0:
            return src.duration_s * nw / old
        # No model time for the source (e.g. a collective without a size, a host copy): no ratio can be
        # formed, so the measurement stands, unless there was nothing measured to carry over.
        return src.duration_s if src.duration_s > 0 else nw


def measured_only(op: Op) -> bool:
    """Ops the cost model cannot time from their fields (it returns their measured duration)."""
    return op.kind is OpKind.CPU or (op.kind is OpKind.COMPUTE and op.kernel is KernelClass.OTHER)


# ------------------------------------------------------------------------------------ configuration
def graph_config(graph: StepGraph) -> tuple[ModelSpec, ParallelConfig]:
    """The (model, resolved parallel configuration) a StepGraph stands for, from its meta."""
    if not isinstance(graph, StepGraph):
        raise GraphError(f"expected a StepGraph, got {type(graph).__name__}: this transformation needs layer "
                         "annotations (blocks and a pipeline plan) that a flat op graph does not have")
    meta = graph.meta or {}
    model, par = meta.get("model"), meta.get("parallel")
    if not isinstance(model, ModelSpec):
        raise GraphError("StepGraph.meta['model'] must be the ModelSpec the graph was built for "
                         f"(got {type(model).__name__}); build it with comet.workload.builder.build_step_graph")
    if not isinstance(par, ParallelConfig) or par.dp is None or par.gpus is None:
        raise GraphError("StepGraph.meta['parallel'] must be the resolved ParallelConfig the graph was built for "
                         f"(got {par!r:.80})")
    return model, par


def graph_timing(graph: StepGraph, par: ParallelConfig) -> tuple[ClusterSpec | None, str]:
    """The cluster and precision the graph's durations were measured / modelled on (None: untimed)."""
    meta = graph.meta or {}
    cluster = meta.get("cluster")
    if cluster is not None and not isinstance(cluster, ClusterSpec):
        raise GraphError(f"StepGraph.meta['cluster'] must be a ClusterSpec, got {type(cluster).__name__}")
    return cluster, str(meta.get("precision", par.precision.value))


# ------------------------------------------------------------------------------------ ops
def same_physics(a: Op, b: Op) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in _PHYSICS)


def carry_op(src: Op | None, tpl: Op, timing: Timing) -> Op:
    """The target op `tpl` (from the builder) with src's identity and measured duration re-timed."""
    if src is None:
        return tpl.with_(duration_s=timing.fresh_s(tpl))
    same = same_physics(src, tpl)
    if same and src.name == tpl.name and not timing.touches(src):
        return src                                        # not touched: keep the op as it is
    # perf: the cost of the new op is the cost of tpl (same physics fields): one copy per op, not two
    keep_start = same and not timing.touches(src)
    return tpl.with_(rank=src.rank, comm_id=src.comm_id, layer=src.layer, microbatch=src.microbatch,
                     start_s=src.start_s if keep_start else None, duration_s=timing.retime_s(src, tpl, same))


def _keyed(g: nx.DiGraph) -> dict[tuple[str, int], tuple[object, Op]]:
    """(name, occurrence) -> (node id, op), in node order."""
    seen: dict[str, int] = {}
    out = {}
    for nid, op in g.nodes(data="op"):
        k = seen.get(op.name, 0)
        seen[op.name] = k + 1
        out[(op.name, k)] = (nid, op)
    return out


class _Index:
    """Counterparts of target ops among one or more base blocks: by (name, occurrence), then by the
    name without a trailing [index] (ring-attention steps, split TP-overlap chunks) of the same kind."""

    def __init__(self, *blocks: nx.DiGraph):
        self.exact: dict = {}
        self.stripped: dict = {}
        for g in blocks:
            for key, (_, op) in _keyed(g).items():
                self.exact.setdefault(key, op)
                self.stripped.setdefault(_INDEX.sub("", op.name), op)

    def find(self, key: tuple[str, int], tpl: Op) -> Op | None:
        op = self.exact.get(key)
        if op is None:
            op = self.stripped.get(_INDEX.sub("", key[0]))
            if op is not None and (op.kind is not tpl.kind or op.kernel is not tpl.kernel):
                op = None
        return op


def carry_block(base: nx.DiGraph, old_tpl: nx.DiGraph, new_tpl: nx.DiGraph, timing: Timing,
                fallback: nx.DiGraph | None = None) -> nx.DiGraph:
    """A new block with new_tpl's ops and edges, each op carrying its base counterpart's duration.
    `fallback`: a second base block to look counterparts up in (the forward, for a recompute block)."""
    index = _Index(base, fallback) if fallback is not None else _Index(base)
    g = nx.DiGraph()
    g.graph.update(base.graph)
    for key, (nid, tpl) in _keyed(new_tpl).items():
        g.add_node(nid, op=carry_op(index.find(key, tpl), tpl, timing))
    g.add_edges_from(new_tpl.edges(data=True))
    _keep_foreign(g, base, old_tpl)
    return g


def _keep_foreign(g: nx.DiGraph, base: nx.DiGraph, old_tpl: nx.DiGraph) -> None:
    """Base ops the builder does not emit for the base configuration: kept, with their edges to ops
    that are still there (matched by role), dependencies through removed ops bridged."""
    known = {key for key in _keyed(old_tpl)}
    base_keys = _keyed(base)
    foreign = {nid for key, (nid, _) in base_keys.items() if key not in known}
    if not foreign:
        return
    new_of = {}                                  # base node id -> node id in g
    target = {key: nid for key, (nid, _) in _keyed(g).items()}
    for key, (nid, op) in base_keys.items():
        if nid in foreign:
            new_of[nid] = ("foreign", nid)
            g.add_node(new_of[nid], op=op)
        elif key in target:
            new_of[nid] = target[key]
    for u in foreign:
        for v in _reach(base, u, new_of, forward=True):
            g.add_edge(new_of[u], new_of[v], **base.edges[u, v] if base.has_edge(u, v) else {"dep": "data"})
        for v in _reach(base, u, new_of, forward=False):
            g.add_edge(new_of[v], new_of[u], **base.edges[v, u] if base.has_edge(v, u) else {"dep": "data"})
    if not nx.is_directed_acyclic_graph(g):
        raise GraphError("keeping the base graph's unannotated ops creates a dependency cycle in the "
                         "transformed block; the block's op names do not follow the builder's roles")


def _reach(g: nx.DiGraph, u, kept: dict, forward: bool) -> set:
    """Nearest kept successors (predecessors) of u, walking through removed ops."""
    out, stack, seen = set(), list(g.successors(u) if forward else g.predecessors(u)), set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in kept:
            out.add(v)
        else:
            stack.extend(g.successors(v) if forward else g.predecessors(v))
    return out


def retime_graph_ops(g: nx.DiGraph, timing: Timing, change=None, shapeless=None) -> nx.DiGraph:
    """Copy of flat op graph g with its ops re-timed for `timing`. change(op) -> the changed op (or op
    itself); shapeless(op) -> duration ratio for a measured kernel the cost model cannot time (no shape),
    or None to leave it as it is."""
    out = g.copy()
    for nid, op in g.nodes(data="op"):
        new = change(op) if change is not None else op
        if new is op and not timing.touches(op) and shapeless is None:
            continue
        if shapeless is not None and op.kind is OpKind.COMPUTE and op.kernel is KernelClass.OTHER \
                and op.duration_s is not None:
            ratio = shapeless(op)
            if ratio is not None and ratio != 1.0:
                out.nodes[nid]["op"] = new.with_(duration_s=op.duration_s * ratio, start_s=None)
            continue
        if new is op and not timing.touches(op):
            continue
        out.nodes[nid]["op"] = new.with_(duration_s=timing.retime_s(op, new, new is op), start_s=None)
    return out


def flat_timing(g: nx.DiGraph, cluster: ClusterSpec | None, precision: str | None, what: str) -> tuple:
    """(cluster, precision) a flat op graph was measured on: g.graph['cluster'] / ['precision'] (set by
    materialize) or the arguments."""
    old = g.graph.get("cluster", cluster)
    if not isinstance(old, ClusterSpec):
        raise GraphError(f"{what}: give the cluster the op graph was measured on (graph attribute 'cluster' "
                         "is not set)")
    return old, str(g.graph.get("precision", precision or "bf16"))
