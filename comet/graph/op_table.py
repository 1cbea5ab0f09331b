"""A block as one numeric table, the form the compiled cost model and packing read
(replay/compute_costs.py, replay/block_pack.pack_rows).

One float64 array: a header (ops, GEMMs, edges), ROW_WIDTH values per op in node order (code, value,
place, kind-group), GEMM_WIDTH per GEMM (m, n, k, batch, dtype bytes), then the edges' sources and
their targets. The code says how an op is timed: GEMM (value: its index among the GEMMs),
ATTENTION (+ BACKWARD, + FA2; value: FLOPs) and MEMORY (value: bytes) by the compiled compute
models, TRANSFER (collectives and sends without a measured duration) by the network model, LEFT_OUT
(measured ops, copies, CPU ops, shapes that are not plain ints) by the Python models. Integers below
2**53 are exact in a float; the compiled model checks its sizes. Place = rank * 2**16 + a number per
stream name; kind-group = kind code (position in OpKind) * 32 + group code (0: none, else 1 +
position in GroupKind): what the packing reads. Kind-group is -1 where an op is matched across
streams (comm_id), its kind or group is not one of those enums, or its rank is not a small int: such
a block is packed from its ops (block_pack.pack).

perf: ~4 numbers an op (and 5 a GEMM) instead of a row of every field: numpy converts a list at
~15-40 ns a number. The block builder (workload/block_builder.py) writes each op's row as it builds the op
(`TableWriter`, the same methods `op_row` uses for any Op); tests/workload/test_builder.py checks the
builder's table equals the one derived from the ops on every block of every shipped model.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter

import numpy as np

from comet.graph.ir import COMPUTE_STREAM, GroupKind, KernelClass, OpKind, Phase

N_OPS, N_GEMMS, N_EDGES, HEADER = 0, 1, 2, 3                   # the header's slots
CODE, VALUE, PLACE, KIND_GROUP, ROW_WIDTH = range(5)           # an op's row
GEMM_WIDTH = 5                                                 # m, n, k, batch, dtype bytes
LEFT_OUT, GEMM, ATTENTION, MEMORY, TRANSFER = 0, 1, 2, 6, 7    # codes
BACKWARD, FA2 = 1, 2                                           # added to ATTENTION
STREAMS_PER_RANK, GROUPS_PER_KIND = 1 << 16, 32

KIND_CODES = {kind: i for i, kind in enumerate(OpKind)}
GROUP_CODES = {group: i for i, group in enumerate((None, *GroupKind))}
_STREAM_CODES: dict = {}


def stream_code(stream) -> int:
    """A number per stream name (the packing only compares them)."""
    code = _STREAM_CODES.get(stream)
    if code is None:
        code = _STREAM_CODES.setdefault(stream, len(_STREAM_CODES))
    return code


# perf: enum members bound once (a member read through its class is ~0.13 us on Python 3.11)
_COMPUTE, _GEMM, _ATTENTION, _MEMORY = OpKind.COMPUTE, KernelClass.GEMM, KernelClass.ATTENTION, KernelClass.MEMORY
_TRANSFERS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)     # timed by comet/hardware/network.py
_BACKWARD_PHASES = (Phase.BACKWARD,)   # compute.compute_op_time_s: `op.phase in (Phase.BACKWARD,)`
_NUMBERS = (int, float)
# a compute kernel on rank 0's compute stream (every kernel the builder writes)
COMPUTE_PLACE = stream_code(COMPUTE_STREAM)
COMPUTE_KIND = KIND_CODES[_COMPUTE] * GROUPS_PER_KIND


def kind_group(kind, group) -> int:
    kind_code, group_code = KIND_CODES.get(kind), GROUP_CODES.get(group)
    return -1 if kind_code is None or group_code is None else kind_code * GROUPS_PER_KIND + group_code


_PLACED: dict = {}


def placed_row(code: int, stream, kind: OpKind, group: GroupKind | None) -> tuple:
    """The row of an op on rank 0 that is not a compute kernel (a TRANSFER, or a LEFT_OUT copy)."""
    key = (code, stream, kind, group)
    row = _PLACED.get(key)
    if row is None:    # perf: a few distinct rows (streams x kinds x groups), each built once
        row = _PLACED[key] = (code, 0.0, stream_code(stream), kind_group(kind, group))
    return row


class TableWriter:
    """Appends ops' rows (and GEMM shapes) in node order; `array(edges)` is the block's table. The
    builder's methods take what it knows of an op; `op` derives the same from any Op. `transfers` and
    `left_out`: the node ids of the TRANSFER and LEFT_OUT rows, in order (perf: noted as written, so
    the replay reads a block's transfers without a pass over every row)."""
    __slots__ = ("rows", "gemms", "transfers", "left_out")

    def __init__(self):
        self.rows: list = []
        self.gemms: list = []
        self.transfers: list = []
        self.left_out: list = []

    def _other(self, code: int, place, kind) -> None:
        """A TRANSFER or LEFT_OUT row (no value), its node id noted."""
        (self.transfers if code == TRANSFER else self.left_out).append(len(self.rows) // ROW_WIDTH)
        self.rows += (code, 0.0, place, kind)

    # a compute kernel on rank 0's compute stream, without a measured duration
    def gemm(self, m, n, k, batch, dtype_bytes, place=COMPUTE_PLACE, kind=COMPUTE_KIND) -> None:
        """Followed in int64 only for plain positive ints (else the Python model times it)."""
        if type(m) is int and type(n) is int and type(k) is int and type(batch) is int and type(dtype_bytes) is int \
                and m >= 1 and n >= 1 and k >= 1 and batch >= 1 and dtype_bytes >= 1:
            self.rows += (GEMM, len(self.gemms) // GEMM_WIDTH, place, kind)
            self.gemms += (m, n, k, batch, dtype_bytes)
        else:
            self._other(LEFT_OUT, place, kind)

    def attention(self, flops, phase, variant: str, place=COMPUTE_PLACE, kind=COMPUTE_KIND) -> None:
        if type(flops) in _NUMBERS:
            code = ATTENTION + (BACKWARD if phase in _BACKWARD_PHASES else 0) + (FA2 if variant == "fa2" else 0)
            self.rows += (code, flops, place, kind)
        else:
            self._other(LEFT_OUT, place, kind)

    def memory(self, nbytes, place=COMPUTE_PLACE, kind=COMPUTE_KIND) -> None:
        if type(nbytes) in _NUMBERS:
            self.rows += (MEMORY, nbytes, place, kind)
        else:
            self._other(LEFT_OUT, place, kind)

    def placed(self, code: int, stream, kind: OpKind, group: GroupKind | None) -> None:
        """An op that is not a compute kernel (a TRANSFER, or a LEFT_OUT copy) on rank 0."""
        row = placed_row(code, stream, kind, group)
        (self.transfers if code == TRANSFER else self.left_out).append(len(self.rows) // ROW_WIDTH)
        self.rows += row

    def op(self, op) -> None:
        """Any Op's row (compute.compute_op_time_s, timing.op_time_s and the packing read these fields)."""
        kind, rank = op.kind, op.rank
        kg = kind_group(kind, op.group_kind)
        code = stream_code(op.stream)
        if op.comm_id is not None or type(rank) is not int or not 0 <= rank < 1 << 31 or code >= STREAMS_PER_RANK:
            kg, rank, code = -1, 0, 0
        place = rank * STREAMS_PER_RANK + code
        if op.duration_s is not None:
            self._other(LEFT_OUT, place, kg)
        elif kind is _COMPUTE:
            kernel, shape = op.kernel, op.shape
            if kernel is _GEMM and len(shape) >= 3:
                self.gemm(*shape[:3], shape[3] if len(shape) > 3 else 1, op.dtype_bytes, place, kg)
            elif kernel is _ATTENTION:
                self.attention(op.flops, op.phase, op.variant, place, kg)
            elif kernel is _MEMORY:
                self.memory(op.bytes, place, kg)
            else:
                self._other(LEFT_OUT, place, kg)
        else:
            self._other(TRANSFER if kind in _TRANSFERS else LEFT_OUT, place, kg)

    @classmethod
    def of(cls, ops) -> "TableWriter":
        writer = cls()
        for op in ops:
            writer.op(op)
        return writer

    def array(self, sources: list, targets: list) -> np.ndarray:
        """The table, with the block's edges (sources and targets in edge order)."""
        return self._array(len(sources), sources, targets)

    def array_of_edges(self, edges: list) -> np.ndarray:
        """The table, with a Block's edges ((source, target, dependency) in edge order)."""
        return tables_of([(self, edges)])[0]

    def _pieces(self, n_edges: int, sources, targets) -> tuple:
        rows, gemms = self.rows, self.gemms
        return (len(rows) // ROW_WIDTH, len(gemms) // GEMM_WIDTH, n_edges), rows, gemms, sources, targets

    def _array(self, n_edges: int, sources, targets) -> np.ndarray:
        return _converted([self._pieces(n_edges, sources, targets)], HEADER + len(self.rows) + len(self.gemms)
                          + 2 * n_edges)


def tables_of(blocks: list) -> tuple[np.ndarray, list]:
    """The tables of several blocks ((writer, a Block's edges as (source, target, dependency)) each) laid
    end to end in one array (each table's header gives its length), and where each one starts.
    perf: one conversion for the blocks a graph sees for the first time (~0.7 us a conversion besides
    its numbers); the sources and targets read while converting, no list of each (~2 us a GPT layer)."""
    pieces, starts, total = [], [], 0
    for writer, edges in blocks:
        starts.append(total)
        total += HEADER + len(writer.rows) + len(writer.gemms) + 2 * len(edges)
        pieces.append(writer._pieces(len(edges), map(_SOURCE, edges), map(_TARGET, edges)))
    return _converted(pieces, total), starts


def _converted(pieces: list, count: int) -> np.ndarray:
    # perf: np.fromiter over the pieces converts the Python ints ~2x faster than np.array of one list
    # (~7 vs ~14 us for a GPT layer's ~330 numbers), the same float(x) each (tests/graph/test_op_table.py)
    return np.fromiter(chain.from_iterable(chain.from_iterable(pieces)), dtype=np.float64, count=count)


_SOURCE, _TARGET = itemgetter(0), itemgetter(1)
