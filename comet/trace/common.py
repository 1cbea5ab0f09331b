"""Shared pieces of the trace importers: the per-rank intermediate form and name tables.

Every importer (Kineto, PyTorch ET, Chakra) produces one `RankTrace` per rank: plain dicts and
lists (fast to build), turned into one networkx graph at the end by `comet.trace.link`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from comet.graph.ir import Collective, DepKind, Op, OpKind


@dataclass
class RankTrace:
    """One rank of an imported trace, before cross-rank linking."""
    rank: int
    source: str                                   # file (or archive::member) it came from
    fmt: str                                      # "kineto" | "pytorch_et" | "chakra_et" | "chakra_json"
    nodes: dict = field(default_factory=dict)     # node id -> Op (insertion order = issue order)
    edges: list = field(default_factory=list)     # (u, v, DepKind, delay_s)
    comms: list = field(default_factory=list)     # node ids of collectives, in issue order on this rank
    group_ranks: dict = field(default_factory=dict)   # process-group name -> tuple of global ranks (may be empty)
    world_size: int | None = None
    rank_from: str = "default"                    # where the rank came from: "distributedInfo", "file name", ...
    pid: int | None = None                        # OS process id (links a Kineto trace to its ET)
    root: str | None = None                       # node id of the step-start node (Kineto)
    measured_s: float | None = None               # measured iteration time (Kineto)
    step: str | None = None                       # "ProfilerStep#10", "all events", ...
    step_start_us: float | None = None            # absolute step start (for cross-rank alignment)
    comm_calls: list = field(default_factory=list)  # Kineto: per c10d collective call, did it launch a kernel

    def add(self, nid: str, op: Op) -> str:
        self.nodes[nid] = op
        return nid

    def dep(self, u: str, v: str, kind: DepKind, delay_s: float = 0.0) -> None:
        self.edges.append((u, v, kind, delay_s))


# c10d / NCCL collective names -> (OpKind, Collective); keys are lower-case, without "nccl:" / "_".
_COLL_NAMES = {
    "allreduce": Collective.ALL_REDUCE, "allgather": Collective.ALL_GATHER,
    "allgatherbase": Collective.ALL_GATHER, "allgatherintocoalesced": Collective.ALL_GATHER,
    "reducescatter": Collective.REDUCE_SCATTER, "reducescatterbase": Collective.REDUCE_SCATTER,
    "reducescattertensorcoalesced": Collective.REDUCE_SCATTER,
    "alltoall": Collective.ALL_TO_ALL, "alltoallv": Collective.ALL_TO_ALL, "alltoallbase": Collective.ALL_TO_ALL,
    "broadcast": Collective.BROADCAST, "reduce": Collective.REDUCE, "barrier": Collective.BARRIER,
}
_KERNEL_COLL = re.compile(r"nccl(?:Dev)?Kernel_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv)")


def collective_from_name(name: str) -> tuple[OpKind, Collective | None] | None:
    """Map a c10d collective name ("allreduce", "_allgather_base", "nccl:all_to_all", "send") to kinds."""
    key = name.lower().split(":")[-1].replace("_", "").replace("c10d", "")
    if key in ("send", "isend"):
        return OpKind.SEND, None
    if key in ("recv", "irecv", "recvanysource"):
        return OpKind.RECV, None
    coll = _COLL_NAMES.get(key)
    return (OpKind.COLLECTIVE, coll) if coll else None


def collective_from_kernel(name: str) -> tuple[OpKind, Collective | None] | None:
    """Kind from an NCCL kernel name; SendRecv is ambiguous (send, recv or all-to-all): None."""
    m = _KERNEL_COLL.search(name)
    if not m or m.group(1) == "SendRecv":
        return None
    word = m.group(1).lower()
    return collective_from_name(word)


# c10 ScalarType names (Kineto `dtype` arg, ET tensor types) -> bytes per element.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "unsigned char": 1, "signed char": 1, "complexfloat": 8,
    "complexdouble": 16, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


def dtype_bytes(name: str | None, default: int = 4) -> int:
    if not name:
        return default
    return DTYPE_BYTES.get(str(name).strip().lower(), default)


def msg_bytes_of(coll: Collective | None, kind: OpKind, in_bytes: float, out_bytes: float) -> float:
    """NCCL "size" of a collective on one rank: all-gather counts its output, the rest their input
    (nccl-tests convention: allgather size = total output, reduce_scatter size = total input)."""
    if coll is Collective.ALL_GATHER:
        return out_bytes or in_bytes
    return in_bytes or out_bytes


def parse_rank_list(text) -> tuple[int, ...]:
    """ "[0, 1, 2]" or [0, 1, 2] -> (0, 1, 2); anything else -> ()."""
    if isinstance(text, (list, tuple)):
        vals = text
    elif isinstance(text, str):
        vals = re.findall(r"-?\d+", text)
    else:
        return ()
    try:
        return tuple(int(v) for v in vals)
    except (TypeError, ValueError):
        return ()


def stride_of(ranks: tuple[int, ...]) -> int:
    if len(ranks) < 2:
        return 1
    d = ranks[1] - ranks[0]
    return d if d > 0 and all(b - a == d for a, b in zip(ranks, ranks[1:])) else 1


_RANK_IN_NAME = (re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.I), re.compile(r"[-_](\d+)\.json(?:\.gz)?$"))
_DOTTED = re.compile(r"\.(\d+)\.(?:et|json)$")     # Chakra: <prefix>.<rank>.et / .json


def rank_from_name(name: str, dotted: bool = False) -> int | None:
    """`worker3_step_12...json` -> 3, `rank-3.json.gz` -> 3, `dlrm_eg_3.json` -> 3; with `dotted`
    (Chakra files) also `all_reduce.3.et` -> 3."""
    base = name.replace("\\", "/").split("::")[-1].split("/")[-1]
    for pat in ((_DOTTED,) if dotted else ()) + _RANK_IN_NAME:
        m = pat.search(base)
        if m:
            return int(m.group(1))
    return None
