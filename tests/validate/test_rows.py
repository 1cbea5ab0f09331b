"""Measurement rows (schema v2) to cases: explicit cells win, empty cells take the framework's default and
are reported, bad cells skip only their row with the column and value, FLOP accounting per formula."""

from dataclasses import replace

import pytest

from comet.config.model import ModelSpec
from comet.config.parallel import Precision, Recompute, Schedule
from comet.errors import ConfigError
from comet.validate.accounting import flops_per_step, narayanan_flops_per_step
from comet.validate.frameworks import defaults_for
from comet.validate.rows import derive_case, load_cases, mark_held_out, read_csv
from comet.workload.flops import hardware_flops_per_step, model_flops_per_step

from csvrows import MEGATRON, MOSAIC, NARAYANAN, row, write_csv


def test_explicit_cells_win_and_are_not_assumptions():
    case = derive_case(row(), 0)
    assert not case.skip_reason
    p = case.parallel
    assert (p.recompute, p.sequence_parallel, p.precision, p.micro_batch) == \
        (Recompute.SELECTIVE, True, Precision.FP16, 4)
    assert not any(a.startswith(("recompute=", "precision=", "micro_batch=")) for a in case.assumptions)


def test_empty_cells_take_the_framework_default_and_say_so():
    kort = derive_case(row(), 0)     # 2022 Megatron-LM: unfused attention, no distributed optimizer
    assert kort.defaults.key == "megatron-lm (2021-22)"
    assert (kort.parallel.flash_attention, kort.parallel.zero) == (False, 0)
    assert any(a.startswith("zero=0") for a in kort.assumptions)
    nemo = derive_case(row(framework="nemo", framework_version="NeMo 24.09", gpu_model="h100-sxm-80gb", precision="",
                           recompute="", sequence_parallel="", micro_batch="", num_gpus="16", tp="8", pp="2",
                           global_batch="32", kv_heads="8", activation="swiglu", tied_embeddings="false"), 0)
    p = nemo.parallel
    assert (p.precision, p.zero, p.overlap_tp_comm, p.grad_dtype, p.micro_batch) == (Precision.BF16, 1, True, "bf16", 1)
    assert nemo.model.kv_heads == 8 and nemo.model.gated and not nemo.model.tied_embeddings
    for col in ("precision=bf16", "recompute=none", "micro_batch=1", "zero=1"):
        assert any(a.startswith(col) and "nemo default" in a for a in nemo.assumptions), col
    titan = derive_case(row(framework="torchtitan", framework_version="", fsdp="true", tp="1", recompute="",
                            num_gpus="8", global_batch="16", micro_batch="2"), 0)
    assert (titan.parallel.zero, titan.parallel.recompute, titan.model.vocab_pad_to) == (3, Recompute.SELECTIVE, 1)
    assert defaults_for("", "").key == "generic" and defaults_for("megatron-lm", "r0.8.0 2024").zero == 0


def test_fsdp_zero_2_is_shard_grad_op_where_the_framework_runs_pytorch_fsdp():
    cells = dict(fsdp="true", zero="2", tp="1", num_gpus="8", global_batch="8", micro_batch="1")
    foundry = derive_case(row(framework="llm-foundry", framework_version="", **cells), 0)
    assert foundry.parallel.shard_grad_op
    assert any(a.startswith("shard_grad_op=True (llm-foundry default") for a in foundry.assumptions)
    # Llama 3's FSDP keeps the weights gathered across micro-batches: step-level buckets, no assumption
    meta = derive_case(row(framework="meta-internal", framework_version="", **cells), 0)
    assert not meta.parallel.shard_grad_op and not any("shard_grad_op" in a for a in meta.assumptions)
    full = derive_case(row(framework="llm-foundry", framework_version="", **(cells | {"zero": "3"})), 0)
    assert not full.parallel.shard_grad_op


def test_source_text_does_not_change_defaults():
    a = derive_case(row(source=MOSAIC), 0)
    b = derive_case(row(source="some lab"), 0)
    assert a.parallel == b.parallel and a.assumptions == b.assumptions


def test_dp_is_derived_from_gpus_and_vpp_interleaves():
    case = derive_case(row(num_gpus="64", tp="8", pp="8", vpp="3", micro_batch="1", global_batch="64"), 0)
    par = case.parallel.resolve(case.model)
    assert par.dp == 1 and par.gpus == 64 and par.schedule is Schedule.INTERLEAVED and par.vpp == 3


def test_uneven_pipeline_columns_and_megatron_embedding_loss_split():
    llama = dict(layers="126", hidden="16384", heads="128", kv_heads="8", ffn_hidden="53248", activation="swiglu",
                 vocab="128256", tied_embeddings="false", seq_len="8192", gpu_model="h100-sxm-80gb",
                 framework="nemo", framework_version="NeMo 25.02", precision="bf16", recompute="none")
    first_last = derive_case(row(**llama, num_gpus="2048", tp="8", pp="16", global_batch="256", micro_batch="1",
                                 pp_first_stage_layers="7", pp_last_stage_layers="7"), 0)
    assert not first_last.skip_reason and first_last.parallel.chunk_layers(first_last.model)[0] == 7
    emb = derive_case(row(**llama, num_gpus="1024", tp="8", pp="8", vpp="8", global_batch="512", micro_batch="1"), 0)
    assert emb.parallel.pp_embedding_as_layer and any("embedding and loss" in a for a in emb.assumptions)


