"""comet's own graph JSON: networkx node-link form with each Op as a plain dict.

{"comet_graph": 1, "graph": {...}, "nodes": [{"id", "op": {...}}], "edges": [{"source", "target",
"dep", "delay_s"?}]}. `comet trace import -o graph.json` writes it, `comet trace replay` reads it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path

import networkx as nx

from comet.errors import TraceError
from comet.graph.ir import Collective, DepKind, GroupKind, KernelClass, Op, OpKind, Phase, check_acyclic

FORMAT_VERSION = 1
_ENUMS = {"kind": OpKind, "kernel": KernelClass, "collective": Collective, "group_kind": GroupKind, "phase": Phase}
_FIELDS = {f.name for f in dataclasses.fields(Op)}


def is_graph_json(doc) -> bool:
    return isinstance(doc, dict) and "comet_graph" in doc


def _op_dict(op: Op) -> dict:
    out = {}
    for f in dataclasses.fields(Op):
        v = getattr(op, f.name)
        if v == f.default:
            continue
        out[f.name] = v.value if isinstance(v, enum.Enum) else list(v) if isinstance(v, tuple) else v
    out["name"], out["kind"] = op.name, op.kind.value
    return out


def graph_to_json(g: nx.DiGraph) -> dict:
    return {"comet_graph": FORMAT_VERSION, "graph": dict(g.graph),
            "nodes": [{"id": nid, "op": _op_dict(d["op"])} for nid, d in g.nodes(data=True)],
            "edges": [{"source": u, "target": v, "dep": d.get("dep", DepKind.DATA).value,
                       **({"delay_s": d["delay_s"]} if d.get("delay_s") else {})} for u, v, d in g.edges(data=True)]}


def write_graph_json(g: nx.DiGraph, path) -> None:
    Path(path).write_text(json.dumps(graph_to_json(g), separators=(",", ":")))


def _op_from(d, where: str) -> Op:
    if not isinstance(d, dict) or "name" not in d or "kind" not in d:
        raise TraceError(f"{where}: an op needs 'name' and 'kind'")
    if d["kind"] is None:   # the other enum fields may be null (absent); an op's kind may not
        raise TraceError(f"{where}.kind: must be one of {', '.join(k.value for k in OpKind)}, got null")
    unknown = set(d) - _FIELDS
    if unknown:
        raise TraceError(f"{where}: unknown op field(s) {', '.join(sorted(unknown))}")
    kw = dict(d)
    try:
        for k, cls in _ENUMS.items():
            if kw.get(k) is not None:
                kw[k] = cls(kw[k])
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None
    if "shape" in kw:
        kw["shape"] = tuple(kw["shape"])
    return Op(**kw)


def graph_from_json(doc: dict, source: str) -> nx.DiGraph:
    if doc.get("comet_graph") != FORMAT_VERSION:
        raise TraceError(f"comet graph format {doc.get('comet_graph')!r} is not supported (expected "
                         f"{FORMAT_VERSION})", path=source)
    g = nx.DiGraph()
    g.graph.update(doc.get("graph") or {})
    try:
        for i, n in enumerate(doc["nodes"]):
            g.add_node(n["id"], op=_op_from(n.get("op"), f"nodes[{i}]"))
        for i, e in enumerate(doc["edges"]):
            u, v = e["source"], e["target"]
            if u not in g or v not in g:
                raise TraceError(f"edges[{i}]: refers to unknown node {u if u not in g else v!r}")
            attrs = {"dep": DepKind(e.get("dep", "data"))}
            if e.get("delay_s"):
                attrs["delay_s"] = float(e["delay_s"])
            g.add_edge(u, v, **attrs)
    except TraceError as exc:
        raise TraceError(str(exc), path=source) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"malformed comet graph JSON ({type(exc).__name__}: {exc})", path=source) from None
    check_acyclic(g, source)
    return g
