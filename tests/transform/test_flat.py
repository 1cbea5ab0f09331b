"""Transformations that apply to flat op graphs (imported traces): data-parallel degree, target
hardware and precision."""

import networkx as nx
import pytest

from comet.errors import GraphError
from comet.graph.ir import (Collective, GroupKind, KernelClass, Op, OpKind, Phase, add_op, chain_streams,
                            new_graph)
from comet.hardware.compute import gemm_time_s, memory_time_s
from comet.replay.timing import op_time_s
from comet.transform import materialize, with_dp, with_hardware, with_precision

MEASURED = 1.2   # measured kernels run 20% over the model


def flat_trace(two_ranks: bool = True) -> nx.DiGraph:
    """A backward fragment on two ranks as a profiler trace gives it: a shaped GEMM, two shapeless
    kernels (a cuBLAS GEMM and an element-wise one), a CPU op, a DP gradient all-reduce matched across
    ranks, a TP all-reduce, and a collective of an unnamed-kind process group "pg7"."""
    g = new_graph()
    for r in range(2 if two_ranks else 1):
        cpu = add_op(g, Op("aten::mm", OpKind.CPU, rank=r, stream="cpu:0", duration_s=2e-5))
        mm = add_op(g, Op("fc1.wgrad", OpKind.COMPUTE, rank=r, kernel=KernelClass.GEMM, shape=(4096, 4096, 8192, 1),
                          flops=2.0 * 4096 * 4096 * 8192, phase=Phase.BACKWARD), after=[cpu])
        k1 = add_op(g, Op("sm90_xmma_gemm_bf16bf16_bf16f32", OpKind.COMPUTE, rank=r, duration_s=3e-4), after=[mm])
        k2 = add_op(g, Op("vectorized_elementwise_kernel", OpKind.COMPUTE, rank=r, duration_s=5e-5), after=[k1])
        add_op(g, Op("tp.all_reduce", OpKind.COLLECTIVE, rank=r, stream="comm.tp", collective=Collective.ALL_REDUCE,
                     msg_bytes=32e6, group="tp", group_kind=GroupKind.TP, group_size=8, comm_id=f"tp{r}"), after=[k2])
        add_op(g, Op("dp.all_reduce", OpKind.COLLECTIVE, rank=r, stream="comm.dp", collective=Collective.ALL_REDUCE,
                     msg_bytes=256e6, group="dp", group_kind=GroupKind.DP, group_size=4, group_stride=8,
                     comm_id="dp"), after=[mm])
        add_op(g, Op("ncclDevKernel_AllGather_RING_LL", OpKind.COLLECTIVE, rank=r, stream="cuda:20",
                     collective=Collective.ALL_GATHER, msg_bytes=64e6, group="pg7", group_size=4, group_stride=8,
                     comm_id="pg7"), after=[k2])
    return chain_streams(g)


@pytest.fixture()
def trace(h100):
    """Modelled durations x MEASURED on the shaped ops; graph attributes record the H100 cluster."""
    g = materialize(flat_trace(), h100, "bf16")
    for nid, op in g.nodes(data="op"):
        if op.kind is not OpKind.CPU and op.kernel is not KernelClass.OTHER or op.is_comm:
            g.nodes[nid]["op"] = op.with_(duration_s=op.duration_s * MEASURED)
    return g


def by_name(g, name):
    return [op for _, op in g.nodes(data="op") if op.name == name]


def test_dp_resizes_and_retimes_dp_collectives_only(trace, h100):
    before = {nid: op for nid, op in trace.nodes(data="op")}
    out = with_dp(trace, 16)
    assert {nid: op for nid, op in trace.nodes(data="op")} == before          # input untouched
    for op in by_name(out, "dp.all_reduce"):
        assert op.group_size == 16
        assert op.duration_s == pytest.approx(MEASURED * op_time_s(op, h100, "bf16"), rel=1e-12)
        assert op.duration_s > by_name(trace, "dp.all_reduce")[0].duration_s
    for nid, op in out.nodes(data="op"):
        if op.name != "dp.all_reduce":
            assert op is before[nid]
    assert list(out.edges) == list(trace.edges)


def test_dp_by_process_group_name(trace, h100):
    out = with_dp(trace, 2, groups=("pg7",))
    for op in by_name(out, "ncclDevKernel_AllGather_RING_LL"):
        assert op.group_size == 2
        assert op.duration_s == pytest.approx(MEASURED * op_time_s(op, h100, "bf16"), rel=1e-12)


