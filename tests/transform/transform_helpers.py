"""Helpers of the transformation tests: configurations, materialized bases, graph comparison."""

from dataclasses import replace

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.graph.ir import StepGraph
from comet.transform import materialize
from comet.workload.builder import build_step_graph


def config(**kw) -> ParallelConfig:
    """A ParallelConfig with dp given (default 1) and a global batch of 32 unless said otherwise."""
    kw.setdefault("dp", 1)
    kw.setdefault("global_batch", 32)
    return ParallelConfig(**kw)


def resolved(model: ModelSpec, **kw) -> ParallelConfig:
    return config(**kw).resolve(model)


def base_graph(model: ModelSpec, cluster, **kw) -> StepGraph:
    return materialize(build_step_graph(model, resolved(model, **kw)), cluster)


def block_signature(g):
    """Everything about a block graph: ops in node order and edges with their data."""
    return ([(nid, op) for nid, op in g.nodes(data="op")], sorted((u, v, tuple(sorted(d.items())))
                                                                  for u, v, d in g.edges(data=True)))


def graph_signature(graph: StepGraph, with_durations: bool = True):
    def strip(sig):
        ops, edges = sig
        if not with_durations:
            ops = [(nid, replace(op, duration_s=None)) for nid, op in ops]
        return ops, edges
    return ({k: strip(block_signature(g)) for k, g in sorted(graph.blocks.items())}, graph.plan,
            graph.stages if with_durations else None)
