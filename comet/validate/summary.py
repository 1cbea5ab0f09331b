"""Error statistics of a validation run: MAPE and max error per source, per metric, overall, and on the
held-out rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from comet.validate.predict import Prediction


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


def summarize(preds: list[Prediction]) -> dict:
    """{"overall", "held_out", "fitted_rows", "by_source", "by_metric", "by_source_metric", "by_gpu", "counts"}."""
    counts = {s: sum(p.status == s for p in preds) for s in ("ok", "skipped", "infeasible")}
    return {
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
        elif k == "counts":
            out[k] = dict(v)
        else:
            out[k] = {name: s.as_dict() for name, s in v.items()}
    return out
