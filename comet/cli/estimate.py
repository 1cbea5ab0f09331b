"""`comet estimate`: one configuration from flags and/or a YAML file -> a rich table or one JSON object,
optionally also a JSON / CSV file and a timeline."""

from __future__ import annotations

import argparse
import json

import sys
from pathlib import Path

from comet.cli.argtypes import non_negative_int, positive_float, positive_int
from comet.api import DEFAULT_CLUSTER, PARALLEL_FIELDS, REQUEST_FIELDS, parallel_config
from comet.config.cluster import load_cluster
from comet.config.job import JobSpec
from comet.config.loader import read_yaml
from comet.config.model import load_model
from comet.config.moe import Dispatcher
from comet.config.parallel import OffloadTarget, Precision, Recompute, RecomputeModule, Schedule
from comet.errors import CometError, ConfigError
from comet.evaluate import evaluate, resolve
from comet.remedy import nearest_feasible
from comet.result import BREAKDOWN_KEYS
from comet.search.context import parallel_dict


def register(sub) -> None:
    p = sub.add_parser("estimate", help="estimate one configuration (step time, MFU, memory, breakdown)",
                       description="Build the execution graph of one configuration, replay it on the cluster "
                                   "model and report step time, throughput, MFU, memory and a time breakdown. "
                                   "Give the configuration as flags, as --config FILE.yaml (the same keys, "
                                   "snake_case), or both (flags win).")
    p.add_argument("--config", metavar="FILE.yaml", help="model, cluster, total_tokens and parallel fields as YAML")
    p.add_argument("--model", help="zoo name (e.g. gpt3_175b) or a model YAML path")
    p.add_argument("--cluster", help=f"cluster spec name or YAML (default {DEFAULT_CLUSTER})")
    p.add_argument("--gpus", type=positive_int, help="total GPUs (dp is derived when --dp is not given)")
    p.add_argument("--tp", type=positive_int, help="tensor parallel size (default 1)")
    p.add_argument("--pp", type=positive_int, help="pipeline stages (default 1)")
    p.add_argument("--dp", type=positive_int)
    p.add_argument("--cp", type=positive_int, help="context parallel size (default 1)")
    p.add_argument("--vpp", type=positive_int, help="virtual pipeline stages (implies interleaved 1F1B)")
    p.add_argument("--pp-first-stage-layers", type=positive_int, help="uneven pipeline: layers on the first stage")
    p.add_argument("--pp-last-stage-layers", type=positive_int, help="uneven pipeline: layers on the last stage")
    p.add_argument("--pp-embedding-as-layer", action="store_const", const=True,
                   help="count the embedding as one layer in the pipeline split (Megatron-Core)")
    p.add_argument("--pp-loss-as-layer", action="store_const", const=True,
                   help="count the loss as one layer in the pipeline split (Megatron-Core)")
    p.add_argument("--overlap-p2p-comm", action="store_const", const=True,
                   help="interleaved pipeline sends overlap compute (Megatron overlap_p2p_comm)")
    p.add_argument("--grad-dtype", choices=["fp32", "bf16"], help="gradient reduce dtype (default fp32)")
    p.add_argument("--reduce-dtype", choices=["fp32", "bf16", "fp16"],
                   help="dtype of the data-parallel gradient reduction where it differs from --grad-dtype "
                        "(FSDP MixedPrecision.reduce_dtype; docs/fsdp.md)")
    p.add_argument("--dp-collective", choices=["hierarchical", "flat"],
                   help="ZeRO-3 gathers / reduce-scatters: hierarchical NCCL rings over all NICs (default) or "
                        "flat, one ring at one NIC per GPU (DeepSpeed 2021)")
    p.add_argument("--fsdp", action="store_const", const=True,
                   help="PyTorch FSDP-style sharding for zero >= 2 (per-module gathers; with pp > 1 as well)")
    p.add_argument("--shard-grad-op", action="store_const", const=True,
                   help="with --fsdp --zero 2: FSDP SHARD_GRAD_OP, weights gathered per module before each "
                        "forward, gradients reduce-scattered per module after its backward (docs/fsdp.md)")
    p.add_argument("--ep", type=positive_int, help="expert parallel size (MoE models; default 1)")
    p.add_argument("--etp", type=positive_int, help="expert tensor parallel size (MoE; default tp)")
    p.add_argument("--moe-dispatcher", choices=[x.value for x in Dispatcher], help="token dispatcher (default alltoall)")
    p.add_argument("--moe-capacity-factor", type=positive_float,
                   help="expert capacity factor, tokens beyond it dropped, experts padded to it (default dropless)")
    p.add_argument("--moe-imbalance", type=positive_float,
                   help="busiest EP rank's routed tokens over the mean (default 1: balanced routing)")
    p.add_argument("--moe-overlap-a2a", action="store_const", const=True,
                   help="dispatch/combine overlapped with compute (DeepEP / 1F1B all-to-all overlap)")
    p.add_argument("--schedule", choices=[s.value for s in Schedule])
    p.add_argument("--micro-batch", type=positive_int, help="default 1")
    p.add_argument("--global-batch", type=positive_int, help="sequences per step (required here or in --config)")
    p.add_argument("--precision", choices=[x.value for x in Precision], help="default bf16")
    p.add_argument("--recompute", choices=[x.value for x in Recompute], help="default none")
    p.add_argument("--recompute-modules", action="append", choices=[x.value for x in RecomputeModule],
                   help="with --recompute selective: Megatron-Core modules recomputed too (repeatable; docs/moe.md)")
    p.add_argument("--zero", type=non_negative_int, help="ZeRO stage 0-3 (default 1 = Megatron distributed optimizer)")
    p.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on when tp > 1")
    p.add_argument("--overlap-tp-comm", action="store_const", const=True, help="pipeline TP collectives with GEMMs")
    p.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_const", const=False)
    p.add_argument("--no-overlap-param-gather", dest="overlap_param_gather", action="store_const", const=False)
    p.add_argument("--no-flash-attention", dest="flash_attention", action="store_const", const=False,
                   help="unfused attention kernels")
    p.add_argument("--attention-kernel", choices=["fused", "fa2"],
                   help="flash-attention kernels: fused (TE / cuDNN / FlashAttention-3, default) or fa2 (PyTorch SDPA, "
                        "flash-attn 2: torchtitan, llm-foundry)")
    p.add_argument("--offload", action="append", choices=[x.value for x in OffloadTarget],
                   help="offload to the cluster's memory expansion tier (repeatable)")
    p.add_argument("--total-tokens", type=positive_float, help="training tokens, for time-to-train")
    p.add_argument("--base-trace", metavar="PATH", help="ground the estimate in a profiler trace of an LLM step "
                   "(Kineto + ET): its measured ops, re-timed to this configuration (docs/traces.md)")
    p.add_argument("--trace-cluster", metavar="SPEC.yaml", help="cluster spec the --base-trace was measured on "
                   "(default: --cluster)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object for every outcome (ok, infeasible, bad input)")
    p.add_argument("-o", "--output", metavar="FILE.{json,csv}", help="also write the result to a JSON or CSV file")
    p.add_argument("--timeline", metavar="OUT.json.gz",
                   help="write the replayed timeline as a Chrome trace (.json.gz or .json; opens in Perfetto)")
    p.add_argument("--timeline-ops", action="store_true",
                   help="put every op in the timeline, not only per-task slices (large files for big models)")
    p.set_defaults(func=run)
    p.error = _json_aware_error(p)   # a usage error under --json is still one JSON object


