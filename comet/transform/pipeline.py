"""Pipeline transformations: pipeline degree and schedule (with virtual stages), micro-batch size and
count, and the number of layers. Layers are re-partitioned into pp * vpp model chunks (a new
PipelinePlan), and every stage's once-per-step ops are rebuilt for the parameters it now holds and
re-timed against the base stage of the same role (first, middle, last). Blocks do not depend on pp or
the layer count, so their ops keep their durations; a micro-batch size change re-times every kernel by
the ratio of costs at the new and old token counts."""

from __future__ import annotations

from dataclasses import replace

from comet.config.parallel import Schedule
from comet.graph.ir import StepGraph
from comet.errors import ConfigError
from comet.transform.retarget import apply_changes, enum_value
from comet.transform.retime import graph_config


def with_pp(graph: StepGraph, pp: int, schedule: str | Schedule | None = None, vpp: int | None = None) -> StepGraph:
    """Pipeline degree `pp` (schedule and virtual stages kept unless given)."""
    _, par = graph_config(graph)
    sched = enum_value(Schedule, schedule, "schedule") if schedule is not None else par.schedule
    return apply_changes(graph, f"pp={pp}", pp=pp, schedule=sched, vpp=vpp if vpp is not None else par.vpp)


def with_schedule(graph: StepGraph, schedule: str | Schedule, vpp: int = 1) -> StepGraph:
    """Pipeline schedule (gpipe, 1f1b, interleaved_1f1b with `vpp` model chunks per stage)."""
    sched = enum_value(Schedule, schedule, "schedule")
    return apply_changes(graph, f"schedule={sched.value},vpp={vpp}", schedule=sched, vpp=vpp)


def with_microbatch(graph: StepGraph, micro_batch: int, global_batch: int | None = None) -> StepGraph:
    """Micro-batch size (and, through the global batch, the number of micro-batches per pipeline:
    global_batch / (dp * micro_batch))."""
    _, par = graph_config(graph)
    gb = global_batch if global_batch is not None else par.global_batch
    return apply_changes(graph, f"micro_batch={micro_batch},global_batch={gb}", micro_batch=micro_batch,
                         global_batch=gb)


def with_num_microbatches(graph: StepGraph, num_microbatches: int) -> StepGraph:
    """Micro-batches per pipeline per step (the global batch follows: dp * micro_batch * count)."""
    _, par = graph_config(graph)
    return with_microbatch(graph, par.micro_batch, par.dp * par.micro_batch * num_microbatches)


def with_layers(graph: StepGraph, layers: int) -> StepGraph:
    """Number of transformer layers (the model otherwise unchanged)."""
    model, _ = graph_config(graph)
    if layers < 1:
        raise ConfigError(f"must be >= 1, got {layers}", field="layers")
    return apply_changes(graph, f"layers={layers}", model=replace(model, layers=layers))
