"""materialize(): give every op of a graph a duration from the cost model, so that a graph built by
comet behaves like a measured trace (transformations then carry durations over by ratio, exactly as
they carry measured ones). Ops that already have a duration (measured) keep it."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.config.parallel import Precision
from comet.errors import GraphError
from comet.graph.ir import BucketSet, Op, StageSync, StepGraph
from comet.replay.timing import op_time_s


def _timed(op: Op, cluster: ClusterSpec, precision: str) -> Op:
    if op.duration_s is not None:
        return op
    return op.with_(duration_s=op_time_s(op, cluster, precision))


def materialize_ops(g: nx.DiGraph, cluster: ClusterSpec, precision: str) -> nx.DiGraph:
    """Copy of flat op graph g with a duration on every op."""
    out = g.copy()
    for nid, op in g.nodes(data="op"):
        out.nodes[nid]["op"] = _timed(op, cluster, precision)
    return out


def map_ops(graph: StepGraph, fn: Callable[[str, Op], Op]) -> StepGraph:
    """A copy of `graph` with fn(block_key, op) applied to every op of every block and fn("stage", op) to every
    stage-sync op (gradient buckets, parameter gathers, embedding sync, optimizer). Middle stages share one
    StageSync object; the copy keeps them shared (and calls fn once per shared object)."""
    blocks = {}
    for key, g in graph.blocks.items():
        out = g.copy()
        for nid, op in g.nodes(data="op"):
            out.nodes[nid]["op"] = fn(key, op)
        blocks[key] = out

    def stage_op(op: Op) -> Op:
        return fn("stage", op)

    def buckets(bs: tuple[BucketSet, ...]) -> tuple[BucketSet, ...]:
        return tuple(replace(b, op=stage_op(b.op)) for b in bs)

    memo: dict[int, StageSync] = {}
    for st in graph.stages:   # perf: middle stages share one object; keep them shared
        if id(st) not in memo:
            memo[id(st)] = replace(st, grad_buckets=buckets(st.grad_buckets), param_gathers=buckets(st.param_gathers),
                                   embedding_sync=None if st.embedding_sync is None else stage_op(st.embedding_sync),
                                   optimizer=tuple(stage_op(op) for op in st.optimizer))
    return graph.with_(blocks=blocks, stages=tuple(memo[id(st)] for st in graph.stages))


def _precision_of(graph, precision) -> str:
    if precision is not None:
        return Precision(precision).value if not isinstance(precision, Precision) else precision.value
    par = graph.meta.get("parallel") if isinstance(graph, StepGraph) else None
    if par is None:
        raise GraphError("materialize: give the precision (the graph's meta has no 'parallel' configuration)")
    return par.precision.value


def materialize(graph: StepGraph | nx.DiGraph, cluster: ClusterSpec, precision: str | Precision | None = None):
    """A new graph with duration_s set on every op of every block (and every stage sync op) from the cost
    model on `cluster`; records meta['cluster'] and meta['precision'] for later re-timing."""
    if isinstance(graph, nx.DiGraph):
        if precision is None:
            raise GraphError("materialize: a flat op graph needs the precision it runs at")
        out = materialize_ops(graph, cluster, _precision_of(graph, precision))
        out.graph.update(cluster=cluster, precision=_precision_of(graph, precision))
        return out
    if not isinstance(graph, StepGraph):
        raise GraphError(f"materialize: expected a StepGraph or an op graph, got {type(graph).__name__}")
    prec = _precision_of(graph, precision)
    out = map_ops(graph, lambda _block, op: _timed(op, cluster, prec))
    return out.with_(meta=dict(graph.meta, cluster=cluster, precision=prec))
