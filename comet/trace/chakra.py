"""Chakra execution trace (MLCommons, `schema/protobuf/et_def.proto`): a hand-written protobuf codec,
import (`.et` protobuf and the feeder's JSON `workload_graph`) and export for ASTRA-sim.

File layout (chakra `protolib.encodeMessage`): varint length + GlobalMetadata, then varint length +
Node, ... until EOF. Field numbers (et_def.proto, docs/trace-formats.md §3):
  Node{1 id, 2 name, 3 type, 4 ctrl_deps, 5 data_deps, 6 start_time_micros, 7 duration_micros,
       8 inputs, 9 outputs, 10 attr}       GlobalMetadata{1 version, 2 attr}
  AttributeProto{1 name, 2 doc_string, 3 double, 4 double_list, 5 float, 7 int32, 9 int64, 11 uint32,
       13 uint64, 15 sint32, 17 sint64, 19 fixed32, 21 fixed64, 23 sfixed32, 25 sfixed64, 27 bool,
       28 bool_list, 29 string, 30 string_list, 31 bytes}; XList{1 repeated values}.
Edges: ASTRA-sim's ETFeeder resolves `data_deps` only; comet reads and writes `data_deps` and ignores
`ctrl_deps` (in converted PyTorch traces they are the caller -> callee tree, not an execution order).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import networkx as nx

from comet.errors import TraceError
from comet.trace.validate import check_chakra_et_nodes
from comet.graph.ir import Collective, DepKind, Op, OpKind, ops
from comet.trace.common import RankTrace, collective_from_kernel

COMP, COMM_SEND, COMM_RECV, COMM_COLL, METADATA, MEM_LOAD, MEM_STORE = 4, 5, 6, 7, 1, 2, 3
COMM_TYPES = [Collective.ALL_REDUCE, Collective.REDUCE, Collective.ALL_GATHER, None, None, Collective.BROADCAST,
              Collective.ALL_TO_ALL, Collective.REDUCE_SCATTER, Collective.REDUCE_SCATTER, Collective.BARRIER]
_COMM_TYPE_OF = {c: i for i, c in enumerate(COMM_TYPES) if c is not None and i != 8}
# ASTRA-sim reads these attrs with these types (et_feeder_node.cpp): anything else reads as 0.
_INT32_ATTRS = {"comm_src", "comm_dst", "comm_tag", "comm_priority"}
_UINT64_ATTRS = {"tensor_size"}


# ---------------------------------------------------------------------------- wire format
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _enc_varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(data: bytes) -> list[tuple[int, int, object]]:
    """[(field number, wire type, value)]: varints as int, fixed as raw bytes, length-delimited as bytes."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(data, pos)
        elif wt in (1, 5):
            size = 8 if wt == 1 else 4
            if pos + size > len(data):
                raise ValueError("truncated fixed-width field")
            val, pos = data[pos:pos + size], pos + size
        elif wt == 2:
            n, pos = _varint(data, pos)
            if pos + n > len(data):
                raise ValueError("truncated length-delimited field")
            val, pos = data[pos:pos + n], pos + n
        else:
            raise ValueError(f"unsupported wire type {wt} (field {num})")
        if num == 0:
            raise ValueError("field number 0")
        out.append((num, wt, val))
    return out


def _signed(n: int, bits: int = 64) -> int:
    return n - (1 << bits) if n >> (bits - 1) & 1 else n


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _packed_varints(wt: int, val) -> list[int]:
    if wt == 0:
        return [val]
    out, pos = [], 0
    while pos < len(val):
        v, pos = _varint(val, pos)
        out.append(v)
    return out


def _scalar(num: int, wt: int, val):
    if num == 3:
        return struct.unpack("<d", val)[0]
    if num == 5:
        return struct.unpack("<f", val)[0]
    if num in (7, 9):
        return _signed(val, 64)
    if num in (11, 13):
        return val
    if num in (15, 17):
        return _zigzag(val)
    if num in (19, 21, 23, 25):
        return struct.unpack({19: "<I", 21: "<Q", 23: "<i", 25: "<q"}[num], val)[0]
    if num == 27:
        return bool(val)
    if num == 29:
        return val.decode("utf-8", "replace")
    return val


