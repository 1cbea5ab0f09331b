"""Error statistics of a validation run: MAPE and max error per source, per metric, overall, and on the
held-out rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from comet.validate.predict import Prediction
from comet.validate.rows import MEMORY_METRICS


@dataclass(frozen=True)
class ErrorStats:
    n: int
    mape: float          # mean absolute percentage error
    max_abs: float       # largest absolute percentage error
    mean: float          # mean signed error (bias)

    def as_dict(self) -> dict:
        def f(x):
            return None if math.isnan(x) else round(x, 3)
        return {"n": self.n, "mape_pct": f(self.mape), "max_abs_error_pct": f(self.max_abs), "bias_pct": f(self.mean)}


def stats(preds: list[Prediction]) -> ErrorStats:
    errs = [p.error_pct for p in preds if p.status == "ok"]
    if not errs:
        return ErrorStats(0, math.nan, math.nan, math.nan)
    return ErrorStats(len(errs), sum(abs(e) for e in errs) / len(errs), max(abs(e) for e in errs),
                      sum(errs) / len(errs))


def grouped(preds: list[Prediction], key) -> dict[str, ErrorStats]:
    groups: dict[str, list[Prediction]] = {}
    for p in preds:
        groups.setdefault(key(p), []).append(p)
    return {k: stats(v) for k, v in groups.items()}


def source_label(p: Prediction) -> str:
    return p.case.source_label


# Issue 11 scores the step-rate metrics (iteration time, tokens/s, TFLOP/s, MFU). Time to train is reported on
# its own: MLPerf's run_start..run_stop also counts periodic evaluation, which the schema has no column for.
STEP_RATE_METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "tflops_per_gpu", "mfu")
TIME_TO_TRAIN_METRICS = ("time_to_train_min",)


def scale(p: Prediction) -> str:
    """Regime by job size: GPUs in the job."""
    try:
        n = int(float(p.case.row.get("num_gpus") or 0))
    except (ValueError, OverflowError):    # a bad cell (its row is skipped): no regime
        n = 0
    return "<=64 GPUs" if n <= 64 else ("65-1024 GPUs" if n <= 1024 else ">1024 GPUs")


def model_size(p: Prediction) -> str:
    """Regime by parameters (comet's count of the row's model)."""
    if p.case.model is None:
        return "-"
    b = p.case.model.params / 1e9
    return "<20B" if b < 20 else ("20-100B" if b < 100 else ">=100B")


def precision(p: Prediction) -> str:
    return p.case.parallel.precision.value if p.case.parallel is not None else "-"


def summarize(preds: list[Prediction]) -> dict:
    """Error statistics overall, on held-out rows, per source / metric / GPU, and per regime (precision,
    scale, framework, model size) over the time metrics, which comet.validate.uncertainty turns into
    an expected error band for new predictions."""
    counts = {s: sum(p.status == s for p in preds) for s in ("ok", "skipped", "infeasible")}
    time_rows = [p for p in preds if p.case.metric in STEP_RATE_METRICS]
    dense_rows = [p for p in time_rows if p.case.model is None or p.case.model.moe is None]
    return {
        "time_metrics": stats(time_rows),
        "time_metrics_held_out": stats([p for p in time_rows if p.case.held_out]),
        "time_metrics_dense": stats(dense_rows),
        "time_metrics_dense_held_out": stats([p for p in dense_rows if p.case.held_out]),
        "time_to_train": stats([p for p in preds if p.case.metric in TIME_TO_TRAIN_METRICS]),
        "time_metrics_with_time_to_train": stats([p for p in preds
                                                  if p.case.metric in STEP_RATE_METRICS + TIME_TO_TRAIN_METRICS]),
        "memory": stats([p for p in preds if p.case.metric in MEMORY_METRICS]),
        "by_precision": grouped(time_rows, precision),
        "by_scale": grouped(time_rows, scale),
        "by_framework": grouped(time_rows, lambda p: p.case.framework),
        "by_model_size": grouped(time_rows, model_size),
        "time_coverage": {"rows": len(time_rows), **{s: sum(p.status == s for p in time_rows)
                                                      for s in ("ok", "skipped", "infeasible")}},
        "time_coverage_dense": {"rows": len(dense_rows), **{s: sum(p.status == s for p in dense_rows)
                                                            for s in ("ok", "skipped", "infeasible")}},
        "overall": stats(preds),
        "held_out": stats([p for p in preds if p.case.held_out]),
        "fitted_rows": stats([p for p in preds if not p.case.held_out]),
        "by_source": grouped(preds, source_label),
        "by_metric": grouped(preds, lambda p: p.case.metric),
        "by_source_metric": grouped(preds, lambda p: f"{source_label(p)} / {p.case.metric}"),
        "by_gpu": grouped(preds, lambda p: p.case.cluster_file or "-"),
        "counts": counts,
    }


def summary_as_dict(summary: dict) -> dict:
    out = {}
    for k, v in summary.items():
        if isinstance(v, ErrorStats):
            out[k] = v.as_dict()
        elif k in ("counts", "time_coverage", "time_coverage_dense"):
            out[k] = dict(v)
        else:
            out[k] = {name: s.as_dict() for name, s in v.items()}
    return out
