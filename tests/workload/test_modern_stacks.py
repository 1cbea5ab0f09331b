"""Memory and FP8 physics of today's stacks: TE FP8 caches, BF16 gradients, no dropout masks, the fit
margin, and the BF16 output layer under FP8."""

from dataclasses import replace

import pytest

from comet.config.model import load_model
from comet.config.parallel import ParallelConfig, Precision
from comet.graph.ir import KernelClass
from comet.workload import layers
from comet.workload.memory import FIT_MARGIN, _state_bytes, activation_bytes_per_layer, estimate_memory, stage_params


@pytest.fixture(scope="module")
def llama():
    return load_model("llama31_8b")


def _par(**kw):
    base = dict(global_batch=8, tp=1, pp=1, gpus=8, micro_batch=1, zero=1)
    base.update(kw)
    return ParallelConfig(**base)


def test_te_fp8_weight_caches_and_fp8_params(llama):
    bf16 = _par().resolve(llama)
    fp8 = _par(precision=Precision.FP8).resolve(llama)
    fp8p = _par(precision=Precision.FP8, fp8_params=True).resolve(llama)
    gemm = llama.layers * llama.layer_params
    rest = stage_params(llama, bf16, 0) - gemm
    w = lambda p: _state_bytes(llama, p, 0)[0]   # noqa: E731
    assert w(bf16) == pytest.approx(2 * (gemm + rest))
    assert w(fp8) == pytest.approx(4 * gemm + 2 * rest)          # BF16 + FP8 copy + FP8 transpose
    assert w(fp8p) == pytest.approx(2 * gemm + 2 * rest)         # FP8 copy + transpose only
    torchao = _par(precision=Precision.FP8, fp8_impl="torchao").resolve(llama)
    assert w(torchao) == pytest.approx(w(bf16))                  # casts on the fly, no cache


def test_bf16_gradients_and_no_dropout_masks(llama):
    fp32 = _par().resolve(llama)
    bf16 = _par(grad_dtype="bf16").resolve(llama)
    assert _state_bytes(llama, bf16, 0)[1] == pytest.approx(_state_bytes(llama, fp32, 0)[1] / 2)
    masks = activation_bytes_per_layer(llama, fp32) - activation_bytes_per_layer(llama, replace(fp32, dropout=False))
    assert masks == pytest.approx(2 * llama.seq_len * llama.hidden)   # two 1-byte masks of s*b*h


def test_fit_margin_keeps_tight_configurations(llama, h100):
    par = _par().resolve(llama)
    need = estimate_memory(llama, par, h100).total_GB
    just_over = replace(h100, gpu=replace(h100.gpu, hbm_GB=need / (1 + FIT_MARGIN / 2)))
    mem = estimate_memory(llama, par, just_over)
    assert mem.fits and mem.tight
    too_small = replace(h100, gpu=replace(h100.gpu, hbm_GB=need / (1 + 2 * FIT_MARGIN)))
    assert not estimate_memory(llama, par, too_small).fits


def test_output_layer_stays_bf16_and_fp8_gemms_pay_casts(llama):
    par = _par(precision=Precision.FP8).resolve(llama)
    head = layers.head_forward(llama, par)
    logits = [op for _, op in head.nodes(data="op") if op.kernel is KernelClass.GEMM]
    assert logits and all(op.dtype_bytes == 2 for op in logits)
    fwd = layers.layer_forward(llama, par)
    gemms = [op for _, op in fwd.nodes(data="op") if op.kernel is KernelClass.GEMM]
    casts = [op for _, op in fwd.nodes(data="op") if op.name.endswith("fp8_cast_transpose")]
    assert all(op.dtype_bytes == 1 for op in gemms) and len(casts) == len(gemms)


def _cast_bytes(graph) -> float:
    return sum(op.bytes for _, op in graph.nodes(data="op") if ".fp8_" in op.name)


def test_torchao_dynamic_scaling_casts(llama):
    """torchao: amax + cast (5 B/element) of input and weight forward; at the dgrad the output gradient
    twice, the weight transposed and the input along dim1; no cast at the wgrad. TE: one fused
    cast + transpose (4 B/element) of the m x k operand, forward and dgrad."""
    te = _par(precision=Precision.FP8).resolve(llama)
    ao = replace(te, fp8_impl="torchao")
    T, h, f = llama.seq_len, llama.hidden, llama.ffn_hidden
    qkv_out = llama.q_hidden + 2 * llama.kv_hidden
    # forward GEMMs (m x n x k): qkv, proj, fc1 (gated: 2f wide), fc2
    shapes = [(T, qkv_out, h), (T, h, llama.q_hidden), (T, 2 * f, h), (T, h, f)]
    fwd_te = sum(4 * m * k for m, n, k in shapes)
    fwd_ao = sum(5 * (m * k + k * n) for m, n, k in shapes)
    assert _cast_bytes(layers.layer_forward(llama, te)) == pytest.approx(fwd_te)
    assert _cast_bytes(layers.layer_forward(llama, ao)) == pytest.approx(fwd_ao)
    # dgrad of (m x n x k) forward: grad m x n (twice), input m x k along dim1, weight k x n transposed
    bwd_ao = sum(5 * (2 * m * n + m * k + k * n) for m, n, k in shapes)
    assert _cast_bytes(layers.layer_backward(llama, ao)) == pytest.approx(bwd_ao)
    assert _cast_bytes(layers.layer_backward(llama, te)) == pytest.approx(sum(4 * m * n for m, n, k in shapes))


def test_fa2_attention_kernels_are_slower_on_hopper_only(llama, h100, a100):
    from comet.hardware.compute import attention_time_s
    flops = 1e15   # seconds of work: the per-kernel overhead is negligible
    for backward, fused in ((False, h100.efficiency.attention_fwd), (True, h100.efficiency.attention_bwd)):
        ratio = attention_time_s(flops, backward, h100, "fa2") / attention_time_s(flops, backward, h100)
        assert ratio == pytest.approx(fused / h100.efficiency.attention_fa2, rel=1e-3)
        assert ratio > 1
        # A100: FlashAttention-2 is the native kernel (attention_fa2 unset): no change
        assert attention_time_s(flops, backward, a100, "fa2") == attention_time_s(flops, backward, a100)
    par = _par(attention_kernel="fa2").resolve(llama)
    att = [op for _, op in layers.layer_forward(llama, par).nodes(data="op") if op.kernel is KernelClass.ATTENTION]
    assert att and all(op.variant == "fa2" for op in att)
    with pytest.raises(Exception, match="attention_kernel"):
        _par(attention_kernel="fa3").resolve(llama)
