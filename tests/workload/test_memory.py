"""Memory model: Korthikanti's per-layer closed forms, pipeline in-flight counts, ZeRO sharding, offload,
and infeasibility reported as a result."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from comet.config.cluster import MemoryTier, load_cluster
from comet.config.model import Activation, ModelSpec, load_model
from comet.config.parallel import OffloadTarget, ParallelConfig, Recompute, Schedule
from comet.errors import ConfigError
from comet.workload.memory import (
    activation_bytes_per_layer, estimate_memory, in_flight_microbatches, stage_params,
)

ROOT = Path(__file__).resolve().parents[2]
A100 = ROOT / "cluster_specs" / "a100_dgx.yaml"
H100 = ROOT / "cluster_specs" / "h100_dgx.yaml"
PUBLISHED = ROOT / ".." / "shared" / "calibration" / "published.csv"


@pytest.fixture(scope="module")
def gpt3():
    return load_model("gpt3_175b")


@pytest.fixture(scope="module")
def a100():
    return load_cluster(A100)


def _par(model, **kw) -> ParallelConfig:
    base = dict(global_batch=64, tp=8, pp=1, dp=1, flash_attention=False)
    base.update(kw)
    return ParallelConfig(**base).resolve(model)


# -------------------------------------------------------------------------------- per-layer formulas
# GPT-3 175B layer, s=2048, b=1, h=12288, a=96, t=8: sbh = 25,165,824 and 5as/(ht) = 10, so
# Korthikanti Table 2 gives (in units of sbh) none 10+3+10 = 23, selective 13, SP 4.25+10 = 14.25,
# selective+SP 4.25, full 2, full+SP 0.25. Hand-multiplied:
@pytest.mark.parametrize("recompute, sp, expected_bytes", [
    (Recompute.NONE, False, 578_813_952),
    (Recompute.SELECTIVE, False, 327_155_712),
    (Recompute.NONE, True, 358_612_992),
    (Recompute.SELECTIVE, True, 106_954_752),
    (Recompute.FULL, False, 50_331_648),
    (Recompute.FULL, True, 6_291_456),
])
def test_layer_activations_match_korthikanti_closed_forms(gpt3, recompute, sp, expected_bytes):
    par = _par(gpt3, recompute=recompute, sequence_parallel=sp)
    assert activation_bytes_per_layer(gpt3, par) == pytest.approx(expected_bytes, rel=1e-12)


def test_flash_attention_drops_the_s_squared_terms(gpt3):
    """Flash attention keeps no s x s scores, only its fp32 log-sum-exp per head and query (4 bytes x s x a,
    split over tp): unfused selective recompute plus those statistics."""
    flash = _par(gpt3, recompute=Recompute.NONE, flash_attention=True)
    selective = _par(gpt3, recompute=Recompute.SELECTIVE)
    lse = 4 * gpt3.seq_len * 1 * gpt3.heads / 8
    assert activation_bytes_per_layer(gpt3, flash) == activation_bytes_per_layer(gpt3, selective) + lse


def test_gqa_and_swiglu_terms_by_hand():
    # h=64, 4 heads of 16, 1 KV head (K and V 16 wide), SwiGLU ffn 128, s=32, b=2 (sb=64), t=1, no flash:
    #   outside TP regions 10*sb*h                                   = 40,960
    #   inside: Q+K 2sb(64+16) + V 2sb*16 + proj 2sb*64 + gate&up 2*2sb*128 + out 2sb*128
    #         = 64 * (160 + 32 + 128 + 512 + 256)                    = 69,632
    #   scores 5*a*s^2*b = 5*4*1024*2                                = 40,960
    tiny = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=1, ffn_hidden=128,
                     activation=Activation.SWIGLU, vocab=128, seq_len=32)
    par = ParallelConfig(global_batch=2, dp=1, micro_batch=2, flash_attention=False).resolve(tiny)
    assert activation_bytes_per_layer(tiny, par) == 151_552


def test_ffn_width_and_gqa_generalize_korthikanti(gpt3):
    # The 24sbh inside-TP term is Q,K,V 6sbh + projection 2sbh + GeLU in/out 16sbh: halving ffn removes
    # 8sbh, grouping K and V to 1/8 width removes 2 * 2sbh * 7/8 = 3.5sbh (t=1, selective).
    sbh = 2048 * 12288
    base = activation_bytes_per_layer(gpt3, _par(gpt3, tp=1, recompute=Recompute.SELECTIVE))
    narrow = replace(gpt3, ffn_hidden=2 * 12288)
    gqa = replace(gpt3, kv_heads=12)
    assert base == 34 * sbh
    assert activation_bytes_per_layer(narrow, _par(narrow, tp=1, recompute=Recompute.SELECTIVE)) == 26 * sbh
    assert activation_bytes_per_layer(gqa, _par(gqa, tp=1, recompute=Recompute.SELECTIVE)) == 30.5 * sbh


def test_activations_scale_linearly_with_micro_batch(gpt3):
    one = activation_bytes_per_layer(gpt3, _par(gpt3, micro_batch=1))
    four = activation_bytes_per_layer(gpt3, _par(gpt3, micro_batch=4))
    assert four == 4 * one


# -------------------------------------------------------------------------------- Korthikanti's claims
@pytest.mark.parametrize("name", ["gpt3_175b", "mt_nlg_530b", "gpt3_1t"])
def test_sequence_parallel_plus_selective_cuts_activations_about_5x(name):
    # Korthikanti et al. MLSys23, abstract: "reduce activation memory by 5x" (vs tensor parallelism alone).
    model = load_model(name)
    baseline = activation_bytes_per_layer(model, _par(model, recompute=Recompute.NONE, sequence_parallel=False))
    ours = activation_bytes_per_layer(model, _par(model, recompute=Recompute.SELECTIVE, sequence_parallel=True))
    assert baseline / ours == pytest.approx(5.0, rel=0.10)


@pytest.mark.parametrize("name, reduction", [("gpt3_175b", 0.70), ("mt_nlg_530b", 0.65)])
def test_selective_recompute_reduction_for_gpt3_and_mt_nlg(name, reduction):
    # Korthikanti et al. MLSys23 Sec 5 (selective activation recomputation): 5as/h = 80 for GPT-3 and
    # 64 for MT-NLG, so selective recompute saves 70% and 65% of the activation memory.
    model = load_model(name)
    none = activation_bytes_per_layer(model, _par(model, tp=1, recompute=Recompute.NONE))
    sel = activation_bytes_per_layer(model, _par(model, tp=1, recompute=Recompute.SELECTIVE))
    assert 1 - sel / none == pytest.approx(reduction, rel=0.10)


# -------------------------------------------------------------------------------- pipeline stages
def test_in_flight_microbatches_per_schedule(gpt3):
    one_f = _par(gpt3, global_batch=64, pp=8)
    assert [in_flight_microbatches(one_f, s) for s in (0, 3, 7)] == [8, 5, 1]
    few = _par(gpt3, global_batch=4, pp=8)            # fewer micro-batches than stages
    assert in_flight_microbatches(few, 0) == 4
    gpipe = _par(gpt3, global_batch=64, pp=8, schedule=Schedule.GPIPE)
    assert in_flight_microbatches(gpipe, 7) == 64
    inter = _par(gpt3, global_batch=64, pp=8, vpp=3, schedule=Schedule.INTERLEAVED)
    assert in_flight_microbatches(inter, 0) == pytest.approx(8 * (1 + 7 / (8 * 3)))   # Korthikanti Sec 4.2.3


def test_first_stage_holds_all_layers_worth_of_activations(gpt3, a100):
    # Korthikanti Sec 4.2.3: with 1F1B the first stage stores pp micro-batches of L/pp layers, i.e.
    # 34sbhL/t (selective + SP) regardless of pp, plus the embedding dropout mask sbh/t per micro-batch.
    sbh = 2048 * 12288
    par = _par(gpt3, pp=8, recompute=Recompute.SELECTIVE, sequence_parallel=True)
    est = estimate_memory(gpt3, par, a100)
    expected = (34 * sbh * 96 / 8 + 8 * sbh / 8) / 1e9
    assert est.activations_GB == pytest.approx(expected, rel=1e-12)


def test_single_stage_adds_embedding_and_output_activations(gpt3, a100):
    # pp=1, t=8, SP + selective, one micro-batch in flight (Korthikanti Sec 4.3):
    #   96 layers x 106,954,752 = 10,267,656,192; embedding dropout mask sbh/t = 3,145,728;
    #   final layernorm + output projection inputs 4sbh/t = 12,582,912; fp32 logits 4sbV/t = 52,428,800
    par = _par(gpt3, pp=1, recompute=Recompute.SELECTIVE, sequence_parallel=True)
    est = estimate_memory(gpt3, par, a100)
    assert est.activations_GB * 1e9 == pytest.approx(10_335_813_632, rel=1e-12)


def test_stage_params_add_up_to_the_model(gpt3):
    for tied in (True, False):
        model = replace(gpt3, tied_embeddings=tied)
        par = _par(model, tp=8, pp=4)
        per_stage = sum(stage_params(model, par, s) for s in range(4)) * 8
        copy = model.vocab * model.hidden if tied else 0          # tied: the last stage keeps a copy
        assert per_stage == pytest.approx(model.params + copy + 2 * model.hidden * 7, rel=1e-9)


# -------------------------------------------------------------------------------- state and ZeRO
def test_zero_stages_divide_state_by_the_data_parallel_group(gpt3, a100):
    kw = dict(tp=8, pp=1, dp=8, cp=2, global_batch=64, recompute=Recompute.FULL)
    z0, z1, z2, z3 = (estimate_memory(gpt3, _par(gpt3, zero=z, **kw), a100) for z in range(4))
    group = 8 * 2
    assert z1.optimizer_GB == pytest.approx(z0.optimizer_GB / group)
    assert z1.gradients_GB == z0.gradients_GB and z1.weights_GB == z0.weights_GB
    assert z2.gradients_GB == pytest.approx(z0.gradients_GB / group)
    layer_GB = 2 * gpt3.layer_params / 8 * 2 / 1e9                  # two gathered layers, bf16, /tp
    assert z3.weights_GB == pytest.approx(z0.weights_GB / group + layer_GB)
    # 16 bytes/param mixed-precision Adam (ZeRO Sec 3.1) + 2 more for Megatron's fp32 main gradients
    params = gpt3.params / 8
    assert z0.weights_GB + z0.gradients_GB + z0.optimizer_GB == pytest.approx(18 * params / 1e9, rel=1e-3)


def test_recompute_orders_memory(gpt3, a100):
    totals = [estimate_memory(gpt3, _par(gpt3, pp=8, recompute=r), a100).activations_GB
              for r in (Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE)]
    assert totals[0] < totals[1] < totals[2]


# -------------------------------------------------------------------------------- feasibility
def test_too_big_for_80GB_is_infeasible_with_a_reason(gpt3, a100):
    est = estimate_memory(gpt3, _par(gpt3, tp=8, pp=1, dp=8), a100)   # 175B over 8 GPUs
    assert not est.fits
    assert est.total_GB > 80
    assert f"needs {est.total_GB:.1f} GB per GPU" in est.reason and "HBM holds 80 GB" in est.reason
    assert f"weights {est.weights_GB:.1f}" in est.reason
    assert est.as_dict()["weights"] == est.weights_GB
    parts = est.as_dict()
    assert sum(v for k, v in parts.items() if k != "expansion") == pytest.approx(est.total_GB)


def test_published_a100_and_mpt_runs_fit_in_80GB(a100):
    # The configurations in published.csv were run on 80 GB GPUs, so they must fit. Korthikanti/Narayanan
    # (Megatron, 2021-22): no distributed optimizer (zero 0), no flash attention; MPT: FSDP FULL_SHARD =
    # ZeRO-3, SHARD_GRAD_OP = ZeRO-2, flash attention. A missing micro-batch is taken as 1.
    if not PUBLISHED.is_file():
        pytest.skip("../shared/calibration/published.csv not found")
    h100 = load_cluster(H100)
    checked = []
    for row in csv.DictReader(PUBLISHED.open()):
        par, cluster = _published_config(row, a100, h100)
        if par is None:
            continue
        model = next(load_model(n) for n in _ZOO_BY_SHAPE if _shape(load_model(n)) == _row_shape(row))
        est = estimate_memory(model, par.resolve(model), cluster)
        assert est.fits, f"{row['model']} {par.label() if par.dp else ''}: {est.reason}"
        checked.append(row["model"])
    assert len(checked) >= 30


_ZOO_BY_SHAPE = ("gpt_1_7b", "gpt_3_6b", "gpt_7_5b", "gpt_18_4b", "gpt_39_1b", "gpt_76_1b", "gpt_145_6b",
                 "gpt_310_1b", "gpt_529_6b", "gpt3_1t", "gpt_22b", "gpt3_175b", "mpt_1b", "mpt_3b", "mpt_7b",
                 "mpt_13b", "mpt_30b", "mpt_70b")


def _shape(m: ModelSpec) -> tuple:
    return (m.layers, m.hidden, m.heads, m.seq_len, m.vocab)


def _row_shape(row: dict) -> tuple:
    return tuple(int(row[k]) for k in ("layers", "hidden", "heads", "seq_len", "vocab"))


def _published_config(row: dict, a100, h100):
    """The ParallelConfig a published row ran with, or None where the row does not say enough."""
    known = row["source"].startswith(("Narayanan", "Korthikanti", "mosaicml"))
    if not known or "single transformer layer" in row["model"]:
        return None, None
    mpt = row["source"].startswith("mosaicml")
    recompute = Recompute.FULL if row["recompute"].startswith("full") else Recompute.SELECTIVE
    if row["recompute"] == "none":
        recompute = Recompute.NONE
    vpp = int(row["vpp"] or 1)
    zero = (2 if "SHARD_GRAD_OP" in row["notes"] else 3) if mpt else 0
    par = ParallelConfig(
        global_batch=int(row["global_batch"]), tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
        micro_batch=int(row["micro_batch"] or 1), vpp=vpp, recompute=recompute, zero=zero,
        schedule=Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B,
        sequence_parallel="+ sequence parallelism" in row["recompute"] or row["recompute"].endswith("+ SP"),
        flash_attention=mpt)
    return par, (h100 if mpt else a100)


# -------------------------------------------------------------------------------- offload
def _with_tier(cluster, capacity_GB):
    return cluster.with_changes(memory_expansion=MemoryTier(name="host DDR", capacity_GB=capacity_GB,
                                                            bandwidth_GBps=50))


def test_optimizer_offload_moves_state_to_the_expansion_tier(gpt3, a100):
    par = _par(gpt3, tp=8, pp=1, dp=8)
    before = estimate_memory(gpt3, par, a100)
    after = estimate_memory(gpt3, replace(par, offload=(OffloadTarget.OPTIMIZER,)), _with_tier(a100, 2000))
    assert after.optimizer_GB == 0
    assert after.expansion_GB == pytest.approx(before.optimizer_GB)
    assert after.total_GB == pytest.approx(before.total_GB - before.optimizer_GB)


def test_weight_and_activation_offload_keep_two_layers_and_one_layer(gpt3, a100):
    par = _par(gpt3, tp=8, pp=8, recompute=Recompute.SELECTIVE, sequence_parallel=True)
    tier = _with_tier(a100, 2000)
    before = estimate_memory(gpt3, par, tier)
    weights = estimate_memory(gpt3, replace(par, offload=(OffloadTarget.WEIGHTS,)), tier)
    assert weights.weights_GB == pytest.approx(2 * gpt3.layer_params / 8 * 2 / 1e9)
    assert weights.expansion_GB == pytest.approx(before.weights_GB, rel=1e-4)   # worst stage: +final norm
    single = _par(gpt3, tp=8, pp=1, recompute=Recompute.SELECTIVE, sequence_parallel=True)  # one stage: HBM and tier figures of the same stage
    before = estimate_memory(gpt3, single, tier)
    acts = estimate_memory(gpt3, replace(single, offload=(OffloadTarget.ACTIVATIONS,)), tier)
    assert acts.activations_GB < before.activations_GB / 50
    assert acts.expansion_GB + acts.activations_GB == pytest.approx(before.activations_GB)


def test_offload_without_a_tier_or_beyond_its_capacity_is_infeasible(gpt3, a100):
    par = replace(_par(gpt3, tp=8, pp=8), offload=(OffloadTarget.OPTIMIZER,))
    none = estimate_memory(gpt3, par, a100)
    assert not none.fits and "needs a memory expansion tier" in none.reason
    small = estimate_memory(gpt3, par, _with_tier(a100, 1))
    assert not small.fits and "holds 1 GB per GPU" in small.reason
    assert estimate_memory(gpt3, par, _with_tier(a100, 1000)).fits


def test_a100_spec_has_datasheet_peaks_and_no_fp8(a100):
    assert a100.gpu.peak_flops("bf16") == 312e12 and a100.gpu.hbm_GB == 80 and a100.network[0].size == 8
    with pytest.raises(ConfigError, match="no fp8 peak"):
        a100.gpu.peak_flops("fp8")


@pytest.mark.parametrize("name, par", [
    ("gpt3_175b", dict(tp=8, pp=8, gpus=1024, global_batch=1536, recompute=Recompute.SELECTIVE)),
    ("gpt3_175b", dict(tp=1, pp=1, gpus=8, global_batch=8)),                       # does not fit: a reason
    ("gpt3_175b", dict(tp=8, pp=4, gpus=256, global_batch=512, zero=1, offload=(OffloadTarget.OPTIMIZER,))),
    ("qwen3_30b_a3b", dict(tp=1, pp=1, ep=8, gpus=8, global_batch=8)),             # MoE: expert fields
])
def test_the_estimate_is_built_as_its_constructor_builds_it(name, par, h100):
    """estimate_memory builds its MemoryEstimate without the frozen dataclass's __init__ (perf): the
    object equals the constructor's from the same values, with every field, in declaration order."""
    import dataclasses
    from comet.workload.memory import MemoryEstimate, estimate_memory
    model = load_model(name)
    est = estimate_memory(model, ParallelConfig(**par).resolve(model), h100)
    names = [f.name for f in dataclasses.fields(MemoryEstimate)]
    assert list(vars(est)) == names
    assert est == MemoryEstimate(**vars(est)) and repr(est) == repr(MemoryEstimate(**vars(est)))
