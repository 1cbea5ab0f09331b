"""`comet validate collectives.csv | gemm.csv | attention.csv | memory.csv`: the kernel- and NCCL-level
report (comet/validate/kernels.py): predicted vs measured per row, then MAPE per collective / kernel,
per scale and per source."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from comet.validate.kernels import short_source, stats, summary, validate_kernels


def _us(s: float) -> str:
    return "-" if math.isnan(s) else f"{s * 1e6:,.1f}"


def run_kernels(csv: Path, specs: Path, console: Console, quiet: bool, json_out: str | None) -> int:
    kind, rows = validate_kernels(csv, specs)
    if not quiet:
        t = Table(title=f"comet validate ({kind}): {csv.name}")
        for col in ("#", "source", "kind", "scale", "measured us", "predicted us", "error", "model"):
            t.add_column(col, justify="right" if col in ("#", "measured us", "predicted us", "error") else "left")
        for r in rows:
            err = f"{r.error_pct:+.1f}%" if not r.skip else "[dim]skipped[/dim]"
            t.add_row(str(r.index), short_source(r.source), r.kind, r.scale, _us(r.measured_s), _us(r.predicted_s),
                      err, r.detail or r.skip)
        console.print(t)
    t = Table(title="error summary (MAPE = mean |predicted - measured| / measured)")
    for col in ("group", "n", "MAPE", "max |error|", "bias"):
        t.add_column(col, justify="left" if col == "group" else "right")
    groups = summary(rows)
    for name, by in groups.items():
        t.add_section()
        for key, s in by.items():
            if s.n:
                t.add_row(f"{name}: {key}" if name != "overall" else key, str(s.n), f"{s.mape:.1f}%",
                          f"{s.max_abs:.1f}%", f"{s.bias:+.1f}%", style="bold" if name == "overall" else None)
    console.print(t)
    skipped = [r for r in rows if r.skip]
    for reason in sorted({r.skip for r in skipped}):
        console.print(f"skipped ({sum(r.skip == reason for r in skipped)} rows): {reason}", soft_wrap=True)
    s = stats(rows)
    console.print(f"{s.n} of {len(rows)} rows predicted ({100 * s.n / max(1, len(rows)):.0f}%), "
                  f"MAPE {s.mape:.1f}%, bias {s.bias:+.1f}%")
    if json_out:
        Path(json_out).write_text(json.dumps({"csv": str(csv), "kind": kind, "rows": [r.as_dict() for r in rows],
                                              "mape_pct": s.mape, "predicted": s.n}, indent=1, default=float) + "\n")
        console.print(f"JSON written to {json_out}")
    return 0
