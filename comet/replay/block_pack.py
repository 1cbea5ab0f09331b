"""A block packed into arrays, the form the compiled engine (block_kernel.py) replays.

`pack` turns a compiled graph into one int64 array (per op: resource, dense rank, flags, topological
position, in-degree, exposure category, matched group; successor offsets and indices in edge order;
group members) and one float array of edge delays; `pack_block` builds the same arrays straight from
a built Block's lists, and `pack_rows` from its op table (graph/op_table.py) in compiled code
(tests/replay/test_block_kernel.py: all equal on every block of every shipped model).
"""

from __future__ import annotations

import numpy as np

from comet.graph.block import block_lists
from comet.graph.ir import GroupKind, OpKind
from comet.graph.op_table import (GEMM_WIDTH, GROUP_CODES, GROUPS_PER_KIND, HEADER, KIND_CODES, KIND_GROUP, N_EDGES,
                                  N_GEMMS, N_OPS, PLACE, ROW_WIDTH, STREAMS_PER_RANK)
from comet.replay.block_exposure import CATEGORY_OF_GROUP, COMPUTE, MEMCPY
from comet.replay.compile import CompiledGraph, compile_graph
from comet.replay.kernels import njit

STRUCTURE_HEADER = 6     # the packed structure's header: n, edges, groups, group members, resources, ranks


def pack(cg: CompiledGraph) -> tuple[np.ndarray, np.ndarray]:
    """(structure, edge delays) of a compiled graph. structure: header, then per op resource, dense
    rank, flags (1 compute, 2 communication), topological position, in-degree, exposure category
    (-1: none), matched group (-1: none); successor offsets (n + 1) and indices in the graph's edge
    order; group offsets and members."""
    n = len(cg)
    rank_of: dict = {}
    rank = [rank_of.setdefault(r, len(rank_of)) for r in cg.rank]
    flags = [int(c) | (2 * int(m)) for c, m in zip(cg.is_compute, cg.is_comm)]
    group_of: dict = {}
    group = [-1 if t is None else group_of.setdefault(id(t), (len(group_of), t))[0] for t in cg.match]
    members = [m for _, t in group_of.values() for m in t]
    group_ptr = np.cumsum([0] + [len(t) for _, t in group_of.values()]).tolist()
    succ_idx = [v for s in cg.succs for v, _ in s]
    succ_ptr = np.cumsum([0] + [len(s) for s in cg.succs]).tolist()
    head = [n, len(succ_idx), len(group_of), len(members), len(cg.resources), len(rank_of)]
    structure = np.array(head + cg.resource + rank + flags + cg.topo + [len(p) for p in cg.preds]
                         + [_category(op) for op in cg.ops] + group + succ_ptr + succ_idx + group_ptr + members,
                         dtype=np.int64)
    return structure, np.array([d for s in cg.succs for _, d in s], dtype=np.float64)


def pack_graph(g) -> tuple[np.ndarray, np.ndarray]:
    """pack(compile_graph(g)), straight from the lists of a built block where it can."""
    lists = block_lists(g)
    packed = pack_block(*lists) if lists is not None else None
    return packed if packed is not None else pack(compile_graph(g))


def pack_block(ops: list, edges: list) -> tuple[np.ndarray, np.ndarray] | None:
    """pack(compile_graph(block)) from a built block's lists (graph/block.py) without the CompiledGraph:
    its edges run forward, sorted by source, none delayed; None when ops are matched across streams
    (comm_id), which pack() handles."""
    n = len(ops)
    res_of: dict = {}
    rank_of: dict = {}
    resource, rank, flags, cat = [], [], [], []
    for op in ops:
        if op.comm_id is not None:
            return None
        r = op.rank
        resource.append(res_of.setdefault((r, op.stream), len(res_of)))
        rank.append(rank_of.setdefault(r, len(rank_of)))
        f, c = _FLAGS_CATEGORY[op.kind, op.group_kind]
        flags.append(f)
        cat.append(c)
    indeg = [0] * n
    succ_end = [0] * (n + 1)          # edges are sorted by source: offsets from counts
    targets = []
    for u, v, _ in edges:
        indeg[v] += 1
        succ_end[u + 1] += 1
        targets.append(v)
    total = 0
    for i in range(n + 1):
        total += succ_end[i]
        succ_end[i] = total
    # perf: one list, one conversion (small numpy calls cost a microsecond each); unpacked into one
    # display instead of concatenating twelve lists (~15% of this function)
    structure = np.array([n, len(edges), 0, 0, len(res_of), len(rank_of), *resource, *rank, *flags, *range(n),
                          *indeg, *cat, *[-1] * n, *succ_end, *targets, 0], dtype=np.int64)
    return structure, np.zeros(len(edges))


