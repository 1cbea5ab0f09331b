"""Expand a StepGraph into the full flat op graph of one step (every block occurrence as real ops on
its stage's representative rank), for complete timelines, Chakra export and for checking the fast
hierarchical replay against the event engine.

Semantics shared with comet/replay/step.py: a block occurrence starts when the previous one on its
stage has completely finished (its outputs feed the next block); a forward / backward task ends with a
blocking send of the boundary tensor that the next virtual stage waits for; a chunk's gradient buckets
wait for the layer whose backward completes them; its first forward waits for the parameter gather of
its first layer.
"""

from __future__ import annotations

import math

import networkx as nx

from comet.graph.ir import COMPUTE_STREAM, DepKind, GroupKind, Op, OpKind, Phase, StepGraph, new_graph
from comet.replay.schedule import FWD, send_stride, stage_tasks, task_blocks


class _Expander:
    def __init__(self, graph: StepGraph):
        self.src = graph
        self.g = new_graph(source="expanded", meta=dict(graph.meta))
        self.last_on_stream: dict[tuple[int, str], object] = {}

    def add(self, op: Op, deps=(), dep=DepKind.DATA):
        nid = len(self.g)
        self.g.add_node(nid, op=op)
        key = (op.rank, op.stream)
        if key in self.last_on_stream:
            self.g.add_edge(self.last_on_stream[key], nid, dep=DepKind.STREAM)
        self.last_on_stream[key] = nid
        for d in deps:
            if d is not None and d != nid:
                self.g.add_edge(d, nid, dep=dep)
        return nid

    def block(self, key: str, stage: int, mb: int, layer: int, after: list) -> list:
        """Copy block `key` onto `stage`; its sources wait for `after`; returns its sinks."""
        b = self.src.blocks[key]
        if len(b) == 0:
            return after
        ids = {}
        for nid in nx.topological_sort(b):
            op = b.nodes[nid]["op"].with_(rank=stage, microbatch=mb, layer=layer)
            preds = [ids[p] for p in b.predecessors(nid)]
            ids[nid] = self.add(op, preds if preds else after)
        return [ids[n] for n in b if b.out_degree(n) == 0]


def expand(graph: StepGraph) -> nx.DiGraph:
    plan = graph.plan
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    last_vs = pp * vpp - 1
    ex = _Expander(graph)
    gather_ids: dict[tuple[int, int], list] = {}
    for s, st in enumerate(graph.stages):          # parameter gathers issued at step start
        if st.gather_before_forward:
            for bs in st.param_gathers:
                gather_ids[s, bs.chunk] = [ex.add(bs.op.with_(rank=s, name=f"{bs.op.name}[{k}]"))
                                           for k in range(bs.count)]
    orders = [list(zip(*stage_tasks(plan.schedule, pp, vpp, m, s))) for s in range(pp)]
    task_send: dict[tuple, object] = {}            # (phase, virtual stage, mb) -> its send op
    task_tail: dict[int, list] = {s: [] for s in range(pp)}
    layer_done: dict[tuple[int, int], list] = {}   # (stage, chunk) -> sinks after each layer of last bwd
    pos = [0] * pp
    # Visit tasks in an order that respects cross-stage waits: round-robin over stages, each stage
    # advancing while the task it waits for has been placed.
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                ph, c, mb = (int(x) for x in orders[s][pos[s]])
                vs = c * pp + s
                src_vs = vs - 1 if ph == FWD else vs + 1
                need = (ph, src_vs, mb) if 0 <= src_vs <= last_vs else None
                if need is not None and need not in task_send:
                    break
                _emit_task(ex, graph, s, c, ph, mb, vs, need, task_send, task_tail, layer_done, gather_ids)
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule has a cross-stage cycle")
    _emit_tails(ex, graph, task_tail, layer_done)
    return ex.g


def _emit_task(ex, graph, s, c, ph, mb, vs, need, task_send, task_tail, layer_done, gather_ids) -> None:
    plan = graph.plan
    after = list(task_tail[s])
    if need is not None:
        after.append(task_send[need])
    if ph == FWD and mb == 0 and (s, c) in gather_ids:
        n = max(plan.chunk_layers[vs], 1)
        ids = gather_ids[s, c]
        after.append(ids[math.ceil(len(ids) / n) - 1])
    last_bwd = ph != FWD and mb == plan.num_microbatches - 1
    layer = 0
    for key in task_blocks(plan, s, c, ph):
        after = ex.block(key, s, mb, layer, after)
        if key.endswith(("layer.fwd", "layer.bwd")):
            layer += 1
            if last_bwd and key.endswith("layer.bwd"):
                layer_done.setdefault((s, c), []).append(list(after))
    if last_bwd:
        layer_done.setdefault((s, c), []).append(list(after))   # all compute of the task, embedding included
        layer_done.setdefault(("order", s), []).append(c)
    stride = send_stride(plan, s, c, ph)
    if stride is not None:
        send = ex.add(Op(f"pp.send_{'activation' if ph == FWD else 'gradient'}", OpKind.SEND, rank=s,
                         stream=COMPUTE_STREAM, msg_bytes=plan.p2p_bytes, group="pp", group_kind=GroupKind.PP,
                         group_size=2, group_stride=stride, microbatch=mb,
                         phase=Phase.FORWARD if ph == FWD else Phase.BACKWARD), after)
        after = [send]
    task_send[ph, vs, mb] = after[-1] if after else None
    task_tail[s] = after


def _emit_tails(ex, graph, task_tail, layer_done) -> None:
    for s, st in enumerate(graph.stages):
        finished = layer_done.get(("order", s), [])   # chunks in the order their last backward ran
        for bs in sorted(st.grad_buckets, key=lambda b: finished.index(b.chunk)):
            done = layer_done[s, bs.chunk]
            n = len(done) - 1                        # per-layer entries, then "all compute"
            for k in range(bs.count):
                if bs.progressive and n:
                    j = math.ceil((k + 1) * n / bs.count) - 1
                    deps = done[-1] if k == bs.count - 1 else done[j]
                else:
                    deps = done[-1]
                ex.add(bs.op.with_(rank=s, name=f"{bs.op.name}[{k}]"), deps)
        if st.embedding_sync is not None:
            ex.add(st.embedding_sync.with_(rank=s), task_tail[s])
        dp_last = ex.last_on_stream.get((s, "comm.dp"))
        opt_ids = [ex.add(op.with_(rank=s), task_tail[s] + ([dp_last] if dp_last is not None else []))
                   for op in st.optimizer]
        if not st.gather_before_forward:
            for bs in st.param_gathers:
                for k in range(bs.count):
                    ex.add(bs.op.with_(rank=s, name=f"{bs.op.name}[{k}]"), opt_ids)
