"""Discrete-event replay of a compiled op graph.

Semantics (what a GPU job does):
- each (rank, stream) runs one op at a time; among ready ops the one earliest in topological order
  goes first (streams chained by STREAM edges are therefore FIFO, as on a CUDA stream);
- an op is ready when every predecessor has ended (+ the edge's delay_s);
- ops sharing a comm_id (members of one collective, or both ends of a send/recv) occupy their streams
  from their own start, but the transfer begins only when the last member has arrived (NCCL kernels
  spin until their peers join), and all members end together;
- while a rank has a transfer in flight its compute kernels run `1 + overlap_slowdown` times slower
  (NCCL kernels take SMs and HBM bandwidth), re-timed at each change.
Events are ordered by (time, priority, sequence): simultaneous events always run in the same order
(the SimPy core's rule), so a replay is deterministic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import networkx as nx

from comet.errors import GraphError
from comet.replay.compile import CompiledGraph, compile_graph

_FINISH, _READY = 0, 1   # finishes first at equal times, so a freed stream takes the next op at once


@dataclass
class Replay:
    compiled: CompiledGraph
    start: list[float]          # per compiled index
    end: list[float]
    arrive: list[float]         # when the op took its stream (= start, except comm waiting for peers)
    makespan: float
    rank_end: dict[int, float]
    critical_path: list[int]    # compiled indices, first to last

    def start_of(self, node_id) -> float:
        return self.start[self.compiled.node_ids.index(node_id)]

    def times(self) -> dict:
        """{node_id: (start, end)}."""
        return {nid: (self.start[i], self.end[i]) for i, nid in enumerate(self.compiled.node_ids)}


def replay_graph(g: nx.DiGraph, durations: dict | None = None, overlap_slowdown: float = 0.0) -> Replay:
    """Replay flat op graph `g`; durations default to each Op's measured duration_s (None -> 0)."""
    cg = compile_graph(g)
    if durations is None:
        dur = [op.duration_s or 0.0 for op in cg.ops]
    else:
        dur = [float(durations.get(nid, cg.ops[i].duration_s or 0.0)) for i, nid in enumerate(cg.node_ids)]
    return replay(cg, dur, overlap_slowdown)


def replay(cg: CompiledGraph, dur: list[float], overlap_slowdown: float = 0.0) -> Replay:
    n = len(cg)
    # perf: plain lists bound to locals; no attribute or dict look-ups per event.
    preds, succs, resource, topo = cg.preds, cg.succs, cg.resource, cg.topo
    match, rank, is_compute, is_comm = cg.match, cg.rank, cg.is_compute, cg.is_comm
    indeg = [len(p) for p in preds]
    ready_t = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    arrive = [0.0] * n
    binding = [-1] * n          # the op that determined each op's start (for the critical path)
    busy = [False] * len(cg.resources)
    queue: list[list] = [[] for _ in cg.resources]   # per resource: heap of (topo, index)
    last_on_res = [-1] * len(cg.resources)
    arrived: dict[tuple, int] = {}
    comm_active: dict[int, int] = {}
    running: dict[int, dict[int, list]] = {}   # rank -> {compute index: [remaining, rate, t0, version]}
    version = [0] * n
    heap: list = []
    seq = 0
    slow = 1.0 / (1.0 + overlap_slowdown)

    def push(t, prio, i, v=0):
        nonlocal seq
        heapq.heappush(heap, (t, prio, seq, i, v))
        seq += 1

    def retime(r: int, t: float) -> None:
        rate = slow if comm_active.get(r, 0) else 1.0
        for i, st in running.get(r, {}).items():
            st[0] -= (t - st[2]) * st[1]
            st[1], st[2] = rate, t
            st[3] += 1
            version[i] = st[3]
            push(t + max(st[0], 0.0) / rate, _FINISH, i, st[3])

    def begin_transfer(members: tuple, t: float) -> None:
        d = max(dur[m] for m in members)
        last = max(members, key=lambda m: (arrive[m], topo[m]))
        for m in members:
            start[m] = t
            binding[m] = last if m != last else binding[m]
            push(t + d, _FINISH, m)
        for r in dict.fromkeys(rank[m] for m in members):   # in member order: deterministic, like the kernel
            comm_active[r] = comm_active.get(r, 0) + 1
            if overlap_slowdown and comm_active[r] == 1:
                retime(r, t)

    def try_start(res: int, t: float) -> None:
        if busy[res] or not queue[res]:
            return
        _, i = heapq.heappop(queue[res])
        busy[res] = True
        arrive[i] = t
        prev = last_on_res[res]
        if prev >= 0 and end[prev] >= ready_t[i]:
            binding[i] = prev
        last_on_res[res] = i
        group = match[i]
        if group is not None:
            arrived[group] = arrived.get(group, 0) + 1
            if arrived[group] == len(group):
                begin_transfer(group, t)
            return
        start[i] = t
        if is_comm[i]:
            begin_transfer((i,), t)
        elif is_compute[i] and overlap_slowdown:
            rate = slow if comm_active.get(rank[i], 0) else 1.0
            running.setdefault(rank[i], {})[i] = [dur[i], rate, t, 0]
            push(t + dur[i] / rate, _FINISH, i, 0)
        else:
            push(t + dur[i], _FINISH, i)

    for i in range(n):
        if indeg[i] == 0:
            push(0.0, _READY, i)
    done = 0
    while heap:
        t, prio, _, i, v = heapq.heappop(heap)
        if prio == _READY:
            heapq.heappush(queue[resource[i]], (topo[i], i))
            try_start(resource[i], t)
            continue
        if v != version[i]:
            continue   # a re-timed compute op: this finish time is stale
        end[i] = t
        done += 1
        r = rank[i]
        if is_compute[i] and overlap_slowdown:
            running[r].pop(i, None)
        if is_comm[i]:
            comm_active[r] -= 1
            if overlap_slowdown and comm_active[r] == 0:
                retime(r, t)
        busy[resource[i]] = False
        for s, delay in succs[i]:
            rt = t + delay
            if rt >= ready_t[s]:
                ready_t[s] = rt
                binding[s] = i
            indeg[s] -= 1
            if indeg[s] == 0:
                push(max(ready_t[s], t), _READY, s)
        try_start(resource[i], t)
    if done != n:
        stuck = [cg.ops[i].name for i in range(n) if indeg[i] == 0 and end[i] == 0.0 and match[i]][:3]
        raise GraphError(f"replay deadlocked: {n - done} ops never ran (collectives whose members wait on each "
                         f"other across streams, e.g. {', '.join(stuck) or 'unknown'})")
    makespan = max(end) if n else 0.0
    rank_end: dict[int, float] = {}
    for i in range(n):
        if end[i] > rank_end.get(rank[i], -1.0):
            rank_end[rank[i]] = end[i]
    return Replay(cg, start, end, arrive, makespan, rank_end, _critical_path(end, binding))


def _critical_path(end: list[float], binding: list[int]) -> list[int]:
    if not end:
        return []
    i = max(range(len(end)), key=lambda k: (end[k], -k))
    path = []
    seen = set()
    while i >= 0 and i not in seen:
        seen.add(i)
        path.append(i)
        i = binding[i]
    return path[::-1]
