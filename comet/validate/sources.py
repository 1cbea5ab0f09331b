"""What each published source leaves implicit, and how it counts FLOPs.

A `SourceProfile` holds the defaults comet assumes where a source is silent (micro-batch, precision,
attention kernel, ZeRO stage, communication overlap) and the FLOP accounting its TFLOP/s and MFU
figures use. The rows' CSV columns always win over these defaults; the defaults are stated in
docs/validation.md. Formula sources:

- Narayanan et al., SC21 (arXiv:2104.04473) eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per
  iteration. It assumes full activation recomputation (4 passes over the layer GEMMs), so the
  reported TFLOP/s are close to hardware FLOPs.
- Korthikanti et al., MLSys23 (arXiv:2205.05198) eq. 7: model FLOPs 72*B*L*s*h^2*(1 + s/(6h) +
  v/(12*h*L)), 3 passes, no recompute term.
- Megatron-Core `num_floating_point_operations()` (training.py): the same model FLOPs, generalised
  to GQA, ffn != 4h and SwiGLU (comet.workload.flops.model_flops_per_step).
- MosaicML llm-foundry: tokens/s/GPU is compared directly (no FLOP accounting needed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from comet.config.model import ModelSpec
from comet.workload.flops import model_flops_per_step


class Accounting(str, enum.Enum):
    MODEL = "model"                        # Megatron / Korthikanti model FLOPs (no recompute term)
    NARAYANAN_RECOMPUTE = "narayanan_eq3"  # SC21 eq. 3: 4 passes over the layer GEMMs (full recompute)


@dataclass(frozen=True)
class SourceProfile:
    key: str
    label: str                      # short name for tables
    match: tuple[str, ...]          # case-insensitive substrings of the CSV `source` column
    accounting: Accounting = Accounting.MODEL
    micro_batch: int = 1
    precision: str = "bf16"
    flash_attention: bool = True
    zero: int = 1
    sequence_parallel: bool | None = None   # None: on whenever tp > 1 (Megatron-Core default)
    recompute: str = "none"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_tp_comm: bool = False
    defaults_note: str = ""


# 2021-2022 Megatron-LM on A100 (Selene): unfused attention (softmax kernels over the s x s scores),
# fp16 mixed precision, no distributed optimizer, gradient all-reduce after the backward ("No overlap
# of grad all-reduce with backprop in these runs", Korthikanti sec. 6.3), no TP overlap, and sequence
# parallelism only where the row says so (it was introduced by Korthikanti et al.).
_A100_PAPERS = dict(micro_batch=1, precision="fp16", flash_attention=False, zero=0, sequence_parallel=False,
                    overlap_grad_reduce=False, overlap_param_gather=False, overlap_tp_comm=False)

PROFILES: tuple[SourceProfile, ...] = (
    SourceProfile("narayanan", "Narayanan SC21", ("narayanan",), accounting=Accounting.NARAYANAN_RECOMPUTE,
                  recompute="full", **_A100_PAPERS,
                  defaults_note="micro-batch 1 (not in Table 1), fp16, unfused attention, ZeRO 0, no SP, "
                                "grad all-reduce not overlapped; TFLOP/s by eq. 3 (recompute counted)"),
    SourceProfile("korthikanti", "Korthikanti MLSys23", ("korthikanti",), recompute="none", **_A100_PAPERS,
                  defaults_note="fp16, unfused attention, ZeRO 0, SP only where stated, grad all-reduce not "
                                "overlapped; MFU by eq. 7 (model FLOPs) against 312 TFLOP/s"),
    SourceProfile("megatron_h100", "Megatron-LM H100", ("megatron-lm",), micro_batch=1, precision="bf16",
                  flash_attention=True, zero=1, recompute="none", overlap_tp_comm=True,
                  defaults_note="micro-batch 1, bf16, flash attention (TE), distributed optimizer (ZeRO 1), "
                                "SP with TP, --tp-comm-overlap, overlapped grad reduce and param gather, "
                                "no recompute, 1F1B without interleaving (vpp not stated)"),
    # PyTorch FSDP's forward_prefetch defaults to False and llm-foundry's benchmark configs do not set
    # it: each unit's forward waits for its own parameter all-gather (backward prefetch is on).
    SourceProfile("mosaicml", "MosaicML llm-foundry", ("mosaicml", "llm-foundry"), precision="bf16",
                  flash_attention=True, zero=3, recompute="none", overlap_param_gather=False,
                  defaults_note="FSDP FULL_SHARD = ZeRO 3 (SHARD_GRAD_OP = ZeRO 2 where the notes say so), "
                                "bf16, flash attention, no TP/PP, no forward prefetch of the parameter "
                                "all-gathers (FSDP default); tokens/s/GPU compared directly"),
)

GENERIC = SourceProfile("generic", "other", (), defaults_note="ParallelConfig defaults: micro-batch 1, bf16, "
                        "flash attention, ZeRO 1, SP with TP, no recompute; model FLOPs")


def profile_for(source: str) -> SourceProfile:
    text = source.lower()
    for prof in PROFILES:
        if any(m in text for m in prof.match):
            return prof
    return GENERIC


# ----------------------------------------------------------------------------------- FLOP formulas
def narayanan_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """SC21 eq. 3: 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)). The paper derives it for ffn = 4h; for other
    widths the 24h^2 per-token layer GEMM term is scaled to the row's actual GEMM FLOPs."""
    B, s, l, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    gemm_scale = (8 * h * h + 4 * h * model.ffn_hidden) / (24 * h * h) if not model.gated else \
        (8 * h * h + 6 * h * model.ffn_hidden) / (24 * h * h)
    return 96 * B * s * l * h * h * (gemm_scale + s / (6 * h) + V / (16 * l * h))


def flops_per_step(accounting: Accounting, model: ModelSpec, global_batch: int) -> float:
    if accounting is Accounting.NARAYANAN_RECOMPUTE:
        return narayanan_flops_per_step(model, global_batch)
    return model_flops_per_step(model, global_batch)
