"""Rescale an imported trace (`comet trace transform`): apply flat-graph transformations to the measured
op graph, replay the original and the transformed graph, and compare them per rank.

Order (fixed): hardware (`with_hardware`, from the cluster the trace was measured on to `cluster`),
then precision (`with_precision`, GEMM kernels on the new hardware), then the data-parallel degree
(`with_dp`, collectives of the data-parallel group re-sized and re-timed on the new hardware). Every
changed op is re-timed by the cost model's ratio new / old (docs/transforms.md); every other op keeps
its measured duration, so the identity (no transformation) replays to exactly the same times.

The graph keeps its ranks: `dp` re-times the collectives of the data-parallel group as if that group
had `dp` members (the other members, like the per-rank work, are assumed identical to the measured
ones: weak scaling of the data-parallel group).

Which collectives form the data-parallel group: those the importer marked group_kind DP, or whose
process group is named in `dp_groups`; when a trace marks none (profiler traces do not say what a
process group is for), the process groups that span every rank of the trace (the world group).

A collective, transfer or copy the cost model gives 0 s on the measured cluster cannot be re-timed by
a ratio (comet/transform/retime.py would replace its measured duration by the new model time, also 0):
a collective whose size the trace does not give (a Kineto trace without its PyTorch ET) or a
host <-> device copy (the model times copies only against a memory-expansion tier). It keeps its
measured duration and is counted as `kept_unmodelled`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.errors import ConfigError, TraceError
from comet.graph.ir import GroupKind, OpKind, ops
from comet.trace.replay import TraceReplayReport, replay_trace

PRECISIONS = ("bf16", "fp16", "fp8")
_RATIO_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV, OpKind.MEMCPY)


@dataclass(frozen=True)
class Rescale:
    """What to change. `from_cluster`: the cluster the trace was measured on (needed for any change)."""
    dp: int | None = None
    cluster: ClusterSpec | None = None
    precision: str | None = None
    from_cluster: ClusterSpec | None = None
    from_precision: str | None = None       # None: the graph's 'precision' attribute, else bf16
    dp_groups: tuple[str, ...] = ()
    tp: int | None = None                   # need layer annotations: raise on a flat trace graph
    pp: int | None = None

    def is_identity(self) -> bool:
        return self.dp is None and self.cluster is None and self.precision is None \
            and self.tp is None and self.pp is None

    def check(self) -> None:
        for name, v in (("--dp", self.dp), ("--tp", self.tp), ("--pp", self.pp)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"must be a whole number >= 1, got {v!r}", field=name)
        for name, p in (("--precision", self.precision), ("--from-precision", self.from_precision)):
            if p is not None and p not in PRECISIONS:
                raise ConfigError(f"must be one of {', '.join(PRECISIONS)}, got {p!r}", field=name)
        if not self.is_identity() and self.from_cluster is None:
            raise ConfigError("give the cluster spec the trace was measured on: re-timing is a ratio of the "
                              "cost model on that cluster and the target (it cannot be inferred from a trace)",
                              field="--from-cluster")


@dataclass
class RescaleResult:
    graph: nx.DiGraph
    transforms: list[str]
    dp_groups: list[str]
    changed: dict
    sums_s: dict


def dp_group_names(g: nx.DiGraph, named: tuple[str, ...] = ()) -> list[str]:
    """Process-group names whose collectives `with_dp` re-sizes (see the module docstring)."""
    comms = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
    groups = {op.group for op in comms if op.group is not None}
    missing = [n for n in named if n not in groups]
    if missing:
        raise ConfigError(f"no collective of the trace is on process group(s) {', '.join(missing)} "
                          f"(groups in the trace: {', '.join(sorted(groups)) or 'none'})", field="--dp-group")
    if named:
        return sorted(set(named))
    if any(op.group_kind is GroupKind.DP for op in comms):
        return sorted({op.group for op in comms if op.group_kind is GroupKind.DP and op.group is not None})
    world = len({op.rank for _, op in ops(g)})
    declared = {r.get("world_size") for r in g.graph.get("ranks", []) if isinstance(r, dict)} - {None}
    sizes = {world} | declared
    return sorted({op.group for op in comms if op.group is not None and op.group_size in sizes})


def rescale(g: nx.DiGraph, how: Rescale) -> RescaleResult:
    """The transformed copy of imported trace graph `g` (never changed) and what changed."""
    from comet.transform import with_dp, with_hardware, with_precision, with_pp, with_tp
    how.check()
    out = g.copy()
    out.graph = dict(g.graph)
    transforms: list[str] = []
    groups: list[str] = []
    if how.tp is not None:
        out = with_tp(out, how.tp)          # GraphError: a flat trace graph has no layer annotations
    if how.pp is not None:
        out = with_pp(out, how.pp)
    if how.is_identity():
        return RescaleResult(out, transforms, groups, {**_changes(g, out), "kept_unmodelled": 0}, _sums(g, out))
    recorded = out.graph.get("precision")
    prec = how.from_precision or (recorded if recorded in PRECISIONS else "bf16")
    out.graph.update(cluster=how.from_cluster, precision=prec, transforms=())
    if how.cluster is not None:
        out = with_hardware(out, how.cluster)
        transforms.append(f"hardware: {how.from_cluster.name} -> {how.cluster.name}")
    if how.precision is not None:
        out = with_precision(out, how.precision)
        transforms.append(f"precision: {prec} -> {how.precision}")
    if how.dp is not None:
        groups = dp_group_names(g, how.dp_groups)
        if not groups:
            raise ConfigError("the trace has no collective on a data-parallel group (none marked DP, none "
                              "spanning every rank): name the process group with --dp-group", field="--dp")
        out = with_dp(out, how.dp, groups=tuple(groups))
        transforms.append(f"dp: group(s) {', '.join(groups)} -> {how.dp} members")
    kept = _keep_unmodelled(g, out, how.from_cluster, prec)
    changed = _changes(g, out)
    changed["kept_unmodelled"] = kept
    return RescaleResult(out, transforms, groups, changed, _sums(g, out))


def _keep_unmodelled(g: nx.DiGraph, out: nx.DiGraph, cluster: ClusterSpec, precision: str) -> int:
    """Restore (and count) the measured op wherever a transformation touched an op the cost model gives
    0 s on the measured cluster: without a model time there is no ratio to carry (module doc)."""
    from comet.replay.timing import op_time_s
    kept = 0
    for nid, op in g.nodes(data="op"):
        new = out.nodes[nid]["op"]
        if new is op or not op.duration_s or op.kind not in _RATIO_KINDS:
            continue
        if op_time_s(op, cluster, precision) <= 0:
            out.nodes[nid]["op"] = op
            kept += 1
    return kept


def _changes(g: nx.DiGraph, out: nx.DiGraph) -> dict:
    retimed = {"compute": 0, "collective": 0, "memcpy": 0, "send_recv": 0, "cpu": 0}
    resized = 0
    for nid, op in g.nodes(data="op"):
        new = out.nodes[nid]["op"]
        if new.duration_s != op.duration_s:
            key = {OpKind.SEND: "send_recv", OpKind.RECV: "send_recv"}.get(op.kind, op.kind.value)
            retimed[key] = retimed.get(key, 0) + 1
        if op.kind is OpKind.COLLECTIVE and new.group_size != op.group_size:
            resized += 1
    return {"retimed": retimed, "resized_collectives": resized}


def _sums(g: nx.DiGraph, out: nx.DiGraph) -> dict:
    """Summed op durations [s] by kind, original and transformed (all ranks)."""
    def total(graph, kind):
        return sum(op.duration_s or 0.0 for _, op in ops(graph) if op.kind is kind)
    return {k.value: {"original_s": total(g, k), "transformed_s": total(out, k)}
            for k in (OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.MEMCPY)}


@dataclass
class Comparison:
    original: TraceReplayReport
    transformed: TraceReplayReport
    result: RescaleResult
    written: list[str] = field(default_factory=list)

    def rows(self) -> list[dict]:
        """Per rank, then 'all': measured, replayed original, transformed, ratio transformed/original."""
        new = {r.rank: r for r in self.transformed.ranks}
        out = [_row(r.rank, r.measured_s, r.predicted_s, new[r.rank].predicted_s) for r in self.original.ranks]
        out.append(_row("all", self.original.measured_s, self.original.predicted_s, self.transformed.predicted_s))
        return out

    def to_dict(self) -> dict:
        rows = self.rows()
        return {"transforms": self.result.transforms, "dp_groups": self.result.dp_groups,
                "ranks": rows[:-1], "overall": rows[-1], "changed": self.result.changed,
                "sums": self.result.sums_s, "aligned": self.original.aligned, "written": self.written}


def _row(rank, measured_s, original_s, transformed_s) -> dict:
    ratio = transformed_s / original_s if original_s else None
    return {"rank": rank, "measured_s": measured_s, "original_predicted_s": original_s,
            "transformed_predicted_s": transformed_s, "ratio": ratio}


def compare(g: nx.DiGraph, how: Rescale, overlap_slowdown: float = 0.0) -> Comparison:
    """Transform `g` and replay both graphs (same rank start offsets: the measured ones)."""
    if g.number_of_nodes() == 0:
        raise TraceError("the trace has no ops to transform")
    res = rescale(g, how)
    before = replay_trace(g, overlap_slowdown=overlap_slowdown, top=0)
    after = replay_trace(res.graph, overlap_slowdown=overlap_slowdown, top=0)
    return Comparison(before, after, res)


def json_safe(g: nx.DiGraph) -> nx.DiGraph:
    """A copy whose graph attributes are plain JSON (the cluster as its name) for write_graph_json; the
    name is stored as 'cluster_name', so a later transform still asks for --from-cluster."""
    out = g.copy()
    attrs = dict(g.graph)
    cluster = attrs.pop("cluster", None)
    if isinstance(cluster, ClusterSpec):
        attrs["cluster_name"] = cluster.name
    if "transforms" in attrs:
        attrs["transforms"] = list(attrs["transforms"])
    out.graph = attrs
    return out
