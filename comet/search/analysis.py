"""Questions a study answers from its results table (COMET's Transformer-1T case study):
the spread of the best time-to-train across cluster configurations, the gain of memory expansion,
the effect of each provisioning axis, and which resource the best designs are bound by."""

from __future__ import annotations

import math
from functools import cached_property

import pandas as pd

from comet.search.context import PROVISION_KEYS

TIME = "time_to_train_days"
RESOURCES = ("compute", "scale-up bandwidth", "scale-out bandwidth", "expansion bandwidth", "pipeline bubble")


def cluster_columns(df: pd.DataFrame) -> list[str]:
    """Columns that identify a cluster configuration (provisioning axes that vary, and GPUs)."""
    cols = [c for c in ("gpus",) + PROVISION_KEYS if c in df.columns]
    return [c for c in cols if df[c].nunique(dropna=False) > 1] or [c for c in cols if c == "gpus"]


def feasible(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["status"] == "ok"] if not df.empty else df
    return ok[ok[TIME].notna() & (ok[TIME] < math.inf)] if TIME in ok else ok.iloc[0:0]


def best_per_cluster(df: pd.DataFrame, cols: list[str] | None = None) -> pd.DataFrame:
    """The best (shortest time-to-train) row of each cluster configuration (`cols`: cluster_columns(df)
    when the caller already has them)."""
    ok = feasible(df)
    cols = cluster_columns(df) if cols is None else cols
    if ok.empty or not cols:
        return ok
    # perf: only the key and time columns are copied to fill the gaps
    idx = ok[cols + [TIME]].fillna({c: 0 for c in cols}).groupby(cols, dropna=False)[TIME].idxmin()
    return ok.loc[idx.values].sort_values(TIME)


class Findings:
    """What a study's summary asks of one results table, each answer computed once: the cluster columns,
    the best row of each cluster, each axis' effect. The case-study and provisioning sections both read
    them (perf: best_per_cluster ran 7 times and every axis effect twice per gpt3_1t summary)."""

    def __init__(self, df: pd.DataFrame):
        self.df = df
        self.cols = cluster_columns(df)
        self._effects: dict[str, dict | None] = {}

    @cached_property
    def best(self) -> pd.DataFrame:
        return best_per_cluster(self.df, self.cols)

    def effect(self, axis: str) -> dict | None:
        if axis not in self._effects:
            self._effects[axis] = axis_effect(self.df, axis, self.best, self.cols)
        return self._effects[axis]


def spread(df: pd.DataFrame, best: pd.DataFrame | None = None) -> dict | None:
    """Best time-to-train of the best and of the worst cluster configuration, and their ratio."""
    best = best_per_cluster(df) if best is None else best
    if len(best) < 2:
        return None
    lo, hi = best.iloc[0], best.iloc[-1]
    return {"clusters": len(best), "best": lo, "worst": hi, "ratio": hi[TIME] / lo[TIME]}


def axis_effect(df: pd.DataFrame, axis: str, best: pd.DataFrame | None = None,
                cols: list[str] | None = None) -> dict | None:
    """For each group of the other cluster axes: best time at the axis' first value / at each other
    value. Returns the largest and median speed-up of going from the lowest to a higher value.
    `best` is best_per_cluster(df) and `cols` cluster_columns(df) when the caller already has them."""
    cols = cluster_columns(df) if cols is None else cols
    best = best_per_cluster(df, cols) if best is None else best
    if axis not in cols or best.empty:
        return None
    others = [c for c in cols if c != axis]
    fill = {c: 0 for c in others}
    low = best[axis].min()
    # perf: one pass over plain lists (a few hundred clusters) instead of a boolean mask per group
    b = best[others + [axis, TIME]].fillna(fill)
    at_low: dict[tuple, float] = {}       # group of the other axes -> best time at the lowest value
    above: dict[tuple, float] = {}        # -> best time at any other value
    for key, is_low, t in zip(_keys(b, others), (b[axis] == low).tolist(), b[TIME].tolist()):
        if is_low:
            at_low.setdefault(key, t)     # best is sorted by time: the first row is the group's best
        else:
            above[key] = min(above.get(key, math.inf), t)
    ratios = [at_low[k] / t for k, t in above.items() if k in at_low]
    # a group whose lowest value has no feasible design counts when that value was tried there
    unmatched = [k for k in above if k not in at_low]
    only_with = 0
    if unmatched:
        lows = df.loc[df[axis] == low, others].fillna(fill).drop_duplicates()
        tried = set(_keys(lows, others)) if others else ({()} if len(lows.index) else set())
        only_with = sum(k in tried for k in unmatched)
    if not ratios and not only_with:
        return None
    s = pd.Series(ratios, dtype=float)
    return {"axis": axis, "low": low, "groups": len(ratios), "max": s.max() if ratios else float("nan"),
            "median": s.median() if ratios else float("nan"), "only_feasible_above_low": only_with}


