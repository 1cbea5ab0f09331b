"""Expected error band of a prediction, from the validation residuals by regime.

`comet validate --docs` (and --fit) writes the time-metric MAPE per regime (precision, scale, model
size, framework) of the last validation into comet/validate/error_bands.json. `error_band()` looks up
the regimes a new prediction falls into and returns the largest of their MAPEs (the regime the model
is least sure of decides), with the rows it rests on. Regimes with fewer than MIN_ROWS rows fall back
to the overall figure: a band from a handful of rows is not calibrated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BANDS_FILE = Path(__file__).with_name("error_bands.json")
MIN_ROWS = 8
REGIMES = ("by_precision", "by_scale", "by_model_size", "by_framework")


@dataclass(frozen=True)
class ErrorBand:
    pct: float          # expected |error| of a time metric, percent (MAPE of the matching regimes)
    basis: str          # which regime set it and on how many rows

    def __str__(self) -> str:
        return f"±{self.pct:.1f}% ({self.basis})"


def write_bands(summary: dict, csv_name: str, path: Path = BANDS_FILE) -> Path:
    """Keep the regime MAPEs of a validation summary (summary_as_dict form)."""
    doc = {"csv": csv_name, "overall": summary["time_metrics"]}
    for key in REGIMES:
        doc[key] = summary.get(key, {})
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def _regime_keys(precision: str | None, gpus: int, params: float | None, framework: str | None) -> dict[str, str]:
    keys = {"by_scale": "<=64 GPUs" if gpus <= 64 else ("65-1024 GPUs" if gpus <= 1024 else ">1024 GPUs")}
    if precision:
        keys["by_precision"] = precision
    if params:
        b = params / 1e9
        keys["by_model_size"] = "<20B" if b < 20 else ("20-100B" if b < 100 else ">=100B")
    if framework:
        keys["by_framework"] = framework
    return keys


def error_band(precision: str | None, gpus: int, params: float | None = None, framework: str | None = None,
               path: Path = BANDS_FILE) -> ErrorBand | None:
    """The expected error band for a prediction in these regimes; None when no validation has been run."""
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    overall = doc.get("overall") or {}
    best = ErrorBand(float(overall.get("mape_pct") or 0.0), f"overall, n={overall.get('n', 0)}")
    for regime, key in _regime_keys(precision, gpus, params, framework).items():
        s = doc.get(regime, {}).get(key)
        if s and s.get("n", 0) >= MIN_ROWS and s.get("mape_pct") is not None and s["mape_pct"] > best.pct:
            best = ErrorBand(float(s["mape_pct"]), f"{regime[3:].replace('_', ' ')} {key}, n={s['n']}")
    return best


def band_for(model, par, framework: str | None = None) -> ErrorBand | None:
    """error_band() of a resolved (model, ParallelConfig)."""
    return error_band(par.precision.value, par.gpus, model.params, framework)
