"""Export one candidate to ASTRA-sim 2.0: the Chakra ET of every rank that runs a different program,
plus the analytical network config (topology, npus_count, bandwidth, latency per dimension), the system
config (collective implementation per dimension) and the remote-memory config, so a user can replay
the same candidate in ASTRA-sim.

Ranks: comet models one representative rank per pipeline stage (the TP / CP / DP peers of a stage run
the same program). Stage s is written as global rank s * gpus/pp; `ranks.json` maps every global rank to
the ET file of its stage (ASTRA-sim reads `<prefix>.<npu>.et` for every NPU: link or copy them).
Pipeline dependencies, which cross ranks, become a SEND on one rank and a matching RECV on the other
(Chakra has no cross-rank edges). ET files are written by comet/trace/chakra.py's codec (et_def.proto).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import networkx as nx

from comet.config.cluster import ClusterSpec, Topology
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.graph.expand import expand
from comet.graph.ir import Op, OpKind, ops
from comet.trace.chakra import write_chakra
from comet.workload.builder import build_step_graph

# ASTRA-sim analytical backend topology names per comet topology
ASTRA_TOPOLOGY = {Topology.SWITCH: "Switch", Topology.RING: "Ring", Topology.FULLY_CONNECTED: "FullyConnected"}
# collective implementation per dimension: a ring on a ring, direct on a full mesh, and on a switch the
# ring NCCL uses for bandwidth-bound collectives
ASTRA_COLLECTIVE = {Topology.SWITCH: "ring", Topology.RING: "ring", Topology.FULLY_CONNECTED: "direct"}


def npus_per_dim(cluster: ClusterSpec, gpus: int) -> list[int]:
    """NPUs along each dimension; the product is `gpus` (ASTRA-sim's npus_count)."""
    counts, below = [], 1
    for dim in cluster.levels:
        size = min(dim.size, gpus) if dim.size else gpus
        counts.append(max(1, size // below))
        below *= counts[-1]
        if below >= gpus:
            break
    counts += [1] * (len(cluster.levels) - len(counts))
    counts[-1] *= max(1, gpus // max(1, _prod(counts)))
    return counts


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def network_config(cluster: ClusterSpec, gpus: int) -> str:
    dims = list(zip(cluster.levels, npus_per_dim(cluster, gpus)))
    dims = [(d, n) for d, n in dims if n > 1] or dims[:1]

    def row(values):
        return "[ " + ", ".join(values) + " ]"
    # bandwidth per NPU per direction after oversubscription and the link efficiency NCCL reaches
    return "\n".join([
        "# ASTRA-sim analytical network config, written by `comet export astra-sim` from " + cluster.name,
        "topology: " + row(ASTRA_TOPOLOGY[d.topology] for d, _ in dims),
        "npus_count: " + row(str(n) for _, n in dims),
        "bandwidth: " + row(f"{d.bandwidth_GBps * d.bus_efficiency / d.oversubscription:.3f}" for d, _ in dims)
        + "  # GB/s",
        "latency: " + row(f"{d.latency_us * 1000:.1f}" for d, _ in dims) + "  # ns",
        ""])


def system_config(cluster: ClusterSpec, gpus: int) -> dict:
    dims = [d for d, n in zip(cluster.levels, npus_per_dim(cluster, gpus)) if n > 1] or list(cluster.levels[:1])
    impl = [ASTRA_COLLECTIVE[d.topology] for d in dims]
    return {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
            "preferred-dataset-splits": 4, "all-reduce-implementation": impl, "all-gather-implementation": impl,
            "reduce-scatter-implementation": impl, "all-to-all-implementation": ["direct"] * len(dims),
            "collective-optimization": "localBWAware", "local-mem-bw": cluster.gpu.hbm_bandwidth_GBps,
            "boost-mode": 0}


def remote_memory_config(cluster: ClusterSpec, gpus: int) -> dict:
    tier = cluster.memory_expansion
    if tier is None:
        return {"memory-type": "NO_MEMORY_EXPANSION"}
    kind = ("PER_NPU_MEMORY_EXPANSION" if tier.shared_by == 1 else
            "PER_NODE_MEMORY_EXPANSION" if tier.shared_by == cluster.gpus_per_node else "MEM_POOL")
    return {"memory-type": kind, "remote-mem-latency": tier.latency_us * 1000,
            "remote-mem-bw": tier.bandwidth_GBps, "num-nodes": max(1, gpus // max(1, tier.shared_by)),
            "num-npus-per-node": tier.shared_by}


def _split_cross_rank_edges(g: nx.DiGraph, stage_rank: dict[int, int]) -> nx.DiGraph:
    """Global ranks on every op; each cross-rank edge u -> v becomes u's SEND (peer set) and a RECV on
    v's rank that v depends on."""
    out = g.copy()
    for nid, op in list(ops(out)):
        out.nodes[nid]["op"] = dataclasses.replace(op, rank=stage_rank[op.rank])
    for k, (u, v) in enumerate([(u, v) for u, v in g.edges if g.nodes[u]["op"].rank != g.nodes[v]["op"].rank]):
        src, dst = out.nodes[u]["op"], out.nodes[v]["op"]
        comm = f"pp{k}"
        if src.kind is OpKind.SEND:
            out.nodes[u]["op"] = dataclasses.replace(src, peer=dst.rank, comm_id=comm)
            nbytes = src.msg_bytes
        else:   # a plain dependency: a zero-byte message carries it
            nbytes = 0.0
        recv = Op(f"recv.{src.name}", OpKind.RECV, rank=dst.rank, peer=src.rank, msg_bytes=nbytes, comm_id=comm,
                  stream=src.stream)
        rid = ("recv", k)
        out.add_node(rid, op=recv)
        out.remove_edge(u, v)
        out.add_edge(rid, v, **g.edges[u, v])
    return out


def export(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, out_dir: str | Path,
           prefix: str = "comet") -> dict:
    """Write the ET files and the three configs into out_dir; returns what was written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    graph = build_step_graph(model, par)
    g = expand(graph)
    per_stage = par.gpus // par.pp
    stage_rank = {s: s * per_stage for s in range(par.pp)}
    et = write_chakra(_split_cross_rank_edges(g, stage_rank), out / "et", prefix)
    (out / "network.yml").write_text(network_config(cluster, par.gpus))
    (out / "system.json").write_text(json.dumps(system_config(cluster, par.gpus), indent=1) + "\n")
    (out / "remote_memory.json").write_text(json.dumps(remote_memory_config(cluster, par.gpus), indent=1) + "\n")
    mapping = {str(r): f"et/{prefix}.{stage_rank[r // per_stage]}.et" for r in range(par.gpus)}
    (out / "ranks.json").write_text(json.dumps({"gpus": par.gpus, "et_of_rank": mapping}, indent=0) + "\n")
    return {"et": [str(p) for p in et], "network": str(out / "network.yml"), "system": str(out / "system.json"),
            "remote_memory": str(out / "remote_memory.json"), "ranks": str(out / "ranks.json")}
