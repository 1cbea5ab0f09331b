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
- dp = num_gpus / (tp * pp * cp) must divide the global batch into whole micro-batches;
- vpp (the interleaving depth), where the row leaves it empty, pp > 1 and the framework runs the
  interleaved schedule (FrameworkDefaults.interleave; comet/validate/frameworks.py says which cannot):
  every depth from 1 up to the layers of a stage that the framework accepts. Megatron splits each
  stage's layers evenly over its vpp chunks (megatron/training/arguments.py: "number of layers per
  pipeline stage must be divisible by number of layers per virtual pipeline stage"; embedding and loss
  count as layers where the split does so), and its interleaved schedule needs the micro-batch count to
  be a multiple of pp (megatron/core/pipeline_parallel/schedules.py,
  forward_backward_pipelining_with_interleaving: "number of microbatches is not divisible by
  pipeline-model-parallel-size when using interleaved schedule"; ParallelConfig.check). The Llama 3
  stack takes chunks of unequal size (Llama 3 paper sec. 3.3.2). A deeper interleave shrinks the
  pipeline bubble by 1/vpp (Narayanan et al. SC21 sec. 2.2.2) and costs vpp times the p2p transfers;
  the engine weighs both. A tuned run uses the depth its framework makes fastest.

Each candidate takes the row's other cells, the unstated memory knobs are fitted as for any row
(comet/validate/memory_knobs.py), and those that fit are evaluated. The fastest step wins; ties go to
the first in (tp, pp, vpp) ascending order, so the choice is deterministic. The search is bounded by
the divisor counts and at most MAX_LAYOUTS candidates (2 to 182 for the rows of measurements.csv; a
lower cap in this order would drop whole tp values). The chosen layout is reported as an assumption
with how many layouts were searched ("vpp=4 (not stated: the fastest feasible of 5, ...)" where only
the depth was open); it is chosen once per row, with the cluster spec's parameters at that time (a
`--fit` keeps it while it varies them).
"""

from __future__ import annotations

from comet.config.cluster import ClusterSpec
from comet.config.parallel import ParallelConfig
from comet.errors import ConfigError
from comet.evaluate import evaluate
from comet.result import Result
from comet.validate.memory_knobs import fit_unstated_knobs, memory_of, with_steps
from comet.validate.rows import Case, Cells, RowError, layout_config

MAX_LAYOUTS = 256    # evaluations per row at most (candidates in (tp, pp, vpp) order beyond it are dropped);
                     # 182 for the widest open row of measurements.csv (96 GPUs, 96 layers)


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


def _chunks_accepted(case: Case, par: ParallelConfig) -> bool:
    """The framework runs this interleaving: the engine's rules hold (micro-batches a multiple of pp, no
    empty chunk) and, unless it takes unequal chunks, each stage's chunks hold equal layer counts (the
    embedding / loss counted where the split counts them)."""
    try:
        chunks = list(par.resolve(case.model).chunk_layers(case.model))
    except ConfigError:
        return False
    if case.defaults.uneven_chunks:
        return True
    if not case.defaults.uneven_pipeline and case.model.layers % (par.pp * par.vpp):
        return False    # Megatron-LM before Megatron-Core: layers divisible by pp * vpp, no embedding-as-layer
    chunks[0] += int(par.pp_embedding_as_layer)
    chunks[-1] += int(par.pp_loss_as_layer)
    return all(len({chunks[v * par.pp + s] for v in range(par.vpp)}) == 1 for s in range(par.pp))


def candidate_configs(case: Case, scale_up: int) -> list[tuple[ParallelConfig, list[str]]]:
    """(configuration, the assumptions its cells add) for each (tp, pp, vpp) the row and its framework
    allow, in ascending order, at most MAX_LAYOUTS."""
    out = []
    for tp, pp in candidate_layouts(case, scale_up):
        depths = range(1, -(-case.model.layers // pp) + 1) if case.open_vpp and pp > 1 else (None,)
        for vpp in depths:
            try:
                par, notes = layout_config(case, tp, pp, vpp)
            except RowError:
                continue
            if vpp is None or vpp == 1 or _chunks_accepted(case, par):
                out.append((par, notes))
            if len(out) == MAX_LAYOUTS:
                return out
    return out


def _chosen_note(case: Case, par: ParallelConfig, searched: int) -> str:
    if case.open_layout is not None and None not in case.open_layout:    # only the depth was open
        return f"vpp={par.vpp} (not stated: the fastest feasible of {searched}, comet/validate/layout.py)"
    dp = par.gpus // (par.tp * par.pp * par.cp)
    depth = f" vpp={par.vpp}" if case.open_vpp else ""
    plural = "s" if searched > 1 else ""
    return (f"layout tp={par.tp} pp={par.pp} dp={dp}{depth} (not stated: the fastest feasible of {searched} "
            f"layout{plural} searched, comet/validate/layout.py)")


def choose_layout(case: Case, cluster: ClusterSpec) -> Result | None:
    """Search the row's open layout; on success the case's configuration and assumptions become the
    fastest feasible layout's and its result is returned. None when no layout is feasible (the case then
    keeps its stand-in configuration and the reason says what was searched)."""
    best: tuple[Result, object, list[str], list[str]] | None = None
    candidates = candidate_configs(case, cluster.gpus_per_node)
    for par, notes in candidates:
        par, taken, replaced = fit_unstated_knobs(case.model, cluster, par, case.row, case.defaults)
        mem = memory_of(case.model, cluster, par)
        if mem is None or not mem.fits:
            continue
        res = evaluate(case.model, cluster, par)
        if res.feasible and (best is None or res.step_time_s < best[0].step_time_s):
            best = (res, par, with_steps(notes, taken, replaced), taken)
    if best is None:
        case.open_layout = None
        case.assumptions.append(
            f"layout not stated; none of {len(candidates)} layouts searched fits (comet/validate/layout.py)"
            if candidates else f"layout not stated and no tp x pp split matches num_gpus {case.parallel.gpus}, "
            f"the stated cells and {case.model.layers} layers (comet/validate/layout.py)")
        return None
    res, par, notes, taken = best
    chosen = _chosen_note(case, par, len(candidates))
    case.open_layout = None
    case.parallel = par
    case.assumptions[:] = [a for a in case.assumptions if a not in case.layout_notes] + notes + [chosen]
    case.chosen.extend(taken + [chosen])
    return res
