"""Measurement rows (schema v2: ../shared/calibration/SCHEMA.md) to comet cases: a ModelSpec, a
ParallelConfig, the cluster spec, the metric and the measured value.

Every schema column is read. Explicit cells win; an empty cell takes the default of the row's framework
(comet.validate.frameworks) and is listed in the case's assumptions. A bad cell (unknown enum value,
non-numeric number, impossible layout) makes that row `skipped` with the column and the value; the
other rows go on. Rows of a kind comet does not model yet (MoE) are `skipped` with the reason.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from comet.config.document import read_text
from comet.config.model import Activation, ModelSpec
from comet.config.parallel import ParallelConfig, Precision, Recompute, Schedule, SelectivePolicy
from comet.errors import CometError, ConfigError
from comet.validate.frameworks import FrameworkDefaults, defaults_for
from comet.validate.moe_rows import apply_expert_parallel, apply_moe, is_moe_row
from comet.workload.memory_measures import MEASURES

REQUIRED_COLUMNS = ("source", "model", "layers", "hidden", "heads", "seq_len", "vocab", "num_gpus", "tp", "pp",
                    "global_batch", "framework", "metric", "value")
# every time or rate metric the schema accepts (the summary scores a subset: summary.STEP_RATE_METRICS)
TIMING_METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "tflops_per_gpu", "mfu",
                  "time_to_train_min", "layer_fwd_bwd_time_ms")
MEMORY_METRICS = ("memory_gib_per_gpu", "memory_gb_per_gpu")
METRICS = TIMING_METRICS + MEMORY_METRICS
ENUMS = {
    "activation": tuple(a.value for a in Activation),
    "attention": ("mha", "gqa", "mla"),
    "gpu_model": ("h100-sxm-80gb", "h100-sxm-96gb", "h200-sxm-141gb", "a100-sxm-80gb"),
    "recompute": ("none", "selective", "full"),
    "precision": ("bf16", "fp16", "fp8", "fp32"),
    "fp8_recipe": ("delayed", "current", "blockwise", "mxfp8", "tensorwise", "rowwise"),
    "framework": ("megatron-lm", "nemo", "megatron-bridge", "torchtitan", "deepspeed", "llm-foundry", "maxtext",
                  "automodel", "meta-internal"),
    "metric": METRICS,
    "flops_formula": ("megatron_model", "narayanan_eq3", "palm_6n", "llm_foundry"),
    "memory_measure": MEASURES,
}
MOE_COLUMNS = ("moe_experts", "moe_topk", "moe_shared_experts", "moe_dense_layers")

# gpu_model -> (cluster spec under cluster_specs/, HBM GB of this part when it differs from the spec's).
# H100 SXM 96 GB: same GH100 compute, 96 GB HBM (torchtitan's 500 W part; its power cap is not modelled).
# H200 SXM: H100 compute with 141 GB HBM3e at 4.8 TB/s (NVIDIA H200 datasheet).
CLUSTER_FOR_GPU = {"h100-sxm-80gb": ("h100_dgx.yaml", None, None), "h100-sxm-96gb": ("h100_dgx.yaml", 96.0, None),
                   "h200-sxm-141gb": ("h100_dgx.yaml", 141.0, 4800.0), "a100-sxm-80gb": ("a100_dgx.yaml", None, None)}


class RowError(Exception):
    """A bad cell: the column, the value and the rule."""

    def __init__(self, column: str, value: str, rule: str):
        super().__init__(f"column {column}={value!r}: {rule}")
        self.column, self.value = column, value


class _Skip(Exception):
    """A row comet cannot model (yet); the message is the reason shown to the user."""


@dataclass
class Case:
    index: int                      # 0-based row number in the CSV (header excluded)
    row: dict
    defaults: FrameworkDefaults
    metric: str
    value: float
    model: ModelSpec | None = None
    parallel: ParallelConfig | None = None
    cluster_file: str = ""
    hbm_GB: float | None = None          # HBM of the part when it differs from the cluster spec's
    hbm_GBps: float | None = None
    flops_formula: str = "megatron_model"
    mfu_peak_tflops: float | None = None
    total_tokens: float | None = None
    memory_measure: str = "max_reserved"   # memory rows: what was read (comet/workload/memory_measures.py)
    held_out: bool = False
    skip_reason: str = ""
    bad_column: str = ""                 # the cell that made the row unreadable
    assumptions: list[str] = field(default_factory=list)
    # (tp, pp) as stated, None where the source leaves it open: the layout is chosen at prediction time
    # (comet/validate/layout.py); None once chosen or where the layout is stated whole
    open_layout: tuple[int | None, int | None] | None = None
    open_vpp: bool = False               # vpp empty, pp > 1 (or open) and the framework interleaves
    layout_notes: list[str] = field(default_factory=list)   # assumptions of the stand-in layout (replaced)
    chosen: list[str] = field(default_factory=list)   # settings chosen for empty knobs (also in assumptions)

    @property
    def source(self) -> str:
        return self.row.get("source", "")

    @property
    def source_label(self) -> str:
        """Short grouping label for reports: the source text up to its first ' @ ', ' (' or ','."""
        return re.split(r" @ | \(|,|'", self.source, maxsplit=1)[0].strip()[:48] or "-"

    @property
    def framework(self) -> str:
        return self.row.get("framework", "") or "generic"


def read_csv(path: str | Path) -> list[dict]:
    text = read_text(path, "CSV")    # the input gate: size, binary / gzip / NUL, UTF-8 (BOM allowed)
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"missing columns: {', '.join(missing)} (schema: ../shared/calibration/SCHEMA.md)",
                              source=str(path))
        return [{k: (v or "").strip() for k, v in r.items() if k is not None} for r in reader]


# ------------------------------------------------------------------------------------------- cells
class Cells:
    """Typed access to one row; every filled-in default is recorded as an assumption."""

    def __init__(self, row: dict, defaults: FrameworkDefaults, assumptions: list[str]):
        self.row, self.d, self.assumptions = row, defaults, assumptions

    def text(self, col: str) -> str:
        return self.row.get(col, "")

    def number(self, col: str, positive: bool = True) -> float | None:
        t = self.text(col)
        if t == "":
            return None
        try:
            v = float(t)
        except ValueError:
            raise RowError(col, t, "must be a number") from None
        if not math.isfinite(v) or (positive and v <= 0):
            raise RowError(col, t, "must be a positive number")
        return v

    def integer(self, col: str, minimum: int = 1) -> int | None:
        v = self.number(col, positive=False)
        if v is None:
            return None
        if v != int(v) or v < minimum:
            raise RowError(col, self.text(col), f"must be an integer >= {minimum}")
        return int(v)

    def enum(self, col: str) -> str:
        t = self.text(col).lower()
        if t and t not in ENUMS[col]:
            raise RowError(col, self.text(col), f"must be one of {', '.join(ENUMS[col])}")
        return t

    def boolean(self, col: str) -> bool | None:
        t = self.text(col).lower()
        if t == "":
            return None
        if t not in ("true", "false"):
            raise RowError(col, self.text(col), "must be true or false")
        return t == "true"

    def default(self, col: str, value, why: str = ""):
        note = why or self.d.notes.get(col, "")
        self.assumptions.append(f"{col}={value} ({self.d.key} default{': ' + note if note else ''})")
        return value

    def int_or(self, col: str, fallback: int, minimum: int = 1) -> int:
        v = self.integer(col, minimum)
        return self.default(col, fallback) if v is None else v

    def bool_or(self, col: str, fallback: bool | None):
        v = self.boolean(col)
        if v is not None:
            return v
        if fallback is None:   # "on whenever tp > 1": stated as such
            self.default(col, "with tp", "on whenever tp > 1")
            return None
        return self.default(col, fallback)

    def enum_or(self, col: str, fallback: str) -> str:
        v = self.enum(col)
        return v or self.default(col, fallback)


# ------------------------------------------------------------------------------------------- model
def build_model(c: Cells) -> ModelSpec:
    need = {k: c.integer(k) for k in ("layers", "hidden", "heads", "seq_len", "vocab")}
    absent = [k for k, v in need.items() if v is None]
    if absent:
        raise _Skip(f"model shape not given ({', '.join(absent)})")
    moe = is_moe_row(c.row)   # the moe_* columns are applied below (comet.validate.moe_rows)
    if c.enum("attention") == "mla" and not moe:
        raise _Skip("multi-head latent attention (attention=mla) is not modelled yet")
    kv = c.integer("kv_heads")
    if kv is None:
        kv = c.default("kv_heads", need["heads"], "= heads (MHA)")
    ffn = c.integer("ffn_hidden")
    if ffn is None:
        ffn = c.default("ffn_hidden", 4 * need["hidden"], "4 * hidden")
    act = c.enum("activation") or c.default("activation", "gelu", "GPT MLP")
    tied = c.boolean("tied_embeddings")
    if tied is None:
        tied = c.default("tied_embeddings", True, "GPT ties input and output embeddings")
    try:
        model = ModelSpec(name=c.text("model") or "row", source=c.text("source"), kv_heads=kv, ffn_hidden=ffn,
                          activation=Activation(act), tied_embeddings=tied, vocab_pad_to=c.d.vocab_pad_to,
                          linear_bias=act == "gelu", **need)
        return apply_moe(c.row, model, c.assumptions) if moe else model
    except ConfigError as exc:
        raise RowError(exc.field or "model", c.text(exc.field or "model"), str(exc)) from None


# ------------------------------------------------------------------------------------------- layout
def build_parallel(c: Cells, model: ModelSpec, tp: int, pp: int, provisional: bool = False,
                   vpp: int | None = None) -> ParallelConfig:
    """The row's configuration on tp x pp. `provisional`: a stand-in layout for a row that states no
    split (every other cell is read and checked; dp is left to the layout search)."""
    d = c.d
    gpus, dp = c.integer("num_gpus"), c.integer("dp")
    if provisional:
        if gpus is None:
            raise _Skip("tp/pp not stated and num_gpus not given: no layout to search")
        dp = None
    cp = c.int_or("cp", 1)
    gb = c.integer("global_batch")
    if gb is None:
        raise _Skip("global batch not stated")
    if gpus is None and dp is None:
        raise _Skip("neither num_gpus nor dp given")
    if gpus is not None and dp is not None and tp * pp * dp * cp != gpus:
        raise RowError("num_gpus", c.text("num_gpus"), f"impossible layout: tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} "
                       f"= {tp * pp * dp * cp}")
    vpp = vpp or c.int_or("vpp", 1)
    mb = c.int_or("micro_batch", d.micro_batch)
    recompute = c.enum_or("recompute", d.recompute)
    if recompute == "full" and c.integer("recompute_layers") is not None:
        c.assumptions.append(f"recompute_layers={c.text('recompute_layers')}: modelled as full recompute of "
                             "every layer")
    precision = c.enum_or("precision", d.precision)
    if precision == "fp32":
        raise _Skip("fp32 GEMMs are not modelled")
    if precision == "fp8":
        c.enum_or("fp8_recipe", d.fp8_recipe)
    fsdp = c.boolean("fsdp")
    if fsdp is None:
        fsdp = c.default("fsdp", d.fsdp)
    zero = c.integer("zero", minimum=0)
    if zero is None:
        zero = c.default("zero", 3 if fsdp else d.zero, "fsdp implies 3" if fsdp else "")
    if zero > 3:
        raise RowError("zero", c.text("zero"), "must be 0, 1, 2 or 3")
    shard_grad_op = fsdp and zero == 2 and d.shard_grad_op
    if shard_grad_op:
        c.default("shard_grad_op", True, d.notes.get("shard_grad_op", "PyTorch FSDP SHARD_GRAD_OP"))
    reduce_dtype = c.default("reduce_dtype", d.reduce_dtype) if d.reduce_dtype else None
    dp_collective = "hierarchical"
    if zero >= 3 and d.dp_collective != "hierarchical":
        dp_collective = c.default("dp_collective", d.dp_collective)
    live = None
    if zero >= 3 and d.zero3_live_params is not None:
        live = d.zero3_live_params
        c.default("zero3_live_params", f"{live:.3g}")
    loss_impl = c.default("loss_impl", d.loss_impl) if "loss_impl" in d.notes else d.loss_impl
    first, last = c.integer("pp_first_stage_layers"), c.integer("pp_last_stage_layers")
    emb_loss = False
    if first is None and last is None and model.layers % (pp * vpp) and (model.layers + 2) % (pp * vpp) == 0:
        emb_loss = True    # Megatron-Core account_for_embedding/loss_in_pipeline_split (NeMo Llama 3.1 405B)
        c.assumptions.append(f"layers {model.layers} on pp*vpp={pp * vpp}: embedding and loss counted as one "
                             "layer each (Megatron-Core account_for_*_in_pipeline_split)")
    elif first is None and last is None and model.layers % (pp * vpp):
        per = -(-model.layers // pp)    # the first stage (which also holds the embedding) takes the remainder
        first = model.layers - (pp - 1) * per
        c.assumptions.append(f"layers {model.layers} on pp={pp}: {per} per stage and {first} on the first "
                             "(--decoder-first-pipeline-num-layers; split not stated)")
    try:
        par = ParallelConfig(
            global_batch=gb, tp=tp, pp=pp, dp=dp, cp=cp, gpus=gpus, vpp=vpp, micro_batch=mb,
            sequence_parallel=c.bool_or("sequence_parallel", d.sequence_parallel),
            schedule=Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B,
            recompute=Recompute(recompute), zero=zero, precision=Precision(precision),
            selective_policy=SelectivePolicy(d.selective_policy), fp8_impl=d.fp8_impl,
            attention_kernel=(c.default("attention_kernel", d.attention_kernel)
                              if d.flash_attention and d.attention_kernel != "fused" else d.attention_kernel),
            overlap_grad_reduce=c.bool_or("overlap_grad_reduce", d.overlap_grad_reduce),
            overlap_param_gather=c.bool_or("overlap_param_gather", d.overlap_param_gather),
            overlap_tp_comm=c.bool_or("tp_comm_overlap", d.overlap_tp_comm),
            overlap_p2p_comm=d.overlap_p2p_comm, attention_unpad=d.attention_unpad and d.flash_attention,
            flash_attention=d.flash_attention, grad_dtype=d.grad_dtype, fsdp=fsdp, dropout=d.dropout,
            dp_collective=dp_collective, zero3_live_params=live, loss_impl=loss_impl, fsdp_impl=d.fsdp_impl,
            shard_grad_op=shard_grad_op, reduce_dtype=reduce_dtype,
            fp8_params=bool(c.boolean("fp8_params")) and precision == "fp8",
            pp_first_stage_layers=first, pp_last_stage_layers=last,
            pp_embedding_as_layer=emb_loss, pp_loss_as_layer=emb_loss)
    except ConfigError as exc:
        raise RowError(exc.field or "layout", c.text(exc.field or ""), str(exc)) from None
    return apply_expert_parallel(c.row, par, c.assumptions)


def layout_config(case: Case, tp: int, pp: int, vpp: int | None = None) -> tuple[ParallelConfig, list[str]]:
    """The configuration of an open-layout row on tp x pp (x vpp where given), with the assumptions its
    cells add."""
    notes: list[str] = []
    return build_parallel(Cells(case.row, case.defaults, notes), case.model, tp, pp, vpp=vpp), notes


def _metric_inputs(c: Cells, case: Case) -> None:
    if case.metric in ("tflops_per_gpu", "mfu"):
        case.flops_formula = c.enum("flops_formula") or c.default("flops_formula", c.d.flops_formula)
    if case.metric == "mfu":
        case.mfu_peak_tflops = c.number("mfu_peak_tflops")
    if case.metric == "time_to_train_min":
        case.total_tokens = c.number("total_tokens")
        if case.total_tokens is None:
            raise _Skip("time_to_train_min needs total_tokens")
    if case.metric in MEMORY_METRICS:
        case.memory_measure = c.enum_or("memory_measure", "max_reserved")


def derive_case(row: dict, index: int) -> Case:
    framework = row.get("framework", "").lower()
    d = defaults_for(framework, row.get("framework_version", ""))
    case = Case(index=index, row=row, defaults=d, metric=row.get("metric", ""), value=math.nan)
    c = Cells(row, d, case.assumptions)
    try:
        c.enum("framework")
        c.number("params_b")         # informational, but a typed column: checked where it enters
        case.metric = c.enum("metric")
        if not case.metric:
            raise RowError("metric", "", f"must be one of {', '.join(METRICS)}")
        value = c.number("value")
        if value is None:
            raise RowError("value", "", "must be a positive number")
        case.value = value
        gpu = c.enum("gpu_model")
        if not gpu:
            raise _Skip("gpu_model not given (closed set: " + ", ".join(ENUMS["gpu_model"]) + ")")
        case.cluster_file, case.hbm_GB, case.hbm_GBps = CLUSTER_FOR_GPU[gpu]
        case.model = build_model(c)
        tp, pp = c.integer("tp"), c.integer("pp")
        case.open_vpp = d.interleave and c.integer("vpp") is None and (pp is None or pp > 1)
        if tp is None or pp is None:     # the layout is searched at prediction time (layout.py)
            case.open_layout = (tp, pp)
            case.parallel = build_parallel(Cells(row, d, []), case.model, tp or 1, pp or 1, provisional=True)
        elif case.open_vpp:              # so is the interleaving depth; the stand-in is vpp 1
            case.open_layout = (tp, pp)
            case.parallel = build_parallel(Cells(row, d, case.layout_notes), case.model, tp, pp)
            case.assumptions.extend(case.layout_notes)
        else:
            case.parallel = build_parallel(c, case.model, tp, pp)
        _metric_inputs(c, case)
        if not framework:
            c.assumptions.append("framework not given: generic defaults")
    except RowError as exc:
        case.skip_reason, case.bad_column = f"bad cell: {exc}", exc.column
    except _Skip as exc:
        case.skip_reason = str(exc)
    except CometError as exc:
        case.skip_reason = f"bad cell: {exc}"
    return case


def mark_held_out(cases: list[Case], every: int = 3) -> None:
    """Deterministic hold-out: every `every`-th modelled row of each source label (the 3rd, 6th, ... in
    file order; skipped rows are not counted)."""
    seen: dict[str, int] = {}
    for c in cases:
        if c.skip_reason:
            continue
        k = seen.get(c.source_label, 0)
        c.held_out = k % every == every - 1
        seen[c.source_label] = k + 1


def load_cases(path: str | Path) -> list[Case]:
    cases = [derive_case(r, i) for i, r in enumerate(read_csv(path))]
    mark_held_out(cases)
    return cases
