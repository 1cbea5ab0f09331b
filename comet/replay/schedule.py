"""Pipeline schedules as per-stage task orders (phase, model chunk, micro-batch), generated with numpy
for all stages at once.

1F1B and interleaved 1F1B follow Megatron-LM `forward_backward_pipelining_without_interleaving` /
`_with_interleaving` (Narayanan et al. SC21 sec. 2.2): stage s runs min(pp - s - 1, M) warm-up forwards
(interleaved: (pp - s - 1) * 2 + (vpp - 1) * pp, capped at M * vpp), then alternates one forward and one
backward, then drains the remaining backwards. GPipe runs every forward, then every backward (Huang et
al. 2019).
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from comet.replay import cache

FWD, BWD = 0, 1


def steady_warmup(schedule: str, pp: int, vpp: int) -> int:
    """1F1B's and interleaved 1F1B's warm-up forwards on stage 0 (the most of any stage) when the
    micro-batches do not cap them; stage s runs 1 (interleaved: 2) per stage fewer."""
    if schedule == "interleaved_1f1b" and vpp > 1:
        return 2 * (pp - 1) + (vpp - 1) * pp
    return pp - 1


def warmups(schedule: str, pp: int, vpp: int, m: int) -> np.ndarray:
    total = m * vpp
    if schedule == "gpipe":
        return np.full(pp, total)
    per_stage = 2 if schedule == "interleaved_1f1b" and vpp > 1 else 1
    return np.minimum(steady_warmup(schedule, pp, vpp) - per_stage * np.arange(pp), total)


def all_stage_tasks(schedule: str, pp: int, vpp: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, chunk, microbatch) arrays of shape (pp, 2*m*vpp): row s is stage s's execution order."""
    total = m * vpp
    j = np.arange(2 * total)[None, :]
    w = warmups(schedule, pp, vpp, m)[:, None]
    # position j: warm-up forward j (j < w); steady pairs F(w + k/2), B(k/2) for k = j - w; drain B(j - total)
    k = j - w
    steady = (j >= w) & (j < 2 * total - w)
    is_fwd = (j < w) | (steady & (k % 2 == 0))
    index = np.where(j < w, j, np.where(steady, np.where(k % 2 == 0, w + k // 2, k // 2), j - total))
    phase = np.where(is_fwd, FWD, BWD)
    if schedule == "interleaved_1f1b" and vpp > 1:
        group, in_group = np.divmod(index, pp * vpp)      # Megatron get_model_chunk_id / microbatch id
        f_chunk = in_group // pp
        chunk = np.where(is_fwd, f_chunk, vpp - 1 - f_chunk)
        mb = group * pp + in_group % pp
    else:
        chunk = np.zeros_like(index)
        mb = index
    return phase, chunk, mb


def stage_tasks(schedule: str, pp: int, vpp: int, m: int, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, chunk, microbatch) of one stage, in execution order."""
    phase, chunk, mb = all_stage_tasks(schedule, pp, vpp, m)
    return phase[stage], chunk[stage], mb[stage]


def block_occurrences(plan, stage: int) -> dict[str, int]:
    """How many times each block runs on `stage` in one step (task_blocks over every task)."""
    m, pp, last = plan.num_microbatches, plan.pp, plan.pp * plan.vpp - 1
    n = dict.fromkeys(("layer.fwd", "layer.bwd", "layer.recompute", "embedding.fwd", "embedding.bwd",
                       "head.fwd", "head.bwd"), 0)
    for c in range(plan.vpp):
        vs = c * pp + stage
        for kind in plan.layer_kinds(vs):
            for part in ("fwd", "bwd") + (("recompute",) if plan.recompute_layers else ()):
                n[f"{kind}.{part}"] = n.get(f"{kind}.{part}", 0) + m
        if vs == 0:
            n["embedding.fwd"] += m
            n["embedding.bwd"] += m
        if vs == last:
            n["head.fwd"] += m
            n["head.bwd"] += m
    return n


def send_stride(plan, stage: int, chunk: int, phase: int) -> int | None:
    """Global-rank distance of the blocking send that ends a task (the activation to the next virtual
    stage, the gradient to the previous one; wrapping between the last and first stage across model
    chunks), or None for the last forward / first backward, which send nothing."""
    vs = chunk * plan.pp + stage
    if vs == (plan.pp * plan.vpp - 1 if phase == FWD else 0):
        return None
    wrap = stage == (plan.pp - 1 if phase == FWD else 0)
    return plan.p2p_group_stride * (plan.pp - 1 if wrap else 1)


def task_blocks(plan, stage: int, chunk: int, phase: int) -> list[str]:
    """The blocks one task runs, in order: a model chunk's layers, with the embedding on the first
    virtual stage and the output head on the last; backward runs each layer's recompute first."""
    vs = chunk * plan.pp + stage
    return list(_with_ends(_layer_blocks(plan, vs, phase), phase, vs == 0, vs == plan.pp * plan.vpp - 1))


def _layer_blocks(plan, vs: int, phase: int) -> tuple:
    """The blocks of model chunk vs's layers in a task's order (backward: last layer first, each
    layer's recompute before its backward)."""
    kinds = plan.layer_kinds(vs)
    if phase == FWD:
        return tuple([f"{k}.fwd" for k in kinds])
    if plan.recompute_layers:
        return tuple([b for k in reversed(kinds) for b in (f"{k}.recompute", f"{k}.bwd")])
    return tuple([f"{k}.bwd" for k in reversed(kinds)])


def _with_ends(layers: tuple, phase: int, first: bool, last: bool) -> tuple:
    """A task's blocks: its layers' with the embedding on the first virtual stage, the head on the last."""
    if phase == FWD:
        return (("embedding.fwd",) if first else ()) + layers + (("head.fwd",) if last else ())
    return (("head.bwd",) if last else ()) + layers + (("embedding.bwd",) if first else ())


def _task_kinds(plan) -> tuple[list, np.ndarray, np.ndarray]:
    pp, vpp = plan.pp, plan.vpp
    # perf: a task's kind depends on its chunk's layers, whether it holds an end and its send stride:
    # each (stage, chunk)'s role is one small integer, from list arithmetic where only the end stages
    # differ; each distinct role's blocks are built once, from its layers' built once per layer key
    # (GPT-3 1T, pp 64: 39 -> 17 us in-process, 0.061 -> ~0.04 ms in a cold call; before, a tuple key
    # and the blocks built per (stage, chunk))
    if plan.chunk_layer_kinds:       # layer kinds per chunk (tuples): numbered by first appearance
        seen: dict = {}
        key = [seen.setdefault(k, len(seen)) for k in plan.chunk_layer_kinds]
    else:                            # layer counts: their own numbers
        key = plan.chunk_layers
    # role = (layer key * 3 + forward send) * 3 + backward send, a send coded 2 (to the next stage),
    # 1 (wrapping from the last stage to the first across chunks) or 0 (none: the last forward, the
    # first backward): send_stride's rule
    by_vs = [k * 9 + 8 for k in key]
    for vs in range(0, pp * vpp, pp):
        by_vs[vs] -= 1               # stage 0's backward wraps
        by_vs[vs + pp - 1] -= 3      # the last stage's forward wraps
    by_vs[0] -= 1                    # ... but the first virtual stage's sends nothing, nor the last's
    by_vs[-1] -= 3
    roles = by_vs if vpp == 1 else [by_vs[c * pp + s] for s in range(pp) for c in range(vpp)]
    strides = (None, plan.p2p_group_stride * (pp - 1), plan.p2p_group_stride)
    kinds: dict = {}
    layers: dict = {}                # (layer key, phase) -> the layers' blocks
    kind_of = ({}, {})               # per phase: role -> its task's kind
    for r in dict.fromkeys(roles):   # in order of first appearance: kinds numbered as task by task
        s, c = divmod(roles.index(r), vpp)
        for phase, send in ((FWD, r // 3 % 3), (BWD, r % 3)):
            blocks = layers.get((r // 9, phase))
            if blocks is None:
                blocks = layers[r // 9, phase] = _layer_blocks(plan, c * pp + s, phase)
            blocks = _with_ends(blocks, phase, r % 3 == 0, r // 3 % 3 == 0)
            kind_of[phase][r] = kinds.setdefault((blocks, strides[send]), len(kinds))
    # perf (i20s-step): both tables from one array (a numpy call costs ~2 us on a cold call). perf
    # (i22s-step): read from the roles through each phase's dict in C (map) into np.fromiter (two list
    # comprehensions and a nested list's conversion before: pp 64, ~9 -> ~6.5 us in a loop)
    n = len(roles)
    both = np.fromiter(chain(map(kind_of[FWD].__getitem__, roles), map(kind_of[BWD].__getitem__, roles)), np.int64,
                       2 * n).reshape(2, n)
    fwd, bwd = both[FWD].reshape(pp, vpp), both[BWD].reshape(pp, vpp)
    fwd.flags.writeable = bwd.flags.writeable = False
    return list(kinds), fwd, bwd


def task_kinds(plan) -> tuple[list, np.ndarray, np.ndarray]:
    """The distinct (blocks, send stride) of the pipeline's tasks, and which one every (stage, chunk)
    forward and backward runs (read-only arrays): middle stages all run the same few."""
    # perf: keyed by the plan's fields _task_kinds reads (not the micro-batch count, the message size or
    # the schedule). perf (i22s-step): a key tuple of those fields, not a copy of the plan without the
    # others hashed through the dataclass's __hash__ (replace_fields + lru_cache: ~1 us more per call)
    key = ("task kinds", plan.pp, plan.vpp, plan.chunk_layers, plan.chunk_layer_kinds, plan.recompute_layers,
           plan.p2p_group_stride)
    return cache.facts.get_or(key, lambda: _task_kinds(plan))
