"""Kineto import: hand-checked synthetic traces and every real fixture against COUNTS.json."""

from __future__ import annotations

import collections
import time

import pytest

from comet.graph.ir import Collective, DepKind, OpKind, ops
from comet.trace import load_trace
from comet.trace.replay import replay_trace

from trace_synth import kineto_doc, write_kineto


def _by_name(g):
    return {op.name: nid for nid, op in ops(g)}


def test_synthetic_graph_edges_and_exact_replay(tmp_path):
    g = load_trace(write_kineto(tmp_path, [kineto_doc(0, 1)]))
    n = _by_name(g)
    launch_mm, launch_ar = n["aten::mm > cudaLaunchKernel"], n["nccl:all_reduce > cudaLaunchKernel"]
    sync, gemm, nccl = n["cudaDeviceSynchronize"], n["sm80_gemm"], n["ncclKernel_AllReduce_RING_LL_Sum_float"]
    assert g.edges[launch_mm, gemm]["dep"] is DepKind.LAUNCH
    assert g.edges[launch_ar, nccl]["dep"] is DepKind.LAUNCH
    assert g.edges[launch_mm, launch_ar]["dep"] is DepKind.STREAM
    assert g.edges[launch_mm, launch_ar]["delay_s"] == pytest.approx(7e-6)      # host gap 1007 -> 1014
    assert g.edges[gemm, nccl]["dep"] is DepKind.SYNC                            # record/wait event pair
    assert g.edges[nccl, sync]["dep"] is DepKind.SYNC                            # synchronize waits for GPU
    op = g.nodes[sync]["op"]
    assert op.duration_s == pytest.approx(3e-6)        # only the part after the GPU finished
    coll = g.nodes[nccl]["op"]
    assert (coll.kind, coll.collective, coll.msg_bytes, coll.group, coll.group_size) == \
        (OpKind.COLLECTIVE, Collective.ALL_REDUCE, 4096.0, "0", 1)
    assert coll.stream == "cuda:20" and g.nodes[launch_mm]["op"].stream == "cpu:100"
    rep = replay_trace(g)
    # hand-computed: gemm 7..107 us, nccl 107..157, sync 157..160
    assert rep.ranks[0].measured_s == pytest.approx(160e-6)
    assert rep.ranks[0].predicted_s == pytest.approx(160e-6)


def test_two_ranks_matched_and_collective_time_corrected(tmp_path):
    docs = [kineto_doc(0, 2, ("allreduce", "broadcast"), comm_us=80.0),
            kineto_doc(1, 2, ("allreduce", "broadcast"), offset_us=30.0, comm_us=50.0)]
    g = load_trace(write_kineto(tmp_path, docs, gz=True))
    comm = collections.defaultdict(list)
    for _, op in ops(g):
        if op.is_comm:
            comm[op.comm_id].append(op)
    assert sorted(comm) == ["0#0", "0#1"]
    for members in comm.values():
        assert sorted(o.rank for o in members) == [0, 1]
        # the measured NCCL time includes waiting for the peer: the least-waiting member's time is kept
        assert [o.duration_s for o in members] == pytest.approx([50e-6, 50e-6])
        assert {o.group_size for o in members} == {2}
    rep = replay_trace(g)
    assert rep.aligned and len(rep.ranks) == 2


def test_step_selection(tmp_path):
    paths = write_kineto(tmp_path, [kineto_doc(0, 1)])
    assert load_trace(paths).graph["ranks"][0]["step"] == "ProfilerStep#3"
    assert load_trace(paths, step="all").graph["ranks"][0]["step"] == "all events"
    from comet.errors import TraceError
    with pytest.raises(TraceError, match=r"no ProfilerStep#9 .*steps: \[3\]"):
        load_trace(paths, step=9)


def _kineto_counts(counts):
    return {k: v for k, v in counts.items() if v.get("kind") == "kineto"}


@pytest.mark.parametrize("name", ["nccl_msg_args/nccl_data.json.gz", "nccl_msg_args/b200_eager_trace.json.gz",
                                  "single_gpu/alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
                                  "single_gpu/benchmark_simple_add_trace.json.gz"])
