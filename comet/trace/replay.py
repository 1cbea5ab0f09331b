"""Replay an imported trace graph and compare with the iteration time measured in the trace.

Per rank, measured = span from the rank's step start to the end of its last imported op (CPU or
GPU); predicted = the replay's end of that rank. When the ranks' clocks are comparable (same host:
the step starts lie closer together than the shortest step), each rank's replay starts at its
measured offset from the earliest rank, as in the trace; otherwise every rank starts at 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from comet.graph.ir import OpKind
from comet.replay.engine import Replay, replay_graph


@dataclass(frozen=True)
class RankResult:
    rank: int
    measured_s: float | None
    predicted_s: float
    error_pct: float | None


@dataclass
class TraceReplayReport:
    ranks: list[RankResult]
    measured_s: float | None
    predicted_s: float
    error_pct: float | None
    aligned: bool                                   # ranks started at their measured offsets
    critical_path: list[dict] = field(default_factory=list)   # top ops on it, longest first
    critical_path_len: int = 0
    replay: Replay | None = None

    def to_dict(self) -> dict:
        return {"ranks": [r.__dict__ for r in self.ranks], "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "error_pct": self.error_pct, "aligned": self.aligned,
                "critical_path": self.critical_path, "critical_path_ops": self.critical_path_len}


def _err(pred: float, meas: float | None) -> float | None:
    return None if not meas else 100.0 * (pred - meas) / meas


def timing_gaps(g: nx.DiGraph) -> tuple[int, list[str]]:
    """(timed ops, warnings) of a graph about to be replayed with its measured durations only: an op
    without one replays as 0 s, which silently makes a host-only execution trace or a Chakra trace
    (collectives with a comm_size but no duration) a 0 ms step."""
    ops = [op for _, op in g.nodes(data="op") if op is not None]
    timed = sum(1 for op in ops if op.duration_s)
    untimed = [op for op in ops if not op.duration_s]
    notes = []
    if untimed and timed:
        notes.append(f"{len(untimed)} of {len(ops)} ops have no measured duration and replay as 0 s")
    sized = [op for op in untimed if op.is_comm and op.msg_bytes > 0]
    if sized:
        total = sum(op.msg_bytes for op in sized)
        notes.append(f"{len(sized)} communication ops carry a size ({total / 2**20:,.1f} MiB in all) but no "
                     "duration: this replay uses measured durations only and does not cost sizes")
    return timed, notes


def rank_offsets(g: nx.DiGraph) -> dict[int, float]:
    """Measured step-start offset of each rank [s] from the earliest rank, {} when not comparable."""
    info = [r for r in g.graph.get("ranks", []) if isinstance(r, dict)]
    if len(info) < 2 or any(r.get("step_start_us") is None or r.get("root") not in g for r in info):
        return {}
    starts = [r["step_start_us"] for r in info]
    shortest_us = min((r.get("measured_s") or 0.0) for r in info) * 1e6
    if max(starts) - min(starts) >= shortest_us:
        return {}                     # clocks of different hosts: starts are not comparable
    return {r["rank"]: (r["step_start_us"] - min(starts)) * 1e-6 for r in info}


def replay_trace(g: nx.DiGraph, overlap_slowdown: float = 0.0, top: int = 10) -> TraceReplayReport:
    info = {r["rank"]: r for r in g.graph.get("ranks", []) if isinstance(r, dict)}
    offsets = rank_offsets(g)
    # the root (step start) node of each rank lasts its measured offset: the rank starts then
    durations = {info[r]["root"]: off for r, off in offsets.items()} if offsets else None
    rep = replay_graph(g, durations=durations, overlap_slowdown=overlap_slowdown)
    results = []
    for r in sorted(rep.rank_end):
        pred = rep.rank_end[r] - offsets.get(r, 0.0)
        meas = info.get(r, {}).get("measured_s")
        results.append(RankResult(r, meas, pred, _err(pred, meas)))
    have = [r for r in results if r.measured_s is not None]
    if have and len(have) == len(results):
        measured = max(offsets.get(r.rank, 0.0) + r.measured_s for r in have) - min(offsets.values(), default=0.0)
    else:
        measured = None
    predicted = rep.makespan
    return TraceReplayReport(results, measured, predicted, _err(predicted, measured), bool(offsets),
                             _top_of_path(rep, top, {r.get("root") for r in info.values()}), len(rep.critical_path),
                             rep)


def _top_of_path(rep: Replay, top: int, roots: set) -> list[dict]:
    cg = rep.compiled
    rows = []
    for i in rep.critical_path:
        if cg.node_ids[i] in roots:
            continue                  # a rank's start offset, not work
        op = cg.ops[i]
        rows.append({"node": str(cg.node_ids[i]), "name": op.name, "rank": op.rank, "stream": op.stream,
                     "kind": op.kind.value, "start_s": rep.start[i], "duration_s": rep.end[i] - rep.start[i]})
    rows.sort(key=lambda d: -d["duration_s"])
    return rows[:top]


def timeline(rep: Replay) -> dict:
    """Chrome trace of the replayed timeline (opens in Perfetto / chrome://tracing): pid = rank, tid = stream."""
    cg = rep.compiled
    events = []
    for r in sorted(set(cg.rank)):
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
    for i, op in enumerate(cg.ops):
        args = {"kind": op.kind.value}
        if op.is_comm:
            args.update(comm_id=op.comm_id, msg_bytes=op.msg_bytes, group=op.group,
                        collective=op.collective.value if op.collective else None)
        if op.kind is OpKind.COMPUTE and op.flops:
            args["flops"] = op.flops
        events.append({"ph": "X", "name": op.name, "cat": op.kind.value, "pid": op.rank, "tid": op.stream,
                       "ts": rep.start[i] * 1e6, "dur": (rep.end[i] - rep.start[i]) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
