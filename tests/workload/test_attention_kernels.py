"""Attention kernels by stack generation (FlashAttention-2 class before Hopper-native kernels) and the
ring-attention merge traffic of context parallelism (Transformer Engine AttnFuncWithCP)."""

import pytest

from comet.config.model import load_model
from comet.config.parallel import ParallelConfig
from comet.graph.ir import KernelClass
from comet.validate.frameworks import HOPPER_ATTENTION_SINCE, defaults_for, release_month
from comet.validate.rows import derive_case
from comet.workload import layers
from comet.workload.block_builder import Dims


@pytest.mark.parametrize("version, when", [
    ("NeMo 24.03.01 container", (2024, 3)),
    ("NVIDIA MLPerf v3.1 GPT-3 implementation (NeMo/Megatron) NGC 23.09", (2023, 9)),
    ("jax:25.01-maxtext-py3", (2025, 1)),
    ("jax:maxtext-2024-12-09", (2024, 12)),
    ("Megatron-LM (MLSys23 paper, 2022)", (2022, 0)),
    ("Megatron-Core r0.8.0 (README H100 benchmark section)", None),          # r0.8 is no YY.MM tag
    ("torchtitan 0.0.2, torchao 0.10.0+git890e0ac8, PyTorch 2.7.0a0", None),
    ("NVIDIA MLPerf v3.0 GPT-3 implementation (NeMo/Megatron)", None),       # v3.0 is no date
])
def test_release_month_reads_container_tags_and_dates(version, when):
    assert release_month(version) == when


def test_attention_kernel_class_follows_the_stack_generation():
    before, after = "NeMo 24.03.01 container", "NeMo 24.09 container"
    assert release_month(before) < HOPPER_ATTENTION_SINCE <= release_month(after)
    assert defaults_for("nemo", before).attention_kernel == "fa2"
    assert "attention_kernel" in defaults_for("nemo", before).notes
    assert defaults_for("nemo", after).attention_kernel == "fused"
    assert defaults_for("nemo", "").attention_kernel == "fused"                # undated: today's default
    assert defaults_for("megatron-bridge", "NeMo 25.09 container").attention_kernel == "fused"
    # unfused attention (2021-22 Megatron-LM) stays unfused; FA2 stacks stay FA2 whatever their date
    old = defaults_for("megatron-lm", "Megatron-LM (SC21 paper, 2021)")
    assert not old.flash_attention and old.attention_kernel == "fused"
    assert defaults_for("torchtitan", "NGC 25.05").attention_kernel == "fa2"
    # a bare year of the cut-off year does not decide
    assert defaults_for("nemo", "NeMo 2024").attention_kernel == "fused"
    assert defaults_for("meta-internal", "").attention_kernel == "fa2"


def test_validate_row_reports_the_kernel_assumption():
    row = dict(model="Llama 2 7B", layers="32", hidden="4096", heads="32", kv_heads="32", ffn_hidden="11008",
               activation="swiglu", seq_len="16384", vocab="32000", tied_embeddings="False",
               gpu_model="h100-sxm-80gb", num_gpus="16", tp="2", pp="1", dp="8", cp="1", global_batch="256",
               precision="fp8", framework="nemo", metric="tflops_per_gpu", flops_formula="megatron_model",
               value="660")
    old = derive_case({**row, "framework_version": "NeMo 24.03.01 container"}, 0)
    new = derive_case({**row, "framework_version": "NeMo 25.02.01 container"}, 1)
    assert old.parallel.attention_kernel == "fa2" and new.parallel.attention_kernel == "fused"
    assert any(a.startswith("attention_kernel=fa2 (nemo default: stack dated 2024-03") for a in old.assumptions)
    assert not any(a.startswith("attention_kernel") for a in new.assumptions)


def _ops(graph, prefix):
    return [op for _, op in graph.nodes(data="op") if op.name.startswith(prefix)]


@pytest.mark.parametrize("cp", [1, 4])
def test_ring_attention_merges_each_step_into_the_result(cp):
    model = load_model("llama31_8b")
    par = ParallelConfig(global_batch=8, tp=2, pp=1, cp=cp, gpus=8 * cp, micro_batch=1).resolve(model)
    D = Dims.of(model, par)
    fwd, bwd = layers.layer_forward(model, par), layers.layer_backward(model, par)
    steps = [op for op in _ops(fwd, "attention[") if op.kernel is KernelClass.ATTENTION]
    merges_f, merges_b = _ops(fwd, "attention.cp_merge"), _ops(bwd, "attention.bwd.cp_merge")
    if cp == 1:
        assert not steps and not merges_f and not merges_b
        return
    assert len(steps) == len(merges_f) == len(merges_b) == cp
    out = D.T * D.heads * D.d * 2                     # this rank's attention output, bf16
    kv = D.T * 2 * (D.kv // D.t) * 2                  # its K and V (and their gradients), bf16
    assert merges_f[0].bytes == pytest.approx(2 * out)                # step 0 writes the output
    assert all(op.bytes == pytest.approx(3 * out) for op in merges_f[1:])
    assert merges_b[0].bytes == pytest.approx(2 * (out + kv))        # step 0 copies dq / dkv
    assert all(op.bytes == pytest.approx(3 * (out + kv)) for op in merges_b[1:])
    # the merges are small beside the attention they follow (long chunks: flops per byte ~ s / cp)
    assert sum(op.bytes for op in merges_f) < 0.01 * sum(op.flops for op in steps)
