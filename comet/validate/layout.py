"""Some sources give only the model-parallel size (Narayanan et al. SC21 Table 2: tp*pp = 96, from
num_gpus / dp) or no layout at all (a strong-scaling curve). Such a run was tuned by its authors, so it
is predicted with the layout its framework would be tuned to: the fastest feasible one, found by a
small exhaustive search with comet's own evaluate():

- tp: the stated value, else every power of two up to the cluster's scale-up domain (GPUs per node)
  that divides the heads and the KV heads (Megatron's rule);
- pp: the stated value, else every divisor of num_gpus / (tp * cp) (and of the model-parallel size
  num_gpus / (dp * cp) where dp is stated) up to the layer count; the layers must split evenly over
  pp * vpp unless the framework runs uneven stages (Megatron-Core: the first stage takes the
  remainder, or embedding and loss count as layers; comet/validate/rows.py);
- dp = num_gpus / (tp * pp * cp) must divide the global batch into whole micro-batches.

Each candidate takes the row's other cells, the unstated memory knobs are fitted as for any row
(comet/validate/memory_knobs.py), and those that fit are evaluated. The fastest step wins; ties go to
the first in (tp, pp) ascending order, so the choice is deterministic. The search is bounded by the
divisor counts and at most 64 candidates (1 to 59 for the rows of measurements.csv). The chosen
layout is reported as an assumption with how many layouts were searched; it is chosen once per row,
with the cluster spec's parameters at that time (a `--fit` keeps it while it varies them).
"""

from __future__ import annotations

from comet.config.cluster import ClusterSpec
from comet.evaluate import evaluate
from comet.result import Result
from comet.validate.memory_knobs import fit_unstated_knobs, memory_of, with_steps
from comet.validate.rows import Case, Cells, RowError, layout_config

MAX_LAYOUTS = 64     # evaluations per row at most (the candidates in (tp, pp) order beyond it are dropped)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def candidate_layouts(case: Case, scale_up: int) -> list[tuple[int, int]]:
    """(tp, pp) pairs the row's stated cells allow, in ascending order."""
    c = Cells(case.row, case.defaults, [])
    tp_stated, pp_stated = case.open_layout
    model, par = case.model, case.parallel
    gpus, dp, cp, vpp, mb = par.gpus, c.integer("dp"), par.cp, par.vpp, par.micro_batch
    tps = [tp_stated] if tp_stated else [t for t in (2 ** k for k in range(12)) if t <= scale_up
                                         and model.heads % t == 0 and model.kv_heads % t == 0]
    out = []
    for tp in tps:
        if gpus % (tp * cp):
            continue
        rest = gpus // (tp * cp)
        for pp in ([pp_stated] if pp_stated else _divisors(rest)):
            if rest % pp or pp > model.layers or (vpp > 1 and pp == 1):
                continue
            dp_here = rest // pp
            if (dp is not None and dp != dp_here) or par.global_batch % (dp_here * mb):
                continue
            if model.layers % (pp * vpp) and not case.defaults.uneven_pipeline:
                continue
            out.append((tp, pp))
    return out[:MAX_LAYOUTS]


def choose_layout(case: Case, cluster: ClusterSpec) -> Result | None:
    """Search the row's open layout; on success the case's configuration and assumptions become the
    fastest feasible layout's and its result is returned. None when no layout is feasible (the case then
    keeps its stand-in configuration and the reason says what was searched)."""
    best: tuple[Result, object, list[str], list[str]] | None = None
    candidates = candidate_layouts(case, cluster.gpus_per_node)
    for tp, pp in candidates:
        try:
            par, notes = layout_config(case, tp, pp)
        except RowError:
            continue
        par, taken, replaced = fit_unstated_knobs(case.model, cluster, par, case.row, case.defaults)
        mem = memory_of(case.model, cluster, par)
        if mem is None or not mem.fits:
            continue
        res = evaluate(case.model, cluster, par)
        if res.feasible and (best is None or res.step_time_s < best[0].step_time_s):
            best = (res, par, with_steps(notes, taken, replaced), taken)
    case.open_layout = None
    if best is None:
        case.assumptions.append(
            f"layout not stated; none of {len(candidates)} layouts searched fits (comet/validate/layout.py)"
            if candidates else f"layout not stated and no tp x pp split matches num_gpus {case.parallel.gpus}, "
            f"the stated cells and {case.model.layers} layers (comet/validate/layout.py)")
        return None
    res, par, notes, taken = best
    dp = par.gpus // (par.tp * par.pp * par.cp)
    searched = f"{len(candidates)} layout{'s' if len(candidates) > 1 else ''} searched"
    chosen = f"layout tp={par.tp} pp={par.pp} dp={dp} (not stated: the fastest feasible of {searched}, " \
             "comet/validate/layout.py)"
    case.parallel = par
    case.assumptions.extend(notes + [chosen])
    case.chosen.extend(taken + [chosen])
    return res
