"""Compile the numba kernels into numba's on-disk cache ahead of first use: `python -m comet.replay.precompile`
(the Makefile's install step runs it). Without it the first evaluation after an install compiles them,
silently, for about a minute on a busy 2-core machine; with the cache warm this takes about a second.

The configurations below reach every kernel signature a search uses (1F1B, interleaved and GPipe
schedules, ZeRO-3 without a pipeline, optimizer and activation offload into an expansion tier, a block
packed from its ops): after this, a GPT-3 1T study in a fresh process compiles nothing
(tests/replay/test_precompile.py checks that it compiles nothing once the cache is warm).
"""

from __future__ import annotations

import sys
import time

# (model, provisioning of the default cluster (search/context.py apply_provisioning), estimate's arguments)
CONFIGURATIONS = (
    ("gpt3_1t", {}, dict(gpus=4096, tp=8, pp=64, micro_batch=1, global_batch=1536, recompute="selective")),
    ("gpt3_1t", {"expansion_GB": 512, "expansion_bandwidth_GBps": 256},
     dict(gpus=4096, tp=8, pp=16, vpp=2, schedule="interleaved_1f1b", micro_batch=1, global_batch=2048,
          recompute="full", zero=1, offload=["optimizer"])),
    ("gpt3_1t", {"expansion_GB": 512, "expansion_bandwidth_GBps": 64},
     dict(gpus=2048, tp=16, pp=32, vpp=2, schedule="interleaved_1f1b", micro_batch=1, global_batch=2048,
          recompute="selective", zero=1, offload=["activations"])),
    ("gpt3_175b", {}, dict(gpus=512, tp=8, pp=8, schedule="gpipe", micro_batch=1, global_batch=512)),
    ("gpt_1_7b", {}, dict(gpus=64, tp=2, pp=1, micro_batch=2, global_batch=256, zero=3)),
)


def precompile() -> int:
    """Evaluate CONFIGURATIONS (compiling what numba's cache lacks) and replay one block packed from its
    ops; returns how many configurations ran."""
    from comet.api import DEFAULT_CLUSTER, estimate
    from comet.config.cluster import load_cluster
    from comet.graph.ir import Op, OpKind, add_op, new_graph
    from comet.replay import cache
    from comet.replay.blocks import time_block
    from comet.search.context import apply_provisioning

    cluster = load_cluster(DEFAULT_CLUSTER)
    for model, provision, parallel in CONFIGURATIONS:
        estimate(model, apply_provisioning(cluster, provision), **parallel)
    # a block the replay packs from its ops (block_kernel.replay_summary): a materialized graph, no table
    g = new_graph()
    add_op(g, Op("a", OpKind.COMPUTE, duration_s=1.0))
    cache.clear()
    time_block(g, cluster, "bf16")
    return len(CONFIGURATIONS)


def main() -> int:
    from comet.replay.kernels import HAVE_NUMBA
    if not HAVE_NUMBA:
        print("numba is not installed: nothing to compile (the engine runs its Python fallbacks)")
        return 0
    t = time.perf_counter()
    precompile()
    print(f"replay kernels ready in numba's cache ({time.perf_counter() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
