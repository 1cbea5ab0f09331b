"""Precision transformation: BF16 <-> FP8 GEMMs (Transformer Engine keeps attention, norms and the
other element-wise kernels in 16-bit; comet/hardware/compute.py). Each GEMM is re-timed by the cost
model's ratio at the new and old precision (its operands shrink to 1 byte under FP8); every other op
keeps its duration.

On a flat op graph, GEMMs with a shape are re-timed the same way; a measured GEMM kernel without a
shape (a profiler trace: the kernel name is all there is) is re-timed by the ratio of a large square
GEMM (8192^3) at the two precisions, i.e. the ratio of achieved large-GEMM throughput."""

from __future__ import annotations

import re

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.config.parallel import Precision
from comet.errors import GraphError
from comet.graph.ir import KernelClass, Op, StepGraph
from comet.hardware.compute import gemm_time_s
from comet.transform.retarget import apply_changes, enum_value
from comet.transform.retime import Timing, flat_timing, retime_graph_ops

# cuBLAS / CUTLASS / cuBLASLt (nvjet) GEMM kernel names as the PyTorch profiler records them.
GEMM_KERNEL_NAME = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul", re.IGNORECASE)
REFERENCE_GEMM = 8192   # a large square GEMM: the efficiency plateau of both precisions


def with_precision(graph, precision: str | Precision, *, cluster: ClusterSpec | None = None):
    """GEMM precision `precision` (bf16, fp16 or fp8). On a flat op graph `cluster` is the one it was
    measured on when the graph does not record it (graph attribute 'cluster')."""
    prec = enum_value(Precision, precision, "precision")
    if isinstance(graph, StepGraph):
        return apply_changes(graph, f"precision={prec.value}", precision=prec)
    if not isinstance(graph, nx.DiGraph):
        raise GraphError(f"with_precision: expected a StepGraph or an op graph, got {type(graph).__name__}")
    old, old_prec = flat_timing(graph, cluster, None, "with_precision")
    new_prec = prec.value
    fp8 = prec is Precision.FP8

    def change(op: Op) -> Op:
        if op.kernel is not KernelClass.GEMM:
            return op
        batch = op.shape[3] if len(op.shape) > 3 else 1
        dtype = 1 if fp8 and batch == 1 else 2        # as comet/workload/block_builder.py BlockBuilder.gemm
        return op if dtype == op.dtype_bytes else op.with_(dtype_bytes=dtype)

    n = REFERENCE_GEMM
    ratio = gemm_time_s(n, n, n, old, new_prec) / gemm_time_s(n, n, n, old, old_prec)

    def shapeless(op: Op) -> float | None:
        return ratio if GEMM_KERNEL_NAME.search(op.name) else None

    out = retime_graph_ops(graph, Timing(old, old_prec, old, new_prec), change, shapeless)
    out.graph.update(precision=new_prec, transforms=tuple(graph.graph.get("transforms", ())) + (f"precision={new_prec}",))
    return out
