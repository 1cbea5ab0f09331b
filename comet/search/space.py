"""Search-space YAML -> a frozen `SearchSpace`.

A space names a study, a model, a base trace, a training job, a cluster spec with provisioning axes,
parallelism axes, objectives, constraints, a method, a budget and a seed (docs/search-space.md).
An axis is a scalar (one value), a list (grid values), `{choices: [...]}` (categorical) or
`{low, high, log, step}` (a range, sampled by random / Optuna methods only; Optuna's short form).
Every problem is a ConfigError naming the file and key: `x.yaml: parallel.tp[2] must be > 0, got -1`.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from comet.config.job import JobSpec
from comet.config.loader import from_dict, positive, read_yaml
from comet.config.moe import Dispatcher
from comet.config.parallel import OffloadTarget, Precision, Recompute, Schedule
from comet.errors import ConfigError


class Method(str, enum.Enum):
    GRID = "grid"
    RANDOM = "random"
    OPTUNA_TPE = "optuna-tpe"
    OPTUNA_NSGA2 = "optuna-nsga2"

    @property
    def uses_optuna(self) -> bool:
        return self in (Method.OPTUNA_TPE, Method.OPTUNA_NSGA2)


class Direction(str, enum.Enum):
    MIN = "min"
    MAX = "max"


class Metric(str, enum.Enum):
    STEP_TIME = "step_time"
    TIME_TO_TRAIN = "time_to_train"
    COST_PER_RUN = "cost_per_run"
    CAPEX = "capex"
    ENERGY = "energy"
    MFU = "mfu"
    GPUS = "gpus"
    TOKENS_PER_JOULE = "tokens_per_joule"   # perf per W: training tokens per joule of facility energy

    @property
    def column(self) -> str:
        """The results column holding this metric."""
        return METRIC_COLUMNS[self]

    @property
    def natural_direction(self) -> "Direction":
        """The direction a bare `- metric` entry means: more is better for efficiencies."""
        return Direction.MAX if self in (Metric.MFU, Metric.TOKENS_PER_JOULE) else Direction.MIN


METRIC_COLUMNS = {Metric.STEP_TIME: "step_time_s", Metric.TIME_TO_TRAIN: "time_to_train_days",
                  Metric.COST_PER_RUN: "cost_per_run_usd", Metric.CAPEX: "capex_usd",
                  Metric.ENERGY: "energy_MWh", Metric.MFU: "mfu", Metric.GPUS: "gpus",
                  Metric.TOKENS_PER_JOULE: "tokens_per_joule"}


@dataclass(frozen=True)
class Range:
    """A sampled numeric axis (Optuna's IntDistribution / FloatDistribution)."""
    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False


@dataclass(frozen=True)
class Axis:
    name: str                        # dotted key, e.g. "parallel.tp"
    values: tuple = ()               # grid / categorical values (canonical form)
    range: Range | None = None       # set for a sampled range; values is then empty

    @property
    def is_grid(self) -> bool:
        return self.range is None

    @property
    def short(self) -> str:
        return self.name.split(".", 1)[1]


@dataclass(frozen=True)
class Objective:
    metric: Metric
    direction: Direction = Direction.MIN

    @property
    def column(self) -> str:
        return self.metric.column


@dataclass(frozen=True)
class BaseTrace:
    """The study's base trace graph: built for a reference configuration, or imported from a file."""
    build: dict | None = None        # ParallelConfig keys of the reference configuration
    trace: str | None = None         # path to a Kineto / PyTorch ET / Chakra ET trace measured with `build`
    cluster: str | None = None       # cluster spec the trace was measured on (None: the study's)


@dataclass(frozen=True)
class Constraints:
    memory_fit: bool = True          # prune candidates that do not fit memory before any replay
    max_gpus: int | None = None
    max_capex_usd: float | None = None
    max_cost_per_run_usd: float | None = None
    max_time_to_train_days: float | None = None
    max_power_kW: float | None = None     # average IT power at the candidate's utilisation (comet/cost.py)


@dataclass(frozen=True)
class Budget:
    trials: int | None = field(default=None, metadata=positive())     # evaluated candidates (random/Optuna)
    wall_time_s: float | None = field(default=None, metadata=positive())


@dataclass(frozen=True)
class JobSection:
    global_batch: int = field(metadata=positive())        # sequences per step
    total_tokens: float = field(default=300e9, metadata=positive())


@dataclass(frozen=True)
class SearchSpace:
    study: str
    source: str                      # the YAML file
    model: str                       # zoo name or path
    cluster_spec: str                # path, resolved against the YAML file's folder if relative
    global_batch: int
    job: JobSpec
    base: BaseTrace
    provision: tuple[Axis, ...]      # cluster.* axes
    parallel: tuple[Axis, ...]       # parallel.* axes
    objectives: tuple[Objective, ...]
    constraints: Constraints = Constraints()
    method: Method = Method.GRID
    budget: Budget = Budget()
    seed: int = 0
    batch: int = 16                  # Optuna trials asked per round (fixed, so results do not depend on workers)
    timelines: int = 3               # Chrome-trace timelines written for the top candidates
    cost: dict = field(default_factory=dict)   # overrides of ClusterSpec.cost fields
    raw: dict = field(default_factory=dict)    # the parsed YAML, written back as study.yaml

    @property
    def axes(self) -> tuple[Axis, ...]:
        return self.provision + self.parallel


# ----------------------------------------------------------------------------- value checkers
# Each checker turns one YAML value into its canonical form or raises ConfigError(field=path).

def _num(kind: type, low: float | None = None, strict: bool = True) -> Callable[[Any, str], Any]:
    def check(v: Any, path: str) -> Any:
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or (kind is int and int(v) != v)):
            raise ConfigError(f"must be {'an integer' if kind is int else 'a number'}, got {v!r}", field=path)
        if low is not None and (v <= low if strict else v < low):
            raise ConfigError(f"must be {'>' if strict else '>='} {low:g}, got {v}", field=path)
        return kind(v)
    return check


