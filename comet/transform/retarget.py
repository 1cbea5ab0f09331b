"""Move a StepGraph from the configuration it stands for to another one in one pass: every block
carried over op by op (comet/transform/retime.py), the pipeline plan rebuilt, every stage's
once-per-step ops (gradient buckets, parameter gathers, tied-embedding sync, optimizer) rebuilt and
re-timed against the base stage of the same role. Each named transformation (with_tp, with_pp, ...)
changes one part of the configuration and calls `retarget`; `transform_to` calls it once with the
whole target configuration, so a candidate costs one pass whatever changed.
"""

from __future__ import annotations

from dataclasses import fields, replace
from functools import lru_cache

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.errors import ConfigError, GraphError
from comet.graph.ir import BucketSet, StageSync, StepGraph
from comet.transform.retime import Timing, carry_block, carry_op, graph_config, graph_timing
from comet.workload import builder

# The model fields a transformation may change: depth and every tensor dimension (each op of the
# target's blocks is matched to the base op of the same role and re-timed by the cost-model ratio of its
# new shape, Lumos-style). Any other difference (activation, embeddings tying, experts) is a different
# model.
_MUTABLE_MODEL = {"layers", "name", "source", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab"}


@lru_cache(maxsize=256)
def _template_blocks(model: ModelSpec, par: ParallelConfig) -> dict:
    # perf: a search transforms one base into many candidates; the base's template and repeated
    # candidates are built once. Cached graphs are only read, never handed out.
    return builder.build_blocks(model, par)


def check_same_model(base: ModelSpec, target: ModelSpec) -> None:
    for f in fields(ModelSpec):
        if f.name not in _MUTABLE_MODEL and getattr(base, f.name) != getattr(target, f.name):
            raise GraphError(f"cannot transform a graph of model {base.name} into model {target.name}: "
                             f"{f.name} differs ({getattr(base, f.name)!r} -> {getattr(target, f.name)!r}); "
                             "only the depth and the tensor dimensions can change")


def retarget(graph: StepGraph, model: ModelSpec, par: ParallelConfig, cluster: ClusterSpec | None = None,
             what: str = "transform_to") -> StepGraph:
    """`graph` moved to (model, par) (par resolved), re-timed for `cluster` (None: the graph's own)."""
    old_model, old_par = graph_config(graph)
    check_same_model(old_model, model)
    old_cluster, old_prec = graph_timing(graph, old_par)
    if cluster is not None and old_cluster is None and _has_durations(graph):
        raise GraphError("the base graph has durations but records no cluster (meta['cluster']) to re-time "
                         "them from; materialize() it or set meta['cluster']")
    timing = Timing(old_cluster, old_prec, cluster or old_cluster, par.precision.value)
    blocks = _carry_blocks(graph, old_model, old_par, model, par, timing)
    stages = _carry_stages(graph.stages, builder.build_stages(model, par), timing)
    meta = dict(graph.meta, model=model, parallel=par, label=par.label(), precision=par.precision.value,
                transforms=tuple(graph.meta.get("transforms", ())) + (what,))
    if timing.new_cluster is not None:
        meta["cluster"] = timing.new_cluster
    return StepGraph(blocks=blocks, plan=builder.build_plan(model, par), stages=stages, meta=meta)


def _has_durations(graph: StepGraph) -> bool:
    return any(op.duration_s is not None for g in graph.blocks.values() for _, op in g.nodes(data="op"))


def _carry_blocks(graph: StepGraph, old_model, old_par, model, par, timing: Timing) -> dict:
    old_tpl = _template_blocks(old_model, old_par)
    new_tpl = _template_blocks(model, par)
    missing = sorted(set(new_tpl) - set(graph.blocks))
    if missing:
        raise GraphError(f"StepGraph has no block(s) {', '.join(missing)}; a transformable graph has the blocks "
                         f"{', '.join(sorted(new_tpl))}")
    out = {}
    for key, tpl in new_tpl.items():
        # A recompute block runs the forward's kernels again: when the base has none (recompute was
        # off), its measured forward kernels are the counterparts.
        fallback = graph.blocks["layer.fwd"] if key == "layer.recompute" else None
        out[key] = carry_block(graph.blocks[key], old_tpl[key], tpl, timing, fallback)
    return out


# ------------------------------------------------------------------------------------ stage sync
def _role_stage(s: int, pp: int, base_pp: int) -> int:
    """The base stage playing the same role (first, middle, last) as target stage s."""
    if s == 0:
        return 0
    if s == pp - 1:
        return base_pp - 1
    return 1 if base_pp > 2 else 0


def _carry_stages(base: tuple[StageSync, ...], target: tuple[StageSync, ...], timing: Timing) -> tuple:
    if not base:
        raise GraphError("StepGraph has no stages (StageSync per pipeline stage)")
    memo: dict[int, StageSync] = {}
    out = []
    for s, st in enumerate(target):
        # perf: the builder shares one StageSync object among the middle stages; carry it once
        if id(st) not in memo:
            memo[id(st)] = _carry_sync(base[_role_stage(s, len(target), len(base))], st, timing)
        out.append(memo[id(st)])
    return tuple(out)


def _carry_buckets(src: tuple[BucketSet, ...], tpl: tuple[BucketSet, ...], timing: Timing) -> tuple:
    by_chunk = {b.chunk: b.op for b in src}
    first = src[0].op if src else None
    return tuple(replace(b, op=carry_op(by_chunk.get(b.chunk, first), b.op, timing)) for b in tpl)


def _carry_sync(src: StageSync, tpl: StageSync, timing: Timing) -> StageSync:
    opt = {op.name: op for op in src.optimizer}
    emb = None
    if tpl.embedding_sync is not None:
        emb = carry_op(src.embedding_sync, tpl.embedding_sync, timing)
    return replace(tpl, grad_buckets=_carry_buckets(src.grad_buckets, tpl.grad_buckets, timing),
                   param_gathers=_carry_buckets(src.param_gathers, tpl.param_gathers, timing),
                   embedding_sync=emb,
                   optimizer=tuple(carry_op(opt.get(op.name), op, timing) for op in tpl.optimizer))


def apply_changes(graph: StepGraph, what: str, model: ModelSpec | None = None, **changes) -> StepGraph:
    """retarget to the graph's own configuration with `changes` (ParallelConfig fields); the other
    degrees stay as they are and the GPU count follows (gpus = tp * pp * dp * cp)."""
    old_model, old_par = graph_config(graph)
    par = replace(old_par, gpus=None, **changes).resolve(model or old_model)
    return retarget(graph, model or old_model, par, what=what)


def enum_value(enum_cls, value, field: str):
    """`value` as a member of `enum_cls`, or a ConfigError naming the field and the allowed values."""
    try:
        return value if isinstance(value, enum_cls) else enum_cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum_cls)
        raise ConfigError(f"must be one of {allowed}, got {value!r}", field=field) from None
