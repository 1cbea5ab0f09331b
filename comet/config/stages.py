"""How the transformer layers are split over pipeline stages and virtual (interleaved) chunks.

Megatron-Core (transformer_block.py get_num_layers_to_build; arguments.py) offers three rules:
  - even: layers / (pp * vpp) per chunk;
  - --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: the first / last stage
    hold the stated counts, the other stages split the rest evenly;
  - account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split: the embedding and
    the loss count as one layer each, so (layers + 1 + 1) / (pp * vpp) per chunk and the first / last
    chunk hold one transformer layer less.
Meta's Llama 3 405B run removes one layer from the first and the last stage (Llama 3 paper sec. 3.3.2),
which is the second rule with 7 + 8*14 + 7 = 126 layers on pp 16. A stage's layers are split over its
vpp chunks as evenly as possible (earlier chunks take the remainder) when first/last counts are given;
the even rule keeps Megatron's divisibility by pp * vpp.
"""

from __future__ import annotations

from functools import lru_cache

from comet.errors import ConfigError


def stage_layer_counts(layers: int, pp: int, first: int | None = None, last: int | None = None,
                       embedding_as_layer: bool = False, loss_as_layer: bool = False, vpp: int = 1) -> list[int]:
    """Transformer layers on each pipeline stage; raises ConfigError naming the rule that fails."""
    if embedding_as_layer or loss_as_layer:
        if first is not None or last is not None:
            raise ConfigError("give either first/last stage layer counts or embedding/loss counted as layers, "
                              "not both", field="pp_first_stage_layers")
        chunks = [c for c in chunk_layer_counts(layers, pp, vpp, embedding_as_layer=embedding_as_layer,
                                                loss_as_layer=loss_as_layer)]
        return [sum(chunks[v * pp + s] for v in range(vpp)) for s in range(pp)]
    if first is None and last is None:
        if layers % (pp * vpp):   # Megatron's even split
            raise ConfigError(f"layers ({layers}) must be divisible by pp*vpp = {pp}*{vpp} = {pp * vpp} (or give "
                              "first/last stage layers, or count embedding/loss as layers)", field="pp")
        return [layers // pp] * pp
    if pp == 1:
        raise ConfigError("first/last stage layer counts need pp > 1", field="pp_first_stage_layers")
    fixed = (first or 0) + (last or 0)
    middle = pp - (first is not None) - (last is not None)
    rest = layers - fixed
    if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
        raise ConfigError(f"layers ({layers}) minus first/last stage layers ({first}, {last}) = {rest} must split "
                          f"evenly over the other {middle} stages", field="pp_first_stage_layers")
    per = rest // middle if middle else 0
    counts = [per] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


@lru_cache(maxsize=1024)   # perf: pure, read for every stage of every candidate of a search
def chunk_layer_counts(layers: int, pp: int, vpp: int = 1, first: int | None = None, last: int | None = None,
                       embedding_as_layer: bool = False, loss_as_layer: bool = False) -> tuple[int, ...]:
    """Layers per model chunk, chunk index = vchunk * pp + stage (comet.graph.ir.PipelinePlan)."""
    chunks = pp * vpp
    if embedding_as_layer or loss_as_layer:
        total = layers + int(embedding_as_layer) + int(loss_as_layer)
        if total % chunks:
            raise ConfigError(f"layers + embedding + loss ({total}) must be divisible by pp*vpp = {chunks} "
                              "when the embedding / loss count as layers", field="pp")
        out = [total // chunks] * chunks
        out[0] -= int(embedding_as_layer)
        out[-1] -= int(loss_as_layer)
        if min(out) < 0:
            raise ConfigError(f"{total // chunks} layer(s) per chunk leave no room for the embedding / loss",
                              field="pp")
        return tuple(out)
    per_stage = stage_layer_counts(layers, pp, first, last, vpp=vpp)
    out = [0] * chunks
    for s, n in enumerate(per_stage):
        for v in range(vpp):
            out[v * pp + s] = n // vpp + (1 if v < n % vpp else 0)
    return tuple(out)
