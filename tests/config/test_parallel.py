"""Every parallel-configuration rule names itself and the values."""

import pytest

from comet.config.cluster import load_cluster
from comet.config.parallel import ParallelConfig, Precision, Recompute, Schedule
from comet.errors import ConfigError


@pytest.mark.parametrize("cfg,field,text", [
    (dict(tp=8, pp=8, dp=4, gpus=1000, global_batch=64), "gpus", "tp*pp*dp*cp must equal gpus: 8*8*4*1 = 256 != 1000"),
    (dict(tp=5, gpus=40, global_batch=64), "tp", "heads (96) must be divisible by tp (5)"),
    (dict(tp=8, pp=5, gpus=40, global_batch=64), "pp", "layers (96) must be divisible by pp*vpp = 5*1 = 5"),
    (dict(tp=8, pp=8, gpus=512, global_batch=100), "global_batch", "global_batch (100) must be divisible by dp*micro_batch = 8*1 = 8"),
    (dict(tp=8, pp=8, gpus=1000, global_batch=64), "gpus", "gpus (1000) must be divisible by tp*pp*cp = 8*8*1 = 64"),
    (dict(tp=8, pp=8, gpus=512, global_batch=64, vpp=2), "vpp", "vpp=2 needs schedule interleaved_1f1b, got 1f1b"),
    (dict(tp=8, pp=8, gpus=512, global_batch=64, zero=2), "zero", "ZeRO stage 2 shards gradients"),
    (dict(tp=8, pp=8, gpus=512, global_batch=64, zero=4), "zero", "must be 0, 1, 2 or 3, got 4"),
    (dict(tp=8, cp=3, gpus=24, global_batch=64), "cp", "seq_len (2048) must be divisible by 2*cp = 6"),
    (dict(tp=8, pp=8, gpus=512, global_batch=8 * 12, vpp=2, schedule=Schedule.INTERLEAVED), "global_batch",
     "interleaved 1F1B needs the micro-batch count (12) divisible by pp (8)"),
    (dict(tp=1, global_batch=8), "dp", "give either dp or gpus"),
])
def test_broken_rule_names_itself(cfg, field, text, gpt3_175b):
    with pytest.raises(ConfigError) as err:
        ParallelConfig(**cfg).resolve(gpt3_175b)
    assert err.value.field == field
    assert text in str(err.value)


def test_derives_dp_and_sequence_parallelism(gpt3_175b):
    par = ParallelConfig(tp=8, pp=8, gpus=1024, global_batch=1536).resolve(gpt3_175b)
    assert (par.dp, par.sp, par.num_microbatches) == (16, True, 96)
    assert ParallelConfig(tp=1, gpus=8, global_batch=8).resolve(gpt3_175b).sp is False


def test_gqa_kv_heads_must_divide_tp():
    from comet.config.model import ModelSpec
    m = ModelSpec(name="gqa", layers=4, hidden=1024, heads=16, kv_heads=2, vocab=1000, seq_len=128)
    with pytest.raises(ConfigError, match=r"kv_heads \(2\) must be divisible by tp \(4\)"):
        ParallelConfig(tp=4, gpus=4, global_batch=4).resolve(m)


def test_resolve_makes_enum_values_given_as_strings_members():
    # the models compare members by identity; a string equal to a member (what a journal or a hand-built
    # configuration may hold) was evaluated as another configuration, while hashing equal to the member
    import enum

    from comet.config.model import load_model
    from comet.config.parallel import RecomputeModule, SelectivePolicy
    from comet.evaluate import evaluate
    from comet.replay import cache

    model = load_model("gpt3_175b")
    as_members = ParallelConfig(global_batch=64, tp=8, pp=4, gpus=64, recompute=Recompute.SELECTIVE,
                                selective_policy=SelectivePolicy.OP_SAC, precision=Precision.BF16)
    as_strings = ParallelConfig(global_batch=64, tp=8, pp=4, gpus=64, recompute="selective",
                                selective_policy="op_sac", precision="bf16", schedule="1f1b",
                                recompute_modules=())
    resolved = as_strings.resolve(model)
    assert resolved == as_members.resolve(model)
    for name in ("schedule", "recompute", "selective_policy", "precision", "moe_dispatcher"):
        assert isinstance(getattr(resolved, name), enum.Enum), name
    modules = ParallelConfig(global_batch=64, tp=8, pp=4, gpus=64, recompute=Recompute.SELECTIVE,
                             recompute_modules=("layernorm",)).resolve(model).recompute_modules
    assert modules == (RecomputeModule.LAYERNORM,) and modules[0] is RecomputeModule.LAYERNORM
    with pytest.raises(ConfigError, match="selective_policy"):
        ParallelConfig(global_batch=64, tp=8, pp=4, gpus=64, selective_policy="nope").resolve(model)
    # the same figures whichever was evaluated first
    cluster = load_cluster("h100_dgx")
    cache.clear()
    first = evaluate(model, cluster, as_strings).step_time_s
    cache.clear()
    assert evaluate(model, cluster, as_members).step_time_s == first


def test_an_unknown_enum_value_is_an_infeasible_result_with_its_label():
    # evaluate() names the refused configuration by its label, built before resolve made the enum fields
    # members: a str there (a hand-built or journal configuration) was an AttributeError, not a result
    from comet.config.model import load_model
    from comet.evaluate import evaluate
    from comet.result import CandidateStatus

    par = ParallelConfig(global_batch=64, tp=8, pp=4, gpus=64, recompute="selectivex", moe_dispatcher="alltoall",
                         recompute_modules=("layernorm",), precision="bf16")
    res = evaluate(load_model("gpt3_175b"), load_cluster("h100_dgx"), par)
    assert res.status is CandidateStatus.INFEASIBLE
    assert "recompute: must be one of none, selective, full, got 'selectivex'" in res.reason
    assert res.label == "tp8-pp4-dpNone-mb1-selectivex+layernorm-z1-bf16"   # alltoall: the default, not named
