"""Chakra ET: wire codec, real files, ASTRA-sim microbenchmark, export -> import round trip."""

from __future__ import annotations

import collections

import pytest

from comet.graph.ir import Collective, DepKind, Op, OpKind, new_graph, add_dep, ops
from comet.trace import load_trace, write_chakra
from comet.trace.chakra import _enc_attr, _enc_varint, _attr, _varint, decode_et


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**32, 2**63 - 1])
def test_varint_round_trip(n):
    data = _enc_varint(n)
    assert _varint(data, 0) == (n, len(data))


def test_negative_int64_is_ten_bytes_twos_complement():
    assert len(_enc_varint(-1)) == 10
    assert _attr(_enc_attr("x", -5)) == ("x", -5)


@pytest.mark.parametrize("value", [True, 7, 2.5, "pg", ["a", "b"], [1.5, 2.0]])
def test_attr_round_trip(value):
    assert _attr(_enc_attr("k", value)) == ("k", value)


def test_real_chakra_et(traces, counts):
    expect = counts["chakra_et/feeder_tests_trace.tar.gz::tests/data/chakra.0.et"]

    import tarfile
    with tarfile.open(traces / "chakra_et/feeder_tests_trace.tar.gz") as tar:
        data = tar.extractfile("tests/data/chakra.0.et").read()
    meta, nodes = decode_et(data, "chakra.0.et")
    assert meta["attrs"]["pid"] == expect["global_metadata"]["pid"]
    assert collections.Counter(n["type"] for n in nodes) == {4: expect["nodes_by_type"]["COMP_NODE"],
                                                              7: expect["nodes_by_type"]["COMM_COLL_NODE"]}
    g = load_trace(traces / "chakra_et/feeder_tests_trace.tar.gz")
    assert g.number_of_nodes() == expect["nodes"]
    colls = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
    got = collections.Counter(f"{op.collective.name}/{int(op.msg_bytes)} bytes" for op in colls)
    assert got == expect["comm_coll_nodes_with_comm_type"]
    assert any(op.duration_s for _, op in ops(g))


def test_chakra_json_workload_graph(traces, counts):
    for member in ("jsonData/chakra.0.json", "jsonData/small_chakra.0.json"):
        expect = counts[f"chakra_et/json_trace.tar.gz::{member}"]
        g = load_trace(f"{traces / 'chakra_et/json_trace.tar.gz'}::{member}")
        assert g.number_of_nodes() == expect["nodes"]
        nccl = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
        assert len(nccl) == expect["nccl_named_nodes"]


def test_astra_sim_all_reduce_8npus(traces):
    g = load_trace(traces / "chakra_et/astra_sim_all_reduce_8npus_1MB")
    colls = [op for _, op in ops(g)]
    assert sorted(op.rank for op in colls) == list(range(8))
    assert {(op.kind, op.collective, op.msg_bytes, op.comm_id, op.group_size) for op in colls} == \
        {(OpKind.COLLECTIVE, Collective.ALL_REDUCE, 1048576.0, "0#0", 8)}


def _small_graph():
    g = new_graph()
    for r in (0, 1):
        g.add_node(f"c{r}", op=Op("launch", OpKind.CPU, rank=r, stream="cpu:1", duration_s=5e-6, start_s=0.0))
        g.add_node(f"k{r}", op=Op("gemm", OpKind.COMPUTE, rank=r, stream="cuda:7", flops=2e9, bytes=1e6,
                                  duration_s=1e-4, start_s=1e-5))
        g.add_node(f"a{r}", op=Op("ncclKernel_AllReduce", OpKind.COLLECTIVE, rank=r, stream="cuda:20",
                                  collective=Collective.ALL_REDUCE, msg_bytes=4096.0, group="0", group_size=2,
                                  comm_id="0#0", duration_s=5e-5))
        g.add_node(f"s{r}", op=Op("send", OpKind.SEND if r == 0 else OpKind.RECV, rank=r, stream="cuda:30",
                                  peer=1 - r, msg_bytes=128.0, group="0", comm_id="p2p:0:0->1#0", duration_s=1e-6))
        add_dep(g, f"c{r}", f"k{r}", DepKind.LAUNCH)
        add_dep(g, f"k{r}", f"a{r}", DepKind.SYNC)
        add_dep(g, f"c{r}", f"s{r}", DepKind.STREAM, delay_s=2e-6)
    return g


def test_export_then_import_round_trip(tmp_path):
    g = _small_graph()
    paths = write_chakra(g, tmp_path, "wl")
    assert [p.name for p in paths] == ["wl.0.et", "wl.1.et"]
    back = load_trace(tmp_path)
    assert set(back.nodes) == set(g.nodes)
    assert {(u, v, d["dep"], d.get("delay_s", 0.0)) for u, v, d in back.edges(data=True)} == \
        {(u, v, d["dep"], d.get("delay_s", 0.0)) for u, v, d in g.edges(data=True)}
    for nid, op in ops(g):
        b = back.nodes[nid]["op"]
        assert (b.name, b.kind, b.rank, b.stream, b.collective, b.msg_bytes, b.group, b.group_size, b.peer,
                b.flops, b.bytes, b.duration_s) == \
            (op.name, op.kind, op.rank, op.stream, op.collective, op.msg_bytes, op.group, op.group_size, op.peer,
             op.flops, op.bytes, op.duration_s)
    # matching is redone on import from the Chakra fields (pg_name order; send/recv by src, dst)
    assert back.nodes["a0"]["op"].comm_id == back.nodes["a1"]["op"].comm_id
    assert back.nodes["s0"]["op"].comm_id == back.nodes["s1"]["op"].comm_id is not None


def test_export_writes_astra_sim_fields(tmp_path):
    (p0, _) = write_chakra(_small_graph(), tmp_path, "wl")
    meta, nodes = decode_et(p0.read_bytes(), str(p0))
    assert meta["version"] == "0.0.4"
    by_name = {n["name"]: n for n in nodes}
    coll, comp, send = by_name["ncclKernel_AllReduce"], by_name["gemm"], by_name["send"]
    assert coll["type"] == 7 and coll["attrs"]["comm_type"] == 0 and coll["attrs"]["comm_size"] == 4096
    assert coll["attrs"]["pg_name"] == "0" and coll["attrs"]["is_cpu_op"] is False
    assert comp["type"] == 4 and comp["duration_micros"] == 100 and comp["attrs"]["num_ops"] == 2_000_000_000
    assert comp["attrs"]["tensor_size"] == 1_000_000
    assert send["type"] == 5 and (send["attrs"]["comm_src"], send["attrs"]["comm_dst"]) == (0, 1)
    assert coll["data_deps"] == [by_name["gemm"]["id"]]


def test_dlrm_export_round_trip_keeps_replay(traces, tmp_path):
    from comet.trace.replay import replay_trace
    g = load_trace(traces / "multi_rank_dlrm_8xV100")
    write_chakra(g, tmp_path, "dlrm")
    back = load_trace(tmp_path)
    assert back.number_of_nodes() == g.number_of_nodes() and back.number_of_edges() == g.number_of_edges()
    a, b = replay_trace(g), replay_trace(back)
    assert b.predicted_s == pytest.approx(a.predicted_s, rel=1e-9)
    assert [r.measured_s for r in b.ranks] == [r.measured_s for r in a.ranks]
