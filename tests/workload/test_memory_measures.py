"""What each memory measure counts: nvidia-smi the whole footprint, max_reserved without the CUDA context
and NCCL's buffers, max_allocated the tensors only. Hand-computed on a tiny model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from comet.config.parallel import ParallelConfig
from comet.validate.predict import ClusterCache, predict
from comet.validate.rows import derive_case
from comet.validate.runner import repo_root
from comet.workload.memory import estimate_memory
from comet.workload.memory_measures import (
    communicator_channels,
    measured_GB,
    outside_allocator_bytes,
    parallel_groups,
)

# One NCCL connection: Simple 4,194,304 + LL 524,288 + LL128 4,915,200 = 9,633,792 B. A communicator
# inside an H100 node has 24 channels (NCCL: 18 NVLinks x 20.6 GB/s hold 6 rings of 60 GB/s, duplicated
# and doubled): 231,211,008 B. CUDA context 0.5e9.
CONNECTION = 9_633_792
PER_COMMUNICATOR = 24 * CONNECTION



def test_one_communicator_per_parallel_group_with_nccl_channels(tiny, h100):
    """tp, cp, dp of 2 inside an 8-GPU node: 24 channels each; pp of 2 at stride 8 crosses nodes, one
    GPU per node on a 50 GB/s NIC: one ring of 48 GB/s, duplicated (<= 4 rings) and doubled: 4."""
    assert parallel_groups(ParallelConfig(global_batch=8, dp=4).resolve(tiny)) == [(4, 1)]
    both = ParallelConfig(global_batch=8, tp=2, pp=2, dp=2, cp=2, zero=1).resolve(tiny)
    assert parallel_groups(both) == [(2, 1), (2, 2), (2, 4), (2, 8)]
    assert [communicator_channels(h100, n, s) for n, s in parallel_groups(both)] == [24, 24, 24, 4]
    assert outside_allocator_bytes(both, h100) == pytest.approx(0.5e9 + 76 * CONNECTION)
    assert communicator_channels(h100, 32, 1) == 16    # 8 GPUs a node, each its NIC: 8 rings, doubled


def test_measures_split_the_workspace(tiny, h100):
    """dp 4: outside the allocator 0.5e9 + 231,211,008 = 731,211,008 B of the 2.0 GB workspace."""
    par = ParallelConfig(global_batch=8, dp=4, zero=3, fsdp=True).resolve(tiny)
    mem = estimate_memory(tiny, par, h100)
    assert measured_GB(mem.total_GB, par, h100, "nvidia_smi") == mem.total_GB
    assert measured_GB(mem.total_GB, par, h100, "max_reserved") == pytest.approx(mem.total_GB - 0.731211008, rel=1e-12)
    assert measured_GB(mem.total_GB, par, h100, "max_allocated") == pytest.approx(mem.total_GB - 2.0, rel=1e-12)
    assert measured_GB(mem.total_GB, par, h100, "max_active") == measured_GB(mem.total_GB, par, h100, "max_allocated")


def test_outside_part_is_capped_by_a_small_workspace(tiny, h100):
    par = ParallelConfig(global_batch=8, dp=4).resolve(tiny)
    small = replace(h100, workspace_GB=0.3)
    mem = estimate_memory(tiny, par, small)
    assert measured_GB(mem.total_GB, par, small, "max_reserved") == pytest.approx(mem.total_GB - 0.3, rel=1e-12)
    with pytest.raises(ValueError, match="memory_measure"):
        measured_GB(mem.total_GB, par, small, "peak")


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
