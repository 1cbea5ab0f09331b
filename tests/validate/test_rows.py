"""Row derivation: what each source leaves implicit, recompute / precision parsing, FLOP accounting."""

import pytest

from comet.config.model import ModelSpec
from comet.config.parallel import Precision, Recompute, Schedule
from comet.errors import ConfigError
from comet.validate.rows import derive_case, load_cases, mark_held_out, parse_precision, parse_recompute, read_csv
from comet.validate.sources import Accounting, flops_per_step, narayanan_flops_per_step, profile_for
from comet.workload.flops import hardware_flops_per_step, model_flops_per_step

from csvrows import MEGATRON, MOSAIC, NARAYANAN, row, write_csv


@pytest.mark.parametrize("text, mode, sp", [
    ("selective + sequence parallelism", Recompute.SELECTIVE, True),
    ("full (no sequence parallelism)", Recompute.FULL, False),
    ("full (no SP)", Recompute.FULL, False),
    ("none + SP", Recompute.NONE, True),
    ("selective + SP", Recompute.SELECTIVE, True),
    ("selective", Recompute.SELECTIVE, None),
    ("none", Recompute.NONE, None),
    ("microbatch-level selective + SP", Recompute.SELECTIVE, True),
    ("full", Recompute.FULL, None),
])
def test_recompute_parsing(text, mode, sp):
    got_mode, got_sp, note = parse_recompute(text, "none")
    assert (got_mode, got_sp) == (mode, sp)
    assert bool(note) == ("microbatch-level" in text)


def test_recompute_blank_takes_the_source_default_and_garbage_is_rejected():
    assert parse_recompute("", "full")[0] is Recompute.FULL
    with pytest.raises(ConfigError, match="recompute"):
        parse_recompute("sometimes", "none")


def test_precision_parsing():
    assert parse_precision("bf16 (amp_bf16)", "bf16") is Precision.BF16
    assert parse_precision("mixed", "bf16") is Precision.FP16
    assert parse_precision("", "bf16") is Precision.BF16
    with pytest.raises(ConfigError, match="precision"):
        parse_precision("int4", "bf16")


def test_dp_is_derived_from_gpus():
    case = derive_case(row(num_gpus="64", tp="8", pp="8", dp="", vpp="3", micro_batch="1", global_batch="64"), 0)
    assert not case.skip_reason
    par = case.parallel.resolve(case.model)
    assert par.dp == 1 and par.gpus == 64
    assert par.schedule is Schedule.INTERLEAVED and par.vpp == 3
    case = derive_case(row(source=NARAYANAN, num_gpus="1536", tp="8", pp="8", dp="", micro_batch="",
                           global_batch="2304", recompute="full", layers="80", hidden="12288", heads="96",
                           ffn_hidden="49152"), 1)
    assert case.parallel.resolve(case.model).dp == 24


def test_source_defaults():
    kort = derive_case(row(), 0)
    assert kort.profile.key == "korthikanti"
    p = kort.parallel
    assert (p.recompute, p.sp, p.flash_attention, p.zero, p.precision) == \
        (Recompute.SELECTIVE, True, False, 0, Precision.FP16)
    assert not p.overlap_grad_reduce

    meg = derive_case(row(source=MEGATRON, gpu="H100", num_gpus="96", tp="2", pp="1", micro_batch="",
                          global_batch="192", recompute="", precision=""), 0)
    p = meg.parallel
    assert p.micro_batch == 1 and any("micro-batch 1" in a for a in meg.assumptions)
    assert (p.zero, p.flash_attention, p.overlap_tp_comm, p.precision) == (1, True, True, Precision.BF16)
    assert meg.cluster_file == "h100_dgx.yaml"

    full = derive_case(row(source=MOSAIC, gpu="H100-80GB", num_gpus="128", tp="1", pp="1", micro_batch="8",
                           global_batch="1024", recompute="full", precision="bf16 (amp_bf16)",
                           notes="PyTorch FSDP FULL_SHARD (pure data parallel)"), 0)
    grad_op = derive_case(row(source=MOSAIC, gpu="H100-80GB", num_gpus="128", tp="1", pp="1", micro_batch="8",
                              global_batch="1024", recompute="none", notes="PyTorch FSDP SHARD_GRAD_OP"), 0)
    assert (full.parallel.zero, grad_op.parallel.zero) == (3, 2)
    assert full.parallel.flash_attention


def test_flop_accounting_switch():
    assert profile_for(NARAYANAN).accounting is Accounting.NARAYANAN_RECOMPUTE
    assert profile_for(MEGATRON).accounting is Accounting.MODEL
    assert profile_for("some other lab").key == "generic"
    m = ModelSpec(name="gpt", layers=24, hidden=2304, heads=24, vocab=51200, seq_len=2048)
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    # SC21 eq. 3 by hand; it equals comet's executed FLOPs under full recompute (4 passes over the layers).
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert narayanan_flops_per_step(m, B) == pytest.approx(eq3)
    full = derive_case(row(source=NARAYANAN, recompute="full", tp="1", num_gpus="32", micro_batch="1",
                           global_batch="512"), 0).parallel
    from dataclasses import replace
    full = replace(full, dp=32, gpus=32)
    assert hardware_flops_per_step(m, full) == pytest.approx(eq3)
    # Korthikanti eq. 7 (model FLOPs): 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL)).
    eq7 = 72 * B * l * s * h * h * (1 + s / (6 * h) + V / (12 * h * l))
    assert flops_per_step(Accounting.MODEL, m, B) == pytest.approx(eq7) == pytest.approx(model_flops_per_step(m, B))
    assert eq3 / eq7 > 1.3


def test_skip_reasons(small_csv):
    cases = load_cases(small_csv)
    reasons = [c.skip_reason for c in cases]
    assert reasons[:3] == ["", "", ""]
    assert "TP/PP not stated" in reasons[3]
    assert "expert parallelism" in reasons[4]


def test_unknown_gpu_metric_and_missing_shape_are_skipped(tmp_path):
    rows = [row(gpu="TPU v5p"), row(metric="watts"), row(layers=""), row(value="n/a")]
    cases = load_cases(write_csv(tmp_path / "x.csv", rows))
    assert "no cluster spec for GPU" in cases[0].skip_reason
    assert "metric 'watts'" in cases[1].skip_reason
    assert "model shape not given (layers)" in cases[2].skip_reason
    assert "not a positive number" in cases[3].skip_reason


def test_bad_cell_names_row_and_field(tmp_path):
    case = load_cases(write_csv(tmp_path / "x.csv", [row(tp="eight")]))[0]
    assert "row 2" in case.skip_reason and "tp" in case.skip_reason


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
