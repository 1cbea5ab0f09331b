"""Per-rank communication volume of a StepGraph over one step, by process-group kind: the sum of
msg_bytes (NCCL's per-rank buffer size; p2p bytes sent) of every op a rank of pipeline stage `stage`
runs: each block's ops times the block's occurrences on that stage, the pipeline sends, and the
stage's once-per-step ops. Used to check transformations against Megatron's analytical volumes."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from comet.graph.ir import GroupKind, StepGraph


def _block_bytes(g: nx.DiGraph) -> dict[GroupKind, float]:
    out: dict = defaultdict(float)
    for _, op in g.nodes(data="op"):
        if op.is_comm and op.group_kind is not None:
            out[op.group_kind] += op.msg_bytes
    return out


def block_occurrences(graph: StepGraph, stage: int) -> dict[str, int]:
    """How many times each block runs on `stage` in one step."""
    plan = graph.plan
    m, pp, last = plan.num_microbatches, plan.pp, plan.num_chunks - 1
    n: dict = defaultdict(int)
    for c in range(plan.vpp):
        vs = c * pp + stage
        n["layer.fwd"] += plan.chunk_layers[vs] * m
        n["layer.bwd"] += plan.chunk_layers[vs] * m
        n["layer.recompute"] += plan.recompute_layers * m
        if vs == 0:
            n["embedding.fwd"] += m
            n["embedding.bwd"] += m
        if vs == last:
            n["head.fwd"] += m
            n["head.bwd"] += m
    return n


def comm_volume(graph: StepGraph, stage: int = 0) -> dict[GroupKind, float]:
    plan = graph.plan
    out: dict = defaultdict(float)
    for key, count in block_occurrences(graph, stage).items():
        for kind, b in _block_bytes(graph.blocks[key]).items():
            out[kind] += count * b
    for c in range(plan.vpp):      # activation forward to the next virtual stage, gradient back
        vs = c * plan.pp + stage
        sends = (vs != plan.num_chunks - 1) + (vs != 0)
        out[GroupKind.PP] += sends * plan.p2p_bytes * plan.num_microbatches
    st = graph.stages[stage]
    for bs in st.grad_buckets + st.param_gathers:
        out[bs.op.group_kind] += bs.count * bs.op.msg_bytes
    if st.embedding_sync is not None:
        out[GroupKind.EMBEDDING] += st.embedding_sync.msg_bytes
    return dict(out)
