"""Give each measured op of a recognised step comet's op role (comet/workload/layers.py names).

Three sources, in this order of trust:
1. **Scopes named by role** (record_function, e.g. the recorder's `qkv`, `fc1.dgrad`, `proj.all_reduce`):
   a role's time is its scope's own time (minus role scopes nested in it).
2. **Autograd sequence numbers**: a backward function (`autograd::engine::evaluate_function: XBackward0`)
   takes the role of the forward op with the same `Sequence number`, plus `.bwd` (`swiglu` ->
   `swiglu.bwd`); time already counted by role scopes nested in it is not counted twice.
3. **Op names in order** (traces without role scopes, e.g. Megatron-LM): the forward ops of each layer are
   walked in issue order: norm, GEMM (QKV), attention core (baddbmm, softmax, bmm; or one fused
   attention op), GEMM (projection), collective, residual add, norm, GEMM (FC1), activation, GEMM (FC2),
   collective, residual add.
Everything no role covers is reported as unattributed time (by where: layer forward, backward, other).
"""

from __future__ import annotations

import re

_SKIP = re.compile(r"^(ProfilerStep#|## |gloo:|nccl:|enumerate\(DataLoader\))|(?:^|[./_])layers?[._]\d+$")
_ROLE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_\[\]]+)*$")
_SUFFIX = re.compile(r"\.(dgrad\.all_reduce|dgrad|wgrad|bwd|all_reduce\w*)$")
# cuBLAS / CUTLASS GEMM kernel names (comet/trace/calibrate_base.py uses the same list for its classes)
GEMM_KERNEL = re.compile(r"gemm|cutlass|cublas|xmma|wgmma|sm80_|sm90_|sm100_|matmul|nvjet", re.I)
_NCCL = re.compile(r"^nccl")
_RENAME = {"embedding": "embedding.lookup", "optimizer": "optimizer.adam",    # recorder scope -> builder role
           "dp.grad_all_reduce": "dp.grad_all_reduce[chunk 0]"}


def _is_role_scope(e) -> bool:
    return e.get("cat") == "user_annotation" and not _SKIP.search(e["name"]) and bool(_ROLE.match(e["name"]))


def stem(role: str) -> str:
    while True:
        s = _SUFFIX.sub("", role)
        if s == role:
            return role
        role = s


def is_comm_role(role: str) -> bool:
    return bool(re.search(r"all_reduce|all_gather|reduce_scatter", role))


def role_times(per_rank: list, layers: int):
    """(role -> ms per occurrence in a step (layer roles: per layer), unattributed ms by where).

    `per_rank`: [(rank, spans)] in rank order. Compute roles come from the first rank. A collective's
    time on one rank includes waiting for the slowest peer, so each occurrence of a collective role takes
    the minimum over the ranks (the last to arrive measured the transfer itself; Lumos does the same)."""
    collected = [_collect(r, spans) for r, spans in per_rank]
    occ, in_layer, unattr = collected[0]
    occ = dict(occ)
    for role, times in occ.items():
        if is_comm_role(role):
            others = [c[0].get(role, []) for c in collected[1:]]
            occ[role] = [min([t] + [o[i] for o in others if i < len(o)]) for i, t in enumerate(times)]
    out = {}
    for role, times in occ.items():
        per = layers if stem(role) in in_layer or role in in_layer else 1
        out[_RENAME.get(role, role)] = round(sum(times) / per / 1000.0, 6)
    return out, {k: round(v / 1000.0, 4) for k, v in unattr.items()}


def _collect(r, spans):
    occ = _Occ()
    in_layer: set = set()
    scopes = [e for e in r.cpu if _is_role_scope(e)]
    if scopes:
        _from_scopes(r, scopes, spans, occ, in_layer)
    else:
        _from_names(r, spans, occ, in_layer)
    _from_sequence(r, scopes, spans, occ, in_layer)
    # Time no role covers, by window: the layers' forwards, the backward (first to last autograd
    # function), the rest of the step. On a CPU trace this is host time on the critical path.
    bwd = [e for e in r.cpu if e["name"].startswith("autograd::engine::evaluate_function")]
    b0, b1 = (min(e["ts"] for e in bwd), max(e["ts"] + e.get("dur", 0) for e in bwd)) if bwd else (0, 0)
    if r.on_gpu:
        total = {"layer forward": sum(r.time_us(e) for e in _top(r) if _inside(e, spans)),
                 "backward": sum(r.time_us(e) for e in _top(r) if b0 <= e["ts"] < b1)}
        step = sum(r.time_us(e) for e in _top(r))
    else:
        total = {"layer forward": sum(b - a for a, b in spans), "backward": b1 - b0}
        step = r.t1 - r.t0
    unattr = {"layer forward": max(0.0, total["layer forward"] - occ.covered(lambda ts: any(a <= ts < b for a, b in spans))),
              "backward": max(0.0, total["backward"] - occ.covered(lambda ts: b0 <= ts < b1))}
    unattr["other"] = max(0.0, step - occ.covered(lambda ts: True) - unattr["layer forward"] - unattr["backward"])
    return occ.times, in_layer, unattr


class _Occ:
    """role -> measured times in issue order, and (start, time) of each for window sums."""

    def __init__(self):
        self.times: dict[str, list] = {}
        self.marks: list = []

    def add(self, role: str, ts: float, t: float) -> None:
        self.times.setdefault(role, []).append(t)
        self.marks.append((ts, t))

    def covered(self, where) -> float:
        return sum(t for ts, t in self.marks if where(ts))


