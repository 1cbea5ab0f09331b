"""`comet estimate`: one configuration from flags -> a rich table or one JSON object."""

from __future__ import annotations

import argparse
import json

from comet.config.cluster import load_cluster
from comet.config.job import JobSpec
from comet.config.model import load_model
from comet.config.parallel import OffloadTarget, ParallelConfig, Precision, Recompute, Schedule
from comet.evaluate import evaluate, resolve
from comet.result import BREAKDOWN_KEYS

DEFAULT_CLUSTER = "cluster_specs/h100_dgx.yaml"


def register(sub) -> None:
    p = sub.add_parser("estimate", help="estimate one configuration (step time, MFU, memory, breakdown)",
                       description="Build the execution graph of one configuration, replay it on the cluster "
                                   "model and report step time, throughput, MFU, memory and a time breakdown.")
    p.add_argument("--model", required=True, help="zoo name (e.g. gpt3_175b) or a model YAML path")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"cluster spec YAML (default {DEFAULT_CLUSTER})")
    p.add_argument("--gpus", type=int, help="total GPUs (dp is derived when --dp is not given)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages (implies interleaved 1F1B)")
    p.add_argument("--pp-first-stage-layers", type=int, help="uneven pipeline: layers on the first stage")
    p.add_argument("--pp-last-stage-layers", type=int, help="uneven pipeline: layers on the last stage")
    p.add_argument("--pp-embedding-as-layer", action="store_true",
                   help="count the embedding as a layer in the pipeline split (Megatron-Core)")
    p.add_argument("--pp-loss-as-layer", action="store_true",
                   help="count the loss as a layer in the pipeline split (Megatron-Core)")
    p.add_argument("--overlap-p2p-comm", action="store_true", help="interleaved pipeline sends overlap compute")
    p.add_argument("--grad-dtype", choices=["fp32", "bf16"], default="fp32", help="gradient reduce dtype")
    p.add_argument("--schedule", choices=[s.value for s in Schedule])
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--precision", choices=[x.value for x in Precision], default="bf16")
    p.add_argument("--recompute", choices=[x.value for x in Recompute], default="none")
    p.add_argument("--zero", type=int, default=1, help="ZeRO stage 0-3 (1 = Megatron distributed optimizer)")
    p.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on when tp > 1")
    p.add_argument("--overlap-tp-comm", action="store_true", help="pipeline TP collectives with their GEMMs")
    p.add_argument("--no-overlap-grad-reduce", action="store_true")
    p.add_argument("--no-overlap-param-gather", action="store_true")
    p.add_argument("--no-flash-attention", action="store_true", help="unfused attention kernels")
    p.add_argument("--offload", action="append", choices=[x.value for x in OffloadTarget], default=[],
                   help="offload to the cluster's memory expansion tier (repeatable)")
    p.add_argument("--total-tokens", type=float, help="training tokens, for time-to-train")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", metavar="OUT.json", help="write the replayed timeline as a Chrome trace")
    p.set_defaults(func=run)


def parallel_from_args(a) -> ParallelConfig:
    schedule = Schedule(a.schedule) if a.schedule else (Schedule.INTERLEAVED if a.vpp > 1 else Schedule.ONE_F_ONE_B)
    return ParallelConfig(global_batch=a.global_batch, tp=a.tp, pp=a.pp, dp=a.dp, cp=a.cp, gpus=a.gpus,
                          sequence_parallel=a.sequence_parallel, vpp=a.vpp, schedule=schedule,
                          micro_batch=a.micro_batch, recompute=Recompute(a.recompute), zero=a.zero,
                          precision=Precision(a.precision), overlap_grad_reduce=not a.no_overlap_grad_reduce,
                          overlap_param_gather=not a.no_overlap_param_gather, overlap_tp_comm=a.overlap_tp_comm,
                          flash_attention=not a.no_flash_attention,
                          offload=tuple(OffloadTarget(x) for x in a.offload),
                          pp_first_stage_layers=a.pp_first_stage_layers, pp_last_stage_layers=a.pp_last_stage_layers,
                          pp_embedding_as_layer=a.pp_embedding_as_layer, pp_loss_as_layer=a.pp_loss_as_layer,
                          overlap_p2p_comm=a.overlap_p2p_comm, grad_dtype=a.grad_dtype)


def run(a) -> int:
    from comet.errors import ConfigError
    for name in ("gpus", "tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch"):
        v = getattr(a, name)
        if v is not None and v < 1:
            raise ConfigError(f"must be >= 1, got {v}", field=f"--{name.replace('_', '-')}")
    model = load_model(a.model)
    cluster = load_cluster(a.cluster)
    par = resolve(model, cluster, parallel_from_args(a))   # a broken rule is bad input: exit 2
    job = JobSpec(total_tokens=a.total_tokens) if a.total_tokens else None
    res = evaluate(model, cluster, par, job, timeline=bool(a.timeline))
    if a.timeline and res.timeline is not None:
        from comet.replay.timeline import write_chrome_trace
        write_chrome_trace(res.timeline, a.timeline)
    if a.json:
        print(json.dumps(res.to_dict(), default=str))
    else:
        _print_tables(model, cluster, par, res, a.timeline)
    return 0 if res.feasible else 1


def _print_tables(model, cluster, par, res, timeline_path) -> None:
    from rich.console import Console
    from rich.table import Table
    con = Console()
    title = f"{model.name} on {par.gpus} x {cluster.gpu.name} — {par.label()}"
    if not res.feasible:
        con.print(f"[bold red]INFEASIBLE[/] {title}\n  {res.reason}")
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
