"""Transformations of execution graphs: pure functions, graph in, new graph out (design.md
"Transform, then replay"). Measured durations survive wherever a transformation does not change an
op; changed ops are re-timed by the ratio of the cost model at the new and old shapes, so calibration
errors cancel. docs/transforms.md describes each one and its limits.

    base = materialize(build_step_graph(model, par_a), cluster)        # or an annotated trace
    graph = transform_to(base, model, par_b)                           # what evaluate(..., base=) does
    graph = with_pp(with_tp(base, 8), 16)                              # the same, step by step
"""

from __future__ import annotations

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.graph.ir import StepGraph
from comet.transform.hardware import with_hardware
from comet.transform.materialize import materialize
from comet.transform.parallel import with_cp, with_dp, with_tp, with_zero
from comet.transform.pipeline import with_layers, with_microbatch, with_num_microbatches, with_pp, with_schedule
from comet.transform.precision import with_precision
from comet.transform.recompute import with_recompute
from comet.transform.retarget import retarget
from comet.transform.volume import comm_volume

__all__ = ["transform_to", "materialize", "with_tp", "with_cp", "with_dp", "with_zero", "with_pp", "with_schedule",
           "with_microbatch", "with_num_microbatches", "with_layers", "with_recompute", "with_precision",
           "with_hardware", "comm_volume"]


def transform_to(base: StepGraph, model: ModelSpec, par: ParallelConfig,
                 cluster: ClusterSpec | None = None) -> StepGraph:
    """`base` (a StepGraph recording meta['model'] and meta['parallel']) moved to configuration `par` of
    `model` (only the layer count may differ from the base model) in one pass; with `cluster`, also
    re-timed from the base's cluster (meta['cluster']) to that one. Raises GraphError if the base does not
    say what configuration it is, ConfigError if `par` breaks a rule."""
    if par.dp is None or par.gpus is None or par.sequence_parallel is None:
        par = par.resolve(model)
    return retarget(base, model, par, cluster, what=f"to {par.label()}")