def _json_aware_error(parser):
    plain = parser.error

    def error(message):
        if "--json" in sys.argv[1:]:
            print(json.dumps({"status": "error", "feasible": False, "reason": message}))
        plain(message)
    return error


def request_from_args(a) -> dict:
    """The estimate request: --config's mapping (checked key by key) overridden by the flags given."""
    req: dict = {}
    if a.config:
        req = _read_config(a.config)
    for name in REQUEST_FIELDS + PARALLEL_FIELDS:
        v = getattr(a, name, None)
        if v is not None:
            req[name] = v
    for name in ("gpus", "tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch", "ep", "etp"):
        v = req.get(name)
        if isinstance(v, int) and v < 1:
            where = f"--{name.replace('_', '-')}" if getattr(a, name, None) is not None else name
            raise ConfigError(f"must be >= 1, got {v}", field=where,
                              source=None if getattr(a, name, None) is not None else a.config)
    if "model" not in req:
        raise ConfigError("required: give --model or `model:` in --config", field="--model")
    if "global_batch" not in req:
        raise ConfigError("required: give --global-batch or `global_batch:` in --config", field="--global-batch")
    return req


def _read_config(path: str) -> dict:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"must be a mapping of keys to values, got {type(data).__name__}", source=path)
    known = REQUEST_FIELDS + PARALLEL_FIELDS
    for key in data:
        if key not in known:
            raise ConfigError(f"unknown key (known keys: {', '.join(known)})", source=path, field=str(key))
    for key in ("model", "cluster"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"must be a name or a path, got {data[key]!r}", source=path, field=key)
    if isinstance(data.get("model"), str):   # a model path in the file is relative to the file
        data["model"] = _beside(data["model"], path)
    if isinstance(data.get("cluster"), str):
        data["cluster"] = _beside(data["cluster"], path)
    return data


def _beside(value: str, config_path: str) -> str:
    p = Path(value)
    if p.is_absolute() or p.exists() or not p.suffix:
        return value
    beside = Path(config_path).parent / p
    return str(beside) if beside.exists() else value


def run(a) -> int:
    try:
        return _run(a)
    except CometError as exc:
        if a.json:
            print(json.dumps({"status": "error", "feasible": False, "reason": str(exc)}))
        raise


