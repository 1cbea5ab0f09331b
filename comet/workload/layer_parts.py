"""The pieces a transformer layer's blocks are made of, on the block builder (block_builder.py):
tensor-parallel GEMMs with their collectives (Megatron-LM's column- and row-parallel linears, with and
without sequence parallelism and TP comm overlap) and their backward, norms, bias-dropout-add, the
attention core (flash, ring attention under context parallelism, unfused), flash-attn's unpad copies,
the dense MLP and the attention sub-layer. Each takes the ops the next kernel depends on and returns
the new list."""

from __future__ import annotations

from comet.graph.ir import Collective, GroupKind
from comet.hardware.compute import FLASH_BWD_FLOP_RATIO
from comet.workload.block_builder import ACT_BYTES, FP8_BYTES, BlockBuilder, Deps, Dims

# Transformer Engine's userbuffers overlap of proj_fprop / fc2_fprop: method `pipeline`, the GEMM split
# into 4 chunks whatever the TP size (TE 1.11 module/base.py initialize_ub: `"num_splits": 4 if method ==
# "pipeline" else tp_size`; NeMo 2.0 recipes/tp_overlap_configs/userbuffers.py: PipelineOverlapCfg(...,
# num_splits=4) for every H100 shape it lists)
TP_RS_SPLITS = 4

# perf: enum members bound once (a member read through its class is ~0.13 us on Python 3.11; a GPT layer's
# blocks read ~30)
_ALL_GATHER, _ALL_REDUCE, _REDUCE_SCATTER = Collective.ALL_GATHER, Collective.ALL_REDUCE, Collective.REDUCE_SCATTER
_TP, _CP = GroupKind.TP, GroupKind.CP