def _top(r):
    out, end = [], -1e300
    for e in r.cpu:
        if e.get("cat") in ("cpu_op", "user_annotation") and not e["name"].startswith("ProfilerStep#") \
                and e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e.get("dur", 0)
    return out


def _inside(e, spans) -> bool:
    return any(a <= e["ts"] < b for a, b in spans)


def _from_scopes(r, scopes, spans, occ, in_layer) -> None:
    """Own time of each role scope: its time minus that of role scopes directly inside it."""
    stack: list = []    # [end, event, nested time]
    def close(item):
        end, e, nested = item
        occ.add(e["name"], e["ts"], max(0.0, r.time_us(e) - nested))
        if stack:
            stack[-1][2] += r.time_us(e)
    for e in scopes:
        while stack and e["ts"] >= stack[-1][0]:
            close(stack.pop())
        if _inside(e, spans):
            in_layer.add(e["name"])
        stack.append([e["ts"] + e.get("dur", 0), e, 0.0])
    while stack:
        close(stack.pop())


def _from_sequence(r, scopes, spans, occ, in_layer) -> None:
    """Backward functions take the role of their forward op (same sequence number) + '.bwd'."""
    fwd_role: dict = {}
    by_start = sorted(scopes, key=lambda e: e["ts"])
    for e in r.cpu:
        seq = (e.get("args") or {}).get("Sequence number")
        if seq is None or e["name"].startswith("autograd::engine") or seq in fwd_role:
            continue
        inner = [s for s in by_start if s["ts"] <= e["ts"] < s["ts"] + s.get("dur", 0)]
        if inner:
            fwd_role[seq] = inner[-1]["name"]
        elif getattr(r, "names_role", {}).get(id(e)):
            fwd_role[seq] = r.names_role[id(e)]
    for e in r.cpu:
        if not e["name"].startswith("autograd::engine::evaluate_function"):
            continue
        t = r.time_us(e)
        nested = sum(r.time_us(s) for s in scopes if e["ts"] <= s["ts"] < e["ts"] + e.get("dur", 0))
        own = max(0.0, t - nested)
        role = fwd_role.get((e.get("args") or {}).get("Sequence number"))
        if role is None or nested:
            continue
        occ.add(f"{role}.bwd", e["ts"], own)
        if role in in_layer:
            in_layer.add(f"{role}.bwd")


def _classify(name: str, launches_nccl: bool) -> str:
    n = name.lower()
    if launches_nccl or n.startswith("c10d::") or "reducefrom" in n or "all_reduce" in n:
        return "coll"
    if "norm" in n:
        return "norm"
    if "baddbmm" in n:
        return "qk"
    if "softmax" in n:
        return "softmax"
    if n == "aten::bmm":
        return "pv"
    if "scaled_dot_product" in n or "flash" in n:
        return "attention"
    if "linear" in n or n in ("aten::mm", "aten::addmm", "aten::matmul"):
        return "gemm"
    if "gelu" in n or "silu" in n or "swiglu" in n:
        return "act"
    if "compiled region" in n or n in ("aten::add", "aten::add_") or "dropout_add" in n:
        return "add"
    return "other"


def _from_names(r, spans, occ, in_layer) -> None:
    """Megatron-style forward: walk each layer's top-level ops in order and name them by role."""
    r.names_role = {}
    for a, b in spans:
        gemms = colls = norms = 0
        for e in _leaves_main(r, a, b):
            nccl = any(e["ts"] <= ts <= e["ts"] + e.get("dur", 0) and tid == e["tid"] and is_nccl
                       for ts, tid, _, is_nccl, _ in r.launches)
            kind = _classify(e["name"], nccl)
            # one to one: a GEMM role counts its GEMM kernels (a layout copy it also launched is not
            # a GEMM), a collective role its NCCL kernels, the others their non-NCCL kernels
            t = (r.time_us(e, only=GEMM_KERNEL) if kind in ("gemm", "qk", "pv") else
                 r.time_us(e, only=_NCCL) if kind == "coll" else r.time_us(e, comm=False))
            role = None
            if kind == "norm":
                role = ("input_norm", "mlp_norm")[min(norms, 1)]
                norms += 1
            elif kind == "gemm" and gemms < 4:
                role = ("qkv", "proj", "fc1", "fc2")[gemms]
                gemms += 1
            elif kind in ("qk", "pv"):
                role = f"attention.{kind}"
            elif kind == "softmax":
                role = "attention.softmax_dropout"
            elif kind == "attention":
                role = "attention"
            elif kind == "coll" and colls < 2:
                role = ("proj.all_reduce", "fc2.all_reduce")[colls]
                colls += 1
            elif kind == "act":
                role = "gelu" if "gelu" in e["name"].lower() else "swiglu"
            elif kind == "add" and colls:
                role = ("attention.dropout_add", "mlp.dropout_add")[colls - 1]
            if role is None:
                continue
            occ.add(role, e["ts"], t)
            in_layer.add(role)
            r.names_role[id(e)] = role


def _leaves_main(r, a, b):
    out, end = [], -1e300
    for e in r.ops(a, b, r.main_tid):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e.get("dur", 0)
    return out
