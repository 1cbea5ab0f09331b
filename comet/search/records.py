"""A finished candidate as the journal and the table hold it: its journal record (one JSON line) and its
table row, made where the candidate was evaluated (`finish`: in a Ray worker, so the driver only writes
lines and keeps rows). No pandas here: workers import this module before any table exists.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np

from comet.result import BREAKDOWN_KEYS, Result
from comet.search.context import Candidate, parallel_dict

PARALLEL_COLUMNS = ("tp", "pp", "dp", "cp", "vpp", "ep", "etp", "sequence_parallel", "schedule", "micro_batch",
                    "recompute", "zero", "precision", "offload",
                    "moe_dispatcher", "moe_capacity_factor", "moe_imbalance", "moe_overlap_a2a")
METRIC_COLUMNS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hw_tflops_per_gpu", "memory_gb_per_gpu")


class Finished(NamedTuple):
    """One evaluated candidate, ready for the journal (`line`, with its newline) and the table (`row`)."""
    key: str
    line: str
    row: dict

    def record(self) -> dict:
        """The journal record, parsed back from the line (as a resumed study reads it)."""
        return json.loads(self.line)


def finish(cand: Candidate, result: Result, attempts: int, fingerprint: str) -> Finished:
    """perf: the record's JSON and its table row are ~0.1 ms of Python per candidate; made by the worker
    that evaluated it, the Ray driver's share of a candidate is writing a line and keeping a row."""
    rec = make_record(cand, result, attempts)
    rec["fp"] = fingerprint
    return Finished(cand.key, json.dumps(rec, default=_json_default, allow_nan=True) + "\n", flatten(rec))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "value"):
        return obj.value
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    return str(obj)


def make_record(cand: Candidate, result: Result, attempts: int = 1) -> dict:
    """The journal line of one evaluated candidate (no timeline: those are written separately)."""
    return {"key": cand.key, "number": cand.number, "params": dict(cand.params),
            "provision": cand.provision_dict, "parallel": parallel_dict(cand.parallel),
            "result": result.to_dict(timeline=False), "attempts": attempts}


def flatten(record: dict) -> dict:
    """One table row: provisioning, parallel config, status, metrics, breakdown, memory, cost."""
    res = record["result"]
    row: dict[str, Any] = {"key": record["key"], "number": record["number"], "label": res.get("label", ""),
                           "status": res["status"], "reason": res.get("reason", ""),
                           "gpus": res.get("gpus") or record["parallel"].get("gpus"),
                           "attempts": record.get("attempts", 1)}
    row.update(record["provision"])
    row.update({k: record["parallel"].get(k) for k in PARALLEL_COLUMNS})
    row.update({k: _num(res.get(k)) for k in METRIC_COLUMNS})
    breakdown = res.get("breakdown", {})
    for k, col in _BREAKDOWN_COLUMNS.items():
        row[col] = _num(breakdown.get(k))
    for k, v in res.get("memory", {}).items():
        row[_column("memory.", k)] = _num(v)
    for k, v in res.get("extra", {}).items():
        row[k] = _num(v) if isinstance(v, (int, float)) or v is None else v
    return row


# perf: one string object per column name, so a chunk of rows pickled by a Ray worker names each
# column once (pickle's memo is by identity): 3.7 KB a candidate with new strings per row
_BREAKDOWN_COLUMNS = {k: f"breakdown.{k}" for k in BREAKDOWN_KEYS}
_columns: dict[tuple[str, str], str] = {}


def _column(prefix: str, key: str) -> str:
    col = _columns.get((prefix, key))
    if col is None:
        col = _columns[(prefix, key)] = prefix + key
    return col


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


