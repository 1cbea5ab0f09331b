"""The replay's shared work is invisible in results: cached evaluation equals uncached evaluation
exactly on random candidates (configuration x provisioned cluster), blocks shared by block_config are
the blocks the builder would build, and the compiled pipeline solver equals the numpy one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comet.config.model import Activation, ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Precision, Recompute, Schedule
from comet.errors import ConfigError
from comet.evaluate import evaluate
from comet.replay import cache
from comet.replay.kernels import HAVE_NUMBA
from comet.replay.pipeline import build_programs, solve, solve_numpy
from comet.search.context import apply_provisioning
from comet.workload.builder import build_blocks, build_stages, build_step_graph

MODELS = {
    "tiny": ModelSpec(name="tiny", layers=8, hidden=512, heads=8, vocab=4096, seq_len=256),
    "gqa": ModelSpec(name="gqa", layers=8, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, activation=Activation.SWIGLU,
                     vocab=8000, seq_len=512, tied_embeddings=False),
}

configs = st.fixed_dictionaries({
    "model": st.sampled_from(sorted(MODELS)),
    "tp": st.sampled_from([1, 2, 4]),
    "pp": st.sampled_from([1, 2, 4]),
    "cp": st.sampled_from([1, 1, 2]),
    "gpus": st.sampled_from([8, 16, 32]),
    "micro_batch": st.sampled_from([1, 2]),
    "global_batch": st.sampled_from([16, 32, 64]),
    "recompute": st.sampled_from(list(Recompute)),
    "zero": st.sampled_from([0, 1, 2, 3]),
    "fsdp": st.booleans(),
    "shard_grad_op": st.sampled_from([False, True]),   # valid with fsdp and zero 2 only
    "schedule": st.sampled_from(list(Schedule)),
    "vpp": st.sampled_from([1, 2]),
    "precision": st.sampled_from([Precision.BF16, Precision.FP8]),
    "flash_attention": st.booleans(),
    "overlap_tp_comm": st.booleans(),
    "overlap_grad_reduce": st.booleans(),
    "offload": st.sampled_from([(), (OffloadTarget.OPTIMIZER,), (OffloadTarget.ACTIVATIONS,)]),
})
provisions = st.fixed_dictionaries({
    "scaleup_size": st.sampled_from([4, 8]),
    "scaleout_bandwidth_GBps": st.sampled_from([25.0, 50.0]),
    "expansion_GB": st.sampled_from([0, 512]),
    "expansion_bandwidth_GBps": st.just(100.0),
    # clusters equal in network but not in compute or HBM share NIC loads and block timings (cache.py)
    "compute_scale": st.sampled_from([1.0, 2.25]),
    "hbm_GB": st.sampled_from([80.0, 141.0]),
})


def _par(cfg: dict) -> tuple[ModelSpec, ParallelConfig]:
    cfg = dict(cfg)
    return MODELS[cfg.pop("model")], ParallelConfig(**cfg)


def _same(a, b) -> None:
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    assert da == db or (da["status"] == db["status"] and _nan_equal(da, db)), (da, db)


def _nan_equal(da: dict, db: dict) -> bool:
    return all(x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)
               for x, y in zip(da.values(), db.values())) and da.keys() == db.keys()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cands=st.lists(st.tuples(configs, provisions), min_size=3, max_size=6))
def test_cached_evaluation_equals_uncached_on_random_candidates(cands, h100):
    # warm the caches with the whole list first, so later candidates hit blocks / durations / replays
    # that earlier (different) candidates left behind
    cache.clear()
    clusters = [apply_provisioning(h100, prov) for _, prov in cands]
    for (cfg, _), cluster in zip(cands, clusters):
        model, par = _par(cfg)
        evaluate(model, cluster, par)
    for (cfg, _), cluster in zip(cands, clusters):
        model, par = _par(cfg)
        cached = evaluate(model, cluster, par)
        with cache.disabled():
            reference = evaluate(model, cluster, par)
        _same(cached, reference)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfgs=st.lists(configs, min_size=1, max_size=3), provs=st.lists(provisions, min_size=3, max_size=6))
def test_cached_evaluation_equals_uncached_across_clusters(cfgs, provs, h100):
    # a search evaluates each configuration on many clusters: what the step shares between clusters that
    # differ only in the network (optimizer seconds, bucket readiness) or outside what ops read (the
    # task level's summary, the NIC share), and the resolved configuration, must be what a fresh
    # evaluation computes; the second pass evaluates every pair again, all from the caches
    cache.clear()
    clusters = [apply_provisioning(h100, prov) for prov in provs]
    for _ in range(2):
        for cfg in cfgs:
            model, par = _par(cfg)
            for cluster in clusters:
                cached = evaluate(model, cluster, par)
                with cache.disabled():
                    reference = evaluate(model, cluster, par)
                _same(cached, reference)


@settings(max_examples=80, deadline=None)
@given(cfg=configs)
def test_resolving_a_resolved_configuration_returns_it(cfg):
    """evaluate.resolve stores a resolved configuration under its own key too (comet.estimate resolves,
    then evaluate looks it up): exact only if resolving is idempotent."""
    model, par = _par(cfg)
    try:
        resolved = par.resolve(model)
    except ConfigError:
        return
    assert resolved.resolve(model) == resolved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs, prov=provisions, base_cfg=configs)
def test_plain_built_base_equals_the_transform(cfg, prov, base_cfg, h100):
    # evaluate() builds a candidate directly when the base is an untimed builder graph; the reference
    # (caches disabled) transforms the base as before
    model, par = _par(cfg)
    base_model, base_par = _par(dict(base_cfg, model=cfg["model"]))
    try:
        base = build_step_graph(model, base_par.resolve(base_model))
    except ConfigError:
        return
    cluster = apply_provisioning(h100, prov)
    cached = evaluate(model, cluster, par, base=base)
    with cache.disabled():
        reference = evaluate(model, cluster, par, base=base)
    _same(cached, reference)


def _signatures(blocks: dict) -> dict:
    return {k: cache.block_signature(g) for k, g in blocks.items()}


@settings(max_examples=60, deadline=None)
@given(a=configs, b=configs)
def test_equal_block_config_builds_equal_blocks(a, b):
    # the fields block_config() blanks out (global batch, gpus, pp, vpp, schedule, dp below ZeRO-3) must
    # not change a block: a builder that starts reading one of them fails here
    b = dict(a, **{k: b[k] for k in ("gpus", "global_batch", "pp", "vpp", "schedule", "overlap_grad_reduce")})
    (model, pa), (_, pb) = _par(a), _par(b)
    try:
        ra, rb = pa.resolve(model), pb.resolve(model)
    except ConfigError:
        return
    if cache.block_config(ra) != cache.block_config(rb):
        return
    assert _signatures(build_blocks(model, ra)) == _signatures(build_blocks(model, rb))


@settings(max_examples=80, deadline=None)
@given(a=configs, b=configs)
def test_block_config_equals_the_blanked_configuration(a, b):
    # block_config is a tuple of the fields it keeps: equal exactly where the configurations with the
    # blanked fields replaced (what it returned before, built with dataclasses.replace) are equal
    b = dict(a, **{k: b[k] for k in ("gpus", "global_batch", "pp", "vpp", "schedule", "zero", "recompute")})
    (model, pa), (_, pb) = _par(a), _par(b)
    try:
        ra, rb = pa.resolve(model), pb.resolve(model)
    except ConfigError:
        return

    def blanked(p):
        return dataclasses.replace(p, global_batch=1, gpus=None, dp=p.dp if p.per_module_dp_collectives else None, pp=1, vpp=1,
                       schedule=None)
    same = blanked(ra) == blanked(rb)
    assert (cache.block_config(ra) == cache.block_config(rb)) == same
    if same:
        assert hash(cache.block_config(ra)) == hash(cache.block_config(rb))


@settings(max_examples=40, deadline=None)
@given(a=configs, batch=st.sampled_from([16, 32, 64, 128]))
def test_equal_stage_config_builds_equal_stage_syncs(a, batch):
    # evaluate._built shares stage syncs between configurations equal but for the global batch
    # (cache.stage_config): a stage sync that starts reading it fails here
    (model, pa), (_, pb) = _par(a), _par(dict(a, global_batch=batch))
    try:
        ra, rb = pa.resolve(model), pb.resolve(model)
    except ConfigError:
        return
    assert cache.stage_config(ra) == cache.stage_config(rb)
    assert build_stages(model, ra) == build_stages(model, rb)


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 4, 1, 8), ("gpipe", 3, 1, 5), ("interleaved_1f1b", 4, 2, 8),
                                               ("1f1b", 8, 1, 3), ("interleaved_1f1b", 2, 3, 4), ("1f1b", 1, 1, 4)])
def test_compiled_solver_equals_numpy_sweeps(schedule, pp, vpp, m):
    rng = np.random.default_rng(pp * 100 + vpp * 10 + m)
    f, b = rng.uniform(0.5, 2.0, (pp, vpp)), rng.uniform(1.0, 4.0, (pp, vpp))
    release = np.where(rng.random((pp, vpp)) < 0.5, rng.uniform(0, 3, (pp, vpp)), 0.0)
    prog = build_programs(schedule, pp, vpp, m, f, b, release)
    np.testing.assert_allclose(solve(prog), solve_numpy(prog), rtol=1e-12, atol=0)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed: the numpy solver is the only one")
def test_compiled_solver_reports_a_cycle():
    prog = build_programs("1f1b", 2, 1, 2, np.ones((2, 1)), np.ones((2, 1)))
    bad = dataclasses.replace(prog, src=prog.src.copy())
    bad.src[0] = 1                       # stage 0's first forward waits for a later task of its own chain
    with pytest.raises(Exception, match="did not converge"):
        solve(bad)


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 4, 1, 8), ("gpipe", 3, 1, 5), ("interleaved_1f1b", 4, 2, 8),
                                               ("1f1b", 8, 1, 3), ("interleaved_1f1b", 2, 3, 4), ("1f1b", 1, 1, 4),
                                               ("interleaved_1f1b", 4, 1, 6), ("interleaved_1f1b", 3, 2, 6)])
def test_one_pass_pipeline_equals_programs_then_solve(schedule, pp, vpp, m):
    from comet.replay.pipeline import last_backward, run
    rng = np.random.default_rng(pp * 1000 + vpp * 10 + m)
    f, b = rng.uniform(0.5, 2.0, (pp, vpp)), rng.uniform(1.0, 4.0, (pp, vpp))
    release = np.where(rng.random((pp, vpp)) < 0.5, rng.uniform(0, 3, (pp, vpp)), 0.0)
    ref = build_programs(schedule, pp, vpp, m, f, b, release)
    prog, end = run(schedule, pp, vpp, m, f, b, release)
    for name in ("phase", "chunk", "mb", "dur", "src", "release", "offset"):
        np.testing.assert_array_equal(getattr(prog, name), getattr(ref, name), err_msg=name)
    np.testing.assert_array_equal(prog.last_b, last_backward(schedule, pp, vpp, m))
    if HAVE_NUMBA:
        np.testing.assert_array_equal(end, solve(ref))            # the same arithmetic, bit for bit
    np.testing.assert_allclose(end, solve_numpy(ref), rtol=1e-12, atol=0)


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 4, 1, 8), ("gpipe", 3, 1, 5), ("interleaved_1f1b", 4, 2, 8),
                                               ("1f1b", 8, 1, 3), ("interleaved_1f1b", 2, 3, 4)])
def test_compiled_summary_equals_the_task_arrays(schedule, pp, vpp, m):
    from comet.replay.pipeline import run, summarize, summarize_tasks
    rng = np.random.default_rng(pp * 7 + vpp * 3 + m)
    f, b = rng.uniform(0.5, 2.0, (pp, vpp)), rng.uniform(1.0, 4.0, (pp, vpp))
    release = np.where(rng.random((pp, vpp)) < 0.5, rng.uniform(0, 3, (pp, vpp)), 0.0)
    fast = summarize(schedule, pp, vpp, m, f, b, release)
    ref = summarize_tasks(*run(schedule, pp, vpp, m, f, b, release))
    for name in ("compute_end", "last_b_start", "bubble", "gather_wait"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed: the numpy solver is the only one")
@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 4, 1, 8), ("gpipe", 3, 1, 5), ("interleaved_1f1b", 4, 2, 8),
                                               ("1f1b", 8, 1, 3), ("interleaved_1f1b", 2, 3, 4), ("1f1b", 1, 1, 4),
                                               ("interleaved_1f1b", 3, 2, 6)])
def test_replay_in_recorded_order_equals_the_sweep_bit_for_bit(schedule, pp, vpp, m):
    # the second candidate of a pipeline shape replays the visit order the first one recorded: other
    # durations and releases, the same figures as the sweep computes for them
    from comet.replay.pipeline import summarize
    rng = np.random.default_rng(pp * 11 + vpp * 5 + m)
    cache.clear()
    for _ in range(3):
        f, b = rng.uniform(0.5, 2.0, (pp, vpp)), rng.uniform(1.0, 4.0, (pp, vpp))
        release = np.where(rng.random((pp, vpp)) < 0.5, rng.uniform(0, 3, (pp, vpp)), 0.0)
        cached = summarize(schedule, pp, vpp, m, f, b, release)
        with cache.disabled():
            swept = summarize(schedule, pp, vpp, m, f, b, release)
        for name in ("compute_end", "last_b_start", "bubble", "gather_wait"):
            np.testing.assert_array_equal(getattr(cached, name), getattr(swept, name), err_msg=name)
    assert cache.orders.hits >= 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs, prov=provisions)
def test_numpy_fallback_equals_compiled_path(cfg, prov, h100, monkeypatch):
    from comet.replay import pipeline
    model, par = _par(cfg)
    cluster = apply_provisioning(h100, prov)
    compiled = evaluate(model, cluster, par)
    with monkeypatch.context() as mp:
        mp.setattr(pipeline, "HAVE_NUMBA", False)
        fallback = evaluate(model, cluster, par)
    assert compiled.status == fallback.status
    if compiled.feasible:
        assert fallback.step_time_s == pytest.approx(compiled.step_time_s, rel=1e-12)
        for k, v in compiled.breakdown.items():
            assert fallback.breakdown[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_cost_models_read_only_the_fields_their_cache_keys_hold(h100):
    # op durations are shared between clusters with equal cache.timing_key (network costs: equal
    # network_key); a cost model that starts reading another field of the cluster must fail here until
    # the field is added to cache.COMPUTE_FIELDS / NETWORK_FIELDS
    from types import SimpleNamespace

    from comet.graph.ir import OpKind
    from comet.replay.timing import op_time_s
    model, par = _par({"model": "gqa", "tp": 2, "pp": 2, "cp": 2, "gpus": 32, "micro_batch": 1, "global_batch": 32,
                       "recompute": Recompute.SELECTIVE, "zero": 1, "schedule": Schedule.ONE_F_ONE_B, "vpp": 1,
                       "precision": Precision.BF16, "flash_attention": True, "overlap_tp_comm": False,
                       "overlap_grad_reduce": True, "offload": (OffloadTarget.OPTIMIZER,)})
    cluster = apply_provisioning(h100, {"expansion_GB": 512, "expansion_bandwidth_GBps": 100.0})
    graph = build_step_graph(model, par.resolve(model))
    ops = [op for g in graph.blocks.values() for _, op in g.nodes(data="op")]
    ops += [bs.op for st in graph.stages for bs in st.grad_buckets + st.param_gathers] + [
        op for st in graph.stages for op in st.optimizer]
    # communication reads only the network, kernels and copies only the GPU side (blocks.py keys them apart)
    network = SimpleNamespace(**{f: getattr(cluster, f) for f in cache.NETWORK_FIELDS}, levels=cluster.levels)
    gpu_side = SimpleNamespace(**{f: getattr(cluster, f) for f in cache.COMPUTE_FIELDS})
    kinds = set()
    with cache.disabled():
        for op in ops:
            only = network if op.kind in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV) else gpu_side
            assert op_time_s(op, only, "bf16") == op_time_s(op, cluster, "bf16"), op.name
            kinds.add(op.kind)
    assert {OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.MEMCPY} <= kinds and kinds & {OpKind.SEND, OpKind.RECV}


def test_memory_estimate_reads_only_the_fields_its_cache_key_holds(h100):
    # evaluate() shares a configuration's memory estimate between clusters with equal cache.memory_key;
    # an estimate that starts reading another field of the cluster must fail here until the field is
    # added to cache.MEMORY_FIELDS
    from types import SimpleNamespace

    from comet.workload.memory import estimate_memory
    for offload, expansion_GB, gpus in (((OffloadTarget.OPTIMIZER,), 512, 32), ((OffloadTarget.ACTIVATIONS,), 0, 8),
                                         ((), 0, 8)):
        model, par = _par({"model": "gqa", "tp": 2, "pp": 2, "cp": 1, "gpus": gpus, "micro_batch": 2,
                           "global_batch": 32, "recompute": Recompute.NONE, "zero": 1,
                           "schedule": Schedule.ONE_F_ONE_B, "vpp": 1, "precision": Precision.BF16,
                           "flash_attention": False, "overlap_tp_comm": False, "overlap_grad_reduce": True,
                           "offload": offload})
        for hbm_GB in (0.5, 80.0):   # does not fit (a reason quoting the cluster), fits
            cluster = apply_provisioning(h100, {"expansion_GB": expansion_GB, "expansion_bandwidth_GBps": 100.0,
                                                "hbm_GB": hbm_GB})
            only = SimpleNamespace(**{f: getattr(cluster, f) for f in cache.MEMORY_FIELDS})
            with cache.disabled():
                assert estimate_memory(model, par.resolve(model), only) == estimate_memory(model, par.resolve(model),
                                                                                           cluster)
