"""The provisioning section of a study summary: how much the cluster design matters at a fixed GPU
count, what memory expansion buys, both next to COMET's figures (Kundu et al., "Towards a holistic
cluster design methodology for distributed training": up to 7.7x between cluster designs, up to 1.4x
from memory expansion), with the reasons for any difference drawn from the study's own rows, and
which resource bounds each Pareto design."""

from __future__ import annotations

import pandas as pd

from comet.search import analysis

COMET_DESIGN_SPREAD = 7.7      # Kundu et al., Transformer-1T case study
COMET_EXPANSION_GAIN = 1.4


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def spread_at_fixed_gpus(df: pd.DataFrame, best: pd.DataFrame | None = None) -> list[dict]:
    """Per GPU count: the best time of the slowest and of the fastest cluster design (each with its best
    parallel configuration), and over every feasible candidate (`best`: best_per_cluster(df) if known)."""
    best = analysis.best_per_cluster(df) if best is None else best
    ok = analysis.feasible(df)
    out = []
    if best.empty or "gpus" not in best:
        return out
    for gpus, g in best.groupby("gpus"):
        all_g = ok[ok["gpus"] == gpus]
        out.append({"gpus": int(gpus), "designs": len(g), "best": g.iloc[g[analysis.TIME].argmin()],
                    "worst": g.iloc[g[analysis.TIME].argmax()],
                    "ratio": g[analysis.TIME].max() / g[analysis.TIME].min(),
                    "any_ratio": all_g[analysis.TIME].max() / all_g[analysis.TIME].min()})
    return out


def _axis_reasons(found: analysis.Findings) -> list[str]:
    effects = [found.effect(a) for a in found.cols if a != "gpus"]
    effects = [e for e in effects if e and e["groups"]]
    effects.sort(key=lambda e: -e["max"])
    return [f"{e['axis']} (from {e['low']:g}: up to {_fmt(e['max'])}x, median {_fmt(e['median'])}x)"
            for e in effects]


def _expansion_reason(best: pd.DataFrame, hbm_GB: float) -> str:
    if best.empty:
        return ""
    limited = sum(analysis.memory_limited(r, hbm_GB) for _, r in best.iterrows())
    offloading = int((best.get("offload", pd.Series(dtype=str)).fillna("none") != "none").sum())
    return (f"{limited} of the {len(best)} best-per-design candidates are limited by HBM capacity and "
            f"{offloading} of them offload to the expansion tier: expansion pays only where HBM capacity "
            "forces full recompute or a smaller micro-batch, and the offload traffic itself costs expansion "
            "bandwidth (it is exposed when the link is slower than the Adam step it overlaps)")


def provisioning_section(df: pd.DataFrame, front: pd.DataFrame, ctx,
                         found: analysis.Findings | None = None) -> list[str]:
    """`found`: the summary's Findings of df (shared with its other sections), or computed here."""
    ok = analysis.feasible(df)
    if ok.empty or analysis.TIME not in ok:
        return []
    found = found or analysis.Findings(df)
    design_cols = [c for c in found.cols if c != "gpus"]
    lines = ["## Provisioning (next to COMET)", ""]
    spreads = spread_at_fixed_gpus(df, found.best)
    multi = [s for s in spreads if s["designs"] > 1]
    if multi:
        cols = design_cols
        top = max(multi, key=lambda s: s["ratio"])
        lines.append(
            "**Spread across cluster designs at a fixed GPU count** (each design at its best parallel "
            "configuration): " + ", ".join(f"{_fmt(s['ratio'])}x over {s['designs']} designs at {s['gpus']} GPUs"
                                           for s in multi)
            + f"; COMET reports up to {COMET_DESIGN_SPREAD}x. Largest at {top['gpus']} GPUs: "
            f"{_row_text(top['best'], cols)} ({top['best'][analysis.TIME]:.1f} days) vs "
            f"{_row_text(top['worst'], cols)} ({top['worst'][analysis.TIME]:.1f} days). Over every feasible "
            "candidate (any parallel configuration) the spread is "
            + ", ".join(f"{_fmt(s['any_ratio'])}x at {s['gpus']} GPUs" for s in multi) + ".")
        reasons = _axis_reasons(found)
        lines += ["", "Why the spread differs from COMET's: each design here is compared at the best parallel "
                  "configuration the search finds for it, which absorbs part of a weaker design's handicap "
                  "(the spread over every candidate, above, is wider); what remains comes from the axes, in "
                  "order of effect: " + ("; ".join(reasons) if reasons else "no design axis varies")
                  + ". The spread is set by how far apart the weakest and strongest design are on these axes: "
                  "an axis the study does not sweep contributes nothing, and a wider range widens it.", ""]
    gain = analysis.expansion_gain(df)
    if gain:
        lines.append(f"**Memory expansion gain**: up to **{_fmt(gain['max'])}x** (median {_fmt(gain['median'])}x "
                     f"over {gain['groups']} designs, other axes equal); COMET reports up to "
                     f"{COMET_EXPANSION_GAIN}x. Why: {_expansion_reason(found.best, ctx.cluster.gpu.hbm_GB)}"
                     + (f"; {gain['only_feasible_above_low']} designs are feasible only with expansion."
                        if gain["only_feasible_above_low"] else "."))
        lines.append("")
    elif "expansion_GB" in df:
        lines += ["**Memory expansion gain**: not measured (the study does not vary expansion capacity).", ""]
    if not front.empty:
        size = ctx.cluster.network[0].size
        rows = [r for _, r in front.head(20).iterrows()]
        bounds = [analysis.bound_of(r, size) for r in rows]
        lines += ["**What bounds each Pareto design** (largest share of step time; exposed communication on the "
                  "scale-up or scale-out tier by the GPUs each group spans):", "",
                  "| design | parallel | days | bound by | largest overhead |", "|---|---|---|---|---|"]
        cols = design_cols + ["gpus"]
        for r, b in zip(rows, bounds):
            name, share = analysis.largest_overhead(r, size)
            lines.append(f"| {_row_text(r, cols)} | {r.get('label', '')} | {r[analysis.TIME]:.1f} | {b} | "
                         f"{name} {share:.0%} |")
        lines.append("")
    return lines


def _row_text(row: pd.Series, cols: list[str]) -> str:
    return ", ".join(f"{c}={row[c]:g}" if isinstance(row[c], (int, float)) else f"{c}={row[c]}"
                     for c in cols if c in row and not pd.isna(row[c])) or "base design"
