"""The validation layer every trace file passes before a reader interprets it (one check per format).

Readers (kineto.py, pytorch_et.py, chakra.py, graph_json.py) may then assume well-typed documents: ids of
one scalar type and unique, numbers finite and in range, dependencies that exist and form no cycle. A
broken file is a TraceError naming the file, the node (index and id), the field, the rule and the value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any

from comet.errors import ConfigError, TraceError

MAX_ABS = 1e18      # timestamps in us since the epoch are ~2e15; counts and bytes are far smaller
ET_ROOT_PREFIX = "[pytorch|profiler|execution_"   # as comet/trace/pytorch_et.py _ROOT_PREFIX
MAX_DEPTH = 200     # JSON nesting; real traces nest < 10 levels


def decode_json(data: bytes, name: str) -> Any:
    """Parse JSON text; bounded nesting, and a clear line for every way the bytes can be wrong."""
    if _nesting_exceeds(data, MAX_DEPTH):
        raise TraceError(f"JSON nested deeper than {MAX_DEPTH} levels", path=name)
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        raise TraceError("not a text JSON file (binary data)", path=name) from None
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(data.rstrip()) - 1 else ""
        raise TraceError(f"bad JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}", path=name) from None
    except (RecursionError, ValueError) as exc:
        raise TraceError(f"unreadable JSON ({type(exc).__name__}: {str(exc)[:80]})", path=name) from None


def _nesting_exceeds(data: bytes, limit: int) -> bool:
    """Cheap pre-check: the deepest run of opening brackets (ignores brackets inside strings only
    approximately, which errs on the side of parsing)."""
    depth = best = 0
    for b in data[:1_000_000] if len(data) > 1_000_000 else data:
        if b in (0x5B, 0x7B):
            depth += 1
            if depth > best:
                best = depth
                if best > limit:
                    return True
        elif b in (0x5D, 0x7D):
            depth -= 1
    return False


# ----------------------------------------------------------------------------- value rules

def _fail(name: str, where: str, rule: str, value: Any) -> TraceError:
    shown = repr(value)
    return TraceError(f"{where} {rule}, got {shown[:80]}", path=name)


def number(value: Any, name: str, where: str, *, low: float | None = 0.0, optional: bool = True) -> None:
    """A finite JSON number (not a bool), >= low when low is given."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, where, "must be a number", value)
    try:
        ok = math.isfinite(value) and abs(value) <= MAX_ABS
    except OverflowError:
        ok = False
    if not ok:
        raise _fail(name, where, f"must be a finite number of magnitude <= {MAX_ABS:g}", value)
    if low is not None and value < low:
        raise _fail(name, where, f"must be >= {low:g}", value)


def integer(value: Any, name: str, where: str, *, low: int | None = None, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, where, "must be an integer", value)
    if abs(value) > MAX_ABS:
        raise _fail(name, where, f"must be of magnitude <= {MAX_ABS:g}", value)
    if low is not None and value < low:
        raise _fail(name, where, f"must be >= {low}", value)


def _list_of_dicts(value: Any, name: str, where: str, what: str, allow_empty: bool = False) -> list[dict]:
    if not isinstance(value, list):
        raise _fail(name, where, "must be a list", type(value).__name__)
    if not value and not allow_empty:
        raise TraceError(f"{where} is empty: the trace holds no {what}", path=name)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _fail(name, f"{where}[{i}]", "must be an object", item)
    return value


def find_cycle(edges: dict[Any, list[Any]]) -> list[Any] | None:
    """A dependency cycle (as node ids, first repeated at the end) in {node: [predecessors]}, or None.
    Iterative three-colour DFS: bounded stack whatever the graph."""
    colour: dict[Any, int] = {}
    for start in edges:
        if colour.get(start):
            continue
        stack = [(start, iter(edges.get(start, ())))]
        colour[start] = 1
        path = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
                continue
            state = colour.get(nxt, 0)
            if state == 1:
                return path[path.index(nxt):] + [nxt]
            if state == 0 and nxt in edges:
                colour[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))
                path.append(nxt)
    return None


