"""A built Block is the DiGraph the builder used to build (nodes, edges and their data, in order),
built only on first use, and an ordinary graph from then on."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import networkx as nx
import pytest

from comet.config.parallel import ParallelConfig, Recompute
from comet.graph.block import Block, block_lists, block_ops, chain_edges, content
from comet.graph.ir import DepKind, Op, OpKind, chain_streams, new_graph
from comet.workload.builder import build_blocks


def _reference(block: Block) -> nx.DiGraph:
    """The graph as built before blocks kept lists: nodes and data edges in insertion order, then
    comet.graph.ir.chain_streams."""
    ops, edges = block_lists(block)
    g = new_graph()
    for i, op in enumerate(ops):
        g.add_node(i, op=op)
    for u, v, dep in sorted(((u, v, dep) for u, v, dep in edges if dep == "data"), key=lambda e: e[1]):
        g.add_edge(u, v, dep="data")
    return chain_streams(g)


@pytest.fixture
def blocks(tiny_model):
    par = ParallelConfig(tp=2, cp=2, gpus=8, global_batch=8, zero=3, recompute=Recompute.FULL,
                         overlap_tp_comm=True).resolve(tiny_model)
    return build_blocks(tiny_model, par)


def test_a_block_is_the_graph_the_builder_built(blocks):
    for key, b in blocks.items():
        ref = _reference(b)
        assert content(b) == content(ref), key
        assert len(b) == len(ref)
        assert [op for _, op in ref.nodes(data="op")] == block_ops(b)
        assert type(b) is Block                      # nothing above built the graph
        assert list(b.edges(data=True)) == list(ref.edges(data=True)), key
        assert type(b) is nx.DiGraph and block_lists(b) is None
        assert list(b.nodes(data=True)) == list(ref.nodes(data=True))
        assert content(b) == content(ref)


def test_edges_follow_networkx_order_with_stream_edges_after_data_edges():
    ops = [Op("a", OpKind.COMPUTE), Op("b", OpKind.COMPUTE), Op("c", OpKind.COMPUTE)]
    # a -> c by data; a -> b and b -> c by stream order: a's data edge first, as networkx lists a's edges
    assert chain_edges(ops, [(0, 2)]) == [(0, 2, "data"), (0, 1, DepKind.STREAM), (1, 2, DepKind.STREAM)]
    # a data edge between stream neighbours is not doubled by a stream edge
    assert chain_edges(ops, [(0, 1), (0, 1)]) == [(0, 1, "data"), (1, 2, DepKind.STREAM)]


def test_a_block_pickles_and_copies_as_a_block(blocks):
    b = blocks["layer.fwd"]
    for twin in (pickle.loads(pickle.dumps(b)), copy.deepcopy(b), copy.copy(b)):
        assert type(twin) is Block and content(twin) == content(b)
    assert type(b) is Block


def test_networkx_copies_are_plain_graphs_and_edits_are_seen(blocks):
    b = blocks["layer.bwd"]
    before = content(b)
    c = b.copy()
    assert type(c) is nx.DiGraph and content(c) == before
    b.add_node("host", op=Op("host", OpKind.CPU))     # an edit builds the graph first, then applies
    assert type(b) is nx.DiGraph and "host" in b
    assert content(b) != before and block_lists(b) is None
    assert Block() is not None and type(Block()) is nx.DiGraph


def test_equal_ops_hash_alike(blocks):
    """Op hashes a subset of its fields: ops equal field for field (defaults given or not, copies,
    replace() with the same value, pickles) must hash alike, and a changed field must break equality."""
    for op in (op for g in blocks.values() for op in block_ops(g)):
        twins = (Op(**{f.name: getattr(op, f.name) for f in dataclasses.fields(Op)}),   # every field given
                 op.with_(rank=op.rank), pickle.loads(pickle.dumps(op)), copy.deepcopy(op))
        for twin in twins:
            assert twin == op and hash(twin) == hash(op)
        assert op.with_(peer=7) != op and op.with_(dtype_bytes=op.dtype_bytes + 1) != op


def test_a_block_and_the_graph_it_becomes_share_one_signature(blocks):
    """cache.block_signature hashes a block's ops and edge count (graph/block.content_hash): the lists
    of a Block and the DiGraph built from them give equal signatures with equal hashes, and a changed
    op gives a different one."""
    from comet.replay import cache
    from comet.graph.block import content_hash
    for key, b in blocks.items():
        cache.clear()
        sig = cache.block_signature(b)
        # an equal Block built apart (a pickled copy) is interned to the same signature, its content
        # compared with the first's (both built lazily)
        assert cache.block_signature(pickle.loads(pickle.dumps(b))) is sig, key
        assert sig.ops == block_ops(b) and sig.value == content(b), key
        twin = b.copy()                                  # a plain DiGraph of the same content
        cache._interned.clear()                          # no interning: compared by value
        other = cache.block_signature(twin)
        assert other is not sig and other == sig and hash(other) == hash(sig), key
        ops, edges = sig.value[0], sig.value[1]
        assert int(sig) == content_hash([op for _, op in ops], len(edges))   # a Signature is the int of its hash
        if ops:
            changed = b.copy()
            first = changed.nodes[0]["op"]
            changed.nodes[0]["op"] = dataclasses.replace(first, flops=first.flops + 1.0)
            assert cache.block_signature(changed) != sig, key
    cache.clear()


def test_a_blocks_signature_is_kept_by_it_until_it_becomes_a_graph(blocks):
    """cache.block_signature keeps a Block's signature in the Block (no side table): the same object on
    every call, and dropped when the Block turns into an editable DiGraph, whose edits then show."""
    from comet.replay import cache
    b = next(iter(blocks.values()))
    sig = cache.block_signature(b)
    assert cache.block_signature(b) is sig and b.__dict__["_signature"] is sig
    b.nodes[0]["op"] = dataclasses.replace(b.nodes[0]["op"], flops=b.nodes[0]["op"].flops + 1.0)  # builds it
    assert type(b) is nx.DiGraph and "_signature" not in b.__dict__
    assert cache.block_signature(b) != sig
    cache.clear()
