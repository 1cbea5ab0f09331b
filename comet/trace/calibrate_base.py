"""Ground a study's base StepGraph in a measured profiler trace, by kernel class (Lumos-style
calibration: Liang et al., "Lumos: Efficient Performance Modeling and Estimation for Large-scale LLM
Training", MLSys 2025, which replays a trace and rescales its kernels class by class).

    base, report = calibrate_base(load_trace(paths), model, par, cluster, precision)

1. The base is comet's own StepGraph of the configuration the trace was measured with
   (`build_step_graph(model, par)`), materialized on the cluster the trace was measured on.
2. The trace's GPU ops of one rank are put in four classes by kernel name (`trace_class`): gemm,
   attention, communication (NCCL collectives and point-to-point), memory-bound (every other kernel).
   CPU ops and memory copies are ignored. The rank is rank 0 if the trace has it, else its lowest rank.
3. The same classes are summed over one step of the materialized base on that rank's pipeline stage
   (Megatron rank order, pipeline outermost: stage = rank // (gpus / pp)), counting block occurrences
   from the pipeline plan exactly as comet/graph/expand.py emits them: every task's blocks, its
   point-to-point send, and the stage's once-per-step ops (gradient buckets, parameter gathers,
   embedding all-reduce, optimizer).
4. Every base op of a class gets duration * measured / modelled. Classes the trace does not have keep
   factor 1 (the report says so). Transformations then carry the factor per op (retime.py ratio rule).

Both sides are busy times (sums of kernel durations), not wall-clock: overlap does not enter. The
pipeline sends are built by the replay from the plan (comet/replay/step.py), not stored in the base, so
they count in the modelled communication time but are not scaled. NCCL kernel times in a real trace
include waiting for the slowest peer, which raises the communication factor.

A factor outside [0.1, 10] means the trace is not of this model and configuration: refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Precision
from comet.errors import ConfigError, TraceError
from comet.graph.ir import KernelClass, Op, OpKind, StepGraph
from comet.replay.schedule import BWD, FWD, block_occurrences, send_stride
from comet.replay.timing import op_time_s, timed_s
from comet.transform.materialize import map_ops

CLASSES = ("gemm", "attention", "communication", "memory")
FACTOR_RANGE = (0.1, 10.0)
# Kernel names: cuBLAS / CUTLASS GEMMs ("sm90_xmma_gemm_...", "ampere_bf16_s16816gemm_...", "nvjet_tst_..."
# on Hopper cuBLAS 12.x, cuDNN "..._scudnn_..." convolutions), flash / fused attention ("flash_fwd_kernel", "fmha_cutlassF_...", "...sdpa...").
# Attention is tested first: CUTLASS-based attention kernels also contain "cutlass".
_ATTENTION = re.compile(r"flash|fmha|attn|attention|sdpa", re.IGNORECASE)
_GEMM = re.compile(r"gemm|cutlass|cublas|xmma|wgmma|sm80_|sm90_|sm100_|matmul|nvjet|scudnn", re.IGNORECASE)
_COMM = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
_BY_KERNEL = {KernelClass.GEMM: "gemm", KernelClass.ATTENTION: "attention", KernelClass.MEMORY: "memory"}


@dataclass(frozen=True)
class ClassFactor:
    name: str
    measured_s: float       # busy time of the class on the trace's rank, one iteration
    modelled_s: float       # the same on the base's stage, one step
    factor: float           # applied to the base's ops of the class
    note: str = ""


@dataclass(frozen=True)
class CalibrationReport:
    rank: int
    stage: int
    step: str | None
    classes: tuple[ClassFactor, ...]

    @property
    def factors(self) -> dict[str, float]:
        return {c.name: c.factor for c in self.classes}

    def line(self) -> str:
        """One plain line for a driver or CLI to print."""
        parts = [f"{c.name} x{c.factor:.3f} ({c.measured_s * 1e3:.3f} / {c.modelled_s * 1e3:.3f} ms"
                 f"{', ' + c.note if c.note else ''})" for c in self.classes]
        return (f"base calibrated from trace rank {self.rank} ({self.step or 'one iteration'}) against "
                f"stage {self.stage} (measured / modelled): " + "; ".join(parts))


# ------------------------------------------------------------------------------------ classes
def trace_class(op: Op) -> str | None:
    """Class of a measured op; None for CPU ops and memory copies (not calibrated)."""
    if op.kind in _COMM:
        return "communication"
    if op.kind is not OpKind.COMPUTE:
        return None
    if op.kernel in _BY_KERNEL:          # an annotated import (comet graph JSON, Chakra) already says
        return _BY_KERNEL[op.kernel]
    if _ATTENTION.search(op.name):
        return "attention"
    return "gemm" if _GEMM.search(op.name) else "memory"


def model_class(op: Op) -> str | None:
    """Class of a built op (by the cost model's kernel class)."""
    if op.kind in _COMM:
        return "communication"
    if op.kind is not OpKind.COMPUTE:
        return None
    return _BY_KERNEL.get(op.kernel, "memory")


# ------------------------------------------------------------------------------------ measured side
def measured_by_class(trace: nx.DiGraph, where: str = "trace") -> tuple[int, str | None, dict[str, float]]:
    """(rank, step label, class -> busy seconds) of rank 0 (else the lowest rank) of an imported trace."""
    ranks = sorted({op.rank for _, op in trace.nodes(data="op")})
    if not ranks:
        raise TraceError("the trace has no ops", path=where)
    rank = 0 if 0 in ranks else ranks[0]
    totals = dict.fromkeys(CLASSES, 0.0)
    for _, op in trace.nodes(data="op"):
        cls = trace_class(op) if op.rank == rank else None
        if cls is not None and op.duration_s:
            totals[cls] += op.duration_s
    info = next((r for r in trace.graph.get("ranks", []) if r.get("rank") == rank), {})
    return rank, info.get("step"), totals


# ------------------------------------------------------------------------------------ modelled side
def _block_totals(g: nx.DiGraph, cluster: ClusterSpec, precision: str) -> dict[str, float]:
    out = dict.fromkeys(CLASSES, 0.0)
    for _, op in g.nodes(data="op"):
        cls = model_class(op)
        if cls is not None:
            out[cls] += timed_s(op, cluster, precision)
    return out


def stage_totals(base: StepGraph, stage: int, cluster: ClusterSpec, precision: str) -> dict[str, float]:
    """Class -> busy seconds of one step on `stage`: each block times its occurrences on the stage
    (schedule.block_occurrences), the tasks' blocking sends, then the stage's once-per-step ops."""
    plan = base.plan
    out = dict.fromkeys(CLASSES, 0.0)
    for key, n in block_occurrences(plan, stage).items():
        for cls, t in _block_totals(base.blocks[key], cluster, precision).items():
            out[cls] += n * t
    for c in range(plan.vpp):
        for phase in (FWD, BWD):
            stride = send_stride(plan, stage, c, phase)
            if stride is not None:
                send = Op("pp.send", OpKind.SEND, msg_bytes=plan.p2p_bytes, group_size=2, group_stride=stride)
                out["communication"] += plan.num_microbatches * op_time_s(send, cluster, precision)
    st = base.stages[stage]
    sync = [(b.op, b.count) for b in st.grad_buckets + st.param_gathers]
    sync += [(op, 1) for op in ((st.embedding_sync,) if st.embedding_sync else ()) + st.optimizer]
    for op, n in sync:
        cls = model_class(op)
        if cls is not None:
            out[cls] += n * timed_s(op, cluster, precision)
    return out


# ------------------------------------------------------------------------------------ scaling
def _scaled(op: Op, factors: dict[str, float]) -> Op:
    f = factors.get(model_class(op) or "", 1.0)
    if f == 1.0 or op.duration_s is None:
        return op
    return op.with_(duration_s=op.duration_s * f)


def scale_classes(base: StepGraph, factors: dict[str, float]) -> StepGraph:
    """A copy of a materialized base with every op's duration times its class's factor."""
    return map_ops(base, lambda _block, op: _scaled(op, factors))


# ------------------------------------------------------------------------------------ entry point
def _factor(cls: str, measured_s: float, modelled_s: float, where: str) -> ClassFactor:
    if measured_s <= 0:
        return ClassFactor(cls, measured_s, modelled_s, 1.0, "not in the trace: factor 1")
    if modelled_s <= 0:
        raise ConfigError(f"the trace has {measured_s * 1e3:.3f} ms of {cls} kernels per iteration but the "
                          "configuration models none: the trace is not of this model / configuration",
                          field=where)
    factor = measured_s / modelled_s
    low, high = FACTOR_RANGE
    if not low <= factor <= high:
        raise ConfigError(f"calibration factor of class {cls} is {factor:.3g} (measured {measured_s * 1e3:.3f} ms "
                          f"/ modelled {modelled_s * 1e3:.3f} ms per step), outside [{low:g}, {high:g}]: the "
                          "trace is not of this model / configuration", field=where)
    return ClassFactor(cls, measured_s, modelled_s, factor)


def calibrate_base(trace: nx.DiGraph, model: ModelSpec, par: ParallelConfig, cluster: ClusterSpec,
                   precision: str | Precision | None = None, where: str = "base.trace"
                   ) -> tuple[StepGraph, CalibrationReport]:
    """The materialized base StepGraph of (model, par) on `cluster`, its ops' durations scaled per kernel
    class to match the measured trace; and the report of the factors. `where` names the input in errors."""
    from comet.transform.materialize import materialize
    from comet.workload.builder import build_step_graph
    par = par.resolve(model)
    prec = par.precision.value if precision is None else Precision(precision).value
    rank, step, measured = measured_by_class(trace, where)
    world = {r.get("world_size") for r in trace.graph.get("ranks", [])} - {None}
    if world and world != {par.gpus}:
        raise ConfigError(f"the trace was measured on {sorted(world)[0]} GPUs but the configuration it is "
                          f"said to be of ({par.label()}) has {par.gpus}", field=where)
    stage = min(rank // max(par.gpus // par.pp, 1), par.pp - 1)
    base = materialize(build_step_graph(model, par), cluster, prec)
    modelled = stage_totals(base, stage, cluster, prec)
    classes = tuple(_factor(c, measured[c], modelled[c], where) for c in CLASSES)
    report = CalibrationReport(rank=rank, stage=stage, step=step, classes=classes)
    return scale_classes(base, report.factors), report


__all__ = ["CLASSES", "FACTOR_RANGE", "CalibrationReport", "ClassFactor", "calibrate_base", "measured_by_class",
           "model_class", "scale_classes", "stage_totals", "trace_class"]
