"""Candidate generation: provisioning, pruning before replay (counted by reason), dedupe, keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.search.candidates import CandidateFactory, grid, random_candidates
from comet.search.context import apply_provisioning
from comet.search.driver import RunOptions, build_context
from comet.search.space import grid_size, load_space, parse_space

from search_fakes import ROOT


def _factory(space):
    ctx, fp = build_context(space, RunOptions())
    return CandidateFactory(space, ctx, fp), ctx


def test_apply_provisioning_replaces_without_mutating(tiny_raw):
    space = parse_space(tiny_raw, str(ROOT / "search_spaces" / "tiny.yaml"))
    _, ctx = _factory(space)
    base = ctx.cluster
    prov = {"hbm_GB": 141.0, "hbm_bandwidth_GBps": 4800.0, "compute_scale": 2.0, "scaleup_size": 32,
            "scaleup_bandwidth_GBps": 900.0, "scaleout_bandwidth_GBps": 100.0, "oversubscription": 2.0,
            "expansion_GB": 512.0, "expansion_bandwidth_GBps": 200.0}
    c = apply_provisioning(base, prov)
    assert (c.gpu.hbm_GB, c.gpu.hbm_bandwidth_GBps) == (141.0, 4800.0)
    assert c.gpu.peak_tflops["bf16"] == pytest.approx(2 * base.gpu.peak_tflops["bf16"])
    assert (c.network[0].size, c.network[0].bandwidth_GBps) == (32, 900.0)
    assert (c.network[-1].bandwidth_GBps, c.network[-1].oversubscription) == (100.0, 2.0)
    assert (c.memory_expansion.capacity_GB, c.memory_expansion.bandwidth_GBps) == (512.0, 200.0)
    assert base.gpu.hbm_GB == 80 and base.network[0].size == 8 and base.memory_expansion is None
    assert apply_provisioning(c, {"expansion_GB": 0.0}).memory_expansion is None


def test_grid_counts_add_up_and_every_candidate_multiplies_out():
    space = load_space(ROOT / "search_spaces" / "gpt3_175b.yaml")
    factory, _ = _factory(space)
    cands = list(grid(space, factory))
    s = factory.stats
    assert s.proposed == grid_size(space)
    assert s.proposed == len(cands) + s.pruned + s.duplicates
    assert s.by_category["memory (HBM)"] > 0               # 175B does not fit at tp*pp = 8 without sharding more
    for c in cands:
        p = c.parallel
        assert p.tp * p.pp * p.dp * p.cp == p.gpus
        assert p.global_batch % (p.dp * p.micro_batch) == 0
    assert len({c.key for c in cands}) == len(cands)


def test_candidate_key_is_the_hash_of_the_whole_configuration():
    """The key, assembled from each configuration's memoized JSON, is the SHA-1 of the sorted JSON of
    (context fingerprint, every parallel field, provisioning): journals stay resumable."""
    import hashlib
    import json

    from comet.search.context import _parallel_dict
    space = load_space(ROOT / "search_spaces" / "gpt3_1t.yaml")
    factory, _ = _factory(space)
    cands = list(grid(space, factory))
    for c in cands[::97]:
        blob = json.dumps({"ctx": factory.fingerprint, "parallel": _parallel_dict(c.parallel),
                           "provision": list(c.provision)}, sort_keys=True, default=str)
        assert c.key == hashlib.sha1(blob.encode()).hexdigest()[:16]


def test_no_expansion_tier_is_one_candidate_at_any_bandwidth(tiny_raw):
    tiny_raw["cluster"].update(expansion_GB=[0, 512], expansion_bandwidth_GBps=[100, 200])
    tiny_raw["parallel"]["offload"] = ["none", "optimizer"]
    space = parse_space(tiny_raw, str(ROOT / "search_spaces" / "tiny.yaml"))
    factory, _ = _factory(space)
    cands = list(grid(space, factory))
    clusters = {c.provision for c in cands}
    assert len({dict(p).get("expansion_bandwidth_GBps") for p in clusters if dict(p)["expansion_GB"] == 0}) == 1
    assert factory.stats.duplicates == grid_size(space) // 4   # (0 GB, 200 GB/s) repeats (0 GB, 100 GB/s)
    assert factory.stats.by_category["offload without expansion tier"] > 0


def test_capex_and_gpu_constraints_prune(tiny_raw):
    tiny_raw["constraints"] = {"max_gpus": 64}
    space = parse_space(tiny_raw, str(ROOT / "search_spaces" / "tiny.yaml"))
    factory, _ = _factory(space)
    cands = list(grid(space, factory))
    assert cands and all(c.parallel.gpus == 64 for c in cands)
    assert factory.stats.by_category["constraint max_gpus"] == grid_size(space) // 2
    tiny_raw["constraints"] = {"max_capex_usd": 1.0}
    factory, _ = _factory(parse_space(tiny_raw, str(ROOT / "search_spaces" / "tiny.yaml")))
    assert list(grid(factory.space, factory)) == []
    assert factory.stats.by_category["constraint max_capex_usd"] > 0


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_random_sampling_is_deterministic_and_valid(seed):
    space = load_space(ROOT / "search_spaces" / "gpt3_175b.yaml")
    first = [c.key for _, c in zip(range(12), random_candidates(space, _factory(space)[0], seed))]
    again = [c.key for _, c in zip(range(12), random_candidates(space, _factory(space)[0], seed))]
    assert first == again and len(set(first)) == len(first)
