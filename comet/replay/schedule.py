"""Pipeline schedules as per-stage task orders (phase, model chunk, micro-batch), generated with numpy.

1F1B and interleaved 1F1B follow Megatron-LM `forward_backward_pipelining_without_interleaving` /
`_with_interleaving` (Narayanan et al. SC21 sec. 2.2): stage s runs min(pp - s - 1, M) warm-up forwards
(interleaved: (pp - s - 1) * 2 + (vpp - 1) * pp), then alternates one forward and one backward, then
drains the remaining backwards. GPipe runs every forward, then every backward (Huang et al. 2019).
"""

from __future__ import annotations

import numpy as np

FWD, BWD = 0, 1


def stage_tasks(schedule: str, pp: int, vpp: int, m: int, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, chunk, microbatch) arrays of length 2*m*vpp, in execution order on `stage`."""
    total = m * vpp
    k = np.arange(total)
    if schedule == "interleaved_1f1b" and vpp > 1:
        group, in_group = np.divmod(k, pp * vpp)
        f_chunk = in_group // pp
        mb = group * pp + in_group % pp
        b_chunk = vpp - 1 - f_chunk
        warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    else:
        f_chunk = np.zeros(total, dtype=np.int64)
        b_chunk = f_chunk
        mb = k
        warmup = total if schedule == "gpipe" else min(pp - stage - 1, total)
    steady = total - warmup
    # Interleave: warm-up forwards, then (forward warmup+i, backward i) pairs, then the drain.
    phase = np.concatenate([np.zeros(warmup, np.int64), np.tile([FWD, BWD], steady), np.ones(warmup, np.int64)])
    idx = np.concatenate([np.arange(warmup), np.stack([np.arange(warmup, total), np.arange(steady)], 1).ravel(),
                          np.arange(steady, total)])
    chunk = np.where(phase == FWD, f_chunk[idx], b_chunk[idx])
    return phase, chunk, mb[idx]
