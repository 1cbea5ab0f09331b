"""Each transformation on its own: pure (the input is untouched), measured durations carried by the
cost-model ratio (calibration errors cancel), untouched ops kept as they are, structural changes wired
as the builder wires them, composition equal to one transform_to, clear errors on bad input."""

from dataclasses import replace

import networkx as nx
import pytest

from comet.config.parallel import Precision, Recompute, Schedule
from comet.errors import ConfigError, GraphError
from comet.evaluate import evaluate
from comet.graph.ir import Collective, GroupKind, StepGraph
from comet.replay.step import replay_step
from comet.replay.timing import op_time_s
from comet.transform import (transform_to, with_cp, with_dp, with_hardware, with_layers,
                             with_microbatch, with_num_microbatches, with_pp, with_precision, with_recompute,
                             with_schedule, with_tp, with_zero)
from comet.workload.builder import build_step_graph

from transform_helpers import base_graph, graph_signature, resolved

CALIBRATION = 1.37   # a "measured" trace that runs 37% slower than the cost model everywhere


def scaled(graph: StepGraph, k: float) -> StepGraph:
    """The graph with every block op's duration multiplied by k (a measured trace off the model by k)."""
    blocks = {}
    for key, g in graph.blocks.items():
        g = g.copy()
        for nid, op in g.nodes(data="op"):
            g.nodes[nid]["op"] = op.with_(duration_s=op.duration_s * k)
        blocks[key] = g
    return graph.with_(blocks=blocks)


def all_ops(graph: StepGraph):
    for key, g in graph.blocks.items():
        for nid, op in g.nodes(data="op"):
            yield key, nid, op


def test_transform_does_not_mutate_its_input(small_model, h100):
    base = base_graph(small_model, h100, tp=2, pp=2, dp=2)
    before = graph_signature(base)
    meta = dict(base.meta)
    transform_to(base, small_model, resolved(small_model, tp=4, pp=4, cp=2, recompute=Recompute.FULL))
    with_tp(base, 1)
    assert graph_signature(base) == before
    assert base.meta == meta


def test_measured_durations_carry_by_cost_ratio(small_model, h100):
    # tp 2 -> 4: same ops, new shapes. Every op was measured at CALIBRATION x the model, so after
    # re-timing by cost(new)/cost(old) each is CALIBRATION x the model at its new shape.
    base = scaled(base_graph(small_model, h100, tp=2), CALIBRATION)
    out = with_tp(base, 4)
    for key, nid, op in all_ops(out):
        model_s = op_time_s(op, h100, "bf16")
        assert op.duration_s == pytest.approx(CALIBRATION * model_s, rel=1e-12), (key, op.name)


def test_per_kind_calibration_survives_a_reconfiguration(small_model, h100):
    # A trace off the model by a different factor per kind of op (GEMMs slow, attention fast, TP
    # collectives slow): after tp 2 -> 8, pp and micro-batch changes, each op keeps its own factor.
    factor = {"gemm": 1.25, "attention": 0.8, "memory": 1.1, "comm": 1.6}

    def kind(op):
        return "comm" if op.is_comm else op.kernel.value

    base = base_graph(small_model, h100, tp=2, dp=2)
    blocks = {}
    for key, g in base.blocks.items():
        g = g.copy()
        for nid, op in g.nodes(data="op"):
            g.nodes[nid]["op"] = op.with_(duration_s=op.duration_s * factor[kind(op)])
        blocks[key] = g
    out = transform_to(base.with_(blocks=blocks), small_model, resolved(small_model, tp=8, pp=2, micro_batch=2))
    for key, nid, op in all_ops(out):
        want = factor[kind(op)] * op_time_s(op, h100, "bf16")
        assert op.duration_s == pytest.approx(want, rel=1e-12), (key, op.name)


def test_new_ops_are_timed_by_the_cost_model(small_model, h100):
    # tp 1 -> 2 adds the sequence-parallel all-gathers and reduce-scatters: no measured counterpart.
    base = scaled(base_graph(small_model, h100), CALIBRATION)
    out = with_tp(base, 2)
    tp_ops = [op for _, _, op in all_ops(out) if op.group_kind is GroupKind.TP]
    assert {op.collective for op in tp_ops} == {Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE}
    for op in tp_ops:
        assert op.duration_s == pytest.approx(op_time_s(op, h100, "bf16"), rel=1e-12)
    gemms = [op for _, _, op in all_ops(out) if op.kernel.value == "gemm"]
    for op in gemms:
        assert op.duration_s == pytest.approx(CALIBRATION * op_time_s(op, h100, "bf16"), rel=1e-12)


def test_sp_collectives_removed_going_back_to_tp1(small_model, h100):
    out = with_tp(base_graph(small_model, h100, tp=4), 1)
    assert not [op for _, _, op in all_ops(out) if op.group_kind is GroupKind.TP]
    built = build_step_graph(small_model, resolved(small_model))
    assert graph_signature(out, with_durations=False)[:2] == graph_signature(built, with_durations=False)[:2]


