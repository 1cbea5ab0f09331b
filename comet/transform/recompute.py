"""Activation recomputation (none, selective, full). Full recompute runs each layer's forward again
before its backward: the recompute block gets the forward's kernels, with the forward's measured
durations (the same kernels on the same shapes), in phase "recompute". Selective recompute (Korthikanti
et al. 2022 sec. 5) re-runs only the attention core of an unfused implementation; with flash attention
it re-runs nothing (the backward kernel already recomputes the scores)."""

from __future__ import annotations

from comet.config.parallel import Recompute
from comet.graph.ir import StepGraph
from comet.transform.retarget import apply_changes, enum_value


def with_recompute(graph: StepGraph, mode: str | Recompute) -> StepGraph:
    mode = enum_value(Recompute, mode, "recompute")
    return apply_changes(graph, f"recompute={mode.value}", recompute=mode)
