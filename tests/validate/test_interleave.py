"""The interleaving depth (vpp) a row leaves empty: part of the layout search (comet/validate/layout.py).
A tuned run on a framework that interleaves uses the depth that makes it fastest; a framework that
cannot interleave keeps vpp 1; a stated vpp always wins."""

import pytest

from comet.evaluate import evaluate
from comet.validate.layout import candidate_configs
from comet.validate.predict import ClusterCache, predict
from comet.validate.rows import derive_case, layout_config
from comet.validate.runner import repo_root

from csvrows import row

# 4 layers on pp 2 (2 per stage: depths 1 and 2), 2 micro-batches, vocab small enough that the embedding
# and the output layer barely unbalance the stages. 1F1B idles (p-1)/m = 1/2 of a stage's compute in the
# bubble; interleaving v chunks cuts it to (p-1)/(m v) = 1/4 (Narayanan et al. SC21 sec. 2.2.2).
TINY = dict(params_b="0.8", layers="4", hidden="4096", heads="32", ffn_hidden="16384", seq_len="4096", vocab="1024",
            gpu="H100", gpu_model="h100-sxm-80gb", num_gpus="2", tp="1", pp="2", micro_batch="1",
            global_batch="2", recompute="none", sequence_parallel="", precision="bf16", framework="megatron-lm",
            framework_version="core_r0.9.0")


def _cache():
    return ClusterCache(repo_root() / "cluster_specs")


def test_vpp_2_halves_the_bubble_and_is_chosen():
    case = derive_case(row(**TINY), 0)
    assert case.open_vpp and case.open_layout == (1, 2) and not case.skip_reason
    cluster = _cache().get("h100_dgx.yaml")
    one, two = (evaluate(case.model, cluster, layout_config(case, 1, 2, v)[0]) for v in (1, 2))
    stage_compute = one.breakdown["compute"]
    assert one.breakdown["pipeline_bubble"] == pytest.approx(stage_compute / 2, rel=0.02)
    assert two.breakdown["pipeline_bubble"] == pytest.approx(stage_compute / 4, rel=0.05)
    pred = predict(case, _cache())
    assert pred.status == "ok" and case.parallel.vpp == 2 and pred.predicted == pytest.approx(two.step_time_s)
    assert "vpp=2 (not stated: the fastest feasible of 2, comet/validate/layout.py)" in case.assumptions
    assert pred.label.split("-")[:4] == ["tp1", "pp2", "dp1", "vpp2"]


def test_framework_that_cannot_interleave_keeps_vpp_1():
    # DeepSpeed's PipelineEngine runs one stage per rank; a row without a framework gets comet's 1F1B
    for cells in (dict(framework="deepspeed", framework_version="", zero="1", recompute="none"),
                  dict(framework="", framework_version="")):
        case = derive_case(row(**dict(TINY, **cells)), 0)
        assert not case.skip_reason and not case.open_vpp and case.open_layout is None
        assert predict(case, _cache()).status == "ok" and case.parallel.vpp == 1
        notes = [a for a in case.assumptions if "vpp=" in a]
        assert len(notes) == 1 and notes[0].startswith("vpp=1 (") and "default" in notes[0], notes


def test_stated_vpp_always_wins():
    case = derive_case(row(**dict(TINY, vpp="1")), 0)
    assert not case.open_vpp and case.open_layout is None
    assert predict(case, _cache()).status == "ok" and case.parallel.vpp == 1


def test_depths_follow_the_framework_rules():
    # 48 layers on pp 4: 12 per stage -> Megatron's even chunks take the divisors 1, 2, 3, 4, 6, 12
    base = dict(TINY, layers="48", num_gpus="4", pp="4", global_batch="8")
    depths = [p.vpp for p, _ in candidate_configs(derive_case(row(**base), 0), 8)]
    assert depths == [1, 2, 3, 4, 6, 12]
    # 6 micro-batches on pp 4: Megatron's interleaved schedule needs a multiple of pp -> only vpp 1
    depths = [p.vpp for p, _ in candidate_configs(derive_case(row(**dict(base, global_batch="6")), 0), 8)]
    assert depths == [1]
    # the Llama 3 stack takes unequal chunks: stages of 7 (first, last) and 8 layers -> depths 1 to 7;
    # Megatron would need every stage's count divisible by vpp -> 1 only
    llama = dict(base, layers="30", pp_first_stage_layers="7", pp_last_stage_layers="7")
    meta = dict(llama, framework="meta-internal", framework_version="", fsdp="true", zero="2")
    assert [p.vpp for p, _ in candidate_configs(derive_case(row(**meta), 0), 8)] == list(range(1, 8))
    assert [p.vpp for p, _ in candidate_configs(derive_case(row(**llama), 0), 8)] == [1]
    # Megatron-LM of 2021: layers divisible by pp * vpp, no embedding counted as a layer (50 = 48 + 2
    # would split over pp 2 x vpp 5 on Megatron-Core)
    sc21 = dict(base, pp="2", num_gpus="2", framework_version="Megatron-LM (SC21 paper, 2021)",
                precision="fp16", recompute="full")
    assert [p.vpp for p, _ in candidate_configs(derive_case(row(**sc21), 0), 8)] == [1, 2, 3, 4, 6, 8, 12, 24]


def test_open_split_and_depth_are_searched_together():
    case = derive_case(row(**dict(TINY, tp="", pp="")), 0)
    assert case.open_vpp and case.open_layout == (None, None)
    layouts = [(p.tp, p.pp, p.vpp) for p, _ in candidate_configs(case, 8)]
    assert layouts == [(1, 1, 1), (1, 2, 1), (1, 2, 2), (2, 1, 1)]
    pred = predict(case, _cache())
    assert pred.status == "ok"
    note = [a for a in case.assumptions if a.startswith("layout ")]
    assert len(note) == 1 and note[0].endswith("(not stated: the fastest feasible of 4 layouts searched, "
                                               "comet/validate/layout.py)")
    assert f" vpp={case.parallel.vpp} " in note[0]