def test_single_rank_fixture_counts(traces, counts, name):
    expect = counts[name]
    g = load_trace(traces / name, step="all")
    kinds = collections.Counter(op.kind for _, op in ops(g))
    colls = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
    assert kinds[OpKind.COMPUTE] + kinds[OpKind.COLLECTIVE] == expect["gpu_kernels"]
    assert len(colls) == expect["nccl_kernels"]
    cats = expect["events_by_cat"]
    assert kinds[OpKind.MEMCPY] == cats.get("gpu_memcpy", 0) + cats.get("gpu_memset", 0)
    names = collections.Counter({"allreduce": "all_reduce", "broadcast": "broadcast",
                                 "_allgather_base": "all_gather"}[k] for k, n in
                                expect["nccl_collective_names"].items() for _ in range(n))
    assert collections.Counter(op.collective.value for op in colls) == names
    assert all(op.msg_bytes > 0 for op in colls)          # sizes from the kernel args


def test_b200_allgather_args(traces):
    g = load_trace(traces / "nccl_msg_args/b200_eager_trace.json.gz")
    (op,) = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
    # Out msg nelems 201088 x BFloat16 (2 bytes): all-gather counts its output
    assert (op.collective, op.msg_bytes, op.group, op.group_size, op.dtype_bytes) == \
        (Collective.ALL_GATHER, 201088 * 2, "3", 8, 2)


def test_nccl_data_last_step(traces):
    g = load_trace(traces / "nccl_msg_args/nccl_data.json.gz")
    info = g.graph["ranks"][0]
    assert info["step"] == "ProfilerStep#6" and info["rank"] == 0
    colls = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
    assert colls and all(op.group == "0" and op.group_size == 2 for op in colls)
    assert len([n for n in g if g.nodes[n]["op"].kind is not OpKind.CPU]) < 2700 / 2   # one step of three


def test_dlrm_all_ranks_counts_and_matching(traces, counts):
    t = time.perf_counter()
    g = load_trace(traces / "multi_rank_dlrm_8xV100", step="all")
    assert time.perf_counter() - t < 20.0                  # seconds, not minutes
    per = collections.Counter((op.rank, op.kind) for _, op in ops(g))
    for key, expect in _kineto_counts(counts).items():
        if "dlrm" not in key:
            continue
        r = expect["rank"]
        assert per[r, OpKind.COMPUTE] + per[r, OpKind.COLLECTIVE] == expect["gpu_kernels"]
        assert per[r, OpKind.COLLECTIVE] == expect["nccl_kernels"] == 8
    groups = collections.defaultdict(list)
    for _, op in ops(g):
        if op.kind is OpKind.COLLECTIVE:
            groups[op.comm_id].append(op)
    assert len(groups) == 8
    for members in groups.values():
        assert sorted(o.rank for o in members) == list(range(8))
        assert len({o.collective for o in members}) == 1 and len({o.duration_s for o in members}) == 1
        assert all(o.msg_bytes > 0 and o.group_size == 8 for o in members)
    kinds = collections.Counter(ops_[0].collective for ops_ in groups.values())
    assert kinds == {Collective.ALL_TO_ALL: 5, Collective.ALL_REDUCE: 3}


def test_dlrm_sizes_from_execution_trace(traces):
    g = load_trace(traces / "multi_rank_dlrm_8xV100")
    rank0 = sorted((op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE and op.rank == 0),
                   key=lambda o: int(o.comm_id.split("#")[1]))
    # ET dlrm_eg_0.json: all_to_allv of 6144 floats, all_to_all of 24 longs, ..., allreduce of 394241 floats
    assert rank0[0].msg_bytes == 6144 * 4 and rank0[1].msg_bytes == 24 * 8
    assert [o.msg_bytes for o in rank0 if o.collective is Collective.ALL_REDUCE][0] == 394241 * 4
    no_et = load_trace(traces / "multi_rank_dlrm_8xV100/dlrm_kineto.tar.gz")
    assert all(op.msg_bytes == 0 for _, op in ops(no_et) if op.is_comm)    # old trace: no size args
