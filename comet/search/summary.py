"""summary.md of a study, for the person who buys the cluster: what to buy and why (each objective's best
design in words, what bounds it), the cost and power assumptions, the candidates (pruned by reason), the
whole Pareto front with equivalent designs merged, the front sorted by each objective, and the answers
to COMET's Transformer-1T case-study questions.

Each section is one function `section(report) -> list[str]` listed in SECTIONS, in order.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

from comet.search import analysis
from comet.search.provisioning import provisioning_section
from comet.search.context import PROVISION_KEYS
from comet.search.front import merge_equivalent, sort_by
from comet.search.naming import cluster_name, parallel_name
from comet.search.results import budget_limits
from comet.search.space import SearchSpace

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
    if "equivalent" in cols and not df["equivalent"].astype(bool).any():
        cols.remove("equivalent")
    lines = ["| " + " | ".join(HEADERS.get(c, c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return lines


def cluster_text(row: pd.Series, cols: list[str]) -> str:
    return ", ".join(f"{c}={_fmt(row[c])}" for c in cols if c in row and not pd.isna(row[c]))


# Column -> header with its unit (tables in summary.md and the CLI)
HEADERS = {"gpus": "GPUs", "design": "cluster", "layout": "parallel layout", "step_time_s": "step (s)",
           "mfu": "MFU", "memory_gb_per_gpu": "GB/GPU", "time_to_train_days": "days to train",
           "cost_per_run_usd": "USD per run", "capex_usd": "capex (USD)", "energy_MWh": "energy (MWh)",
           "equivalent": "same result at", "best_for": "top for", "hbm_GB": "HBM (GB)",
           "expansion_GB": "expansion (GB)", "expansion_bandwidth_GBps": "expansion (GB/s)",
           "scaleup_size": "NVLink domain", "scaleup_bandwidth_GBps": "NVLink (GB/s)",
           "scaleout_bandwidth_GBps": "scale-out (GB/s)", "oversubscription": "oversub.", "compute_scale": "FLOP x"}
METRICS = ["time_to_train_days", "cost_per_run_usd", "capex_usd", "energy_MWh", "step_time_s", "mfu",
           "memory_gb_per_gpu"]
FRONT_ROWS = 60      # the whole merged front up to this many rows; pareto.csv always has every row
VIEW_ROWS = 10       # rows of each per-objective view


@dataclass
class Report:
    """What every section reads. A section is `def section(r: Report) -> list[str]` (markdown lines);
    add one by putting it in SECTIONS."""
    outcome: object
    space: SearchSpace
    ctx: object
    df: pd.DataFrame
    front: pd.DataFrame                   # every Pareto row
    merged: pd.DataFrame                  # equivalent designs merged (front.merge_equivalent)
    ccols: list = field(default_factory=list)   # cluster axes that vary in the study

    @cached_property
    def found(self) -> analysis.Findings:
        """Best design per cluster and axis effects, computed once for every section that reads them."""
        return analysis.Findings(self.df)

    @property
    def ok(self) -> pd.DataFrame:
        return self.df[self.df["status"] == "ok"] if not self.df.empty else self.df

    def named(self, rows: pd.DataFrame) -> pd.DataFrame:
        """rows with `design` (the cluster in words, varying axes only) and `layout` columns."""
        if rows.empty:
            return rows.assign(design=pd.Series(dtype=str), layout=pd.Series(dtype=str))
        cols = [c for c in self.ccols if c != "gpus"]
        return rows.assign(design=[cluster_name(r, cols) for _, r in rows.iterrows()],
                           layout=[parallel_name(r) for _, r in rows.iterrows()])


def write_summary(outcome, space: SearchSpace, ctx, out: Path) -> Path:
    df = outcome.frame
    merged = getattr(outcome, "merged", None)
    report = Report(outcome, space, ctx, df, outcome.front,
                    merged if merged is not None else merge_equivalent(outcome.front, space),
                    analysis.cluster_columns(df) if not df.empty else [])
    lines: list[str] = []
    for section in SECTIONS:
        lines += section(report)
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def header(r: Report) -> list[str]:
    space, ctx, outcome = r.space, r.ctx, r.outcome
    return [f"# Study `{space.study}`", "",
            f"- model: `{ctx.model.name}` ({ctx.model.params / 1e9:,.0f}B parameters); cluster spec: "
            f"`{space.cluster_spec}` ({ctx.cluster.name}, {ctx.cluster.gpu.name}); job: "
            f"{space.job.total_tokens:.3g} tokens, global batch {space.global_batch} x {ctx.model.seq_len} tokens",
            f"- method: {space.method.value}; objectives: "
            + ", ".join(f"{o.metric.value} ({o.direction.value})" for o in space.objectives),
            f"- run: {outcome.wall_s:.1f} s wall{_phases(outcome)} on "
            f"{getattr(outcome, 'where', '') or 'an executor'}, "
            f"{outcome.evaluated_now} candidates evaluated now, {outcome.resumed} taken from an earlier run"
            + (" -- **interrupted**: re-run to resume" if outcome.interrupted else "")
            + (" -- **stopped by the wall-time budget** with candidates left: re-run to continue"
               if outcome.budget_stop else ""), ""]


def _phases(outcome) -> str:
    """' (start-up 1.2 s, evaluation 3.4 s, writing 0.8 s)': where the wall time went (writing: tables,
    plots and timelines, before this file)."""
    phases = getattr(outcome, "phases", None)
    return " (" + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) + ")" if phases else ""


def recommendation(r: Report) -> list[str]:
    """What to buy: each objective's best design in words, what it achieves and what bounds it."""
    if r.merged.empty:
        return []
    lines = ["## What to buy", ""]
    size, hbm = r.ctx.cluster.network[0].size, r.ctx.cluster.gpu.hbm_GB
    bests = {}
    for o in r.space.objectives:
        if o.column not in r.merged:
            continue
        best = sort_by(r.merged, o, r.space.objectives).iloc[0]
        bests[o] = best
        parts = analysis.resource_times(best, size)
        total = sum(parts.values()) or 1.0
        bound = max(parts, key=parts.get)
        over, share = analysis.largest_overhead(best, size)
        lines.append(f"- **Best {o.metric.value.replace('_', ' ')}** ({o.direction.value}): "
                     f"{cluster_name(best)}, running {parallel_name(best)}. "
                     f"{_fmt(best.get('time_to_train_days'))} days to train, {_usd(best.get('cost_per_run_usd'))} "
                     f"per run, capex {_usd(best.get('capex_usd'))}, {_fmt(best.get('energy_MWh'))} MWh; "
                     f"MFU {_pct(best.get('mfu'))}, {_fmt(best.get('memory_gb_per_gpu'))} of "
                     f"{_fmt(best.get('hbm_GB') or hbm)} GB HBM per GPU. Bound by {bound} "
                     f"({parts[bound] / total:.0%} of the step); largest overhead beyond compute: {over} "
                     f"({share:.0%})." + (f" Same result at {best['equivalent']}." if best.get("equivalent") else ""))
    if len(bests) >= 2:
        (o1, b1), (o2, b2) = list(bests.items())[:2]
        if b1["key"] != b2["key"] and o1.column in b2 and o2.column in b1:
            lines.append(f"- **Trade-off**: the best {o2.metric.value.replace('_', ' ')} design is "
                         f"{_ratio(b2[o2.column], b1[o2.column])} on {o2.metric.value.replace('_', ' ')} and "
                         f"{_ratio(b2[o1.column], b1[o1.column])} on {o1.metric.value.replace('_', ' ')} "
                         f"compared with the best {o1.metric.value.replace('_', ' ')} design.")
    return lines + ["", f"{len(r.front)} designs are on the Pareto front of "
                    + ", ".join(o.metric.value for o in r.space.objectives)
                    + f" ({len(r.merged)} after merging designs that differ only in axes with no effect); "
                    "the sections below list them all and sorted by each objective.", ""]


