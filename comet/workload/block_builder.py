"""The block builder: appends one block's ops (compute kernels, collectives, sends, copies) with their
dependencies and their rows of the block's op table, on one representative rank; and the per-rank
tensor sizes of one micro-batch (`Dims`) that the layer recipes (layers.py, layer_parts.py) read."""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import networkx as nx

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Precision
from comet.graph.block import Block
from comet.graph.ir import (COMPUTE_STREAM, CP_STREAM, DP_STREAM, EP_STREAM, OFFLOAD_STREAM, TP_STREAM, Collective,
                            DepKind, GroupKind, KernelClass, Op, OpKind, Phase)
from comet.graph.op_table import COMPUTE_KIND, COMPUTE_PLACE, LEFT_OUT, MEMORY, TRANSFER, TableWriter, placed_row

ACT_BYTES = 2   # bf16/fp16 activations
FP8_BYTES = 1

# perf: the builder's methods write an Op's given fields straight into its instance dict, as
# Op.unchecked does (the others read the class defaults), without the keyword arguments: ~0.25 vs
# ~0.65 us an op, ~55 ops a GPT configuration (tests/workload/test_builder.py checks every op built)
_new_object, _set_attribute = object.__new__, object.__setattr__


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
        # perf: every field in field order, the instance dict set at once (a frozen dataclass's __init__
        # stores each of the 16 through object.__setattr__: ~2 us a configuration; tests/workload/
        # test_builder.py checks it against Dims(...))
        dims = _new_object(Dims)
        _set_attribute(dims, "__dict__", {
            "b": par.micro_batch, "s": model.seq_len, "T": T, "Ts": T // par.tp if par.sp else T, "t": par.tp,
            "h": model.hidden, "kv": model.kv_hidden, "q": model.q_hidden, "f": model.ffn_hidden,
            "gate": 2 if model.gated else 1, "heads": model.heads // par.tp, "d": model.head_size,
            "V": model.padded_vocab(par.tp), "sp": par.sp, "cp": par.cp, "act": model.activation._value_})
        _last_dims = (model, par, dims)
        return dims


_last_dims: tuple = (None, None, None)     # (model, parallel configuration, Dims) of the last Dims.of


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
        self.rows = self.table.rows
        self.heads: dict = {}    # (collective, group, flat_ring) or (SEND, group) -> _transfer_head
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
        op = self._kernel_op(name, _GEMM, ())
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
        # TableWriter.memory's row of a float (perf: written here, a call fewer an op; tested equal)
        op = self._kernel_op(name, _MEMORY, (MEMORY, nbytes, COMPUTE_PLACE, COMPUTE_KIND))
        op.__dict__["bytes"] = nbytes
        return self._append(op, after)

    def attention(self, name: str, flops: float, shape: tuple, after=()) -> int:
        variant = "" if self.par.attention_kernel == "fused" else self.par.attention_kernel
        self.table.attention(flops, self.phase, variant)
        op = self._kernel_op(name, _ATTENTION, ())
        d = op.__dict__
        d["flops"] = flops
        d["shape"] = shape
        d["variant"] = variant
        return self._append(op, after)

    def _kernel_op(self, name: str, kernel: KernelClass, row: tuple) -> Op:
        """A compute kernel's op with the fields every kernel has, its table `row` appended (or () where
        the caller wrote it); the caller writes the kernel's own fields."""
        self.rows += row
        op = _new_object(Op)
        d = op.__dict__
        d["name"] = name
        d["kind"] = _COMPUTE
        d["kernel"] = kernel
        d["phase"] = self.phase
        return op

    def collective(self, name: str, kind: Collective, msg_bytes: float, group: GroupKind, after=(),
                   flat_ring: bool = False) -> int:
        head = self.heads.get((kind, group, flat_ring))
        if head is None:
            head = self.heads[(kind, group, flat_ring)] = self._transfer_head(_COLLECTIVE, group, kind, flat_ring)
        return self._transfer(head, name, msg_bytes, after)

    def send(self, name: str, msg_bytes: float, group: GroupKind, after=()) -> int:
        head = self.heads.get((_SEND, group))
        if head is None:
            head = self.heads[(_SEND, group)] = self._transfer_head(_SEND, group)
        return self._transfer(head, name, msg_bytes, after)

    def _transfer_head(self, kind: OpKind, group: GroupKind, collective: Collective | None = None,
                       flat_ring: bool = False) -> tuple[dict, tuple, tuple]:
        """What a collective's or send's op shares with the block's other transfers of its kind and
        group: its fields (name and msg_bytes to fill, in the order the op's dict has them), table row and
        (rank, stream). perf: each (collective, group) met once a block, its geometry and row looked up
        once (a GPT layer's backward has 9 TP collectives of two kinds)."""
        size, stride, stream = group_geometry(group, self.par)
        fields = {"name": None, "kind": kind, "stream": stream, "msg_bytes": None,
                  "group": group._value_,    # perf: Enum._value_ is the member's value (.value: a property)
                  "group_kind": group, "group_size": size, "group_stride": stride, "phase": self.phase}
        if kind is _COLLECTIVE:
            fields["collective"] = collective
            fields["flat_ring"] = flat_ring
        return fields, placed_row(TRANSFER, stream, kind, group), (0, stream)

    def _transfer(self, head: tuple, name: str, msg_bytes: float, after) -> int:
        fields, row, place = head
        self.rows += row
        op = _new_object(Op)
        d = op.__dict__
        d.update(fields)     # perf: one C call for the shared fields, ~0.2 us fewer than storing each
        d["name"] = name
        d["msg_bytes"] = float(msg_bytes)
        nid = self._append(op, after, place)
        self.table.transfers.append(nid)     # its row's node id, as TableWriter.placed notes it
        return nid

    def offload(self, name: str, nbytes: float, after=()) -> int:
        self.table.placed(LEFT_OUT, OFFLOAD_STREAM, _MEMCPY, None)
        op = _new_object(Op)
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


def empty_block() -> nx.DiGraph:
    """BlockBuilder(...).done() of a builder given no op: a new (editable) block each call."""
    return Block.of([], [], TableWriter())


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


# Each recipe step takes the list of ops the next kernel depends on and returns the new list.
Deps = list