def _enum(cls: type[enum.Enum]) -> Callable[[Any, str], Any]:
    def check(v: Any, path: str) -> Any:
        try:
            return cls(v).value
        except ValueError:
            raise ConfigError(f"must be one of {', '.join(m.value for m in cls)}, got {v!r}", field=path) from None
    return check


def _bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"must be true or false, got {v!r}", field=path)
    return v


def _optional_bool(v: Any, path: str) -> bool | None:
    return None if v is None or v == "auto" else _bool(v, path)


def _dp(v: Any, path: str) -> int | None:
    return None if v in (None, "derived") else _num(int, 0)(v, path)


def _zero(v: Any, path: str) -> int:
    v = _num(int, 0, strict=False)(v, path)
    if v > 3:
        raise ConfigError(f"must be 0, 1, 2 or 3, got {v}", field=path)
    return v


def _offload(v: Any, path: str) -> str:
    """Canonical offload value: "none" or targets joined by "+" (a string, so Optuna can sample it)."""
    items = [] if v in (None, "none", []) else (v.split("+") if isinstance(v, str) else v)
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"must be none, a target or a list of targets, got {v!r}", field=path)
    targets = [_enum(OffloadTarget)(t, path) for t in items]
    return "+".join(targets) if targets else "none"


PROVISION_AXES: dict[str, Callable] = {
    "gpus": _num(int, 0), "hbm_GB": _num(float, 0), "hbm_bandwidth_GBps": _num(float, 0),
    "expansion_GB": _num(float, 0, strict=False), "expansion_bandwidth_GBps": _num(float, 0),
    "scaleup_size": _num(int, 0), "scaleup_bandwidth_GBps": _num(float, 0),
    "scaleout_bandwidth_GBps": _num(float, 0), "oversubscription": _num(float, 1, strict=False),
    "compute_scale": _num(float, 0),
}
PARALLEL_AXES: dict[str, Callable] = {
    "tp": _num(int, 0), "pp": _num(int, 0), "dp": _dp, "cp": _num(int, 0), "vpp": _num(int, 0),
    "sequence_parallel": _optional_bool, "schedule": _enum(Schedule), "micro_batch": _num(int, 0),
    "recompute": _enum(Recompute), "zero": _zero, "precision": _enum(Precision), "offload": _offload,
    "overlap_grad_reduce": _bool, "overlap_param_gather": _bool, "overlap_tp_comm": _bool,
    "flash_attention": _bool,
    # uneven pipelines (comet/config/stages.py): embedding / loss counted as layers, or first / last stage layers
    "pp_embedding_as_layer": _bool, "pp_loss_as_layer": _bool,
    "pp_first_stage_layers": _dp, "pp_last_stage_layers": _dp,
    # mixture of experts (comet/config/moe.py)
    "ep": _num(int, 0), "etp": _num(int, 0), "moe_dispatcher": _enum(Dispatcher),
    "moe_capacity_factor": _num(float, 0), "moe_imbalance": _num(float, 1, strict=False), "moe_overlap_a2a": _bool,
}
_NUMERIC = {"gpus", "hbm_GB", "hbm_bandwidth_GBps", "expansion_GB", "expansion_bandwidth_GBps", "scaleup_size",
            "scaleup_bandwidth_GBps", "scaleout_bandwidth_GBps", "oversubscription", "compute_scale",
            "tp", "pp", "cp", "vpp", "micro_batch", "zero", "ep", "etp", "moe_capacity_factor", "moe_imbalance"}
