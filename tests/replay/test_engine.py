"""Golden tests of the event engine on graphs small enough to check by hand."""

import pytest
from hypothesis import given, settings, strategies as st

from comet.errors import GraphError
from comet.graph.ir import Collective, DepKind, Op, OpKind, add_dep, add_op, new_graph
from comet.replay.engine import replay_graph


def comp(name, d, rank=0, stream="compute"):
    return Op(name, OpKind.COMPUTE, rank=rank, stream=stream, duration_s=d)


def coll(name, d, rank=0, cid=None):
    return Op(name, OpKind.COLLECTIVE, rank=rank, stream="comm", collective=Collective.ALL_REDUCE,
              duration_s=d, comm_id=cid)


def four_node(comm_d=3.0):
    g = new_graph()
    a = add_op(g, comp("A", 1.0))
    b = add_op(g, comp("B", 2.0), after=[a])
    c = add_op(g, coll("C", comm_d), after=[a])
    d = add_op(g, comp("D", 1.0), after=[b, c])
    return g, (a, b, c, d)


def test_four_node_makespan_by_hand():
    g, (a, b, c, d) = four_node()
    r = replay_graph(g)
    # A 0-1; B 1-3 on compute; C 1-4 on comm; D waits for both: 4-5
    assert r.times() == {a: (0.0, 1.0), b: (1.0, 3.0), c: (1.0, 4.0), d: (4.0, 5.0)}
    assert r.makespan == 5.0
    assert [r.compiled.node_ids[i] for i in r.critical_path] == [a, c, d]


def test_overlap_slowdown_retimes_running_compute():
    g, (a, b, c, d) = four_node(comm_d=1.0)
    r = replay_graph(g, overlap_slowdown=0.5)
    # B starts at 1 with C in flight: rate 1/1.5 until 2 (2/3 s of work done), then full rate:
    # remaining 4/3 s -> B ends at 2 + 4/3; D follows for 1 s.
    assert r.end[1] == pytest.approx(2 + 4 / 3)
    assert r.makespan == pytest.approx(3 + 4 / 3)


def test_stream_serializes_independent_ops_in_topological_order():
    g = new_graph()
    add_op(g, comp("X", 1.0))
    add_op(g, comp("Y", 1.0))
    r = replay_graph(g)
    assert sorted(zip(r.start, r.end)) == [(0.0, 1.0), (1.0, 2.0)]


def test_collective_starts_when_last_member_arrives():
    g = new_graph()
    x = add_op(g, comp("X", 1.0, rank=0))
    y = add_op(g, comp("Y", 2.0, rank=1))
    ar0 = add_op(g, coll("AR", 1.0, rank=0, cid="ar"), after=[x])
    ar1 = add_op(g, coll("AR", 1.0, rank=1, cid="ar"), after=[y])
    r = replay_graph(g)
    t = r.times()
    assert t[ar0] == (2.0, 3.0) and t[ar1] == (2.0, 3.0)
    assert r.arrive[2] == 1.0              # rank 0's NCCL kernel took its stream at 1 and waited
    assert r.rank_end == {0: 3.0, 1: 3.0}


def test_edge_delay_is_honoured():
    g = new_graph()
    a = add_op(g, comp("A", 1.0, stream="cpu"))
    b = add_op(g, comp("B", 1.0, stream="cpu"))
    add_dep(g, a, b, DepKind.STREAM, delay_s=0.5)
    assert replay_graph(g).makespan == 2.5


def test_cycle_is_a_graph_error():
    g = new_graph()
    a = add_op(g, comp("A", 1.0))
    b = add_op(g, comp("B", 1.0), after=[a])
    add_dep(g, b, a)
    with pytest.raises(GraphError, match="cycle"):
        replay_graph(g)


@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 12))
    g = new_graph()
    for i in range(n):
        d = draw(st.floats(0.0, 5.0, allow_nan=False))
        stream = draw(st.sampled_from(["s0", "s1", "s2"]))
        parents = draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3)) if i else []
        add_op(g, comp(f"n{i}", d, stream=stream), after=sorted(set(parents)))
    return g


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_critical_path_le_makespan_le_sum(g):
    r = replay_graph(g)
    total = sum(op.duration_s for _, op in g.nodes(data="op"))
    path = sum(r.end[i] - r.start[i] for i in r.critical_path)
    assert path <= r.makespan + 1e-9
    assert r.makespan <= total + 1e-9
    assert replay_graph(g).end == r.end   # same input, same result
