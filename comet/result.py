"""What an evaluation returns: metrics, breakdown, memory and status. Plain data, picklable."""

from __future__ import annotations

import copy
import enum
import json
import math
from dataclasses import dataclass, field, fields


class CandidateStatus(str, enum.Enum):
    OK = "ok"
    INFEASIBLE = "infeasible"   # breaks a rule or does not fit memory: a result with a reason
    ERROR = "error"             # the evaluation itself failed (recorded, the study goes on)


# Breakdown keys; the values of one result add up to step_time_s.
BREAKDOWN_KEYS = ("compute", "exposed_tp", "exposed_cp", "exposed_ep", "exposed_dp", "exposed_pp",
                  "pipeline_bubble", "optimizer", "offload")


@dataclass
class Result:
    status: CandidateStatus
    reason: str = ""
    label: str = ""
    step_time_s: float = float("nan")
    tokens_per_s: float = float("nan")
    tflops_per_gpu: float = float("nan")      # model FLOPs (Megatron accounting, no recompute term)
    mfu: float = float("nan")
    hw_tflops_per_gpu: float = float("nan")   # FLOPs executed, recompute included
    memory_gb_per_gpu: float = float("nan")
    memory: dict[str, float] = field(default_factory=dict)      # GB per component
    breakdown: dict[str, float] = field(default_factory=dict)   # seconds per BREAKDOWN_KEYS
    gpus: int = 0
    extra: dict = field(default_factory=dict)                   # cost, energy, time-to-train (search)
    timeline: list | None = None                                # Chrome-trace events when asked for

    @property
    def feasible(self) -> bool:
        return self.status is CandidateStatus.OK

    def to_dict(self, timeline: bool = False) -> dict:
        """JSON-ready: NaN metrics of an infeasible result become None (null)."""
        # perf: asdict() deep-copies the timeline (millions of events); the other fields are scalars and
        # flat dicts of numbers, copied one level (extra deep-copied only when it nests containers)
        d = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and math.isnan(v):
                v = None
            elif isinstance(v, dict):
                v = copy.deepcopy(v) if any(isinstance(x, (dict, list, tuple, set)) for x in v.values()) else dict(v)
            elif isinstance(v, list) and f.name == "timeline":
                v = copy.deepcopy(v) if timeline else None
            d[f.name] = v
        d["status"] = self.status.value
        d["feasible"] = self.feasible
        if not timeline:
            d.pop("timeline")
        return d

    def flat(self) -> dict:
        """One flat row: status, metrics, `breakdown.<key>`, `memory.<key>`, then the extras
        (non-scalar extras, e.g. remedies, as text), the shape of a candidates.csv row."""
        d = self.to_dict()
        row = {k: v for k, v in d.items() if k not in ("breakdown", "memory", "extra")}
        row.update({f"breakdown.{k}": d["breakdown"].get(k) for k in BREAKDOWN_KEYS})
        row.update({f"memory.{k}": v for k, v in d["memory"].items()})
        for k, v in d["extra"].items():
            row[k] = v if v is None or isinstance(v, (int, float, str, bool)) else json.dumps(v, default=str)
        return row

    def to_frame(self):
        """The flat row as a one-row pandas DataFrame (concatenate several with pandas.concat)."""
        import pandas as pd
        return pd.DataFrame([self.flat()])