def _attr(data: bytes):
    name, value = "", None
    for num, wt, val in _fields(data):
        if num == 1:
            name = val.decode("utf-8", "replace")
        elif num == 2:
            continue
        elif num % 2 == 1 or num in (27, 29, 31):
            value = _scalar(num, wt, val)
        else:                                   # XList message: field 1 repeated
            elem = num - 1
            items = []
            for n2, wt2, v2 in _fields(val):
                if n2 != 1:
                    continue
                if elem in (3, 5) and wt2 == 2:
                    fmt, size = ("<d", 8) if elem == 3 else ("<f", 4)
                    items += [struct.unpack(fmt, v2[i:i + size])[0] for i in range(0, len(v2), size)]
                elif elem in (29, 31):
                    items.append(_scalar(elem, wt2, v2))
                elif elem in (19, 21, 23, 25):
                    size = 4 if elem in (19, 23) else 8
                    items += [_scalar(elem, 1, v2[i:i + size]) for i in range(0, len(v2), size)]
                else:
                    items += [_scalar(elem, 0, x) for x in _packed_varints(wt2, v2)]
            value = items
    return name, value


def decode_et(data: bytes, source: str) -> tuple[dict, list[dict]]:
    """(global metadata {version, attrs}, [node dicts]) of a Chakra .et file."""
    msgs, pos = [], 0
    try:
        while pos < len(data):
            n, pos = _varint(data, pos)
            if pos + n > len(data):
                raise ValueError(f"message of {n} bytes at offset {pos} runs past the end ({len(data)} bytes)")
            msgs.append(data[pos:pos + n])
            pos += n
        if not msgs:
            raise ValueError("empty file")
        meta = {"version": "", "attrs": {}}
        for num, _, val in _fields(msgs[0]):
            if num == 1:
                meta["version"] = val.decode("utf-8", "replace")
            elif num == 2:
                k, v = _attr(val)
                meta["attrs"][k] = v
        return meta, [_node(m) for m in msgs[1:]]
    except (ValueError, struct.error, UnicodeDecodeError, TypeError, AttributeError, IndexError) as exc:
        # TypeError / AttributeError / IndexError: a field of another wire type than its number has in the schema
        raise TraceError(f"bad or truncated Chakra ET protobuf: {exc}", path=source) from None


def _node(data: bytes) -> dict:
    node = {"id": 0, "name": "", "type": 0, "data_deps": [], "ctrl_deps": [], "duration_micros": None,
            "attrs": {}}
    for num, wt, val in _fields(data):
        if num == 1:
            node["id"] = val
        elif num == 2:
            node["name"] = val.decode("utf-8", "replace")
        elif num == 3:
            node["type"] = val
        elif num in (4, 5):
            node["ctrl_deps" if num == 4 else "data_deps"] += _packed_varints(wt, val)
        elif num == 7:
            node["duration_micros"] = val
        elif num == 8:
            node["inputs"] = {n: v.decode("utf-8", "replace") for n, w, v in _fields(val) if w == 2}
        elif num == 10:
            k, v = _attr(val)
            node["attrs"][k] = v
    return node


# ---------------------------------------------------------------------------- import
def parse_chakra_et(data: bytes, source: str, rank: int) -> RankTrace:
    meta, nodes = decode_et(data, source)
    check_chakra_et_nodes(nodes, source)      # comet/trace/validate.py
    rt = _to_rank(nodes, source, rank, "chakra_et")
    try:
        info = json.loads(meta["attrs"].get("comet_rank_info") or "{}")
    except (TypeError, ValueError):
        info = {}
    if isinstance(info, dict) and info:
        rt.measured_s, rt.step_start_us = info.get("measured_s"), info.get("step_start_us")
        rt.step, rt.root, rt.world_size = info.get("step"), info.get("root"), info.get("world_size")
    return rt


def parse_chakra_json(doc: dict, source: str, rank: int) -> RankTrace:
    """The feeder's JSON form: {"workload_graph": [{"Id", "Name", "NodeType", "data_deps", "runtime" (us), ...}]}."""
    nodes = []
    for i, n in enumerate(doc["workload_graph"]):
        if not isinstance(n, dict) or "Id" not in n:
            raise TraceError(f"workload_graph[{i}] has no 'Id'", path=source)
        attrs = {k: n[k] for k in ("is_cpu_op", "tensor_size", "comm_type", "comm_size", "comm_src", "comm_dst",
                                   "comm_tag", "num_ops") if k in n}
        nodes.append({"id": n["Id"], "name": str(n.get("Name", "")), "type": int(n.get("NodeType", 0)),
                      "data_deps": list(n.get("data_deps") or []), "duration_micros": n.get("runtime"),
                      "attrs": attrs})
    return _to_rank(nodes, source, rank, "chakra_json")