_INTEGER = {"gpus", "scaleup_size", "tp", "pp", "cp", "vpp", "micro_batch", "zero", "ep", "etp"}
MAX_BATCH = 10_000       # Optuna trials asked per round
TOP_KEYS = ("study", "model", "base", "job", "cluster", "parallel", "objectives", "constraints", "method",
            "budget", "seed", "batch", "timelines")


def _parse_range(name: str, spec: dict, check: Callable, path: str) -> Range:
    unknown = [k for k in spec if k not in ("low", "high", "log", "step")]
    if unknown:
        raise ConfigError("unknown key (known keys: choices, high, log, low, step)", field=f"{path}.{unknown[0]}")
    if name not in _NUMERIC:
        raise ConfigError("a {low, high} range needs a numeric axis; give a list or {choices: [...]}", field=path)
    for k in ("low", "high"):
        if k not in spec:
            raise ConfigError("missing required key", field=f"{path}.{k}")
    low, high = check(spec["low"], f"{path}.low"), check(spec["high"], f"{path}.high")
    if low > high:
        raise ConfigError(f"low <= high must hold, but got low={low} and high={high}", field=path)
    log = _bool(spec.get("log", False), f"{path}.log")
    step = spec.get("step")
    if step is not None:
        step = _num(float, 0)(step, f"{path}.step")
        if log:
            raise ConfigError("step and log cannot be used together", field=path)
    return Range(low=low, high=high, log=log, step=step, integer=name in _INTEGER)


def parse_axis(section: str, name: str, value: Any, check: Callable, method: Method) -> Axis:
    path = f"{section}.{name}"
    if isinstance(value, dict):
        if "choices" in value:
            if len(value) > 1:
                raise ConfigError("choices cannot be combined with other keys", field=path)
            value = value["choices"]
            path = f"{path}.choices"
            if not isinstance(value, list):
                raise ConfigError(f"must be a list, got {value!r}", field=path)
        else:
            rng = _parse_range(name, value, check, path)
            if method is Method.GRID:
                raise ConfigError("a {low, high} range cannot be enumerated by method grid; give a list",
                                  field=section + "." + name)
            return Axis(section + "." + name, range=rng)
    if not isinstance(value, list):   # a scalar is one value
        values = (check(value, path),)
    else:
        if not value:
            raise ConfigError("must list at least one value", field=path)
        values = tuple(check(v, f"{path}[{i}]") for i, v in enumerate(value))
    deduped = tuple(dict.fromkeys(values))
    return Axis(section + "." + name, values=deduped)


