"""Fit the cluster specs' physical efficiency parameters to the published measurements.

One parameter set per GPU type (never per model or per row). Each parameter has a physical meaning,
bounds that keep it physically plausible, and a prior centre taken from a published hardware fact
(calibration/README.md "Hardware facts"); the fit minimises

    mean over sources of the mean over its fitted rows |ln(predicted / measured)|
        +  PRIOR_WEIGHT * sum(((x - x0) / (hi - lo))^2)

by a deterministic bounded coordinate search (no scipy in the environment), starting from the prior.
Every third modelled row of each source is held out and reported separately.

    python -m comet.validate.calibrate [CSV] [--no-write]     (same as `comet validate --fit`)
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

from comet.config.cluster import ClusterSpec, load_cluster
from comet.validate.predict import ClusterCache, Prediction, predict
from comet.validate.rows import MEMORY_METRICS, Case

PRIOR_GEMM_FP8 = 0.74   # ~1400-1470 TFLOP/s FP8 large GEMMs of 1978.9 (DeepGEMM PRs; calibration README)
LARGE_GEMM_RANGE = (0.60, 0.90)   # achieved fraction of dense peak of an 8192^3 BF16 GEMM
PRIOR_WEIGHT = 0.05      # a parameter moved by half its range costs as much as 1.25% mean error
MIN_STEP = 1 / 256       # coordinate-search resolution, as a fraction of each parameter's range


@dataclass(frozen=True)
class Param:
    key: str                 # "efficiency.gemm" or "network.<dim name>.<field>"
    lo: float
    hi: float
    meaning: str
    log: bool = False        # searched on a log scale (sizes in bytes)

    def to_unit(self, x: float) -> float:
        if self.log:
            return (math.log(x) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return (x - self.lo) / (self.hi - self.lo)

    def from_unit(self, u: float) -> float:
        u = min(1.0, max(0.0, u))
        if self.log:
            return math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        return self.lo + u * (self.hi - self.lo)


# Bounds: NCCL bus efficiency 0.6-0.95 and a large GEMM at 0.6-0.9 of dense peak (project brief). The
# GEMM bound applies to what an 8192^3 GEMM achieves with every term of the cost model (efficiency, wave
# quantization, k/(k + k_half)): LARGE_GEMM_RANGE, checked in the loss. Flash
# attention 25-75% of peak (FlashAttention-2 on H100 ~25-35%, FlashAttention-3 / cuDNN up to ~75%;
# Dao 2023, Shah et al. 2024); elementwise kernels 60-92% of HBM bandwidth (STREAM-like copy on
# HBM2e/HBM3); launch + tail 1-12 us per kernel.
PARAMS: tuple[Param, ...] = (
    Param("efficiency.gemm", 0.60, 0.95, "in-training large-GEMM fraction of dense tensor peak (sustained "
          "clocks under the power cap included)"),
    Param("efficiency.gemm_k_half", 32, 512, "reduction length k at which a GEMM tile loop reaches half "
          "of `gemm` (prologue/epilogue cost per tile)", log=True),
    Param("efficiency.attention_fwd", 0.30, 0.75, "flash-attention forward fraction of peak"),
    Param("efficiency.attention_bwd", 0.25, 0.65, "flash-attention backward fraction of peak"),
    Param("efficiency.memory_bound", 0.60, 0.92, "fraction of HBM bandwidth reached by elementwise kernels"),
    Param("efficiency.kernel_overhead_us", 1.0, 12.0, "launch + tail cost per kernel, microseconds"),
    Param("efficiency.overlap_slowdown", 0.0, 0.30, "compute slowdown while a collective is in flight "
          "(SMs and HBM taken by NCCL kernels)"),
    Param("efficiency.gemm_fp8", 0.45, 0.80, "in-training large FP8 GEMM fraction of dense FP8 peak (TE "
          "casts and amax reductions are separate kernels)"),
)
# Network efficiencies are calibrated against nccl-tests (collectives.csv) by the network model's own
# checks, not against end-to-end steps: fitting them here would let step-time residuals of other
# causes leak into link physics.
NETWORK_PARAMS: tuple[Param, ...] = (
    Param("network.nvlink.bus_efficiency", 0.60, 0.95, "NVLink ring bus bandwidth / link rate, large messages"),
    Param("network.nvlink.half_efficiency_bytes", 2.5e5, 3.2e7, "NVLink message size reaching half of the "
          "bus efficiency (latency-bound below)", log=True),
    Param("network.infiniband.bus_efficiency", 0.60, 0.95, "InfiniBand bus bandwidth / NIC line rate"),
    Param("network.infiniband.half_efficiency_bytes", 5e5, 6.4e7, "InfiniBand message size reaching half of "
          "the bus efficiency", log=True),
)

# Prior centres and start points: published measurements (calibration/README.md "Hardware facts").
PRIORS: dict[str, dict[str, float]] = {
    "h100_dgx.yaml": {
        "efficiency.gemm": 0.80,                 # ~790-800 TFLOP/s at 8192^3 BF16 of 989.4
        "efficiency.gemm_k_half": 128,
        "efficiency.attention_fwd": 0.60,        # FlashAttention-3 / cuDNN fused attention fwd on H100
        "efficiency.attention_bwd": 0.45,
        "efficiency.memory_bound": 0.85,
        "efficiency.kernel_overhead_us": 4.0,
        "efficiency.overlap_slowdown": 0.10,
        "efficiency.gemm_fp8": PRIOR_GEMM_FP8,   # ~1400-1470 TFLOP/s large FP8 GEMMs of 1978.9 (gemm.csv)
        "network.nvlink.bus_efficiency": 0.82,   # ~370 GB/s ring bus bandwidth of 450 (nccl-tests#212)
        "network.nvlink.half_efficiency_bytes": 2.0e6,
        "network.infiniband.bus_efficiency": 0.94,   # 46-49 GB/s per 400 Gb/s NIC (nccl-tests#290, #267)
        "network.infiniband.half_efficiency_bytes": 4.0e6,
    },
    "a100_dgx.yaml": {
        "efficiency.gemm": 0.83,                 # ~260 TFLOP/s cuBLAS FP16/BF16 large GEMM of 312
        "efficiency.gemm_k_half": 128,
        "efficiency.attention_fwd": 0.65,        # FlashAttention-2 on A100 (not exercised: rows are unfused)
        "efficiency.attention_bwd": 0.50,
        "efficiency.memory_bound": 0.85,
        "efficiency.kernel_overhead_us": 4.0,
        "efficiency.overlap_slowdown": 0.10,
        "efficiency.gemm_fp8": PRIOR_GEMM_FP8,   # A100 has no FP8: never constrained, prior kept
        "network.nvlink.bus_efficiency": 0.78,   # ~235 GB/s ring all-reduce bus bandwidth of 300 on DGX A100
        "network.nvlink.half_efficiency_bytes": 8.0e6,
        "network.infiniband.bus_efficiency": 0.92,   # ~23 GB/s per HDR 200 Gb/s NIC
        "network.infiniband.half_efficiency_bytes": 1.6e7,
    },
}


# ------------------------------------------------------------------------------------ spec editing
def get_value(cluster: ClusterSpec, key: str) -> float:
    parts = key.split(".")
    if parts[0] == "efficiency":
        return float(getattr(cluster.efficiency, parts[1]))
    dim = next(d for d in cluster.network if d.name == parts[1])
    return float(getattr(dim, parts[2]))


def with_values(cluster: ClusterSpec, values: dict[str, float]) -> ClusterSpec:
    eff = {k.split(".")[1]: v for k, v in values.items() if k.startswith("efficiency.")}
    net = {}
    for k, v in values.items():
        if k.startswith("network."):
            _, name, fld = k.split(".")
            net.setdefault(name, {})[fld] = v
    network = tuple(replace(d, **net[d.name]) if d.name in net else d for d in cluster.network)
    return cluster.with_changes(efficiency=replace(cluster.efficiency, **eff), network=network)


def large_gemm_fraction(cluster: ClusterSpec, size: int = 8192) -> float:
    """Fraction of the dense 16-bit peak a size^3 GEMM reaches in the cost model."""
    from comet.hardware.compute import gemm_time_s
    peak = cluster.gpu.peak_flops("bf16" if "bf16" in cluster.gpu.peak_tflops else "fp16")
    return 2.0 * size ** 3 / gemm_time_s(size, size, size, cluster, "bf16") / peak


# ------------------------------------------------------------------------------------------- the fit
@dataclass
class FitResult:
    cluster_file: str
    values: dict[str, float]
    start: dict[str, float]
    train_rows: int
    held_out_rows: int
    loss_start: float
    loss_end: float
    evaluations: int
    sensitive: dict[str, bool]     # whether the fitted rows constrain each parameter at all
    derived: dict[str, float]      # set from fitted values by a stated rule (not fitted themselves)
    sources: dict[str, int]        # fitted rows per source


# Robust loss: a row's |ln error| counts at most ln(1.3). A row the model misses by more than 30% has a
# cause the efficiencies do not describe (a missing mechanism, a default that was not what the run used);
# letting it pull on the GEMM or attention rates would spread its error over every other row.
LOG_ERROR_CAP = math.log(1.3)


def _log_error(preds: list[Prediction]) -> float:
    """Mean capped |ln(predicted / measured)| per source, averaged over sources: each publication weighs
    the same, however many rows it contributes (otherwise the 20 MosaicML rows would outvote the 9
    Megatron-LM rows on the H100)."""
    by_source: dict[str, list[float]] = {}
    for p in preds:
        if p.status == "ok" and p.predicted > 0:
            err = min(abs(math.log(p.predicted / p.case.value)), LOG_ERROR_CAP)
            by_source.setdefault(p.case.source_label, []).append(err)
    means = [sum(v) / len(v) for v in by_source.values()]
    return sum(means) / len(means) if means else 0.0


def fit_gpu(cases: list[Case], base: ClusterSpec, cluster_file: str) -> FitResult:
    rows = [c for c in cases if c.cluster_file == cluster_file and not c.skip_reason and not c.held_out
            and c.metric not in MEMORY_METRICS            # memory does not depend on the efficiencies
            and c.metric != "time_to_train_min"]          # counts evaluation passes comet does not model
    base_cache = ClusterCache(".", {cluster_file: base})
    rows = [c for c in rows if predict(c, base_cache).status == "ok"]   # infeasible rows cannot inform a rate
    prior = PRIORS[cluster_file]
    params = [p for p in PARAMS if p.key in prior]
    u0 = [p.to_unit(prior[p.key]) for p in params]
    evals = 0

    def loss(u: list[float]) -> float:
        nonlocal evals
        evals += 1
        values = {p.key: p.from_unit(x) for p, x in zip(params, u)}
        cluster = with_values(base, values)
        if not LARGE_GEMM_RANGE[0] <= large_gemm_fraction(cluster) <= LARGE_GEMM_RANGE[1]:
            return math.inf
        cache = ClusterCache(".", {cluster_file: cluster})
        preds = [predict(c, cache) for c in rows]
        if any(p.status != "ok" for p in preds):
            return math.inf
        penalty = sum((x - x0) ** 2 for x, x0 in zip(u, u0))
        return _log_error(preds) + PRIOR_WEIGHT * penalty

    u = list(u0)
    best = start = loss(u)
    sensitive = {}
    for i, p in enumerate(params):   # does the data see this parameter at all?
        probe = list(u0)
        probe[i] = min(1.0, u0[i] + 0.1) if u0[i] < 0.9 else u0[i] - 0.1
        sensitive[p.key] = abs(loss(probe) - PRIOR_WEIGHT * 0.01 - start) > 1e-9
    step = 0.25
    while step >= MIN_STEP:
        improved = False
        for i, p in enumerate(params):
            if not sensitive[p.key]:
                continue
            for d in (step, -step):
                trial = list(u)
                trial[i] = min(1.0, max(0.0, u[i] + d))
                if trial[i] == u[i]:
                    continue
                val = loss(trial)
                if val < best - 1e-9:
                    u, best, improved = trial, val, True
                    break
        if not improved:
            step /= 2
    values = {p.key: _round(p.from_unit(x)) for p, x in zip(params, u)}
    derived = {}
    if "fp8" in base.gpu.peak_tflops and "efficiency.gemm" in values and not sensitive.get("efficiency.gemm_fp8"):
        # No FP8 row to fit: FP8 GEMMs keep their published ratio to BF16 (~1400-1470 vs ~790-800 TFLOP/s
        # for large shapes, calibration README), so in-training losses scale both alike.
        derived["efficiency.gemm_fp8"] = _round(PRIOR_GEMM_FP8 * values["efficiency.gemm"] / prior["efficiency.gemm"])
    held = sum(1 for c in cases if c.cluster_file == cluster_file and not c.skip_reason and c.held_out)
    return FitResult(cluster_file, values, {p.key: prior[p.key] for p in params}, len(rows), held, start, best,
                     evals, sensitive, derived, _count_sources(rows))


def _count_sources(rows: list[Case]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in rows:
        out[c.source_label] = out.get(c.source_label, 0) + 1
    return out


def _round(x: float) -> float:
    if x == 0:
        return 0.0
    return float(f"{x:.3g}")


# ------------------------------------------------------------------------------------ YAML writing
def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.3g}".replace("e+0", "e").replace("e+", "e")


def _replace_key(lines: list[str], start: int, end: int, key: str, value: float, note: str) -> bool:
    """Set `key: value` in lines[start:end]; the comment becomes `note: <the original comment>`."""
    pat = re.compile(rf"^(\s+){re.escape(key)}:\s*([^#\n]*?)(\s*#\s*(.*))?$")
    for i in range(start, end):
        m = pat.match(lines[i])
        if m:
            # drop the note of an earlier fit ("fit <date> (prior x)", alone or before ": original")
            old_comment = re.sub(r"^(fit|derived) \d{4}-\d{2}-\d{2}[^:]*(: ?|$)", "", m.group(4) or "")
            comment = note + (f": {old_comment}" if old_comment else "")
            lines[i] = f"{m.group(1)}{key}: {_fmt(value)}  # {comment}"
            return True
    return False


def _block(lines: list[str], header: re.Pattern) -> tuple[int, int]:
    """[start, end) of the lines under the first line matching `header`: up to the next top-level key
    or the next list item."""
    for i, line in enumerate(lines):
        if header.match(line):
            j = i + 1
            while j < len(lines):
                s = lines[j]
                body = s.strip()
                if body and not body.startswith("#") and (not s.startswith(" ") or body.startswith("- ")):
                    break
                j += 1
            return i + 1, j
    return -1, -1


def write_values(path: Path, values: dict[str, float], notes: dict[str, str], header: list[str]) -> None:
    """Set keys in a cluster spec YAML in place (other keys and the original comments are kept; the
    comment is prefixed by notes[key]), and put `header` (comment lines) right above `efficiency:`."""
    lines = path.read_text().splitlines()
    for key, value in values.items():
        note = notes[key]
        parts = key.split(".")
        if parts[0] == "efficiency":
            lo, hi = _block(lines, re.compile(r"^efficiency:\s*$"))
            fld = parts[1]
        else:
            lo, hi = _block(lines, re.compile(rf"^\s*-\s*name:\s*{re.escape(parts[1])}\b"))
            fld = parts[2]
        if lo < 0:
            raise ValueError(f"{path}: no block for {key}")
        if not _replace_key(lines, lo, hi, fld, value, note):
            indent = "  " if parts[0] == "efficiency" else "    "
            lines.insert(hi, f"{indent}{fld}: {_fmt(value)}  # {note}")
    eff = next(i for i, s in enumerate(lines) if re.match(r"^efficiency:\s*$", s))
    top = eff
    while top > 0 and lines[top - 1].startswith(("# Calibrated", "#   ")):
        top -= 1
    lines[top:eff] = header
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------- driver
def fit_all(cases: list[Case], specs_dir: Path) -> list[FitResult]:
    files = sorted({c.cluster_file for c in cases if not c.skip_reason and c.cluster_file in PRIORS})
    return [fit_gpu(cases, load_cluster(specs_dir / f), f) for f in files]


def header_lines(fit: FitResult, csv_name: str, command: str, warnings: list[str] = ()) -> list[str]:
    today = date.today().isoformat()
    per_source = ", ".join(f"{k} {n}" for k, n in fit.sources.items())
    return [f"# Calibrated {today} by `{command}` against {csv_name}: {fit.train_rows} fitted rows",
            f"#   ({per_source}); {fit.held_out_rows} held out (every 3rd modelled row of each source).",
            f"#   Per-source mean |ln(predicted/measured)| + prior: {fit.loss_start:.3f} -> {fit.loss_end:.3f}.",
            "#   Keys marked 'fit' were fitted within physical bounds around a published hardware fact (the",
            "#   prior; comet/validate/calibrate.py PARAMS / PRIORS); 'derived' keys follow from fitted ones",
            "#   by the stated rule. docs/validation.md lists them and their physical meaning.",
            ("#   Structural checks passed: layer-block FLOPs equal the analytical count." if not warnings else
             f"#   WARNING: fitted while a structural check failed ({warnings[0]}): re-fit once fixed.")]


def write_fit(fit: FitResult, specs_dir: Path, csv_name: str, command: str, warnings: list[str] = ()) -> Path:
    path = specs_dir / fit.cluster_file
    today = date.today().isoformat()
    changed = {k: v for k, v in fit.values.items() if fit.sensitive.get(k)}
    notes = {k: f"fit {today} (prior {fit.start[k]:.3g})" for k in changed}
    for k, v in fit.derived.items():
        changed[k] = v
        notes[k] = f"derived {today} (gemm_fp8 = {PRIOR_GEMM_FP8} * gemm / {fit.start['efficiency.gemm']:.3g})"
    write_values(path, changed, notes, header_lines(fit, csv_name, command, warnings))
    return path


def main(argv: list[str] | None = None) -> int:
    from comet.validate.rows import load_cases
    from comet.validate.runner import default_csv, repo_root
    ap = argparse.ArgumentParser(prog="python -m comet.validate.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", help="published measurements (default: ../shared/calibration/published.csv)")
    ap.add_argument("--no-write", action="store_true", help="print the fitted values, leave the YAML files alone")
    args = ap.parse_args(argv)
    csv_path = Path(args.csv) if args.csv else default_csv()
    specs = repo_root() / "cluster_specs"
    cases = load_cases(csv_path)
    from comet.validate.checks import structural_warnings
    warnings = structural_warnings(cases)
    for w in warnings:
        print(f"structural check: {w}")
    for fit in fit_all(cases, specs):
        print(f"{fit.cluster_file}: loss {fit.loss_start:.4f} -> {fit.loss_end:.4f} in {fit.evaluations} evaluations")
        for k, v in fit.values.items():
            flag = "" if fit.sensitive[k] else "   (not constrained by these rows: kept at prior)"
            print(f"  {k:45s} {fit.start[k]:>10.4g} -> {v:<10.4g}{flag}")
        for k, v in fit.derived.items():
            print(f"  {k:45s} {'derived':>10s} -> {v:<10.4g}")
        if not args.no_write:
            print(f"  written to {write_fit(fit, specs, csv_path.name, 'python -m comet.validate.calibrate', warnings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
