"""docs/validation.md: the validation table, error summary, held-out errors, fitted parameters and the
known limitations, generated from a Validation (and a fit, when one ran)."""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path

from comet.config.cluster import load_cluster
from comet.validate.calibrate import (LARGE_GEMM_RANGE, PARAMS, PRIORS, FitResult, get_value,
                                      large_gemm_fraction)
from comet.validate.runner import Validation
from comet.validate.frameworks import FRAMEWORKS, GENERIC, defaults_for
from comet.validate.layout import __doc__ as LAYOUT_DOC
from comet.validate.memory_knobs import __doc__ as MEMORY_KNOBS_DOC
from comet.validate.frameworks import __doc__ as FRAMEWORK_DOC
from comet.validate.summary import ErrorStats
from comet.workload.memory_measures import __doc__ as MEMORY_MEASURES_DOC

# How the peak is built (comet/workload/memory.py); the measures follow (comet/workload/memory_measures.py).
MEMORY_MODEL = (
    "Peak memory per GPU is the worst pipeline stage's weights, gradients, optimizer state, saved activations "
    "(Korthikanti et al. term by term, with the framework's recompute policy and FP8 handling), the loss's "
    "logits and a workspace. The cross-entropy holds 4 bytes per logit where it is fused (Megatron's "
    "vocab-parallel loss works in place on an fp32 copy; a torch.compile'd loss keeps bf16 logits and a bf16 "
    "gradient) and 12 where PyTorch runs it eagerly on `pred.float()` (saved fp32 log-softmax plus two fp32 "
    "gradients at the start of the backward): torchtitan before 0.1.0 did, by `framework_version` (JSON "
    "assumption `loss_impl`). Under FSDP (ZeRO-3 with `fsdp`) the fp32 shard is the parameter and the "
    "optimizer's master (4 + 8 bytes per parameter, not a bf16 shard + 12), and the root module (embedding, "
    "final norm, output layer) stays gathered in bf16 from the forward through the backward. The predicted "
    "footprint (`memory_gb_per_gpu` in the JSON, the fit test of a search) is what nvidia-smi shows; a memory "
    "row is compared in the measure it names:")

LIMITATIONS = (
    "DeepSpeed ZeRO-3 as run in 2021 (Narayanan SC21 Table 2) gathers every module's parameters with a flat "
    "NCCL collective over the whole data-parallel group; a flat ring is limited by one NIC per GPU. The network "
    "model (comet/hardware/network.py) runs DP collectives hierarchically (NVLink inside the node, 1/8 of the "
    "data over InfiniBand), which is ~8x too optimistic for these rows: they are predicted far too fast. The fix "
    "belongs to the network model (flat vs hierarchical algorithms per collective), not to a factor here.",
    "MLPerf `time_to_train_min` counts evaluation and the run's own overheads; comet predicts total_tokens / "
    "(tokens/s) of the training steps only, so these rows read 10-25% fast while the same runs' iteration "
    "times are closer (measured time to train is 5-16% above measured step time x steps on the same runs). "
    "They are reported on their own line, outside the time metrics, and left out of the efficiency fit, "
    "which would otherwise charge the evaluation passes to the GEMM rate.",
    "Cells a source leaves empty take the framework's documented default, which is not always what the run "
    "used. Where a default does not fit, the memory-knob ladder picks the least memory-saving "
    "setting that does; the run may have used a different one (e.g. BF16 optimizer state instead of FP8 "
    "weights): the choice is listed per row.",
    "A layout the source does not state is the fastest feasible one under comet's own model, so these rows "
    "measure comet's optimum against a tuned run, not the run's configuration. The same holds for an empty "
    "`vpp` on a framework that interleaves: dgxc Nemotron-4 340B and NeMo GPT-3 175B get vpp 12, what other "
    "releases of those recipes state; SC21 Table 1 and the Megatron-LM README rows (which state the "
    "interleaved schedule or none) get depths 2-23 and read 2-17% fast, as the efficiency parameters were "
    "last fitted with those rows at vpp 1. Rows without a global batch "
    "(NeMo Launcher GPT-3 175B) or a vocabulary (NeMo Nemotron-8B/22B: the launcher yaml leaves the tokenizer "
    "empty) stay skipped: both set the step's work (batch; output-layer FLOPs and memory), and no generic "
    "default stands in for them.",
    "torchtitan / torchao rows ran on the 96 GB, 500 W H100 part and with torch.compile; the power cap and the "
    "compiled kernels' fusion are not modelled (the 96 GB HBM is), so these rows are predicted fast.",
    "MaxText `selective` is read as remat_policy save_qkv_proj and torchtitan `selective` as per-op SAC; a run "
    "with another policy saves a different set of tensors.",
    "One hardware parameter set per GPU serves every software stack; of the stack-specific costs, the "
    "attention kernel generation (fused TE / cuDNN vs FlashAttention-2 in torchtitan and llm-foundry) and "
    "torchao's dynamic-scaling FP8 casts are modelled, elementwise fusion and host overhead per layer are "
    "not, so the remaining bias splits by framework (see 'Residuals by regime').",
    "Korthikanti's micro-batch-level selective recompute (App. C) is modelled as plain selective recompute "
    "(it skips recompute for some micro-batches; +0.4-0.9 MFU points in the paper).",
    "Rows of one run reported as two metrics (iteration time and MFU, or step time and time to train) are "
    "not independent; the hold-out split is by row, so a held-out row can share its configuration with a "
    "fitted row.",
    "GPU clocks are taken at their nominal peak; power or thermal throttling under sustained load "
    "appears only through the fitted GEMM efficiency.",
)


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1f}%"


