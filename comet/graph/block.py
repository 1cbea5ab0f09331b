"""A built block: its ops in program order and their dependencies as plain lists, a networkx graph
only when someone asks for one.

The replay of a block reads a list of ops, a list of edges and the streams (comet/replay/compile.py,
comet/replay/block_kernel.py); building a networkx DiGraph of every block of every configuration a
search meets costs more than replaying it. A `Block` is a DiGraph whose networkx state is built on
first use: transforms, expansion, export and traces see an ordinary DiGraph (node ids 0..n-1 in
program order, edge attribute "dep"), the replay reads `block_lists(g)` and never builds it.

On first use the object becomes a plain `nx.DiGraph` (its class is switched), so nothing can edit
the graph while the lists still describe the old content: `block_lists` answers None from then on
and readers take the networkx path.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter

import networkx as nx

from comet.graph.ir import DepKind, Op
from comet.graph.op_table import TableWriter

_DATA = DepKind.DATA.value    # the builder's data edges carry the plain string
# a built block's edge data as content() lists it, by dependency kind (a str Enum equals its value)
_EDGE_DATA = {dep: (("dep", dep),) for dep in (*DepKind, _DATA)}   # "data": the builder's str

# networkx's per-instance state (DiGraph.__init__): reading any of it builds the graph
_NX_STATE = ("graph", "_node", "_adj", "_succ", "_pred", "__networkx_cache__")


class _BuildOnUse:
    """Class attribute standing for one piece of networkx state: the first read (or write) builds the
    graph, after which the instance is a plain DiGraph and this descriptor is no longer consulted."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        obj._materialize()
        return getattr(obj, self.name)

    def __set__(self, obj, value) -> None:
        obj._materialize()
        setattr(obj, self.name, value)


class Block(nx.DiGraph):
    """`ops`: Op per node, node id = position; `edges`: (u, v, dep) with u < v, in the order networkx
    lists them (by source, then insertion), at most one edge per (u, v)."""

    def __new__(cls, *args, **kwargs):
        # networkx makes new graphs of the same class (copy(), subgraph views, ...): those are plain graphs
        return nx.DiGraph(*args, **kwargs)

    @classmethod
    def of(cls, ops: list[Op], edges: list[tuple[int, int, str]], table=None) -> "Block":
        """`table`: the ops' graph/op_table.TableWriter, where the builder wrote one."""
        b = object.__new__(cls)
        d = b.__dict__
        d["_lists"] = (ops, edges)
        d["_table"] = table
        return b

    def __reduce__(self):
        lists = self.__dict__.get("_lists")
        if lists is None:  # pragma: no cover - a Block stops being one once built (_materialize)
            return super().__reduce__()
        return Block.of, (*lists, self.__dict__.get("_table"))

    def __len__(self) -> int:
        return len(self.__dict__["_lists"][0])

    def _materialize(self) -> None:
        ops, edges = self.__dict__.pop("_lists")
        self.__dict__.pop("_table", None)
        self.__dict__.pop("_signature", None)   # cache.block_signature's: the graph may be edited from here on
        self.__class__ = nx.DiGraph         # from here on an ordinary graph, edited like any other
        nx.DiGraph.__init__(self)
        self.add_nodes_from((i, {"op": op}) for i, op in enumerate(ops))
        self.add_edges_from((u, v, {"dep": dep}) for u, v, dep in edges)


for _name in _NX_STATE:
    setattr(Block, _name, _BuildOnUse(_name))


def block_lists(g) -> tuple[list[Op], list[tuple[int, int, str]]] | None:
    """(ops, edges) of a Block not yet turned into a graph; None for any other graph."""
    return g.__dict__["_lists"] if type(g) is Block else None


def block_table(g):
    """The graph/op_table.TableWriter the builder filled for a Block not yet turned into a graph; None
    for any other graph (TableWriter.of derives one from the ops)."""
    return g.__dict__["_table"] if type(g) is Block else None


def block_ops(g) -> list[Op]:
    """The ops of block graph `g` in node order (without building a Block's graph)."""
    lists = block_lists(g)
    return lists[0] if lists is not None else [op for _, op in g.nodes(data="op")]


def content(g) -> tuple:
    """What a block's replay reads: (node id, op) in node order and (u, v, sorted edge data) in
    networkx's edge order; equal for a Block and the DiGraph it turns into (tested)."""
    lists = block_lists(g)
    if lists is None:
        return (tuple(g.nodes(data="op")),
                tuple((u, v, tuple(sorted(d.items()))) for u, v, d in g.edges(data=True)))
    return lists_content(*lists)


def lists_content(ops: list[Op], edges: list[tuple[int, int, str]]) -> tuple:
    """content() of a Block from its lists (`block_lists`)."""
    # perf: the edge data tuples are shared constants, not two new tuples per edge
    data = _EDGE_DATA
    return tuple(enumerate(ops)), tuple([(u, v, data.get(dep) or (("dep", dep),)) for u, v, dep in edges])


# the fields that tell ops apart where their table rows hold no value, read in C (attrgetter): a transfer's
# (its kind and group are in its row), an op left out of the compiled models' (every field hashed before)
_TRANSFER_HASHED = attrgetter("name", "msg_bytes", "group_size", "group_stride")
_LEFT_OUT_HASHED = attrgetter("name", "shape", "flops", "bytes", "msg_bytes", "group_size", "group_stride")


def content_hash(ops: list[Op], n_edges: int, table: TableWriter | None = None) -> int:
    """A hash of a block's content (`content`) from its ops in node order, their table (graph/op_table.py:
    the builder's, or derived from the ops: equal to it) and its edge count: equal contents hash alike
    (a function of what equality compares), blocks of different shapes apart.
    perf (i23b-blocks): the table's rows and GEMM shapes (numbers, hashed in C) and a few fields of the
    ops whose rows hold no value (transfers, ops left out), not 7 fields of every op: 13.3 -> 7.2 us
    for the flagship's six blocks (hot)."""
    if table is None:
        table = TableWriter.of(ops)
    pick, left_out = ops.__getitem__, table.left_out
    return hash((tuple(table.rows), tuple(table.gemms), n_edges,
                 tuple(map(_TRANSFER_HASHED, map(pick, table.transfers))),
                 tuple(map(_LEFT_OUT_HASHED, map(pick, left_out))) if left_out else ()))


def chain_edges(ops: list[Op], data: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """The block's edges in networkx order: the data dependencies `data` (u, v) as added (duplicates
    dropped), then STREAM edges between consecutive ops of each (rank, stream) not already linked
    (as comet.graph.ir.chain_streams adds them), sorted by source, stable."""
    # perf: one dict of the data pairs serves as both the de-duplicated list and the membership test;
    # (rank, stream) read in C (attrgetter); the enum member bound once
    seen = dict.fromkeys(data)
    edges = [(u, v, _DATA) for u, v in seen]
    stream = DepKind.STREAM
    last: dict = {}
    for i, key in enumerate(map(_RANK_STREAM, ops)):
        u = last.get(key)
        if u is not None and (u, i) not in seen:
            edges.append((u, i, stream))
        last[key] = i
    edges.sort(key=_SOURCE)
    return edges


_RANK_STREAM, _SOURCE = attrgetter("rank", "stream"), itemgetter(0)
