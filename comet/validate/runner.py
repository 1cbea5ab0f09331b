"""Run a validation: rows -> predictions -> summary, and its JSON form."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from comet.errors import ConfigError
from comet.validate.checks import structural_warnings
from comet.validate.predict import ClusterCache, Prediction, predict_all
from comet.validate.rows import Case, load_cases
from comet.validate.summary import summarize, summary_as_dict


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_csv() -> Path:
    """../shared/calibration/measurements.csv next to the repository (schema: SCHEMA.md there)."""
    return (repo_root() / ".." / "shared" / "calibration" / "measurements.csv").resolve()


def find_csv(path: str | None) -> Path:
    p = Path(path) if path else default_csv()
    if not p.is_file():
        raise ConfigError("measurement CSV not found" + ("" if path else " (default ../shared/calibration/"
                                                          "measurements.csv next to the repository)"), source=str(p))
    return p


@dataclass
class Validation:
    csv: Path
    cases: list[Case]
    predictions: list[Prediction]
    summary: dict
    warnings: list[str] = field(default_factory=list)   # structural self-check failures

    def as_json(self) -> dict:
        summary = summary_as_dict(self.summary)
        summary["structural_warnings"] = list(self.warnings)
        return {"csv": str(self.csv), "rows": [p.as_dict() for p in self.predictions], "summary": summary}

    def write_json(self, out: str | Path) -> None:
        Path(out).write_text(json.dumps(self.as_json(), indent=1, default=float) + "\n")


def run_validation(csv: str | Path, specs_dir: str | Path | None = None) -> Validation:
    csv = Path(csv)
    cases = load_cases(csv)
    preds = predict_all(cases, ClusterCache(specs_dir or repo_root() / "cluster_specs"))
    return Validation(csv, cases, preds, summarize(preds), structural_warnings(cases))
