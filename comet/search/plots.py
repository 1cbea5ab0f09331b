"""PNG plots of a study (matplotlib, Agg backend): Pareto fronts, a TP x PP heatmap of the best step
time, and the step-time breakdown of the top configurations."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
# perf: a Figure on an Agg canvas, not pyplot: no backend selection, no global figure registry (~0.1 s of
# imports), and nothing to close
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from comet.result import BREAKDOWN_KEYS
from comet.search.analysis import cluster_columns
from comet.search.naming import cluster_name, parallel_name
from comet.search.space import SearchSpace


# Axis labels with units, and the breakdown components in words
LABELS = {"time_to_train_days": "time to train (days)", "cost_per_run_usd": "cost per run (USD)",
          "capex_usd": "capex (USD)", "energy_MWh": "energy per run (MWh)", "step_time_s": "step time (s)",
          "mfu": "MFU (model FLOPs / peak)", "gpus": "GPUs"}
PARTS = {"compute": "compute", "exposed_tp": "exposed TP comm", "exposed_cp": "exposed CP comm",
         "exposed_dp": "exposed DP comm", "exposed_pp": "exposed PP send", "pipeline_bubble": "pipeline bubble",
         "optimizer": "optimizer step", "offload": "offload traffic"}
# perf: zlib level 1 instead of Pillow's 6: the same pixels, ~3% larger files, ~70 ms less per plot
_PNG = {"compress_level": 1}


def _figure(**kwargs) -> Figure:
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    """Lay out once (tight_layout fits the labels), then draw once: tight_layout leaves a placeholder
    layout engine behind, for which savefig draws the whole figure a second time (matplotlib 3.6+);
    bbox_inches="tight" would draw twice too."""
    fig.tight_layout()
    fig.set_layout_engine(None)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, pil_kwargs=_PNG)
    return buf.getvalue()


PLOTS = ("pareto.png", "heatmap_tp_pp.png", "breakdown_top.png")


def write_plots(df: pd.DataFrame, front: pd.DataFrame, space: SearchSpace, out: Path) -> list[Path]:
    paths = []
    for name, png in render_plots(df, front, space):
        paths.append(out / name)
        paths[-1].write_bytes(png)
    return paths


def render_plots(df: pd.DataFrame, front: pd.DataFrame, space: SearchSpace,
                 names: tuple[str, ...] = PLOTS) -> list[tuple[str, bytes]]:
    """(file name, PNG bytes) of the plots `names`: drawn where the study's executor can spare a worker
    (Ray tasks while the driver writes the tables), written by the driver."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return []
    draw = {"pareto.png": lambda: _pareto(ok, front, space), "heatmap_tp_pp.png": lambda: _heatmap(ok),
            "breakdown_top.png": lambda: _breakdown(front if not front.empty else ok, df, space)}
    pngs = [(name, draw[name]()) for name in names]
    return [(name, png) for name, png in pngs if png is not None]


def _human(v: float, _pos=None) -> str:
    """Tick label without offsets or powers of ten: 1.2M, 350k, 12.5, 0.45."""
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def _axis(ax, which: str, values: np.ndarray, label: str) -> None:
    vals = values[np.isfinite(values) & (values > 0)]
    if len(vals) and vals.max() / vals.min() > 20:
        getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(FuncFormatter(_human))
    axis.set_minor_formatter(FuncFormatter(lambda v, p: ""))
    getattr(ax, f"set_{which}label")(label)


