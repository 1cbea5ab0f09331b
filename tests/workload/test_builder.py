"""The built blocks carry the FLOPs and bytes of Megatron's layer, and MFU uses Megatron's accounting."""

import pytest
from hypothesis import given, settings, strategies as st

from comet.config.parallel import ParallelConfig, Recompute
from comet.graph.ir import GroupKind, KernelClass, OpKind, ops
from comet.workload.builder import build_step_graph
from comet.workload.flops import model_flops_per_step


def block_flops(g, kernel=KernelClass.GEMM):
    return sum(op.flops for _, op in ops(g) if op.kernel is kernel)


def comm_bytes(g, kind=GroupKind.TP):
    return sum(op.msg_bytes for _, op in ops(g) if op.is_comm and op.group_kind is kind)


@pytest.fixture
def built(gpt3_175b):
    par = ParallelConfig(tp=8, pp=8, gpus=1024, global_batch=1536).resolve(gpt3_175b)
    return par, build_step_graph(gpt3_175b, par)


def test_layer_gemm_flops_match_megatron(built, gpt3_175b):
    par, g = built
    T, h, t = 2048, gpt3_175b.hidden, 8
    fwd = 2 * T * 12 * h * h / t          # QKV 3h^2, projection h^2, MLP 8h^2 per token
    assert block_flops(g.blocks["layer.fwd"]) == pytest.approx(fwd)
    assert block_flops(g.blocks["layer.bwd"]) == pytest.approx(2 * fwd)   # dgrad + wgrad


def test_attention_flops_are_causal_half_of_the_square(built):
    par, g = built
    full = 4 * 2048 * 2048 * 12288 / 8     # QK^T and PV over the full square, per rank
    assert block_flops(g.blocks["layer.fwd"], KernelClass.ATTENTION) == pytest.approx(full / 2)


def test_sequence_parallel_comm_volume(built):
    # Korthikanti et al. sec. 4.2.2: SP replaces each all-reduce by an all-gather + reduce-scatter of
    # the same s*b*h activation: forward 2 AG + 2 RS, backward 2 AG + 2 RS + 2 input re-gathers.
    par, g = built
    act = 2048 * 12288 * 2
    assert comm_bytes(g.blocks["layer.fwd"]) == pytest.approx(4 * act)
    assert comm_bytes(g.blocks["layer.bwd"]) == pytest.approx(6 * act)


def test_without_sp_two_all_reduces_each_way(gpt3_175b):
    par = ParallelConfig(tp=8, pp=8, gpus=1024, global_batch=1536, sequence_parallel=False).resolve(gpt3_175b)
    g = build_step_graph(gpt3_175b, par)
    for key in ("layer.fwd", "layer.bwd"):
        colls = [op.collective.value for _, op in ops(g.blocks[key]) if op.kind is OpKind.COLLECTIVE]
        assert colls == ["all_reduce", "all_reduce"]


def test_full_recompute_replays_the_forward(gpt3_175b):
    par = ParallelConfig(tp=8, pp=8, gpus=1024, global_batch=1536, recompute=Recompute.FULL).resolve(gpt3_175b)
    g = build_step_graph(gpt3_175b, par)
    assert block_flops(g.blocks["layer.recompute"]) == pytest.approx(block_flops(g.blocks["layer.fwd"]))
    assert g.plan.recompute_layers == 12


def test_gradient_buckets_cover_the_stage_parameters(built, gpt3_175b):
    par, g = built
    from comet.workload.memory import stage_params
    st = g.stages[3]
    total = sum(b.count * b.op.msg_bytes for b in st.grad_buckets)
    assert total == pytest.approx(stage_params(gpt3_175b, par, 3) * 4)   # fp32 main grads
    assert all(b.op.group_size == 16 and b.op.group_stride == 8 for b in st.grad_buckets)


def test_model_flops_equal_korthikanti_formula(gpt3_175b):
    B, L, s, h, V = 1536, 96, 2048, 12288, 51200
    korthikanti = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_step(gpt3_175b, B) == pytest.approx(korthikanti, rel=1e-3)


@pytest.mark.parametrize("flash", [True, False])
def test_attention_work_scales_with_micro_batch_once(gpt3_175b, flash):
    """T already counts the micro-batch: doubling it doubles attention work (regression: it was squared)."""
    def attention_work(mb):
        par = ParallelConfig(tp=8, pp=8, gpus=512, global_batch=64, micro_batch=mb, flash_attention=flash)
        g = build_step_graph(gpt3_175b, par.resolve(gpt3_175b)).blocks["layer.fwd"]
        return sum(op.flops + op.bytes for _, op in ops(g) if "attention" in op.name)
    assert attention_work(2) == pytest.approx(2 * attention_work(1))


