"""Published measurements (calibration/published.csv) to comet cases: a ModelSpec, a resolved-ready
ParallelConfig, the cluster spec to run on, the metric and the measured value. What a row leaves
implicit comes from its source's profile (comet.validate.sources); a row that cannot be modelled
becomes a case with a skip reason."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Precision, Recompute, Schedule
from comet.errors import CometError, ConfigError
from comet.validate.moe_rows import apply_expert_parallel, apply_moe
from comet.validate.sources import SourceProfile, profile_for

REQUIRED_COLUMNS = ("source", "model", "layers", "hidden", "heads", "ffn_hidden", "seq_len", "vocab", "gpu",
                    "num_gpus", "tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch", "recompute",
                    "precision", "metric", "value")
METRICS = ("iteration_time_s", "tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "layer_fwd_bwd_time_ms")

# GPU name fragment (upper case) -> cluster spec file under cluster_specs/
CLUSTER_FOR_GPU = {"H100": "h100_dgx.yaml", "A100": "a100_dgx.yaml"}


@dataclass
class Case:
    index: int                      # 0-based row number in the CSV (header excluded)
    row: dict
    profile: SourceProfile
    metric: str
    value: float
    model: ModelSpec | None = None
    parallel: ParallelConfig | None = None
    cluster_file: str = ""
    held_out: bool = False
    skip_reason: str = ""
    assumptions: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.row.get("source", "")


def read_csv(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("file not found", source=str(path))
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"missing columns: {', '.join(missing)}", source=str(path))
        return [{k: (v or "").strip() for k, v in r.items() if k is not None} for r in reader]


def _int(row: dict, key: str) -> int | None:
    text = row.get(key, "")
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"must be a number, got {text!r}", field=key) from None
    if value != int(value) or value <= 0:
        raise ConfigError(f"must be a positive integer, got {text!r}", field=key)
    return int(value)


def parse_recompute(text: str, default: str) -> tuple[Recompute, bool | None, str]:
    """'selective + sequence parallelism' -> (SELECTIVE, True, note). The second value is the sequence
    parallelism the text states (None when it says nothing)."""
    t = text.lower()
    if "full" in t:
        mode = Recompute.FULL
    elif "selective" in t:
        mode = Recompute.SELECTIVE
    elif "none" in t or t == "":
        mode = Recompute(default) if t == "" else Recompute.NONE
    else:
        raise ConfigError(f"unknown recompute mode {text!r} (expected none / selective / full, optionally "
                          "'+ SP' or '(no SP)')", field="recompute")
    sp = None
    if "no sp" in t or "no sequence parallel" in t:
        sp = False
    elif "sequence parallel" in t or "+ sp" in t:
        sp = True
    note = ""
    if "microbatch-level" in t:
        note = "micro-batch-level recompute (Korthikanti App. C) is modelled as plain selective recompute"
    return mode, sp, note


def parse_precision(text: str, default: str) -> Precision:
    t = text.lower()
    for p in ("bf16", "fp16", "fp8"):
        if p in t:
            return Precision(p)
    if t.startswith("mixed"):
        return Precision.FP16      # 2021-22 Megatron "mixed precision" = fp16 with loss scaling
    if t == "":
        return Precision(default)
    raise ConfigError(f"unknown precision {text!r}", field="precision")


def _zero_stage(row: dict, prof: SourceProfile) -> int:
    notes = row.get("notes", "").upper()
    if "SHARD_GRAD_OP" in notes:
        return 2        # PyTorch FSDP SHARD_GRAD_OP shards gradients and optimizer state = ZeRO 2
    if "FULL_SHARD" in notes:
        return 3
    return prof.zero


def build_model(row: dict) -> ModelSpec:
    need = {k: _int(row, k) for k in ("layers", "hidden", "heads", "seq_len", "vocab")}
    absent = [k for k, v in need.items() if v is None]
    if absent:
        raise _Skip(f"model shape not given ({', '.join(absent)})")
    return ModelSpec(name=row.get("model") or "row", ffn_hidden=_int(row, "ffn_hidden"), source=row.get("source", ""),
                     **need)


class _Skip(Exception):
    """A row comet cannot model; the message is the reason shown to the user."""


def build_parallel(row: dict, prof: SourceProfile, model: ModelSpec, notes: list[str]) -> ParallelConfig:
    tp, pp = _int(row, "tp"), _int(row, "pp")
    if tp is None or pp is None:
        raise _Skip("TP/PP not stated by the source for this point")
    gpus, dp, cp = _int(row, "num_gpus"), _int(row, "dp"), _int(row, "cp") or 1
    gb = _int(row, "global_batch")
    if gb is None:
        raise _Skip("global batch not stated")
    if gpus is None and dp is None:
        raise _Skip("neither num_gpus nor dp given")
    vpp = _int(row, "vpp") or 1
    mb = _int(row, "micro_batch")
    if mb is None:
        mb = prof.micro_batch
        notes.append(f"micro-batch {mb} (source silent)")
    recompute, sp_stated, rc_note = parse_recompute(row.get("recompute", ""), prof.recompute)
    if rc_note:
        notes.append(rc_note)
    sp = prof.sequence_parallel if sp_stated is None else sp_stated
    return ParallelConfig(global_batch=gb, tp=tp, pp=pp, dp=dp, cp=cp, gpus=gpus, sequence_parallel=sp, vpp=vpp,
                          schedule=Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B, micro_batch=mb,
                          recompute=recompute, zero=_zero_stage(row, prof),
                          precision=parse_precision(row.get("precision", ""), prof.precision),
                          overlap_grad_reduce=prof.overlap_grad_reduce, overlap_param_gather=prof.overlap_param_gather,
                          overlap_tp_comm=prof.overlap_tp_comm, flash_attention=prof.flash_attention)


def cluster_file_for(gpu: str) -> str | None:
    up = gpu.upper()
    for frag, fname in CLUSTER_FOR_GPU.items():
        if frag in up:
            return fname
    return None


def derive_case(row: dict, index: int) -> Case:
    prof = profile_for(row.get("source", ""))
    metric = row.get("metric", "")
    try:
        value = float(row.get("value", ""))
    except ValueError:
        value = math.nan
    case = Case(index=index, row=row, profile=prof, metric=metric, value=value)
    try:
        if metric not in METRICS:
            raise _Skip(f"metric {metric!r} is not one comet predicts ({', '.join(METRICS)})")
        if not math.isfinite(value) or value <= 0:
            raise _Skip(f"measured value {row.get('value')!r} is not a positive number")
        case.cluster_file = cluster_file_for(row.get("gpu", "")) or ""
        if not case.cluster_file:
            raise _Skip(f"no cluster spec for GPU {row.get('gpu')!r} (known: {', '.join(CLUSTER_FOR_GPU)})")
        case.model = apply_moe(row, build_model(row), case.assumptions)
        case.parallel = apply_expert_parallel(row, build_parallel(row, prof, case.model, case.assumptions),
                                              case.assumptions)
    except _Skip as exc:
        case.skip_reason = str(exc)
    except CometError as exc:
        case.skip_reason = f"row {index + 2}: {exc}"
    return case


def mark_held_out(cases: list[Case], every: int = 3) -> None:
    """Deterministic hold-out: every `every`-th modelled row of each source (the 3rd, 6th, ... in file
    order; rows of one source profile count as one source, skipped rows are not counted)."""
    seen: dict[str, int] = {}
    for c in cases:
        if c.skip_reason:
            continue
        key = c.profile.key if c.profile.match else c.source
        k = seen.get(key, 0)
        c.held_out = k % every == every - 1
        seen[key] = k + 1


def load_cases(path: str | Path) -> list[Case]:
    cases = [derive_case(r, i) for i, r in enumerate(read_csv(path))]
    mark_held_out(cases)
    return cases