@pytest.mark.parametrize("transform", [lambda g: with_dp(g, 4), lambda g: with_pp(g, 4),
                                       lambda g: with_layers(g, 16), lambda g: with_num_microbatches(g, 4),
                                       lambda g: with_schedule(with_pp(g, 2), Schedule.GPIPE)])
def test_ops_a_transformation_does_not_change_keep_their_duration(small_model, h100, transform):
    base = scaled(base_graph(small_model, h100, tp=2, pp=2, dp=2), CALIBRATION)
    out = transform(base)
    for key, g in out.blocks.items():
        base_ops = [op for _, op in base.blocks[key].nodes(data="op")]
        assert [op for _, op in g.nodes(data="op")] == base_ops, key


def test_full_recompute_carries_the_forward_kernels(small_model, h100):
    base = scaled(base_graph(small_model, h100, tp=2), CALIBRATION)
    out = with_recompute(base, "full")
    fwd = [op.duration_s for _, op in out.blocks["layer.fwd"].nodes(data="op")]
    rec = list(out.blocks["layer.recompute"].nodes(data="op"))
    assert [op.duration_s for _, op in rec] == pytest.approx(fwd, rel=1e-12)
    assert {op.phase.value for _, op in rec} == {"recompute"}
    assert out.plan.recompute_layers == out.plan.chunk_layers[0]
    assert len(with_recompute(out, Recompute.NONE).blocks["layer.recompute"]) == 0


@pytest.mark.parametrize("name,step,target", [
    ("tp", lambda g: with_tp(g, 4), dict(tp=4, pp=2, dp=2)),
    ("tp-nosp", lambda g: with_tp(g, 2, sequence_parallel=False), dict(tp=2, pp=2, dp=2, sequence_parallel=False)),
    ("cp", lambda g: with_cp(g, 2), dict(tp=2, pp=2, dp=2, cp=2)),
    ("dp", lambda g: with_dp(g, 8), dict(tp=2, pp=2, dp=8, global_batch=32)),
    ("zero0", lambda g: with_zero(g, 0), dict(tp=2, pp=2, dp=2, zero=0)),
    ("pp", lambda g: with_pp(g, 4), dict(tp=2, pp=4, dp=2)),
    ("vpp", lambda g: with_pp(g, 4, "interleaved_1f1b", 2), dict(tp=2, pp=4, dp=2, vpp=2, schedule=Schedule.INTERLEAVED)),
    ("mb", lambda g: with_microbatch(g, 4), dict(tp=2, pp=2, dp=2, micro_batch=4)),
    ("recompute", lambda g: with_recompute(g, "full"), dict(tp=2, pp=2, dp=2, recompute=Recompute.FULL)),
    ("fp8", lambda g: with_precision(g, "fp8"), dict(tp=2, pp=2, dp=2, precision=Precision.FP8)),
])
def test_each_transformation_matches_the_built_target(small_model, h100, name, step, target):
    out = step(base_graph(small_model, h100, tp=2, pp=2, dp=2))
    par = resolved(small_model, **target)
    assert out.meta["parallel"] == par
    direct = evaluate(small_model, h100, par)
    assert replay_step(out, h100, par.precision.value).step_time_s == pytest.approx(direct.step_time_s, rel=1e-9)


def test_composition_equals_one_transform_to(small_model, h100):
    base = scaled(base_graph(small_model, h100, tp=2, dp=2), CALIBRATION)
    stepwise = with_microbatch(with_cp(with_pp(with_tp(base, 4), 2), 2), 2)
    par = resolved(small_model, tp=4, pp=2, dp=2, cp=2, micro_batch=2)
    once = transform_to(base, small_model, par)
    assert graph_signature(stepwise, with_durations=False)[:2] == graph_signature(once, with_durations=False)[:2]
    for key in once.blocks:
        a = [op.duration_s for _, op in stepwise.blocks[key].nodes(data="op")]
        b = [op.duration_s for _, op in once.blocks[key].nodes(data="op")]
        assert a == pytest.approx(b, rel=1e-12), key
    assert stepwise.meta["transforms"][-1] == "micro_batch=2,global_batch=32"


def test_hardware_carries_calibration_to_the_new_cluster(small_model, h100, a100):
    on_a100 = scaled(base_graph(small_model, a100, tp=2, pp=2), CALIBRATION)
    out = with_hardware(on_a100, h100)
    assert out.meta["cluster"] is h100
    for key, nid, op in all_ops(out):
        assert op.duration_s == pytest.approx(CALIBRATION * op_time_s(op, h100, "bf16"), rel=1e-12), op.name
    # and a modelled base re-targeted replays like one materialized on the new cluster
    plain = with_hardware(base_graph(small_model, a100, tp=2, pp=2), h100)
    par = plain.meta["parallel"]
    want = replay_step(build_step_graph(small_model, par), h100, "bf16").step_time_s
    assert replay_step(plain, h100, "bf16").step_time_s == pytest.approx(want, rel=1e-9)