@pytest.mark.parametrize("mode", ["hierarchical", "flat"])
def test_zero3_layer_collectives_carry_the_dp_collective_mode(gpt3_175b, mode):
    par = ParallelConfig(tp=1, pp=1, gpus=64, global_batch=64, zero=3, dp_collective=mode).resolve(gpt3_175b)
    g = build_step_graph(gpt3_175b, par)
    dp_ops = [op for blk in ("layer.fwd", "layer.bwd") for _, op in ops(g.blocks[blk])
              if op.is_comm and op.group_kind is GroupKind.DP]
    assert {op.name for op in dp_ops} == {"zero3.all_gather_params", "zero3.reduce_scatter_grads"}
    assert all(op.flat_ring is (mode == "flat") for op in dp_ops)


def _builder_layouts(model):
    """Layouts that reach every builder path: TP with and without SP and comm overlap, CP, ZeRO-3,
    recompute, FP8 (TE and torchao), activation offload, expert parallelism on MoE models."""
    from comet.config.parallel import OffloadTarget, Precision
    from comet.errors import ConfigError
    moe = model.moe is not None
    for tp, sp, cp, zero, recompute, extra in (
            (1, False, 1, 1, Recompute.NONE, {}),
            (8, True, 1, 3, Recompute.FULL, {"overlap_tp_comm": True}),
            (4, False, 2, 1, Recompute.SELECTIVE, {"precision": Precision.FP8}),
            (2, True, 4, 3, Recompute.NONE, {"precision": Precision.FP8, "fp8_impl": "torchao"}),
            (2, True, 1, 1, Recompute.NONE, {"offload": (OffloadTarget.ACTIVATIONS,)})):
        try:
            yield ParallelConfig(tp=tp, cp=cp, sequence_parallel=sp if tp > 1 else False, gpus=tp * cp * 4,
                                 micro_batch=1, global_batch=4, recompute=recompute, zero=zero,
                                 ep=2 if moe else 1, **extra).resolve(model)
        except ConfigError:
            continue


def test_every_op_the_builders_emit_is_a_checked_op():
    """The block and stage-sync builders construct ops without Op.__init__'s check of field names
    (Op.unchecked): every op they emit, on every shipped model, has only Op's fields and equals the op
    Op(...) builds from them."""
    from pathlib import Path
    from comet.config.model import load_model
    from comet.graph.block import block_ops
    from comet.graph.ir import Op
    from comet.workload.builder import build_blocks, build_stages
    fields = set(Op.__dataclass_fields__)
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "comet" / "models").glob("*.yaml"))
    seen = stage_ops = 0
    for name in names:
        model = load_model(name)
        for par in _builder_layouts(model):
            for key, g in build_blocks(model, par).items():
                for op in block_ops(g):
                    assert set(vars(op)) <= fields, (name, key, op.name, set(vars(op)) - fields)
                    assert Op(**vars(op)) == op
                    seen += 1
            for sync in build_stages(model, par):
                ops = [bs.op for bs in sync.grad_buckets + sync.param_gathers] + list(sync.optimizer)
                for op in ops + ([sync.embedding_sync] if sync.embedding_sync is not None else []):
                    assert set(vars(op)) <= fields, (name, "stage sync", op.name, set(vars(op)) - fields)
                    assert Op(**vars(op)) == op
                    stage_ops += 1
    assert seen > 1000 and stage_ops > 100


def _same_dataclass(got, cls) -> None:
    """`got` is the object cls's own __init__ builds from its fields: the same type, the same instance
    dict (every field, in field order, nothing else)."""
    want = cls(**vars(got))
    assert type(got) is cls and list(vars(got).items()) == list(vars(want).items()) and got == want
    assert list(vars(got)) == list(cls.__dataclass_fields__)


def test_step_structure_built_as_its_dataclasses_build_it():
    """The builder sets the fields of its PipelinePlan, StageSyncs, BucketSets and StepGraph at once
    (builder._frozen): on every shipped model and its layouts, each equals what the dataclass's own
    __init__ builds, field dict and order included."""
    from pathlib import Path
    from comet.config.model import load_model
    from comet.graph.ir import BucketSet, PipelinePlan, StageSync, StepGraph
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "comet" / "models").glob("*.yaml"))
    buckets = 0
    for name in names:
        model = load_model(name)
        for par in _builder_layouts(model):
            graph = build_step_graph(model, par)
            _same_dataclass(graph, StepGraph)
            _same_dataclass(graph.plan, PipelinePlan)
            for sync in graph.stages:
                _same_dataclass(sync, StageSync)
                for bs in sync.grad_buckets + sync.param_gathers:
                    _same_dataclass(bs, BucketSet)
                    buckets += 1
    assert buckets > 50


def _op_fields(op) -> list | None:
    return None if op is None else list(vars(op).items())


