"""Compile a flat op graph into arrays for the replay hot loop (networkx stays outside the loop)."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from comet.graph.block import block_lists
from comet.graph.ir import Op, OpKind, check_acyclic


@dataclass(frozen=True)
class CompiledGraph:
    node_ids: list            # index -> original node id
    ops: list[Op]             # index -> Op
    resource: list[int]       # index -> (rank, stream) resource number
    resources: list[tuple]    # resource number -> (rank, stream)
    rank: list[int]           # index -> rank
    is_compute: list[bool]    # GPU compute kernel (slowed while communication is in flight)
    is_comm: list[bool]       # collective / send / recv (transfers on the network)
    preds: list[list[tuple[int, float]]]   # index -> [(pred index, delay_s)]
    succs: list[list[tuple[int, float]]]   # index -> [(succ index, delay_s)]
    match: list[tuple[int, ...] | None]    # index -> all members of its comm_id group (None: not matched)
    topo: list[int]           # index -> position in a deterministic topological order

    def __len__(self) -> int:
        return len(self.ops)


def compile_graph(g: nx.DiGraph, where: str = "graph") -> CompiledGraph:
    """Index nodes in insertion order; resources are (rank, stream); matched comm ops grouped by comm_id."""
    lists = block_lists(g)
    if lists is not None:
        # perf: a built block's own lists (graph/block.py); its edges all run forward, none is delayed
        ops, edges = lists
        return _compiled(list(range(len(ops))), ops, [(u, v, 0.0) for u, v, _ in edges], None)
    node_ids = list(g.nodes)
    index = {nid: i for i, nid in enumerate(node_ids)}
    edges = [(index[u], index[v], float(d.get("delay_s", 0.0))) for u, v, d in g.edges(data=True)]

    def topological() -> list[int]:
        check_acyclic(g, where)
        return [index[nid] for nid in nx.lexicographical_topological_sort(g, key=lambda n: index[n])]

    return _compiled(node_ids, [g.nodes[nid]["op"] for nid in node_ids], edges, topological)


def _compiled(node_ids: list, ops: list[Op], edges: list[tuple[int, int, float]], topological) -> CompiledGraph:
    """`edges`: (u, v, delay) by index in the graph's edge order; `topological()`: the lexicographically
    smallest topological order, asked for only when some edge runs backwards."""
    res_of: dict[tuple, int] = {}
    resource = [res_of.setdefault((op.rank, op.stream), len(res_of)) for op in ops]
    preds: list[list[tuple[int, float]]] = [[] for _ in node_ids]
    succs: list[list[tuple[int, float]]] = [[] for _ in node_ids]
    forward_only = True           # every edge from an earlier to a later node
    for iu, iv, d in edges:
        preds[iv].append((iu, d))
        succs[iu].append((iv, d))
        forward_only = forward_only and iu < iv
    groups: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if op.comm_id is not None:
            groups.setdefault(op.comm_id, []).append(i)
    match: list[tuple[int, ...] | None] = [None] * len(ops)
    for members in groups.values():
        if len(members) > 1:
            t = tuple(members)
            for i in members:
                match[i] = t
    if forward_only:
        # perf: insertion order is then a topological order (no cycle possible), and it is the
        # lexicographically smallest one: the earliest node is always ready when its turn comes
        topo = list(range(len(ops)))
    else:
        topo = [0] * len(ops)
        for pos, i in enumerate(topological()):
            topo[i] = pos
    comm_kinds = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
    return CompiledGraph(
        node_ids=node_ids, ops=ops, resource=resource, resources=list(res_of), rank=[op.rank for op in ops],
        is_compute=[op.kind is OpKind.COMPUTE for op in ops], is_comm=[op.kind in comm_kinds for op in ops],
        preds=preds, succs=succs, match=match, topo=topo)
