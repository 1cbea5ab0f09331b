"""Cross-check the hand-written Chakra codec with the official protobuf runtime (when installed).

The schema is rebuilt from et_def.proto's field numbers (docs/trace-formats.md §3) as a descriptor,
so the check needs `google.protobuf` but no generated code and no chakra package.
"""

from __future__ import annotations

import pytest

pb = pytest.importorskip("google.protobuf", reason="google.protobuf not installed: codec cross-check skipped")
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

from comet.graph.ir import Collective, Op, OpKind, new_graph, add_dep, DepKind  # noqa: E402
from comet.trace import write_chakra  # noqa: E402
from comet.trace.chakra import _varint  # noqa: E402

F = descriptor_pb2.FieldDescriptorProto


def _classes():
    fd = descriptor_pb2.FileDescriptorProto(name="et_def_test.proto", package="ChakraProtoMsg", syntax="proto3")

    def msg(name, fields):
        m = fd.message_type.add(name=name)
        for num, fname, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = f".ChakraProtoMsg.{tname}"
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("BoolList", [(1, "values", F.TYPE_BOOL, rep, None)])
    msg("StringList", [(1, "values", F.TYPE_STRING, rep, None)])
    msg("DoubleList", [(1, "values", F.TYPE_DOUBLE, rep, None)])
    a = msg("AttributeProto", [(1, "name", F.TYPE_STRING, opt, None), (2, "doc_string", F.TYPE_STRING, opt, None),
                               (3, "double_val", F.TYPE_DOUBLE, opt, None), (4, "double_list", F.TYPE_MESSAGE, opt, "DoubleList"),
                               (7, "int32_val", F.TYPE_INT32, opt, None), (9, "int64_val", F.TYPE_INT64, opt, None),
                               (13, "uint64_val", F.TYPE_UINT64, opt, None), (27, "bool_val", F.TYPE_BOOL, opt, None),
                               (28, "bool_list", F.TYPE_MESSAGE, opt, "BoolList"),
                               (29, "string_val", F.TYPE_STRING, opt, None),
                               (30, "string_list", F.TYPE_MESSAGE, opt, "StringList")])
    a.oneof_decl.add(name="value")
    for f in a.field:
        if f.number > 2:
            f.oneof_index = 0
    msg("GlobalMetadata", [(1, "version", F.TYPE_STRING, opt, None), (2, "attr", F.TYPE_MESSAGE, rep, "AttributeProto")])
    msg("Node", [(1, "id", F.TYPE_UINT64, opt, None), (2, "name", F.TYPE_STRING, opt, None),
                 (3, "type", F.TYPE_INT32, opt, None), (4, "ctrl_deps", F.TYPE_UINT64, rep, None),
                 (5, "data_deps", F.TYPE_UINT64, rep, None), (7, "duration_micros", F.TYPE_UINT64, opt, None),
                 (10, "attr", F.TYPE_MESSAGE, rep, "AttributeProto")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    get = message_factory.GetMessageClass
    return (get(pool.FindMessageTypeByName("ChakraProtoMsg.GlobalMetadata")),
            get(pool.FindMessageTypeByName("ChakraProtoMsg.Node")))


def test_official_runtime_reads_our_export(tmp_path):
    Meta, Node = _classes()
    g = new_graph()
    g.add_node("k", op=Op("gemm", OpKind.COMPUTE, stream="cuda:7", flops=3e9, bytes=2e6, duration_s=2.5e-4))
    g.add_node("a", op=Op("allreduce", OpKind.COLLECTIVE, stream="cuda:20", collective=Collective.REDUCE_SCATTER,
                          msg_bytes=8192.0, group="5", duration_s=1e-5))
    add_dep(g, "k", "a", DepKind.SYNC, delay_s=1e-6)
    (path,) = write_chakra(g, tmp_path, "x")
    data = path.read_bytes()
    msgs, pos = [], 0
    while pos < len(data):
        n, pos = _varint(data, pos)
        msgs.append(data[pos:pos + n])
        pos += n
    meta = Meta.FromString(msgs[0])
    assert meta.version == "0.0.4"
    k, a = Node.FromString(msgs[1]), Node.FromString(msgs[2])
    attrs = {x.name: x for x in a.attr}
    assert (k.id, k.name, k.type, k.duration_micros) == (0, "gemm", 4, 250)
    assert {x.name: x for x in k.attr}["num_ops"].int64_val == 3_000_000_000
    assert {x.name: x for x in k.attr}["tensor_size"].uint64_val == 2_000_000
    assert (a.type, list(a.data_deps)) == (7, [0])
    assert attrs["comm_type"].int64_val == 7 and attrs["comm_size"].int64_val == 8192
    assert attrs["pg_name"].string_val == "5" and attrs["is_cpu_op"].WhichOneof("value") == "bool_val"
    assert list(attrs["comet_dep_kinds"].string_list.values) == ["sync"]
    assert list(attrs["comet_dep_delays_s"].double_list.values) == [1e-6]