def _cycle_error(cycle: list, name: str, relation: str) -> TraceError:
    if len(cycle) == 2:
        return TraceError(f"node {cycle[0]!r} is its own {relation}", path=name)
    shown = " -> ".join(repr(c) for c in cycle[:8]) + (" -> ..." if len(cycle) > 8 else "")
    return TraceError(f"{relation} cycle between nodes {shown}", path=name)


# ----------------------------------------------------------------------------- formats

# Kineto args the readers use as ids / counts / sizes (PyTorch profiler output; docs/trace-formats.md)
KINETO_INT_ARGS = ("correlation", "stream", "device", "External id", "Record function id", "In msg nelems",
                   "Out msg nelems", "Group size")
KINETO_NUMBER_ARGS = ("bytes",)


def check_kineto(doc: dict, name: str) -> None:
    events = _list_of_dicts(doc.get("traceEvents"), name, "traceEvents", "events", allow_empty=True)
    for i, e in enumerate(events):
        where = f"traceEvents[{i}]"
        for key in ("ph", "name", "cat"):
            if key in e and not isinstance(e[key], str):
                raise _fail(name, f"{where}.{key}", "must be a string", e[key])
        if e.get("ph") == "X":        # a complete event: the readers place it by all four
            for key in ("ts", "pid", "tid"):
                if key not in e:
                    raise TraceError(f"{where}: a complete event (ph X) needs '{key}'", path=name)
        if "ts" in e:
            number(e["ts"], name, f"{where}.ts", low=0.0)
        if "dur" in e:
            number(e["dur"], name, f"{where}.dur", low=0.0)
        for key in ("pid", "tid"):
            if key in e and (not isinstance(e[key], (int, str)) or isinstance(e[key], bool)):
                raise _fail(name, f"{where}.{key}", "must be an integer or a string", e[key])
        args = e.get("args")
        if args is None:
            continue
        if not isinstance(args, dict):
            raise _fail(name, f"{where}.args", "must be an object", args)
        for key in KINETO_INT_ARGS:
            if args.get(key) is not None:
                integer(args[key], name, f"{where}.args.{key}", low=-1)
        for key in KINETO_NUMBER_ARGS:
            if args.get(key) is not None:
                number(args[key], name, f"{where}.args.{key}")


def check_pytorch_et(doc: dict, name: str) -> None:
    nodes = _list_of_dicts(doc.get("nodes"), name, "nodes", "nodes")
    ids: dict[int, int] = {}
    for i, n in enumerate(nodes):
        where = f"nodes[{i}]"
        integer(n.get("id"), name, f"{where}.id", low=0)
        if n["id"] in ids:
            raise TraceError(f"{where}: duplicate node id {n['id']} (also nodes[{ids[n['id']]}])", path=name)
        ids[n["id"]] = i
        if not isinstance(n.get("name"), str):
            raise _fail(name, f"{where}.name (node {n['id']})", "must be a string", n.get("name"))
        for key in ("parent", "ctrl_deps"):
            if key in n:
                integer(n[key], name, f"{where}.{key} (node {n['id']})", optional=True, low=0)
        for key in ("inputs", "outputs", "attrs"):
            if key in n and n[key] is not None and not isinstance(n[key], (list, dict)):
                raise _fail(name, f"{where}.{key} (node {n['id']})", "must be a list or an object", n[key])
        if isinstance(n.get("attrs"), list) and any(not isinstance(a, dict) for a in n["attrs"]):
            raise _fail(name, f"{where}.attrs (node {n['id']})", "must be a list of objects", n["attrs"])
    parents = {}
    for n in nodes:
        p = n.get("parent", n.get("ctrl_deps"))
        # the root "[pytorch|profiler|execution_trace|process]" is its own parent by convention; readers stop there
        root = n["name"].startswith(ET_ROOT_PREFIX)
        parents[n["id"]] = [p] if p in ids and not root else []
    cycle = find_cycle(parents)
    if cycle:
        raise _cycle_error(cycle, name, "parent")