def assumptions(r: Report) -> list[str]:
    """The cost and power figures every USD and MWh number rests on (cluster spec + the space's cost)."""
    c, p, cl = r.ctx.cluster.cost, r.ctx.cluster.power, r.ctx.cluster
    dims = ", ".join(f"{d.name or f'dimension {i}'} {price:g} USD per GB/s per GPU"
                     for i, (d, price) in enumerate(zip(cl.network, c.network_usd_per_GBps)))
    gpu_W = p.gpu_W if p.gpu_W is not None else cl.gpu.power_W
    return ["## Cost and power assumptions", "",
            f"- capex = GPUs x {c.gpu_usd:,.0f} USD + chassis ({cl.gpus_per_node} GPUs each) x {c.node_usd:,.0f} "
            f"USD + network per GPU ({dims or 'not priced'}; scale-up charged only beyond one chassis; divided "
            f"by the oversubscription) + HBM x {c.hbm_usd_per_GB:g} USD/GB + expansion memory x "
            f"{c.expansion_usd_per_GB:g} USD/GB",
            f"- cost per run = capex amortized over {c.amortization_years:g} years x time to train + energy x "
            f"{c.electricity_usd_per_kWh:g} USD/kWh; no staff, facility, storage or failed-run overheads",
            *power_model(r, gpu_W),
            "- prices are the cluster spec's (`cluster.cost` in the space overrides them); they are list-price "
            "orders of magnitude: put your own quotes there before buying", ""]


