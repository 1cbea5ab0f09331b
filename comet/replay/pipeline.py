"""Replay of the pipeline level: every stage's tasks (a model chunk's forward or backward for one
micro-batch) in schedule order, with cross-stage dependencies, then each stage's once-per-step tail
(gradient buckets, tied-embedding sync, optimizer, parameter gathers).

The task level is a static-order schedule: each stage runs its tasks in a fixed order, a task starts
when the stage is free and its input has arrived. Its timing is the longest path of that DAG, which
we solve exactly without visiting tasks one by one:
  on one stage, e_i = max(e_{i-1}, a_i) + d_i  =>  e = C + cummax(a - C_prev)   (C = cumsum(d)),
so a stage is a handful of numpy calls given its arrival times a (ends of the tasks it waits for on
the neighbouring stages). Sweeping the stages downwards (forwards flow down) and upwards (backwards
flow up) until nothing changes is a Gauss-Seidel iteration of a monotone operator from below: it
converges to the least fixed point, which is the longest-path solution. Tests check it against the
event engine on the expanded op graph.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from comet.errors import GraphError
from comet.replay import cache
from comet.replay.kernels import HAVE_NUMBA, longest_path, pipeline_summary, pipeline_tasks, replay_in_order
from comet.replay.schedule import BWD, FWD, all_stage_tasks, warmups


@dataclass
class StagePrograms:
    """Task arrays of every stage, concatenated; stage s owns [offset[s], offset[s+1])."""
    phase: np.ndarray
    chunk: np.ndarray
    mb: np.ndarray
    dur: np.ndarray
    src: np.ndarray        # global index of the task this one waits for on another stage (n = none)
    release: np.ndarray    # earliest start (e.g. after the parameter all-gather), seconds
    offset: np.ndarray
    last_b: np.ndarray | None = None    # (stage, chunk) -> index of the chunk's last backward

    @property
    def n(self) -> int:
        return len(self.dur)


@cache.memoized(64)
def _structure(schedule: str, pp: int, vpp: int, m: int):
    """The task arrays that depend only on the schedule's shape: computed once per (schedule, pp, vpp,
    m) and shared by every candidate with that shape (read-only)."""
    per = 2 * m * vpp
    phase, chunk, mb = (a.ravel() for a in all_stage_tasks(schedule, pp, vpp, m))
    stage = np.repeat(np.arange(pp), per)
    n = pp * per
    pos = np.empty((pp, 2, vpp, m), dtype=np.int64)          # (stage, phase, chunk, mb) -> global index
    pos[stage, phase, chunk, mb] = np.arange(n)
    vs = chunk * pp + stage                                  # virtual stage of each task
    last_vs = pp * vpp - 1
    fwd = phase == FWD
    # forward waits for the previous virtual stage's forward; backward for the next one's backward
    src_vs = np.where(fwd, vs - 1, vs + 1)
    has_src = (src_vs >= 0) & (src_vs <= last_vs)
    sv = np.clip(src_vs, 0, last_vs)
    src = np.where(has_src, pos[sv % pp, phase, sv // pp, mb], n)
    # index into the (pp, 2, vpp) table of task durations: one gather per candidate
    dur_index = (stage * 2 + phase) * vpp + chunk
    first_fwd = np.flatnonzero(fwd & (mb == 0))
    arrays = (phase, chunk, mb, src, dur_index, first_fwd, stage, np.arange(pp + 1) * per)
    for a in arrays:
        a.flags.writeable = False
    return arrays


@cache.memoized(64)
def last_backward(schedule: str, pp: int, vpp: int, m: int) -> np.ndarray:
    """(stage, chunk) -> global index of the chunk's last backward task (the last micro-batch's)."""
    phase, chunk, mb, *_ = _structure(schedule, pp, vpp, m)
    stage = _structure(schedule, pp, vpp, m)[6]
    idx = np.flatnonzero((phase == BWD) & (mb == m - 1))
    out = np.empty((pp, vpp), dtype=np.int64)
    out[stage[idx], chunk[idx]] = idx
    out.flags.writeable = False
    return out


def build_programs(schedule: str, pp: int, vpp: int, m: int, f_dur: np.ndarray, b_dur: np.ndarray,
                   f_release: np.ndarray | None = None) -> StagePrograms:
    """f_dur / b_dur[stage, chunk]: task durations (send included); f_release[stage, chunk]: earliest
    start of the chunk's first forward."""
    phase, chunk, mb, src, dur_index, first_fwd, stage, offset = _structure(schedule, pp, vpp, m)
    # perf: the schedule's shape is cached; a candidate only gathers its durations into it
    dur = np.stack((np.asarray(f_dur, dtype=float), np.asarray(b_dur, dtype=float)), axis=1).ravel()[dur_index]
    release = np.zeros(len(dur))
    if f_release is not None and f_release.any():
        release[first_fwd] = f_release[stage[first_fwd], chunk[first_fwd]]
    return StagePrograms(phase, chunk, mb, dur, src, release, offset)


