"""Target-hardware transformation: every op re-timed by cost(new cluster) / cost(old cluster), so the
measured durations carry their calibration over to the new GPU and network.

Ops the cost model can time from their fields (GEMMs and attention with a shape, memory-bound kernels
with bytes, collectives and transfers with a message size and group) use that ratio. A measured
compute kernel with nothing but a name (profiler traces) is re-timed by a class ratio: GEMM kernels by
the ratio of a large square GEMM (8192^3) on the two GPUs, every other kernel as memory-bound (the
ratio of achieved HBM bandwidth). CPU ops keep their duration."""

from __future__ import annotations

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.errors import GraphError
from comet.graph.ir import Op, StepGraph
from comet.hardware.compute import gemm_time_s, memory_time_s
from comet.transform.precision import GEMM_KERNEL_NAME, REFERENCE_GEMM
from comet.transform.retarget import retarget
from comet.transform.retime import Timing, flat_timing, graph_config, retime_graph_ops

_REFERENCE_BYTES = 1e9   # a large memory-bound kernel: launch overhead negligible


def with_hardware(graph, cluster: ClusterSpec, *, old_cluster: ClusterSpec | None = None,
                  precision: str | None = None):
    """The graph on `cluster`. A StepGraph must record the cluster its durations belong to
    (meta['cluster'], set by materialize); a flat op graph records it in graph attribute 'cluster' or
    takes it as `old_cluster` (with `precision`, default bf16)."""
    if not isinstance(cluster, ClusterSpec):
        raise GraphError(f"with_hardware: cluster must be a ClusterSpec, got {type(cluster).__name__}")
    if isinstance(graph, StepGraph):
        model, par = graph_config(graph)
        if graph.meta.get("cluster") is None and old_cluster is not None:
            graph = graph.with_(meta=dict(graph.meta, cluster=old_cluster))
        return retarget(graph, model, par, cluster, what=f"hardware={cluster.name}")
    if not isinstance(graph, nx.DiGraph):
        raise GraphError(f"with_hardware: expected a StepGraph or an op graph, got {type(graph).__name__}")
    old, prec = flat_timing(graph, old_cluster, precision, "with_hardware")
    n = REFERENCE_GEMM
    gemm_ratio = gemm_time_s(n, n, n, cluster, prec) / gemm_time_s(n, n, n, old, prec)
    mem_ratio = memory_time_s(_REFERENCE_BYTES, cluster) / memory_time_s(_REFERENCE_BYTES, old)

    def shapeless(op: Op) -> float:
        return gemm_ratio if GEMM_KERNEL_NAME.search(op.name) else mem_ratio

    out = retime_graph_ops(graph, Timing(old, prec, cluster, prec), None, shapeless)
    out.graph.update(cluster=cluster, precision=prec,
                     transforms=tuple(graph.graph.get("transforms", ())) + (f"hardware={cluster.name}",))
    return out
