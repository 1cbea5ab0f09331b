"""Recognise a transformer training step in a real profiler trace (Kineto, with its PyTorch ET beside it).

    rec = recognize(paths)       # Recognition: shape, layout, phases, per-layer and per-role times

* **Layers**: record_function / nn.Module scopes named `...layers.<i>` (or `layer.<i>`) when present;
  else the attention cores (`aten::baddbmm`, `aten::scaled_dot_product_attention`, flash-attention ops),
  one per layer in the forward, and the norm ops around them (two per layer, Megatron / Llama).
* **Shape** from the recorded input shapes (`Input Dims`, `record_shapes=True`) of the first layer's
  four forward GEMMs in issue order (QKV, projection, FC1, FC2; column-parallel QKV/FC1, row-parallel
  projection/FC2) and of its attention core: tokens m = b*s, hidden = K of QKV, QKV width (h+2kv)/tp,
  FFN width gate*f/tp (gate 2 when FC1 is twice FC2's input: SwiGLU), heads per rank and head dim from
  the attention operands, sequence from the attention operands, micro-batch = m / s, vocabulary from the
  logits GEMM after the last layer (N = V/tp), dtype from the GEMM's input type.
* **TP** from the process group of the collectives issued inside the first layer (ET `record_param_comms`
  group size, matched to the Kineto c10d calls in order); no collective in a layer: tp 1. DP = world / tp
  (a pipeline-parallel trace is not recognised: the reason says so).
* **Phases**: forward always; backward when autograd engine ops are present; optimizer when an
  optimizer step (`Optimizer.step`, an `optimizer` scope, `adam`) is.
* **Per-role times** (for grounding, comet/trace/ground.py): every measured op is given comet's op role
  (comet/workload/layers.py names). Scope names that are roles count as they are; autograd backward
  functions take the role of the forward op with the same sequence number plus `.bwd`; without role
  scopes the forward ops of a layer are walked in order (norm, QKV GEMM, attention core, projection,
  all-reduce, residual add, norm, FC1, activation, FC2, all-reduce, residual add). A role's time on a
  GPU is the sum of the kernels its CPU ops launched; on a CPU-only trace the ops' own durations.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field

from comet.errors import TraceError
from comet.trace.common import collective_from_name, rank_from_name
from comet.trace.kineto import _GPU_CATS, _NEST_CATS, _RUNTIME_CATS, _window
from comet.trace.loader import read_files
from comet.trace.pytorch_et import comm_records
from comet.trace.roles import role_times

_LAYER_SCOPE = re.compile(r"(?:^|[./_])layers?[._](\d+)$")
_ATTN = re.compile(r"^aten::(?:baddbmm|scaled_dot_product_attention|_scaled_dot_product_\w+)$|flash_attn", re.I)
_GEMM = {"aten::mm", "aten::addmm"}
_NORM = re.compile(r"norm", re.I)
_ACT = re.compile(r"gelu|silu|swiglu|glu|tanh", re.I)
_ADD = re.compile(r"^aten::add_?$|fused_add|dropout_add|bias_dropout_add", re.I)
_DTYPES = {"c10::half": "fp16", "half": "fp16", "c10::bfloat16": "bf16", "bfloat16": "bf16", "float": "fp32",
           "float32": "fp32", "c10::float8_e4m3fn": "fp8"}
# comet's op roles inside a layer (comet/workload/layers.py) that a trace can name directly
LAYER_ROLES = ("input_norm", "qkv", "attention", "attention.qk", "attention.softmax_dropout", "attention.pv",
               "proj", "proj.all_reduce", "attention.dropout_add", "mlp_norm", "fc1", "gelu", "swiglu", "fc2",
               "fc2.all_reduce", "mlp.dropout_add")
OUTER_ROLES = ("embedding", "embedding.all_reduce", "head", "final_norm", "logits", "cross_entropy",
               "dp.grad_all_reduce", "optimizer")


@dataclass
class Recognition:
    source: str
    ranks: list = field(default_factory=list)
    world_size: int = 1
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    activation: str | None = None
    seq_len: int | None = None
    micro_batch: int | None = None
    vocab: int | None = None
    tp: int | None = None
    dp: int | None = None
    dtype: str | None = None
    phases: list = field(default_factory=list)
    streams: dict = field(default_factory=dict)
    layers_from: str = ""
    per_layer_ms: list = field(default_factory=list)       # measured time of each layer's forward, rank 0
    step_ms: float | None = None                           # the imported iteration, rank 0
    role_ms: dict = field(default_factory=dict)            # role -> ms per occurrence (layer roles: per layer)
    unattributed_ms: dict = field(default_factory=dict)    # measured time no role covers, by where
    how: dict = field(default_factory=dict)                # field -> how it was found
    unrecognised: dict = field(default_factory=dict)       # field -> reason

    def as_dict(self) -> dict:
        return asdict(self)


class _Rank:
    """The imported iteration of one Kineto file: CPU events of the step process, GPU kernels by launch."""

    def __init__(self, doc: dict, source: str, step):
        self.source = source
        evs = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
               and isinstance(e.get("ts"), (int, float))]
        cpu = [e for e in evs if e.get("cat") in _NEST_CATS and isinstance(e.get("pid"), (int, float))]
        gpu = [e for e in evs if e.get("cat") in _GPU_CATS]
        t0, t1, main, self.step = _window(doc, cpu, gpu, step, source)
        self.t0, self.t1 = t0, (t1 if t1 != math.inf else max(e["ts"] + e.get("dur", 0) for e in cpu + gpu))
        pid = main[0] if main else (cpu[0]["pid"] if cpu else None)
        self.main_tid = main[1] if main else None
        self.cpu = sorted((e for e in cpu if e["pid"] == pid and self.t0 <= e["ts"] < self.t1),
                          key=lambda e: (e["ts"], -e.get("dur", 0)))
        self.gpu = gpu
        info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
        self.rank = info.get("rank") if isinstance(info.get("rank"), int) else rank_from_name(source) or 0
        self.world = info.get("world_size") if isinstance(info.get("world_size"), int) else 1
        self.pg_config = [pg for pg in info.get("pg_config") or [] if isinstance(pg, dict)]
        kernels_by_corr: dict = {}
        for g in gpu:
            kernels_by_corr.setdefault((g.get("args") or {}).get("correlation"), []).append(g)
        self.launches = []            # (ts, tid, kernel duration us, is_nccl, kernel name)
        for e in self.cpu:
            if e["cat"] in _RUNTIME_CATS:
                for g in kernels_by_corr.get((e.get("args") or {}).get("correlation"), ()):
                    name = g.get("name", "")
                    self.launches.append((e["ts"], e["tid"], g.get("dur", 0), name.startswith("nccl"), name))
        self.launches.sort()
        self.on_gpu = bool(self.launches)

    def time_us(self, e, comm: bool = True, only=None) -> float:
        """Measured time of a CPU op: the kernels it launched (GPU trace; `comm` False: without NCCL
        kernels; `only`: kernels whose name matches this regex) or its own duration (CPU trace)."""
        if not self.on_gpu:
            return e.get("dur", 0)
        a, b = e["ts"], e["ts"] + e.get("dur", 0)
        return sum(d for ts, tid, d, nccl, name in self.launches if a <= ts <= b and tid == e["tid"]
                   and (comm or not nccl) and (only is None or only.search(name)))

    def ops(self, a: float, b: float, tid=None):
        return [e for e in self.cpu if a <= e["ts"] < b and e["cat"] == "cpu_op" and (tid is None or e["tid"] == tid)]


def _dims(e) -> list:
    return (e.get("args") or {}).get("Input Dims") or []


def _innermost_gemms(r: _Rank, a, b, tid) -> list:
    """aten::mm / addmm of [a, b) on the thread (matmul / linear decompose into them)."""
    return [e for e in r.ops(a, b, tid) if e["name"] in _GEMM and len(_dims(e)) >= 2
            and len(_dims(e)[0]) == 2 and len(_dims(e)[1]) == 2]


def _layer_spans(r: _Rank, rec: Recognition) -> list:
    scopes: dict[int, dict] = {}
    for e in r.cpu:
        m = _LAYER_SCOPE.search(str(e.get("name", ""))) if e["cat"] in ("user_annotation", "cpu_op") else None
        if m and e.get("tid") == r.main_tid:
            scopes.setdefault(int(m.group(1)), e)
    if scopes:
        rec.layers_from = "record_function scopes `layers.<i>`"
        return [(e["ts"], e["ts"] + e.get("dur", 0)) for _, e in sorted(scopes.items())]
    main = [e for e in r.cpu if e["cat"] == "cpu_op" and e.get("tid") == r.main_tid]
    attn = [e for e in main if _ATTN.search(e["name"])]
    norms = [e for e in main if _NORM.search(e["name"]) and not e["name"].startswith("aten::")]
    if not attn:
        return []
    rec.layers_from = f"op names and repetition: {len(attn)} attention cores ({attn[0]['name']})"
    # a layer runs from its input norm (the last norm op before its attention core) to the next layer's
    spans, starts = [], []
    for a in attn:
        before = [n for n in norms if n["ts"] < a["ts"]]
        starts.append(before[-1]["ts"] if before else a["ts"])
    after_last = [n for n in norms if n["ts"] > attn[-1]["ts"]]
    # the final norm follows the last layer's MLP norm
    end = after_last[1]["ts"] if len(after_last) >= 2 else r.t1
    for i, s in enumerate(starts):
        spans.append((s, starts[i + 1] if i + 1 < len(starts) else end))
    return spans


def _shape(r: _Rank, rec: Recognition, spans, comm_groups) -> None:
    a, b = spans[0]
    gemms = _innermost_gemms(r, a, b, r.main_tid)
    if len(gemms) < 4:
        rec.unrecognised["shape"] = f"first layer has {len(gemms)} forward GEMMs with recorded shapes (need 4: " \
                                    f"QKV, projection, FC1, FC2; was the profiler run with record_shapes=True?)"
        return
    qkv, proj, fc1, fc2 = gemms[:4]
    (m, h), (_, n_qkv) = _dims(qkv)[:2]
    n_proj_in = _dims(proj)[0][1]
    n_fc1 = _dims(fc1)[1][1]
    n_fc2_in = _dims(fc2)[0][1]
    rec.hidden = h
    rec.how["hidden"] = f"K of the first GEMM of layer 0 ({qkv['name']} {_dims(qkv)[:2]})"
    itype = ((qkv.get("args") or {}).get("Input type") or [""])[0]
    rec.dtype = _DTYPES.get(str(itype).lower())
    rec.how["dtype"] = f"input type of that GEMM: {itype}"
    rec.activation = "swiglu" if n_fc1 == 2 * n_fc2_in else "gelu"
    rec.how["activation"] = f"FC1 width {n_fc1} vs FC2 input {n_fc2_in}"
    attn = [e for e in r.ops(a, b, r.main_tid) if _ATTN.search(e["name"])]
    if not attn:
        rec.unrecognised["heads"] = "no attention core op (baddbmm / scaled_dot_product_attention) in layer 0"
        return
    d0 = _dims(attn[0])
    if attn[0]["name"] == "aten::baddbmm":     # [b*heads/tp, s, s], [b*heads/tp, s, d], [b*heads/tp, d, s]
        bh, s, d = d0[1][0], d0[1][1], d0[1][2]
        rec.seq_len = s
        b_ = m // s
        hp = bh // b_
    else:                                      # sdpa: q [b, heads/tp, s, d], k [b, kv/tp, s, d]
        b_, hp, s, d = d0[0]
        rec.seq_len = s
    rec.micro_batch = m // rec.seq_len
    rec.how["seq_len"] = f"attention operands of layer 0 ({attn[0]['name']} {d0[:2]})"
    rec.how["micro_batch"] = f"GEMM rows {m} / seq_len {rec.seq_len}"
    tp = comm_groups[0] if comm_groups else 1
    rec.tp = tp
    rec.how["tp"] = (f"group size of the {len(comm_groups)} collectives in layer 0"
                     if comm_groups else "no collective inside a layer")
    rec.heads = hp * tp
    rec.how["heads"] = f"{hp} heads per rank (head dim {d}) x tp {tp}"
    kv = (n_qkv * tp - hp * d * tp) // 2
    rec.kv_heads = kv // d if d else None
    rec.ffn_hidden = n_fc1 * tp // (2 if rec.activation == "swiglu" else 1)
    rec.how["ffn_hidden"] = f"FC1 width {n_fc1} per rank x tp {tp}" + (" / 2 (gate and up)" if rec.activation == "swiglu" else "")
    if n_proj_in != hp * d:
        rec.unrecognised["heads"] = f"projection input {n_proj_in} != heads per rank x head dim {hp * d}"
    tail = _innermost_gemms(r, spans[-1][1], r.t1, r.main_tid)
    logits = next((g for g in tail if _dims(g)[0][1] == h), None)     # the first GEMM after the layers
    if logits is not None:
        rec.vocab = _dims(logits)[1][1] * tp
        rec.how["vocab"] = f"logits GEMM after the last layer ({_dims(logits)[:2]}) x tp {tp}"
    else:
        rec.unrecognised["vocab"] = "no logits GEMM (K = hidden) after the last layer"


def _comm_groups(r: _Rank, et_doc, et_name, a, b, rec: Recognition) -> list:
    """Group sizes of the collectives issued in [a, b) on the step thread: from the ET's
    record_param_comms (NCCL), matched to the Kineto c10d calls in order; else from a process group the
    job described as "tp" (Kineto distributedInfo.pg_config); else the world."""
    calls = [e for e in r.cpu if e["cat"] == "cpu_op" and e["name"].startswith("c10d::")
             and collective_from_name(e["name"].split("::")[-1])]
    inside = sum(1 for e in calls if a <= e["ts"] < b)
    if not inside:
        return []
    records = comm_records(et_doc, et_name) if et_doc is not None else []
    if not records:
        tp = [pg for pg in r.pg_config if str(pg.get("pg_desc", "")).lower() in ("tp", "tensor_parallel", "tensor")
              and r.rank in (pg.get("ranks") or [])]
        if tp:
            rec.how["tp_group"] = f"process group {tp[0].get('pg_name')!r} described {tp[0].get('pg_desc')!r} (pg_config)"
            return [int(tp[0].get("pg_size") or len(tp[0]["ranks"]))] * inside
        rec.how["tp_group"] = "no group sizes in the trace (no ET record_param_comms, no 'tp' group): the world"
        return [r.world] * inside
    if len(records) != len(calls):
        raise TraceError(f"execution trace has {len(records)} collectives but the Kineto step has "
                         f"{len(calls)} c10d calls; they do not describe the same iteration", path=et_name)
    return [rec.group_size or r.world for e, rec in zip(calls, records) if a <= e["ts"] < b]


def recognize(paths, step=None) -> Recognition:
    files = read_files(paths)
    kin = sorted((f for f in files if f.kind == "kineto"), key=lambda f: f.name)
    if not kin:
        raise TraceError("recognition needs Kineto traces (PyTorch profiler JSON)", path=str(paths))
    ranks = [_Rank(f.doc, f.name, step) for f in kin]
    ranks.sort(key=lambda r: r.rank)
    r = ranks[0]
    ets = {f.doc.get("pid"): f for f in files if f.kind == "pytorch_et"}
    et = ets.get(next((e["pid"] for e in r.cpu), None))
    if et is None:
        et = next((f for f in files if f.kind == "pytorch_et" and rank_from_name(f.name) == r.rank), None)
    rec = Recognition(source=str(paths), ranks=[x.rank for x in ranks], world_size=max(r.world, len(ranks)))
    rec.step_ms = (r.t1 - r.t0) / 1000.0
    spans = _layer_spans(r, rec)
    if not spans:
        rec.unrecognised["layers"] = "no `layers.<i>` scopes and no attention core ops (baddbmm / sdpa / flash)"
        return rec
    rec.layers = len(spans)
    groups = _comm_groups(r, et.doc if et else None, et.name if et else "", *spans[0], rec)
    if et is None:
        rec.how["et"] = "no execution trace beside the Kineto file: collective group = world"
    _shape(r, rec, spans, groups)
    if rec.tp:
        rec.dp = rec.world_size // rec.tp
        rec.how["dp"] = f"world {rec.world_size} / tp {rec.tp} (no pipeline sends in the trace)"
    names = {e["name"] for e in r.cpu}
    rec.phases = ["forward"]
    if any(n.startswith("autograd::engine") for n in names):
        rec.phases.append("backward")
    if any(re.search(r"optimizer|adam", n, re.I) for n in names):
        rec.phases.append("optimizer")
    streams: dict = {}
    for g in r.gpu:
        kind = "communication" if g.get("name", "").startswith("nccl") else "compute"
        streams.setdefault(kind, set()).add((g.get("args") or {}).get("stream", g.get("tid")))
    rec.streams = {k: sorted(v) for k, v in streams.items()} or {"cpu threads": sorted({e["tid"] for e in r.cpu})}
    # GPU: compute kernels launched by the layer's forward (NCCL kernels include waiting for peers; their
    # transfer time is in role_ms); CPU: the layer's forward ops.
    rec.per_layer_ms = [round(sum(r.time_us(e, comm=False) for e in _leaves(r, a, b)) / 1000.0, 4) for a, b in spans]
    per_rank = [(r, spans)]
    for x in ranks[1:]:
        x_spans = _layer_spans(x, Recognition(source=x.source))
        if len(x_spans) == len(spans):
            per_rank.append((x, x_spans))
    rec.role_ms, rec.unattributed_ms = role_times(per_rank, rec.layers)
    return rec


def _leaves(r: _Rank, a, b) -> list:
    """Ops of [a, b) on the step thread that are not nested in another op of that range."""
    out, end = [], -math.inf
    for e in r.ops(a, b, r.main_tid):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e.get("dur", 0)
    return out


def median(xs):
    return statistics.median(xs) if xs else None
