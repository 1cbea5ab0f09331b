"""The one IR for every trace.

A *flat op graph* is a networkx DiGraph whose nodes carry an `Op` (attribute "op") and whose edges
carry a `DepKind` (attribute "dep") and an optional `delay_s`. Imported profiler traces become flat
op graphs. The vocabulary follows Chakra: COMP / COMM_COLL / COMM_SEND / COMM_RECV nodes, data vs
control dependencies (docs/trace-formats.md), so import and export are mechanical.

Cross-rank matching is by `Op.comm_id`: every member of one collective (and both ends of one
point-to-point transfer) carries the same id; the replay starts a collective when all members are
ready.

A graph built by comet for a configuration is a *StepGraph*: op-level blocks (one transformer
layer's forward, backward, recompute; embedding; head) that repeat, plus the pipeline plan that
says where and how often each block runs. Blocks are replayed once and reused; `expand()`
(comet/graph/expand.py) turns a StepGraph into the full flat graph when a complete timeline is asked for.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field, fields, replace
from typing import Iterator

import networkx as nx

from comet.errors import GraphError


class OpKind(str, enum.Enum):
    COMPUTE = "compute"        # a GPU kernel (Chakra COMP_NODE)
    MEMCPY = "memcpy"          # device copy / offload traffic
    COLLECTIVE = "collective"  # Chakra COMM_COLL_NODE
    SEND = "send"              # Chakra COMM_SEND_NODE
    RECV = "recv"              # Chakra COMM_RECV_NODE
    CPU = "cpu"                # host op (launch overhead, python), replayed on a CPU thread


class Collective(str, enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    BARRIER = "barrier"


class DepKind(str, enum.Enum):
    STREAM = "stream"   # program order on one stream / thread
    DATA = "data"       # producer -> consumer
    SYNC = "sync"       # cross-stream event wait (cudaEventRecord -> cudaStreamWaitEvent), synchronize
    LAUNCH = "launch"   # CPU launch -> GPU kernel


class Phase(str, enum.Enum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class GroupKind(str, enum.Enum):
    """Which parallel dimension a process group belongs to (drives the breakdown)."""
    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"
    EMBEDDING = "embedding"   # first <-> last pipeline stage (tied embedding gradients)
    EP = "ep"                 # expert parallel: token dispatch / combine of MoE layers
    ETP = "etp"               # expert tensor parallel (the TP group of the expert layers)
    EDP = "edp"               # expert data parallel: gradients / optimizer state of the expert weights
    OTHER = "other"


class KernelClass(str, enum.Enum):
    """How the cost model times a compute op."""
    GEMM = "gemm"              # shape (m, n, k)
    ATTENTION = "attention"    # fused flash attention, flops from shape
    MEMORY = "memory"          # memory-bound: bytes / (HBM bandwidth * efficiency)
    OTHER = "other"            # measured duration only


# Stream names used by built graphs. Imported graphs use "cuda:<stream id>" and "cpu:<thread id>".
COMPUTE_STREAM = "compute"
TP_STREAM = "comm.tp"
CP_STREAM = "comm.cp"
DP_STREAM = "comm.dp"
PP_STREAM = "comm.pp"
EP_STREAM = "comm.ep"
OFFLOAD_STREAM = "offload"


@dataclass(frozen=True)
class Op:
    name: str
    kind: OpKind
    rank: int = 0
    stream: str = COMPUTE_STREAM
    kernel: KernelClass = KernelClass.OTHER
    flops: float = 0.0                  # floating-point operations of this kernel
    bytes: float = 0.0                  # HBM (or expansion-tier, for offload) bytes moved
    shape: tuple[int, ...] = ()         # GEMM (m, n, k); attention (batch*heads, sq, skv, head_dim)
    dtype_bytes: int = 2
    variant: str = ""                   # kernel implementation within the class (attention: "" fused, "fa2")
    collective: Collective | None = None
    msg_bytes: float = 0.0              # collective buffer per rank (NCCL "size"); p2p bytes sent
    group: str | None = None            # process-group name
    group_kind: GroupKind | None = None
    group_size: int = 1
    group_stride: int = 1               # distance between consecutive member global ranks
    flat_ring: bool = False             # one ring over the whole group at one NIC per GPU (network.py)
    peer: int | None = None             # p2p partner rank
    comm_id: str | None = None          # cross-rank match key, equal on every member
    layer: int = -1
    microbatch: int = -1
    phase: Phase = Phase.OTHER
    duration_s: float | None = None     # measured duration (imported); None: timed by the cost model
    start_s: float | None = None        # measured start, relative to the rank's step start

    def __init__(self, name: str, kind: OpKind, *args, **given):
        # perf: a frozen dataclass's __init__ stores all 24 fields through object.__setattr__ (~3 us
        # an op, most of what building a block costs); here the fields given go into the instance
        # dict at once and the others read the class attributes, which are the dataclass defaults.
        # Equality, hashing, repr and replace() are the dataclass's, over every field.
        if args:
            given.update(zip(_OP_FIELDS[2:], args))
        if not given.keys() <= _OP_FIELD_SET:
            raise TypeError(f"Op() got unexpected field(s): {', '.join(sorted(given.keys() - _OP_FIELD_SET))}")
        d = self.__dict__
        d["name"] = name
        d["kind"] = kind
        d.update(given)

    @classmethod
    def unchecked(cls, name: str, kind: OpKind, **given) -> "Op":
        """Op(name, kind, **given) for the block builders, whose field names are literals in code:
        without the check of the names (perf: ~0.35 of ~1.2 us an op, 55 ops a GPT configuration;
        tests/workload/test_builder.py checks every op the builders emit)."""
        op = _new_object(cls)
        d = op.__dict__
        d["name"] = name
        d["kind"] = kind
        d.update(given)
        return op

    def __hash__(self) -> int:
        # perf: a block's signature hashes every op of every new block; the dataclass's hash builds a
        # tuple of all 24 fields (~0.7 us), these few fields ~0.2 us. Equal ops still hash alike (a
        # subset of the fields equality compares), so dicts and sets behave the same.
        return hash((self.name, self.kind, self.phase, self.shape, self.flops, self.bytes, self.msg_bytes,
                     self.group_size, self.layer, self.microbatch))

    def with_(self, **changes) -> "Op":
        return replace(self, **changes)

    @property
    def is_comm(self) -> bool:
        return self.kind in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)


_OP_FIELDS = tuple(f.name for f in fields(Op))
_new_object = object.__new__
_OP_FIELD_SET = frozenset(_OP_FIELDS)


# ---------------------------------------------------------------------------- flat op graphs
_ids = itertools.count()


def new_graph(**attrs) -> nx.DiGraph:
    g = nx.DiGraph()
    g.graph.update(attrs)
    return g


def add_op(g: nx.DiGraph, op: Op, after: tuple = (), dep: DepKind = DepKind.DATA, node_id=None):
    """Add `op` as a node, depending on each node in `after`; returns its node id."""
    nid = node_id if node_id is not None else len(g)
    while node_id is None and nid in g:
        nid = f"{nid}_{next(_ids)}"
    g.add_node(nid, op=op)
    for u in after:
        g.add_edge(u, nid, dep=dep)
    return nid


def add_dep(g: nx.DiGraph, u, v, dep: DepKind = DepKind.DATA, delay_s: float = 0.0) -> None:
    g.add_edge(u, v, dep=dep, delay_s=delay_s) if delay_s else g.add_edge(u, v, dep=dep)


def ops(g: nx.DiGraph) -> Iterator[tuple[object, Op]]:
    for nid, data in g.nodes(data=True):
        yield nid, data["op"]


def chain_streams(g: nx.DiGraph) -> nx.DiGraph:
    """Add STREAM edges between consecutive ops of each (rank, stream) in insertion order."""
    last: dict[tuple[int, str], object] = {}
    for nid, op in list(ops(g)):
        key = (op.rank, op.stream)
        if key in last and not g.has_edge(last[key], nid):
            g.add_edge(last[key], nid, dep=DepKind.STREAM)
        last[key] = nid
    return g


def check_acyclic(g: nx.DiGraph, where: str = "graph") -> None:
    """Raise GraphError naming a cycle if `g` has one."""
    if nx.is_directed_acyclic_graph(g):
        return
    cycle = nx.find_cycle(g)
    names = " -> ".join(str(g.nodes[u]["op"].name) for u, _ in cycle[:6])
    raise GraphError(f"{where}: dependency cycle: {names}{' -> ...' if len(cycle) > 6 else ''}")


def ranks(g: nx.DiGraph) -> list[int]:
    return sorted({op.rank for _, op in ops(g)})


# ---------------------------------------------------------------------------- built step graphs
@dataclass(frozen=True)
class PipelinePlan:
    """Where each block runs: pp stages x vpp model chunks x micro-batches under a schedule."""
    pp: int
    vpp: int
    num_microbatches: int
    schedule: str                          # a comet.config.parallel.Schedule value
    chunk_layers: tuple[int, ...]          # layers per model chunk, chunk index = vchunk * pp + stage
    p2p_bytes: float                       # activation (or gradient) bytes sent between stages per micro-batch
    p2p_group_stride: int = 1              # global-rank distance between neighbouring stages
    recompute_layers: int = 0              # layers per chunk that run the "layer.recompute" block before backward
    p2p_exposed: float = 1.0               # share of the stage-to-stage sends that block their task (1 = all;
                                           # overlapped p2p exposes only warm-up / cool-down: builder.build_plan)
    chunk_layer_kinds: tuple[tuple[str, ...], ...] = ()   # per chunk, each layer's block prefix in order
                                                          # ("layer" or "moe_layer"); empty: all "layer"

    @property
    def num_chunks(self) -> int:
        return self.pp * self.vpp

    def layer_kinds(self, vs: int) -> tuple[str, ...]:
        """Block prefix of each layer of model chunk `vs` in forward order (MoE models mix dense and
        expert layers: "layer.fwd" vs "moe_layer.fwd")."""
        if self.chunk_layer_kinds:
            return self.chunk_layer_kinds[vs]
        return ("layer",) * self.chunk_layers[vs]


@dataclass(frozen=True)
class BucketSet:
    """`count` equal DP collectives `op` covering model chunk `chunk` of a stage. Gradient buckets
    fill in backward order during the chunk's last backward (the last micro-batch), bucket k being
    ready after (k+1)/count of it when `progressive` (Megatron DDP overlap_grad_reduce), else all at
    its end. Parameter-gather buckets run in forward order."""
    op: Op
    chunk: int
    count: int
    progressive: bool = True


@dataclass(frozen=True)
class StageSync:
    """Once-per-step ops of one pipeline stage, outside the micro-batch loop.

    grad_buckets: DP gradient reduce-scatters / all-reduces; param_gathers: ZeRO-1/2 parameter
    all-gathers (at the start of the step, overlapping the first forward, when gather_before_forward;
    else after the optimizer); embedding_sync: all-reduce of tied embedding gradients between the first
    and last stage; optimizer: the Adam step (plus expansion-tier traffic when the optimizer is offloaded).
    """
    grad_buckets: tuple[BucketSet, ...] = ()
    param_gathers: tuple[BucketSet, ...] = ()
    gather_before_forward: bool = True
    embedding_sync: Op | None = None
    optimizer: tuple[Op, ...] = ()


@dataclass(frozen=True)
class StepGraph:
    """One training step of a built workload on representative ranks (one per pipeline stage).

    blocks: op subgraphs on one rank, keyed "layer.fwd", "layer.bwd", "layer.recompute",
    "embedding.fwd", "embedding.bwd", "head.fwd", "head.bwd"; each is replayed once and reused.
    """
    blocks: dict[str, nx.DiGraph]
    plan: PipelinePlan
    stages: tuple[StageSync, ...]
    meta: dict = field(default_factory=dict)

    def with_(self, **changes) -> "StepGraph":
        return replace(self, **changes)
