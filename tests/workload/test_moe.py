"""Mixture of experts: all-to-all volume, expert memory and FLOPs against hand counts on a tiny model,
the expert-parallel rules, and the MoE zoo against the published parameter counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from comet.config.cluster import load_cluster
from comet.config.model import ModelSpec, load_model
from comet.config.moe import Dispatcher, MoESpec
from comet.config.parallel import ParallelConfig, Precision
from comet.errors import ConfigError
from comet.evaluate import evaluate
from comet.graph.ir import Collective, GroupKind, ops
from comet.replay.schedule import block_occurrences
from comet.workload.builder import build_step_graph
from comet.workload.flops import model_flops_per_step
from comet.workload.memory import activation_bytes_per_layer, estimate_memory

H100 = Path(__file__).resolve().parents[2] / "cluster_specs" / "h100_dgx.yaml"

# 4 layers: 1 leading dense layer, then 3 MoE layers of 8 experts (FFN 128 each), top-2, 1 shared expert.
TINY = ModelSpec(name="tiny_moe", layers=4, hidden=64, heads=4, vocab=256, seq_len=32, ffn_hidden=256,
                 activation="swiglu", tied_embeddings=False, linear_bias=False, vocab_pad_to=1,
                 moe=MoESpec(num_experts=8, experts_per_token=2, expert_ffn_hidden=128, shared_experts=1,
                             dense_layers=1))


def _par(**kw) -> ParallelConfig:
    base = dict(global_batch=16, tp=1, pp=1, dp=8, micro_batch=2, ep=4)
    base.update(kw)
    return ParallelConfig(**base).resolve(TINY)


def _a2a(block):
    return [op for _, op in ops(block) if op.collective is Collective.ALL_TO_ALL]


def test_all_to_all_volume_matches_a_hand_count():
    par = _par()
    graph = build_step_graph(TINY, par)
    # A rank holds b*s = 2*32 = 64 tokens; each leaves as k = 2 copies of h = 64 bf16 values.
    hand = 64 * 2 * 64 * 2
    for key in ("moe_layer.fwd", "moe_layer.bwd"):
        a2a = _a2a(graph.blocks[key])
        assert len(a2a) == 2                                   # dispatch and combine (or their gradients)
        assert all(op.msg_bytes == hand for op in a2a)
        assert all((op.group_kind, op.group_size, op.group_stride) == (GroupKind.EP, 4, 1) for op in a2a)
    assert _a2a(graph.blocks["layer.fwd"]) == []               # the leading dense layer has no experts
    # Per step: 3 MoE layers x 4 all-to-alls (fwd + bwd) x 16 / (8 * 2) = 1 micro-batch.
    n = block_occurrences(graph.plan, 0)
    total = sum(n[k] * sum(op.msg_bytes for op in _a2a(graph.blocks[k])) for k in n if k.startswith("moe_layer"))
    assert total == 3 * 4 * 1 * hand


def test_expert_tensor_parallel_gathers_over_etp_and_sequence_parallel_shards_tokens():
    par = _par(tp=2, dp=4, ep=4, etp=2)       # 8 ranks per stage = etp 2 x ep 4
    a2a = _a2a(build_step_graph(TINY, par).blocks["moe_layer.fwd"])
    assert all(op.msg_bytes == 32 * 2 * 64 * 2 for op in a2a)  # SP: 64 tokens / tp 2 per rank
    assert all((op.group_size, op.group_stride) == (4, 2) for op in a2a)   # EP ranks are etp apart
    gathers = [op for _, op in ops(build_step_graph(TINY, par).blocks["moe_layer.fwd"]) if op.group_kind is GroupKind.ETP]
    assert [op.collective for op in gathers] == [Collective.ALL_GATHER, Collective.REDUCE_SCATTER]
    assert all(op.msg_bytes == 32 * 2 * 64 * 2 * 2 for op in gathers)


def _exchange_chain(block):
    """The EP / ETP collectives of a MoE block as (name, collective), in dependency order."""
    import networkx as nx
    order = list(nx.topological_sort(block))
    comm = [(nid, op) for nid, op in ((n, block.nodes[n]["op"]) for n in order)
            if op.group_kind in (GroupKind.EP, GroupKind.ETP)]
    for (a, _), (b, _) in zip(comm, comm[1:]):
        assert nx.has_path(block, a, b)          # one chain: each exchange waits for the one before
    return [(op.name, op.collective) for _, op in comm]


def test_exchanges_follow_megatron_order_and_backward_reverses_each_collective():
    # Megatron-Core MoEAlltoAllTokenDispatcher: dispatch = all-to-all (EP) then all-gather (ETP); combine =
    # reduce-scatter (ETP) then all-to-all. Autograd reverses each: the combine's gradient all-gathers,
    # the dispatch's reduce-scatters.
    graph = build_step_graph(TINY, _par(tp=2, dp=4, ep=4, etp=2))
    A2A, AG, RS = Collective.ALL_TO_ALL, Collective.ALL_GATHER, Collective.REDUCE_SCATTER
    assert _exchange_chain(graph.blocks["moe_layer.fwd"]) == [
        ("moe.dispatch.all_to_all", A2A), ("moe.dispatch.etp_all_gather", AG),
        ("moe.combine.etp_reduce_scatter", RS), ("moe.combine.all_to_all", A2A)]
    assert _exchange_chain(graph.blocks["moe_layer.bwd"]) == [
        ("moe.combine.bwd.all_to_all", A2A), ("moe.combine.bwd.etp_all_gather", AG),
        ("moe.dispatch.bwd.etp_reduce_scatter", RS), ("moe.dispatch.bwd.all_to_all", A2A)]
    # The all-gather dispatcher: tokens gathered over EP on the way to the experts, scattered back.
    ag = build_step_graph(TINY, _par(moe_dispatcher=Dispatcher.ALLGATHER))
    assert [c for _, c in _exchange_chain(ag.blocks["moe_layer.fwd"])] == [AG, RS]
    assert [c for _, c in _exchange_chain(ag.blocks["moe_layer.bwd"])] == [AG, RS]


def test_capacity_factor_and_imbalance_scale_the_busiest_rank():
    base = _a2a(build_step_graph(TINY, _par()).blocks["moe_layer.fwd"])[0].msg_bytes
    skew = _a2a(build_step_graph(TINY, _par(moe_imbalance=1.5)).blocks["moe_layer.fwd"])[0].msg_bytes
    capped = _a2a(build_step_graph(TINY, _par(moe_imbalance=1.5, moe_capacity_factor=1.25)).blocks["moe_layer.fwd"])
    assert skew == 1.5 * base and capped[0].msg_bytes == 1.25 * base


def _sorts(block):
    return {op.name: op.bytes for _, op in ops(block) if "sort_by_expert" in op.name or "restore_order" in op.name}


def test_rows_for_several_local_experts_are_sorted_by_expert_and_back():
    # ep 4 of 8 experts: 2 local experts. 64 tokens x top-2 = 128 routed rows of h = 64 bf16 values,
    # read and written once per sort: 2 * 128 * 64 * 2 bytes, forward (sort, restore) and backward.
    hand = 2 * 128 * 64 * 2
    graph = build_step_graph(TINY, _par())
    assert _sorts(graph.blocks["moe_layer.fwd"]) == {"moe.sort_by_expert": hand, "moe.restore_order": hand}
    assert _sorts(graph.blocks["moe_layer.bwd"]) == {"moe.sort_by_expert.bwd": hand, "moe.restore_order.bwd": hand}
    # tp 2 = etp 2: 32 tokens per rank (SP) x top-2, gathered over etp 2 -> again 128 rows.
    etp = build_step_graph(TINY, _par(tp=2, dp=4, ep=4, etp=2))
    assert _sorts(etp.blocks["moe_layer.fwd"]) == {"moe.sort_by_expert": hand, "moe.restore_order": hand}
    # One local expert (ep 8) needs no sort; the all-gather dispatcher permutes straight into expert order.
    assert _sorts(build_step_graph(TINY, _par(ep=8)).blocks["moe_layer.fwd"]) == {}
    assert _sorts(build_step_graph(TINY, _par(moe_dispatcher=Dispatcher.ALLGATHER)).blocks["moe_layer.fwd"]) == {}


def test_expert_memory_matches_a_hand_count():
    par = _par(dp=8, ep=4)                    # expert-DP = 8 / 4 = 2
    mem = estimate_memory(TINY, par, load_cluster(H100))
    experts_per_gpu = 3 * (8 // 4) * 3 * 64 * 128      # 3 MoE layers x 2 local experts x (gate, up, down)
    assert mem.expert_weights_GB * 1e9 == pytest.approx(experts_per_gpu * 2)             # bf16
    assert mem.expert_gradients_GB * 1e9 == pytest.approx(experts_per_gpu * 4)           # fp32 main grads
    assert mem.expert_optimizer_GB * 1e9 == pytest.approx(experts_per_gpu * 12 / 2)      # ZeRO-1 over expert-DP
    # The rest of the model (attention, norms, router, shared expert, dense layer, embeddings) is `weights`.
    attention = 4 * 64 * 64
    rest = (4 * (attention + 4 * 64) + 256 * 64 * 3           # 4 layers' attention + norms; dense MLP
            + 3 * (64 * 8 + 128 * 64 * 3)                      # router + shared expert of the 3 MoE layers
            + 2 * 256 * 64 + 2 * 64)                           # untied embedding and output, final norm
    assert mem.weights_GB * 1e9 == pytest.approx(rest * 2)
    parts = mem.as_dict()
    hbm = sum(v for k, v in parts.items() if k != "expansion")
    assert hbm == pytest.approx(mem.total_GB)


def test_routed_token_activations_and_dispatch_buffers_are_counted():
    par = _par()
    mem = estimate_memory(TINY, par, load_cluster(H100))
    assert mem.moe_dispatch_GB * 1e9 == pytest.approx(2 * 64 * 2 * 64 * 2)   # send + receive buffer
    # A MoE layer saves, instead of the dense MLP's activation input (2 x 256) and FC2 input (256) per token:
    # 128 routed copies x (FC1 input 64 + FC2 input 128 + activation input 2 x 128 + expert output 64) bf16,
    # fp32 router probabilities (64 tokens x 8 experts) and the shared expert's (2 x 128 + 128) per token.
    routed = 128 * (64 + 128 + 256 + 64) * 2 + 64 * 8 * 4
    shared = 64 * (256 + 128) * 2
    dense_mlp = 64 * (512 + 256) * 2
    diff = activation_bytes_per_layer(TINY, par, moe_layer=True) - activation_bytes_per_layer(TINY, par)
    assert diff == pytest.approx(routed + shared - dense_mlp)


def test_moe_flops_count_the_routed_and_shared_experts_only():
    h, s, tokens = 64, 32, 16 * 32
    attention = 2 * (h * (h + 2 * h) + h * h) + 4 * s * h
    dense_mlp = 2 * h * 256 * 3
    moe_mlp = 2 * h * (2 * 128 + 128) * 3                     # top-2 routed + 1 shared expert (router uncounted)
    logits = 2 * h * 256
    hand = 3 * tokens * (4 * attention + dense_mlp + 3 * moe_mlp + logits)
    assert model_flops_per_step(TINY, 16) == pytest.approx(hand)


def test_active_parameters_use_top_k():
    assert TINY.params - TINY.active_params == 3 * (8 - 2) * 3 * 64 * 128


@pytest.mark.parametrize("kw, field, words", [
    (dict(ep=3, dp=6, global_batch=12), "ep", "divisible by ep"),
    (dict(ep=8, tp=2, dp=4, etp=2), "ep", "must divide the ranks"),
    (dict(ep=2, tp=2, dp=4, sequence_parallel=False), "sequence_parallel", "needs sequence parallelism"),
    (dict(moe_imbalance=0.5), "moe_imbalance", ">= 1"),
    (dict(etp=3, tp=1, ep=2), "etp", "divisible by etp"),
])
def test_expert_parallel_rules_name_the_field(kw, field, words):
    with pytest.raises(ConfigError) as info:
        _par(**kw)
    assert info.value.field == field and words in str(info.value)


def test_dense_model_rejects_expert_parallelism():
    with pytest.raises(ConfigError, match="has no experts"):
        ParallelConfig(global_batch=8, dp=8, ep=2).resolve(load_model("llama3_8b"))


def test_estimate_reports_exposed_all_to_all_and_expert_memory():
    res = evaluate(load_model("qwen3_30b_a3b"), load_cluster(H100),
                   ParallelConfig(global_batch=256, tp=1, pp=2, gpus=64, ep=16, precision=Precision.BF16))
    assert res.feasible
    assert res.breakdown["exposed_ep"] > 0
    assert sum(res.breakdown.values()) == pytest.approx(res.step_time_s, rel=1e-9)
    assert res.memory["expert_weights"] > 0 and res.memory["expert_optimizer"] > 0
    # The all-to-all over 16 ranks crosses nodes: slower than the same exchange inside one node.
    inside = evaluate(load_model("qwen3_30b_a3b"), load_cluster(H100),
                      ParallelConfig(global_batch=256, tp=1, pp=2, gpus=64, ep=8, precision=Precision.BF16))
    assert res.breakdown["exposed_ep"] > inside.breakdown["exposed_ep"]


# Published totals / active parameters (billions): DeepSeek-V3 report 671 / 37 (the main model; the
# released checkpoint's 685B adds the 14B multi-token-prediction module, not modelled); Qwen3 report 235 / 22 and 30.5 / 3.3; Mixtral paper 46.7 / 12.9;
# Kimi K2 1040 / 32; gpt-oss model card 116.8 / 5.1 and 20.9 / 3.6 (its active count leaves out the input
# embedding); Llama 4 Maverick 400 / 17.
PUBLISHED = {"deepseek_v3": (671, 37), "qwen3_235b_a22b": (235, 22), "qwen3_30b_a3b": (30.5, 3.3),
             "mixtral_8x7b": (46.7, 12.9), "kimi_k2": (1040, 32), "gpt_oss_120b": (116.8, 5.1),
             "gpt_oss_20b": (20.9, 3.6), "llama4_maverick": (400, 17), "grok1": (314, None),
             "mixtral_8x22b": (141, 39)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_zoo_matches_published_parameter_counts(name):
    model = load_model(name)
    total, active = PUBLISHED[name]
    assert model.moe is not None
    assert model.params / 1e9 == pytest.approx(total, rel=0.04)
    if active is not None:
        counted = model.active_params - (model.embedding_params if name.startswith("gpt_oss") else 0)
        assert counted / 1e9 == pytest.approx(active, rel=0.08)


def test_biased_experts_add_megatron_cores_fc2_bias_loop():
    from dataclasses import replace
    biased = replace(TINY, linear_bias=True)
    par = ParallelConfig(global_batch=16, dp=8, micro_batch=2, ep=4).resolve(biased)
    graph = build_step_graph(biased, par)
    # 2 local experts, each 64 tokens x top-2 / 2 experts = 64 rows of h = 64 in bf16: 8192 bytes a pass
    rows_h = 64 * 64 * 2
    fwd = [(op.name, op.bytes) for _, op in ops(graph.blocks["moe_layer.fwd"]) if "fc2_bias" in op.name]
    assert fwd == [("experts.fc2_bias.mul", rows_h), ("experts.fc2_bias.add", 3 * rows_h)] * 2 + [
        ("experts.fc2_bias.cat", 2 * 2 * rows_h)]
    bwd = [op.bytes for _, op in ops(graph.blocks["moe_layer.bwd"]) if "fc2_bias" in op.name]
    assert len(bwd) == 2 * 4 + 1 and sum(bwd) == 2 * 6 * rows_h + 2 * 2 * rows_h
    plain = build_step_graph(TINY, ParallelConfig(global_batch=16, dp=8, micro_batch=2, ep=4).resolve(TINY))
    assert not [op for _, op in ops(plain.blocks["moe_layer.fwd"]) if "fc2_bias" in op.name]
