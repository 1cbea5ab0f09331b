"""Knobs a row leaves empty: the memory-saving ladder (a run that ran fitted) and the layout search
(a run whose tp x pp split is not stated was tuned: the fastest feasible layout)."""

from dataclasses import replace

import pytest

from comet.config.parallel import Recompute
from comet.evaluate import evaluate
from comet.validate.layout import candidate_layouts
from comet.validate.predict import ClusterCache, predict
from comet.validate.rows import derive_case, layout_config, load_cases
from comet.validate.runner import repo_root
from comet.workload.memory import estimate_memory

from csvrows import row, write_csv

# A small GPT on one 80 GB A100, as Megatron-LM of 2021 ran it (fp16, unfused attention, dropout, no
# selective recompute): micro-batch 64 of 2048 tokens keeps far more activations than HBM holds.
TINY = dict(params_b="0.1", layers="4", hidden="1024", heads="16", ffn_hidden="4096", seq_len="2048", vocab="51200",
            num_gpus="1", tp="1", pp="1", micro_batch="64", global_batch="64", recompute="",
            sequence_parallel="false", framework_version="Megatron-LM (SC21 paper, 2021)")


def _cache():
    return ClusterCache(repo_root() / "cluster_specs")


def test_tiny_model_whose_default_does_not_fit_runs_with_full_recompute():
    s, b, h, a, L = 2048, 64, 1024, 16, 4
    # Korthikanti Table 2, no recompute, tp 1: sbh(34 + 5as/h) bytes per layer -> 4 layers alone > 80 GB
    by_hand = L * s * b * h * (34 + 5 * a * s / h) / 1e9
    assert by_hand > 80
    case = derive_case(row(**TINY), 0)
    pred = predict(case, _cache())
    assert pred.status == "ok" and case.parallel.recompute is Recompute.FULL
    default = replace(case.parallel, recompute=Recompute.NONE).resolve(case.model)
    needs = estimate_memory(case.model, default, _cache().get("a100_dgx.yaml")).total_GB
    assert needs > by_hand
    assert f"recompute=full (not stated; none does not fit: needs {needs:.1f} GB per GPU)" in case.assumptions
    assert not any(x.startswith("recompute=none") for x in case.assumptions)   # the default note is replaced
    assert pred.memory_GB <= 80 * 1.05


def test_explicit_cells_win_over_the_ladder_and_nothing_that_fits_stays_infeasible():
    stated = derive_case(row(**dict(TINY, recompute="none")), 0)
    pred = predict(stated, _cache())
    assert pred.status == "infeasible" and "needs" in pred.reason and stated.parallel.recompute is Recompute.NONE
    assert not any("not stated;" in x for x in stated.assumptions)
    huge = derive_case(row(**dict(TINY, micro_batch="512", global_batch="512")), 0)   # even full does not fit
    pred = predict(huge, _cache())
    assert pred.status == "infeasible" and "HBM holds 80 GB" in pred.reason
    assert any(x.startswith("recompute=full (not stated;") for x in huge.assumptions)


def test_ladder_order_free_steps_first_and_bf16_optimizer_state_only_where_expressible():
    # Megatron-Core (zero 0 default): the distributed optimizer comes before any recompute
    llama = dict(layers="32", hidden="4096", heads="32", kv_heads="8", ffn_hidden="14336", activation="swiglu",
                 vocab="128256", tied_embeddings="false", seq_len="8192", gpu_model="h100-sxm-80gb",
                 num_gpus="8", tp="1", pp="1", cp="1", micro_batch="1", global_batch="128", precision="bf16",
                 recompute="", sequence_parallel="", framework="megatron-lm", framework_version="core_r0.9.0")
    case = derive_case(row(**llama), 0)
    assert predict(case, _cache()).status == "ok"
    steps = [x.split(" ")[0] for x in case.assumptions if "not stated;" in x]
    assert steps[0] == "zero=1" and case.parallel.zero == 1
    # the BF16 optimizer state halves the Adam bytes (12 -> 6 per parameter)
    par = case.parallel.resolve(case.model)
    cluster = _cache().get("h100_dgx.yaml")
    fp32 = estimate_memory(case.model, par, cluster).optimizer_GB
    bf16 = estimate_memory(case.model, replace(par, optimizer_dtype="bf16"), cluster).optimizer_GB
    assert bf16 == pytest.approx(fp32 / 2)
    nemo = derive_case(row(**dict(llama, framework="nemo", framework_version="24.09")), 0)
    bridge = derive_case(row(**dict(llama, framework="megatron-bridge", framework_version="25.09")), 0)
    assert nemo.defaults.bf16_optimizer_state and not bridge.defaults.bf16_optimizer_state


