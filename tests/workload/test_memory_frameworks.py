"""Memory of today's PyTorch stacks, hand-computed on a tiny model: the cross-entropy's logits by loss
implementation, and FSDP's fp32 shard (the master copy) with its root module gathered for the step."""

from __future__ import annotations


import pytest

from comet.config.parallel import ParallelConfig
from comet.errors import ConfigError
from comet.validate.frameworks import defaults_for
from comet.workload.memory import estimate_memory


# 2 layers, h 64, 4 heads, ffn 256 (GeLU), vocab 1000 untied, no biases, s 128.
# Layer: attention 4h^2 = 16,384 + MLP 2hf = 32,768 + norms 4h = 256 -> 49,408 parameters.
# One GPU at tp 1, pp 1: 2 layers 98,816 + embedding 64,000 + output 64,000 + final norm 2h = 128 -> 226,944.
LAYER, PARAMS, LAYERS = 49_408, 226_944, 98_816



def _par(model, **kw) -> ParallelConfig:
    base = dict(global_batch=8, tp=1, pp=1, dp=4, micro_batch=2, zero=3, fsdp=True)
    base.update(kw)
    return ParallelConfig(**base).resolve(model)


def test_tiny_model_parameter_count(tiny):
    assert tiny.layer_params == LAYER
    assert 2 * LAYER + 2 * 1000 * 64 + 2 * 64 == PARAMS


def test_eager_cross_entropy_holds_three_fp32_copies_of_the_logits(tiny, h100):
    """Fused: 4 B per logit; eager F.cross_entropy(pred.float()): 12 B. Logits s*b*V = 128*2*1000 = 256,000,
    so eager holds 8 * 256,000 = 2,048,000 bytes more at the start of the backward."""
    fused = estimate_memory(tiny, _par(tiny, loss_impl="fused"), h100)
    eager = estimate_memory(tiny, _par(tiny, loss_impl="eager"), h100)
    assert (eager.activations_GB - fused.activations_GB) * 1e9 == pytest.approx(2_048_000, rel=1e-9)
    assert eager.total_GB - fused.total_GB == pytest.approx(2_048_000 / 1e9, rel=1e-9)


def test_fsdp_shard_is_the_fp32_master_and_the_root_stays_gathered(tiny, h100):
    """dp 4, ZeRO-3. FSDP: fp32 shard 4P/4 = 226,944 + two gathered bf16 layers 2*2*49,408 = 197,632 + the
    root (embedding, output, final norm: 128,128 parameters) gathered in bf16 256,256 -> 680,832 weight
    bytes; Adam m, v 8P/4 = 453,888. A ZeRO-3 that is not FSDP (DeepSpeed): bf16 shard 2P/4 = 113,472 +
    two layers 197,632 = 311,104; fp32 master + m + v 12P/4 = 680,832. Gradients fp32 4P/4 in both."""
    fsdp = estimate_memory(tiny, _par(tiny), h100)
    zero3 = estimate_memory(tiny, _par(tiny, fsdp=False), h100)
    assert fsdp.weights_GB * 1e9 == pytest.approx(680_832, rel=1e-9)
    assert fsdp.optimizer_GB * 1e9 == pytest.approx(453_888, rel=1e-9)
    assert zero3.weights_GB * 1e9 == pytest.approx(311_104, rel=1e-9)
    assert zero3.optimizer_GB * 1e9 == pytest.approx(680_832, rel=1e-9)
    assert fsdp.gradients_GB * 1e9 == zero3.gradients_GB * 1e9 == pytest.approx(226_944, rel=1e-9)


def test_fsdp_with_bf16_optimizer_state_keeps_the_separate_master_count(tiny, h100):
    """The fp32-shard rule is for fp32 Adam state; bf16 state (6 B) keeps comet's bf16 shard + state."""
    mem = estimate_memory(tiny, _par(tiny, optimizer_dtype="bf16"), h100)
    assert mem.optimizer_GB * 1e9 == pytest.approx(6 * PARAMS / 4, rel=1e-9)
    assert mem.weights_GB * 1e9 == pytest.approx(2 * PARAMS / 4 + 2 * 2 * LAYER, rel=1e-9)


@pytest.mark.parametrize("version, loss", [
    ("torchtitan 0.0.2, torchao 0.10.0+git890e0ac8, PyTorch 2.7.0a0+gitb98af95", "eager"),
    ("torchtitan, Aug 2024 (docs/performance.md @ 3faaa1a0)", "eager"),
    ("torchtitan e7c0cae (torch 2.8.0a0 NGC 25.05, torchao 0afa4c1)", "fused"),
    ("torchtitan 0.1.0", "fused"),
    ("", "fused"),
])
def test_torchtitan_loss_by_version(version, loss):
    assert defaults_for("torchtitan", version).loss_impl == loss


def test_other_frameworks_keep_the_fused_loss():
    # Megatron-LM runs Megatron-Core's unfused loss by default (loss_impl megatron, same 4 B per logit held:
    # tests/workload/test_loss_traffic.py)
    assert {defaults_for(f).loss_impl for f in ("nemo", "llm-foundry", "deepspeed", "")} == {"fused"}


def test_unknown_loss_implementation_is_a_config_error(tiny):
    with pytest.raises(ConfigError, match="loss_impl"):
        _par(tiny, loss_impl="chunked")


def test_megatron_fsdp_keeps_a_bf16_shard_beside_the_fp32_main_weights(tiny, h100):
    """Megatron-FSDP: bf16 shard 2P/4 + two gathered layers = 311,104 and fp32 main + m + v 12P/4 = 680,832,
    as ZeRO-3 without FSDP; no root kept gathered."""
    mem = estimate_memory(tiny, _par(tiny, fsdp_impl="megatron"), h100)
    assert mem.weights_GB * 1e9 == pytest.approx(311_104, rel=1e-9)
    assert mem.optimizer_GB * 1e9 == pytest.approx(680_832, rel=1e-9)
    assert {defaults_for(f).fsdp_impl for f in ("megatron-lm", "nemo", "megatron-bridge")} == {"megatron"}
    assert {defaults_for(f).fsdp_impl for f in ("torchtitan", "llm-foundry", "automodel", "maxtext")} == {"torch"}
