"""TP communication overlap as Transformer Engine's userbuffers run it (TE 1.11 module/base.py
initialize_ub): ring exchange for the sequence-parallel all-gathers feeding qkv / fc1 (forward) and proj /
fc2 (dgrad), the rank's own shard computed first; the proj / fc2 reduce-scatter in 4 chunks; under TE FP8
the shard is cast once and gathered in FP8 (with or without userbuffers)."""

import pytest

from comet.config.parallel import ParallelConfig, Precision
from comet.graph.ir import Collective, KernelClass
from comet.workload import layers
from comet.workload.layer_parts import TP_RS_SPLITS

T, H, TP = 128, 64, 4     # tokens per micro-batch (seq 128, mb 1), hidden, tensor parallel


def _ops(graph):
    return {op.name: (n, op) for n, op in graph.nodes(data="op")}


def _par(tiny, **kw):
    base = dict(tp=TP, gpus=TP, global_batch=1, sequence_parallel=True, overlap_tp_comm=True)
    return ParallelConfig(**{**base, **kw}).resolve(tiny)


def _gathers(ops, prefix):
    return [op for name, (_, op) in ops.items()
            if name.startswith(prefix + ".all_gather[") and op.collective is Collective.ALL_GATHER]


def test_ring_exchange_computes_the_own_shard_first(tiny):
    g = layers.layer_forward(tiny, _par(tiny))
    ops = _ops(g)
    first, _ = ops["qkv[0]"]
    # the first chunk waits for no gather: it is the rank's own shard
    assert not any(g.nodes[p]["op"].collective for p in g.predecessors(first))
    steps = _gathers(ops, "qkv")
    assert len(steps) == TP - 1
    # each ring step delivers one shard: an all-gather of msg/(tp-1) gives (tp-1)/tp of it to each rank
    shard = T * H * 2 / TP
    for op in steps:
        assert op.msg_bytes * (TP - 1) / TP == pytest.approx(shard)
    # in all, what one unsplit all-gather would deliver: (tp-1)/tp of the gathered input
    assert sum(op.msg_bytes * (TP - 1) / TP for op in steps) == pytest.approx(T * H * 2 * (TP - 1) / TP)


def test_fp8_gathers_move_fp8_and_cast_the_shard_once(tiny):
    g = layers.layer_forward(tiny, _par(tiny, precision=Precision.FP8))
    ops = _ops(g)
    for op in _gathers(ops, "qkv") + _gathers(ops, "fc1"):
        assert op.msg_bytes == pytest.approx(T * H * 1 / (TP - 1))        # 1 byte per element
    casts = [op for name, (_, op) in ops.items() if name.startswith("qkv") and ".fp8_" in name]
    assert len(casts) == 1 and casts[0].bytes == pytest.approx(T // TP * H * (2 + 1 + 1))   # shard: read 2, write 1 + 1
    # torchao keeps BF16 gathers (it casts after the gather) and casts per chunk
    ao = _ops(layers.layer_forward(tiny, _par(tiny, precision=Precision.FP8, fp8_impl="torchao")))
    assert all(op.msg_bytes == pytest.approx(T * H * 2 / (TP - 1)) for op in _gathers(ao, "qkv"))
    # without userbuffers TE still gathers the FP8 norm output (LayerNormLinear), one gather
    plain = _ops(layers.layer_forward(tiny, _par(tiny, precision=Precision.FP8, overlap_tp_comm=False)))
    assert plain["qkv.all_gather"][1].msg_bytes == pytest.approx(T * H * 1)


def test_row_parallel_dgrad_gathers_by_ring_exchange(tiny):
    bf16 = _ops(layers.layer_backward(tiny, _par(tiny)))
    assert len(_gathers(bf16, "fc2.dgrad")) == TP - 1 and len(_gathers(bf16, "proj.dgrad")) == TP - 1
    fp8 = _ops(layers.layer_backward(tiny, _par(tiny, precision=Precision.FP8)))
    # the saved input re-gathered for the wgrad (TE bulk overlap, FP8 buffer) and the dgrad ring steps
    assert fp8["qkv.all_gather_input"][1].msg_bytes == pytest.approx(T * H * 1)
    assert bf16["qkv.all_gather_input"][1].msg_bytes == pytest.approx(T * H * 2)
    assert all(op.msg_bytes == pytest.approx(T * H / (TP - 1)) for op in _gathers(fp8, "fc2.dgrad"))
    # without overlap: one gather of the output gradient before the dgrad, FP8 under TE (cast on the shard)
    plain = _ops(layers.layer_backward(tiny, _par(tiny, precision=Precision.FP8, overlap_tp_comm=False)))
    assert plain["fc2.dgrad.all_gather"][1].msg_bytes == pytest.approx(T * H * 1)
    assert plain["fc2.dgrad.fp8_cast_transpose"][1].bytes == pytest.approx(T // TP * H * 4)
    plain16 = _ops(layers.layer_backward(tiny, _par(tiny, overlap_tp_comm=False)))
    assert plain16["fc2.dgrad.all_gather"][1].msg_bytes == pytest.approx(T * H * 2)


def test_output_layer_gathers_stay_bf16(tiny):
    head = _ops(layers.head_forward(tiny, _par(tiny, precision=Precision.FP8)))
    assert all(op.msg_bytes == pytest.approx(T * H * 2 / (TP - 1)) for op in _gathers(head, "logits"))
    assert not any(".fp8_" in name for name in head)
    assert all(op.dtype_bytes == 2 for _, op in head.values() if op.kernel is KernelClass.GEMM)


def test_row_parallel_reduce_scatter_pipelines_in_four_chunks_whatever_the_tp(tiny):
    """TE's `pipeline` method for proj_fprop / fc2_fprop splits the GEMM into 4 chunks (num_splits 4),
    not tp: at tp 2 as at tp 4, four GEMM chunks of T/4 rows, each followed by its reduce-scatter."""
    for tp in (2, 4):
        ops = _ops(layers.layer_forward(tiny, _par(tiny, tp=tp, gpus=tp)))
        rs = [op for name, (_, op) in ops.items() if name.startswith("fc2.reduce_scatter[")]
        gemms = [op for name, (_, op) in ops.items() if name.startswith("fc2[")]
        assert len(rs) == len(gemms) == TP_RS_SPLITS == 4
        assert all(op.msg_bytes == pytest.approx(T * H * 2 / 4) for op in rs)
        assert all(op.shape[0] == T // 4 for op in gemms)
