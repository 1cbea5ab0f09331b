"""The compiled compute cost model (comet/replay/compute_costs.py) equals comet/hardware/compute.py bit
for bit: on random GEMM, attention and memory-bound shapes (every shipped cluster, every precision,
FP8 and 16-bit GEMMs, FlashAttention-2 kernels), on shapes beyond int64's reach (left to Python), and
on every op of every block of every shipped model under many layouts; a block's table as the builder
writes it equals the one derived from its ops."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.cluster import load_cluster
from comet.config.model import load_model
from comet.config.parallel import OffloadTarget, ParallelConfig, Precision, Recompute
from comet.errors import ConfigError
from comet.graph.block import block_lists, block_table
from comet.graph.ir import KernelClass, Op, OpKind, Phase
from comet.graph.op_table import CODE, LEFT_OUT, ROW_WIDTH, TRANSFER, TableWriter
from comet.hardware.compute import compute_op_time_s
from comet.replay import blocks, cache, compute_costs
from comet.replay.timing import timed_s
from comet.workload.builder import build_blocks

pytestmark = pytest.mark.skipif(not compute_costs.HAVE_NUMBA, reason="numba not installed: the Python model only")

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted(p.stem for p in (ROOT / "comet" / "models").glob("*.yaml"))
CLUSTERS = [load_cluster(p) for p in sorted((ROOT / "cluster_specs").glob("*.yaml"))]
# an FA2-native variant (attention_fa2 > 0) of the first cluster with an efficiency block
FA2 = dataclasses.replace(CLUSTERS[0], efficiency=dataclasses.replace(CLUSTERS[0].efficiency, attention_fa2=0.3))
PRECISIONS = ("bf16", "fp16", "fp8")


def compiled(ops: list[Op], cluster, precision: str) -> list[float]:
    """kernel_times of `ops` (NaN where the Python model times an op), its count of NaN compute rows last."""
    table = TableWriter.of(ops).array([], [])
    return compute_costs.kernel_times(table, compute_costs.constants(cluster, precision)).tolist()


def python(op: Op, cluster, precision: str) -> float:
    try:
        return compute_op_time_s(op, cluster, precision)
    except ConfigError:       # a precision the GPU has no peak for: the compiled model leaves it to Python
        return math.nan


def assert_same(ops: list[Op], cluster, precision: str, must_compile: bool = True) -> None:
    *times, missed = compiled(ops, cluster, precision)
    for op, t in zip(ops, times):
        ref = python(op, cluster, precision)
        if math.isnan(t):
            assert not must_compile or math.isnan(ref), op
        else:
            assert t == ref, (op, t, ref)
    assert missed == sum(math.isnan(t) for t in times)


dims = st.integers(1, 1 << 17)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(dims, dims, dims, st.integers(1, 512), st.sampled_from((1, 2, 4))), min_size=1, max_size=8),
       st.sampled_from(CLUSTERS + [FA2]), st.sampled_from(PRECISIONS))
def test_gemms_equal_the_python_model_bit_for_bit(shapes, cluster, precision):
    ops = [Op("g", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=(m, n, k, b), dtype_bytes=d)
           for m, n, k, b, d in shapes]
    ops.append(Op("g3", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=shapes[0][:3]))   # no batch: 1
    assert_same(ops, cluster, precision)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((KernelClass.ATTENTION, KernelClass.MEMORY)),
                          st.floats(0, 1e18, allow_nan=False) | st.integers(0, 1 << 62),
                          st.sampled_from(list(Phase)), st.sampled_from(("", "fa2"))), min_size=1, max_size=8),
       st.sampled_from(CLUSTERS + [FA2]), st.sampled_from(PRECISIONS))
def test_attention_and_memory_kernels_equal_the_python_model_bit_for_bit(specs, cluster, precision):
    ops = [Op("k", OpKind.COMPUTE, kernel=kernel, flops=value, bytes=value, phase=phase, variant=variant)
           for kernel, value, phase, variant in specs]
    assert_same(ops, cluster, precision)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(*[st.integers(1, 1 << 40)] * 4), min_size=1, max_size=4), st.sampled_from(PRECISIONS))
def test_shapes_beyond_int64_are_left_to_python_or_equal(shapes, precision):
    cluster = CLUSTERS[0]
    ops = [Op("g", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=s) for s in shapes]
    assert_same(ops, cluster, precision, must_compile=False)


def test_what_the_table_leaves_out_is_nan():
    ops = [Op("measured", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=(8, 8, 8), duration_s=1.0),
           Op("float shape", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=(8.0, 8, 8)),
           Op("other", OpKind.COMPUTE, kernel=KernelClass.OTHER),
           Op("copy", OpKind.MEMCPY, bytes=1e6), Op("send", OpKind.SEND, msg_bytes=1e6)]
    *times, missed = compiled(ops, CLUSTERS[0], "bf16")
    assert all(math.isnan(t) for t in times) and missed == 0


def _layouts(model):
    base = dict(micro_batch=1, global_batch=4)
    for kw in (dict(tp=1), dict(tp=8, sequence_parallel=True, recompute=Recompute.FULL, zero=3),
               dict(tp=4, cp=2, recompute=Recompute.SELECTIVE, flash_attention=False),
               dict(tp=2, sequence_parallel=True, overlap_tp_comm=True, precision=Precision.FP8),
               dict(tp=2, sequence_parallel=True, precision=Precision.FP8, fp8_impl="torchao"),
               dict(tp=2, attention_kernel="fa2", offload=(OffloadTarget.WEIGHTS, OffloadTarget.ACTIVATIONS)),
               dict(tp=2, cp=4, sequence_parallel=True, zero=3, precision=Precision.FP8)):
        try:
            gpus = kw.get("tp", 1) * kw.get("cp", 1) * 2
            yield ParallelConfig(gpus=gpus, **base, **kw).resolve(model)
        except ConfigError:
            continue


@pytest.mark.parametrize("name", MODELS)
def test_every_op_of_every_shipped_model(name):
    model = load_model(name)
    layouts = list(_layouts(model))
    assert layouts
    compiled_ops = 0
    for par in layouts:
        precision = par.precision.value
        for key, g in build_blocks(model, par).items():
            ops, _ = block_lists(g)
            written, derived = block_table(g), TableWriter.of(ops)
            assert (written.rows, written.gemms) == (derived.rows, derived.gemms), key
            # the node ids noted as written: every TRANSFER and LEFT_OUT row, in order
            codes = written.rows[CODE::ROW_WIDTH]
            assert written.transfers == derived.transfers == [i for i, c in enumerate(codes) if c == TRANSFER], key
            assert written.left_out == derived.left_out == [i for i, c in enumerate(codes) if c == LEFT_OUT], key
            for cluster in CLUSTERS:
                if precision not in cluster.gpu.peak_tflops:
                    continue
                *times, _ = compiled(ops, cluster, precision)
                compiled_ops += sum(not math.isnan(t) for t in times)
                cache.clear()
                sig = cache.block_signature(g)
                every = blocks._durations([(g, sig, blocks._table(g, sig))], blocks._Context(cluster, precision))[0][0].value
                assert list(every) == [timed_s(op, cluster, precision) for op in ops], key
    assert compiled_ops > 0
    cache.clear()


def test_durations_with_and_without_numba_agree(monkeypatch, h100, tiny_model):
    par = ParallelConfig(tp=2, cp=2, gpus=8, global_batch=8, zero=3).resolve(tiny_model)
    expected = {}
    for numba in (True, False):
        monkeypatch.setattr(compute_costs, "HAVE_NUMBA", numba)
        cache.clear()
        got = {}
        for k, g in build_blocks(tiny_model, par).items():
            sig = cache.block_signature(g)
            got[k] = blocks._durations([(g, sig, blocks._table(g, sig))], blocks._Context(h100, "bf16"))[0][0].value
        assert expected.setdefault("durations", got) == got
    cache.clear()


def test_table_array_layout():
    writer = TableWriter.of([Op("g", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=(2, 3, 4, 5)),
                             Op("m", OpKind.COMPUTE, kernel=KernelClass.MEMORY, bytes=7.0)])
    table = writer.array([0], [1])
    assert table[:3].tolist() == [2, 1, 1]            # ops, GEMMs, edges
    assert table[-7:-2].tolist() == [2, 3, 4, 5, 2]   # the GEMM's m, n, k, batch, dtype bytes
    assert table[-2:].tolist() == [0, 1]              # the edge
    gemm = [Op("g", OpKind.COMPUTE, kernel=KernelClass.GEMM, shape=(2, 3, 4, 5))]
    assert compiled(gemm, CLUSTERS[0], "bf16")[:1] == [compute_op_time_s(gemm[0], CLUSTERS[0], "bf16")]


@pytest.mark.parametrize("name", ["gpt3_1t", "llama3_8b", "deepseek_v3"])
def test_blocks_timed_together_equal_each_apart(name):
    """kernel_times over several blocks' tables laid end to end, and blocks._durations over several
    blocks, equal each block timed alone (the cold call times a graph's new blocks together)."""
    model = load_model(name)
    for par in list(_layouts(model))[:6]:
        graphs = [g for g in build_blocks(model, par).values() if len(g)]
        tables = [block_table(g).array_of_edges(block_lists(g)[1]) for g in graphs]
        for cluster in CLUSTERS[:2]:
            precision = par.precision.value
            if precision not in cluster.gpu.peak_tflops:
                continue
            c = compute_costs.constants(cluster, precision)
            apart = [compute_costs.kernel_times(t, c) for t in tables]
            together = compute_costs.kernel_times(np.concatenate(tables), c)
            expected = np.concatenate([times[:-1] for times in apart] + [[sum(times[-1] for times in apart)]])
            assert np.array_equal(together, expected, equal_nan=True)
            cache.clear()
            batch = [(g, cache.block_signature(g)) for g in graphs]
            batch = [(g, sig, blocks._table(g, sig)) for g, sig in batch]
            joint = [dur.value for dur in blocks._durations(batch, blocks._Context(cluster, precision))[0]]
            cache.clear()
            assert joint == [blocks._durations([b], blocks._Context(cluster, precision))[0][0].value for b in batch]
    cache.clear()