def _chakra_nodes(nodes: list[dict], name: str, where_list: str, keys: dict[str, str]) -> None:
    """Shared by Chakra JSON (feeder keys) and decoded Chakra ET protobuf nodes."""
    k_id, k_type, k_deps, k_ctrl, k_dur = keys["id"], keys["type"], keys["data_deps"], keys["ctrl_deps"], keys["dur"]
    ids: dict[int, int] = {}
    for i, n in enumerate(nodes):
        where = f"{where_list}[{i}]"
        integer(n.get(k_id), name, f"{where}.{k_id}", low=0)
        nid = n[k_id]
        if nid in ids:
            raise TraceError(f"{where}: duplicate node id {nid} (also {where_list}[{ids[nid]}])", path=name)
        ids[nid] = i
        integer(n.get(k_type, 0), name, f"{where}.{k_type} (node {nid})", low=0)
        if "name" in keys and keys["name"] in n and not isinstance(n[keys["name"]], str):
            raise _fail(name, f"{where}.{keys['name']} (node {nid})", "must be a string", n[keys["name"]])
        for k in (k_deps, k_ctrl):
            deps = n.get(k)
            if deps is None:
                continue
            if not isinstance(deps, list):
                raise _fail(name, f"{where}.{k} (node {nid})", "must be a list of node ids", deps)
            for d in deps:
                integer(d, name, f"{where}.{k} (node {nid})", low=0)
        number(n.get(k_dur), name, f"{where}.{k_dur} (node {nid})")
        attrs = n.get("attrs", n)
        for k in ("comm_size", "tensor_size", "num_ops", "comet_duration_s", "comet_start_s"):
            if isinstance(attrs, dict) and k in attrs:
                number(attrs[k], name, f"{where}.{k} (node {nid})", low=0.0 if k != "comet_start_s" else None)
        for k in ("comm_type", "comet_group_size", "comet_group_stride", "comm_src", "comm_dst"):
            if isinstance(attrs, dict) and attrs.get(k) is not None:
                integer(attrs[k], name, f"{where}.{k} (node {nid})", low=0)
        delays = attrs.get("comet_dep_delays_s") if isinstance(attrs, dict) else None
        if delays is not None:
            if not isinstance(delays, list):
                raise _fail(name, f"{where}.comet_dep_delays_s (node {nid})", "must be a list", delays)
            for d in delays:
                number(d, name, f"{where}.comet_dep_delays_s (node {nid})")
    deps = {n[k_id]: [d for d in (n.get(k_deps) or []) if d in ids] for n in nodes}
    cycle = find_cycle(deps)
    if cycle:
        raise _cycle_error(cycle, name, "data dependency")


def check_chakra_json(doc: dict, name: str) -> None:
    nodes = _list_of_dicts(doc.get("workload_graph"), name, "workload_graph", "nodes")
    _chakra_nodes(nodes, name, "workload_graph", {"id": "Id", "type": "NodeType", "data_deps": "data_deps",
                                                  "ctrl_deps": "ctrlDeps", "dur": "runtime", "name": "Name"})


def check_chakra_et_nodes(nodes: list[dict], name: str) -> None:
    if not nodes:
        raise TraceError("the Chakra ET holds no nodes", path=name)
    _chakra_nodes(nodes, name, "node", {"id": "id", "type": "type", "data_deps": "data_deps",
                                        "ctrl_deps": "ctrl_deps", "dur": "duration_micros", "name": "name"})


