"""The nearest feasible change to an infeasible configuration, found by re-evaluating its neighbours.

A configuration that does not fit memory usually fits after one of a few standard moves on the same
GPU count: more pipeline stages or tensor parallelism (weights, gradients and activations split
further), activation recompute, a higher ZeRO stage (optimizer state and gradients sharded over DP),
a smaller micro-batch, or offload to the cluster's memory-expansion tier. Each neighbour is checked
with the memory model first (cheap) and the ones that fit are replayed, so a suggestion comes with
the step time it would actually have. Single moves are tried first; pairs only when no single move fits.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from comet.config.cluster import ClusterSpec
from comet.config.job import JobSpec
from comet.config.model import ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Recompute, RecomputeModule
from comet.workload import recompute_modules

MAX_REMEDIES = 3


def _moves(par: ParallelConfig, cluster: ClusterSpec, model: ModelSpec | None = None) -> list[tuple[str, dict]]:
    """(description, changed fields) of each single move from `par`; dp is re-derived from gpus."""
    moves: list[tuple[str, dict]] = []
    for factor in (2, 4):
        if par.dp % factor == 0:
            moves.append((f"pp {par.pp} -> {par.pp * factor}", {"pp": par.pp * factor}))
    if par.dp % 2 == 0:
        if par.tp * 2 <= cluster.gpus_per_node:   # TP beyond the NVLink domain is rarely worth it
            moves.append((f"tp {par.tp} -> {par.tp * 2}", {"tp": par.tp * 2}))
    if par.recompute is Recompute.NONE:
        moves.append(("recompute selective", {"recompute": Recompute.SELECTIVE}))
    if model is not None and (model.moe is not None or model.mla is not None) and recompute_modules.can_add(par):
        # Megatron-Core's recompute modules: MoE / MLA activations freed for a few percent more work
        # (comet/workload/recompute_modules.py)
        moves.append(("recompute selective + modules", {"recompute": Recompute.SELECTIVE,
                                                        "recompute_modules": tuple(RecomputeModule)}))
    if par.recompute is not Recompute.FULL:
        moves.append(("recompute full", {"recompute": Recompute.FULL}))
    for stage in range(par.zero + 1, 4):
        # FSDP's ZeRO-3 is FULL_SHARD: SHARD_GRAD_OP (a ZeRO-2 mode) does not carry over
        moves.append((f"zero {par.zero} -> {stage}", {"zero": stage} | ({"shard_grad_op": False} if par.shard_grad_op else {})))
    if par.micro_batch > 1:
        moves.append((f"micro_batch {par.micro_batch} -> 1", {"micro_batch": 1}))
    if cluster.memory_expansion is not None:
        for target in OffloadTarget:
            if target not in par.offload:
                moves.append((f"offload {target.value}", {"offload": par.offload + (target,)}))
    return moves


def _apply(par: ParallelConfig, changes: dict) -> ParallelConfig:
    return replace(par, dp=None, **changes)


def nearest_feasible(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig,
                     job: JobSpec | None = None) -> list[dict]:
    """Up to MAX_REMEDIES changes that make `par` feasible on the same GPUs, fastest first:
    [{"change": "pp 8 -> 16", "label": ..., "step_time_s": ..., "memory_gb_per_gpu": ...}]."""
    from comet.evaluate import evaluate, precheck

    if par.dp is None:   # an unresolved configuration (a broken rule): no neighbour search
        return []
    singles = _moves(par, cluster, model)
    tried: set[str] = set()
    for size in (1, 2):
        found = []
        for combo in combinations(singles, size):
            keys = [k for _, ch in combo for k in ch]
            if len(keys) != len(set(keys)):
                continue   # two moves on the same field (e.g. recompute selective + full)
            changes = {k: v for _, ch in combo for k, v in ch.items()}
            cand = _apply(par, changes)
            ident = repr(cand)
            if ident in tried:
                continue
            tried.add(ident)
            fits, _ = precheck(model, cluster, cand)
            if not fits:
                continue
            res = evaluate(model, cluster, cand, job)
            if res.feasible:
                found.append({"change": " + ".join(d for d, _ in combo), "label": res.label,
                              "step_time_s": res.step_time_s, "memory_gb_per_gpu": res.memory_gb_per_gpu})
        if found:
            return sorted(found, key=lambda r: r["step_time_s"])[:MAX_REMEDIES]
    return []