def run(schedule: str, pp: int, vpp: int, m: int, f_dur: np.ndarray, b_dur: np.ndarray,
        f_release: np.ndarray) -> tuple[StagePrograms, np.ndarray]:
    """build_programs + solve: the task programs and every task's end time. With numba, one compiled
    pass builds and solves (kernels.pipeline_tasks; equal to build_programs + solve, tested)."""
    if not HAVE_NUMBA:
        prog = build_programs(schedule, pp, vpp, m, f_dur, b_dur, f_release)
        prog.last_b = last_backward(schedule, pp, vpp, m)
        return prog, solve_numpy(prog)
    interleaved = schedule == "interleaved_1f1b" and vpp > 1
    phase, chunk, mb, dur, src, release, end, last_b, complete = pipeline_tasks(
        interleaved, pp, vpp, m, warmups(schedule, pp, vpp, m).astype(np.int64), np.ascontiguousarray(f_dur, float),
        np.ascontiguousarray(b_dur, float), np.ascontiguousarray(f_release, float))
    if not complete:
        raise GraphError("pipeline replay did not converge (the schedule has a dependency cycle)")
    per = 2 * m * vpp
    return StagePrograms(phase, chunk, mb, dur, src, release, np.arange(pp + 1) * per, last_b), end


@dataclass
class PipelineSummary:
    """What the step replay reads of the task level, per stage."""
    compute_end: np.ndarray      # (pp,) end of the stage's last task
    last_b_start: np.ndarray     # (pp, vpp) start of each chunk's last backward (the last micro-batch's)
    bubble: np.ndarray           # (pp,) idle, waiting for other stages
    gather_wait: np.ndarray      # (pp,) idle, waiting for a parameter all-gather (input already there)


def summarize(schedule: str, pp: int, vpp: int, m: int, f_dur: np.ndarray, b_dur: np.ndarray,
              f_release: np.ndarray) -> PipelineSummary:
    """The task level reduced to per-stage figures: compiled in one pass without per-task arrays when
    numba is installed (kernels.pipeline_summary; from the second candidate of a pipeline shape on,
    kernels.replay_in_order over the visit order the first one recorded), else from run()'s arrays."""
    if HAVE_NUMBA:
        interleaved = schedule == "interleaved_1f1b" and vpp > 1
        f_release = np.ascontiguousarray(f_release, float)
        # the visit order depends on the schedule's shape only (warm-up counts: gpipe, interleaved or 1f1b)
        shape = (interleaved, pp, vpp, m, schedule == "gpipe")
        order = cache.orders.get(shape)
        if order is not None:   # perf: a shape seen before is replayed without the schedule logic (~3x faster)
            dur = np.stack((np.asarray(f_dur, dtype=float), np.asarray(b_dur, dtype=float)), axis=1).ravel()
            return PipelineSummary(*replay_in_order(order, pp, vpp, dur, f_release.ravel(), _scratch(len(order) + 1 + pp)))
        compute_end, last_b_start, bubble, gather_wait, complete, order = pipeline_summary(
            interleaved, pp, vpp, m, warmups(schedule, pp, vpp, m).astype(np.int64),
            np.ascontiguousarray(f_dur, float), np.ascontiguousarray(b_dur, float), f_release)
        if not complete:
            raise GraphError("pipeline replay did not converge (the schedule has a dependency cycle)")
        order.flags.writeable = False
        cache.orders.put(shape, order)
        return PipelineSummary(compute_end, last_b_start, bubble, gather_wait)
    prog, end = run(schedule, pp, vpp, m, f_dur, b_dur, f_release)
    return summarize_tasks(prog, end)


