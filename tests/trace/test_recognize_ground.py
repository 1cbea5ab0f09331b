"""Recognition of a real LLM step (Megatron-LM GPT, TP 8 on 8 A100s), per-op grounding of comet's base in
it, and the base mattering in evaluation: a trace with 20% slower GEMMs slows every candidate's GEMMs by
20% and reorders candidates by their GEMM share."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from comet.cli import main
from comet.config.cluster import load_cluster
from comet.config.parallel import Recompute
from comet.evaluate import evaluate
from comet.graph.ir import KernelClass
from comet.trace.ground import ground, model_of, parallel_of
from comet.trace.recognize import recognize
from comet.trace.replay import replay_trace
from comet.trace import load_trace
from comet.transform import transform_to

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = "llm_megatron_gpt_tp8_a100"
CPU_TRACES = ROOT / "data" / "traces" / "cpu"
GEMM = re.compile(r"gemm|cutlass|cublas|xmma", re.I)


@pytest.fixture(scope="module")
def megatron(traces):
    return recognize(traces / MEGATRON)


@pytest.fixture(scope="module")
def a100():
    return load_cluster(ROOT / "cluster_specs" / "a100_dgx.yaml")


def test_inspect_recognises_megatron_gpt(traces, capsys):
    assert main(["trace", "inspect", str(traces / MEGATRON), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = {k: d[k] for k in ("layers", "hidden", "heads", "ffn_hidden", "seq_len", "micro_batch", "tp", "dtype")}
    assert got == {"layers": 40, "hidden": 4096, "heads": 64, "ffn_hidden": 16384, "seq_len": 2048,
                   "micro_batch": 4, "tp": 8, "dtype": "fp16"}
    assert d["ranks"] == list(range(8)) and d["vocab"] == 51200 and d["dp"] == 1
    assert d["phases"] == ["forward"] and d["activation"] == "gelu" and not d["unrecognised"]
    assert len(d["per_layer_ms"]) == 40 and all(3.0 < x < 30.0 for x in d["per_layer_ms"])
    # every role of a Megatron layer's forward got a measured time
    for role in ("input_norm", "qkv", "attention.qk", "attention.softmax_dropout", "attention.pv", "proj",
                 "proj.all_reduce", "attention.dropout_add", "mlp_norm", "fc1", "gelu", "fc2", "fc2.all_reduce",
                 "mlp.dropout_add"):
        assert d["role_ms"][role] > 0, role


def test_megatron_replay_within_5_percent_every_rank(traces):
    rep = replay_trace(load_trace(traces / MEGATRON))
    assert [r.rank for r in rep.ranks] == list(range(8))
    for r in rep.ranks:
        assert 0.5 < r.measured_s < 0.7 and abs(r.error_pct) < 5.0, r


def test_grounding_keeps_measured_ops_and_models_the_missing_backward(megatron, a100):
    base, report = ground(megatron, a100)
    fwd = {op.name: op for _, op in base.blocks["layer.fwd"].nodes(data="op")}
    assert fwd["qkv"].duration_s == pytest.approx(megatron.role_ms["qkv"] * 1e-3, rel=1e-12)
    assert fwd["fc2.all_reduce"].duration_s == pytest.approx(megatron.role_ms["fc2.all_reduce"] * 1e-3, rel=1e-12)
    sources = {(blk, name): src for blk, name, src, _ in report.ops}
    assert sources[("layer.fwd", "fc1")] == "measured"
    assert sources[("layer.bwd", "fc1.dgrad")] == "modelled"        # forward-only trace: backward modelled
    assert report.counts()["measured"] == 14
    assert set(report.factors) == {"gemm", "memory", "communication"}
    # a modelled backward GEMM carries the GEMM factor measured on the forward GEMMs
    from comet.replay.timing import op_time_s
    bwd = {op.name: op for _, op in base.blocks["layer.bwd"].nodes(data="op")}
    model_s = op_time_s(bwd["fc1.dgrad"].with_(duration_s=None), a100, "fp16")
    assert bwd["fc1.dgrad"].duration_s == pytest.approx(model_s * report.factors["gemm"], rel=1e-9)
    # the grounded step differs from the cost model's own (the base matters)
    m, p = model_of(megatron), parallel_of(megatron, model_of(megatron))
    assert evaluate(m, a100, p, base=base).step_time_s != pytest.approx(evaluate(m, a100, p).step_time_s, rel=1e-3)


def _slowed_copy(src: Path, dst: Path, factor: float) -> Path:
    """The trace with rank 0's GEMM kernels `factor` times longer (other ranks unchanged)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith("megatron_kineto_0"):
            d = json.load(gzip.open(f))
            for e in d["traceEvents"]:
                if e.get("cat") == "kernel" and GEMM.search(e["name"]):
                    e["dur"] *= factor
            with gzip.open(dst / f.name, "wt") as out:
                json.dump(d, out)
        elif f.name.endswith(".json.gz"):
            (dst / f.name).symlink_to(f)
    return dst


def _gemm_s(graph) -> float:
    return sum(op.duration_s for g in graph.blocks.values() for _, op in g.nodes(data="op")
               if op.kernel is KernelClass.GEMM)