def _stat_row(name: str, s: ErrorStats) -> str:
    if s.n == 0:
        return f"| {name} | 0 | - | - | - |"
    return f"| {name} | {s.n} | {s.mape:.2f}% | {s.max_abs:.1f}% | {s.mean:+.2f}% |"


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


def summary_md(val: Validation) -> list[str]:
    s = val.summary
    cov = s["time_coverage"]
    out = ["| rows | n | MAPE | max abs error | bias |", "|---|---|---|---|---|",
           _stat_row("**time metrics** (iteration time, tokens/s, TFLOP/s, MFU)", s["time_metrics"]),
           _stat_row("**time metrics, held-out rows**", s["time_metrics_held_out"]),
           _stat_row("dense models: time metrics", s["time_metrics_dense"]),
           _stat_row("dense models: time metrics, held-out rows", s["time_metrics_dense_held_out"]),
           _stat_row("time to train (includes periodic evaluation, not modelled)", s["time_to_train"]),
           _stat_row("time metrics and time to train together", s["time_metrics_with_time_to_train"]),
           _stat_row("**memory rows** (peak memory per GPU)", s["memory"]),
           _stat_row("all modelled rows", s["overall"]), _stat_row("fitted rows", s["fitted_rows"]),
           _stat_row("**held-out rows** (every 3rd of each source)", s["held_out"]), "",
           f"Time-metric rows: {cov['rows']}, predicted {cov['ok']} ({100 * cov['ok'] / max(cov['rows'], 1):.1f}%), "
           f"skipped {cov['skipped']}, infeasible {cov['infeasible']}. Dense models: "
           f"{s['time_coverage_dense']['rows']} rows, predicted {s['time_coverage_dense']['ok']} "
           f"({100 * s['time_coverage_dense']['ok'] / max(s['time_coverage_dense']['rows'], 1):.1f}%), "
           f"infeasible {s['time_coverage_dense']['infeasible']}."]
    out += ["", "### Residuals by regime (time metrics)", "",
            "These feed the expected error band that `comet estimate` and the search summary print "
            "(comet/validate/uncertainty.py, stored in comet/validate/error_bands.json)."]
    for title, key in (("precision", "by_precision"), ("scale", "by_scale"), ("framework", "by_framework"),
                       ("model size", "by_model_size")):
        out += ["", f"| {title} | n | MAPE | max abs error | bias |", "|---|---|---|---|---|"]
        out += [_stat_row(name, st) for name, st in s[key].items() if st.n]
    out += ["", "### By source, metric and cluster spec"]
    for title, key in (("source", "by_source"), ("metric", "by_metric"), ("source / metric", "by_source_metric"),
                       ("cluster spec", "by_gpu")):
        out += ["", f"| {title} | n | MAPE | max abs error | bias |", "|---|---|---|---|---|"]
        out += [_stat_row(name, st) for name, st in s[key].items() if st.n]
    c = s["counts"]
    out += ["", f"{c['ok']} rows predicted, {c['skipped']} skipped, {c['infeasible']} infeasible."]
    return out