def _pareto(ok: pd.DataFrame, front: pd.DataFrame, space: SearchSpace) -> bytes:
    cols = [o.column for o in space.objectives]
    if len(cols) == 1:   # one objective: show it against the GPU count
        cols = [cols[0], "gpus"] if cols[0] != "gpus" else [cols[0], "step_time_s"]
    pairs = list(itertools.combinations(cols, 2))[:6]
    fig = _figure(figsize=(5.5 * len(pairs), 4.8))
    axes = fig.subplots(1, len(pairs), squeeze=False)
    gpus = sorted(ok["gpus"].dropna().unique()) if "gpus" in ok else []
    for ax, (x, y) in zip(axes[0], pairs):
        if 1 < len(gpus) <= 8:   # colour by GPU count: the first thing a buyer compares
            for i, g in enumerate(gpus):
                sub = ok[ok["gpus"] == g]
                ax.scatter(sub[x], sub[y], s=8, alpha=0.45, color=f"C{i}",
                           label=f"{int(g)} GPUs")
        else:
            ax.scatter(ok[x], ok[y], s=8, alpha=0.4, color="0.6", label="feasible designs")
        if not front.empty:
            f = front.sort_values(x)
            ax.scatter(f[x], f[y], s=40, facecolors="none", edgecolors="k", linewidths=1.5,
                       label="Pareto front (all objectives)")
        _axis(ax, "x", ok[x].to_numpy(float), LABELS.get(x, x))
        _axis(ax, "y", ok[y].to_numpy(float), LABELS.get(y, y))
        ax.grid(alpha=0.3, which="both")
    # one legend: the panels share their colours (~0.1 s less than a legend placed "best" in each)
    axes[0][0].legend(fontsize=8, loc="best")
    fig.suptitle(f"{space.study}: every feasible design; lower-left is better")
    return _png(fig)


def _heatmap(ok: pd.DataFrame) -> bytes | None:
    if "tp" not in ok or "pp" not in ok:
        return None
    best = ok.groupby(["tp", "pp"])["step_time_s"].min().unstack("pp")
    if best.empty:
        return None
    fig = _figure(figsize=(2.5 + 0.9 * best.shape[1], 1.8 + 0.6 * best.shape[0]))
    ax = fig.subplots()
    im = ax.imshow(best.to_numpy(float), cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(best.shape[1]), [str(c) for c in best.columns])
    ax.set_yticks(range(best.shape[0]), [str(i) for i in best.index])
    ax.set_xlabel("pipeline stages (pp)")
    ax.set_ylabel("tensor parallel size (tp)")
    lo, hi = np.nanmin(best.to_numpy(float)), np.nanmax(best.to_numpy(float))
    for (i, j), v in np.ndenumerate(best.to_numpy(float)):
        if np.isfinite(v):   # 3 significant digits; dark text on the light (fast) cells
            light = hi > lo and (v - lo) / (hi - lo) < 0.5
            ax.text(j, i, f"{v:#.3g}", ha="center", va="center", fontsize=8, color="k" if light else "w")
    fig.colorbar(im, ax=ax, label="best step time (s)")
    ax.set_title("best step time (s) at each tp x pp,\nover every other axis (blank: none feasible)", fontsize=10)
    return _png(fig)


def _breakdown(rows: pd.DataFrame, df: pd.DataFrame, space: SearchSpace, top: int = 10) -> bytes:
    first = space.objectives[0]
    rows = rows.sort_values(first.column, ascending=first.direction.value == "min")
    rows = rows.drop_duplicates(subset=[o.column for o in space.objectives]).head(top)
    varying = [c for c in cluster_columns(df) if c != "gpus"]
    labels = [f"{cluster_name(r, varying)}\n{parallel_name(r)}" for _, r in rows.iterrows()]
    fig = _figure(figsize=(12, 0.75 * len(rows) + 2.2))
    ax = fig.subplots()
    left = np.zeros(len(rows))
    for i, key in enumerate(BREAKDOWN_KEYS):
        col = f"breakdown.{key}"
        if col not in rows:
            continue
        vals = rows[col].fillna(0).to_numpy(float)
        if not vals.any():
            continue   # a component that is zero everywhere only clutters the legend
        ax.barh(range(len(rows)), vals, left=left, color=f"C{i}", label=PARTS.get(key, key))
        left += vals
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("step time (s), critical pipeline stage")
    ax.xaxis.set_major_formatter(FuncFormatter(_human))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="component")
    ax.set_title(f"where the step time goes: the {len(rows)} best distinct designs by "
                 f"{LABELS.get(first.column, first.column)}")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
