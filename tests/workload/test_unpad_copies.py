"""Copies into and out of flash-attn's packed (varlen) layout (ParallelConfig.attention_unpad), hand-computed on
the tiny model (tests/workload/conftest.py: h 64, 4 heads of 16, MHA, s 128) at micro-batch 2, tp 1:
T = 256 tokens, Q = K = V = output = 256 x 64 = 16,384 elements of 2 bytes."""

from __future__ import annotations

import pytest

from comet.config.parallel import ParallelConfig
from comet.validate.frameworks import defaults_for
from comet.workload.layers import layer_backward, layer_forward

ELEMENTS = 256 * 64


def _par(model, unpad: bool) -> ParallelConfig:
    return ParallelConfig(global_batch=8, tp=1, pp=1, dp=4, micro_batch=2, attention_unpad=unpad).resolve(model)


def _ops(block) -> dict:
    return {d["op"].name: d["op"] for _, d in block.nodes(data=True)}


def test_unpad_copies_around_the_attention_kernel(tiny):
    fwd, bwd = _ops(layer_forward(tiny, _par(tiny, True))), _ops(layer_backward(tiny, _par(tiny, True)))
    # forward: Q, K, V gathered (read 2 + write 2 each) = 3 x 4 x 16,384; output zero-filled and scattered
    # into (2 + 2 + 2) = 6 x 16,384
    assert fwd["attention.unpad_qkv"].bytes == 12 * ELEMENTS
    assert fwd["attention.pad_output"].bytes == 6 * ELEMENTS
    # backward: output gradient gathered (2 + 2); Q, K, V gradients zero-filled and scattered (3 x 6)
    assert bwd["attention.pad_grad_gather"].bytes == 4 * ELEMENTS
    assert bwd["attention.unpad_qkv.bwd"].bytes == 18 * ELEMENTS


def test_no_copies_without_unpad(tiny):
    names = set(_ops(layer_forward(tiny, _par(tiny, False)))) | set(_ops(layer_backward(tiny, _par(tiny, False))))
    assert not {n for n in names if "unpad" in n or "pad_" in n}


def test_unpad_copies_cost_the_hbm_time_of_their_bytes(tiny, h100):
    """Forward plus backward: (12 + 6 + 4 + 18) x 16,384 bytes more, four more memory-bound kernels."""
    from comet.replay.blocks import time_block
    from comet.workload.builder import build_step_graph
    from comet.hardware.compute import memory_time_s
    extra = 0.0
    for unpad, sign in ((True, 1), (False, -1)):
        g = build_step_graph(tiny, _par(tiny, unpad))
        extra += sign * sum(time_block(g.blocks[b], h100, "bf16").duration_s for b in ("layer.fwd", "layer.bwd"))
    per_kernel = [12, 6, 4, 18]
    assert extra == pytest.approx(sum(memory_time_s(b * ELEMENTS, h100) for b in per_kernel), rel=1e-6)


def test_llm_foundry_unpads_others_do_not():
    """llm-foundry 0.3.0-0.8.0 llmfoundry/models/layers/attention.py flash_attn_fn: bert_padding
    unpad_input / index_first_axis on Q, K, V and pad_input on the output, in every layer."""
    assert defaults_for("llm-foundry").attention_unpad
    assert not any(defaults_for(f).attention_unpad for f in ("megatron-lm", "nemo", "torchtitan", "maxtext", ""))
