"""Build the StepGraph of one training step for a (model, parallel configuration): the op-level
blocks, the pipeline plan and each stage's once-per-step ops (gradient buckets, parameter gathers,
tied-embedding sync, optimizer). Hardware-independent: the cluster model times it at replay."""

from __future__ import annotations

import math

from comet.config.model import ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Recompute
from comet.graph.ir import (COMPUTE_STREAM, DP_STREAM, OFFLOAD_STREAM, BucketSet, Collective, GroupKind, KernelClass,
                            Op, OpKind, Phase, PipelinePlan, StageSync, StepGraph)
from comet.workload import layers, moe
from comet.workload.block_builder import ACT_BYTES, group_geometry
from comet.workload.memory import stage_params

ADAM_STEP_BYTES = 34       # fused Adam per parameter: read grad, master, m, v (16 B), write master, m, v
                           # (12 B), write bf16 weight (2 B), grad-norm pass (4 B)
OFFLOADED_STATE_BYTES = 24  # master, m, v read and written across the expansion link (12 + 12 B)


def bucket_params(par: ParallelConfig) -> int:
    """Megatron-Core DDP bucket size: max(40M, 1M * dp) parameters (distributed.py)."""
    return max(40_000_000, 1_000_000 * par.dp * par.cp)


def build_blocks(model: ModelSpec, par: ParallelConfig) -> dict:
    extra = moe.moe_blocks(model, par) if model.moe is not None else {}
    return extra | {
        "layer.fwd": layers.layer_forward(model, par),
        "layer.bwd": layers.layer_backward(model, par),
        "layer.recompute": layers.layer_recompute(model, par),
        "embedding.fwd": layers.embedding_forward(model, par),
        "embedding.bwd": layers.embedding_backward(model, par),
        "head.fwd": layers.head_forward(model, par),
        "head.bwd": layers.head_backward(model, par),
    }