def power_model(r: Report, gpu_W: float) -> list[str]:
    """How power, energy, tokens per joule and a power cap are computed (comet/cost.py)."""
    c, p = r.ctx.cluster.cost, r.ctx.cluster.power
    if p.gpu_idle_W is None:
        draw = f"GPUs x {gpu_W:g} W (full load for the whole run: the spec gives no idle draw)"
    else:
        draw = (f"GPUs x GPU draw from the step's utilisation ({gpu_W:g} W while computing, "
                f"{p.gpu_idle_W:g} + {p.comm_activity:g} x ({gpu_W:g} - {p.gpu_idle_W:g}) W while only "
                f"communication or offload runs, {p.gpu_idle_W:g} W idle in pipeline bubbles)")
    lines = [f"- power (IT) = {draw} + chassis x {p.node_overhead_W:g} W + GPUs x {p.network_W_per_gpu:g} W "
             f"network + expansion x {p.expansion_W_per_GB:g} W/GB; energy = power x time x PUE {c.pue:g}; "
             f"tokens per joule = tokens/s / (power x PUE)"]
    cap = r.space.constraints.max_power_kW
    if cap is not None:
        lines.append(f"- power cap: average IT power at the candidate's utilisation <= {cap:,.1f} kW (critical IT "
                     f"load, as data-centre capacity is quoted; the facility draws x PUE {c.pue:g} = "
                     f"{cap * c.pue:,.1f} kW); while every GPU computes the draw peaks above the average, up to "
                     f"{gpu_W:g} W per GPU, which the power distribution must carry")
    return lines


def candidates(r: Report) -> list[str]:
    return _counts(r.df, r.outcome.stats) + over_budget(r) + (["", "No feasible candidate: see the reasons above.",
                                                               ""] if r.ok.empty else [])


def over_budget(r: Report) -> list[str]:
    """Designs that ran but break a budget the replay decides (power at their utilisation, cost, time)."""
    ok = r.df[r.df["status"] == "ok"] if not r.df.empty else r.df
    lines = []
    for limit, col in budget_limits(r.space):
        if col in ok and (n := int((ok[col] > limit).sum())):
            nearest = ok.loc[ok[col] > limit, col].min()
            lines.append(f"- {n} ok designs exceed the constraint on {col} (max {limit:,.6g}; the nearest of them "
                         f"is at {nearest:,.6g}); they are kept off the Pareto set")
    return lines + [""] if lines else []


