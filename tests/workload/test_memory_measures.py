"""What each memory measure counts: nvidia-smi the whole footprint, max_reserved without the CUDA context
and NCCL's buffers, max_allocated the tensors only. Hand-computed on a tiny model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from comet.config.cluster import load_cluster
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig
from comet.validate.predict import ClusterCache, predict
from comet.validate.rows import derive_case
from comet.validate.runner import repo_root
from comet.workload.memory import estimate_memory
from comet.workload.memory_measures import communicators, measured_GB, outside_allocator_bytes

H100 = Path(__file__).resolve().parents[2] / "cluster_specs" / "h100_dgx.yaml"
# One NCCL connection: Simple 4,194,304 + LL 524,288 + LL128 4,915,200 = 9,633,792 B; 16 channels:
# 154,140,672 B per communicator. CUDA context 0.5e9.
PER_COMMUNICATOR = 16 * 9_633_792


@pytest.fixture(scope="module")
def tiny():
    return ModelSpec(name="tiny", layers=2, hidden=64, heads=4, vocab=1000, seq_len=128, ffn_hidden=256,
                     tied_embeddings=False, vocab_pad_to=1, linear_bias=False)


@pytest.fixture(scope="module")
def h100():
    return load_cluster(H100)


def test_one_communicator_per_parallel_group_of_more_than_one_rank(tiny):
    assert communicators(ParallelConfig(global_batch=8, dp=4).resolve(tiny)) == 1
    both = ParallelConfig(global_batch=8, tp=2, pp=2, dp=2, cp=2, zero=1).resolve(tiny)
    assert communicators(both) == 4
    assert outside_allocator_bytes(both) == pytest.approx(0.5e9 + 4 * PER_COMMUNICATOR)


def test_measures_split_the_workspace(tiny, h100):
    """dp 4: outside the allocator 0.5e9 + 154,140,672 = 654,140,672 B of the 2.0 GB workspace."""
    par = ParallelConfig(global_batch=8, dp=4, zero=3, fsdp=True).resolve(tiny)
    mem = estimate_memory(tiny, par, h100)
    assert measured_GB(mem, par, "nvidia_smi") == mem.total_GB
    assert measured_GB(mem, par, "max_reserved") == pytest.approx(mem.total_GB - 0.654140672, rel=1e-12)
    assert measured_GB(mem, par, "max_allocated") == pytest.approx(mem.total_GB - 2.0, rel=1e-12)
    assert measured_GB(mem, par, "max_active") == measured_GB(mem, par, "max_allocated")


def test_outside_part_is_capped_by_a_small_workspace(tiny, h100):
    par = ParallelConfig(global_batch=8, dp=4).resolve(tiny)
    mem = estimate_memory(tiny, par, replace(h100, workspace_GB=0.3))
    assert measured_GB(mem, par, "max_reserved") == pytest.approx(mem.total_GB - 0.3, rel=1e-12)
    with pytest.raises(ValueError, match="memory_measure"):
        measured_GB(mem, par, "peak")


def test_validate_predicts_each_row_in_its_measure():
    """The same run read as nvidia-smi, reserved and allocated: predictions step down by the NCCL/CUDA
    part, then by the allocator's cache (GiB: 1e9 / 2^30)."""
    cells = dict(source="test", model="Llama 3 8B", layers="32", hidden="4096", heads="32", kv_heads="8",
                 ffn_hidden="14336", activation="swiglu", seq_len="8192", vocab="128256", tied_embeddings="false",
                 gpu_model="h100-sxm-80gb", num_gpus="8", tp="1", pp="1", dp="8", micro_batch="1",
                 global_batch="8", recompute="selective", precision="bf16", framework="torchtitan",
                 framework_version="torchtitan 0.1.0", metric="memory_gib_per_gpu", value="40", unit="GiB")
    cache = ClusterCache(repo_root() / "cluster_specs")
    got = {m: predict(derive_case(dict(cells, memory_measure=m), 0), cache).predicted
           for m in ("nvidia_smi", "max_reserved", "max_allocated")}
    gib = 1e9 / 2 ** 30
    assert got["nvidia_smi"] - got["max_reserved"] == pytest.approx((0.5e9 + PER_COMMUNICATOR) / 1e9 * gib)
    assert got["nvidia_smi"] - got["max_allocated"] == pytest.approx(2.0 * gib)