def _keys(frame: pd.DataFrame, cols: list[str]) -> list[tuple]:
    """Each row's values of `cols` as a tuple (() for every row when there are none)."""
    if not cols:
        return [()] * len(frame.index)
    return list(zip(*(frame[c].tolist() for c in cols)))


def expansion_gain(df: pd.DataFrame) -> dict | None:
    """Speed-up from adding memory expansion (expansion_GB > 0 vs 0), other axes equal."""
    if "expansion_GB" not in df.columns or df["expansion_GB"].nunique() < 2:
        return None
    d = df.copy()
    d["expansion_GB"] = d["expansion_GB"].fillna(0)
    d["_has_expansion"] = (d["expansion_GB"] > 0).astype(int)
    d = d.drop(columns=[c for c in ("expansion_bandwidth_GBps",) if c in d]).rename(
        columns={"expansion_GB": "_expansion_GB"})
    d["expansion_GB"] = d["_has_expansion"]
    return axis_effect(d, "expansion_GB")


def group_span(kind: str, row: pd.Series) -> int:
    """GPUs spanned by one group of `kind`, in Megatron's rank order (tp innermost, then cp, dp, pp)."""
    tp, cp, dp, pp = (int(row.get(k) or 1) for k in ("tp", "cp", "dp", "pp"))
    return {"tp": tp, "cp": tp * cp, "dp": tp * cp * dp, "pp": tp * cp * dp * pp}[kind]


def resource_times(row: pd.Series, scaleup_size: int) -> dict[str, float]:
    """Step time by resource: compute (and optimizer), exposed communication on the scale-up or the
    scale-out tier (a group stays in the scale-up domain when it spans no more GPUs than the domain
    holds), offload traffic (expansion bandwidth) and pipeline bubble."""
    size = int(row.get("scaleup_size") or scaleup_size or 1)
    parts = dict.fromkeys(RESOURCES, 0.0)
    parts["compute"] = _v(row, "breakdown.compute") + _v(row, "breakdown.optimizer")
    for kind in ("tp", "cp", "dp", "pp"):
        tier = "scale-up bandwidth" if group_span(kind, row) <= size else "scale-out bandwidth"
        parts[tier] += _v(row, f"breakdown.exposed_{kind}")
    parts["expansion bandwidth"] = _v(row, "breakdown.offload")
    parts["pipeline bubble"] = _v(row, "breakdown.pipeline_bubble")
    return parts


def bound_of(row: pd.Series, scaleup_size: int) -> str:
    """The resource with the largest share of the step time."""
    parts = resource_times(row, scaleup_size)
    return max(parts, key=parts.get)


def largest_overhead(row: pd.Series, scaleup_size: int) -> tuple[str, float]:
    """The largest non-compute resource and its fraction of the step time."""
    parts = resource_times(row, scaleup_size)
    parts.pop("compute")
    name = max(parts, key=parts.get)
    total = _v(row, "step_time_s") or sum(resource_times(row, scaleup_size).values()) or 1.0
    return name, parts[name] / total


def cluster_tag(row: pd.Series) -> str:
    """Short cluster name for plot labels: 4096g x512@200 su32 so100."""
    parts = [f"{int(row['gpus'])}g"]
    if "expansion_GB" in row and not pd.isna(row["expansion_GB"]) and row["expansion_GB"] > 0:
        bw = row.get("expansion_bandwidth_GBps")
        parts.append(f"x{row['expansion_GB']:g}" + (f"@{bw:g}" if bw is not None and not pd.isna(bw) else ""))
    for col, short in (("hbm_GB", "hbm"), ("scaleup_size", "su"), ("scaleup_bandwidth_GBps", "suBW"),
                       ("scaleout_bandwidth_GBps", "so"), ("compute_scale", "cs")):
        if col in row and not pd.isna(row[col]):
            parts.append(f"{short}{row[col]:g}")
    return " ".join(parts)


def memory_limited(row: pd.Series, hbm_GB: float) -> bool:
    """HBM capacity shapes the design: it recomputes everything, offloads, or fills >= 90% of HBM
    (selective recompute is Megatron's default and nearly free, Korthikanti et al. 2022)."""
    hbm = row.get("hbm_GB") or hbm_GB
    return (row.get("recompute") == "full" or row.get("offload") not in (None, "none")
            or _v(row, "memory_gb_per_gpu") >= 0.9 * hbm)


def _v(row: pd.Series, key: str) -> float:
    v = row.get(key)
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
