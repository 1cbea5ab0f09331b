"""schedule.task_kinds: the distinct (blocks, send stride) of a pipeline's tasks, and which one each
(stage, chunk) runs; a role looked up once per kind must give every task what task_blocks and
send_stride give it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from comet.graph.ir import PipelinePlan
from comet.replay import cache
from comet.replay.schedule import BWD, FWD, send_stride, task_blocks, task_kinds


@st.composite
def plans(draw):
    pp, vpp = draw(st.integers(1, 9)), draw(st.integers(1, 3))
    layers = tuple(draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp)))
    kinds = ()
    if draw(st.booleans()):   # a MoE model: each layer dense or expert
        kinds = tuple(tuple(draw(st.sampled_from(("layer", "moe_layer"))) for _ in range(n)) for n in layers)
    return PipelinePlan(pp=pp, vpp=vpp, num_microbatches=draw(st.integers(1, 8)),
                        schedule="interleaved_1f1b" if vpp > 1 else "1f1b", chunk_layers=layers, p2p_bytes=1.0,
                        p2p_group_stride=draw(st.integers(1, 64)), recompute_layers=draw(st.integers(0, 1)),
                        chunk_layer_kinds=kinds)


@settings(max_examples=300, deadline=None)
@given(plans())
def test_every_task_gets_its_blocks_and_send_stride(plan):
    with cache.disabled():
        kinds, fwd, bwd = task_kinds(plan)
    assert len(set(kinds)) == len(kinds)
    for s in range(plan.pp):
        for c in range(plan.vpp):
            for phase, ids in ((FWD, fwd), (BWD, bwd)):
                assert kinds[ids[s, c]] == (tuple(task_blocks(plan, s, c, phase)), send_stride(plan, s, c, phase))


@settings(max_examples=300, deadline=None)
@given(plans())
def test_kinds_are_numbered_in_order_of_first_appearance(plan):
    # task by task, stage-major then chunk, each forward then its backward: the numbering the per-stage
    # loop gave before the roles were computed with numpy (downstream sums run in this order)
    want: dict = {}
    for s in range(plan.pp):
        for c in range(plan.vpp):
            for phase in (FWD, BWD):
                want.setdefault((tuple(task_blocks(plan, s, c, phase)), send_stride(plan, s, c, phase)), len(want))
    with cache.disabled():
        kinds, _, _ = task_kinds(plan)
    assert kinds == list(want)
