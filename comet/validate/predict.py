"""Predict one published measurement with comet's engine and compare it with the measured value."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from comet.config.cluster import ClusterSpec, load_cluster
from comet.evaluate import evaluate, resolve
from comet.errors import CometError
from comet.replay.blocks import time_block
from comet.result import Result
from comet.validate.accounting import flops_per_step
from comet.validate.layout import choose_layout
from comet.validate.memory_knobs import fit_unstated_knobs, with_steps
from comet.validate.rows import MEMORY_METRICS, Case
from comet.workload.builder import build_step_graph
from comet.workload.memory_measures import measured_GB

LAYER_BLOCKS = ("layer.fwd", "layer.recompute", "layer.bwd")


@dataclass
class Prediction:
    case: Case
    status: str                   # ok | skipped | infeasible
    predicted: float = math.nan
    reason: str = ""
    label: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_GB: float | None = None      # predicted peak HBM per GPU (1e9 bytes), every modelled row

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction relative to the measurement, in percent."""
        if self.status != "ok":
            return math.nan
        return (self.predicted - self.case.value) / self.case.value * 100.0

    def as_dict(self) -> dict:
        c = self.case
        err = self.error_pct
        return {"index": c.index, "source": c.source, "source_label": c.source_label, "framework": c.framework,
                "model": c.row.get("model", ""),
                "gpu": c.row.get("gpu", ""), "num_gpus": c.row.get("num_gpus", ""), "metric": c.metric,
                "value": c.value, "predicted": None if math.isnan(self.predicted) else self.predicted,
                "error_pct": None if math.isnan(err) else err, "status": self.status, "reason": self.reason,
                "held_out": c.held_out, "config": self.label, "assumptions": list(c.assumptions),
                "bad_column": c.bad_column, "memory_gb_per_gpu": self.memory_GB, "breakdown": self.breakdown}


class ClusterCache:
    """Cluster specs by file name, loaded once from a folder (or given directly, e.g. during a fit)."""

    def __init__(self, folder: str | Path, overrides: dict[str, ClusterSpec] | None = None):
        self.folder = Path(folder)
        self.specs: dict[str, ClusterSpec] = dict(overrides or {})

    def get(self, fname: str, hbm_GB: float | None = None, hbm_GBps: float | None = None) -> ClusterSpec:
        """The spec, with the HBM of a variant part (H100 96 GB, H200) where the row's gpu_model says so."""
        if fname not in self.specs:
            self.specs[fname] = load_cluster(self.folder / fname)
        spec = self.specs[fname]
        if hbm_GB is None and hbm_GBps is None:
            return spec
        gpu = replace(spec.gpu, hbm_GB=hbm_GB or spec.gpu.hbm_GB,
                      hbm_bandwidth_GBps=hbm_GBps or spec.gpu.hbm_bandwidth_GBps)
        return replace(spec, gpu=gpu)


def _percent_scale(case: Case) -> float:
    unit = case.row.get("unit", "")
    return 100.0 if "%" in unit or case.value > 1.0 else 1.0


GIB = 2 ** 30


def metric_from_result(case: Case, res: Result, cluster: ClusterSpec) -> float:
    """The row's metric computed from a step time (or the memory estimate), with the row's FLOP
    accounting (flops_formula) and MFU peak (mfu_peak_tflops, else the GPU's dense BF16 peak)."""
    model, t = case.model, res.step_time_s
    gpus = res.gpus
    gb = case.parallel.global_batch
    tokens = gb * model.seq_len
    if case.metric == "iteration_time_s":
        return t
    if case.metric == "tokens_per_s_per_gpu":
        return tokens / t / gpus
    if case.metric == "tokens_per_s":
        return tokens / t
    if case.metric == "time_to_train_min":
        return case.total_tokens / (tokens / t) / 60.0
    if case.metric == "tflops_per_gpu":
        return flops_per_step(case.flops_formula, model, gb) / t / gpus / 1e12
    if case.metric == "mfu":
        peak = (case.mfu_peak_tflops * 1e12 if case.mfu_peak_tflops else
                cluster.gpu.peak_flops("bf16" if "bf16" in cluster.gpu.peak_tflops else "fp16"))
        return flops_per_step(case.flops_formula, model, gb) / t / gpus / peak * _percent_scale(case)
    if case.metric in MEMORY_METRICS:
        return _measured_memory(case, cluster, res.memory_gb_per_gpu)
    raise ValueError(case.metric)


def _measured_memory(case: Case, cluster: ClusterSpec, total_GB: float) -> float:
    """The footprint as the row's memory_measure reads it (nvidia-smi, reserved or allocated), in the
    row's unit."""
    gb = measured_GB(total_GB, case.parallel.resolve(case.model), cluster, case.memory_measure)   # dp from gpus
    return gb * 1e9 / GIB if case.metric == "memory_gib_per_gpu" else gb


def layer_time_ms(case: Case, cluster: ClusterSpec) -> tuple[float, dict, str]:
    """One transformer layer's forward + recompute + backward on the cluster model (Korthikanti Table 4)."""
    par = resolve(case.model, cluster, case.parallel)
    graph = build_step_graph(case.model, par)
    total, parts = 0.0, {}
    for name in LAYER_BLOCKS:
        bt = time_block(graph.blocks[name], cluster, par.precision.value)
        total += bt.duration_s
        for k, v in bt.parts.items():
            parts[k] = parts.get(k, 0.0) + v * 1e3
    return total * 1e3, parts, par.label()


def fit_memory_knobs(case: Case, cluster: ClusterSpec) -> None:
    """Memory-saving knobs the row leaves empty, where the default does not fit
    (comet/validate/memory_knobs.py): the case's configuration and its assumptions."""
    par, taken, replaced = fit_unstated_knobs(case.model, cluster, case.parallel, case.row, case.defaults)
    if taken:
        case.parallel = par
        case.assumptions[:] = with_steps(case.assumptions, taken, replaced)
        case.chosen.extend(taken)


def predict(case: Case, clusters: ClusterCache) -> Prediction:
    if case.skip_reason:
        return Prediction(case, "skipped", reason=case.skip_reason)
    try:
        cluster = clusters.get(case.cluster_file, case.hbm_GB, case.hbm_GBps)
        if case.open_layout is not None:
            res = choose_layout(case, cluster)
            if res is None:
                return Prediction(case, "infeasible", reason=case.assumptions[-1])
        else:
            fit_memory_knobs(case, cluster)
            res = None
        if case.metric == "layer_fwd_bwd_time_ms":
            ms, parts, label = layer_time_ms(case, cluster)
            return Prediction(case, "ok", ms, label=label, breakdown=parts)
        res = res or evaluate(case.model, cluster, case.parallel)
    except CometError as exc:
        return Prediction(case, "infeasible", reason=str(exc))
    mem = res.memory_gb_per_gpu if res.memory_gb_per_gpu == res.memory_gb_per_gpu else None
    if not res.feasible:
        if case.metric in MEMORY_METRICS and mem:   # a memory row still gets its predicted footprint
            return Prediction(case, "infeasible", _measured_memory(case, cluster, mem),
                              reason=res.reason, label=res.label, memory_GB=mem)
        return Prediction(case, "infeasible", reason=res.reason, label=res.label, memory_GB=mem)
    return Prediction(case, "ok", metric_from_result(case, res, cluster), label=res.label,
                      breakdown=dict(res.breakdown), memory_GB=mem)


def predict_all(cases: list[Case], clusters: ClusterCache) -> list[Prediction]:
    return [predict(c, clusters) for c in cases]
