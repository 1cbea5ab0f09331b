"""HBM traffic of the cross-entropy by implementation and of the embedding's weight gradient, hand-computed
on a tiny model (tests/workload/conftest.py: vocab 1000 untied, no padding, s 128), micro-batch 2 at tp 2:
logits per rank T x V/t = 256 x 500 = 128,000."""

from __future__ import annotations

import pytest

from comet.config.parallel import ParallelConfig
from comet.validate.frameworks import defaults_for
from comet.workload.layers import head_backward, head_forward

LOGITS = 256 * 500


def _bytes(block, name: str) -> float:
    return next(d["op"].bytes for _, d in block.nodes(data=True) if d["op"].name == name)


def _par(model, loss_impl: str) -> ParallelConfig:
    return ParallelConfig(global_batch=8, tp=2, pp=1, dp=2, micro_batch=2, loss_impl=loss_impl).resolve(model)


@pytest.mark.parametrize("loss_impl, forward, backward", [
    # Megatron-Core unfused: cast 2+4, max 4, subtract 4+4, exp 4+4, sum 4, divide 4+4 = 38;
    # backward mul_ 4+4, cast back 4+2 = 14
    ("megatron", 38, 14),
    # PyTorch eager F.cross_entropy(pred.float()): cast 2+4, log_softmax 4+4 = 14;
    # backward nll zero gradient 4, log_softmax backward 4+4+4, cast back 4+2 = 22
    ("eager", 14, 22),
    # one fused pass: 2 + 4 + 4 = 10; backward 4 + 2 = 6 (unchanged)
    ("fused", 10, 6),
])
def test_cross_entropy_bytes_by_implementation(tiny, loss_impl, forward, backward):
    par = _par(tiny, loss_impl)
    assert _bytes(head_forward(tiny, par), "cross_entropy") == forward * LOGITS
    assert _bytes(head_backward(tiny, par), "cross_entropy.bwd") == backward * LOGITS


def test_unfused_megatron_loss_costs_more_time_than_fused(tiny, h100):
    """Same logits, 38 + 14 = 52 against 10 + 6 = 16 bytes each: the memory-bound loss kernels take
    52/16 of the fused ones' transfer time (kernel overheads aside)."""
    from comet.hardware.compute import memory_time_s
    t = {impl: memory_time_s(b * LOGITS, h100) for impl, b in (("megatron", 52), ("fused", 16))}
    overhead = h100.efficiency.kernel_overhead_us * 1e-6
    assert (t["megatron"] - overhead) / (t["fused"] - overhead) == pytest.approx(52 / 16, rel=1e-9)


def test_megatron_lm_defaults_to_the_unfused_loss():
    """megatron-core 0.8.0 model_parallel_config.py: cross_entropy_loss_fusion = False; Megatron-LM of the
    2021-22 papers runs the same steps (mpu vocab_parallel_cross_entropy on output.float())."""
    assert defaults_for("megatron-lm", "Megatron-Core r0.8.0").loss_impl == "megatron"
    assert defaults_for("megatron-lm", "2021").loss_impl == "megatron"
    assert "cross_entropy_loss_fusion" in defaults_for("megatron-lm").notes["loss_impl"]


def _names(block) -> set:
    return {d["op"].name for _, d in block.nodes(data=True)}


def test_embedding_weight_gradient_is_dense_and_added_to_the_main_gradient(tiny):
    """F.embedding's backward zero-fills a V/t x h = 500 x 64 16-bit gradient (64,000 B) and accumulates
    the T = 256 rows into it (256 x 64 x 2 B read, 2 + 2 read-modify-write: 98,304 B); Megatron's DDP hook
    then adds it into the fp32 main gradient: 500 x 64 x (4 + 2 + 4) = 320,000 B."""
    from comet.workload.layers import embedding_backward
    block = embedding_backward(tiny, _par(tiny, "fused"))
    assert _bytes(block, "embedding.grad_scatter_add") == 64_000 + 98_304
    assert _bytes(block, "embedding.main_grad_add") == 320_000


def test_pytorch_fsdp_has_no_main_gradient_add(tiny):
    from comet.workload.layers import embedding_backward
    par = ParallelConfig(global_batch=8, tp=1, pp=1, dp=4, micro_batch=2, zero=3, fsdp=True).resolve(tiny)
    block = embedding_backward(tiny, par)
    assert "embedding.main_grad_add" not in _names(block)
    # tp 1: V x h = 1000 x 64 zero-filled (128,000 B) plus the 256 rows (98,304 B)
    assert _bytes(block, "embedding.grad_scatter_add") == 128_000 + 98_304