def _to_rank(nodes: list[dict], source: str, rank: int, fmt: str) -> RankTrace:
    rt = RankTrace(rank=rank, source=source, fmt=fmt, rank_from="file name")
    ids = {}
    for n in nodes:
        nid = n["attrs"].get("comet_id") or f"r{rank}:n{n['id']}"
        if n["id"] in ids:
            raise TraceError(f"duplicate node id {n['id']}", path=source)
        ids[n["id"]] = nid
        op = _op(n, rank)
        rt.add(nid, op)
        if op.is_comm:
            rt.comms.append(nid)
        if n["name"] == "## process_group:init ##":
            _pg_init(rt, n)
    for n in nodes:
        kinds = n["attrs"].get("comet_dep_kinds") or []
        delays = n["attrs"].get("comet_dep_delays_s") or []
        for j, d in enumerate(n["data_deps"]):
            if d not in ids:
                raise TraceError(f"node {n['id']} ({n['name']}) depends on unknown node {d}", path=source)
            kind = DepKind(kinds[j]) if j < len(kinds) and kinds[j] in DepKind._value2member_map_ else DepKind.DATA
            rt.dep(ids[d], ids[n["id"]], kind, float(delays[j]) if j < len(delays) else 0.0)
    return rt


def _op(n: dict, rank: int) -> Op:
    a, t = n["attrs"], n["type"]
    dur = a.get("comet_duration_s")
    if dur is None and n.get("duration_micros") is not None:
        dur = float(n["duration_micros"]) * 1e-6
    cpu = bool(a.get("is_cpu_op", False))
    stream = a.get("comet_stream") or (f"cpu:{a.get('tid', 0)}" if cpu else f"cuda:{a.get('stream', 0)}")
    common = dict(name=n["name"], rank=rank, stream=stream, duration_s=dur, start_s=a.get("comet_start_s"),
                  comm_id=None, group_size=int(a.get("comet_group_size", 1)),
                  group_stride=int(a.get("comet_group_stride", 1)))
    kind = OpKind(a["comet_kind"]) if a.get("comet_kind") in OpKind._value2member_map_ else None
    if t == COMM_COLL and "comm_type" not in a and not cpu and collective_from_kernel(n["name"]):
        return Op(kind=OpKind.COLLECTIVE, collective=collective_from_kernel(n["name"])[1], group="0", **common)
    if t == COMM_COLL and "comm_type" in a:
        ct = int(a["comm_type"])
        coll = COMM_TYPES[ct] if 0 <= ct < len(COMM_TYPES) else None
        return Op(kind=OpKind.COLLECTIVE, collective=coll, msg_bytes=float(a.get("comm_size", 0)),
                  group=str(a.get("pg_name") or "0"), **common)
    if t in (COMM_SEND, COMM_RECV):
        send = t == COMM_SEND
        peer = a.get("comm_dst" if send else "comm_src")
        return Op(kind=OpKind.SEND if send else OpKind.RECV, msg_bytes=float(a.get("comm_size", 0)),
                  peer=int(peer) if peer is not None else None, group=str(a.get("pg_name") or "0"), **common)
    if kind is None:
        kind = OpKind.MEMCPY if t in (MEM_LOAD, MEM_STORE) else OpKind.CPU if cpu or t != COMP else OpKind.COMPUTE
    return Op(kind=kind, flops=float(a.get("num_ops", 0)), bytes=float(a.get("tensor_size", 0)), **common)


def _pg_init(rt: RankTrace, n: dict) -> None:
    try:
        table = json.loads((n.get("inputs") or {}).get("values", "[]"))
        table = table[0] if table and isinstance(table[0], str) else table
        table = json.loads(table) if isinstance(table, str) else table
        for pg in table:
            rt.group_ranks[str(pg.get("pg_name"))] = tuple(pg.get("ranks") or ())
    except (ValueError, TypeError, AttributeError):
        pass


# ---------------------------------------------------------------------------- export
def _key(num: int, wt: int) -> bytes:
    return _enc_varint(num << 3 | wt)


def _len_field(num: int, payload: bytes) -> bytes:
    return _key(num, 2) + _enc_varint(len(payload)) + payload


