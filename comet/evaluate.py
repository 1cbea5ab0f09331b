"""evaluate(): one candidate (model x cluster x parallel configuration) to a Result. Pure: no Ray, no
I/O, no rich; picklable inputs and output. Infeasible configurations come back as results with a
reason, never as exceptions."""

from __future__ import annotations

from comet.config.cluster import ClusterSpec
from comet.config.cluster_checks import check_job_fits_domains
from comet.config.job import JobSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.errors import CometError, ConfigError
from comet.graph.ir import StepGraph
from comet.replay import cache
from comet.replay.step import StepReplay, replay_step
from comet.result import CandidateStatus, Result
from comet.workload.builder import build_blocks, build_stages, build_step_graph
from comet.workload.flops import model_flops_per_token, recompute_flops_per_token, step_flops
from comet.workload.memory import MemoryEstimate, estimate_memory, memory_microbatches


def resolve(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig) -> ParallelConfig:
    """Derive dp / SP and check every rule, including what the hardware can run."""
    # perf: ParallelConfig.resolve (derived fields and every rule, ~35 us) depends on the model and the
    # configuration alone; a search resolves each configuration once per cluster. A rule it breaks is
    # raised again on every call (errors are not stored).
    par = cache.resolved.get_or((model, parallel), lambda: _resolved(model, parallel))
    _check_on_cluster(cluster, par)
    return par


def _check_on_cluster(cluster: ClusterSpec, par: ParallelConfig) -> None:
    """The rules that read the cluster: the job's GPUs fill its domains, the GPU runs the precision."""
    check_job_fits_domains(cluster, par.gpus)
    if par.precision._value_ not in cluster.gpu.peak_tflops:   # perf: _value_, not the .value property
        raise ConfigError(f"{cluster.gpu.name} has no {par.precision.value} tensor cores "
                          f"(peaks given: {', '.join(cluster.gpu.peak_tflops)})", field="precision")


def _resolved(model: ModelSpec, parallel: ParallelConfig) -> ParallelConfig:
    # perf (i18g-glue): three rules read the global batch (ParallelConfig.check_batch); the derived fields
    # and every other rule are the same for each global batch of a configuration, so they are resolved
    # once per batch-free configuration and a new global batch checks its three rules (~35 -> ~8 us).
    # A configuration not seen with any batch is resolved whole (the first broken rule raised in check's
    # order), and its batch-free part kept.
    key = (model, "batch free", parallel.batch_free_fields())
    shape = cache.resolved.get(key)
    if shape is None:
        par = parallel.resolve(model)
        cache.resolved.add(key, par.batch_free())
    else:
        par = shape.with_global_batch(parallel.global_batch)
        par.check_batch()
    # perf: resolving a resolved configuration returns it unchanged (every field derived, the same rules
    # pass): comet.estimate resolves, then evaluate() looks the result up
    cache.resolved.put((model, par), par)
    return par


def precheck(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig) -> tuple[bool, str]:
    """Cheap pruning before any replay: divisibility rules, then memory fit."""
    try:
        mem = _prepared(model, cluster, parallel)[1]
    except ConfigError as exc:
        return False, str(exc)
    return mem.fits, mem.reason


class _Prepared(list):
    """[resolved configuration, memory estimate, FLOPs per token | None] of one (model, configuration as
    given, memory side of the cluster); the FLOPs filled when first needed (a feasible candidate)."""
    __slots__ = ()


def _prepared(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig) -> _Prepared:
    """resolve + the memory estimate, with room for the FLOPs per token: the values their own caches hold
    (the same objects), in one entry. perf (i20g-glue): a search meets a configuration on several
    networks (scale-out bandwidth, ...), which none of these read: one look-up where there were three
    (resolve, memory, FLOPs per token). The cluster's own rules are checked on every call, as resolve
    does; a broken rule raises and stores nothing. (The graph is left to cache.graphs: held here too, a
    study could keep up to this cache's size in graphs and their blocks.)"""
    key = (model, parallel, cache.memory_key(cluster))
    entry = cache.candidates.get(key)
    if entry is None:
        par = resolve(model, cluster, parallel)
        entry = _Prepared((par, _memory(model, par, cluster), None))
        cache.candidates.add(key, entry)
    else:
        _check_on_cluster(cluster, entry[0])
    return entry


def _memory(model: ModelSpec, par: ParallelConfig, cluster: ClusterSpec) -> MemoryEstimate:
    # perf: a search's pruning pass estimates a candidate's memory before evaluate() does (read-only).
    # i18g-glue: keyed by what the estimate reads, the batch-free configuration and the micro-batch count
    # as it reads it (pipeline in-flight counts saturate at the pipeline depth), so a configuration's
    # global batches share one estimate (tests/workload/test_memory_key.py)
    key = (model, par.batch_free(), memory_microbatches(par), cache.memory_key(cluster))
    return cache.memory.get_or(key, lambda: estimate_memory(model, par, cluster))


def _memory_fields(mem: MemoryEstimate) -> dict:
    return {"memory_gb_per_gpu": mem.total_GB, "memory": mem.as_dict()}


def evaluate(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig, job: JobSpec | None = None, *,
             timeline: bool | str = False, base: StepGraph | None = None) -> Result:
    """timeline: True for task-level Chrome-trace events in result.timeline, "ops" for every op too."""
    try:
        prepared = _prepared(model, cluster, parallel)
    except ConfigError as exc:
        return Result(CandidateStatus.INFEASIBLE, reason=str(exc), label=parallel.label(), gpus=parallel.gpus or 0)
    return evaluate_prepared(model, cluster, prepared, job, timeline=timeline, base=base)


