"""Per-rank communication volume of a StepGraph over one step, by process-group kind: the sum of
msg_bytes (NCCL's per-rank buffer size; p2p bytes sent) of every op a rank of pipeline stage `stage`
runs: each block's ops times the block's occurrences on that stage, the pipeline sends, and the
stage's once-per-step ops. Used to check transformations against Megatron's analytical volumes."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from comet.graph.ir import GroupKind, StepGraph
from comet.replay.schedule import block_occurrences


def _block_bytes(g: nx.DiGraph) -> dict[GroupKind, float]:
    out: dict = defaultdict(float)
    for _, op in g.nodes(data="op"):
        if op.is_comm and op.group_kind is not None:
            out[op.group_kind] += op.msg_bytes
    return out


def comm_volume(graph: StepGraph, stage: int = 0) -> dict[GroupKind, float]:
    plan = graph.plan
    out: dict = defaultdict(float)
    for key, count in block_occurrences(plan, stage).items():
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