def _enc_attr(name: str, value) -> bytes:
    out = _len_field(1, name.encode())
    if isinstance(value, bool):
        return out + _key(27, 0) + _enc_varint(int(value))
    if isinstance(value, int):
        num = 7 if name in _INT32_ATTRS else 13 if name in _UINT64_ATTRS else 9
        return out + _key(num, 0) + _enc_varint(value)
    if isinstance(value, float):
        return out + _key(3, 1) + struct.pack("<d", value)
    if isinstance(value, str):
        return out + _len_field(29, value.encode())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return out + _len_field(30, b"".join(_len_field(1, v.encode()) for v in value))
    if isinstance(value, list) and all(isinstance(v, float) for v in value):
        return out + _len_field(4, _len_field(1, b"".join(struct.pack("<d", v) for v in value)))
    raise TypeError(f"attr {name}: cannot encode {type(value).__name__}")


def _node_type(op: Op) -> int:
    if op.kind is OpKind.COLLECTIVE and op.collective in _COMM_TYPE_OF:
        return COMM_COLL
    return {OpKind.SEND: COMM_SEND, OpKind.RECV: COMM_RECV}.get(op.kind, COMP)


def _enc_node(idx: int, nid, op: Op, deps: list[tuple[int, str, float]], p2p_tag: dict) -> bytes:
    t = _node_type(op)
    body = _key(1, 0) + _enc_varint(idx) + _len_field(2, op.name.encode()) + _key(3, 0) + _enc_varint(t)
    if deps:
        body += _len_field(5, b"".join(_enc_varint(d) for d, _, _ in deps))
    if op.duration_s is not None:
        body += _key(7, 0) + _enc_varint(int(round(op.duration_s * 1e6)))
    attrs: dict = {"is_cpu_op": op.kind is OpKind.CPU}
    if t == COMP:
        attrs.update(num_ops=int(op.flops), tensor_size=int(op.bytes))
    elif t == COMM_COLL:
        attrs.update(comm_type=_COMM_TYPE_OF[op.collective], comm_size=int(op.msg_bytes), pg_name=op.group or "0")
    else:
        src, dst = (op.rank, op.peer) if op.kind is OpKind.SEND else (op.peer, op.rank)
        attrs.update(comm_src=int(src if src is not None else -1), comm_dst=int(dst if dst is not None else -1),
                     comm_tag=p2p_tag.get(op.comm_id, 0), comm_size=int(op.msg_bytes), pg_name=op.group or "0")
    attrs.update(comet_id=str(nid), comet_kind=op.kind.value, comet_stream=op.stream,
                 comet_group_size=op.group_size, comet_group_stride=op.group_stride)
    if op.duration_s is not None:
        attrs["comet_duration_s"] = float(op.duration_s)
    if op.start_s is not None:
        attrs["comet_start_s"] = float(op.start_s)
    if deps:
        attrs["comet_dep_kinds"] = [k for _, k, _ in deps]
        attrs["comet_dep_delays_s"] = [float(x) for _, _, x in deps]
    body += b"".join(_len_field(10, _enc_attr(k, v)) for k, v in attrs.items())
    return body


def write_chakra(g: nx.DiGraph, out_dir, prefix: str = "comet") -> list[Path]:
    """One `<prefix>.<rank>.et` per rank: GlobalMetadata, then the rank's nodes in graph order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_rank: dict[int, list] = {}
    for nid, op in ops(g):
        per_rank.setdefault(op.rank, []).append((nid, op))
    p2p = sorted({op.comm_id for _, op in ops(g) if op.kind in (OpKind.SEND, OpKind.RECV) and op.comm_id})
    p2p_tag = {cid: i for i, cid in enumerate(p2p)}
    info = {r["rank"]: r for r in g.graph.get("ranks", []) if isinstance(r, dict)}
    paths = []
    for rank, members in sorted(per_rank.items()):
        index = {nid: i for i, (nid, _) in enumerate(members)}
        meta = _len_field(1, b"0.0.4") + _len_field(2, _enc_attr("comet_rank_info", json.dumps(info.get(rank, {}))))
        chunks = [_enc_varint(len(meta)) + meta]
        for i, (nid, op) in enumerate(members):
            deps = []
            for u in g.predecessors(nid):
                if u not in index:
                    raise TraceError(f"edge {u} -> {nid} crosses ranks; Chakra ET has no cross-rank deps")
                d = g.edges[u, nid]
                deps.append((index[u], d.get("dep", DepKind.DATA).value, float(d.get("delay_s", 0.0))))
            body = _enc_node(i, nid, op, sorted(deps), p2p_tag)
            chunks.append(_enc_varint(len(body)) + body)
        path = out_dir / f"{prefix}.{rank}.et"
        path.write_bytes(b"".join(chunks))
        paths.append(path)
    return paths