def _parse_axes(section: str, data: Any, known: dict[str, Callable], method: Method,
                extra: tuple[str, ...] = ()) -> tuple[Axis, ...]:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"must be a mapping, got {data!r}", field=section)
    axes = []
    for name, value in data.items():
        if name in extra:
            continue
        if name not in known:
            names = ", ".join(sorted(list(known) + list(extra)))
            raise ConfigError(f"unknown key (known keys: {names})", field=f"{section}.{name}")
        axes.append(parse_axis(section, name, value, known[name], method))
    return tuple(axes)


def _parse_objectives(data: Any) -> tuple[Objective, ...]:
    if not isinstance(data, list) or not data:
        raise ConfigError(f"must be a non-empty list like [{{time_to_train: min}}], got {data!r}", field="objectives")
    out = []
    for i, item in enumerate(data):
        path = f"objectives[{i}]"
        if isinstance(item, str):   # a bare metric: its natural direction (tokens_per_joule, mfu: max)
            item = {item: Metric(_enum(Metric)(item, path)).natural_direction.value}
        if not isinstance(item, dict) or len(item) != 1:
            raise ConfigError(f"must be one `metric: min|max` pair, got {item!r}", field=path)
        (metric, direction), = item.items()
        metric = _enum(Metric)(metric, path)
        direction = _enum(Direction)(direction, f"{path}.{metric}")
        out.append(Objective(Metric(metric), Direction(direction)))
    if len({o.metric for o in out}) != len(out):
        raise ConfigError("lists a metric twice", field="objectives")
    return tuple(out)


def _parse_base(data: Any, source: str) -> BaseTrace:
    if data is None:
        return BaseTrace()
    if not isinstance(data, dict) or not data or any(k not in ("build", "trace", "cluster") for k in data):
        raise ConfigError(f"must be {{build: {{tp: .., pp: ..}}}}, optionally with trace: path and cluster: spec "
                          f"(the trace's configuration and cluster), got {data!r}", field="base")
    build = data.get("build") or {}
    if not isinstance(build, dict):
        raise ConfigError(f"must be a mapping of parallel keys, got {build!r}", field="base.build")
    for k, v in build.items():
        if k not in PARALLEL_AXES:
            raise ConfigError(f"unknown key (known keys: {', '.join(sorted(PARALLEL_AXES))})", field=f"base.build.{k}")
        PARALLEL_AXES[k](v, f"base.build.{k}")
    if "trace" not in data:
        if "cluster" in data:
            raise ConfigError("only a trace base has a cluster (the one the trace was measured on)",
                              field="base.cluster")
        return BaseTrace(build=dict(build))
    for key in ("trace", "cluster"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"must be a path, got {data[key]!r}", field=f"base.{key}")
    # without base.build the trace must be a recognisable LLM step (comet/trace/recognize.py)
    cluster = _resolve_path(data["cluster"], source) if "cluster" in data else None
    return BaseTrace(build=dict(build), trace=_resolve_path(data["trace"], source), cluster=cluster)


def parse_space(data: Any, source: str) -> SearchSpace:
    """Build a SearchSpace from a parsed YAML mapping; every error names `source` and the key."""
    try:
        return _parse_space(data, source)
    except ConfigError as exc:
        if exc.source is None:
            raise ConfigError(str(exc), source=source) from None
        raise


