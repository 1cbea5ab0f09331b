"""Predict one published measurement with comet's engine and compare it with the measured value."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from comet.config.cluster import ClusterSpec, load_cluster
from comet.evaluate import evaluate, resolve
from comet.errors import CometError
from comet.replay.blocks import time_block
from comet.result import Result
from comet.validate.rows import Case
from comet.validate.sources import Accounting, flops_per_step
from comet.workload.builder import build_step_graph

LAYER_BLOCKS = ("layer.fwd", "layer.recompute", "layer.bwd")


@dataclass
class Prediction:
    case: Case
    status: str                   # ok | skipped | infeasible
    predicted: float = math.nan
    reason: str = ""
    label: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction relative to the measurement, in percent."""
        if self.status != "ok":
            return math.nan
        return (self.predicted - self.case.value) / self.case.value * 100.0

    def as_dict(self) -> dict:
        c = self.case
        err = self.error_pct
        return {"index": c.index, "source": c.source, "source_key": c.profile.key, "model": c.row.get("model", ""),
                "gpu": c.row.get("gpu", ""), "num_gpus": c.row.get("num_gpus", ""), "metric": c.metric,
                "value": c.value, "predicted": None if math.isnan(self.predicted) else self.predicted,
                "error_pct": None if math.isnan(err) else err, "status": self.status, "reason": self.reason,
                "held_out": c.held_out, "config": self.label, "assumptions": list(c.assumptions),
                "breakdown": self.breakdown}


class ClusterCache:
    """Cluster specs by file name, loaded once from a folder (or given directly, e.g. during a fit)."""

    def __init__(self, folder: str | Path, overrides: dict[str, ClusterSpec] | None = None):
        self.folder = Path(folder)
        self.specs: dict[str, ClusterSpec] = dict(overrides or {})

    def get(self, fname: str) -> ClusterSpec:
        if fname not in self.specs:
            self.specs[fname] = load_cluster(self.folder / fname)
        return self.specs[fname]


def _percent_scale(case: Case) -> float:
    unit = case.row.get("unit", "")
    return 100.0 if "%" in unit or case.value > 1.0 else 1.0


def metric_from_result(case: Case, res: Result, cluster: ClusterSpec) -> float:
    """The row's metric computed from a step time, with the row's source FLOP accounting."""
    model, t = case.model, res.step_time_s
    gpus = res.gpus
    gb = case.parallel.global_batch
    if case.metric == "iteration_time_s":
        return t
    if case.metric == "tokens_per_s_per_gpu":
        return gb * model.seq_len / t / gpus
    if case.metric == "tflops_per_gpu":
        return flops_per_step(case.profile.accounting, model, gb) / t / gpus / 1e12
    if case.metric == "mfu":
        peak = cluster.gpu.peak_flops("bf16" if "bf16" in cluster.gpu.peak_tflops else "fp16")
        return flops_per_step(Accounting.MODEL, model, gb) / t / gpus / peak * _percent_scale(case)
    raise ValueError(case.metric)


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


def predict(case: Case, clusters: ClusterCache) -> Prediction:
    if case.skip_reason:
        return Prediction(case, "skipped", reason=case.skip_reason)
    try:
        cluster = clusters.get(case.cluster_file)
        if case.metric == "layer_fwd_bwd_time_ms":
            ms, parts, label = layer_time_ms(case, cluster)
            return Prediction(case, "ok", ms, label=label, breakdown=parts)
        res = evaluate(case.model, cluster, case.parallel)
    except CometError as exc:
        return Prediction(case, "infeasible", reason=str(exc))
    if not res.feasible:
        return Prediction(case, "infeasible", reason=res.reason, label=res.label)
    return Prediction(case, "ok", metric_from_result(case, res, cluster), label=res.label,
                      breakdown=dict(res.breakdown))


def predict_all(cases: list[Case], clusters: ClusterCache) -> list[Prediction]:
    return [predict(c, clusters) for c in cases]
