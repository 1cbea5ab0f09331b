"""Calibrating a study's base StepGraph to a profiler trace by kernel class (comet/trace/calibrate_base.py):
a synthetic Kineto trace made from comet's own graph with known per-class factors comes back with those
factors; a study on a trace base runs end to end; an unrelated real trace is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from comet.config.cluster import load_cluster
from comet.config.model import load_model
from comet.config.parallel import ParallelConfig
from comet.errors import ConfigError, TraceError
from comet.evaluate import evaluate
from comet.graph.expand import expand
from comet.replay.timing import op_time_s
from comet.trace import load_trace
from comet.trace.calibrate_base import (CLASSES, calibrate_base, model_class, scale_classes, stage_totals,
                                        trace_class)
from comet.transform import materialize
from comet.workload.builder import build_step_graph

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / ".." / "shared"
CLUSTER = ROOT / "cluster_specs" / "h100_dgx.yaml"
TINY_MODEL = {"name": "tiny_gpt", "layers": 4, "hidden": 512, "heads": 8, "ffn_hidden": 2048,
              "activation": "gelu", "vocab": 8192, "seq_len": 512, "tied_embeddings": True}
GLOBAL_BATCH = 16
KERNEL_NAME = {"gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_{}", "attention": "flash_fwd_kernel",
               "communication": "ncclDevKernel_AllGather_RING_LL", "memory": "elementwise_kernel"}
FACTORS = {"gemm": 1.3, "attention": 0.8, "communication": 1.1, "memory": 1.5}


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny_gpt.yaml"
    path.write_text(yaml.safe_dump(TINY_MODEL))
    model = load_model(str(path))
    par = ParallelConfig(global_batch=GLOBAL_BATCH, tp=2, pp=2, gpus=8, micro_batch=1).resolve(model)
    return path, model, par, load_cluster(str(CLUSTER))


def write_synthetic_kineto(path: Path, model, par, cluster, factors: dict[str, float], rank: int = 0) -> dict:
    """A GPU-only Kineto trace of rank `rank`: the ops of comet's expanded step on that rank (pipeline
    sends timed by the cost model, as the replay does), named so they classify by class, with durations
    = modelled * factor of their class. Returns the modelled busy seconds per class."""
    base = materialize(build_step_graph(model, par), cluster)
    stage = rank // (par.gpus // par.pp)
    modelled = dict.fromkeys(CLASSES, 0.0)
    events, clock_us = [], {7: 1000.0, 20: 1000.0}
    for _, op in expand(base).nodes(data="op"):
        cls = model_class(op)
        if op.rank != stage or cls is None:
            continue
        dur_s = op.duration_s if op.duration_s is not None else op_time_s(op, cluster, par.precision.value)
        modelled[cls] += dur_s
        stream = 20 if cls == "communication" else 7
        dur_us = dur_s * factors.get(cls, 1.0) * 1e6
        events.append({"ph": "X", "cat": "kernel", "name": KERNEL_NAME[cls].format(op.name), "pid": rank,
                       "tid": stream, "ts": clock_us[stream], "dur": dur_us,
                       "args": {"stream": stream, "device": rank}})
        clock_us[stream] += dur_us + 1.0
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": par.gpus},
           "traceEvents": events}
    path.write_text(json.dumps(doc))
    return modelled


def test_kernel_names_classify():
    from comet.graph.ir import Op, OpKind
    names = {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n": "gemm", "ampere_bf16_s16816gemm_bf16_128x128": "gemm",
             "cutlass_80_tensorop_bf16_s16816gemm": "gemm", "flash_fwd_kernel": "attention",
             "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention", "void at::native::elementwise_kernel<4>": "memory",
             "ncclDevKernel_AllGather_RING_LL": "communication"}
    for name, cls in names.items():
        kind = OpKind.COLLECTIVE if name.startswith("nccl") else OpKind.COMPUTE
        assert trace_class(Op(name, kind)) == cls, name
    assert trace_class(Op("Memcpy HtoD", OpKind.MEMCPY)) is None and trace_class(Op("aten::mm", OpKind.CPU)) is None


def test_round_trip_recovers_factors(tiny, tmp_path):
    _, model, par, cluster = tiny
    trace_path = tmp_path / "rank-0.json"
    modelled = write_synthetic_kineto(trace_path, model, par, cluster, FACTORS)
    assert all(modelled[c] > 0 for c in CLASSES)
    base, report = calibrate_base(load_trace(trace_path), model, par, cluster)
    assert (report.rank, report.stage) == (0, 0)
    for c in report.classes:
        assert c.modelled_s == pytest.approx(modelled[c.name], rel=1e-9)
        assert c.factor == pytest.approx(FACTORS[c.name], rel=0.01), c
    # every base op of a class is scaled by that class's factor, nothing else
    plain = materialize(build_step_graph(model, par), cluster)
    for key, g in plain.blocks.items():
        for nid, op in g.nodes(data="op"):
            new = base.blocks[key].nodes[nid]["op"]
            cls = model_class(op)
            assert new.duration_s == pytest.approx(op.duration_s * (report.factors[cls] if cls else 1.0))
    assert base.stages[0].optimizer[0].duration_s == pytest.approx(
        plain.stages[0].optimizer[0].duration_s * report.factors["memory"])


@pytest.mark.parametrize("extra", [{}, {"vpp": 2, "schedule": "interleaved_1f1b"}, {"recompute": "full"},
                                   {"pp": 1, "zero": 2}])
def test_stage_totals_match_expanded_graph(tiny, extra):
    """The occurrence counting from the plan equals summing the expanded step, on every stage."""
    from comet.config.parallel import Recompute, Schedule
    _, model, _, cluster = tiny
    kw = {"tp": 2, "pp": 2, **extra}
    kw.update({k: {"schedule": Schedule, "recompute": Recompute}[k](v) for k, v in extra.items()
               if k in ("schedule", "recompute")})
    par = ParallelConfig(global_batch=GLOBAL_BATCH, gpus=8, micro_batch=1, **kw).resolve(model)
    base = materialize(build_step_graph(model, par), cluster)
    flat = expand(base)
    for stage in range(par.pp):
        want = dict.fromkeys(CLASSES, 0.0)
        for _, op in flat.nodes(data="op"):
            cls = model_class(op)
            if op.rank == stage and cls is not None:
                want[cls] += op.duration_s if op.duration_s is not None else op_time_s(op, cluster, "bf16")
        got = stage_totals(base, stage, cluster, "bf16")
        assert got == pytest.approx(want, rel=1e-12) and got["gemm"] > 0


def test_class_absent_from_trace_keeps_factor_one(tiny, tmp_path):
    _, model, par, cluster = tiny
    trace_path = tmp_path / "rank-0.json"
    write_synthetic_kineto(trace_path, model, par, cluster, {"gemm": 2.0, "communication": 0.0})
    doc = json.loads(trace_path.read_text())      # drop the NCCL kernels: a compute-only trace
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("nccl")]
    trace_path.write_text(json.dumps(doc))
    _, report = calibrate_base(load_trace(trace_path), model, par, cluster)
    comm = next(c for c in report.classes if c.name == "communication")
    assert comm.factor == 1.0 and "not in the trace" in comm.note and "not in the trace" in report.line()
    assert report.factors["gemm"] == pytest.approx(2.0, rel=0.01)


def test_insane_factor_is_refused_naming_class(tiny, tmp_path):
    _, model, par, cluster = tiny
    trace_path = tmp_path / "rank-0.json"
    write_synthetic_kineto(trace_path, model, par, cluster, {"attention": 25.0})
    with pytest.raises(ConfigError, match=r"class attention is 25(\.0)? .*outside \[0.1, 10\]"):
        calibrate_base(load_trace(trace_path), model, par, cluster)


def test_trace_of_another_world_size_is_refused(tiny, tmp_path):
    _, model, par, cluster = tiny
    trace_path = tmp_path / "rank-0.json"
    write_synthetic_kineto(trace_path, model, par, cluster, {})
    other = ParallelConfig(global_batch=GLOBAL_BATCH, tp=2, pp=2, gpus=16, micro_batch=1)
    with pytest.raises(ConfigError, match="measured on 8 GPUs"):
        calibrate_base(load_trace(trace_path), model, other, cluster)


# ------------------------------------------------------------------------------------ a study
def _space(tmp_path, model_path, base: dict) -> Path:
    raw = {"study": "calib", "model": str(model_path), "base": base,
           "job": {"global_batch": GLOBAL_BATCH, "total_tokens": 1e9},
           "cluster": {"spec": str(CLUSTER), "gpus": [8]},
           "parallel": {"tp": [1, 2], "pp": [1, 2], "micro_batch": 1},
           "objectives": [{"time_to_train": "min"}], "method": "grid", "timelines": 0}
    path = tmp_path / f"space-{len(list(tmp_path.glob('space-*')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _step_times(outcome) -> dict[str, float]:
    ok = outcome.frame[outcome.frame["status"] == "ok"]
    return dict(zip(ok["label"], ok["step_time_s"]))


def test_study_on_trace_base_differs_by_calibration(tiny, tmp_path):
    from comet.search.driver import RunOptions, build_context, run_study
    from comet.search.space import load_space
    model_path, model, par, cluster = tiny
    trace_path = tmp_path / "rank-0.json"
    write_synthetic_kineto(trace_path, model, par, cluster, {"gemm": 1.3})
    build = {"tp": 2, "pp": 2, "micro_batch": 1}
    built = load_space(_space(tmp_path, model_path, {"build": build}))
    traced = load_space(_space(tmp_path, model_path, {"build": build, "trace": str(trace_path)}))
    ctx, _ = build_context(traced, RunOptions())
    report = ctx.base.meta["calibration"]
    assert report.factors["gemm"] == pytest.approx(1.3, rel=0.01)
    assert all(report.factors[c] == pytest.approx(1.0, rel=0.01) for c in ("attention", "communication", "memory"))
    a = _step_times(run_study(built, RunOptions(out=tmp_path / "built", executor="serial", timelines=False)))
    traced_run = run_study(traced, RunOptions(out=tmp_path / "traced", executor="serial", timelines=False))
    assert "gemm" in traced_run.base_note and "1.3" in traced_run.base_note   # printed by `comet search`
    b = _step_times(traced_run)
    assert set(a) == set(b) and len(a) >= 3
    for label in a:                      # slower, by at most the GEMM factor (GEMMs are part of the step)
        assert a[label] < b[label] < 1.3 * a[label], label
    assert b["tp1-pp1-dp8-mb1-none-z1-bf16"] / a["tp1-pp1-dp8-mb1-none-z1-bf16"] > 1.1   # compute-bound
    # exactly the calibration: the same as evaluating on the materialized base with the factors applied
    scaled = scale_classes(materialize(build_step_graph(model, par), cluster), report.factors)
    for cand in (ParallelConfig(global_batch=GLOBAL_BATCH, tp=tp, pp=pp, gpus=8) for tp in (1, 2) for pp in (1, 2)):
        res = evaluate(model, cluster, cand, base=scaled)
        assert b[res.label] == pytest.approx(res.step_time_s, rel=1e-9)
    # a different trace at the same path changes the factors: the study is not resumed from stale results
    write_synthetic_kineto(trace_path, model, par, cluster, {"gemm": 1.5})
    again = run_study(traced, RunOptions(out=tmp_path / "traced", executor="serial", timelines=False))
    assert again.resumed == 0 and again.evaluated_now == traced_run.evaluated_now


def test_space_trace_base_errors_are_one_line(tiny, tmp_path):
    from comet.search.driver import RunOptions, build_context
    from comet.search.space import load_space
    model_path, model, par, cluster = tiny
    build = {"tp": 2, "pp": 2, "micro_batch": 1}
    with pytest.raises(TraceError, match="no such file"):
        build_context(load_space(_space(tmp_path, model_path, {"build": build, "trace": "missing.json"})),
                      RunOptions())
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"traceEvents": [')
    with pytest.raises(TraceError):
        build_context(load_space(_space(tmp_path, model_path, {"build": build, "trace": str(corrupt)})),
                      RunOptions())
    # without base.build the trace must be a recognisable LLM step (per-op grounding)
    with pytest.raises(TraceError, match="base.trace: .*give base.build"):
        build_context(load_space(_space(tmp_path, model_path, {"trace": str(corrupt)})), RunOptions())
    with pytest.raises(ConfigError, match="base.cluster: only a trace base"):
        load_space(_space(tmp_path, model_path, {"build": build, "cluster": str(CLUSTER)}))
    with pytest.raises(ConfigError, match="base.cluster: cluster spec not found"):
        build_context(load_space(_space(tmp_path, model_path, {"build": build, "trace": str(corrupt),
                                                                "cluster": "nowhere.yaml"})), RunOptions())


def test_cli_insane_trace_base_is_one_line(tiny, tmp_path, capsys):
    from comet.cli import main
    model_path, model, par, cluster = tiny
    trace_path = tmp_path / "rank-0.json"
    write_synthetic_kineto(trace_path, model, par, cluster, {"gemm": 0.02})
    space = _space(tmp_path, model_path, {"build": {"tp": 2, "pp": 2, "micro_batch": 1}, "trace": str(trace_path)})
    code = main(["search", str(space), "--executor", "serial", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "base.trace" in err and "class gemm is 0.02" in err and str(space) in err


# ------------------------------------------------------------------------------------ a real trace
def test_unrelated_real_trace_is_refused(tiny):
    """AlexNet on one GPU (fp32 convolutions, no NCCL) is not a GPT. Against the 4-layer GPT its busy times
    happen to land inside [0.1, 10] (gemm 4.2x, memory-bound 4.1x; attention and communication absent, so
    factor 1): the check only catches gross mismatches. Against GPT 1.7B it is refused."""
    traces = SHARED / "traces" / "single_gpu"
    if not traces.is_dir():
        pytest.skip("../shared/traces not found")
    _, model, par, cluster = tiny
    trace = load_trace(traces / "alexnet_benchmark_result_2869224_1695835535_trace.json.gz")
    _, report = calibrate_base(trace, model, par, cluster)
    f = report.factors
    assert 1.5 < f["gemm"] < 10 and 1.5 < f["memory"] < 10 and f["attention"] == f["communication"] == 1.0
    big = load_model("gpt_1_7b")
    one_gpu = ParallelConfig(global_batch=8, gpus=1, micro_batch=1)
    with pytest.raises(ConfigError, match=r"calibration factor of class gemm is .* outside \[0.1, 10\]"):
        calibrate_base(trace, big, one_gpu, cluster)
