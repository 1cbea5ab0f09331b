"""The Python API: `comet.estimate(...)` and `comet.search(...)` (docs/api.md).

Both run the code paths the CLI runs (`comet estimate`, `comet search`) and return plain objects:
`estimate` the same `Result` the CLI prints (`.to_dict()`, `.to_frame()`), `search` a `SearchResults`
with the candidates and the Pareto front as pandas DataFrames. Bad input raises `ConfigError` (one
message naming the field and the rule); an infeasible configuration is a Result with a reason.

Importing this module stays light: Ray, Optuna, matplotlib and pandas load only when a search runs.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comet.config.cluster import ClusterSpec, load_cluster
from comet.config.job import JobSpec
from comet.config.loader import from_dict
from comet.config.model import ModelSpec, load_model
from comet.config.parallel import ParallelConfig, Schedule
from comet.errors import ConfigError
from comet.result import Result

if TYPE_CHECKING:   # pandas is imported by the functions that build frames
    import pandas as pd

DEFAULT_CLUSTER = "h100_dgx"
PARALLEL_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelConfig))
_PARALLEL_FIELD_SET = frozenset(PARALLEL_FIELDS)
# keys of an estimate request besides the ParallelConfig fields (also the keys of `estimate --config`)
REQUEST_FIELDS = ("model", "cluster", "total_tokens")
_PLAIN_TYPES = frozenset({int, float, str, bool})   # values parallel_config passes on unchanged (no .value)


def parallel_config(params: dict, source: str = "comet.estimate()") -> ParallelConfig:
    """A ParallelConfig from plain values (strings for enums, lists for offload), every value checked
    by the project's strict loader; `vpp > 1` implies the interleaved schedule unless one is given."""
    params = _plain_values(params)
    vpp = params.get("vpp", 1)
    # a vpp that is not a number is the loader's to reject (it names the field), not a TypeError here
    if isinstance(vpp, (int, float)) and vpp > 1 and "schedule" not in params:
        params["schedule"] = Schedule.INTERLEAVED.value
    if isinstance(params.get("offload"), (str, bytes)):
        params["offload"] = [params["offload"]]
    return from_dict(ParallelConfig, params, source=source)


def _plain_values(params: dict) -> dict:
    """A copy of `params` without the None values, an enum member (anything with a .value) as its value."""
    if _PLAIN_TYPES.issuperset(map(type, params.values())):
        # perf (i22g-glue): ints, floats, strs and bools (none has a .value) copied in C: ~1 us of the
        # per-item comprehension below (tests/api/test_api.py checks both give the same dict)
        return dict(params)
    return {k: (v.value if hasattr(v, "value") else v) for k, v in params.items() if v is not None}


@functools.cache
def _engine() -> tuple:
    """comet.evaluate's _prepared and evaluate_prepared, imported on the first estimate (the engine loads
    numba); perf: an import statement in the function cost ~1 us a call."""
    from comet.evaluate import _prepared, evaluate_prepared
    return _prepared, evaluate_prepared


def _model(model: str | Path | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(str(model))


def _cluster(cluster: str | Path | ClusterSpec) -> ClusterSpec:
    return cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)


def estimate(model: str | Path | ModelSpec, cluster: str | Path | ClusterSpec = DEFAULT_CLUSTER, *,
             global_batch: int, total_tokens: float | None = None, timeline: bool | str = False,
             **parallel: Any) -> Result:
    """Estimate one configuration, e.g.

        comet.estimate("gpt3_175b", gpus=1024, tp=8, pp=8, global_batch=1536, recompute="selective")

    `parallel` takes the ParallelConfig fields (gpus, tp, pp, dp, cp, vpp, schedule, micro_batch,
    recompute, zero, precision, sequence_parallel, overlap_*, flash_attention, offload). `timeline`:
    True puts task-level Chrome-trace events in `result.timeline`, "ops" every op too. A broken rule
    (tp not dividing the heads, ...) raises ConfigError; a configuration that does not fit memory
    returns a Result with status infeasible, its reason and, in `extra["remedies"]`, the nearest
    changes that make it fit.
    """
    prepare, evaluate_prepared = _engine()
    if not _PARALLEL_FIELD_SET.issuperset(parallel):   # perf: one C call when every name is known (~1 us)
        unknown = sorted(parallel.keys() - _PARALLEL_FIELD_SET)
        raise ConfigError(f"unknown argument (known: {', '.join(REQUEST_FIELDS + PARALLEL_FIELDS)})",
                          field=unknown[0])
    m, c = _model(model), _cluster(cluster)
    # resolve (a broken rule raises ConfigError) and the memory estimate, once: perf (i22g-glue), evaluate()
    # resolved the configuration a second time (a look-up and the cluster's rules, ~5 us of a cold call)
    prepared = prepare(m, c, parallel_config({**parallel, "global_batch": global_batch}))
    job = JobSpec(total_tokens=total_tokens) if total_tokens else None
    res = evaluate_prepared(m, c, prepared, job, timeline=timeline)
    par = prepared[0]
    if not res.feasible:
        from comet.remedy import nearest_feasible
        res.extra["remedies"] = nearest_feasible(m, c, par, job)
    return res


@dataclass
class SearchResults:
    """What `comet.search` returns: every candidate and the Pareto front as DataFrames, and where the
    study's files are."""
    candidates: "pd.DataFrame"     # one row per evaluated candidate (same as candidates.parquet)
    pareto: "pd.DataFrame"         # the feasible, non-dominated rows (same as pareto.csv)
    out_dir: Path
    outcome: Any                   # the driver's StudyOutcome (pruning statistics, files written, timings)

    def __repr__(self) -> str:
        return (f"SearchResults({len(self.candidates)} candidates, {len(self.pareto)} on the Pareto front, "
                f"out_dir={str(self.out_dir)!r})")


def search(space: str | Path | dict, *, out: str | Path | None = None, executor: str = "ray",
           workers: int | None = None, address: str | None = None, trials: int | None = None,
           seed: int | None = None, timelines: bool = True) -> SearchResults:
    """Run a study from a search-space YAML path or the same mapping as a dict (docs/search-space.md).

    executor "ray" (a private local Ray, or the cluster at `address`) or "serial" (this process).
    Re-running with the same `out` resumes, as the CLI does.
    """
    from comet.search.driver import RunOptions, run_study
    from comet.search.space import load_space, parse_space

    if executor not in ("ray", "serial"):
        raise ConfigError(f"must be ray or serial, got {executor!r}", field="executor")
    loaded = parse_space(space, "<comet.search() mapping>") if isinstance(space, dict) else load_space(space)
    opts = RunOptions(out=Path(out) if out else None, executor=executor, workers=workers, address=address,
                      trials=trials, seed=seed, timelines=timelines)
    outcome = run_study(loaded, opts)
    return SearchResults(candidates=outcome.frame, pareto=outcome.front, out_dir=outcome.out_dir, outcome=outcome)


__all__ = ["DEFAULT_CLUSTER", "SearchResults", "estimate", "parallel_config", "search"]