_local = threading.local()


def _scratch(n: int) -> np.ndarray:
    """A per-thread buffer of at least n floats for the task end times (reused: no page faults per call)."""
    buf = getattr(_local, "end", None)
    if buf is None or len(buf) < n:
        buf = _local.end = np.empty(max(n, 1 << 16))
    return buf


def summarize_tasks(prog: StagePrograms, end: np.ndarray) -> PipelineSummary:
    """PipelineSummary from every task's end time (numpy). A start is the latest of what the task waits
    for (exact, unlike end - duration), so a start at the release time is recognised as such."""
    lo = prog.offset[:-1]
    prev_end = np.concatenate([[0.0], end[:-1]])
    prev_end[lo] = 0.0
    src_end = np.append(end, 0.0)[np.minimum(prog.src, len(end))]
    start = np.maximum(np.maximum(prev_end, src_end), prog.release)
    gaps = start - prev_end
    waiting = (prog.release > 0) & (start == prog.release) & (src_end < start)
    per_stage = np.repeat(np.arange(len(lo)), np.diff(prog.offset))
    pp = len(lo)
    return PipelineSummary(end[prog.offset[1:] - 1], start[prog.last_b],
                           np.bincount(per_stage, np.where(waiting, 0.0, gaps), minlength=pp),
                           np.bincount(per_stage, np.where(waiting, gaps, 0.0), minlength=pp))


def solve(prog: StagePrograms, max_sweeps: int | None = None) -> np.ndarray:
    """End time of every task (exact longest path of the static-order schedule): compiled when numba is
    installed (kernels.longest_path, one visit per task), else numpy sweeps (solve_numpy)."""
    if HAVE_NUMBA and max_sweeps is None:
        end, complete = longest_path(prog.src, prog.dur, prog.release, prog.offset)
        if not complete:
            raise GraphError("pipeline replay did not converge (the schedule has a dependency cycle)")
        return end
    return solve_numpy(prog, max_sweeps)


def solve_numpy(prog: StagePrograms, max_sweeps: int | None = None) -> np.ndarray:
    """The same longest path by Gauss-Seidel sweeps of vectorised stages (equal to 1e-12 relative:
    the prefix sums round differently from one task after another)."""
    pp = len(prog.offset) - 1
    end = np.zeros(prog.n + 1)                                # end[n] = 0: "no dependency"
    # perf: per-stage slices and prefix sums computed once, outside the sweep loop
    lo, hi = prog.offset[:-1], prog.offset[1:]
    srcs = [prog.src[lo[s]:hi[s]] for s in range(pp)]
    rel = [prog.release[lo[s]:hi[s]] for s in range(pp)]
    has_rel = [bool(r.any()) for r in rel]
    cum = [np.cumsum(prog.dur[lo[s]:hi[s]]) for s in range(pp)]
    cprev = [c - d for c, d in zip(cum, (prog.dur[lo[s]:hi[s]] for s in range(pp)))]
    order = list(range(pp)) + list(range(pp - 1, -1, -1))
    limit = max_sweeps or 4 * (pp + 2) * max(1, int(prog.chunk.max(initial=0)) + 1)
    for _ in range(limit):
        changed = False
        for s in order:
            a = end[srcs[s]]
            if has_rel[s]:
                np.maximum(a, rel[s], out=a)
            a -= cprev[s]
            np.maximum.accumulate(a, out=a)
            a += cum[s]
            seg = end[lo[s]:hi[s]]
            if not np.array_equal(a, seg):
                seg[:] = a
                changed = True
        if not changed:
            return end[:-1]
    raise GraphError("pipeline replay did not converge (the schedule has a dependency cycle)")