def tp_in(bb: BlockBuilder, D: Dims, name: str, m: int, n: int, k: int, deps: Deps) -> Deps:
    """Column-parallel GEMM whose m x k input is all-gathered first under sequence parallelism; with
    overlap_tp_comm the gather and the GEMM are split into tp chunks and pipelined as Transformer
    Engine's userbuffers ring exchange runs them (TE 1.11 initialize_ub: method `ring_exchange` for
    qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; `UbufP2PCommOverlap::split_overlap_ag`): the first
    chunk is the rank's own shard, computed while it is sent on, and each of the tp - 1 ring steps
    brings one shard (1/tp of the gathered input) for the next chunk. Under FP8 the shard is cast once
    and gathered in FP8 (BlockBuilder.fp8_gather)."""
    if not D.sp:
        return [bb.gemm(name, m, n, k, deps)]
    fp8 = bb.fp8_gather(name)
    if fp8:   # TE casts the rank's own shard, then gathers FP8
        deps = bb._fp8_casts(name, m // D.t, n, k, deps)
    msg = m * k * (FP8_BYTES if fp8 else ACT_BYTES)
    if not bb.par.overlap_tp_comm:
        ag = bb.collective(f"{name}.all_gather", _ALL_GATHER, msg, _TP, deps)
        return [bb.gemm(name, m, n, k, [ag], cast_done=fp8)]
    prev = bb.gemm(f"{name}[0]", m // D.t, n, k, deps, cast_done=fp8)
    for j in range(1, D.t):
        # an all-gather of msg / (tp - 1) delivers (tp - 1) / tp of it to each rank: one shard, msg / tp
        step = bb.collective(f"{name}.all_gather[{j}]", _ALL_GATHER, msg / (D.t - 1), _TP, deps)
        prev = bb.gemm(f"{name}[{j}]", m // D.t, n, k, [step, prev], cast_done=fp8)
    return [prev]


def tp_out(bb: BlockBuilder, D: Dims, name: str, m: int, n: int, k: int, deps: Deps) -> Deps:
    """Row-parallel GEMM followed by the reduction of its partial sums over the TP group; with
    overlap_tp_comm (under sequence parallelism) the GEMM and its reduce-scatter are pipelined in
    TP_RS_SPLITS chunks, the last chunk's reduce-scatter exposed."""
    if D.t == 1:
        return [bb.gemm(name, m, n, k, deps)]
    msg = D.T * D.h * ACT_BYTES
    kind = _REDUCE_SCATTER if D.sp else _ALL_REDUCE
    if not (D.sp and bb.par.overlap_tp_comm):
        g = bb.gemm(name, m, n, k, deps)
        return [bb.collective(f"{name}.{kind._value_}", kind, msg, _TP, [g])]
    tail = []
    for j in range(TP_RS_SPLITS):
        g = bb.gemm(f"{name}[{j}]", m // TP_RS_SPLITS, n, k, deps)
        tail = [bb.collective(f"{name}.{kind._value_}[{j}]", kind, msg / TP_RS_SPLITS, _TP, [g])]
    return tail


def grad_in(bb: BlockBuilder, D: Dims, name: str, deps: Deps) -> Deps:
    """The backward of a reduce-scatter is an all-gather of the output gradient (sequence parallelism)."""
    if not D.sp:
        return deps
    return [bb.collective(f"{name}.all_gather_grad", _ALL_GATHER, D.T * D.h * ACT_BYTES,
                          _TP, deps)]


def row_backward(bb: BlockBuilder, D: Dims, name: str, n_in: int, deps: Deps) -> Deps:
    """Backward of a row-parallel GEMM (input width n_in per rank, output h): dgrad and wgrad. Under
    sequence parallelism the output gradient is all-gathered for the dgrad as a column-parallel input is
    in the forward (tp_in: in FP8 under TE; with overlap_tp_comm the dgrad's ring exchange, proj_dgrad /
    fc2_dgrad, TE `_Linear.backward` with `ub_overlap_ag`)."""
    if D.sp:
        dgrad = tp_in(bb, D, f"{name}.dgrad", D.T, n_in, D.h, deps)[0]
        return [dgrad, bb.gemm(f"{name}.wgrad", n_in, D.h, D.T, [dgrad])]
    dgrad = bb.gemm(f"{name}.dgrad", D.T, n_in, D.h, deps)
    wgrad = bb.gemm(f"{name}.wgrad", n_in, D.h, D.T, [dgrad])
    return [dgrad, wgrad]


def col_backward(bb: BlockBuilder, D: Dims, name: str, n_out: int, deps: Deps) -> Deps:
    """Backward of a column-parallel GEMM (input width h, output n_out per rank): the dgrad's
    all-reduce / reduce-scatter overlaps the wgrad (Megatron's async grad reduction); under sequence
    parallelism the layer input is re-gathered for the wgrad while the dgrad runs."""
    # the saved input re-gathered for the wgrad: FP8 under TE (BlockBuilder.fp8_gather)
    ag_bytes = FP8_BYTES if bb.fp8_gather(name) else ACT_BYTES
    regather = ([bb.collective(f"{name}.all_gather_input", _ALL_GATHER, D.T * D.h * ag_bytes,
                               _TP, deps)] if D.sp else [])
    dgrad = bb.gemm(f"{name}.dgrad", D.T, D.h, n_out, deps)
    wgrad = bb.gemm(f"{name}.wgrad", n_out, D.h, D.T, [dgrad] + regather)
    if D.t == 1:
        return [wgrad]
    kind = _REDUCE_SCATTER if D.sp else _ALL_REDUCE
    red = bb.collective(f"{name}.dgrad.{kind._value_}", kind, D.T * D.h * ACT_BYTES, _TP, [dgrad])
    return [wgrad, red]


def norm(bb: BlockBuilder, D: Dims, name: str, deps: Deps, backward: bool = False) -> Deps:
    """LayerNorm / RMSNorm: reads and writes Ts x h (backward also reads the output gradient)."""
    return [bb.memory(name, D.Ts * D.h * ACT_BYTES * (3 if backward else 2), deps)]


def dropout_add(bb: BlockBuilder, D: Dims, name: str, deps: Deps) -> Deps:
    """Bias-dropout-add: reads input and residual, writes output and a 1-byte mask (Korthikanti sec. 4.1)."""
    return [bb.memory(name, D.Ts * D.h * (3 * ACT_BYTES + 1), deps)]


def _ring_merge_bytes(D: Dims, step: int, backward: bool) -> float:
    """HBM traffic of merging ring-attention step `step` into the running result, as Transformer
    Engine's AttnFuncWithCP does it (TE 1.9 transformer_engine/pytorch/attention.py; the same in TE 2.4
    attention/dot_product_attention/context_parallel.py): forward, `flash_attn_fwd_out_correction`
    rescales the step's partial output by exp(lse_step - lse) and adds it into the output (read partial,
    read and write output: 3 passes over this rank's T x heads*d in the activation dtype; the first
    step's `_init` writes it: 2); backward, `dq.add_(dq_)` and `dkv.add_(dkv_)` (3 passes each; the
    first step copies: 2). The last rank merges every step in full (the others only half of the
    steps after their own position). The softmax-statistics correction (T x heads fp32) is negligible."""
    passes = 2 if step == 0 else 3
    q_out = D.T * D.heads * D.d * ACT_BYTES
    if not backward:
        return passes * q_out
    kv = D.T * 2 * (D.kv // D.t) * ACT_BYTES
    return passes * (q_out + kv)


def attention_core(bb: BlockBuilder, D: Dims, deps: Deps, backward: bool) -> Deps:
    """Scores and values for this rank's heads and tokens against the whole (causal) sequence."""
    name = "attention.bwd" if backward else "attention"
    if bb.par.flash_attention:
        # Causal: each query sees on average half the keys; with load-balanced context parallelism
        # every rank does 1/cp of the full causal work (Megatron-Core CP).
        flops = 4.0 * D.heads * D.T * D.s * D.d * 0.5 * (FLASH_BWD_FLOP_RATIO if backward else 1.0)
        shape = (D.b * D.heads, D.T // D.b, D.s, D.d)
        if D.cp == 1:
            return [bb.attention(name, flops, shape, deps)]
        # Ring attention: cp steps; step j uses the K/V block received in step j-1 (K and V, and in
        # backward also their gradients, travel around the CP ring).
        kv_block = D.T * 2 * (D.kv // D.t) * ACT_BYTES * (2 if backward else 1)
        step, arrived = None, None   # the previous attention chunk and the transfer it handed on
        for j in range(D.cp):
            waits = deps + [x for x in (step, arrived) if x is not None]
            if j < D.cp - 1:   # node id 0 is a valid node: compare with None, not by truth
                sent_after = deps + ([arrived] if arrived is not None else [])
                transfer = bb.send(f"{name}.cp_exchange[{j}]", kv_block, _CP, sent_after)
            else:
                transfer = None
            step = bb.attention(f"{name}[{j}]", flops / D.cp, shape, waits)
            step = bb.memory(f"{name}.cp_merge[{j}]", _ring_merge_bytes(D, j, backward), [step])
            arrived = transfer
        return [step]
    # Unfused (Megatron before flash attention): batched QK^T and PV GEMMs over the full square, and
    # softmax + mask + dropout over b*heads*(s/cp)*s scores (T already counts the micro-batch; 2-byte
    # scores, 1-byte mask; Korthikanti sec. 4.1).
    scores = D.heads * D.T * D.s
    passes = 2 if backward else 1
    g1 = [bb.gemm(f"{name}.qk", D.T // D.b, D.s, D.d, deps, batch=D.b * D.heads) for _ in range(passes)]
    sm = [bb.memory(f"{name}.softmax_dropout", scores * (7 if backward else 5), g1)]
    return [bb.gemm(f"{name}.pv", D.T // D.b, D.d, D.s, sm, batch=D.b * D.heads) for _ in range(passes)][-1:]




def dense_mlp_forward(bb: BlockBuilder, D: Dims, x: Deps, name: str = "") -> Deps:
    """Column-parallel FC1, activation, row-parallel FC2 (`name` prefixes the ops, e.g. shared experts)."""
    x = tp_in(bb, D, f"{name}fc1", D.T, D.gate * D.f // D.t, D.h, x)
    x = [bb.memory(f"{name}{D.act}", D.T * D.f // D.t * ACT_BYTES * (D.gate + 1), x)]
    return tp_out(bb, D, f"{name}fc2", D.T, D.h, D.f // D.t, x)


def dense_mlp_backward(bb: BlockBuilder, D: Dims, x: Deps, name: str = "") -> Deps:
    x = row_backward(bb, D, f"{name}fc2", D.f // D.t, x)
    x = [bb.memory(f"{name}{D.act}.bwd", D.T * D.f // D.t * ACT_BYTES * (2 * D.gate + 1), x)]
    return col_backward(bb, D, f"{name}fc1", D.gate * D.f // D.t, x)


def unpad_copies(bb: BlockBuilder, D: Dims, x: Deps, backward: bool, before: bool) -> Deps:
    """The copies into and out of flash-attn's packed (varlen) layout where the framework makes them
    (ParallelConfig.attention_unpad; flash-attn 2.3.2 flash_attn/bert_padding.py IndexFirstAxis,
    IndexPutFirstAxis). Forward, before the kernel: `index_first_axis` gathers Q, K and V (torch.gather:
    read 2 + write 2 B per element); after it, `pad_input` zero-fills the padded output and index-puts into
    it (2 + 2 + 2). Backward, before: the output gradient gathered back (`grad_output[indices]`, 2 + 2);
    after: Q, K and V gradients zero-filled and scattered (`torch.zeros` + `scatter_`, 2 + 2 + 2 each). Per rank the
    tensors are T x q/t (Q, output) and T x kv/t (K, V)."""
    if not bb.par.attention_unpad:
        return x
    q, kv = D.T * D.q // D.t, D.T * D.kv // D.t
    if before:
        nbytes = q * 2 * ACT_BYTES if backward else (q + 2 * kv) * 2 * ACT_BYTES
        return [bb.memory("attention.pad_grad_gather" if backward else "attention.unpad_qkv", nbytes, x)]
    nbytes = (q + 2 * kv) * 3 * ACT_BYTES if backward else q * 3 * ACT_BYTES
    return [bb.memory("attention.unpad_qkv.bwd" if backward else "attention.pad_output", nbytes, x)]


def attention_forward(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    """QKV projection, attention core, output projection (MLA: comet/workload/mla.py)."""
    if bb.model.mla is not None:
        from comet.workload import mla
        return mla.forward(bb, D, x)
    x = tp_in(bb, D, "qkv", D.T, (D.q + 2 * D.kv) // D.t, D.h, x)
    x = unpad_copies(bb, D, x, backward=False, before=True)
    x = attention_core(bb, D, x, backward=False)
    x = unpad_copies(bb, D, x, backward=False, before=False)
    return tp_out(bb, D, "proj", D.T, D.h, D.q // D.t, x)


def attention_backward(bb: BlockBuilder, D: Dims, x: Deps) -> Deps:
    if bb.model.mla is not None:
        from comet.workload import mla
        return mla.backward(bb, D, x)
    x = row_backward(bb, D, "proj", D.q // D.t, x)
    x = unpad_copies(bb, D, x, backward=True, before=True)
    x = attention_core(bb, D, x, backward=True)
    x = unpad_copies(bb, D, x, backward=True, before=False)
    return col_backward(bb, D, "qkv", (D.q + 2 * D.kv) // D.t, x)

