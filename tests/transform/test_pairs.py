"""Transforming a built graph from configuration A to B and replaying it matches building B directly
(within 2% of the step time), over many (A, B) pairs across tp, pp, dp, cp, schedule, micro-batch,
layers, recompute, ZeRO and precision; every transformed block stays acyclic; A -> A is the identity."""

import itertools
from dataclasses import replace

import networkx as nx
import pytest

from comet.config.parallel import Recompute, Schedule
from comet.evaluate import evaluate
from comet.replay.step import replay_step
from comet.transform import materialize, transform_to
from comet.workload.builder import build_step_graph

from transform_helpers import graph_signature, resolved

CONFIGS = {
    "tp1": dict(),
    "tp2": dict(tp=2),
    "tp4-pp2": dict(tp=4, pp=2),
    "tp2-pp2-dp2": dict(tp=2, pp=2, dp=2),
    "pp4-dp2": dict(pp=4, dp=2),
    "tp2-dp2-cp2": dict(tp=2, dp=2, cp=2),
    "pp2-cp2-full": dict(pp=2, cp=2, recompute=Recompute.FULL),
    "tp2-pp2-mb2": dict(tp=2, pp=2, dp=2, micro_batch=2),
    "tp2-pp4-vpp2": dict(tp=2, pp=4, vpp=2, schedule=Schedule.INTERLEAVED),
    "dp4-z0": dict(dp=4, zero=0),
    "dp2-z3": dict(dp=2, zero=3),
    "tp2-pp2-gpipe-mb4": dict(tp=2, pp=2, schedule=Schedule.GPIPE, micro_batch=4),
    "tp8-nosp": dict(tp=8, sequence_parallel=False),
    "tp4-overlap": dict(tp=4, overlap_tp_comm=True),
    "tp2-unfused-selective": dict(tp=2, pp=2, flash_attention=False, recompute=Recompute.SELECTIVE),
}
# Every ordered pair of distinct configurations: 15 * 14 = 210 pairs.
PAIRS = [(a, b) for a, b in itertools.permutations(CONFIGS, 2)]
LAYER_PAIRS = [("tp2", "tp2", 8, 16), ("tp2-pp2-dp2", "pp4-dp2", 8, 4), ("tp4-pp2", "tp2-pp4-vpp2", 16, 8),
               ("pp2-cp2-full", "tp2-dp2-cp2", 4, 24)]


@pytest.fixture(scope="module")
def bases(small_model, h100):
    return {name: materialize(build_step_graph(small_model, resolved(small_model, **kw)), h100)
            for name, kw in CONFIGS.items()}


def _check_pair(model_a, model_b, cluster, base, kw_b):
    par_b = resolved(model_b, **kw_b)
    direct = evaluate(model_b, cluster, par_b)
    via = evaluate(model_b, cluster, par_b, base=base)
    assert direct.status.value == "ok", direct.reason
    assert via.status.value == "ok", via.reason
    err = abs(via.step_time_s - direct.step_time_s) / direct.step_time_s
    assert err < 0.02, f"{err:.2%}: transformed {via.step_time_s} vs built {direct.step_time_s}"
    return err


@pytest.mark.parametrize("a,b", PAIRS)
def test_transformed_replay_matches_built(small_model, h100, bases, a, b):
    _check_pair(small_model, small_model, h100, bases[a], CONFIGS[b])
    graph = transform_to(bases[a], small_model, resolved(small_model, **CONFIGS[b]))
    for key, g in graph.blocks.items():
        assert nx.is_directed_acyclic_graph(g), key


@pytest.mark.parametrize("a,b,layers_a,layers_b", LAYER_PAIRS)
def test_layer_count_change_matches_built(small_model, h100, a, b, layers_a, layers_b):
    model_a, model_b = replace(small_model, layers=layers_a), replace(small_model, layers=layers_b)
    base = materialize(build_step_graph(model_a, resolved(model_a, **CONFIGS[a])), h100)
    _check_pair(model_a, model_b, h100, base, CONFIGS[b])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_to_a_is_identity(small_model, h100, bases, name):
    base = bases[name]
    par = base.meta["parallel"]
    same = transform_to(base, small_model, par)
    assert graph_signature(same) == graph_signature(base)
    r0, r1 = replay_step(base, h100, par.precision.value), replay_step(same, h100, par.precision.value)
    assert r1.step_time_s == r0.step_time_s
    assert r1.breakdown == r0.breakdown