def test_slower_gemms_in_the_trace_slow_every_candidate_and_reorder(traces, megatron, a100, tmp_path):
    slow = recognize(_slowed_copy(traces / MEGATRON, tmp_path / "slow", 1.2))
    base, _ = ground(megatron, a100)
    base_slow, rep = ground(slow, a100)
    m = model_of(megatron)
    cands = []
    for tp in (2, 4, 8):
        for mb in (1, 2, 4):
            for rc in (Recompute.NONE, Recompute.FULL):
                par = parallel_of(megatron, m, tp=tp, dp=8 // tp, micro_batch=mb, global_batch=64, recompute=rc)
                g, g_slow = transform_to(base, m, par, cluster=a100), transform_to(base_slow, m, par, cluster=a100)
                assert _gemm_s(g_slow) == pytest.approx(1.2 * _gemm_s(g), rel=1e-9), par.label()
                a, b = evaluate(m, a100, par, base=base), evaluate(m, a100, par, base=base_slow)
                if a.feasible:
                    cands.append((par.label(), a.step_time_s, b.step_time_s, _gemm_s(g)))
    assert len(cands) >= 8
    flips = 0
    for i, (la, a0, a1, ga) in enumerate(cands):
        for lb, b0, b1, gb in cands[i + 1:]:
            if (a0 - b0) * (a1 - b1) < 0:          # the order of this pair changed
                flips += 1
                # the one that was faster and fell behind is the one whose step is more GEMM time
                fast, slow_ = ((ga / a0, gb / b0) if a0 < b0 else (gb / b0, ga / a0))
                assert fast > slow_, (la, lb)
    assert flips >= 1


def test_hidden_change_on_a_grounded_base(megatron, a100):
    """Tensor dimensions may change: every op is re-timed by the cost ratio of its new shape."""
    from dataclasses import replace
    base, _ = ground(megatron, a100)
    m = model_of(megatron)
    wide = replace(m, hidden=5120, heads=80, kv_heads=80, ffn_hidden=20480)
    par = parallel_of(megatron, wide)
    g = transform_to(base, wide, par, cluster=a100)
    qkv0 = {op.name: op for _, op in base.blocks["layer.fwd"].nodes(data="op")}["qkv"]
    qkv1 = {op.name: op for _, op in g.blocks["layer.fwd"].nodes(data="op")}["qkv"]
    from comet.replay.timing import op_time_s
    ratio = op_time_s(qkv1.with_(duration_s=None), a100, "fp16") / op_time_s(qkv0.with_(duration_s=None), a100, "fp16")
    assert qkv1.duration_s == pytest.approx(qkv0.duration_s * ratio, rel=1e-9) and ratio > 1.3


@pytest.mark.skipif(not CPU_TRACES.is_dir(), reason="data/traces/cpu (recorded CPU traces) not in this checkout")
def test_recorded_cpu_trace_is_recognised_from_its_scopes():
    d = CPU_TRACES / "L2_h512_mb2_s128_tp2_dp1"
    rec = recognize(d)
    m = json.loads((d / "measured.yaml").read_text())
    assert (rec.layers, rec.hidden, rec.heads, rec.ffn_hidden, rec.seq_len, rec.micro_batch, rec.vocab,
            rec.tp, rec.dp, rec.dtype, rec.activation) == \
        (m["layers"], m["hidden"], m["heads"], m["ffn"], m["seq"], m["micro_batch"], m["vocab"], 2, 1, "fp32", "swiglu")
    assert rec.layers_from.startswith("record_function scopes")
    assert rec.phases == ["forward", "backward", "optimizer"]
    for role in ("qkv", "attention", "fc1.dgrad", "fc1.wgrad", "fc1.dgrad.all_reduce", "attention.bwd",
                 "swiglu.bwd", "optimizer.adam"):
        assert rec.role_ms[role] > 0, role


@pytest.mark.skipif(not CPU_TRACES.is_dir(), reason="data/traces/cpu (recorded CPU traces) not in this checkout")
def test_recorded_trace_grounds_its_own_step_and_predicts_a_pair():
    from comet.trace.ab_check import measured, predict
    cpu = load_cluster(ROOT / "cluster_specs" / "vm_cpu_gloo.yaml")
    a, b = CPU_TRACES / "L2_h512_mb2_s128_tp1_dp1", CPU_TRACES / "L4_h512_mb2_s128_tp1_dp1"
    own = predict(a, measured(a), cpu)
    assert own == pytest.approx(measured(a)["step_s_min"], rel=0.05)      # A -> A: the base replays A
    deeper = predict(a, measured(b), cpu)
    assert 1.6 < deeper / own < 2.2          # two more layers: about twice the step, as measured
    assert deeper == pytest.approx(measured(b)["step_s_min"], rel=0.15)


def test_study_base_from_a_recognisable_trace_needs_no_build(traces, tmp_path):
    import yaml
    from comet.search.driver import RunOptions, build_context
    from comet.search.space import load_space
    from comet.trace.ground import GroundingReport
    model = tmp_path / "gpt.yaml"
    model.write_text("name: gpt_40l\nlayers: 40\nhidden: 4096\nheads: 64\nffn_hidden: 16384\nactivation: gelu\n"
                     "vocab: 51200\nseq_len: 2048\n")
    a100 = str(ROOT / "cluster_specs" / "a100_dgx.yaml")
    raw = {"study": "grounded", "model": str(model), "base": {"trace": str(traces / MEGATRON), "cluster": a100},
           "job": {"global_batch": 64, "total_tokens": 1e9}, "cluster": {"spec": a100, "gpus": [8]},
           "parallel": {"tp": [4, 8], "pp": [1], "micro_batch": 1}, "objectives": [{"time_to_train": "min"}],
           "method": "grid", "timelines": 0}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    ctx, _ = build_context(load_space(path), RunOptions())
    report = ctx.base.meta["calibration"]
    assert isinstance(report, GroundingReport) and report.counts()["measured"] == 14
    assert ctx.base.meta["model"].layers == 40 and ctx.base.meta["parallel"].tp == 8
