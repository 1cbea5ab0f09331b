"""Parallel-degree transformations: tensor (with sequence parallelism), context and data parallelism,
and the ZeRO stage. Each is a pure function StepGraph -> StepGraph (comet/transform/retarget.py does
the carrying); `with_dp` also applies to a flat op graph, where it re-sizes and re-times the
collectives of the data-parallel group.

What changes (Megatron-LM rules, as comet/workload/layers.py builds them):
- tp: GEMM n or k dimensions and attention heads divide by tp; TP all-reduces (no SP) or all-gathers /
  reduce-scatters (SP) are re-sized and appear (tp 1 -> 2) or disappear (tp 2 -> 1); the gradient
  buckets shrink with the per-GPU parameters; the pipeline message shrinks by 1/tp.
- cp: tokens per rank divide by cp; ring-attention steps and K/V exchanges appear or disappear.
- dp: the DP group of the gradient buckets (and ZeRO collectives) is re-sized and re-timed; at a fixed
  global batch the number of micro-batches per pipeline changes.
- zero: reduce-scatter + all-gather (stage >= 1) instead of all-reduce; stage 3 gathers weights per layer.
The other degrees stay as they are; the GPU count follows (tp * pp * dp * cp).
"""

from __future__ import annotations

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.errors import GraphError
from comet.graph.ir import GroupKind, Op, OpKind, StepGraph
from comet.transform.retarget import apply_changes
from comet.transform.retime import Timing, flat_timing, retime_graph_ops


def with_tp(graph: StepGraph, tp: int, sequence_parallel: bool | None = None) -> StepGraph:
    """Tensor-parallel degree `tp`; sequence parallelism on whenever tp > 1 unless given."""
    return apply_changes(graph, f"tp={tp}", tp=tp, sequence_parallel=sequence_parallel)


def with_cp(graph: StepGraph, cp: int) -> StepGraph:
    return apply_changes(graph, f"cp={cp}", cp=cp)


def with_zero(graph: StepGraph, zero: int) -> StepGraph:
    return apply_changes(graph, f"zero={zero}", zero=zero)


def with_dp(graph, dp: int, *, cluster: ClusterSpec | None = None, precision: str | None = None,
            groups: tuple[str, ...] = ()):
    """Data-parallel degree `dp`. On a StepGraph: the whole configuration follows (buckets, micro-batch
    count). On a flat op graph: every collective of the DP group (group_kind DP, or a process-group name
    in `groups`) gets group_size = dp and is re-timed by the cost model's ratio; `cluster` is the one the
    graph was measured on when the graph does not record it (graph attribute 'cluster')."""
    if isinstance(graph, StepGraph):
        return apply_changes(graph, f"dp={dp}", dp=dp)
    if not isinstance(graph, nx.DiGraph):
        raise GraphError(f"with_dp: expected a StepGraph or an op graph, got {type(graph).__name__}")
    if dp < 1:
        raise GraphError(f"with_dp: dp must be >= 1, got {dp}")
    old, prec = flat_timing(graph, cluster, precision, "with_dp")
    names = set(groups)

    def change(op: Op) -> Op:
        in_dp = op.group_kind is GroupKind.DP or (op.group is not None and op.group in names)
        if op.kind is not OpKind.COLLECTIVE or not in_dp or op.group_size == dp:
            return op
        return op.with_(group_size=dp)

    out = retime_graph_ops(graph, Timing(old, prec, old, prec), change)
    out.graph["transforms"] = tuple(graph.graph.get("transforms", ())) + (f"dp={dp}",)
    return out
