"""Cluster specs as data (cluster_specs/*.yaml): GPU, memory tiers, network dimensions, efficiencies,
cost and power. Units are in the field names and converted to SI by the properties below."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

from comet.config.loader import (
    at_least,
    fraction,
    from_dict,
    non_negative,
    positive,
    read_yaml,
)
from comet.errors import ConfigError


class Topology(str, enum.Enum):
    """How the ports of one dimension are wired (comet/hardware/network.py says what each changes).
    A multi-tier fat tree / rail-optimised Clos is one `switch` dimension per tier (rack, pod, spine),
    each with its domain size and oversubscription."""
    SWITCH = "switch"                  # crossbar / fat-tree tier: full port rate to every peer (1/oversubscription across it)
    RING = "ring"                      # two neighbour links per port (one torus dimension)
    FULLY_CONNECTED = "fully_connected"  # a direct link to every other port of the domain


class CollectiveAlgorithm(str, enum.Enum):
    AUTO = "auto"      # NCCL's choice: the fastest of the algorithms below by the model
    RING = "ring"      # bandwidth-optimal ring (NCCL default for large messages)
    TREE = "tree"      # double binary tree: log2(n) latency, ring-like bandwidth
    NVLS = "nvls"      # NVLink SHARP in-switch reduction (all-reduce moves each byte once per direction)
    SHARP = "sharp"    # in-network reduction on the fabric (InfiniBand SHARP / NCCL CollNet)


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_tflops: dict[str, float]      # dense tensor-core peak per precision (bf16, fp16, fp8, tf32)
    hbm_GB: float = field(metadata=positive())
    hbm_bandwidth_GBps: float = field(metadata=positive())
    sms: int = field(metadata=positive())
    power_W: float = field(metadata=positive())

    def __post_init__(self):
        for prec, value in self.peak_tflops.items():
            if value <= 0:
                raise ConfigError(f"must be > 0, got {value}", field=f"peak_tflops.{prec}")

    def peak_flops(self, precision: str) -> float:
        try:
            return self.peak_tflops[precision] * 1e12
        except KeyError:
            raise ConfigError(f"GPU {self.name} has no {precision} peak (has: {', '.join(self.peak_tflops)})",
                              field="precision") from None

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_GB * 1e9

    @property
    def hbm_bandwidth(self) -> float:
        return self.hbm_bandwidth_GBps * 1e9


@dataclass(frozen=True)
class MemoryTier:
    """Memory expansion (host DDR, CXL device or pool) used for offload. capacity_GB, bandwidth_GBps and
    latency_us describe one tier; `shared_by` GPUs use it (1: per GPU, the node's GPU count: per node
    host DDR behind the CPU, more: a pooled CXL switch). Every GPU offloads in the same phase of the
    step, so each gets 1/shared_by of the capacity and of the bandwidth."""
    name: str
    capacity_GB: float = field(metadata=non_negative())
    bandwidth_GBps: float = field(metadata=positive())
    shared_by: int = field(default=1, metadata=positive())
    latency_us: float = field(default=0.0, metadata=non_negative())   # load-to-use; CXL ~0.2-0.4 us (CXL 2.0 devices)

    @property
    def capacity_bytes(self) -> float:
        """Per GPU."""
        return self.capacity_GB * 1e9 / self.shared_by

    @property
    def bandwidth(self) -> float:
        """Per GPU, bytes/s, while every GPU sharing the tier streams."""
        return self.bandwidth_GBps * 1e9 / self.shared_by


@dataclass(frozen=True)
class FabricTier:
    """A switch tier below the top of a scale-out dimension: `size` GPUs share one domain of it (a
    scalable unit / rack of leaves, a pod), and traffic leaving that domain crosses the next tier up at
    1/oversubscription of the port rate."""
    size: int = field(metadata=positive())
    oversubscription: float = field(default=1.0, metadata=at_least(1.0))


@dataclass(frozen=True)
class NetworkDim:
    """One level of the network, innermost first. `size` GPUs share this level's domain (0 = the
    whole cluster); bandwidth is per GPU per direction."""
    name: str
    size: int = field(metadata=non_negative())
    bandwidth_GBps: float = field(metadata=positive())
    latency_us: float = field(metadata=non_negative())
    topology: Topology = Topology.SWITCH
    algorithm: CollectiveAlgorithm = CollectiveAlgorithm.AUTO   # anything else restricts NCCL's choice (NCCL_ALGO)
    oversubscription: float = field(default=1.0, metadata=at_least(1.0))
    # Bus-bandwidth efficiency eff(m) = bus_efficiency * m / (m + half_efficiency_bytes): large
    # messages reach bus_efficiency of the link rate, a message of half_efficiency_bytes half of that.
    bus_efficiency: float = field(default=0.8, metadata=fraction())
    half_efficiency_bytes: float = field(default=4e6, metadata=non_negative())
    nvls_bus_GBps: float | None = None   # measured all-reduce bus bandwidth with NVLS, if the domain has it
    nvls_half_efficiency_bytes: float = field(default=0.0, metadata=non_negative())  # buffer at which NVLS
    #   reaches half of nvls_bus_GBps (few NVLS channels, multimem chunk pipelining)
    in_network_reduction: bool = False   # the switches of this tier reduce in the network (SHARP)
    # A multi-tier fat tree / rail-optimised Clos: the tiers below this dimension's top, innermost first
    # (e.g. a 256-GPU scalable unit of leaves); `size` and `oversubscription` above are the top tier's
    # (the spine). Bandwidth, latency and efficiencies are the same NICs and switches at every tier.
    tiers: tuple[FabricTier, ...] = ()

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class Efficiency:
    """The few physical efficiency parameters of the compute model (see comet/hardware/compute.py)."""
    gemm: float = field(default=0.8, metadata=fraction())           # large-GEMM fraction of dense peak
    gemm_fp8: float = field(default=0.72, metadata=fraction())      # same for FP8 (vs FP8 peak)
    gemm_k_half: float = field(default=128.0, metadata=non_negative())  # reduction dim at which a GEMM reaches half of `gemm`
    gemm_tile_m: int = field(default=128, metadata=positive())      # output tile of the GEMM library (wave quantization)
    gemm_tile_n: int = field(default=256, metadata=positive())
    attention_fwd: float = field(default=0.6, metadata=fraction())  # flash attention forward, fraction of peak
    attention_bwd: float = field(default=0.45, metadata=fraction())
    # FlashAttention-2-class kernels (PyTorch SDPA flash backend, flash-attn 2), forward and backward; 0: the
    # same kernels as attention_fwd / attention_bwd (GPUs where FA2 is the native kernel, e.g. A100)
    attention_fa2: float = field(default=0.0, metadata=non_negative())
    memory_bound: float = field(default=0.85, metadata=fraction())  # fraction of HBM bandwidth for elementwise kernels
    kernel_overhead_us: float = field(default=4.0, metadata=non_negative())  # launch + tail per kernel
    overlap_slowdown: float = field(default=0.1, metadata=non_negative())    # compute slows by this while comm is in flight
    offload: float = field(default=0.8, metadata=fraction())        # fraction of expansion-tier bandwidth reached


@dataclass(frozen=True)
class CostSpec:
    """Unit prices in USD, with sources in the YAML comments."""
    gpu_usd: float = field(default=0.0, metadata=non_negative())
    gpu_usd_per_bf16_TFLOPs: float = field(default=0.0, metadata=non_negative())  # added per TFLOP/s of dense
    #   BF16 peak, so a faster part costs more in a study that scales compute (compute_scale)
    node_usd: float = field(default=0.0, metadata=non_negative())           # chassis, CPUs, DRAM, excluding GPUs
    network_usd_per_GBps: tuple[float, ...] = ()                          # per GPU, per network dimension
    hbm_usd_per_GB: float = field(default=0.0, metadata=non_negative())
    expansion_usd_per_GB: float = field(default=0.0, metadata=non_negative())
    expansion_usd_per_GBps: float = field(default=0.0, metadata=non_negative())  # links / controllers / CXL ports
    electricity_usd_per_kWh: float = field(default=0.0, metadata=non_negative())
    amortization_years: float = field(default=4.0, metadata=positive())
    pue: float = field(default=1.0, metadata=at_least(1.0))


@dataclass(frozen=True)
class PowerSpec:
    """Average power draw per component in W (sources in the YAML)."""
    gpu_W: float | None = None         # None: the GPU's TDP; the draw while computing
    gpu_idle_W: float | None = None    # draw while waiting (bubble); None: run at gpu_W all the time
    comm_activity: float = field(default=0.35, metadata=fraction())  # share of (gpu_W - idle) drawn while only
    #   communication / copy kernels run (a few SMs, HBM and links busy, tensor cores idle)
    node_overhead_W: float = field(default=0.0, metadata=non_negative())  # per node: CPUs, fans, DRAM, NICs
    network_W_per_gpu: float = field(default=0.0, metadata=non_negative())  # switches and optics, per GPU
    expansion_W_per_GB: float = field(default=0.0, metadata=non_negative())


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpu: GpuSpec
    network: tuple[NetworkDim, ...]
    efficiency: Efficiency = Efficiency()
    memory_expansion: MemoryTier | None = None
    cost: CostSpec = CostSpec()
    power: PowerSpec = PowerSpec()
    workspace_GB: float = field(default=2.0, metadata=non_negative())  # CUDA context, NCCL buffers, allocator slack
    source: str = ""

    def __post_init__(self):
        if not self.network:
            raise ConfigError("must list at least one network dimension", field="network")
        for i, dim in enumerate(self.network[:-1]):
            if dim.size < 1:
                raise ConfigError(f"size must be >= 1 for all but the outermost dimension, got {dim.size}",
                                  field=f"network[{i}].size")

    @property
    def gpus_per_node(self) -> int:
        return self.network[0].size or 1

    @functools.cached_property
    def levels(self) -> tuple[NetworkDim, ...]:
        """The network with every fabric tier as its own level (what collectives are placed on). Cached
        on the instance (perf: the collective cost models read it per call; hashing the network each
        time showed in the cold path)."""
        return network_levels(self.network)

    def with_changes(self, **changes) -> ClusterSpec:
        return replace(self, **changes)


@functools.lru_cache(maxsize=256)
def network_levels(network: tuple[NetworkDim, ...]) -> tuple[NetworkDim, ...]:
    out = []
    for dim in network:
        for i, tier in enumerate(dim.tiers):
            out.append(replace(dim, name=f"{dim.name}.tier{i}", size=tier.size,
                               oversubscription=tier.oversubscription, tiers=(), in_network_reduction=False))
        out.append(replace(dim, tiers=()) if dim.tiers else dim)
    return tuple(out)


SPECS_DIR = Path(__file__).resolve().parents[2] / "cluster_specs"   # the repository's reviewed specs


def resolve_cluster_path(name_or_path: str | Path) -> Path:
    """A path as given if it exists; else a spec name (`h100_dgx`) or a `cluster_specs/...` path looked
    up in the repository's cluster_specs/ folder, so the default works from any working directory."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    candidates = [SPECS_DIR / p.name, SPECS_DIR / f"{p.name}.yaml"]
    for c in candidates:
        if c.is_file() and (p.parent in (Path("."), Path("cluster_specs")) or not p.suffix):
            return c
    if not p.suffix:
        known = ", ".join(sorted(q.stem for q in SPECS_DIR.glob("*.yaml"))) if SPECS_DIR.is_dir() else "none"
        raise ConfigError(f"unknown cluster spec '{name_or_path}' (known: {known}; or give a YAML path)",
                          field="cluster")
    return p   # let the loader report "file not found" with the path the user gave


