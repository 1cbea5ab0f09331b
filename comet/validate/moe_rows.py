"""The mixture-of-experts columns of a measurement row (SCHEMA.md v2: moe_experts, moe_topk,
moe_shared_experts, moe_dense_layers, ep, etp, attention) applied to the dense model and parallel
configuration the row reader built.

The schema cannot express every architectural detail (MLA ranks, query head width, the FFN width of
dense layers beside the expert width in `ffn_hidden`, MoE layer frequency). When the zoo holds a MoE
model with the row's shape (hidden, heads, experts, top-k, expert FFN width), its public config fills
those details; the row's own columns (layers, seq_len, vocab, ...) still win. Without a zoo match the
row's columns alone are used and each gap is stated as an assumption.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache

from comet.config.model import ModelSpec, load_model, zoo_names
from comet.config.moe import MoESpec
from comet.config.parallel import ParallelConfig
from comet.errors import ConfigError

_CAPACITY = re.compile(r"capacity[ _-]factor[ =:]*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


def _int(row: dict, key: str) -> int | None:
    text = (row.get(key) or "").strip()
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"must be a number, got {text!r}", field=key) from None
    if value != int(value) or value < 0:
        raise ConfigError(f"must be a non-negative integer, got {text!r}", field=key)
    return int(value)


@lru_cache(maxsize=1)
def _zoo_moe_models() -> tuple[ModelSpec, ...]:
    out = []
    for name in zoo_names():
        spec = load_model(name)
        if spec.moe is not None:
            out.append(spec)
    return tuple(out)


def zoo_match(hidden: int, heads: int, experts: int, topk: int, expert_ffn: int) -> ModelSpec | None:
    """The zoo MoE model with exactly this shape, if there is one."""
    hits = [m for m in _zoo_moe_models()
            if (m.hidden, m.heads, m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_ffn_hidden)
            == (hidden, heads, experts, topk, expert_ffn)]
    return hits[0] if len(hits) == 1 else None


def is_moe_row(row: dict) -> bool:
    return (_int(row, "moe_experts") or 0) > 1


def apply_moe(row: dict, model: ModelSpec, notes: list[str]) -> ModelSpec:
    """`model` (built from the dense columns) with the row's experts; unchanged for a dense row."""
    if not is_moe_row(row):
        return model
    experts, topk = _int(row, "moe_experts"), _int(row, "moe_topk")
    if topk is None:
        raise ConfigError("a MoE row (moe_experts > 1) needs moe_topk", field="moe_topk")
    expert_ffn = model.ffn_hidden      # SCHEMA.md: for MoE, ffn_hidden is one expert's FFN width
    zoo = zoo_match(model.hidden, model.heads, experts, topk, expert_ffn)
    shared, dense = _int(row, "moe_shared_experts"), _int(row, "moe_dense_layers")
    if zoo is not None:
        notes.append(f"architecture details (attention, head width, dense-layer FFN, MoE layer pattern, biases) "
                     f"from the zoo's {zoo.name}")
        moe = replace(zoo.moe, shared_experts=zoo.moe.shared_experts if shared is None else shared,
                      dense_layers=zoo.moe.dense_layers if dense is None else min(dense, model.layers - 1))
        if moe.shared_experts != zoo.moe.shared_experts:
            moe = replace(moe, shared_ffn_hidden=moe.shared_experts * moe.expert_ffn_hidden)
        return replace(model, moe=moe, mla=zoo.mla, head_dim=zoo.head_dim, ffn_hidden=zoo.ffn_hidden,
                       kv_heads=zoo.kv_heads, activation=zoo.activation, tied_embeddings=zoo.tied_embeddings,
                       linear_bias=zoo.linear_bias)
    if (row.get("attention") or "").lower() == "mla":
        notes.append("MLA ranks not given and no zoo model of this shape: attention modelled as MHA")
    notes.append("dense layers (if any) use the expert FFN width; every layer after them is MoE")
    moe = MoESpec(num_experts=experts, experts_per_token=topk, expert_ffn_hidden=expert_ffn,
                  shared_experts=shared or 0, dense_layers=min(dense or 0, model.layers - 1))
    return replace(model, moe=moe)


def apply_expert_parallel(row: dict, par: ParallelConfig, notes: list[str]) -> ParallelConfig:
    """ep / etp and the token-dropping setting of the row. An empty etp takes the framework's default:
    Megatron-Bridge recipes set expert_tensor_parallel_size 1; Megatron-Core / NeMo otherwise default it
    to tp (and before ETP existed experts were always split over the TP group)."""
    ep = _int(row, "ep") or 1
    etp = _int(row, "etp")
    if etp is None and is_moe_row(row):
        etp = 1 if (row.get("framework") or "").lower() == "megatron-bridge" else par.tp
        notes.append(f"etp {etp} (source silent; framework default)")
    capacity = None
    m = _CAPACITY.search(row.get("notes", ""))
    if m and "dropless" not in row.get("model", "").lower():
        capacity = float(m.group(1))
        notes.append(f"capacity factor {capacity:g} with padding to capacity (from the notes)")
    return replace(par, ep=ep, etp=etp, moe_capacity_factor=capacity)