def memory_md(val: Validation) -> list[str]:
    """Predicted peak memory per GPU of every modelled row (memory rows compared with the measurement)."""
    out = ["| # | model | configuration | predicted GB per GPU | measured | error |", "|---|---|---|---|---|---|"]
    for p in val.predictions:
        if p.memory_GB is None:
            continue
        c = p.case
        measured = (f"{_fmt(c.value)} ({c.metric.split('_')[1]}, {c.memory_measure})"
                    if c.metric.startswith("memory") else "")
        err = _pct(p.error_pct) if measured and p.status == "ok" else ""
        out.append(f"| {c.index} | {c.row.get('model', '')} | {p.label or '-'} | {p.memory_GB:.1f} | {measured} | "
                   f"{err} |")
    return out


def rows_md(val: Validation) -> list[str]:
    out = ["| # | source | model | GPUs | configuration | metric | measured | predicted | error | held out |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for p in val.predictions:
        c = p.case
        label = c.source_label
        status = _pct(p.error_pct) if p.status == "ok" else f"{p.status}: {p.reason}"
        out.append(f"| {c.index} | {label} | {c.row.get('model', '')} | {c.row.get('num_gpus', '')} | "
                   f"{p.label or '-'} {c.row.get('recompute', '')} | {c.metric} | {_fmt(c.value)} | "
                   f"{_fmt(p.predicted)} | {status} | {'yes' if c.held_out else ''} |")
    return out


def params_md(specs_dir: Path, fits: list[FitResult] | None) -> list[str]:
    fits_by = {f.cluster_file: f for f in fits or []}
    out = []
    for fname in PRIORS:
        path = specs_dir / fname
        if not path.is_file():
            continue
        cluster = load_cluster(path)
        out += ["", f"### {fname} ({cluster.gpu.name})", "",
                "| parameter | value in spec | prior (published fact) | bounds | meaning |", "|---|---|---|---|---|"]
        for prm in PARAMS:
            if prm.key not in PRIORS[fname]:
                continue
            v = get_value(cluster, prm.key)
            at = " (at bound)" if min(abs(v - prm.lo), abs(v - prm.hi)) <= 0.002 * abs(prm.hi - prm.lo) else ""
            out.append(f"| `{prm.key}` | {v:.4g}{at} | {PRIORS[fname][prm.key]:.4g} | "
                       f"{prm.lo:.3g} - {prm.hi:.3g} | {prm.meaning} |")
        frac = large_gemm_fraction(cluster)
        bound = " (at bound)" if min(abs(frac - b) for b in LARGE_GEMM_RANGE) < 0.002 else ""
        out += ["", f"An 8192^3 GEMM reaches {frac:.3f} of the dense peak in this spec{bound} "
                    f"(allowed {LARGE_GEMM_RANGE[0]}-{LARGE_GEMM_RANGE[1]})."]
        fit = fits_by.get(fname)
        if fit:
            fixed = [k for k, v in fit.sensitive.items() if not v]
            out += ["", f"Fit: {fit.train_rows} rows, {fit.held_out_rows} held out; mean |ln error| + prior "
                        f"{fit.loss_start:.4f} -> {fit.loss_end:.4f} in {fit.evaluations} evaluations."]
            if fixed:
                out.append(f"Not constrained by these rows (kept at the prior): {', '.join(fixed)}.")
    return out


def render(val: Validation, specs_dir: Path, command: str, fits: list[FitResult] | None = None) -> str:
    lines = ["# Validation against published measurements", "",
             f"Generated by `{command}` on {date.today().isoformat()} from `{val.csv.name}` "
             f"({len(val.cases)} rows). Do not edit by hand: re-run the command.", "",
             "Each row is predicted with `comet.evaluate.evaluate()` (or, for the single-layer rows, the "
             "layer's forward + recompute + backward blocks timed with `comet.replay.blocks.time_block`) and "
             "compared in the row's own FLOP accounting (`flops_formula`: megatron_model, narayanan_eq3, palm_6n, "
             "llm_foundry; comet/validate/accounting.py) and MFU peak (`mfu_peak_tflops`). "
             "Errors are (predicted - measured) / measured.", ""]
    if val.warnings:
        lines += [f"> **Structural check failed** ({len(val.warnings)} mismatches, see 'Structural checks'): the "
                  "built layer blocks do not have the analytical FLOPs, so the errors below mix a graph bug with "
                  "the physics. Fix the builder and re-run this command.", ""]
    lines += ["## Summary", ""]
    lines += summary_md(val)
    lines += ["", "![Signed error of every predicted row by source; held-out rows hollow](validation.png)"]
    lines += ["", "## Structural checks", "",
              "The FLOPs of the built layer blocks are compared with the analytical count (comet/validate/"
              "checks.py) for every modelled configuration, so that the errors above can be read as physics."]
    lines += [""] + ([f"- **mismatch**: {w}" for w in val.warnings] or
                     ["All layer blocks match the analytical GEMM and attention FLOPs within 1%."])
    lines += ["", "## Defaults where a row is silent", "",
              "An empty cell takes the default of the row's `framework` (below, from comet/validate/frameworks.py) "
              "and is listed as an assumption of that row (JSON `assumptions`). Explicit cells always win; the "
              "`source` text is never used to pick a default.", "", FRAMEWORK_DOC.strip(), "",
              "| framework | micro-batch | precision | ZeRO | FSDP | SP | recompute | grad reduce | vocab pad | "
              "TP overlap | FLOP formula |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in list(FRAMEWORKS.values()) + [GENERIC]:
        lines.append(f"| {d.key} | {d.micro_batch} | {d.precision} | {d.zero} | {d.fsdp} | "
                     f"{'with tp' if d.sequence_parallel is None else d.sequence_parallel} | {d.recompute} | "
                     f"{d.grad_dtype} | {d.vocab_pad_to} | {d.overlap_tp_comm} | {d.flops_formula} |")
    lines += ["", "## Memory-saving knobs a row leaves empty", "", MEMORY_KNOBS_DOC.strip(), "",
              "| framework | BF16-gradient step | BF16 optimizer-state step | selective recompute | uneven stages |",
              "|---|---|---|---|---|"]
    for d in list(FRAMEWORKS.values()) + [defaults_for("megatron-lm", "2021"), GENERIC]:
        lines.append(f"| {d.key} | {d.bf16_grad_reduce} | {d.bf16_optimizer_state} | "
                     f"{d.selective_recompute} | {d.uneven_pipeline} |")
    lines += ["", "## Layouts a row does not state", "", LAYOUT_DOC.strip()]
    lines += ["", "## Calibrated parameters", "",
              "One parameter set per GPU type, fitted by `comet validate --fit` (bounded coordinate search on "
              "the mean |ln(predicted/measured)| of the fitted rows, averaged per source so each publication "
              "weighs the same, plus a quadratic pull towards the published hardware fact; "
              "comet/validate/calibrate.py). Held-out rows are never seen by the fit. The values below are read "
              "from the cluster specs; their YAML comments say when, by which command and on which rows they "
              "were fitted."]
    lines += params_md(specs_dir, fits)
    lines += ["", "## Commands", "",
              "- `comet validate [CSV] [--json OUT] [--docs [MD]]`: predict every row, print the table and the "
              "summary (default CSV ../shared/calibration/measurements.csv); `--docs` writes this file.",
              "- `comet validate --fit` (or `python -m comet.validate.calibrate [CSV] [--no-write]`): re-fit the "
              "parameters above, write them into cluster_specs/*.yaml and regenerate this file.",
              "- `pytest -m slow tests/validate`: the targets (Korthikanti iteration times <= 5% MAPE, overall "
              "<= 8%) on the shipped CSV and specs."]
    lines += ["", "## Your own measurements", "",
              "A CSV in the same schema (../shared/calibration/SCHEMA.md) is read the same way: "
              "`comet validate my_runs.csv --json out.json`. Every column is read; explicit cells win; empty "
              "cells take the framework default above and are listed per row under `assumptions` in the JSON "
              "(`index` is the 0-based CSV row, `status` ok / infeasible / skipped, `predicted` is in the row's "
              "metric, `reason` says why a row was not predicted). A bad cell (unknown enum value, non-numeric "
              "number, tp*pp*dp*cp != num_gpus) skips that row with the column and value; the others go on. "
              "Empty memory-saving knobs and an unstated tp x pp split are filled as the two sections above "
              "say, and listed under `assumptions`. "
              "Memory is predicted for every modelled row (`memory_gb_per_gpu`); a configuration fits when its "
              "predicted peak is within 5% of HBM (comet/workload/memory.py FIT_MARGIN).",
              "", "## Memory", "", MEMORY_MODEL, "", MEMORY_MEASURES_DOC.strip(), ""]
    lines += memory_md(val)
    lines += ["", "## Settings chosen for knobs a row leaves empty", "",
              "Rows whose configuration the memory-knob ladder or the layout search set (sections above):", ""]
    lines += [f"- row {p.case.index} ({p.case.row.get('model', '')}): {note}"
              for p in val.predictions for note in p.case.chosen] or ["- none"]
    lines += ["", "## Rows", ""]
    lines += rows_md(val)
    lines += ["", "## Known limitations", ""]
    lines += [f"- {x}" for x in LIMITATIONS]
    return "\n".join(lines) + "\n"