def _run(a) -> int:
    req = request_from_args(a)
    source = a.config or "comet estimate"
    model = load_model(str(req.pop("model")))
    cluster = load_cluster(req.pop("cluster", DEFAULT_CLUSTER))
    total_tokens = req.pop("total_tokens", None)
    if total_tokens is not None and (isinstance(total_tokens, bool) or not isinstance(total_tokens, (int, float))
                                     or total_tokens <= 0):
        raise ConfigError(f"must be a number > 0, got {total_tokens!r}", source=a.config, field="total_tokens")
    par = resolve(model, cluster, parallel_config(req, source=source))   # a broken rule is bad input: exit 2
    job = JobSpec(total_tokens=total_tokens) if total_tokens else None
    base = None
    if a.base_trace:     # per-op grounding in a measured trace (comet/trace/ground.py)
        from comet.trace.ground import ground_for
        base, report = ground_for(a.base_trace, model, load_cluster(a.trace_cluster) if a.trace_cluster else cluster)
        if not a.json:
            print("; ".join([report.line()] + report.notes))
    res = evaluate(model, cluster, par, job, timeline=("ops" if a.timeline_ops else True) if a.timeline else False,
                   base=base)
    if not res.feasible:
        res.extra["remedies"] = nearest_feasible(model, cluster, par, job)
    timeline_path = None
    if a.timeline and res.timeline is not None:
        from comet.replay.timeline import write_chrome_trace
        timeline_path = write_chrome_trace(res.timeline, a.timeline, meta={
            "model": model.name, "cluster": cluster.name, "gpus": par.gpus, "design": par.label()})
    if a.output:
        _write_output(a.output, model, cluster, par, res)
    if a.json:
        print(json.dumps(_json_doc(model, cluster, par, res), default=str))
    else:
        _print_tables(model, cluster, par, res, timeline_path)
        if a.output:
            print(f"result written to {a.output}")
    return 0 if res.feasible else 1


def _json_doc(model, cluster, par, res) -> dict:
    """The result plus what it is the result of: model, cluster and the resolved configuration."""
    return {**res.to_dict(), "model": model.name, "cluster": cluster.name, "parallel": parallel_dict(par)}


def _write_output(path: str, model, cluster, par, res) -> None:
    suffix = Path(path).suffix.lower()
    if suffix not in (".json", ".csv"):
        raise ConfigError(f"must end in .json or .csv, got {path!r}", field="-o")
    out = Path(path)
    if suffix == ".json":
        out.write_text(json.dumps(_json_doc(model, cluster, par, res), default=str, indent=1) + "\n")
        return
    import csv
    row = {"model": model.name, "cluster": cluster.name, **parallel_dict(par), **res.flat()}
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)


def _print_tables(model, cluster, par, res, timeline_path) -> None:
    from rich.console import Console
    from rich.table import Table
    con = Console()
    title = f"{model.name} on {par.gpus} x {cluster.gpu.name} — {par.label()}"
    if not res.feasible:
        con.print(f"[bold red]INFEASIBLE[/] {title}", highlight=False)
        con.print(f"  {res.reason}", highlight=False)
        remedies = res.extra.get("remedies") or []
        if remedies:
            fix = Table(title=f"nearest feasible changes on the same {par.gpus} GPUs (re-evaluated)")
            for col in ("change", "step s", "GB / GPU", "configuration"):
                fix.add_column(col, justify="left" if col in ("change", "configuration") else "right")
            for r in remedies:
                fix.add_row(r["change"], f"{r['step_time_s']:.3f}", f"{r['memory_gb_per_gpu']:.1f}", r["label"])
            con.print(fix)
        elif res.memory:
            con.print("no single or paired change of pp, tp, recompute, ZeRO, micro-batch or offload fits on "
                      f"{par.gpus} GPUs: more GPUs or a larger-memory GPU are needed", highlight=False)
        return
    t = Table(title=title, show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    rows = [("step time", f"{res.step_time_s:.3f} s"), ("tokens / s", f"{res.tokens_per_s:,.0f}"),
            ("model TFLOP/s per GPU", f"{res.tflops_per_gpu:.1f}"), ("MFU", f"{res.mfu:.1%}"),
            ("hardware TFLOP/s per GPU", f"{res.hw_tflops_per_gpu:.1f}"),
            ("memory per GPU", f"{res.memory_gb_per_gpu:.1f} GB of {cluster.gpu.hbm_GB:g} GB")]
    if "time_to_train_s" in res.extra:
        rows.append(("time to train", f"{res.extra['time_to_train_s'] / 86400:.1f} days"))
    from comet.validate.uncertainty import band_for   # expected error from the validation residuals
    band = band_for(model, par)
    if band is not None:
        rows.append(("expected error (time metrics)", str(band)))
    for k, v in rows:
        t.add_row(k, v)
    con.print(t)
    b = Table(title="step time breakdown (critical stage)")
    b.add_column("component")
    b.add_column("seconds", justify="right")
    b.add_column("share", justify="right")
    for k in BREAKDOWN_KEYS:
        v = res.breakdown.get(k, 0.0)
        b.add_row(k.replace("_", " "), f"{v:.3f}", f"{v / res.step_time_s:.1%}")
    m = Table(title="memory per GPU (GB)")
    m.add_column("component")
    m.add_column("GB", justify="right")
    for k, v in res.memory.items():
        m.add_row(k, f"{v:.2f}")
    con.print(b, m)
    if timeline_path:
        con.print(f"timeline written to {timeline_path} (open it in https://ui.perfetto.dev)")
