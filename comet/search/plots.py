"""PNG plots of a study (matplotlib, Agg backend): Pareto fronts, a TP x PP heatmap of the best step
time, and the step-time breakdown of the top configurations."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from comet.result import BREAKDOWN_KEYS  # noqa: E402
from comet.search.analysis import cluster_tag  # noqa: E402
from comet.search.space import SearchSpace  # noqa: E402


def write_plots(df: pd.DataFrame, front: pd.DataFrame, space: SearchSpace, out: Path) -> list[Path]:
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return []
    paths = [_pareto(ok, front, space, out / "pareto.png"), _heatmap(ok, out / "heatmap_tp_pp.png"),
             _breakdown(front if not front.empty else ok, space, out / "breakdown_top.png")]
    return [p for p in paths if p is not None]


def _pareto(ok: pd.DataFrame, front: pd.DataFrame, space: SearchSpace, path: Path) -> Path:
    cols = [o.column for o in space.objectives]
    if len(cols) == 1:   # one objective: show it against the GPU count
        cols = [cols[0], "gpus"] if cols[0] != "gpus" else [cols[0], "step_time_s"]
    pairs = list(itertools.combinations(cols, 2))[:6]
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 4.5), squeeze=False)
    for ax, (x, y) in zip(axes[0], pairs):
        ax.scatter(ok[x], ok[y], s=6, alpha=0.35, color="0.6", label="feasible")
        if not front.empty:
            f = front.sort_values(x)
            ax.scatter(f[x], f[y], s=18, color="C3", label="Pareto set")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        for col, axis in ((x, "x"), (y, "y")):
            vals = ok[col].to_numpy(float)
            vals = vals[np.isfinite(vals) & (vals > 0)]
            if len(vals) and vals.max() / vals.min() > 20:
                getattr(ax, f"set_{axis}scale")("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{space.study}: objectives")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _heatmap(ok: pd.DataFrame, path: Path) -> Path | None:
    if "tp" not in ok or "pp" not in ok:
        return None
    best = ok.groupby(["tp", "pp"])["step_time_s"].min().unstack("pp")
    if best.empty:
        return None
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * best.shape[1], 1.0 + 0.6 * best.shape[0]))
    im = ax.imshow(best.to_numpy(float), cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(best.shape[1]), [str(c) for c in best.columns])
    ax.set_yticks(range(best.shape[0]), [str(i) for i in best.index])
    ax.set_xlabel("pp")
    ax.set_ylabel("tp")
    for (i, j), v in np.ndenumerate(best.to_numpy(float)):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, ax=ax, label="best step time (s)")
    ax.set_title("best step time over all other axes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _breakdown(rows: pd.DataFrame, space: SearchSpace, path: Path, top: int = 10) -> Path:
    first = space.objectives[0]
    rows = rows.sort_values(first.column, ascending=first.direction.value == "min")
    rows = rows.drop_duplicates(subset=[o.column for o in space.objectives]).head(top)
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(rows) + 2.5))
    left = np.zeros(len(rows))
    labels = [f"{cluster_tag(r)}  {r['label']}" + (f" off:{r['offload']}" if r.get("offload", "none") != "none" else "")
              for _, r in rows.iterrows()]
    for i, key in enumerate(BREAKDOWN_KEYS):
        col = f"breakdown.{key}"
        if col not in rows:
            continue
        vals = rows[col].fillna(0).to_numpy(float)
        ax.barh(range(len(rows)), vals, left=left, color=f"C{i}", label=key)
        left += vals
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("step time (s)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.set_title(f"step-time breakdown, top {len(rows)} distinct designs by {first.column}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
