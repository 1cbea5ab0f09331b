"""docs/validation.png: the signed error of every predicted row, by source (held-out rows hollow)."""

from __future__ import annotations

from pathlib import Path

from comet.validate.runner import Validation

TARGET_PCT = 8.0   # the overall MAPE target (project issue 3)


def plot_errors(val: Validation, path: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = sorted({p.case.source_label for p in val.predictions if p.status == "ok"})
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(sources)))
    ax.axvspan(-TARGET_PCT, TARGET_PCT, color="0.92", zorder=0, label=f"±{TARGET_PCT:g}%")
    ax.axvline(0, color="0.5", lw=0.8)
    for y, src in enumerate(sources):
        rows = [p for p in val.predictions if p.status == "ok" and p.case.source_label == src]
        for held in (False, True):
            xs = [p.error_pct for p in rows if p.case.held_out == held]
            ax.scatter(xs, [y + (0.12 if held else -0.12)] * len(xs), s=28, zorder=2,
                       facecolors="none" if held else f"C{y}", edgecolors=f"C{y}",
                       label="held out (hollow)" if held and y == 0 else None)
    ax.set_yticks(range(len(sources)), sources)
    ax.set_xlabel("prediction error, (predicted - measured) / measured [%]")
    ax.set_title("comet validate: every published row")
    ax.grid(axis="x", alpha=0.4)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
