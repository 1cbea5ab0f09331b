"""summary.md of a study: counts (pruned by reason), best designs, the Pareto set, and the answers to
COMET's Transformer-1T case-study questions derived from the results table."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pandas as pd

from comet.search import analysis
from comet.search.provisioning import provisioning_section
from comet.search.context import PROVISION_KEYS
from comet.search.space import Direction, SearchSpace

TOP = 10


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def _table(df: pd.DataFrame, cols: list[str]) -> list[str]:
    cols = [c for c in cols if c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return lines


def cluster_text(row: pd.Series, cols: list[str]) -> str:
    return ", ".join(f"{c}={_fmt(row[c])}" for c in cols if c in row and not pd.isna(row[c]))


def write_summary(outcome, space: SearchSpace, ctx, out: Path) -> Path:
    df, front, stats = outcome.frame, outcome.front, outcome.stats
    lines = [f"# Study `{space.study}`", "",
             f"- model: `{ctx.model.name}` ({ctx.model.params / 1e9:,.0f}B parameters); cluster spec: "
             f"`{space.cluster_spec}` ({ctx.cluster.name}); job: {space.job.total_tokens:.3g} tokens, "
             f"global batch {space.global_batch}",
             f"- method: {space.method.value}; objectives: "
             + ", ".join(f"{o.metric.value} ({o.direction.value})" for o in space.objectives),
             f"- run: {outcome.wall_s:.1f} s wall, {outcome.evaluated_now} candidates evaluated now, "
             f"{outcome.resumed} taken from an earlier run" + (" -- **interrupted**: re-run to resume" if
                                                               outcome.interrupted else "")
             + (" -- **stopped by the wall-time budget** with candidates left: re-run to continue"
                if outcome.budget_stop else ""), ""]
    lines += _counts(df, stats)
    if df.empty or (df["status"] == "ok").sum() == 0:
        lines += ["", "No feasible candidate: see the reasons above."]
    else:
        lines += _best(df, front, space) + _case_study(df, ctx)
        lines += provisioning_section(df, front, ctx)   # comet/search/provisioning.py (COMET comparison)
    lines += ["", "## Files", "", "candidates.parquet / candidates.csv (every evaluated candidate), pareto.csv, "
              "study.yaml, journal.jsonl, *.png, timelines/*.json (open in https://ui.perfetto.dev)"
              + (", optuna.db (`optuna-dashboard sqlite:///optuna.db`)" if space.method.uses_optuna else "")]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _counts(df: pd.DataFrame, stats) -> list[str]:
    status = Counter(df["status"]) if not df.empty else Counter()
    lines = ["## Candidates", "",
             f"proposed {stats.proposed} this run, duplicates {stats.duplicates}, pruned before replay "
             f"{stats.pruned}; in the results: {len(df)} evaluated = {status.get('ok', 0)} ok + "
             f"{status.get('infeasible', 0)} infeasible + {status.get('error', 0)} error", ""]
    if stats.by_category:
        lines += ["| pruned because | count | example |", "|---|---|---|"]
        for cat, n in stats.by_category.most_common():
            lines.append(f"| {cat} | {n} | {_example(cat, stats.examples[cat])} |")
        lines.append("")
    bad = df[df["status"] != "ok"] if not df.empty else df
    if not bad.empty:
        lines += ["| not ok after replay | count |", "|---|---|"]
        for reason, n in Counter(bad["status"] + ": " + bad["reason"].str.slice(0, 100)).most_common(8):
            lines.append(f"| {reason} | {n} |")
        lines.append("")
    return lines


def _example(category: str, reason: str) -> str:
    """The part of a (possibly compound) reason that belongs to its category, shortened."""
    parts = reason.split("; ")
    if "expansion" in category:
        parts = [p for p in parts if "expansion" in p] or parts
    text = parts[0]
    return text if len(text) <= 260 else text[:257] + "..."


def _best(df: pd.DataFrame, front: pd.DataFrame, space: SearchSpace) -> list[str]:
    ok = df[df["status"] == "ok"]
    ccols = analysis.cluster_columns(df)
    show = ["gpus"] + [c for c in ccols if c != "gpus"] + ["label", "offload", "step_time_s", "mfu", "memory_gb_per_gpu",
                                                            "time_to_train_days", "cost_per_run_usd", "capex_usd",
                                                            "energy_MWh"]
    lines = ["## Best per objective", ""]
    rows = []
    for o in space.objectives:
        if o.column in ok:
            # ties (e.g. equal capex) are broken by the other objectives, in their order
            order = [o] + [x for x in space.objectives if x is not o]
            best = ok.sort_values([x.column for x in order],
                                  ascending=[x.direction is Direction.MIN for x in order]).iloc[0].copy()
            best["objective"] = f"{o.metric.value} {o.direction.value}"
            rows.append(best)
    lines += _table(pd.DataFrame(rows), ["objective"] + show)
    lines += ["", f"## Pareto set ({len(front)} designs; first {min(len(front), 20)})", ""]
    lines += _table(front.head(20), show)
    return lines + [""] + _error_band_note(ok)


def _error_band_note(ok: pd.DataFrame) -> list[str]:
    """Hook (comet.validate.uncertainty): designs closer than the validation error band are a tie."""
    from comet.validate.uncertainty import error_band
    if ok.empty or "step_time_s" not in ok:
        return []
    fastest = ok.sort_values("step_time_s").iloc[:2]
    prec = fastest.iloc[0].get("precision") if "precision" in fastest else None
    band = error_band(prec if isinstance(prec, str) else None, int(fastest.iloc[0].get("gpus", 0) or 0))
    if band is None:
        return []
    from comet.workload.memory import FIT_MARGIN
    lines = [f"Expected error of a step-time prediction: {band} (comet validate residuals by regime). "
             f"Memory fit test: a design fits when its predicted peak is within {FIT_MARGIN:.0%} of HBM."]
    if len(fastest) == 2:
        gap = (fastest.iloc[1]["step_time_s"] / fastest.iloc[0]["step_time_s"] - 1) * 100
        if gap < band.pct:
            lines.append(f"The two fastest designs differ by {gap:.1f}%, less than that band: treat them as equal.")
    return lines + [""]


def _case_study(df: pd.DataFrame, ctx) -> list[str]:
    lines = ["## Case-study questions", ""]
    if analysis.TIME not in df:
        return lines + ["(no time-to-train column)"]
    ccols = analysis.cluster_columns(df)
    sp = analysis.spread(df)
    if sp:
        lines.append(f"**Spread across cluster configurations.** Over {sp['clusters']} cluster configurations, "
                     f"the best time-to-train ranges from {sp['best'][analysis.TIME]:.1f} days "
                     f"({cluster_text(sp['best'], ccols)}) to {sp['worst'][analysis.TIME]:.1f} days "
                     f"({cluster_text(sp['worst'], ccols)}): **{sp['ratio']:.1f}x** apart "
                     "(COMET reports up to 7.7x).")
        ok = analysis.feasible(df)
        lines[-1] += (f" Across all {len(ok)} feasible designs (any parallel configuration), time-to-train spans "
                      f"{ok[analysis.TIME].min():.1f} to {ok[analysis.TIME].max():.1f} days "
                      f"({ok[analysis.TIME].max() / ok[analysis.TIME].min():.1f}x).")
        by_gpus = analysis.spread_by_gpus(df)
        if by_gpus:
            lines[-1] += (" At a fixed GPU count, provisioning alone (memory, scale-up, scale-out) spans "
                          + ", ".join(f"{r:.2f}x at {g} GPUs" for g, r in by_gpus.items()) + ".")
        lines.append("")
    gain = analysis.expansion_gain(df)
    if gain:
        lines.append(f"**Memory expansion.** With the other axes equal, adding expansion memory shortens the best "
                     f"time-to-train by up to **{gain['max']:.2f}x** (median {gain['median']:.2f}x over "
                     f"{gain['groups']} cluster configurations; COMET: up to 1.4x)"
                     + (f"; {gain['only_feasible_above_low']} configurations have a feasible design only with "
                        "expansion." if gain["only_feasible_above_low"] else "."))
        lines.append("")
    effects = [e for e in (analysis.axis_effect(df, a) for a in ("gpus",) + PROVISION_KEYS) if e]
    if effects:
        lines += ["**Effect of each provisioning axis** (best time at the lowest value / best at a higher value, "
                  "other axes equal):", "", "| axis | lowest | groups | median speed-up | max speed-up | "
                  "groups feasible only above lowest |", "|---|---|---|---|---|---|"]
        for e in effects:
            lines.append(f"| {e['axis']} | {_fmt(e['low'])} | {e['groups']} | {_fmt(e['median'])}x | "
                         f"{_fmt(e['max'])}x | {e['only_feasible_above_low']} |")
        lines.append("")
    lines += _bounds(df, ctx, ccols)
    return lines


def _bounds(df: pd.DataFrame, ctx, ccols: list[str]) -> list[str]:
    best = analysis.best_per_cluster(df).head(TOP)
    if best.empty:
        return []
    size = ctx.cluster.network[0].size
    rows = [r for _, r in best.iterrows()]
    over = [analysis.largest_overhead(r, size) for r in rows]
    best = best.assign(bound=[analysis.bound_of(r, size) for r in rows],
                       overhead=[f"{name} {share:.0%}" for name, share in over],
                       memory_limited=[analysis.memory_limited(r, ctx.cluster.gpu.hbm_GB) for r in rows])
    counts = Counter(best["bound"])
    over_counts = Counter(name for name, _ in over)
    shares = pd.Series([share for _, share in over])
    mem = int(best["memory_limited"].sum())
    lines = [f"**What the best designs are bound by.** Taking the best design of each of the top {len(best)} "
             "cluster configurations: by the largest share of step time, "
             + ", ".join(f"{n} are bound by {k}" for k, n in counts.most_common())
             + "; the largest overhead beyond compute is "
             + ", ".join(f"{k} ({n})" for k, n in over_counts.most_common())
             + f", at a median {shares.median():.0%} of the step time; {mem} of {len(best)} are limited by HBM "
             "capacity (full recompute, offload, or >= 90% of HBM used). Exposed communication is assigned "
             "to the scale-up or scale-out tier by the GPUs each group spans (Megatron rank order: tp, cp, dp, "
             "pp); offload traffic is expansion bandwidth.", ""]
    cols = ccols + ["label", "offload", analysis.TIME, "bound", "overhead", "memory_limited", "memory_gb_per_gpu",
                    "breakdown.compute", "breakdown.exposed_tp", "breakdown.exposed_dp", "breakdown.exposed_pp",
                    "breakdown.pipeline_bubble", "breakdown.offload"]
    return lines + _table(best, cols)