def pareto_front(r: Report) -> list[str]:
    if r.merged.empty:
        return []
    first = r.space.objectives[0]
    rows = sort_by(r.merged, first, r.space.objectives)
    shown = rows.head(FRONT_ROWS)
    more = f"; first {FRONT_ROWS}, every row is in pareto.csv" if len(rows) > FRONT_ROWS else ""
    lines = [f"## Pareto front ({len(r.merged)} designs, by {first.metric.value}{more})", ""]
    return lines + _table(r.named(shown), _front_cols(r)) + [""]


def per_objective(r: Report) -> list[str]:
    """The front sorted by each further objective (the first is the order of the section above)."""
    lines = []
    for o in r.space.objectives[1:]:
        if r.merged.empty or o.column not in r.merged:
            continue
        rows = sort_by(r.merged, o, r.space.objectives).head(VIEW_ROWS)
        lines += [f"## Front by {o.metric.value} ({o.direction.value}; best {len(rows)})", ""]
        lines += _table(r.named(rows), _front_cols(r, first=o.column)) + [""]
    return lines


def case_study(r: Report) -> list[str]:
    return _case_study(r.df, r.ctx, r.found) if not r.ok.empty else []


def error_band(r: Report) -> list[str]:
    return _error_band_note(r.ok)


def provisioning(r: Report) -> list[str]:
    """comet/search/provisioning.py: spread across designs at fixed GPU count, expansion gain, COMET comparison."""
    return provisioning_section(r.df, r.front, r.ctx, r.found) if not r.ok.empty else []


def files(r: Report) -> list[str]:
    return ["", "## Files", "", "candidates.parquet / candidates.csv.gz (every evaluated candidate, with its model, job "
            "and complete cluster), pareto.csv (every Pareto row, unmerged), study.yaml, journal.jsonl.gz (the "
            "raw results, for resuming), *.png, "
            "timelines/*.json.gz (task-level Chrome traces: open in https://ui.perfetto.dev)"
            + (", optuna.db (`optuna-dashboard sqlite:///optuna.db`)" if r.space.method.uses_optuna else "")]


def _front_cols(r: Report, first: str | None = None) -> list[str]:
    objs = [o.column for o in r.space.objectives]
    if first:
        objs = [first] + [c for c in objs if c != first]
    rest = [c for c in METRICS if c not in objs]
    return ["design", "layout"] + objs + rest + ["equivalent"]


SECTIONS: list[Callable[[Report], list[str]]] = [header, recommendation, assumptions, candidates, pareto_front,
                                                 error_band, per_objective, case_study, provisioning, files]


def _usd(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.0f} USD"


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _ratio(a, b) -> str:
    if not b or (isinstance(a, float) and math.isnan(a)):
        return "-"
    x = a / b
    return f"{x:.2f}x" if x >= 1 else f"{x:.2f}x ({1 - x:.0%} less)"


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


def _case_study(df: pd.DataFrame, ctx, found: analysis.Findings) -> list[str]:
    lines = ["## Case-study questions", ""]
    if analysis.TIME not in df:
        return lines + ["(no time-to-train column)"]
    ccols = found.cols
    sp = analysis.spread(df, found.best)
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
        lines.append("")
    effects = [e for e in (found.effect(a) for a in ("gpus",) + PROVISION_KEYS) if e]
    if effects:
        lines += ["**Effect of each provisioning axis** (best time at the lowest value / best at a higher value, "
                  "other axes equal):", "", "| axis | lowest | groups | median speed-up | max speed-up | "
                  "groups feasible only above lowest |", "|---|---|---|---|---|---|"]
        for e in effects:
            lines.append(f"| {e['axis']} | {_fmt(e['low'])} | {e['groups']} | {_fmt(e['median'])}x | "
                         f"{_fmt(e['max'])}x | {e['only_feasible_above_low']} |")
        lines.append("")
    lines += _bounds(found.best, ctx, ccols)
    return lines


def _bounds(best_per_cluster: pd.DataFrame, ctx, ccols: list[str]) -> list[str]:
    best = best_per_cluster.head(TOP)
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