def pack_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """pack_block(ops, edges) from a built block's table (graph/op_table.py: its ops' places and
    kind-groups, its edges) in one compiled pass (perf: pack_block is ~1 us of Python an op); None
    where the table marks an op the packing cannot read (pack() handles it). Equal to pack_block
    (tested on every block of every shipped model)."""
    structure = structure_of_rows(table, FLAGS_CATEGORY_CODES)
    if structure.shape[0] == 0:
        return None
    return structure, np.zeros(structure[1])


@njit(inline="always")
def table_length(tables, pos):
    """The length of the table (graph/op_table.py) at `pos` of tables laid end to end."""
    return (HEADER + int(tables[pos + N_OPS]) * ROW_WIDTH + int(tables[pos + N_GEMMS]) * GEMM_WIDTH
            + 2 * int(tables[pos + N_EDGES]))


@njit(inline="always")
def _dense(seen, count, x):
    """x's number in order of first appearance among seen[:count] (pack_block's dict.setdefault), and
    the new count."""
    k = 0
    while k < count and seen[k] != x:
        k += 1
    if k == count:
        seen[k] = x
        count += 1
    return k, count


@njit(cache=True, nogil=True)
def structure_of_rows(table, flags_category):
    """The structure pack_block builds, from the table (edges forward, sorted by source); an empty
    array where an op's kind-group is -1."""
    n, m = int(table[N_OPS]), int(table[N_EDGES])
    edges = HEADER + n * ROW_WIDTH + int(table[N_GEMMS]) * GEMM_WIDTH
    out = np.empty(STRUCTURE_HEADER + 8 * n + 1 + m + 1, dtype=np.int64)
    o = STRUCTURE_HEADER
    places = np.empty(n)
    ranks = np.empty(n)
    n_res = n_ranks = 0
    for i in range(n):
        row = HEADER + i * ROW_WIDTH
        kg = int(table[row + KIND_GROUP])
        if kg < 0:
            return np.empty(0, dtype=np.int64)
        place = table[row + PLACE]
        r = place // STREAMS_PER_RANK
        res, n_res = _dense(places, n_res, place)
        rk, n_ranks = _dense(ranks, n_ranks, r)
        kind, group = kg // GROUPS_PER_KIND, kg % GROUPS_PER_KIND
        out[o + i] = res
        out[o + n + i] = rk
        out[o + 2 * n + i] = flags_category[kind, group, 0]
        out[o + 3 * n + i] = i
        out[o + 4 * n + i] = 0
        out[o + 5 * n + i] = flags_category[kind, group, 1]
        out[o + 6 * n + i] = -1
    ptr = o + 7 * n
    for i in range(n + 1):
        out[ptr + i] = 0
    for e in range(m):
        u, v = int(table[edges + e]), int(table[edges + m + e])
        out[o + 4 * n + v] += 1
        out[ptr + u + 1] += 1
        out[ptr + n + 1 + e] = v
    for i in range(n):
        out[ptr + i + 1] += out[ptr + i]
    out[ptr + n + 1 + m] = 0
    out[0], out[1], out[2], out[3], out[4], out[5] = n, m, 0, 0, n_res, n_ranks
    return out


def _category(op) -> int:
    if op.kind is OpKind.COMPUTE:
        return COMPUTE
    if op.kind is OpKind.MEMCPY:
        return MEMCPY
    if op.is_comm:
        return CATEGORY_OF_GROUP.get(op.group_kind, -1)
    return -1


_COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
# (flags, exposure category) of an op by (kind, group kind)
_FLAGS_CATEGORY = {(kind, group): (int(kind is OpKind.COMPUTE) | 2 * int(kind in _COMM_KINDS),
                                   COMPUTE if kind is OpKind.COMPUTE else MEMCPY if kind is OpKind.MEMCPY
                                   else CATEGORY_OF_GROUP.get(group, -1) if kind in _COMM_KINDS else -1)
                   for kind in OpKind for group in (None, *GroupKind)}
# the same by the op table's kind and group codes (graph/op_table.py KIND_CODES, GROUP_CODES), padded to
# GROUPS_PER_KIND groups
FLAGS_CATEGORY_CODES = np.array([[_FLAGS_CATEGORY[kind, group] for group in GROUP_CODES]
                                  + [(0, -1)] * (GROUPS_PER_KIND - len(GROUP_CODES)) for kind in KIND_CODES],
                                 dtype=np.int64)


__all__ = ["FLAGS_CATEGORY_CODES", "STRUCTURE_HEADER", "pack", "pack_block", "pack_graph", "pack_rows",
           "structure_of_rows", "table_length"]