@pytest.mark.parametrize("cells, column, value", [
    (dict(precision="int4"), "precision", "int4"),
    (dict(tp="eight"), "tp", "eight"),
    (dict(activation="relu"), "activation", "relu"),
    (dict(dp="3", num_gpus="8"), "num_gpus", "8"),            # tp*pp*dp*cp = 24 != 8
    (dict(heads="60"), "heads", "60"),                          # hidden 6144 not divisible by 60 heads... rule on hidden
])
def test_bad_cells_skip_only_their_row_naming_column_and_value(tmp_path, cells, column, value):
    cases = load_cases(write_csv(tmp_path / "x.csv", [row(**cells), row()]))
    bad, good = cases
    assert bad.skip_reason.startswith("bad cell") and bad.bad_column in (column, "hidden")
    assert not good.skip_reason


def test_other_skips(small_csv, tmp_path):
    cases = load_cases(small_csv)
    assert [c.skip_reason for c in cases[:3]] == ["", "", ""]
    assert "global batch not stated" in cases[3].skip_reason
    moe = cases[4]   # MoE rows are modelled: the moe_* columns and ep / etp reach the model and layout
    assert moe.skip_reason == "" and (moe.model.moe.num_experts, moe.model.moe.experts_per_token) == (8, 2)
    assert (moe.parallel.ep, moe.parallel.etp) == (8, 1)
    rows = [row(gpu_model=""), row(layers=""), row(value="n/a"), row(metric="time_to_train_min")]
    c = load_cases(write_csv(tmp_path / "y.csv", rows))
    assert "gpu_model not given" in c[0].skip_reason
    assert "model shape not given (layers)" in c[1].skip_reason
    assert c[2].bad_column == "value"
    assert "total_tokens" in c[3].skip_reason


def test_flop_formulas():
    m = ModelSpec(name="gpt", layers=24, hidden=2304, heads=24, vocab=51200, seq_len=2048)
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    # SC21 eq. 3 by hand; it equals comet's executed FLOPs under full recompute (4 passes over the layers).
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert narayanan_flops_per_step(m, B) == pytest.approx(eq3)
    full = derive_case(row(source=NARAYANAN, recompute="full", tp="1", num_gpus="32", micro_batch="1",
                           global_batch="512"), 0).parallel
    full = replace(full, dp=32, gpus=32)
    assert hardware_flops_per_step(m, full) == pytest.approx(eq3, rel=2e-3)   # biases: eq. 3 has none
    eq7 = 72 * B * l * s * h * h * (1 + s / (6 * h) + V / (12 * h * l))
    assert flops_per_step("megatron_model", m, B) == pytest.approx(eq7) == pytest.approx(model_flops_per_step(m, B))
    palm = flops_per_step("palm_6n", m, B)
    foundry = flops_per_step("llm_foundry", m, B)
    assert foundry - palm == pytest.approx(6 * m.embedding_params * B * s)
    assert palm == pytest.approx((6 * l * m.layer_params + 12 * l * h * s) * B * s)


def test_missing_columns_and_file(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("source,model\nx,y\n")
    with pytest.raises(ConfigError, match="missing columns"):
        read_csv(p)
    with pytest.raises(ConfigError, match="file not found"):
        read_csv(tmp_path / "absent.csv")


def test_held_out_is_every_third_modelled_row_per_source(tmp_path):
    rows = [row(value=str(1 + i / 10)) for i in range(7)] + [row(source=NARAYANAN, metric="tflops_per_gpu",
                                                                 value="140") for _ in range(3)]
    cases = load_cases(write_csv(tmp_path / "h.csv", rows))
    assert [c.held_out for c in cases] == [False, False, True, False, False, True, False, False, False, True]
    again = load_cases(write_csv(tmp_path / "h2.csv", rows))
    mark_held_out(again)
    assert [c.held_out for c in again] == [c.held_out for c in cases]


def test_deepspeed_zero3_rows_issue_flat_dp_collectives_and_say_so():
    ds = dict(framework="deepspeed", framework_version="", tp="1", pp="1", num_gpus="16", global_batch="16",
              micro_batch="1", sequence_parallel="", recompute="", zero="3")
    case = derive_case(row(**ds), 0)
    assert case.parallel.dp_collective == "flat"
    assert any(a.startswith("dp_collective=flat") and "deepspeed default" in a for a in case.assumptions)
    z1 = derive_case(row(**dict(ds, zero="1")), 0)          # no per-layer gathers: nothing to flatten
    assert z1.parallel.dp_collective == "hierarchical"
    assert derive_case(row(), 0).parallel.dp_collective == "hierarchical"