def _merged(base: dict, over: dict) -> dict:
    """`over` on top of `base`: mappings merge key by key, anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_cluster_document(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The spec's YAML with its `base:` applied. A variant of a system names the spec it starts from
    (`base: h100_dgx.yaml`, relative to its own folder) and gives only what differs, so the fitted
    efficiencies, cost and power of the base are read from one file (a refit cannot leave a stale copy)."""
    data = read_yaml(path)
    if not isinstance(data, dict) or "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"must name a cluster spec YAML file, got {base!r}", source=str(path), field="base")
    base_path = (path.parent / base).resolve()
    if base_path in seen or base_path == path.resolve():
        raise ConfigError(f"'{base}' leads back to a spec already on the chain (a cycle)", source=str(path),
                          field="base")
    if not base_path.is_file():
        raise ConfigError(f"'{base}' not found (looked for {base_path})", source=str(path), field="base")
    return _merged(read_cluster_document(base_path, seen + (path.resolve(),)), data)


def load_cluster(path: str | Path) -> ClusterSpec:
    from comet.config.cluster_checks import (
        check_cluster,  # cross-field rules of the file
    )
    path = Path(resolve_cluster_path(path))
    return check_cluster(from_dict(ClusterSpec, read_cluster_document(path), source=str(path)), str(path))
