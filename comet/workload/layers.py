"""Op-level blocks of a Megatron-style transformer on one representative rank.

Each block is a small flat op graph (forward, backward or recompute of one layer; embedding; output
head) with compute kernels on the "compute" stream and collectives on per-group communication
streams, as the PyTorch profiler records a Megatron-LM step. Shapes follow Megatron-LM's tensor and
sequence parallelism (Shoeybi et al. 2019 Fig. 3; Korthikanti et al. 2022 Fig. 5): column-parallel QKV
and FC1, row-parallel projection and FC2; without sequence parallelism one all-reduce after each
row-parallel GEMM (forward) and after each column-parallel dgrad (backward); with it an all-gather
before and a reduce-scatter after, and the backward re-gathers the layer input for the weight gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import networkx as nx

from comet.config.model import ModelSpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Precision, Recompute, SelectivePolicy
from comet.graph.block import Block
from comet.graph.op_table import LEFT_OUT, TRANSFER, TableWriter
from comet.graph.ir import (COMPUTE_STREAM, CP_STREAM, DP_STREAM, EP_STREAM, OFFLOAD_STREAM, TP_STREAM, Collective,
                            DepKind, GroupKind, KernelClass, Op, OpKind, Phase)
from comet.hardware.compute import FLASH_BWD_FLOP_RATIO

ACT_BYTES = 2   # bf16/fp16 activations
FP8_BYTES = 1

# HBM bytes per logit (tokens x vocab / tp) the loss moves: (forward, backward), by implementation
# (ParallelConfig.loss_impl; the bytes it keeps are comet/workload/memory.py LOSS_LOGIT_BYTES).
#  fused: one pass that reads the 16-bit logits and writes the fp32 softmax (2 + 4) plus a reduction
#    re-read (4); the backward reads it and writes the 16-bit gradient (4 + 2).
#  eager: PyTorch eager F.cross_entropy(pred.float()) (torchtitan before 0.1.0): cast (read 2, write 4),
#    log_softmax (4 + 4), nll_loss (a gather); backward: nll_loss_backward writes a zero fp32 gradient
#    (4), log_softmax_backward reads it and the saved output and writes a new one (4 + 4 + 4), and the
#    cast's backward returns 16 bits (4 + 2): 14 and 22.
#  megatron: Megatron-Core's unfused vocab_parallel_cross_entropy, its default (ModelParallelConfig
#    cross_entropy_loss_fusion = False; megatron-core 0.8.0 tensor_parallel/cross_entropy.py), one kernel
#    per line: logits.float() (2 + 4), max (4), in-place subtract of the max (4 + 4), exp (4 + 4), sum
#    (4), div_ by the sum to the saved softmax (4 + 4): 38; backward: the scatter at the targets, mul_ by
#    the output gradient (4 + 4) and the cast's backward to 16 bits (4 + 2): 14.
LOSS_HBM_BYTES = {"fused": (ACT_BYTES + 4 * 2, 4 + ACT_BYTES),
                  "eager": (ACT_BYTES + 4 + 4 * 2, 4 + 4 * 3 + 4 + ACT_BYTES),
                  "megatron": (ACT_BYTES + 4 + 4 + 4 * 2 + 4 * 2 + 4 + 4 * 2, 4 * 2 + 4 + ACT_BYTES)}


@dataclass(frozen=True)
class Dims:
    """Per-rank tensor sizes of one micro-batch."""
    b: int        # micro-batch
    s: int        # full sequence length
    T: int        # tokens per rank (b * s / cp): the GEMM m dimension
    Ts: int       # tokens held between TP regions (T / tp with sequence parallelism)
    t: int        # tensor-parallel degree
    h: int
    kv: int       # K (or V) projection width
    q: int        # Q projection / attention output width (heads * head_dim; = h unless head_dim is set)
    f: int        # ffn hidden
    gate: int     # 2 for SwiGLU (gate and up projections), 1 for GeLU
    heads: int    # attention heads per rank
    d: int        # head dim
    V: int        # padded vocabulary (Megatron pads to a multiple of 128 * tp)
    sp: bool
    cp: int
    act: str      # activation name (kernel label)

    @staticmethod
    def of(model: ModelSpec, par: ParallelConfig) -> "Dims":
        # perf: the blocks of one configuration are built one after another from the same two
        # (immutable) objects; the last answer is kept with them (one tuple: read and replaced whole)
        global _last_dims
        last = _last_dims
        if last[0] is model and last[1] is par:
            return last[2]
        T = par.micro_batch * model.seq_len // par.cp
        dims = Dims(b=par.micro_batch, s=model.seq_len, T=T, Ts=T // par.tp if par.sp else T, t=par.tp,
                    h=model.hidden, kv=model.kv_hidden, q=model.q_hidden, f=model.ffn_hidden,
                    gate=2 if model.gated else 1, heads=model.heads // par.tp, d=model.head_size,
                    V=model.padded_vocab(par.tp), sp=par.sp, cp=par.cp, act=model.activation.value)
        _last_dims = (model, par, dims)
        return dims


_last_dims: tuple = (None, None, None)     # (model, parallel configuration, Dims) of the last Dims.of


# perf: the builder's methods write an Op's given fields straight into its instance dict, as
# Op.unchecked does (the others read the class defaults), without the keyword arguments: ~0.25 vs
# ~0.65 us an op, ~55 ops a GPT configuration (tests/workload/test_builder.py checks every op built)
_new_op = object.__new__
# the (rank, stream) of the builder's kernels and copies; the edge kinds chain_edges gives (data: the plain str)
_ON_COMPUTE, _ON_OFFLOAD = (0, COMPUTE_STREAM), (0, OFFLOAD_STREAM)
_DATA, _STREAM, _SOURCE = DepKind.DATA.value, DepKind.STREAM, itemgetter(0)
# perf: enum members bound once: on Python 3.11 a member read through its class costs ~0.09 us, and the
# builder's methods read two to eight a op (group_geometry's chain of tests)
_COMPUTE, _COLLECTIVE, _SEND, _MEMCPY = OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.SEND, OpKind.MEMCPY
_GEMM, _MEMORY, _ATTENTION = KernelClass.GEMM, KernelClass.MEMORY, KernelClass.ATTENTION
_TP, _CP, _DP, _PP, _EMBEDDING, _ETP, _EP, _EDP = (GroupKind.TP, GroupKind.CP, GroupKind.DP, GroupKind.PP,
                                                    GroupKind.EMBEDDING, GroupKind.ETP, GroupKind.EP, GroupKind.EDP)


class BlockBuilder:
    """Appends ops to one block graph; ops on the same stream run in insertion order."""

    def __init__(self, phase: Phase, par: ParallelConfig, model: ModelSpec):
        # perf: ops and data edges in lists; no networkx graph is built unless one is asked for (graph/block.py)
        self.ops: list[Op] = []
        self.deps: list[tuple[int, int, str]] = []          # data edges (u, v, "data") as added
        # perf: the stream edges noted as ops are added, not found by chain_edges' pass over the ops
        # (~0.4 us an op; graph/block.chain_edges is the reference, tests/workload/test_builder.py):
        # (u, v, STREAM) where u is v's predecessor on its (rank, stream) and v does not wait for u already
        self.stream_edges: list[tuple[int, int, DepKind]] = []
        self.last: dict = {}                                 # (rank, stream) -> its last op so far
        # perf: each op's row of the block's table (graph/op_table.py) written here, where its kind is
        # known: the replay's compiled cost model and packing read it without a pass over the Op objects
        self.table = TableWriter()
        self.phase = phase
        self.par = par
        self.model = model
        self.fp8 = par.precision is Precision.FP8

    def _add(self, op: Op, after) -> int:
        """An op built elsewhere (its table row derived from the op)."""
        self.table.op(op)
        return self._append(op, after, (op.rank, op.stream))

    def _append(self, op: Op, after, place: tuple = _ON_COMPUTE) -> int:
        """An op whose table row is written already, on `place` (rank, stream), after the ops `after` (a
        list or tuple of node ids; None entries ignored). Every data edge into an op is added here, so
        its stream edge is needed unless its stream predecessor is among `after`."""
        nid = len(self.ops)
        self.ops.append(op)
        for u in after:
            if u is not None:
                self.deps.append((u, nid, _DATA))
        last = self.last
        prev = last.get(place)
        last[place] = nid
        if prev is not None and prev not in after:
            self.stream_edges.append((prev, nid, _STREAM))
        return nid

    def gemm(self, name: str, m: int, n: int, k: int, after=(), batch: int = 1, cast_done: bool = False) -> int:
        """A GEMM; under FP8 the layer GEMMs run in FP8 (Transformer Engine or torchao) while the output
        layer stays BF16 (Megatron's output layer is a plain ColumnParallelLinear, not a TE module) and so
        do the batched attention GEMMs; the casts to FP8 are memory-bound kernels (`_fp8_casts`), unless
        `cast_done` (the operand was cast before a gather: `fp8_gather`)."""
        fp8 = self.fp8 and batch == 1 and not name.startswith("logits")
        if fp8 and not cast_done:
            after = self._fp8_casts(name, m, n, k, after)
        dtype = 1 if fp8 else 2
        self.table.gemm(m, n, k, batch, dtype)
        op = self._kernel_op(name, _GEMM)
        d = op.__dict__
        d["shape"] = (m, n, k, batch)
        d["flops"] = 2.0 * m * n * k * batch
        d["dtype_bytes"] = dtype
        return self._append(op, after)

    def _fp8_casts(self, name: str, m: int, n: int, k: int, after) -> list:
        """The kernels that quantize an FP8 GEMM's operands (m x k is the activation or output gradient,
        k x n the weight), returning what the GEMM waits for.

        Transformer Engine with delayed scaling uses the amax of earlier steps, so one fused cast +
        transpose + amax kernel per quantized tensor: read 2 bytes, write 1 + 1 per element of the m x k
        operand in the forward and the dgrad (TE `fp8_cast_transpose_fused`); the wgrad reuses both, and
        the FP8 weight is cached across micro-batches.

        torchao Float8Linear with dynamic scaling (torchao/float8/float8_linear.py
        `matmul_with_hp_or_float8_args`; `hp_tensor_to_float8_dynamic`) needs the amax of the tensor it
        is about to cast: every cast is an amax reduction (read 2 bytes) and then a cast (read 2, write 1),
        5 bytes per element in two kernels, as the eager code issues them (torch.compile can fuse an
        amax into the kernel producing the tensor). Forward: input and weight. Backward, at the dgrad:
        the output gradient twice (dim0 for the dgrad, dim1 for the wgrad), the weight transposed and the
        saved high-precision input along dim1 for the wgrad (the dgrad's output has the input's shape);
        nothing is cached across micro-batches."""
        base = name.split("[")[0]
        if base.endswith(".wgrad"):
            return list(after)
        if self.par.fp8_impl != "torchao":
            return [self.memory(f"{name}.fp8_cast_transpose", m * k * (ACT_BYTES + 2 * FP8_BYTES), after)]
        casts = [("grad_dim0", m * k), ("grad_dim1", m * k), ("input_dim1", m * n), ("weight_t", k * n)] \
            if base.endswith(".dgrad") else [("input", m * k), ("weight", k * n)]
        deps = list(after)
        for what, elements in casts:
            amax = self.memory(f"{name}.fp8_amax_{what}", elements * ACT_BYTES, deps)
            deps = [self.memory(f"{name}.fp8_cast_{what}", elements * (ACT_BYTES + FP8_BYTES), [amax])]
        return deps

    def fp8_gather(self, name: str) -> bool:
        """Whether the sequence-parallel all-gather feeding GEMM `name` moves FP8 data. Transformer Engine
        casts the rank's own shard and gathers the FP8 tensor, 1 byte per element (TE 1.11):
        LayerNormLinear's norm kernel writes FP8 and `gather_along_first_dim` gathers that `ln_out`
        (qkv, fc1; the wgrad's re-gather of the saved input likewise); `grad_output_preprocess` "FP8 case
        with gather: unfused bgrad, cast, transpose for efficient gather" (the proj / fc2 dgrad); with
        userbuffers the all-gather buffers are FP8 ("AllGather buffers use fp8 when using fp8 recipe",
        module/base.py initialize_ub). Not the BF16 output layer, nor torchao (casts after the gather)."""
        return self.fp8 and self.par.fp8_impl == "te" and not name.startswith("logits")

    def memory(self, name: str, nbytes: float, after=()) -> int:
        nbytes = float(nbytes)
        self.table.memory(nbytes)
        op = self._kernel_op(name, _MEMORY)
        op.__dict__["bytes"] = nbytes
        return self._append(op, after)

    def attention(self, name: str, flops: float, shape: tuple, after=()) -> int:
        variant = "" if self.par.attention_kernel == "fused" else self.par.attention_kernel
        self.table.attention(flops, self.phase, variant)
        op = self._kernel_op(name, _ATTENTION)
        d = op.__dict__
        d["flops"] = flops
        d["shape"] = shape
        d["variant"] = variant
        return self._append(op, after)

    def _kernel_op(self, name: str, kernel: KernelClass) -> Op:
        """A compute kernel's op with the fields every kernel has (the caller writes its table row and
        the kernel's own fields)."""
        op = _new_op(Op)
        d = op.__dict__
        d["name"] = name
        d["kind"] = _COMPUTE
        d["kernel"] = kernel
        d["phase"] = self.phase
        return op

    def collective(self, name: str, kind: Collective, msg_bytes: float, group: GroupKind, after=(),
                   flat_ring: bool = False) -> int:
        op, place = self._transfer_op(name, _COLLECTIVE, msg_bytes, group)
        d = op.__dict__
        d["collective"] = kind
        d["flat_ring"] = flat_ring
        return self._append(op, after, place)

    def send(self, name: str, msg_bytes: float, group: GroupKind, after=()) -> int:
        op, place = self._transfer_op(name, _SEND, msg_bytes, group)
        return self._append(op, after, place)

    def _transfer_op(self, name: str, kind: OpKind, msg_bytes: float, group: GroupKind) -> tuple[Op, tuple]:
        """A collective's or send's op with the fields both have (its table row written), and its
        (rank, stream)."""
        size, stride, stream = group_geometry(group, self.par)
        self.table.placed(TRANSFER, stream, kind, group)
        op = _new_op(Op)
        d = op.__dict__
        d["name"] = name
        d["kind"] = kind
        d["stream"] = stream
        d["msg_bytes"] = float(msg_bytes)
        d["group"] = group._value_    # perf: Enum._value_ is the member's value (.value: a property, ~0.3 us)
        d["group_kind"] = group
        d["group_size"] = size
        d["group_stride"] = stride
        d["phase"] = self.phase
        return op, (0, stream)

    def offload(self, name: str, nbytes: float, after=()) -> int:
        self.table.placed(LEFT_OUT, OFFLOAD_STREAM, _MEMCPY, None)
        op = _new_op(Op)
        d = op.__dict__
        d["name"] = name
        d["kind"] = _MEMCPY
        d["stream"] = OFFLOAD_STREAM
        d["bytes"] = float(nbytes)
        d["phase"] = self.phase
        return self._append(op, after, _ON_OFFLOAD)

    def done(self) -> nx.DiGraph:
        """The block (a DiGraph, built on first use): ops in insertion order, data edges, and stream
        order between consecutive ops of a stream."""
        # the order chain_edges gives: data edges as added (duplicates dropped), then stream edges, sorted by
        # source (stable)
        edges = list(dict.fromkeys(self.deps))
        edges += self.stream_edges
        edges.sort(key=_SOURCE)
        return Block.of(self.ops, edges, self.table)


def group_geometry(group: GroupKind, par: ParallelConfig) -> tuple[int, int, str]:
    """(size, global-rank stride, stream) of a process group; Megatron rank order is tp, cp, dp, pp."""
    if group is _TP:
        return par.tp, 1, TP_STREAM
    if group is _CP:
        return par.cp, par.tp, CP_STREAM
    if group is _DP:    # gradients are reduced over data x context parallel ranks
        return par.dp * par.cp, par.tp, DP_STREAM
    if group is _PP:
        return par.pp, par.tp * par.cp * par.dp, DP_STREAM
    if group is _EMBEDDING:
        return 2, (par.pp - 1) * par.tp * par.cp * par.dp, DP_STREAM
    # Expert layers re-partition a stage's tp*cp*dp ranks as etp (innermost), ep, expert-dp
    # (Megatron-Core parallel_state: expert rank order "tp-ep-dp-pp").
    if group is _ETP:
        return par.expert_tp, 1, TP_STREAM
    if group is _EP:
        return par.ep, par.expert_tp, EP_STREAM
    if group is _EDP:
        return par.expert_dp, par.expert_tp * par.ep, DP_STREAM
    raise ValueError(group)


# ------------------------------------------------------------------------------------------- helpers
# Each helper takes the list of ops the next kernel depends on and returns the new list.
Deps = list


# Transformer Engine's userbuffers overlap of proj_fprop / fc2_fprop: method `pipeline`, the GEMM split
# into 4 chunks whatever the TP size (TE 1.11 module/base.py initialize_ub: `"num_splits": 4 if method ==
# "pipeline" else tp_size`; NeMo 2.0 recipes/tp_overlap_configs/userbuffers.py: PipelineOverlapCfg(...,
# num_splits=4) for every H100 shape it lists)
TP_RS_SPLITS = 4


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
        ag = bb.collective(f"{name}.all_gather", Collective.ALL_GATHER, msg, GroupKind.TP, deps)
        return [bb.gemm(name, m, n, k, [ag], cast_done=fp8)]
    prev = bb.gemm(f"{name}[0]", m // D.t, n, k, deps, cast_done=fp8)
    for j in range(1, D.t):
        # an all-gather of msg / (tp - 1) delivers (tp - 1) / tp of it to each rank: one shard, msg / tp
        step = bb.collective(f"{name}.all_gather[{j}]", Collective.ALL_GATHER, msg / (D.t - 1), GroupKind.TP, deps)
        prev = bb.gemm(f"{name}[{j}]", m // D.t, n, k, [step, prev], cast_done=fp8)
    return [prev]


def tp_out(bb: BlockBuilder, D: Dims, name: str, m: int, n: int, k: int, deps: Deps) -> Deps:
    """Row-parallel GEMM followed by the reduction of its partial sums over the TP group; with
    overlap_tp_comm (under sequence parallelism) the GEMM and its reduce-scatter are pipelined in
    TP_RS_SPLITS chunks, the last chunk's reduce-scatter exposed."""
    if D.t == 1:
        return [bb.gemm(name, m, n, k, deps)]
    msg = D.T * D.h * ACT_BYTES
    kind = Collective.REDUCE_SCATTER if D.sp else Collective.ALL_REDUCE
    if not (D.sp and bb.par.overlap_tp_comm):
        g = bb.gemm(name, m, n, k, deps)
        return [bb.collective(f"{name}.{kind._value_}", kind, msg, GroupKind.TP, [g])]
    tail = []
    for j in range(TP_RS_SPLITS):
        g = bb.gemm(f"{name}[{j}]", m // TP_RS_SPLITS, n, k, deps)
        tail = [bb.collective(f"{name}.{kind._value_}[{j}]", kind, msg / TP_RS_SPLITS, GroupKind.TP, [g])]
    return tail


def grad_in(bb: BlockBuilder, D: Dims, name: str, deps: Deps) -> Deps:
    """The backward of a reduce-scatter is an all-gather of the output gradient (sequence parallelism)."""
    if not D.sp:
        return deps
    return [bb.collective(f"{name}.all_gather_grad", Collective.ALL_GATHER, D.T * D.h * ACT_BYTES,
                          GroupKind.TP, deps)]


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
    regather = ([bb.collective(f"{name}.all_gather_input", Collective.ALL_GATHER, D.T * D.h * ag_bytes,
                               GroupKind.TP, deps)] if D.sp else [])
    dgrad = bb.gemm(f"{name}.dgrad", D.T, D.h, n_out, deps)
    wgrad = bb.gemm(f"{name}.wgrad", n_out, D.h, D.T, [dgrad] + regather)
    if D.t == 1:
        return [wgrad]
    kind = Collective.REDUCE_SCATTER if D.sp else Collective.ALL_REDUCE
    red = bb.collective(f"{name}.dgrad.{kind._value_}", kind, D.T * D.h * ACT_BYTES, GroupKind.TP, [dgrad])
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
                transfer = bb.send(f"{name}.cp_exchange[{j}]", kv_block, GroupKind.CP, sent_after)
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


# ------------------------------------------------------------------------------------------- blocks
def _layer_weight_bytes(model: ModelSpec, par: ParallelConfig) -> float:
    return model.layer_params / par.tp * ACT_BYTES


def _zero3_and_offload(bb: BlockBuilder, model: ModelSpec, D: Dims, backward: bool) -> list:
    """Per-layer traffic that overlaps the layer's compute in steady state: the ZeRO-3 gather of the
    next layer's weights (and, backward, the reduce-scatter of the previous layer's gradients), and
    expansion-tier streaming of weights / activations. They have no dependency inside the block: each
    stands for the prefetch issued one layer ahead; the block ends when they are done. Without
    forward prefetch (overlap_param_gather off; PyTorch FSDP's default forward_prefetch=False) the
    forward gathers the layer's own weights first: returns what the layer's first kernel waits for.
    FSDP SHARD_GRAD_OP (par.shard_grad_op) gathers in the forward (and a full recompute) the same way
    but keeps the weights through the backward: no backward gather, the gradients reduce-scattered."""
    par = bb.par
    weights = _layer_weight_bytes(model, par)
    first: list = []
    if par.per_module_dp_collectives and par.dp * par.cp > 1:
        flat = par.dp_collective == "flat"    # DeepSpeed-2021: one ring at one NIC per GPU (network.py)
        # Which passes gather the weights: every forward; the backward unless SHARD_GRAD_OP kept them from
        # the forward; a full recompute only where the framework's hooks fetch again (DeepSpeed ZeRO-3).
        # PyTorch FSDP checkpoints inside its unit (Composer dist_strategy.py applies activation
        # checkpointing after FSDP wrapping and skips FSDP modules; torchtitan wraps checkpointed blocks
        # with fully_shard), so the recompute runs on the weights the backward's gather brought in.
        gathers = not par.fsdp if bb.phase is Phase.RECOMPUTE else not (backward and par.shard_grad_op)
        if gathers:
            ag = bb.collective("zero3.all_gather_params", Collective.ALL_GATHER, weights, GroupKind.DP, [], flat)
            if not backward and not par.overlap_param_gather:
                first = [ag]
        if backward:   # gradients reduced in the reduce dtype (FSDP MixedPrecision.reduce_dtype)
            grads = model.layer_params / par.tp * par.grad_reduce_bytes
            bb.collective("zero3.reduce_scatter_grads", Collective.REDUCE_SCATTER, grads, GroupKind.DP, [], flat)
    if OffloadTarget.WEIGHTS in par.offload:
        bb.offload("offload.weights_in", weights, [])
    if OffloadTarget.ACTIVATIONS in par.offload:
        from comet.workload.memory import activation_bytes_per_layer
        bb.offload("offload.activations_in" if backward else "offload.activations_out",
                   activation_bytes_per_layer(model, par), [])
    return first


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


def layer_forward(model: ModelSpec, par: ParallelConfig, phase: Phase = Phase.FORWARD,
                  mlp_forward=dense_mlp_forward) -> nx.DiGraph:
    """One layer's forward; `mlp_forward` is the MLP (dense, or comet.workload.moe's expert layer)."""
    D = Dims.of(model, par)
    bb = BlockBuilder(phase, par, model)
    x = norm(bb, D, "input_norm", _zero3_and_offload(bb, model, D, backward=False))
    x = attention_forward(bb, D, x)
    x = dropout_add(bb, D, "attention.dropout_add", x)
    x = norm(bb, D, "mlp_norm", x)
    x = mlp_forward(bb, D, x)
    dropout_add(bb, D, "mlp.dropout_add", x)
    return bb.done()


def layer_backward(model: ModelSpec, par: ParallelConfig, mlp_backward=dense_mlp_backward) -> nx.DiGraph:
    D = Dims.of(model, par)
    bb = BlockBuilder(Phase.BACKWARD, par, model)
    _zero3_and_offload(bb, model, D, backward=True)
    x = dropout_add(bb, D, "mlp.dropout_add.bwd", [])
    x = mlp_backward(bb, D, x)
    x = norm(bb, D, "mlp_norm.bwd", x, backward=True)
    x = dropout_add(bb, D, "attention.dropout_add.bwd", x)
    x = attention_backward(bb, D, x)
    x = norm(bb, D, "input_norm.bwd", x, backward=True)
    bb.memory("residual_grad_add", D.Ts * D.h * ACT_BYTES * 3, x)
    return bb.done()


def layer_recompute(model: ModelSpec, par: ParallelConfig, forward=layer_forward, moe_layer: bool = False) -> nx.DiGraph:
    """What runs again before a layer's backward: the whole forward (full), the attention core of an
    unfused implementation (selective, Korthikanti et al. sec. 5), or nothing (flash attention already
    recomputes its scores inside the backward kernel); plus Megatron-Core's recompute modules."""
    from comet.workload.recompute_modules import add_recompute_ops   # (it imports this module)
    if par.recompute is Recompute.FULL:
        return forward(model, par, phase=Phase.RECOMPUTE)
    if par.recompute is Recompute.SELECTIVE and par.selective_policy is not SelectivePolicy.ATTENTION:
        return _policy_recompute(model, par, par.selective_policy)
    bb = BlockBuilder(Phase.RECOMPUTE, par, model)
    if par.recompute is Recompute.SELECTIVE and not par.flash_attention:
        attention_core(bb, Dims.of(model, par), [], backward=False)
    add_recompute_ops(bb, moe_layer)
    return bb.done()


def _policy_recompute(model: ModelSpec, par: ParallelConfig, policy) -> nx.DiGraph:
    """The forward work a framework's selective policy re-runs before the layer's backward (see
    comet.workload.memory._policy_saved_bytes for what each keeps). op_sac: the norms, the recomputed
    mm's wk (kv wide), wo and w3 (f wide) and the activation; save_qkv: everything after the QKV GEMM."""
    D = Dims.of(model, par)
    bb = BlockBuilder(Phase.RECOMPUTE, par, model)
    x = norm(bb, D, "input_norm", [])
    if policy is SelectivePolicy.OP_SAC:
        x = [bb.gemm("wk", D.T, D.kv // D.t, D.h, x)]
        x = tp_out(bb, D, "proj", D.T, D.h, D.h // D.t, x)
        x = norm(bb, D, "mlp_norm", x)
        x = [bb.gemm("w3", D.T, D.f // D.t, D.h, x)]
        bb.memory(D.act, D.T * D.f // D.t * ACT_BYTES * (D.gate + 1), x)
        return bb.done()
    x = attention_core(bb, D, x, backward=False)
    x = tp_out(bb, D, "proj", D.T, D.h, D.h // D.t, x)
    x = dropout_add(bb, D, "attention.dropout_add", x)
    x = norm(bb, D, "mlp_norm", x)
    x = tp_in(bb, D, "fc1", D.T, D.gate * D.f // D.t, D.h, x)
    x = [bb.memory(D.act, D.T * D.f // D.t * ACT_BYTES * (D.gate + 1), x)]
    tp_out(bb, D, "fc2", D.T, D.h, D.f // D.t, x)
    return bb.done()


def embedding_forward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    """Vocab-parallel embedding lookup: each TP rank writes its rows, the partial embeddings are summed
    over the TP group (reduce-scattered under SP), then embedding dropout."""
    D = Dims.of(model, par)
    bb = BlockBuilder(Phase.FORWARD, par, model)
    x = [bb.memory("embedding.lookup", D.T * D.h * ACT_BYTES * 2, [])]
    if D.t > 1:
        kind = Collective.REDUCE_SCATTER if D.sp else Collective.ALL_REDUCE
        x = [bb.collective(f"embedding.{kind._value_}", kind, D.T * D.h * ACT_BYTES, GroupKind.TP, x)]
    bb.memory("embedding.dropout", D.Ts * D.h * (2 * ACT_BYTES + 1), x)
    return bb.done()


def embedding_backward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    D = Dims.of(model, par)
    bb = BlockBuilder(Phase.BACKWARD, par, model)
    x = [bb.memory("embedding.dropout.bwd", D.Ts * D.h * (2 * ACT_BYTES + 1), [])]
    x = grad_in(bb, D, "embedding", x)
    # F.embedding's weight gradient is dense: a zero V/t x h tensor in the weight's 16-bit dtype with the
    # T gradient rows accumulated into it (torch/_decomp/decompositions.py embedding_dense_backward:
    # new_zeros + index_put accumulate): write 2 B per weight; read 2 per row element, read + write 2 + 2
    x = [bb.memory("embedding.grad_scatter_add", D.V // D.t * D.h * ACT_BYTES + D.T * D.h * ACT_BYTES * 3, x)]
    if not (par.fsdp and par.fsdp_impl == "torch"):
        # Megatron-Core's DDP hook adds it into the fp32 main gradient each micro-batch
        # (megatron-core 0.8.0 distributed/distributed_data_parallel.py _make_param_hook:
        # param.main_grad.add_(param.grad.data)): read 4 + 2, write 4 per weight. PyTorch FSDP hands the
        # 16-bit gradient to its reduce-scatter instead.
        bb.memory("embedding.main_grad_add", D.V // D.t * D.h * (4 + ACT_BYTES + 4), x)
    return bb.done()


def head_forward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    """Final norm, vocab-parallel logits GEMM and cross-entropy (fp32 softmax over V/t columns with
    three small all-reduces over TP: max, sum of exponentials, target logit; Megatron
    vocab_parallel_cross_entropy)."""
    D = Dims.of(model, par)
    bb = BlockBuilder(Phase.FORWARD, par, model)
    x = norm(bb, D, "final_norm", [])
    x = tp_in(bb, D, "logits", D.T, D.V // D.t, D.h, x)
    x = [bb.memory("cross_entropy", D.T * D.V // D.t * LOSS_HBM_BYTES[par.loss_impl][0], x)]
    if D.t > 1:
        for what in ("max", "sum_exp", "target"):
            x = [bb.collective(f"cross_entropy.all_reduce_{what}", Collective.ALL_REDUCE, D.T * 4, GroupKind.TP, x)]
    return bb.done()


def head_backward(model: ModelSpec, par: ParallelConfig) -> nx.DiGraph:
    D = Dims.of(model, par)
    bb = BlockBuilder(Phase.BACKWARD, par, model)
    x = [bb.memory("cross_entropy.bwd", D.T * D.V // D.t * LOSS_HBM_BYTES[par.loss_impl][1], [])]
    x = col_backward(bb, D, "logits", D.V // D.t, x)
    norm(bb, D, "final_norm.bwd", x, backward=True)
    return bb.done()