def check_graph_json(doc: dict, name: str) -> None:
    from comet.config.loader import convert
    from comet.graph.ir import Op
    nodes = _list_of_dicts(doc.get("nodes"), name, "nodes", "nodes")
    edges = doc.get("edges")
    if not isinstance(edges, list):
        raise _fail(name, "edges", "must be a list", edges)
    hints = typing.get_type_hints(Op)
    fields = {f.name for f in dataclasses.fields(Op)}
    ids: dict = {}
    for i, n in enumerate(nodes):
        nid = n.get("id")
        if isinstance(nid, bool) or not isinstance(nid, (str, int)):
            raise _fail(name, f"nodes[{i}].id", "must be a string or an integer", nid)
        if nid in ids:
            raise TraceError(f"nodes[{i}]: duplicate node id {nid!r} (also nodes[{ids[nid]}])", path=name)
        ids[nid] = i
        op = n.get("op")
        if not isinstance(op, dict):
            raise _fail(name, f"nodes[{i}].op (node {nid!r})", "must be an object", op)
        for k, v in op.items():
            if k not in fields or k in _ENUM_FIELDS:
                continue          # the reader names unknown fields and bad enum values
            try:
                convert(hints[k], v, name, f"nodes[{i}].op.{k} (node {nid!r})")
            except ConfigError as exc:
                raise TraceError(str(exc)) from None
            if k in ("flops", "bytes", "msg_bytes", "duration_s", "dtype_bytes"):
                number(v, name, f"nodes[{i}].op.{k} (node {nid!r})")
            elif k == "start_s":
                number(v, name, f"nodes[{i}].op.{k} (node {nid!r})", low=None)
            elif k in ("group_size", "group_stride"):
                integer(v, name, f"nodes[{i}].op.{k} (node {nid!r})", low=1)
            elif k == "shape":
                for d in v:
                    integer(d, name, f"nodes[{i}].op.shape (node {nid!r})", low=0)
    _graph_meta(doc.get("graph"), name, "graph")
    kinds = {type(k) for k in ids}
    if len(kinds) > 1:
        raise TraceError("node ids mix strings and integers", path=name)
    for i, e in enumerate(edges):
        if not isinstance(e, dict):
            raise _fail(name, f"edges[{i}]", "must be an object", e)
        for key in ("source", "target"):
            v = e.get(key)
            if isinstance(v, (list, dict)) or v not in ids:
                raise _fail(name, f"edges[{i}].{key}", "must name a node", v)
        if "delay_s" in e:
            number(e["delay_s"], name, f"edges[{i}].delay_s")
    # cycles: graph_from_json runs comet.graph.ir.check_acyclic on the built graph


def _graph_meta(value: Any, name: str, where: str) -> None:
    """The graph's metadata (ranks, measured times): every number finite, times (`*_s`) >= 0; `ranks` a
    list of objects (the replay reads one per rank)."""
    if where == "graph" and value is not None and not isinstance(value, dict):
        raise _fail(name, where, "must be an object", value)
    if where == "graph" and isinstance(value, dict) and "ranks" in value:
        ranks = value["ranks"]
        if not isinstance(ranks, list) or any(not isinstance(r, dict) for r in ranks):
            raise _fail(name, "graph.ranks", "must be a list of objects", ranks)
        for i, r in enumerate(ranks):
            _rank_info(r, name, f"graph.ranks[{i}]")
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                number(v, name, f"{where}.{k}", low=0.0 if str(k).endswith("_s") else None)
            else:
                _graph_meta(v, name, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                number(v, name, f"{where}[{i}]", low=None)
            else:
                _graph_meta(v, name, f"{where}[{i}]")


def _rank_info(r: dict, name: str, where: str) -> None:
    """What the trace replay reads of a rank (comet/trace/replay.py): its number, its measured step time and
    step start (numbers or null) and its root node's id (a string or an integer, or null)."""
    rank = r.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise _fail(name, f"{where}.rank", "must be a rank number (an integer >= 0)", rank)
    number(r.get("measured_s"), name, f"{where}.measured_s")
    number(r.get("step_start_us"), name, f"{where}.step_start_us", low=None)
    root = r.get("root")
    if root is not None and (isinstance(root, bool) or not isinstance(root, (str, int))):
        raise _fail(name, f"{where}.root", "must be a node id (a string or an integer) or null", root)


_ENUM_FIELDS = {"kind", "kernel", "collective", "group_kind", "phase"}
CHECKS = {"kineto": check_kineto, "pytorch_et": check_pytorch_et, "chakra_json": check_chakra_json,
          "comet_graph": check_graph_json}


def check_trace_document(kind: str, doc: Any, name: str) -> None:
    """Run the format's checks on a classified JSON document (Chakra ET is checked after decoding)."""
    check = CHECKS.get(kind)
    if check is not None:
        check(doc, name)