def test_hardware_round_trip_restores_durations(trace, h100, a100):
    there = with_hardware(trace, a100)
    assert there.graph["cluster"] is a100
    back = with_hardware(there, h100)
    for nid, op in trace.nodes(data="op"):
        assert back.nodes[nid]["op"].duration_s == pytest.approx(op.duration_s, rel=1e-12), op.name


def test_hardware_ratios_by_kernel_class(trace, h100, a100):
    out = with_hardware(trace, a100)
    n = 8192
    gemm = gemm_time_s(n, n, n, a100, "bf16") / gemm_time_s(n, n, n, h100, "bf16")
    mem = memory_time_s(1e9, a100) / memory_time_s(1e9, h100)
    assert by_name(out, "sm90_xmma_gemm_bf16bf16_bf16f32")[0].duration_s == pytest.approx(3e-4 * gemm)
    assert by_name(out, "vectorized_elementwise_kernel")[0].duration_s == pytest.approx(5e-5 * mem)
    assert by_name(out, "aten::mm")[0].duration_s == 2e-5
    for op in by_name(out, "fc1.wgrad") + by_name(out, "tp.all_reduce"):
        assert op.duration_s == pytest.approx(MEASURED * op_time_s(op, a100, "bf16"), rel=1e-12)
    assert gemm > 2 and mem > 1.3     # H100 -> A100 is slower, as the datasheets say


def test_fp8_retimes_gemms_only(trace, h100):
    out = with_precision(trace, "fp8")
    mm = by_name(out, "fc1.wgrad")[0]
    assert mm.dtype_bytes == 1
    assert mm.duration_s == pytest.approx(MEASURED * op_time_s(mm, h100, "fp8"), rel=1e-12)
    assert mm.duration_s < by_name(trace, "fc1.wgrad")[0].duration_s
    assert by_name(out, "sm90_xmma_gemm_bf16bf16_bf16f32")[0].duration_s < 3e-4
    for name in ("vectorized_elementwise_kernel", "tp.all_reduce", "dp.all_reduce", "aten::mm"):
        assert [op.duration_s for op in by_name(out, name)] == [op.duration_s for op in by_name(trace, name)]
    back = with_precision(out, "bf16")
    for nid, op in trace.nodes(data="op"):
        assert back.nodes[nid]["op"].duration_s == pytest.approx(op.duration_s, rel=1e-12)


def test_flat_graph_without_cluster_needs_one(h100):
    g = flat_trace()
    with pytest.raises(GraphError, match="cluster"):
        with_dp(g, 8)
    out = with_dp(g, 8, cluster=h100)          # untimed ops stay untimed
    assert all(op.duration_s is None for _, op in out.nodes(data="op") if op.name == "dp.all_reduce")


def test_materialize_keeps_measured_durations(h100):
    g = flat_trace(two_ranks=False)
    out = materialize(g, h100, "bf16")
    assert by_name(out, "sm90_xmma_gemm_bf16bf16_bf16f32")[0].duration_s == 3e-4
    assert all(op.duration_s is not None for _, op in out.nodes(data="op"))
    assert by_name(g, "fc1.wgrad")[0].duration_s is None


def test_imported_kineto_trace_moves_to_other_hardware(repo_root, h100, a100):
    path = repo_root.parent / "shared" / "traces" / "single_gpu" / "alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
    if not path.exists():
        pytest.skip("../shared/traces not found (real profiler trace fixtures live next to the repo)")
    from comet.trace import load_trace
    g = load_trace([path])
    out = with_hardware(g, a100, old_cluster=h100)
    kernels = [(g.nodes[n]["op"], out.nodes[n]["op"]) for n in g if g.nodes[n]["op"].kind is OpKind.COMPUTE
               and g.nodes[n]["op"].duration_s]
    assert kernels and all(b.duration_s > a.duration_s for a, b in kernels)
    assert nx.is_directed_acyclic_graph(out)


def test_same_dp_is_the_identity(trace):
    out = with_dp(trace, 4)
    assert [op for _, op in out.nodes(data="op")] == [op for _, op in trace.nodes(data="op")]
    assert list(out.edges(data=True)) == list(trace.edges(data=True))
