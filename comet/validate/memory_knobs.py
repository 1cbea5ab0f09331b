"""A published run ran, so it fitted in its GPUs' memory.

Where a row leaves a memory-saving knob empty and its framework's default does not fit in HBM, the row
is predicted with the least memory-saving setting that fits, taken along one fixed ladder. The steps,
in order of what they cost the step time (a tuned run takes the free ones first):

  1. sequence_parallel false -> true (tp > 1): the layer norms and dropouts outside the tensor-parallel
     regions work on 1/tp of the sequence (Korthikanti et al., MLSys 2023, sec. 4.2.2); it replaces
     each all-reduce by a reduce-scatter + all-gather of the same volume, so it costs no time.
  2. zero 0 -> 1: the distributed optimizer (Megatron `--use-distributed-optimizer`) shards the Adam
     state over the data-parallel group; free when its reduce-scatter / all-gather overlap the step.
  3. grad_dtype fp32 -> bf16 (Megatron-Core `--grad-reduce-in-bf16`, NeMo `grad_reduce_in_fp32: false`;
     no schema column): the main-gradient buffer in BF16; it also halves the gradient traffic.
  4. fp8_params false -> true (FP8 rows on Transformer Engine: `fp8_model_init`, Megatron
     `--fp8-param-gather`): the GEMM weights exist only in FP8, the BF16 copy goes.
  5. recompute none -> selective: the attention core is re-run in the backward (Korthikanti et al.,
     MLSys 2023, sec. 5: a few percent more FLOPs); Megatron-LM of 2021 had only full recompute.
  6. recompute -> selective with Megatron-Core's recompute modules layernorm, mla_up_proj, moe_act
     (frameworks on Megatron-Core >= 0.12: `--recompute-modules`; comet/workload/recompute_modules.py):
     frees the separate norms' outputs, MLA's Q/K/V and the experts' activation output for a re-run
     of those memory-bound ops and MLA's up projections (a few percent of the layer's forward).
  7. optimizer_dtype fp32 -> bf16 (frameworks that can express it: NeMo `optim.dtype: bf16`; the schema
     has no column for it, so it is never stated): halves the Adam state.
  8. recompute -> full: every layer's forward re-run before its backward (about a third more compute).

Each step applies on top of the previous ones, only to a knob whose cell the row left empty and that
its framework can express (explicit cells always win), and only where it lowers the peak (selective
recompute saves nothing under flash attention, which keeps no attention scores). The first
configuration that fits is used and every step taken is reported as an assumption with the memory
that made it necessary, e.g. "recompute=full (not stated; none does not fit: needs 91.2 GB per GPU)".
If none fits, the row stays infeasible with the reason of the most memory-saving configuration tried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Precision, Recompute, RecomputeModule
from comet.errors import ConfigError
from comet.evaluate import resolve
from comet.validate.frameworks import FrameworkDefaults
from comet.workload import recompute_modules
from comet.workload.memory import MemoryEstimate, estimate_memory


@dataclass(frozen=True)
class Step:
    column: str                      # the row's cell that states this knob ("" where the schema has none)
    knob: str                        # the ParallelConfig field
    value: object                    # the setting this step takes
    applies: Callable[[ParallelConfig, FrameworkDefaults], bool]   # saves memory here, and expressible
    also: tuple[tuple[str, object], ...] = ()   # further fields the step sets with it

    def text(self, par: ParallelConfig) -> str:
        return _show(getattr(par, self.knob))

    def take(self, par: ParallelConfig) -> ParallelConfig:
        return replace(par, **{self.knob: self.value, **dict(self.also)})


def _show(v) -> str:
    if isinstance(v, tuple):
        return "+".join(_show(x) for x in v) or "none"
    v = getattr(v, "value", v)
    return str(v).lower() if isinstance(v, bool) else str(v)


_ORDER = list(Recompute)
LADDER = (
    Step("sequence_parallel", "sequence_parallel", True, lambda p, d: p.tp > 1 and p.sequence_parallel is False),
    Step("zero", "zero", 1, lambda p, d: p.zero < 1),
    Step("", "grad_dtype", "bf16", lambda p, d: d.bf16_grad_reduce and p.grad_dtype == "fp32"),
    Step("fp8_params", "fp8_params", True,
         lambda p, d: p.precision is Precision.FP8 and p.fp8_impl == "te" and not p.fp8_params),
    Step("recompute", "recompute", Recompute.SELECTIVE,
         lambda p, d: d.selective_recompute and _ORDER.index(p.recompute) < _ORDER.index(Recompute.SELECTIVE)),
    Step("recompute", "recompute_modules", tuple(RecomputeModule),
         lambda p, d: d.recompute_modules and recompute_modules.can_add(p), also=(("recompute", Recompute.SELECTIVE),)),
    Step("", "optimizer_dtype", "bf16", lambda p, d: d.bf16_optimizer_state and p.optimizer_dtype == "fp32"),
    Step("recompute", "recompute", Recompute.FULL, lambda p, d: p.recompute is not Recompute.FULL),
)


def memory_of(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> MemoryEstimate | None:
    """The memory estimate of a configuration, or None where it breaks a layout rule (the prediction
    reports that rule)."""
    try:
        return estimate_memory(model, resolve(model, cluster, par), cluster)
    except ConfigError:
        return None


def fit_unstated_knobs(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, row: dict,
                       defaults: FrameworkDefaults) -> tuple[ParallelConfig, list[str], list[str]]:
    """(configuration, assumptions, columns whose default assumption the steps replace). The row's own
    configuration when it fits, breaks a layout rule, or no step applies; the most memory-saving one
    tried when none fits (its prediction then says how much it needs)."""
    mem = memory_of(model, cluster, par)
    taken: list[str] = []
    replaced: list[str] = []
    trial = par
    for step in LADDER:
        if mem is None or mem.fits:
            break
        if (step.column and row.get(step.column, "").strip()) or not step.applies(trial, defaults):
            continue
        nxt = step.take(trial)
        after = memory_of(model, cluster, nxt)
        if after is None or after.total_GB >= mem.total_GB:
            continue
        taken.append(f"{step.knob}={step.text(nxt)} (not stated; {step.text(trial)} does not fit: needs "
                     f"{mem.total_GB:.1f} GB per GPU)")
        replaced.append(step.column or step.knob)
        trial, mem = nxt, after
    return trial, taken, replaced


def with_steps(assumptions: list[str], taken: list[str], replaced: list[str]) -> list[str]:
    """The row's assumptions with the default notes of the knobs the ladder changed replaced by its steps."""
    return [a for a in assumptions if not a.startswith(tuple(f"{col}=" for col in replaced))] + taken
