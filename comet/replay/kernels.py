"""Compiled inner loops of the step replay (numba when installed; callers keep a numpy fallback).

The static-order pipeline schedule is a DAG whose longest path is the step: a task ends at
max(its stage's previous task, the task it waits for on another stage, its release) + duration.
`longest_path` visits every task once, in an order that respects both kinds of dependencies: each
stage advances as far as its cross-stage inputs allow, round-robin over stages (Kahn's algorithm
specialised to one chain per stage). The arithmetic per task is the event engine's (`max` then `+`),
so with overlap slowdown off the end times are bit-identical to replaying every op.
"""

from __future__ import annotations

import numpy as np

try:  # numba is optional: without it the pipeline solver uses vectorised numpy (comet/replay/pipeline.py)
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is not installed
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        def wrap(fn):
            return fn
        return wrap if not (args and callable(args[0])) else args[0]


@njit(cache=True, nogil=True)
def longest_path(src: np.ndarray, dur: np.ndarray, release: np.ndarray, offset: np.ndarray):
    """End time of every task, and whether every task could be scheduled (False: a dependency cycle).
    src[i] = global index of the task i waits for on another stage (n: none); stage s owns
    [offset[s], offset[s+1])."""
    n = dur.shape[0]
    pp = offset.shape[0] - 1
    end = np.zeros(n + 1)
    done = np.zeros(n + 1, dtype=np.bool_)
    done[n] = True
    ptr = offset[:-1].copy()
    left = n
    while left > 0:
        progressed = False
        for s in range(pp):
            i = ptr[s]
            hi = offset[s + 1]
            prev = end[i - 1] if i > offset[s] else 0.0
            while i < hi and done[src[i]]:
                t = end[src[i]]
                if release[i] > t:
                    t = release[i]
                if prev > t:
                    t = prev
                prev = t + dur[i]
                end[i] = prev
                done[i] = True
                i += 1
            if i != ptr[s]:
                left -= i - ptr[s]
                ptr[s] = i
                progressed = True
        if not progressed:
            return end[:n], False
    return end[:n], True


@njit(cache=True, nogil=True)
def serial_stream(ready: np.ndarray, dur: np.ndarray, t0: float) -> np.ndarray:
    """End times of ops run one after another on one stream in ready order (stable), each starting no
    earlier than its ready time nor t0. Same arithmetic as the event engine."""
    order = np.argsort(ready, kind="mergesort")
    ends = np.empty(ready.shape[0])
    t = t0
    for k in range(order.shape[0]):
        i = order[k]
        if ready[i] > t:
            t = ready[i]
        t = t + dur[i]
        ends[k] = t
    return ends
