"""The compiled block replay (comet/replay/block_kernel.py, block_pack.py, block_exposure.py) equals the Python event engine and its
exposure split bit for bit: on random graphs (ranks, streams, collectives matched across ranks, edge
delays, edges against insertion order, ties, overlap slowdown, deadlocks) and on every block of every
shipped model; and a built block packed from its lists, or from its table, equals the packing of its
compiled graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comet.config.model import load_model
from comet.config.parallel import ParallelConfig, Recompute
from comet.errors import ConfigError, GraphError
from comet.graph.block import block_lists, block_table
from comet.graph.ir import Collective, GroupKind, Op, OpKind, add_dep, add_op, new_graph
from comet.graph.op_table import TableWriter
from comet.replay import block_kernel, cache
from comet.replay.block_exposure import PARTS
from comet.replay.block_kernel import replay_arrays, replay_summary, replay_tables
from comet.replay.block_pack import pack, pack_block, pack_rows
from comet.replay.blocks import exposure_parts, time_block
from comet.replay.compile import compile_graph
from comet.replay.engine import _critical_path, replay
from comet.replay.timing import timed_s
from comet.workload.builder import build_blocks

pytestmark = pytest.mark.skipif(not block_kernel.HAVE_NUMBA, reason="numba not installed: the Python engine is the only one")

MODELS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "comet" / "models").glob("*.yaml"))


def assert_same_replay(cg, dur: list[float], slowdown: float) -> None:
    """The kernel's replay of compiled graph `cg` equals the Python engine's in every number."""
    start, end, arrive, binding, done, parts, makespan = replay_arrays(*pack(cg), np.array(dur, dtype=float),
                                                                       slowdown)
    assert replay_summary(*pack(cg), np.array(dur, dtype=float), slowdown).tolist() == [done, makespan, *parts]
    try:
        ref = replay(cg, list(dur), slowdown)
    except GraphError:
        assert done < len(cg)          # both deadlock
        return
    assert done == len(cg)
    assert start.tolist() == ref.start
    assert end.tolist() == ref.end
    assert arrive.tolist() == ref.arrive
    assert makespan == ref.makespan
    assert _critical_path(end.tolist(), binding.tolist()) == ref.critical_path
    expected = exposure_parts(ref)
    assert list(expected) == list(PARTS)
    assert dict(zip(PARTS, parts.tolist())) == expected


_KINDS = [OpKind.COMPUTE, OpKind.COMPUTE, OpKind.MEMCPY, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV, OpKind.CPU]
_GROUPS = [None, *GroupKind]

op_specs = st.lists(st.tuples(
    st.sampled_from(_KINDS), st.integers(0, 2), st.sampled_from(["compute", "side", "comm.a", "comm.b"]),
    st.sampled_from(_GROUPS), st.sampled_from([None, None, "c0", "c1", "c2"]),
    st.integers(0, 8)), min_size=1, max_size=24)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=op_specs, order=st.randoms(use_true_random=False), slowdown=st.sampled_from([0.0, 0.15, 0.5, 1.0]),
       edges=st.lists(st.tuples(st.integers(0, 23), st.integers(0, 23), st.sampled_from([0.0, 0.0, 0.25])),
                      max_size=40))
def test_kernel_equals_python_engine_on_random_graphs(specs, order, slowdown, edges):
    g = new_graph()
    for k, (kind, rank, stream, group, cid, d) in enumerate(specs):
        collective = Collective.ALL_REDUCE if kind is OpKind.COLLECTIVE else None
        add_op(g, Op(f"op{k}", kind, rank=rank, stream=stream, group_kind=group, collective=collective,
                     comm_id=cid if kind in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV) else None,
                     duration_s=d / 4))        # quarters: exact sums and many ties
    n = len(g)
    rank_of = list(range(n))
    order.shuffle(rank_of)                    # a hidden topological order: edges follow it, acyclic
    for u, v, delay in edges:
        u, v = u % n, v % n
        if rank_of[u] < rank_of[v]:
            add_dep(g, u, v, delay_s=delay)
    cg = compile_graph(g)
    assert_same_replay(cg, [op.duration_s for op in cg.ops], slowdown)


def _layouts(model):
    for tp, sp, cp, zero, recompute in ((1, False, 1, 1, Recompute.NONE), (8, True, 1, 3, Recompute.FULL),
                                        (4, False, 2, 1, Recompute.SELECTIVE), (2, True, 4, 3, Recompute.NONE)):
        try:
            yield ParallelConfig(tp=tp, cp=cp, sequence_parallel=sp if tp > 1 else False, gpus=tp * cp * 2,
                                 micro_batch=1, global_batch=2, recompute=recompute, zero=zero,
                                 flash_attention=cp > 1 or tp != 4).resolve(model)
        except ConfigError:
            continue


@pytest.mark.parametrize("name", MODELS)
def test_kernel_equals_python_engine_on_every_shipped_model(name, h100):
    model = load_model(name)
    layouts = list(_layouts(model))
    assert layouts
    for par in layouts:
        tables, durs, summaries = [], [], {}
        for key, g in build_blocks(model, par).items():
            cg = compile_graph(g)
            ops, edges = block_lists(g)
            packed = pack_block(ops, edges)
            assert [a.tolist() for a in packed] == [a.tolist() for a in pack(cg)], key
            # and from the block's table (graph/op_table.py), as the builder wrote it and as derived from the ops
            for writer in (block_table(g), TableWriter.of(ops)):
                table = writer.array([u for u, _, _ in edges], [v for _, v, _ in edges])
                assert [a.tolist() for a in pack_rows(table)] == [a.tolist() for a in packed], key
            dur = [timed_s(op, h100, par.precision.value) for op in cg.ops]
            tables.append(table)
            durs += dur
            for slowdown in (0.0, h100.efficiency.overlap_slowdown, 0.5):
                assert_same_replay(cg, dur, slowdown)
                summaries.setdefault(slowdown, []).append(
                    replay_summary(*packed, np.array(dur, dtype=float), slowdown).tolist())
        # the blocks' first replay: packed from their tables and replayed in one call, equal to each apart
        for slowdown, expected in summaries.items():
            assert replay_tables(np.concatenate(tables), np.array(durs, dtype=float), slowdown).tolist() == expected


def test_time_block_is_the_same_with_and_without_numba(monkeypatch, h100, tiny_model):
    par = ParallelConfig(tp=2, cp=2, gpus=8, global_batch=8, zero=3).resolve(tiny_model)
    blocks = build_blocks(tiny_model, par)
    cache.clear()
    compiled = {k: time_block(g, h100, "bf16") for k, g in blocks.items()}
    cache.clear()
    monkeypatch.setattr(block_kernel, "HAVE_NUMBA", False)
    python = {k: time_block(g, h100, "bf16") for k, g in blocks.items()}
    cache.clear()
    assert {k: (b.duration_s, b.parts) for k, b in compiled.items()} == \
           {k: (b.duration_s, b.parts) for k, b in python.items()}


def test_a_deadlocked_block_raises_on_the_compiled_path(h100):
    g = new_graph()    # each rank's collective waits behind the other's on one stream: never both ready
    for rank, first, second in ((0, "a", "b"), (1, "b", "a")):
        x = add_op(g, Op(first, OpKind.COLLECTIVE, rank=rank, stream="comm", comm_id=first, duration_s=1.0))
        add_op(g, Op(second, OpKind.COLLECTIVE, rank=rank, stream="comm", comm_id=second, duration_s=1.0), after=[x])
    cache.clear()
    with pytest.raises(GraphError, match="deadlocked"):
        time_block(g, h100, "bf16")


def test_a_table_with_ops_matched_across_streams_is_packed_from_its_ops():
    ops = [Op("a", OpKind.COLLECTIVE, stream="comm", comm_id="a"), Op("b", OpKind.COMPUTE)]
    assert pack_rows(TableWriter.of(ops).array([0], [1])) is None
    # in a batch, that table's row says so (ops done -1) and the others are replayed
    plain = [Op("x", OpKind.COMPUTE), Op("y", OpKind.COMPUTE)]
    tables = [TableWriter.of(o).array([0], [1]) for o in (plain, ops, plain)]
    rows = replay_tables(np.concatenate(tables), np.array([1.0, 2.0, 1.0, 2.0, 3.0, 4.0]), 0.0).tolist()
    assert rows[1][0] == -1
    assert rows[0] == replay_summary(*pack_rows(tables[0]), np.array([1.0, 2.0]), 0.0).tolist()
    assert rows[2] == replay_summary(*pack_rows(tables[2]), np.array([3.0, 4.0]), 0.0).tolist()