def build_plan(model: ModelSpec, par: ParallelConfig) -> PipelinePlan:
    chunk_layers = par.chunk_layers(model)   # even, or uneven first/last stages (comet.config.stages)
    # Each TP rank sends 1/tp of the boundary activation: sequence-parallel shards, or Megatron's
    # scatter/gather optimization without SP (Narayanan et al. SC21 sec. 4.1).
    tokens = par.micro_batch * (model.seq_len // par.cp) / par.tp
    recompute = max(chunk_layers) if par.recompute is not Recompute.NONE else 0
    # Megatron-Core's interleaved schedule with overlap_p2p_comm posts each send asynchronously and
    # waits for it only before the next transfer (schedules.py forward_backward_pipelining_with_
    # interleaving): in the steady state the transfer hides behind the next chunk's compute. The
    # pp - 1 warm-up sends and pp - 1 cool-down sends of a stage have no compute to hide behind, so
    # (pp - 1) of the stage's m * vpp sends per direction stay exposed.
    exposed = 1.0
    if par.overlap_p2p_comm and par.vpp > 1:
        exposed = min(1.0, (par.pp - 1) / (par.num_microbatches * par.vpp))
    return _frozen(PipelinePlan, {
        "pp": par.pp, "vpp": par.vpp, "num_microbatches": par.num_microbatches, "schedule": par.schedule._value_,
        "chunk_layers": chunk_layers, "p2p_bytes": float(tokens * model.hidden * ACT_BYTES),
        "p2p_group_stride": par.tp * par.cp * par.dp, "recompute_layers": recompute, "p2p_exposed": exposed,
        "chunk_layer_kinds": moe.chunk_layer_kinds(model, chunk_layers) if model.moe else ()})


# perf: enum members bound once (a member read through its class is ~0.09 us on Python 3.11)
_COLLECTIVE_OP, _COMPUTE_OP, _MEMCPY_OP = OpKind.COLLECTIVE, OpKind.COMPUTE, OpKind.MEMCPY
_DP, _EDP, _EMBEDDING = GroupKind.DP, GroupKind.EDP, GroupKind.EMBEDDING
_ALL_GATHER, _ALL_REDUCE, _REDUCE_SCATTER = Collective.ALL_GATHER, Collective.ALL_REDUCE, Collective.REDUCE_SCATTER
_BACKWARD, _FORWARD, _OPTIMIZER = Phase.BACKWARD, Phase.FORWARD, Phase.OPTIMIZER
_MEMORY_KERNEL, _OFFLOADED_OPTIMIZER = KernelClass.MEMORY, OffloadTarget.OPTIMIZER


_new_object, _set_attribute = object.__new__, object.__setattr__


def _frozen(cls: type, fields: dict):
    """cls(**fields) for a frozen dataclass of the step's structure (BucketSet, StageSync, PipelinePlan,
    StepGraph: plain dataclasses, no __post_init__) given every field by name, in field order: the same
    instance dict. perf (i22s-step): a frozen dataclass's __init__ stores each field through
    object.__setattr__ (~0.2 us a field); here the dict is set at once (PipelinePlan 1.36 -> 0.53 us,
    StageSync 1.67 -> 0.72 us in a loop). tests/workload/test_builder.py checks the objects built against
    the dataclasses' own __init__ (field dicts equal, in order)."""
    new = _new_object(cls)
    _set_attribute(new, "__dict__", fields)
    return new


def _resized(made: dict | None, name: str, size_field: str, value: float) -> Op | None:
    """The op named `name` that an earlier stage of this build made (`made`: name -> op), with its size
    field set to `value`; None where there is none. perf (i22s-step): within one build_stages, ops of
    one name differ only in their size (the bucket's bytes, the optimizer's state): a copy of the first
    one's field dict, one value replaced (the same dict, in the same order, as Op.unchecked builds),
    ~0.3 against ~1 us; tests/workload/test_builder.py checks every stage against its own build."""
    op = made.get(name) if made is not None else None
    if op is None:
        return None
    fields = op.__dict__.copy()
    fields[size_field] = value
    op = _new_object(Op)
    _set_attribute(op, "__dict__", fields)
    return op


def _made(made: dict | None, op: Op) -> Op:
    if made is not None:
        made[op.name] = op
    return op


def _dp_op(name: str, kind: Collective, nbytes: float, phase: Phase, group: GroupKind, size: int, stride: int,
           made: dict | None = None) -> Op:
    # perf (i20s-step): Op.unchecked (the field names are literals here; tests/workload/test_builder.py
    # checks the ops built), the group's geometry computed once per bucket set by the caller
    return _resized(made, name, "msg_bytes", nbytes) or _made(made, Op.unchecked(
        name, _COLLECTIVE_OP, stream=DP_STREAM, collective=kind, msg_bytes=nbytes, group=group._value_,
        group_kind=group, group_size=size, group_stride=stride, phase=phase))


def _bucket_sets(params: float, par: ParallelConfig, group: GroupKind, dp_size: int, what: str,
                 made: dict | None = None):
    """Gradient reduce (and ZeRO parameter gather) buckets of `params` per GPU over a data-parallel
    group of `dp_size` ranks (the DP group, or the expert-DP group for routed experts). `made`: the ops
    an earlier stage of this build made, by name (_resized), or None."""
    buckets, gathers = [], []
    zero = par.zero
    per_module = zero >= 3 or (par.shard_grad_op and group is _DP)
    if dp_size <= 1 or per_module or params <= 0:   # ZeRO-3 / SHARD_GRAD_OP: per layer inside the blocks
        return buckets, gathers
    kind = _REDUCE_SCATTER if zero >= 1 else _ALL_REDUCE
    vpp = par.vpp
    chunk_p = params / vpp
    n = max(1, math.ceil(chunk_p / bucket_params(par)))
    size, stride, _ = group_geometry(group, par)
    grad_name, grad_bytes, progressive = f"{what}.grad_{kind._value_}", chunk_p / n * par.grad_reduce_bytes, \
        par.overlap_grad_reduce
    for c in range(vpp):
        grad = _dp_op(f"{grad_name}[chunk {c}]", kind, grad_bytes, _BACKWARD, group, size, stride, made)
        buckets.append(_frozen(BucketSet, {"op": grad, "chunk": c, "count": n, "progressive": progressive}))
        if zero >= 1:
            gather = _dp_op(f"{what}.param_all_gather[chunk {c}]", _ALL_GATHER, chunk_p / n * ACT_BYTES, _FORWARD,
                            group, size, stride, made)
            gathers.append(_frozen(BucketSet, {"op": gather, "chunk": c, "count": n, "progressive": True}))
    return buckets, gathers


def _embedding_sync(model: ModelSpec, par: ParallelConfig) -> Op | None:
    """The tied-embedding gradient all-reduce between the first and the last stage, or None."""
    if par.pp <= 1 or not model.tied_embeddings:
        return None
    size, stride, _ = group_geometry(_EMBEDDING, par)
    return Op.unchecked("embedding.grad_all_reduce", _COLLECTIVE_OP, stream=DP_STREAM, collective=_ALL_REDUCE,
                        msg_bytes=model.padded_vocab(par.tp) * model.hidden / par.tp * par.grad_reduce_bytes,
                        group="embedding", group_kind=_EMBEDDING, group_size=size, group_stride=stride,
                        phase=_BACKWARD, comm_id="embedding.grad_all_reduce")


_UNSET = object()


def build_stage_sync(model: ModelSpec, par: ParallelConfig, stage: int, embedding_sync=_UNSET,
                     made: dict | None = None) -> StageSync:
    """`embedding_sync`: _embedding_sync(model, par), where the caller built it (perf (i22s-step): the
    first and the last stage share the one op object: built once, and timed once by the step's syncs);
    `made`: the ops earlier stages of this build made, by name (_resized), or None."""
    params = stage_params(model, par, stage)
    buckets, gathers = _bucket_sets(params, par, _DP, par.dp * par.cp, "dp", made)
    expert_params = moe.stage_expert_params(model, par, stage) if model.moe is not None else 0.0
    if expert_params:   # routed experts reduce over expert-DP (Megatron-Core expert_data_parallel_group)
        eb, eg = _bucket_sets(expert_params, par, _EDP, par.expert_dp, "edp", made)
        buckets += eb
        gathers += eg
    emb = None
    if stage in (0, par.pp - 1):
        emb = _embedding_sync(model, par) if embedding_sync is _UNSET else embedding_sync
    zero = par.zero
    opt_params = params / (par.dp * par.cp if zero >= 1 else 1)
    if expert_params:   # (adding 0.0 leaves a non-negative count as it is)
        opt_params += expert_params / (par.expert_dp if zero >= 1 else 1)
    adam_bytes = opt_params * ADAM_STEP_BYTES
    optimizer = [_resized(made, "optimizer.adam", "bytes", adam_bytes) or _made(made, Op.unchecked(
        "optimizer.adam", _COMPUTE_OP, stream=COMPUTE_STREAM, kernel=_MEMORY_KERNEL, bytes=adam_bytes,
        phase=_OPTIMIZER))]
    if _OFFLOADED_OPTIMIZER in par.offload:
        optimizer.append(Op.unchecked("optimizer.offload_stream", _MEMCPY_OP, stream=OFFLOAD_STREAM,
                                      bytes=opt_params * OFFLOADED_STATE_BYTES, phase=_OPTIMIZER))
    return _frozen(StageSync, {"grad_buckets": tuple(buckets), "param_gathers": tuple(gathers),
                               "gather_before_forward": par.overlap_param_gather, "embedding_sync": emb,
                               "optimizer": tuple(optimizer)})


def build_stages(model: ModelSpec, par: ParallelConfig) -> tuple[StageSync, ...]:
    """Middle stages are identical: build first, middle and last once and share them. A MoE model's
    stages differ when dense and expert layers fall unevenly on them: stages share a StageSync only when
    they hold the same layer kinds."""
    emb, made = _embedding_sync(model, par), {}
    if model.moe is not None:
        built: dict = {}
        out = []
        for s in range(par.pp):
            key = (tuple(model.is_moe_layer(i) for i in moe.stage_layer_indices(model, par, s)),
                   s == 0, s == par.pp - 1)
            if key not in built:
                built[key] = build_stage_sync(model, par, s, emb, made)
            out.append(built[key])
        return tuple(out)
    first = build_stage_sync(model, par, 0, emb, made)
    if par.pp == 1:
        return (first,)
    middle = build_stage_sync(model, par, 1, emb, made) if par.pp > 2 else None
    return (first,) + (middle,) * (par.pp - 2) + (build_stage_sync(model, par, par.pp - 1, emb, made),)


def build_step_graph(model: ModelSpec, par: ParallelConfig, blocks: dict | None = None,
                     stages: tuple | None = None) -> StepGraph:
    """`par` must be resolved (ParallelConfig.resolve). `blocks` / `stages`: build_blocks(model, par) /
    build_stages(model, par) already built (the replay's cache shares them between configurations that
    differ only outside them)."""
    return _frozen(StepGraph, {"blocks": blocks if blocks is not None else build_blocks(model, par),
                               "plan": build_plan(model, par),
                               "stages": stages if stages is not None else build_stages(model, par),
                               "meta": {"model": model, "parallel": par, "label": par.label(), "source": "built"}})
