"""Test helpers for the search tests: paths, and a fake evaluate/precheck for driver-mechanics tests only
(resume, Ctrl-C, crashes). End-to-end tests call the real comet.evaluate."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from comet.result import BREAKDOWN_KEYS, CandidateStatus, Result

# A worker evaluating a configuration whose label starts with the text in this file dies (os._exit).
# A file, not an environment variable, so Ray workers started before the test see it.
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "search_spaces" / "tiny.yaml"

# One file per test process: the machine's other test runs (same uid) must not kill this one's evaluations.
# Ray workers get the driver's value: the module is pickled by value (register_pickle_by_value).
CRASH_FILE = Path(tempfile.gettempdir()) / f"comet-fake-crash-tp-{os.getuid()}-{os.getpid()}"
INTERRUPT_AFTER = {"n": None, "count": 0}  # raise KeyboardInterrupt after n calls (serial executor)


def fake_precheck(model, cluster, parallel):
    if parallel.tp * parallel.pp < 8:
        return False, f"does not fit memory: {900 / (parallel.tp * parallel.pp):.0f} GB > {cluster.gpu.hbm_GB:.0f} GB HBM"
    return True, ""


def fake_evaluate(model, cluster, parallel, job=None, *, timeline=False, base=None):
    if CRASH_FILE.exists() and parallel.label().startswith(CRASH_FILE.read_text()):
        os._exit(3)
    if INTERRUPT_AFTER["n"] is not None:
        INTERRUPT_AFTER["count"] += 1
        if INTERRUPT_AFTER["count"] > INTERRUPT_AFTER["n"]:
            raise KeyboardInterrupt
    if parallel.pp == 8 and parallel.tp == 8 and parallel.recompute.value == "selective":
        return Result(status=CandidateStatus.INFEASIBLE, reason="activations do not fit memory", gpus=parallel.gpus,
                      label=parallel.label())
    bw = cluster.network[-1].bandwidth_GBps
    compute = 100.0 / parallel.gpus * (1.3 if parallel.recompute.value == "full" else 1.0)
    dp_comm = 2.0 / bw * parallel.dp / parallel.tp
    bubble = compute * (parallel.pp - 1) / parallel.num_microbatches
    parts = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    parts.update(compute=compute, exposed_dp=dp_comm, pipeline_bubble=bubble)
    step = sum(parts.values())
    tokens = parallel.global_batch * model.seq_len / step
    events = [{"name": "step", "ph": "X", "ts": 0, "dur": step * 1e6, "pid": 0, "tid": 0}] if timeline else None
    return Result(status=CandidateStatus.OK, label=parallel.label(), step_time_s=step, tokens_per_s=tokens,
                  tflops_per_gpu=100.0, mfu=0.4, memory_gb_per_gpu=900 / (parallel.tp * parallel.pp),
                  breakdown=parts, gpus=parallel.gpus, timeline=events)


def dies_outside(ctx, driver_pid: int, value):
    """A side task (executor.side) whose worker dies: it gives `value` only in the driver's process."""
    if os.getpid() != driver_pid:
        os._exit(3)
    return value
