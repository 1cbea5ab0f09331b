"""Cross-rank linking: rank set checks, ET message sizes, collective matching, one networkx graph.

Collectives are matched across ranks by (process group, order on that group): NCCL requires every
member of a communicator to issue the same collectives in the same order, so the i-th collective of
group G is the same operation on every member (docs/trace-formats.md §1.5; HTA and Chakra match the
same way). Matched ops get `comm_id = "<group>#<i>"`.
"""

from __future__ import annotations

import networkx as nx

from comet.errors import GraphError, TraceError
from comet.graph.ir import OpKind, check_acyclic
from comet.trace.common import RankTrace, collective_from_name, msg_bytes_of
from comet.trace.pytorch_et import CommRecord


def check_rank_set(traces: list[RankTrace]) -> None:
    """Ranks must be distinct, and a multi-rank set must hold every rank of the job."""
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise TraceError(f"two files claim rank {t.rank} ({t.rank_from}): {seen[t.rank]} and {t.source}",
                             path=t.source)
        seen[t.rank] = t.source
    if len(traces) < 2:
        return
    world = max([t.world_size or 0 for t in traces] + [len(traces)])
    missing = sorted(set(range(world)) - set(seen))
    if missing:
        src = min(traces, key=lambda t: t.rank).source
        raise TraceError(f"rank(s) {', '.join(map(str, missing))} missing from the set: got ranks "
                         f"{', '.join(map(str, sorted(seen)))} of world_size {world}", path=src)


def apply_et_sizes(rt: RankTrace, records: list[CommRecord], et_source: str) -> None:
    """Message sizes (and group sizes) of Kineto collectives from the matching ET, in issue order.

    When the ET has one record per c10d call of the window and some calls launched no kernel inside it,
    the records of those calls are skipped (matched by call order, see kineto.comm_calls)."""
    if len(records) != len(rt.comms) and len(records) == len(rt.comm_calls) \
            and sum(rt.comm_calls) == len(rt.comms):
        records = [r for r, launched in zip(records, rt.comm_calls) if launched]
    if len(records) != len(rt.comms):
        raise TraceError(f"execution trace has {len(records)} collectives but the Kineto trace "
                         f"{rt.source} has {len(rt.comms)} in the imported step; they do not describe the "
                         f"same iteration", path=et_source)
    for i, (nid, rec) in enumerate(zip(rt.comms, records)):
        op = rt.nodes[nid]
        kinds = collective_from_name(rec.collective)
        if kinds and (kinds[0] is not op.kind or (kinds[1] and op.collective and kinds[1] is not op.collective)):
            raise TraceError(f"collective #{i}: execution trace says {rec.collective} but {rt.source} has "
                             f"{op.collective.value if op.collective else op.kind.value} ({op.name})", path=et_source)
        changes = {"msg_bytes": op.msg_bytes or msg_bytes_of(op.collective, op.kind, rec.in_bytes, rec.out_bytes)}
        if rec.group_size and op.group_size <= 1:
            changes["group_size"] = rec.group_size
        rt.nodes[nid] = op.with_(**changes)


def match_collectives(traces: list[RankTrace]) -> int:
    """Give the i-th collective of each group the same comm_id on every member; returns the count."""
    multi = len(traces) > 1
    per_group: dict[str, dict[int, list[str]]] = {}
    by_rank = {t.rank: t for t in traces}
    for t in traces:
        for nid in t.comms:
            op = t.nodes[nid]
            if op.kind is OpKind.COLLECTIVE:
                per_group.setdefault(op.group or "0", {}).setdefault(t.rank, []).append(nid)
    matched = 0
    for group, lists in per_group.items():
        members = _members(group, traces, lists) if multi else sorted(lists)
        n = max(len(lists.get(r, [])) for r in members)
        for i in range(n):
            present = [r for r in members if i < len(lists.get(r, []))]
            if len(present) != len(members):
                r = present[0]
                op = by_rank[r].nodes[lists[r][i]]
                absent = sorted(set(members) - set(present))
                raise GraphError(f"{by_rank[r].source}: collective {op.name} "
                                 f"({op.collective.value if op.collective else op.kind.value}) #{i} on process "
                                 f"group {group!r} (rank {r}) has no partner on rank(s) "
                                 f"{', '.join(map(str, absent))}")
            ops = [by_rank[r].nodes[lists[r][i]] for r in members]
            kinds = {o.collective for o in ops}
            if len(kinds) > 1:
                raise GraphError(f"collective #{i} on process group {group!r} differs across ranks: "
                                 + ", ".join(f"rank {r}: {o.collective.value if o.collective else '?'}"
                                             for r, o in zip(members, ops)))
            # The measured NCCL kernel time includes waiting for the slowest peer: every member spins
            # until the last one arrives, so the last to arrive waited least. Its duration is the
            # transfer itself; give every member that duration (Lumos, Liang et al., MLSys 2025, corrects
            # collective kernels the same way before replay).
            durs = [o.duration_s for o in ops if o.duration_s is not None]
            transfer_s = min(durs) if durs else None
            for r in members:
                nid = lists[r][i]
                op = by_rank[r].nodes[nid]
                by_rank[r].nodes[nid] = op.with_(
                    comm_id=f"{group}#{i}", duration_s=transfer_s if op.duration_s is not None else None,
                    group_size=op.group_size if op.group_size > 1 else len(members))
            matched += 1
    return matched + _match_p2p(traces, by_rank, multi)


