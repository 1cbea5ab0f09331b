"""What a memory measurement counts (the `memory_measure` column, ../shared/calibration/SCHEMA.md).

comet's footprint (MemoryEstimate.total_GB) is what the GPU holds for the process, as nvidia-smi shows
it: the tensors, the caching allocator's cached free blocks, and what is allocated outside that
allocator. The cluster's `workspace_GB` is everything but the tensors. PyTorch reports less
(PyTorch docs, "CUDA semantics: memory management"; torch.cuda.memory_stats):

- nvidia_smi: everything: tensors + allocator cache + CUDA context + NCCL buffers.
- max_reserved: the caching allocator's segments: tensors + cached free blocks (fragmentation); the CUDA
  context and NCCL's buffers (NCCL cudaMallocs its own) are outside it.
- max_allocated: live tensors only (torch.cuda.max_memory_allocated); max_active counts the same blocks
  (allocated plus those freed but not yet reusable by another stream).

The part outside the allocator is the CUDA context plus NCCL's buffers: one connection's buffers per channel
of each communicator, its channels by NCCL's rules; what is left of the workspace is the allocator's cache. The total and the fit test are unchanged by the split.
"""

from __future__ import annotations

from comet.config.cluster import ClusterSpec
from comet.config.parallel import ParallelConfig
from comet.hardware.p2p_channels import comm_channels, nvlink_comm_channels
from comet.workload.memory import GB

MEASURES = ("max_reserved", "max_allocated", "max_active", "nvidia_smi")   # the schema's closed set

# CUDA context with PyTorch's kernels loaded lazily (CUDA_MODULE_LOADING=LAZY, PyTorch's default since
# 2.0 on CUDA >= 11.7: "CUDA Lazy Loading", CUDA C++ Programming Guide): the context, cuBLAS/cuDNN handles
# and the modules of the kernels a training step launches. NVIDIA states no size; 0.5 GB is the order of
# what nvidia-smi shows for a process that has only initialised CUDA on an H100 (an estimate, not a
# vendor figure).
CUDA_CONTEXT_BYTES = 0.5e9
# NCCL's receive buffers for one connection of one channel, one per protocol at NCCL's defaults
# (NCCL docs, environment variables: NCCL_BUFFSIZE 4 MiB for the Simple protocol; NCCL src/include/
# device.h: LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, LL128 120 elements x 640 threads x
# 8 steps x 8 B = 4,915,200 B).
NCCL_CONNECTION_BYTES = 4 * 2 ** 20 + 512 * 2 ** 10 + 4_915_200


def parallel_groups(par: ParallelConfig) -> list[tuple[int, int]]:
    """(ranks, stride) of each parallel group of more than one rank that a GPU runs collectives or sends
    in, in Megatron's rank order (tp innermost, then cp, dp, pp; the expert group inside the data-parallel
    ranks). PyTorch creates an NCCL communicator on a group's first collective (ProcessGroupNCCL), so
    only groups in use hold buffers."""
    groups, stride = [], 1
    for size in (par.tp, par.cp, par.dp, par.pp):
        if size > 1:
            groups.append((size, stride))
        stride *= size
    if par.ep > 1:
        groups.append((par.ep, par.tp * par.cp))
    return groups


def communicator_channels(cluster: ClusterSpec, ranks: int, stride: int) -> int:
    """Channels of one communicator by NCCL's topology rules (comet/hardware/p2p_channels.py): on
    NVLink where the group is inside a node, else one ring per NIC the node's members of the group use."""
    node, levels = cluster.gpus_per_node, cluster.levels
    if ranks * stride <= node or len(levels) == 1:
        return nvlink_comm_channels(levels[0].bandwidth / 1e9)
    local = min(ranks, node // stride) if stride < node else 1
    return comm_channels(levels[1].bandwidth / 1e9, max(1, local))


def outside_allocator_bytes(par: ParallelConfig, cluster: ClusterSpec) -> float:
    """CUDA context + NCCL buffers: memory nvidia-smi counts and PyTorch's allocator does not. One ring
    connection per channel of each communicator (tree and NVLS buffers, where NCCL builds them, come on
    top: a lower bound)."""
    channels = sum(communicator_channels(cluster, n, stride) for n, stride in parallel_groups(par))
    return CUDA_CONTEXT_BYTES + channels * NCCL_CONNECTION_BYTES


def measured_GB(total_GB: float, par: ParallelConfig, cluster: ClusterSpec, measure: str) -> float:
    """The footprint `total_GB` (MemoryEstimate.total_GB, which includes the cluster's workspace) as
    `measure` reads it. The part outside the allocator is capped by the workspace (the workspace is all
    that is not tensors); the rest of the workspace is the allocator's cache."""
    if measure not in MEASURES:
        raise ValueError(f"memory_measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    workspace = cluster.workspace_GB
    if measure == "nvidia_smi":
        return total_GB
    if measure == "max_reserved":
        return total_GB - min(workspace, outside_allocator_bytes(par, cluster) / GB)
    return total_GB - workspace