def evaluate_prepared(model: ModelSpec, cluster: ClusterSpec, prepared: _Prepared, job: JobSpec | None = None, *,
                      timeline: bool | str = False, base: StepGraph | None = None) -> Result:
    """evaluate() of a configuration already resolved on this cluster: `prepared` is what
    _prepared(model, cluster, parallel) returned (comet.estimate resolves first, to raise a broken rule)."""
    par, mem = prepared[0], prepared[1]
    if not mem.fits:
        return Result(CandidateStatus.INFEASIBLE, reason=mem.reason, label=par.label(), gpus=par.gpus,
                      **_memory_fields(mem))
    try:
        graph = _graph_for(model, cluster, par, base)
        rep = replay_step(graph, cluster, par.precision._value_, keep_block_replays=bool(timeline))
    except CometError as exc:
        return Result(CandidateStatus.INFEASIBLE, reason=str(exc), label=par.label(), gpus=par.gpus)
    return _result(model, cluster, par, job, mem, rep, timeline, prepared)


def _graph_for(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, base: StepGraph | None) -> StepGraph:
    # perf: a search evaluates one configuration on many clusters; its graph is built once (graphs are
    # read-only from here on). A base graph re-timed to the cluster is keyed by the cluster too.
    if not cache.enabled:
        return build_step_graph(model, par) if base is None else _transformed(base, model, par, cluster)
    if base is None or cache.facts.get_or(("plain build", cache.object_key(base), model),
                                                       lambda: _plain_build(base, model)):
        return cache.graphs.get_or((None, model, par, None), lambda: _built(model, par))
    key = (cache.object_key(base), model, par, cache.cluster_key(cluster))
    return cache.graphs.get_or(key, lambda: _transformed(base, model, par, cluster))


def _transformed(base: StepGraph, model: ModelSpec, par: ParallelConfig, cluster: ClusterSpec) -> StepGraph:
    from comet.transform import transform_to   # the trace-driven path: rescale the base graph
    return transform_to(base, model, par, cluster=cluster)


def _plain_build(base: StepGraph, model: ModelSpec) -> bool:
    """A base the builder made and nothing timed (no durations, no calibration) holds no information a
    fresh build lacks: transforming it gives the builder's graph of the target (tests/replay/test_cache.py
    checks the results are equal), so the candidate is built directly and its blocks shared."""
    meta = base.meta or {}
    return (meta.get("source") == "built" and meta.get("model") == model and not meta.get("transforms") and "calibration" not in meta
            and meta.get("cluster") is None
            and all(op.duration_s is None for g in base.blocks.values() for _, op in g.nodes(data="op"))
            and all(op.duration_s is None for st in base.stages for op in _stage_ops(st)))


def _stage_ops(st):
    yield from (bs.op for bs in st.grad_buckets + st.param_gathers)
    yield from st.optimizer
    if st.embedding_sync is not None:
        yield st.embedding_sync


def _built(model: ModelSpec, par: ParallelConfig) -> StepGraph:
    blocks = cache.blocks.get_or((model, cache.block_config(par)), lambda: build_blocks(model, par))
    # perf: stage syncs do not read the global batch: configurations that differ only there share them,
    # and with them what the replay caches by their identity (parameter gathers, NIC loads)
    stages = cache.facts.get_or(("stages", model, cache.stage_config(par)), lambda: build_stages(model, par))
    return build_step_graph(model, par, blocks=blocks, stages=stages)


def _result(model, cluster, par, job, mem, rep: StepReplay, timeline: bool, prepared: _Prepared) -> Result:
    step = rep.step_time_s
    tokens = par.global_batch * model.seq_len
    peak = cluster.gpu.peak_flops("bf16" if "bf16" in cluster.gpu.peak_tflops else "fp16")
    # perf: a configuration's FLOPs per token are the model's and the configuration's alone, the same for
    # every global batch (i18g-glue: keyed without it; a step's FLOPs are its tokens times those)
    per_token = prepared[2]
    if per_token is None:
        per_token = prepared[2] = cache.facts.get_or(("flops per token", model, par.batch_free()), lambda: (
            model_flops_per_token(model), recompute_flops_per_token(model, par)))
    model_flops, hw_flops = step_flops(par.global_batch, model.seq_len, *per_token)
    model_tflops = model_flops / step / par.gpus / 1e12
    hw_tflops = hw_flops / step / par.gpus / 1e12
    res = Result(CandidateStatus.OK, label=par.label(), step_time_s=step, tokens_per_s=tokens / step,
                 tflops_per_gpu=model_tflops, mfu=model_tflops * 1e12 / peak, hw_tflops_per_gpu=hw_tflops,
                 memory_gb_per_gpu=mem.total_GB, memory=mem.as_dict(), breakdown=rep.breakdown, gpus=par.gpus,
                 extra={"critical_stage": rep.critical_stage})
    if mem.tight:   # over the nominal HBM, inside the fit margin (comet.workload.memory.FIT_MARGIN)
        res.extra["memory_tight"] = True
    if job is not None:
        res.extra["time_to_train_s"] = job.total_tokens / res.tokens_per_s
    if timeline:
        from comet.replay.timeline import step_timeline
        res.timeline = step_timeline(rep, ops=timeline == "ops")
    return res