def _match_p2p(traces: list[RankTrace], by_rank: dict, multi: bool) -> int:
    """The i-th send src->dst on a group pairs with the i-th recv at dst from src (NCCL p2p order)."""
    ends: dict[tuple, dict[str, list]] = {}
    for t in traces:
        for nid in t.comms:
            op = t.nodes[nid]
            if op.kind in (OpKind.SEND, OpKind.RECV) and op.peer is not None:
                src, dst = (t.rank, op.peer) if op.kind is OpKind.SEND else (op.peer, t.rank)
                ends.setdefault((op.group or "0", src, dst), {"send": [], "recv": []})[
                    "send" if op.kind is OpKind.SEND else "recv"].append((t.rank, nid))
    count = 0
    for (group, src, dst), sides in ends.items():
        if multi and len(sides["send"]) != len(sides["recv"]) and {src, dst} <= set(by_rank):
            longer = "send" if len(sides["send"]) > len(sides["recv"]) else "recv"
            i = min(len(sides["send"]), len(sides["recv"]))
            r, nid = sides[longer][i]
            raise GraphError(f"{by_rank[r].source}: {longer} {by_rank[r].nodes[nid].name} #{i} from rank {src} "
                             f"to rank {dst} on process group {group!r} has no partner on rank "
                             f"{dst if longer == 'send' else src}")
        for i, pair in enumerate(zip(sides["send"], sides["recv"])):
            for r, nid in pair:
                by_rank[r].nodes[nid] = by_rank[r].nodes[nid].with_(comm_id=f"p2p:{group}:{src}->{dst}#{i}")
            count += 1
    return count


def _members(group: str, traces: list[RankTrace], lists: dict) -> list[int]:
    loaded = {t.rank for t in traces}
    declared: set[int] = set()
    for t in traces:
        declared |= set(t.group_ranks.get(group, ()))
    if declared:
        return sorted(declared & loaded)
    return sorted(loaded)    # no member list: an empty rank list means every rank (ASTRA-sim's rule)


def build_graph(traces: list[RankTrace], where: str = "trace") -> nx.DiGraph:
    """One DiGraph for all ranks, built once; graph attrs carry per-rank measurements."""
    g = nx.DiGraph()
    for t in sorted(traces, key=lambda t: t.rank):
        g.add_nodes_from((nid, {"op": op}) for nid, op in t.nodes.items())
    for t in traces:
        for u, v, kind, delay in t.edges:
            if u == v:
                continue
            old = g.get_edge_data(u, v)
            if old is not None:
                old["delay_s"] = max(old.get("delay_s", 0.0), delay)
                if not old["delay_s"]:
                    old.pop("delay_s")
                continue
            if delay:
                g.add_edge(u, v, dep=kind, delay_s=delay)
            else:
                g.add_edge(u, v, dep=kind)
    g.graph["source"] = sorted({t.fmt for t in traces})
    g.graph["ranks"] = [{"rank": t.rank, "file": t.source, "format": t.fmt, "rank_from": t.rank_from,
                         "step": t.step, "root": t.root, "measured_s": t.measured_s,
                         "step_start_us": t.step_start_us, "world_size": t.world_size}
                        for t in sorted(traces, key=lambda t: t.rank)]
    g.graph["groups"] = {grp: list(r) for t in traces for grp, r in t.group_ranks.items() if r}
    check_acyclic(g, where)
    return g


def link(traces: list[RankTrace], where: str = "trace") -> nx.DiGraph:
    check_rank_set(traces)
    match_collectives(traces)
    return build_graph(traces, where)

