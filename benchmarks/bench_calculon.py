"""comet against Calculon (Isaev et al. SC'23), both in this process, calls alternated, CPU time per
candidate (medians; ratios, not absolute times, are stable on a shared machine). Run by `make bench`.

- comet_over_calculon_cold: GPT-3 1T on 4096 H100 (tp 8, pp 64, dp 8, 1F1B, micro-batch 1, global
  batch 1536, selective recompute) through the public API (`comet.estimate`, the arguments checked as
  the CLI checks them), evaluated as a configuration seen for the first time: every comet
  cache is emptied before each call (blocks, op durations, replays, graphs, schedule structures), so
  nothing is reused from the previous call; imports and numba's compiled kernels are loaded once per
  process (a warm-up call on another configuration), like Calculon's imports.
- comet_over_calculon_search: per candidate inside a search (`comet.evaluate.evaluate`, what the search
  driver calls): dp (2048 / 4096 / 8192 GPUs), global batch and scale-out bandwidth vary; each
  candidate is new to both tools, while the blocks were seen on other candidates (a warm-up pass with
  another global batch). The search runs SEARCH_PASSES times, each from emptied caches and the same
  warm-up; a candidate's cost is its median over the passes, the ratio the median over candidates.

The gpt3_1t study's rates: benchmarks/bench_study.py.
Calculon is ../shared/peers/calculon, unmodified (not a dependency: on sys.path here only; it needs psutil).
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CALCULON = ROOT.parent / "shared" / "peers" / "calculon"
REPEATS = 30
SEARCH_PASSES = 5

# The same run for both tools. Calculon: megatron-1T.json is GPT-3 1T's shape (Narayanan et al. SC21
# Table 1); its H100 system has no bf16 entry, float16 runs at the same tensor-core rate.
EXECUTION = {"num_procs": 4096, "tensor_par": 8, "pipeline_par": 64, "data_par": 8, "tensor_par_net": 0,
             "pipeline_par_net": 1, "data_par_net": 1, "batch_size": 1536, "microbatch_size": 1,
             "datatype": "float16", "fused_activation": True, "attention_type": "multihead",
             "activation_recompute": "attn_only", "pipeline_interleaving": 1, "optimizer_sharding": True,
             "tensor_par_comm_type": "rs_ag", "tensor_par_overlap": "none", "seq_par_ag_redo": False,
             "data_par_overlap": True, "weight_offload": False, "activations_offload": False,
             "optimizer_offload": False, "training": True}
SEARCH_GPUS = (2048, 4096, 8192)
SEARCH_BATCH = (1024, 2048, 3072)
SEARCH_SCALEOUT_GBPS = (25.0, 50.0, 100.0)


def _calculon():
    if not (CALCULON / "calculon").is_dir():
        pytest.skip(f"Calculon not found at {CALCULON} (../shared/peers/calculon)")
    sys.path.insert(0, str(CALCULON))
    try:
        import calculon
        from calculon.llm import Llm
    except ImportError as exc:
        pytest.skip(f"Calculon does not import ({exc}); it needs psutil")
    finally:
        sys.path.remove(str(CALCULON))
    read = calculon.io.read_json_file
    app = Llm.Application(read(str(CALCULON / "models" / "megatron-1T.json")))
    system_json = read(str(CALCULON / "systems" / "h100_80g_nvl8.json"))
    log = logging.getLogger("calculon")

    def system(scaleout_GBps: float | None = None):
        js = copy.deepcopy(system_json)
        if scaleout_GBps is not None:
            js["networks"][1]["bandwidth"] = scaleout_GBps
        return calculon.System(js)

    def run(sys_, execution: dict) -> float:
        model = Llm(app, log)
        model.compile(sys_, Llm.Execution.from_json(execution))
        model.run(sys_)
        return model.get_total_time()

    return system, run


# The same configuration as comet.estimate arguments and as the ParallelConfig a search evaluates.
COMET_ARGS = {"tp": 8, "pp": 64, "gpus": 4096, "micro_batch": 1, "global_batch": 1536, "recompute": "selective"}


def _comet():
    from comet.config.cluster import load_cluster
    from comet.config.model import load_model
    from comet.config.parallel import ParallelConfig, Recompute
    from comet.evaluate import evaluate
    model = load_model("gpt3_1t")
    cluster = load_cluster(ROOT / "cluster_specs" / "h100_dgx.yaml")
    par = ParallelConfig(**dict(COMET_ARGS, recompute=Recompute.SELECTIVE))
    return model, cluster, par, evaluate


def _forget_everything() -> None:
    """Empty every cache comet keeps between candidates, so the next call computes from scratch."""
    from comet.replay import cache
    cache.clear()


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


@pytest.mark.bench
def test_bench_comet_over_calculon():
    system, calc_run = _calculon()
    model, cluster, par, evaluate = _comet()
    from comet.search.context import apply_provisioning
    print(f"\nBENCH calculon_loadavg_1min_before {os.getloadavg()[0]:.2f} processes")

    import comet

    # ---- cold: a configuration never seen, every cache emptied before each comet call
    calc_sys = system()
    for batch in (768, 768):       # imports, numba kernels loaded (a shape seen first, then again)
        comet.estimate(model, cluster, **dict(COMET_ARGS, global_batch=batch))
    calc_run(calc_sys, EXECUTION)
    comet_cold, calc_cold = [], []
    for _ in range(REPEATS):
        _forget_everything()
        comet_cold.append(_cpu(lambda: comet.estimate(model, cluster, **COMET_ARGS)))
        calc_cold.append(_cpu(lambda: calc_run(calc_sys, EXECUTION)))
    comet_step = comet.estimate(model, cluster, **COMET_ARGS).step_time_s
    assert comet_step == evaluate(model, cluster, par).step_time_s
    calc_step = calc_run(calc_sys, EXECUTION)

    # ---- search: dp, global batch and scale-out bandwidth vary; blocks seen on other candidates
    cands = list(itertools.product(SEARCH_GPUS, SEARCH_BATCH, SEARCH_SCALEOUT_GBPS))
    clusters = {bw: apply_provisioning(cluster, {"scaleout_bandwidth_GBps": bw}) for bw in SEARCH_SCALEOUT_GBPS}
    systems = {bw: system(bw) for bw in SEARCH_SCALEOUT_GBPS}
    comet_passes, calc_passes = [], []
    for _ in range(SEARCH_PASSES):    # the same search each pass, from the same cache state
        _forget_everything()
        for bw in SEARCH_SCALEOUT_GBPS:                              # warm-up: another global batch
            evaluate(model, clusters[bw], replace(par, global_batch=512))
        comet_pass, calc_pass = [], []
        for gpus, batch, bw in cands:
            p = replace(par, gpus=gpus, global_batch=batch)
            execution = dict(EXECUTION, num_procs=gpus, data_par=gpus // 512, batch_size=batch)
            comet_pass.append(_cpu(lambda: evaluate(model, clusters[bw], p)))
            calc_pass.append(_cpu(lambda: calc_run(systems[bw], execution)))
        comet_passes.append(comet_pass)
        calc_passes.append(calc_pass)
    # each candidate's cost: its median over the passes (one sample of a candidate is at the mercy of
    # the machine's noise, and the median candidate sits where the costs split into groups)
    comet_search = [statistics.median(c) for c in zip(*comet_passes)]
    calc_search = [statistics.median(c) for c in zip(*calc_passes)]

    med = statistics.median
    print(f"BENCH comet_cold_cpu_ms {med(comet_cold) * 1e3:.3f} ms")
    print(f"BENCH calculon_cold_cpu_ms {med(calc_cold) * 1e3:.3f} ms")
    print(f"BENCH comet_over_calculon_cold {med(comet_cold) / med(calc_cold):.3f}")
    print(f"BENCH comet_search_cpu_ms {med(comet_search) * 1e3:.3f} ms")
    print(f"BENCH calculon_search_cpu_ms {med(calc_search) * 1e3:.3f} ms")
    print(f"BENCH comet_over_calculon_search {med(comet_search) / med(calc_search):.3f}")
    # the search candidates' costs are bimodal (a candidate that reuses its shape's transient vs one that
    # builds a new shape, memory estimate or DP syncs): the quartiles show where the median sits
    for tool, times in (("comet", comet_search), ("calculon", calc_search)):
        q1, q2, q3 = statistics.quantiles(times, n=4)
        print(f"BENCH {tool}_search_cpu_ms_quartiles {q1 * 1e3:.3f} / {q2 * 1e3:.3f} / {q3 * 1e3:.3f} ms")
    print(f"BENCH step_time_s comet {comet_step:.3f} calculon {calc_step:.3f}")
    print(f"BENCH calculon_loadavg_1min_after {os.getloadavg()[0]:.2f} processes")
    assert comet_step > 0 and calc_step > 0