def test_model_parallel_size_given_but_not_the_split_takes_the_fastest_layout():
    # 16 GPUs, dp 2 stated: tp*pp = 8 -> (1, 8), (2, 4), (4, 2), (8, 1); 48 layers divide by every pp
    # (vpp stated: the depth search is tests/validate/test_interleave.py)
    cells = dict(num_gpus="16", dp="2", tp="", pp="", vpp="1", micro_batch="1", global_batch="16", recompute="selective",
                 framework_version="Megatron-LM (SC21 paper, 2021)")
    case = derive_case(row(**cells), 0)
    assert not case.skip_reason and case.open_layout == (None, None)
    cluster = _cache().get("a100_dgx.yaml")
    layouts = candidate_layouts(case, cluster.gpus_per_node)
    assert layouts == [(1, 8), (2, 4), (4, 2), (8, 1)]
    times = {}
    for tp, pp in layouts:
        res = evaluate(case.model, cluster, layout_config(case, tp, pp)[0])
        if res.feasible:
            times[(tp, pp)] = res.step_time_s
    pred = predict(case, _cache())
    assert pred.status == "ok" and case.open_layout is None
    fastest = min(times, key=times.get)
    assert (case.parallel.tp, case.parallel.pp) == fastest
    assert pred.predicted == pytest.approx(times[fastest])
    note = [x for x in case.assumptions if x.startswith("layout ")]
    assert note == [f"layout tp={fastest[0]} pp={fastest[1]} dp=2 (not stated: the fastest feasible of 4 layouts "
                    "searched, comet/validate/layout.py)"]


def test_layout_candidates_respect_layers_heads_and_the_framework():
    # Narayanan Table 2, 530B: tp*pp = 560/2 = 280 and 105 layers -> only tp 8 x pp 35 (4 x 70 leaves
    # 105/70 uneven, which 2021 Megatron-LM cannot run; 2 x 140 has more stages than layers)
    big = dict(layers="105", hidden="20480", heads="128", ffn_hidden="81920", num_gpus="560", dp="2", tp="", pp="",
               micro_batch="1", global_batch="2240", framework_version="Megatron-LM (SC21 paper, 2021)")
    assert candidate_layouts(derive_case(row(**big), 0), 8) == [(8, 35)]
    # tp stated, pp open; heads 64 rule out nothing here, tp 8 x pp in divisors of 64/8 = 8 dividing 48 layers
    half = derive_case(row(num_gpus="64", tp="8", pp="", micro_batch="1", global_batch="64",
                           framework_version="Megatron-LM (SC21 paper, 2021)"), 0)
    assert candidate_layouts(half, 8) == [(8, 1), (8, 2), (8, 4), (8, 8)]
    # Megatron-Core runs uneven stages: pp 5 is a candidate for 48 layers
    core = derive_case(row(num_gpus="40", tp="8", pp="", micro_batch="1", global_batch="40", framework="nemo",
                           framework_version="24.09", precision="bf16"), 0)
    assert (8, 5) in candidate_layouts(core, 8)


@pytest.mark.parametrize("cells, column, value", [
    (dict(tp="", pp="", precision="int4"), "precision", "int4"),
    (dict(tp="", pp="", zero="two"), "zero", "two"),
    (dict(tp="", pp="", num_gpus="-8"), "num_gpus", "-8"),
])
def test_open_layout_rows_still_report_bad_cells_per_row(tmp_path, cells, column, value):
    bad, good = load_cases(write_csv(tmp_path / "x.csv", [row(**cells), row()]))
    assert bad.skip_reason.startswith("bad cell") and bad.bad_column == column and value in bad.skip_reason
    assert not good.skip_reason


@pytest.mark.slow
def test_published_rows_stated_less_still_fit(tmp_path):
    """Sources that state less (issue 11: unseen rows of the same schema): the shipped rows with every
    memory-saving knob and the layout cleared are predicted with <= 2 time rows infeasible and >= 90%
    predicted."""
    import csv

    from comet.validate.runner import default_csv, run_validation
    src = default_csv()
    if not src.is_file():
        pytest.skip("../shared/calibration/measurements.csv not found")
    with src.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for col in ("zero", "recompute", "recompute_layers", "fp8_params", "sequence_parallel"):
            r[col] = ""
        if r["num_gpus"]:
            r["tp"] = r["pp"] = r["dp"] = ""
    out = tmp_path / "stated_less.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cov = run_validation(out).summary["time_coverage"]
    assert cov["infeasible"] <= 2 and cov["ok"] / cov["rows"] >= 0.90


def test_cli_and_json_report_the_chosen_settings(tmp_path, capsys):
    import json

    from comet.cli import main
    csv = write_csv(tmp_path / "t.csv", [row(**TINY)])
    out = tmp_path / "t.json"
    assert main(["validate", str(csv), "--quiet", "--json", str(out)]) == 0
    assert "row 0 (GPT 22B) assumed recompute=full (not stated; none does not fit" in capsys.readouterr().out
    r = json.loads(out.read_text())["rows"][0]
    assert r["status"] == "ok" and any(a.startswith("recompute=full (not stated;") for a in r["assumptions"])


def test_open_layout_that_nothing_matches_is_infeasible_with_the_reason():
    # 10 GPUs, global batch 7: dp must divide 7 and 10 -> dp 1, tp*pp = 10 -> (1, 10), (2, 5); neither pp
    # divides 48 layers, and 2021 Megatron-LM has no uneven stages
    case = derive_case(row(num_gpus="10", tp="", pp="", micro_batch="1", global_batch="7",
                           framework_version="Megatron-LM (SC21 paper, 2021)"), 0)
    assert candidate_layouts(case, 8) == []
    pred = predict(case, _cache())
    assert pred.status == "infeasible" and "no tp x pp split matches num_gpus 10" in pred.reason