def _parse_space(data: Any, source: str) -> SearchSpace:
    if not isinstance(data, dict):
        raise ConfigError(f"the file must be a mapping of keys to values, got {type(data).__name__}")
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise ConfigError(f"unknown key (known keys: {', '.join(sorted(TOP_KEYS))})", field=str(unknown[0]))
    for key in ("study", "model", "job", "cluster", "objectives"):
        if key not in data:
            raise ConfigError("missing required key", field=key)
    study = data["study"]
    if not isinstance(study, str) or not study or any(c in study for c in "/\\ ") or study.startswith("."):
        raise ConfigError(f"must be a plain name (no spaces or slashes), got {study!r}", field="study")
    if not isinstance(data["model"], str):
        raise ConfigError(f"must be a zoo name or a path, got {data['model']!r}", field="model")
    method = Method(_enum(Method)(data.get("method", "grid"), "method"))
    job = from_dict(JobSection, data["job"], source=source, path="job")
    cluster = data["cluster"]
    if not isinstance(cluster, dict) or "spec" not in cluster:
        raise ConfigError("must be a mapping with `spec: path/to/cluster.yaml` and provisioning axes",
                          field="cluster")
    spec = cluster["spec"]
    if not isinstance(spec, str):
        raise ConfigError(f"must be a path, got {spec!r}", field="cluster.spec")
    cost = cluster.get("cost") or {}
    if not isinstance(cost, dict):
        raise ConfigError(f"must be a mapping of cost fields, got {cost!r}", field="cluster.cost")
    provision = _parse_axes("cluster", cluster, PROVISION_AXES, method, extra=("spec", "cost"))
    parallel = _parse_axes("parallel", data.get("parallel"), PARALLEL_AXES, method)
    seed = _num(int, -1)(data.get("seed", 0), "seed")
    if seed >= 2**32:   # numpy / Optuna samplers take a 32-bit seed
        raise ConfigError(f"must be < 2**32, got {seed}", field="seed")
    batch = _num(int, 0)(data.get("batch", 16), "batch")
    if batch > MAX_BATCH:   # every trial of a round is asked (and held) before any is evaluated
        raise ConfigError(f"must be <= {MAX_BATCH:,} trials per round, got {batch:,}", field="batch")
    timelines = _num(int, -1)(data.get("timelines", 3), "timelines")
    budget = from_dict(Budget, data.get("budget") or {}, source=source, path="budget")
    if method is not Method.GRID and budget.trials is None and budget.wall_time_s is None:
        raise ConfigError(f"method {method.value} needs budget.trials or budget.wall_time_s", field="budget")
    constraints = from_dict(Constraints, data.get("constraints") or {}, source=source, path="constraints")
    for name in ("max_gpus", "max_capex_usd", "max_cost_per_run_usd", "max_time_to_train_days", "max_power_kW"):
        value = getattr(constraints, name)
        if value is not None and value <= 0:
            raise ConfigError(f"must be > 0, got {value}", field=f"constraints.{name}")
    return SearchSpace(
        study=study, source=source, model=data["model"], cluster_spec=_resolve_path(spec, source),
        global_batch=job.global_batch, job=JobSpec(total_tokens=job.total_tokens),
        base=_parse_base(data.get("base"), source),
        provision=provision, parallel=parallel, objectives=_parse_objectives(data["objectives"]),
        constraints=constraints, method=method, budget=budget, seed=seed, batch=batch, timelines=timelines,
        cost=dict(cost), raw=data)


def _resolve_path(path: str, source: str) -> str:
    """A relative path is looked up next to the space file first, then from the working folder."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return str(p)
    beside = Path(os.path.normpath(Path(source).parent / p))
    return str(beside) if beside.exists() else str(p)


def load_space(path: str | Path) -> SearchSpace:
    return parse_space(read_yaml(path), str(path))


def grid_size(space: SearchSpace) -> int:
    """Candidates in the full grid before pruning (inf when an axis is a sampled range)."""
    if any(not a.is_grid for a in space.axes):
        return math.inf
    return math.prod(len(a.values) for a in space.axes)


__all__ = ["Axis", "BaseTrace", "Budget", "Constraints", "Direction", "Method", "Metric", "Objective", "Range",
           "SearchSpace", "grid_size", "load_space", "parse_space"]
