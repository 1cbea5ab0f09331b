"""Megatron-Core recompute modules (comet/workload/recompute_modules.py): what each frees and re-runs,
against hand counts on a tiny MLA + MoE model."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings, strategies as st

from comet.config.model import ModelSpec
from comet.config.moe import MLASpec, MoESpec
from comet.config.parallel import ParallelConfig, Recompute, RecomputeModule, SelectivePolicy
from comet.errors import ConfigError
from comet.graph.ir import KernelClass, ops
from comet.validate.frameworks import defaults_for
from comet.validate.memory_knobs import LADDER
from comet.workload.builder import build_step_graph
from comet.workload.flops import hardware_flops_per_step
from comet.workload.memory import activation_bytes_per_layer

# 2 MoE layers of 8 experts (FFN 128) top-2, MLA with q latent 32, kv latent 16, rope 8, nope 16, v 16.
TINY = ModelSpec(name="tiny_mla_moe", layers=2, hidden=64, heads=4, vocab=256, seq_len=32, ffn_hidden=256,
                 activation="swiglu", tied_embeddings=False, linear_bias=False, vocab_pad_to=1,
                 moe=MoESpec(num_experts=8, experts_per_token=2, expert_ffn_hidden=128),
                 mla=MLASpec(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=32))
ALL = tuple(RecomputeModule)


def _par(**kw) -> ParallelConfig:
    base = dict(global_batch=8, tp=1, pp=1, dp=8, micro_batch=1, ep=4, recompute=Recompute.SELECTIVE)
    base.update(kw)
    return ParallelConfig(**base).resolve(TINY)


# One layer and micro-batch on one rank, bf16, tp 1: 32 tokens of h = 64.
FREED = {
    RecomputeModule.LAYERNORM: 2 * 32 * 64 * 2,          # MLA input norm out + MoE pre-MLP norm out
    RecomputeModule.MLA_UP_PROJ: 2 * 32 * 4 * (2 * 24 + 16),   # Q, K (nope+rope 24) and V (16), 4 heads
    RecomputeModule.MOE_ACT: 2 * (32 * 2) * 128,         # FC2 input: 32 tokens x top-2 rows of FFN 128
}


@pytest.mark.parametrize("module", ALL)
def test_each_module_frees_its_hand_counted_bytes(module):
    kept = activation_bytes_per_layer(TINY, _par(), moe_layer=True)
    assert kept - activation_bytes_per_layer(TINY, _par(recompute_modules=(module,)), moe_layer=True) == FREED[module]


def test_modules_add_up_and_a_dense_non_mla_layer_frees_nothing():
    kept = activation_bytes_per_layer(TINY, _par(), moe_layer=True)
    assert kept - activation_bytes_per_layer(TINY, _par(recompute_modules=ALL), moe_layer=True) == sum(FREED.values())
    plain = ModelSpec(name="tiny_dense", layers=2, hidden=64, heads=4, vocab=256, seq_len=32, ffn_hidden=256,
                      activation="swiglu", vocab_pad_to=1)
    par = ParallelConfig(global_batch=8, dp=8, recompute=Recompute.SELECTIVE, recompute_modules=ALL).resolve(plain)
    # TE fuses a dense layer's norms into its linears and there is no MLA or expert: Megatron ignores them
    assert activation_bytes_per_layer(plain, par) == activation_bytes_per_layer(
        plain, ParallelConfig(global_batch=8, dp=8, recompute=Recompute.SELECTIVE).resolve(plain))


def test_recompute_block_reruns_the_modules_and_their_gemm_flops():
    block = build_step_graph(TINY, _par(recompute_modules=ALL)).blocks["moe_layer.recompute"]
    names = [op.name for _, op in ops(block)]
    assert names == ["input_norm", "q_norm", "q_up", "kv_norm", "kv_up", "rope", "mlp_norm", "experts.swiglu"]
    gemm = sum(op.flops for _, op in ops(block) if op.kernel is KernelClass.GEMM)
    assert gemm == 2 * 32 * (32 * 4 * 24 + 16 * 4 * (16 + 16))     # q_up and kv_up of 32 tokens
    # the step's hardware FLOPs grow by the same up projections, every layer, every token of the batch
    extra = hardware_flops_per_step(TINY, _par(recompute_modules=ALL)) - hardware_flops_per_step(TINY, _par())
    assert extra == 8 * 32 * 2 * 2 * (32 * 4 * 24 + 16 * 4 * (16 + 16))
    assert list(ops(build_step_graph(TINY, _par()).blocks["moe_layer.recompute"])) == []   # flash: nothing


def test_modules_need_megatron_selective_recompute():
    with pytest.raises(ConfigError) as err:
        _par(recompute=Recompute.NONE, recompute_modules=(RecomputeModule.MOE_ACT,))
    assert err.value.field == "recompute_modules"
    assert "mb1-selective+moe_act-z1" in _par(recompute_modules=(RecomputeModule.MOE_ACT,)).label()


def test_frameworks_with_recompute_modules_and_the_ladder_step():
    assert defaults_for("nemo", "NeMo 25.04.01 container").recompute_modules          # mcore 0.12
    assert not defaults_for("nemo", "NeMo 24.12 container").recompute_modules         # mcore 0.10
    assert defaults_for("megatron-bridge", "NeMo 25.09 container").recompute_modules
    assert not defaults_for("megatron-lm", "").recompute_modules
    step = next(s for s in LADDER if s.knob == "recompute_modules")
    par = ParallelConfig(global_batch=8, dp=8)
    assert step.applies(par, defaults_for("megatron-bridge"))
    assert not step.applies(par, defaults_for("torchtitan"))
    taken = step.take(par)
    assert (taken.recompute, taken.recompute_modules) == (Recompute.SELECTIVE, ALL)


def test_cli_flag_and_its_bad_input(capsys):
    from comet.cli import main
    base = ["estimate", "--model", "gpt_1_7b", "--gpus", "8", "--global-batch", "16", "--json",
            "--recompute-modules", "layernorm"]
    assert main(base + ["--recompute", "selective"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "tp1-pp1-dp8-mb1-selective+layernorm-z1-bf16"
    assert out["parallel"]["recompute_modules"] == ["layernorm"]
    assert main(base) == 2      # modules without selective recompute: one line naming the field
    assert "recompute_modules needs recompute: selective" in capsys.readouterr().out


def test_remedies_offer_the_modules_for_moe_and_mla_models_only():
    from comet.config.cluster import load_cluster
    from comet.remedy import _moves
    cluster = load_cluster("cluster_specs/h100_dgx.yaml")
    move = ("recompute selective + modules", {"recompute": Recompute.SELECTIVE, "recompute_modules": ALL})
    assert move in _moves(_par(recompute=Recompute.NONE), cluster, TINY)
    plain = ModelSpec(name="tiny_dense", layers=2, hidden=64, heads=4, vocab=256, seq_len=32, ffn_hidden=256)
    assert move not in _moves(ParallelConfig(global_batch=8, dp=8).resolve(plain), cluster, plain)


@settings(max_examples=40, deadline=None)
@given(selective=st.booleans(), flash=st.booleans(), modules=st.lists(st.sampled_from(ALL), unique=True),
       moe_layer=st.booleans(), policy=st.sampled_from(SelectivePolicy))
def test_the_recompute_block_equals_the_builders_on_random_settings(selective, flash, modules, moe_layer, policy):
    """layers.layer_recompute skips the builder where nothing runs again: the block it gives equals, op
    for op, edge for edge and row for row, the one a builder given the same work builds."""
    from comet.graph.block import block_lists, block_table
    from comet.graph.ir import Phase
    from comet.workload.block_builder import BlockBuilder, Dims
    from comet.workload.layer_parts import attention_core
    from comet.workload.layers import layer_recompute
    from comet.workload.recompute_modules import add_recompute_ops
    kind = Recompute.SELECTIVE if selective else Recompute.NONE
    try:
        par = _par(recompute=kind, flash_attention=flash, recompute_modules=tuple(modules), selective_policy=policy)
    except ConfigError:     # modules without Megatron selective recompute
        return
    assume(par.recompute is Recompute.NONE or par.selective_policy is SelectivePolicy.ATTENTION)
    bb = BlockBuilder(Phase.RECOMPUTE, par, TINY)
    if par.recompute is Recompute.SELECTIVE and not par.flash_attention:
        attention_core(bb, Dims.of(TINY, par), [], backward=False)
    add_recompute_ops(bb, moe_layer)
    built, reference = layer_recompute(TINY, par, moe_layer=moe_layer), bb.done()
    assert block_lists(built) == block_lists(reference)
    mine, theirs = block_table(built), block_table(reference)
    assert [mine.rows, mine.gemms, mine.transfers, mine.left_out] == \
        [theirs.rows, theirs.gemms, theirs.transfers, theirs.left_out]
