"""Uneven pipeline splits (comet.config.stages) and the dense model inputs they meet (Llama 3 405B)."""

import pytest

from comet.config.model import Activation, load_model
from comet.config.parallel import ParallelConfig, Schedule
from comet.config.stages import chunk_layer_counts, stage_layer_counts
from comet.errors import ConfigError


def test_llama3_paper_first_last_stage_one_layer_less():
    # Llama 3 paper sec. 3.3.2: 126 layers on pp 16, one layer less on the first and last stage.
    counts = stage_layer_counts(126, 16, first=7, last=7)
    assert counts == [7] + [8] * 14 + [7] and sum(counts) == 126


def test_embedding_and_loss_counted_as_layers_megatron():
    # Megatron-Core account_for_*_in_pipeline_split: (126 + 2) / (8 * 8) = 2 per chunk, one less on the
    # first chunk (embedding) and the last chunk (loss).
    chunks = chunk_layer_counts(126, 8, 8, embedding_as_layer=True, loss_as_layer=True)
    assert len(chunks) == 64 and sum(chunks) == 126
    assert chunks[0] == 1 and chunks[-1] == 1 and set(chunks[1:-1]) == {2}


def test_first_last_with_vpp_splits_each_stage_over_its_chunks():
    chunks = chunk_layer_counts(126, 16, 2, first=7, last=7)
    assert sum(chunks) == 126
    assert chunks[0] + chunks[16] == 7 and chunks[15] + chunks[31] == 7 and chunks[1] == chunks[17] == 4


@pytest.mark.parametrize("kw, field", [
    (dict(first=10, last=10), "pp_first_stage_layers"),        # 106 over 6 stages does not split
    (dict(embedding_as_layer=True), "pp"),                      # 127 over 8 chunks does not split
])
def test_bad_split_names_the_rule(kw, field):
    with pytest.raises(ConfigError) as err:
        if "embedding_as_layer" in kw:
            chunk_layer_counts(126, 8, **kw)
        else:
            stage_layer_counts(126, 8, **kw)
    assert err.value.field == field


def test_llama3_405b_resolves_on_pp8_and_pp16_with_and_without_vpp():
    model = load_model("llama31_405b")
    for pp, vpp, extra in ((16, 1, dict(pp_first_stage_layers=7, pp_last_stage_layers=7)),
                           (16, 2, dict(pp_first_stage_layers=7, pp_last_stage_layers=7)),
                           (8, 8, dict(pp_embedding_as_layer=True, pp_loss_as_layer=True)),
                           (8, 1, dict(pp_first_stage_layers=15, pp_last_stage_layers=15))):
        par = ParallelConfig(global_batch=2048, tp=8, pp=pp, vpp=vpp, gpus=8 * pp * 16, micro_batch=1,
                             schedule=Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B, **extra)
        par = par.resolve(model)
        assert sum(par.chunk_layers(model)) == 126
    with pytest.raises(ConfigError, match="divisible by pp"):
        ParallelConfig(global_batch=2048, tp=8, pp=16, gpus=8 * 16 * 16).resolve(model)


def test_activations_and_vocab_padding():
    assert Activation("geglu").gated and Activation("swiglu").gated
    assert not Activation("squared_relu").gated and not Activation("gelu").gated
    m = load_model("llama31_8b")
    assert m.padded_vocab(1) == 128256 and m.padded_vocab(8) == 129024   # Megatron: multiple of 128 * tp
    nemo = load_model("nemotron4_15b")
    # untied: embedding and output layer are separate matrices; squared-ReLU: 2 MLP matrices
    assert nemo.params == pytest.approx(nemo.layers * nemo.layer_params + 2 * 256000 * 6144 + 2 * 6144)
    assert 15.0e9 < nemo.params < 16.5e9   # "15B" (Parmar et al. 2024 Table 1: 12.5B non-embedding)
