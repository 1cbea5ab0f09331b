"""Speed of the trace-driven path the search takes for every candidate: transform a base graph into the
candidate's configuration, then replay it. GPT-3 1T (128 layers, hidden 25600) on 4096 H100s, target
tp 8, pp 64, 1F1B, micro-batch 1, global batch 1536, from a base built and materialized at tp 4, pp 32.

transform_1t_ms is the cold cost (the builder templates of both configurations built afresh each time,
as for a candidate never seen before); transform_1t_warm_ms reuses them (a repeated candidate)."""

import statistics
import time
from pathlib import Path

import pytest

from comet.config.cluster import load_cluster
from comet.config.model import load_model
from comet.config.parallel import ParallelConfig
from comet.evaluate import evaluate, resolve
from comet.replay.step import replay_step
from comet.transform import materialize, transform_to
from comet.transform.retarget import _template_blocks
from comet.workload.builder import build_step_graph

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 30


def _median_ms(fn, repeats: int = REPEATS, setup=None) -> float:
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@pytest.mark.bench
def test_bench_transform_1t():
    model = load_model("gpt3_1t")
    cluster = load_cluster(ROOT / "cluster_specs" / "h100_dgx.yaml")
    base_par = resolve(model, cluster, ParallelConfig(global_batch=1536, tp=4, pp=32, gpus=4096))
    par = resolve(model, cluster, ParallelConfig(global_batch=1536, tp=8, pp=64, gpus=4096, micro_batch=1))
    base = materialize(build_step_graph(model, base_par), cluster)

    cold = _median_ms(lambda: transform_to(base, model, par), setup=_template_blocks.cache_clear)
    warm = _median_ms(lambda: transform_to(base, model, par))
    graph = transform_to(base, model, par)
    replay = _median_ms(lambda: replay_step(graph, cluster, par.precision.value), repeats=15)

    step = replay_step(graph, cluster, par.precision.value).step_time_s
    built = evaluate(model, cluster, par).step_time_s
    print(f"\nBENCH transform_1t_ms {cold:.3f} ms")
    print(f"BENCH transform_1t_warm_ms {warm:.3f} ms")
    print(f"BENCH replay_1t_ms {replay:.3f} ms")
    print(f"BENCH transform_1t_step_s {step:.4f} s (built: {built:.4f} s)")
    print(f"BENCH transform_1t_cold_over_replay {cold / replay:.3f} (a transform should cost less than the replay it feeds)")
    assert abs(step - built) / built < 0.02