@pytest.mark.parametrize("a,b", [("tp1", "tp2"), ("tp2-pp2-dp2", "tp2-dp2-cp2"), ("dp2-z3", "tp4-overlap"),
                                 ("tp2-unfused-selective", "pp2-cp2-full")])
def test_transformed_structure_equals_built(small_model, h100, bases, a, b):
    # Ops, shapes, dependencies, plan: the same graph the builder makes for B (durations aside).
    par_b = resolved(small_model, **CONFIGS[b])
    via = transform_to(bases[a], small_model, par_b)
    built = build_step_graph(small_model, par_b)
    assert graph_signature(via, with_durations=False)[:2] == graph_signature(built, with_durations=False)[:2]


def test_fp8_precision_pair_matches_built(small_model, h100, bases):
    from comet.config.parallel import Precision
    _check_pair(small_model, small_model, h100, bases["tp2-pp2-dp2"], dict(tp=4, pp=2, precision=Precision.FP8))
    base8 = materialize(build_step_graph(small_model, resolved(small_model, tp=2, precision=Precision.FP8)), h100)
    _check_pair(small_model, small_model, h100, base8, dict(tp=2, pp=2))


def _config_strategy():
    from hypothesis import strategies as st
    return st.fixed_dictionaries(dict(
        tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2]),
        cp=st.sampled_from([1, 2]), micro_batch=st.sampled_from([1, 2]),
        recompute=st.sampled_from(list(Recompute)), zero=st.sampled_from([0, 1]),
        overlap_tp_comm=st.booleans(), flash_attention=st.booleans()))


def test_random_pairs_match_built(small_model, h100):
    from hypothesis import assume, given, settings
    from comet.errors import ConfigError

    @settings(max_examples=25, deadline=None, derandomize=True)
    @given(_config_strategy(), _config_strategy())
    def check(kw_a, kw_b):
        try:
            par_a, par_b = resolved(small_model, **kw_a), resolved(small_model, **kw_b)
        except ConfigError:
            assume(False)
        base = materialize(build_step_graph(small_model, par_a), h100)
        via = replay_step(transform_to(base, small_model, par_b), h100, "bf16").step_time_s
        assert via == pytest.approx(replay_step(build_step_graph(small_model, par_b), h100, "bf16").step_time_s,
                                    rel=1e-9)

    check()


# A GQA + SwiGLU model with untied embeddings (Llama 3 8B), and a medium GPT from the zoo.
ZOO_CONFIGS = {
    "llama3_8b": [dict(tp=2, pp=2, dp=2, global_batch=16), dict(tp=8, dp=2, global_batch=16),
                  dict(tp=4, pp=4, dp=1, cp=2, global_batch=16, recompute=Recompute.FULL),
                  dict(tp=1, pp=8, dp=2, global_batch=16, vpp=2, schedule=Schedule.INTERLEAVED)],
    "gpt_1_7b": [dict(tp=2, dp=4, global_batch=64), dict(tp=8, pp=2, dp=2, global_batch=64, micro_batch=2),
                 dict(pp=4, dp=4, global_batch=64, recompute=Recompute.SELECTIVE, flash_attention=False)],
}
ZOO_PAIRS = [(name, i, j) for name, cfgs in ZOO_CONFIGS.items()
             for i, j in itertools.permutations(range(len(cfgs)), 2)]


@pytest.mark.parametrize("name,i,j", ZOO_PAIRS)
def test_zoo_model_pairs_match_built(h100, name, i, j):
    from comet.config.model import load_model
    model = load_model(name)
    cfgs = ZOO_CONFIGS[name]
    base = materialize(build_step_graph(model, resolved(model, **cfgs[i])), h100)
    _check_pair(model, model, h100, base, cfgs[j])
