"""PyTorch Execution Trace (host ET) -> comm records and a timing-free `RankTrace`
(docs/trace-formats.md §2).

Two layouts: schema 1.0.1 keeps `parent`, `tid`, `inputs` (values), `input_types` flat on each node;
>= 1.0.2 puts `ctrl_deps` (parent id), `inputs: {values, shapes, types}` and an `attrs` list
[{name, type, value}] (rf_id, tid, ... and on newer record_param_comms: collective_name, dtype,
in_msg_nelems, out_msg_nelems, pg_name, pg_size, global_rank_start/stride).
A tensor is a 6-tuple [tensor_id, storage_id, offset, numel, itemsize, device].
An ET has no timings: every op gets `duration_s=None`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from comet.errors import TraceError
from comet.graph.ir import DepKind, Op, OpKind
from comet.trace.common import RankTrace, collective_from_name, dtype_bytes, msg_bytes_of

_ROOT_PREFIX = "[pytorch|profiler|execution_"


@dataclass(frozen=True)
class CommRecord:
    """One collective as the ET records it (a record_param_comms that is not a `wait`)."""
    et_id: int
    collective: str          # c10d name: "allreduce", "all_to_allv", ...
    in_bytes: float
    out_bytes: float
    group: str | None
    group_size: int | None


def is_pytorch_et(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc


def _norm(node: dict) -> dict:
    """Uniform view of a node of either layout: id, name, parent, tid, values, attrs (dict)."""
    attrs = {a.get("name"): a.get("value") for a in node.get("attrs") or [] if isinstance(a, dict)}
    inputs, outputs = node.get("inputs"), node.get("outputs")
    values = inputs.get("values", []) if isinstance(inputs, dict) else (inputs or [])
    out_values = outputs.get("values", []) if isinstance(outputs, dict) else (outputs or [])
    parent = node.get("parent", node.get("ctrl_deps"))
    return {"id": node.get("id"), "name": str(node.get("name", "")), "parent": parent,
            "tid": node.get("tid", attrs.get("tid", 0)), "values": values, "out_values": out_values, "attrs": attrs}


def _tensor_bytes(v) -> float:
    """Bytes of a tensor 6-tuple, or of a (nested) list of them; 0 for anything else."""
    if isinstance(v, list):
        if len(v) == 6 and all(isinstance(x, int) for x in v[:5]) and isinstance(v[5], str):
            return float(v[3] * v[4])
        return sum(_tensor_bytes(x) for x in v)
    return 0.0


def _pg_table(nodes: list[dict]) -> dict:
    for n in nodes:
        if n["name"] == "## process_group:init ##" and n["values"]:
            try:
                table = json.loads(n["values"][0])
            except (TypeError, ValueError):
                return {}
            return {str(pg.get("pg_name")): pg for pg in table if isinstance(pg, dict)}
    return {}


def comm_records(doc: dict, source: str) -> list[CommRecord]:
    """Collectives of the ET in issue (id) order."""
    if not is_pytorch_et(doc):
        raise TraceError("not a PyTorch execution trace (no 'schema' and 'nodes')", path=source)
    nodes = [_norm(n) for n in doc["nodes"] if isinstance(n, dict)]
    pgs = _pg_table(nodes)
    out = []
    for n in sorted(nodes, key=lambda n: n["id"] if isinstance(n["id"], int) else -1):
        if n["name"] != "record_param_comms":
            continue
        a, vals = n["attrs"], n["values"]
        coll = a.get("collective_name") or next((v for v in vals[:6] if isinstance(v, str) and v != "<Object>"), None)
        if not coll or coll == "wait":
            continue
        if "in_msg_nelems" in a:
            elem = dtype_bytes(a.get("dtype"))
            in_b, out_b = float(a["in_msg_nelems"]) * elem, float(a.get("out_msg_nelems", 0)) * elem
        else:
            in_b, out_b = _tensor_bytes(vals[:1]), _tensor_bytes(n["out_values"][:1])
        group = a.get("pg_name")
        if group is None and len(vals) > 2 and isinstance(vals[2], list) and vals[2] and isinstance(vals[2][0], str):
            group = vals[2][0]                                   # 1.1.0: ("0", "default_pg")
        if group is None and len(pgs) == 1:
            group = next(iter(pgs))
        size = a.get("pg_size") or (pgs.get(str(group), {}).get("group_size") if group is not None else None)
        out.append(CommRecord(n["id"], str(coll), in_b, out_b, None if group is None else str(group),
                              int(size) if isinstance(size, int) else None))
    return out


def parse_pytorch_et(doc: dict, source: str, rank: int) -> RankTrace:
    """Timing-free graph: outermost operators of each thread (CPU, chained in id order = issue order),
    collectives on a "comm" stream launched by their enclosing operator."""
    if not is_pytorch_et(doc):
        raise TraceError("not a PyTorch execution trace (no 'schema' and 'nodes')", path=source)
    rt = RankTrace(rank=rank, source=source, fmt="pytorch_et", pid=doc.get("pid"))
    nodes = [_norm(n) for n in doc["nodes"] if isinstance(n, dict)]
    by_id = {n["id"]: n for n in nodes}
    roots = {n["id"] for n in nodes if n["name"].startswith(_ROOT_PREFIX)}
    pgs = _pg_table(nodes)
    for name, pg in pgs.items():
        rt.group_ranks[name] = tuple(pg.get("ranks") or ())
        rt.world_size = max(rt.world_size or 0, int(pg.get("group_size") or 0)) or None
    top_of: dict = {}

    def top(nid):
        """Outermost operator ("aten::", "c10d::", ...: a '::' in the name) enclosing nid, or None;
        record_function ranges ("## forward ##", "[param|...]") are transparent."""
        path, found = [], None
        while nid in by_id and nid not in roots and nid not in top_of:
            path.append(nid)
            if "::" in by_id[nid]["name"]:
                found = nid
            nid = by_id[nid]["parent"]
        above = top_of.get(nid)
        result = above if above is not None else found
        for p in path:
            top_of[p] = result
        return result

    last_on_thread: dict = {}
    records = {r.et_id: r for r in comm_records(doc, source)}
    last_comm = None
    for n in sorted(nodes, key=lambda n: n["id"] if isinstance(n["id"], int) else -1):
        if top(n["id"]) == n["id"]:
            nid = rt.add(f"r{rank}:e{n['id']}", Op(name=n["name"], kind=OpKind.CPU, rank=rank,
                                                  stream=f"cpu:{n['tid']}", duration_s=None))
            prev = last_on_thread.get(n["tid"])
            if prev is not None:
                rt.dep(prev, nid, DepKind.STREAM)
            last_on_thread[n["tid"]] = nid
        rec = records.get(n["id"])
        if rec is None:
            continue
        kinds = collective_from_name(rec.collective) or (OpKind.COLLECTIVE, None)
        cid = rt.add(f"r{rank}:e{n['id']}:comm", Op(
            name=f"nccl:{rec.collective}", kind=kinds[0], collective=kinds[1], rank=rank, stream="comm",
            msg_bytes=msg_bytes_of(kinds[1], kinds[0], rec.in_bytes, rec.out_bytes), group=rec.group or "0",
            group_size=rec.group_size or 1, duration_s=None))
        parent = top(n["id"])
        if parent is not None and f"r{rank}:e{parent}" in rt.nodes:
            rt.dep(f"r{rank}:e{parent}", cid, DepKind.LAUNCH)
        if last_comm is not None:
            rt.dep(last_comm, cid, DepKind.STREAM)
        last_comm = cid
        rt.comms.append(cid)
    return rt