def test_transform_to_retargets_hardware_when_given_a_cluster(small_model, h100, a100):
    base = base_graph(small_model, a100, tp=2)
    par = resolved(small_model, tp=4, pp=2)
    out = transform_to(base, small_model, par, cluster=h100)
    direct = evaluate(small_model, h100, par)
    assert replay_step(out, h100, "bf16").step_time_s == pytest.approx(direct.step_time_s, rel=1e-9)


def test_an_untimed_graph_stays_untimed(small_model, h100):
    base = build_step_graph(small_model, resolved(small_model, tp=2))
    out = with_pp(with_tp(base, 4), 2)
    assert all(op.duration_s is None for _, _, op in all_ops(out))
    par = out.meta["parallel"]
    assert replay_step(out, h100, "bf16").step_time_s == evaluate(small_model, h100, par).step_time_s


def test_unannotated_ops_of_the_base_are_kept(small_model, h100):
    base = base_graph(small_model, h100, tp=2)
    g = base.blocks["layer.fwd"].copy()
    norm = next(n for n, op in g.nodes(data="op") if op.name == "input_norm")
    nxt = next(iter(g.successors(norm)))
    extra = next(op for _, op in g.nodes(data="op")).with_(name="custom.rope", duration_s=3e-5)
    g.add_node("x", op=extra)
    g.add_edge(norm, "x", dep="data")
    g.add_edge("x", nxt, dep="data")
    base = base.with_(blocks=dict(base.blocks, **{"layer.fwd": g}))
    out = with_tp(base, 4).blocks["layer.fwd"]
    kept = [n for n, op in out.nodes(data="op") if op.name == "custom.rope"]
    assert len(kept) == 1 and out.nodes[kept[0]]["op"].duration_s == 3e-5
    names = lambda ns: {out.nodes[n]["op"].name for n in ns}
    assert names(out.predecessors(kept[0])) == {"input_norm"}
    assert nx.is_directed_acyclic_graph(out)


# ------------------------------------------------------------------------------------ bad input
def test_missing_meta_is_a_graph_error(small_model, h100):
    base = base_graph(small_model, h100)
    with pytest.raises(GraphError, match="meta\\['parallel'\\]"):
        with_tp(base.with_(meta={"model": small_model}), 2)
    with pytest.raises(GraphError, match="meta\\['model'\\]"):
        transform_to(base.with_(meta={}), small_model, resolved(small_model))


def test_other_model_is_a_graph_error(small_model, h100):
    other = replace(small_model, activation="swiglu")
    with pytest.raises(GraphError, match="activation differs"):
        transform_to(base_graph(small_model, h100), other, resolved(other))


def test_tensor_dimensions_may_change(small_model, h100):
    # hidden / heads / ffn / seq / vocab: every op re-timed by its new shape's cost ratio; a base timed by
    # the cost model therefore replays exactly like the target built from scratch
    other = replace(small_model, hidden=small_model.hidden * 2, heads=small_model.heads * 2,
                    kv_heads=small_model.kv_heads * 2, ffn_hidden=small_model.ffn_hidden * 2,
                    seq_len=small_model.seq_len * 2, vocab=small_model.vocab + 128)
    par = resolved(other, tp=2)
    a = evaluate(other, h100, par, base=base_graph(small_model, h100))
    b = evaluate(other, h100, par)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)


def test_flat_graph_needs_layer_annotations(small_model, h100):
    flat = base_graph(small_model, h100).blocks["layer.fwd"]
    for fn in (lambda g: with_tp(g, 2), lambda g: with_pp(g, 2), lambda g: with_recompute(g, "full"),
               lambda g: with_layers(g, 4), lambda g: with_microbatch(g, 2)):
        with pytest.raises(GraphError, match="needs layer annotations"):
            fn(flat)


def test_bad_target_configuration_is_a_config_error(small_model, h100):
    base = base_graph(small_model, h100)
    with pytest.raises(ConfigError, match="heads"):
        with_tp(base, 3)
    with pytest.raises(ConfigError, match="recompute"):
        with_recompute(base, "sometimes")
    with pytest.raises(ConfigError, match="layers"):
        with_layers(base, 0)


def test_measured_durations_without_a_cluster_are_a_graph_error(small_model, h100):
    base = base_graph(small_model, h100, tp=2)
    meta = {k: v for k, v in base.meta.items() if k != "cluster"}
    with pytest.raises(GraphError, match="cluster"):
        with_tp(base.with_(meta=meta), 4)


def test_evaluate_reports_a_base_without_meta_as_infeasible(small_model, h100):
    base = base_graph(small_model, h100)
    res = evaluate(small_model, h100, resolved(small_model, tp=2), base=base.with_(meta={}))
    assert res.status.value == "infeasible" and "meta" in res.reason
