"""`comet validate [CSV] [--json OUT] [--fit] [--docs [MD]]`: predict published training measurements,
print predicted vs measured per row and the error summary (MAPE, max error per source and metric,
held-out rows). --fit first calibrates the cluster specs' efficiency parameters (one set per GPU type)
and writes them into cluster_specs/*.yaml."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from comet.validate.kernels import kernel_level
from comet.validate.runner import find_csv, repo_root, run_validation

DEFAULT_DOCS = "docs/validation.md"


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="compare predictions with published measurements",
                              description=__doc__)
    p.add_argument("csv", nargs="?", help="measurements CSV (schema ../shared/calibration/SCHEMA.md; default: ../shared/calibration/measurements.csv)")
    p.add_argument("--json", metavar="OUT", help="write {rows, summary} as JSON")
    p.add_argument("--fit", action="store_true",
                   help="calibrate the efficiency parameters first and write them into cluster_specs/*.yaml")
    p.add_argument("--no-write", action="store_true", help="with --fit: report the fit and validate with it, leave the YAML alone")
    p.add_argument("--docs", nargs="?", const="", metavar="MD",
                   help=f"write the markdown report (default path {DEFAULT_DOCS}; always written after --fit)")
    p.add_argument("--specs", metavar="DIR", help="cluster spec folder (default: the repository's cluster_specs)")
    p.add_argument("--quiet", action="store_true", help="summary only, no per-row table")
    p.set_defaults(func=run)


def _err(x: float) -> str:
    if math.isnan(x):
        return "-"
    colour = "green" if abs(x) <= 5 else ("yellow" if abs(x) <= 10 else "red")
    return f"[{colour}]{x:+.1f}%[/{colour}]"


def _num(x: float) -> str:
    return "-" if math.isnan(x) else (f"{x:.4g}" if abs(x) < 1e4 else f"{x:,.0f}")


METRIC_SHORT = {"iteration_time_s": "iter s", "tflops_per_gpu": "TFLOP/s", "mfu": "MFU %",
                "tokens_per_s_per_gpu": "tok/s/GPU", "layer_fwd_bwd_time_ms": "layer ms"}


def _rows_table(val) -> Table:
    t = Table(title=f"comet validate: {val.csv.name}", show_lines=False)
    for col in ("#", "source", "model", "GPUs", "config", "metric", "measured", "predicted", "error", "hold"):
        t.add_column(col, justify="right" if col in ("#", "GPUs", "measured", "predicted", "error") else "left")
    for p in val.predictions:
        c = p.case
        label = c.source_label[:28]
        err = _err(p.error_pct) if p.status == "ok" else f"[dim]{p.status}[/dim]"
        model = c.row.get("model", "").split(" (")[0][:20]
        if c.metric == "layer_fwd_bwd_time_ms":
            model += " layer"
        t.add_row(str(c.index), label, model, c.row.get("num_gpus", ""), p.label or "-",
                  METRIC_SHORT.get(c.metric, c.metric), _num(c.value), _num(p.predicted), err,
                  "H" if c.held_out else "")
    return t


def _summary_table(summary: dict) -> Table:
    t = Table(title="error summary (MAPE = mean |predicted - measured| / measured)")
    for col in ("group", "n", "MAPE", "max |error|", "bias"):
        t.add_column(col, justify="left" if col == "group" else "right")

    def add(name, s, style=None):
        if s.n:
            t.add_row(name, str(s.n), f"{s.mape:.2f}%", f"{s.max_abs:.1f}%", f"{s.mean:+.2f}%", style=style)

    add("all modelled rows", summary["overall"], "bold")
    add("fitted rows", summary["fitted_rows"])
    add("held-out rows", summary["held_out"], "bold")
    for key, prefix in (("by_source", "source"), ("by_metric", "metric"), ("by_source_metric", "")):
        t.add_section()
        for name, s in summary[key].items():
            add(f"{prefix}: {name}" if prefix else name, s)
    return t


def run(args) -> int:
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 150))   # piped / captured: do not squeeze the table
    csv = find_csv(args.csv)
    specs = Path(args.specs) if args.specs else repo_root() / "cluster_specs"
    if kernel_level(csv):   # collectives / gemm / attention / memory microbenchmarks (comet/validate/kernels.py)
        from comet.cli.validate_kernels import run_kernels
        return run_kernels(csv, specs, console, args.quiet, args.json)
    fits = None
    command = "comet validate" + (" --fit" if args.fit else "")
    if args.fit:
        from comet.validate.calibrate import fit_all, write_fit
        from comet.validate.rows import load_cases
        from comet.validate.checks import structural_warnings
        cases = load_cases(csv)
        warnings = structural_warnings(cases)
        fits = fit_all(cases, specs)
        if args.no_write:   # validate with the fitted values, written into a scratch copy of the specs
            import atexit
            import shutil
            import tempfile
            scratch_root = tempfile.mkdtemp(prefix="comet-fit-")
            atexit.register(shutil.rmtree, scratch_root, ignore_errors=True)
            scratch = Path(scratch_root) / "cluster_specs"
            shutil.copytree(specs, scratch)
            specs = scratch
        for fit in fits:
            console.print(f"[bold]fit {fit.cluster_file}[/bold]: {fit.train_rows} rows "
                          f"({fit.held_out_rows} held out), loss {fit.loss_start:.4f} -> {fit.loss_end:.4f}, "
                          f"{fit.evaluations} evaluations")
            for k, v in fit.values.items():
                note = "" if fit.sensitive[k] else "  [dim](not constrained by these rows: prior kept)[/dim]"
                console.print(f"  {k:45s} {fit.start[k]:>10.4g} -> {v:<10.4g}{note}")
            for k, v in fit.derived.items():
                console.print(f"  {k:45s} {'derived':>10s} -> {v:<10.4g}")
            written = write_fit(fit, specs, csv.name, command, warnings)
            if not args.no_write:
                console.print(f"  written to {written}")
    val = run_validation(csv, specs)
    if not args.quiet:
        console.print(_rows_table(val))
    for p in val.predictions:
        if p.status != "ok":
            console.print(f"row {p.case.index} ({p.case.row.get('model', '')}, {p.case.metric}) {p.status}: {p.reason}",
                          soft_wrap=True)
    for p in val.predictions:
        for note in p.case.chosen:    # settings comet chose for knobs the row leaves empty
            console.print(f"row {p.case.index} ({p.case.row.get('model', '')}) assumed {note}", soft_wrap=True)
    console.print(_summary_table(val.summary))
    h = val.summary["held_out"]
    if h.n:
        console.print(f"held-out rows: n={h.n}, MAPE {h.mape:.2f}%, max |error| {h.max_abs:.1f}%", soft_wrap=True)
    s = val.summary
    for name, key, cov in (("time metrics (iteration time, tokens/s, TFLOP/s, MFU)", "time_metrics", "time_coverage"),
                           ("time metrics, dense models", "time_metrics_dense", "time_coverage_dense")):
        st, c = s[key], s[cov]
        console.print(f"{name}: MAPE {st.mape:.2f}% over {st.n} rows (held out: "
                      f"{s[key + '_held_out'].mape:.2f}%); "
                      f"{c['ok']} of {c['rows']} predicted ({100 * c['ok'] / max(c['rows'], 1):.1f}%), "
                      f"{c['infeasible']} infeasible", soft_wrap=True)
    if s["time_to_train"].n:
        console.print(f"time to train (includes periodic evaluation, not modelled): MAPE {s['time_to_train'].mape:.2f}% "
                      f"over {s['time_to_train'].n} rows; with the time metrics: "
                      f"{s['time_metrics_with_time_to_train'].mape:.2f}% over {s['time_metrics_with_time_to_train'].n}",
                      soft_wrap=True)
    if s["memory"].n:
        console.print(f"memory rows: MAPE {s['memory'].mape:.2f}% over {s['memory'].n} rows", soft_wrap=True)
    for w in val.warnings:
        console.print(f"[yellow]structural check:[/yellow] {w} (comet/workload/layers.py)", soft_wrap=True)
    c = val.summary["counts"]
    console.print(f"{c['ok']} predicted, {c['skipped']} skipped, {c['infeasible']} infeasible")
    if args.json:
        val.write_json(args.json)
        console.print(f"JSON written to {args.json}")
    if args.docs or args.docs == "" or (args.fit and not args.no_write):
        from comet.validate.report import render
        path = Path(args.docs) if args.docs else repo_root() / DEFAULT_DOCS
        if path.resolve() == (repo_root() / DEFAULT_DOCS).resolve():   # the shipped report: keep its error bands
            from comet.validate.summary import summary_as_dict
            from comet.validate.uncertainty import write_bands
            write_bands(summary_as_dict(val.summary), val.csv.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(val, specs, command, fits))
        from comet.validate.plot import plot_errors
        png = plot_errors(val, path.with_suffix(".png"))
        console.print(f"report written to {path} (plot: {png.name})")
    return 0
