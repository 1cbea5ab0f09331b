"""How a source counted FLOPs for its TFLOP/s and MFU figures (the `flops_formula` column).

- megatron_model: Korthikanti et al. MLSys23 eq. 7 / Megatron-Core `num_floating_point_operations()`
  (training.py): 3 passes over the layer GEMMs, attention over the full s x s square, logits; no
  recompute term; generalised to GQA and gated MLPs (comet.workload.flops.model_flops_per_step).
- narayanan_eq3: Narayanan et al. SC21 (arXiv:2104.04473) eq. 3: 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)),
  which counts full recomputation (4 passes over the layer GEMMs).
- palm_6n: Chowdhery et al. 2022 (PaLM) App. B: 6N + 12*L*h*s per token, N without embeddings
  (torchtitan, MaxText and the Llama 3 paper use it).
- llm_foundry: MosaicML llm-foundry `flops_per_batch`: 6N + 12*L*h*s per token with N including the
  embedding.
"""

from __future__ import annotations

from comet.config.model import ModelSpec
from comet.workload.flops import model_flops_per_step


def narayanan_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """SC21 eq. 3, derived for ffn = 4h; for other widths the 24h^2 per-token layer GEMM term is scaled
    to the row's actual GEMM FLOPs."""
    B, s, l, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.padded_vocab()
    gemm_scale = (8 * h * h + (6 if model.gated else 4) * h * model.ffn_hidden) / (24 * h * h)
    return 96 * B * s * l * h * h * (gemm_scale + s / (6 * h) + V / (16 * l * h))


def six_n_flops_per_step(model: ModelSpec, global_batch: int, with_embedding: bool) -> float:
    n = model.layers * model.layer_params + (model.embedding_params if with_embedding else 0)
    per_token = 6 * n + 12 * model.layers * model.hidden * model.seq_len
    return per_token * global_batch * model.seq_len


def flops_per_step(formula: str, model: ModelSpec, global_batch: int) -> float:
    if formula == "narayanan_eq3":
        return narayanan_flops_per_step(model, global_batch)
    if formula == "palm_6n":
        return six_n_flops_per_step(model, global_batch, with_embedding=False)
    if formula == "llm_foundry":
        return six_n_flops_per_step(model, global_batch, with_embedding=True)
    return model_flops_per_step(model, global_batch)