def _sync_fields(sync) -> list:
    """Every op field of a StageSync, in order, with its buckets' chunks and counts."""
    return ([(bs.chunk, bs.count, bs.progressive, _op_fields(bs.op)) for bs in sync.grad_buckets + sync.param_gathers]
            + [sync.gather_before_forward, _op_fields(sync.embedding_sync)] + [_op_fields(op) for op in sync.optimizer])


@pytest.mark.parametrize("pp, vpp, zero, offload", [(3, 1, 1, False), (4, 2, 1, True), (8, 1, 0, False)])
def test_each_stage_sync_equals_its_own_build(pp, vpp, zero, offload):
    """build_stages builds later stages' ops from earlier stages' (builder._resized: one size field
    replaced) and shares the tied-embedding op between the first and the last stage: on every shipped
    model, each stage equals build_stage_sync of that stage alone (every op field, in order)."""
    from pathlib import Path
    from comet.config.model import load_model
    from comet.config.parallel import OffloadTarget
    from comet.errors import ConfigError
    from comet.workload.builder import build_stage_sync, build_stages
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "comet" / "models").glob("*.yaml"))
    compared = 0
    for name in names:
        model = load_model(name)
        try:
            par = ParallelConfig(tp=2, pp=pp, vpp=vpp, schedule="interleaved_1f1b" if vpp > 1 else "1f1b",
                                 gpus=2 * pp * 4, micro_batch=1, global_batch=4 * 2 * pp,
                                 zero=zero, ep=2 if model.moe is not None else 1,
                                 offload=(OffloadTarget.OPTIMIZER,) if offload else ()).resolve(model)
        except ConfigError:
            continue
        stages = build_stages(model, par)
        for s in range(pp):
            assert _sync_fields(stages[s]) == _sync_fields(build_stage_sync(model, par, s))
            compared += 1
        if stages[0].embedding_sync is not None:
            assert stages[0].embedding_sync is stages[-1].embedding_sync
    assert compared >= 3 * pp


def _edges_by_chain_edges(ops, edges):
    """graph/block.chain_edges (the reference) from a block's ops and its data edges."""
    from comet.graph.block import chain_edges
    return chain_edges(ops, [(u, v) for u, v, dep in edges if dep == "data"])


def test_builder_stream_edges_equal_chain_edges_on_every_shipped_model():
    """BlockBuilder notes each op's stream edge as it adds the op: every block of every shipped model
    (every builder path) has the edges, in the order, that chain_edges derives from its ops."""
    from pathlib import Path
    from comet.config.model import load_model
    from comet.graph.block import block_lists
    from comet.workload.builder import build_blocks
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "comet" / "models").glob("*.yaml"))
    streams = 0
    for name in names:
        model = load_model(name)
        for par in _builder_layouts(model):
            for key, g in build_blocks(model, par).items():
                ops, edges = block_lists(g)[:2]
                assert edges == _edges_by_chain_edges(ops, edges), (name, key)
                streams += sum(dep != "data" for _, _, dep in edges)
    assert streams > 100


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["compute", "comm.tp", "comm.dp"]),
                          st.lists(st.one_of(st.none(), st.integers(0, 30)), max_size=4)), max_size=30))
def test_builder_stream_edges_equal_chain_edges_on_random_blocks(spec):
    """Ops on random (rank, stream)s after random earlier ops (duplicates and None included), through
    BlockBuilder._add: the block's edges equal chain_edges'."""
    from comet.config.model import load_model
    from comet.graph.block import block_lists
    from comet.graph.ir import Op, OpKind, Phase
    from comet.workload.block_builder import BlockBuilder
    model = load_model("gpt3_1t")
    bb = BlockBuilder(Phase.FORWARD, ParallelConfig(tp=1, gpus=1, micro_batch=1, global_batch=1).resolve(model),
                      model)
    for i, (rank, stream, after) in enumerate(spec):
        after = [u if u is None or u < i else u % i if i else None for u in after]
        kind = OpKind.COMPUTE if stream == "compute" else OpKind.COLLECTIVE
        bb._add(Op(f"op{i}", kind, rank=rank, stream=stream), after)
    ops, edges = block_lists(bb.done())[:2]
    assert edges == _edges_by_chain_edges(ops, edges)


def test_dims_built_as_the_dataclass_builds_them():
    """Dims.of sets a new Dims' instance dict at once: on every shipped model and its layouts, the same
    fields, values and order as Dims(...)'s own __init__ (and the sizes the blocks read)."""
    from pathlib import Path
    from comet.config.model import load_model
    from comet.workload.block_builder import Dims
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "comet" / "models").glob("*.yaml"))
    seen = 0
    for name in names:
        model = load_model(name)
        for par in _builder_layouts(model):
            dims = Dims.of(model, par)
            _same_dataclass(dims, Dims)
            assert dims.T == par.micro_batch * model.seq_len // par.cp and dims.act == model.activation.value
            assert Dims.of(model, par) is dims
            seen += 1
    assert seen > 20
