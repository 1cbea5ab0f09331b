"""replay_step's per-graph facts and prebuilt task-level layouts (comet/replay/step.py, branch
i21s-step) against the path that builds every key and layout per call, on random configurations."""

import dataclasses

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Schedule
from comet.errors import ConfigError
from comet.evaluate import resolve
from comet.replay import cache, step
from comet.replay.contention import nic_key
from comet.replay.schedule import task_kinds
from comet.replay.tails import _stage_groups_shared, statics_key
from comet.workload.builder import build_step_graph

_SMALL = ModelSpec(name="small", layers=12, hidden=2048, heads=16, vocab=32000, seq_len=2048)


def _graph(data, h100):
    tp, pp, dp = data.draw(st.sampled_from([1, 2, 8])), data.draw(st.integers(1, 5)), data.draw(st.sampled_from([1, 2, 4, 16]))
    par = dict(tp=tp, pp=pp, gpus=tp * pp * dp, global_batch=dp * pp * data.draw(st.integers(1, 4)),
               zero=data.draw(st.integers(0, 3)), overlap_param_gather=data.draw(st.booleans()))
    if pp > 1 and data.draw(st.booleans()):
        par.update(vpp=2, schedule=Schedule.INTERLEAVED, global_batch=dp * pp * 4)
    model = dataclasses.replace(_SMALL, tied_embeddings=data.draw(st.booleans()))
    cluster = h100 if data.draw(st.booleans()) else dataclasses.replace(
        h100, network=(dataclasses.replace(h100.network[0], size=4),) + h100.network[1:])
    try:
        return build_step_graph(model, resolve(model, cluster, ParallelConfig(**par))), cluster
    except ConfigError:
        return None, None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_step_with_graph_facts_equals_the_per_call_path(h100, data):
    graph, cluster = _graph(data, h100)
    assume(graph is not None)
    cache.clear()
    fast = step.replay_step(graph, cluster, "bf16")
    again = step.replay_step(graph, cluster, "bf16")          # every entry a hit
    # the timeline's path builds the releases' layout, the durations' and the tail's figures per call
    slow = step.replay_step(graph, cluster, "bf16", keep_block_replays=True)
    for got in (fast, again):
        assert got.step_time_s == slow.step_time_s and got.critical_stage == slow.critical_stage
        assert got.breakdown == slow.breakdown and list(got.breakdown) == list(slow.breakdown)
        assert got.stage_end.tobytes() == slow.stage_end.tobytes()
    f_dur, b_dur, f_release = fast.task_durations
    for layout, want in ((step._durations_layout(f_dur, b_dur), np.concatenate((f_dur, b_dur), axis=1).ravel()),
                         (step._release_layout(f_release), np.asarray(f_release, dtype=float).ravel())):
        assert layout[0].tobytes() == want.tobytes() == layout[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_graph_facts_hold_the_keys_built_per_call(h100, data):
    graph, _ = _graph(data, h100)
    assume(graph is not None)
    cache.clear()
    facts = step._graph_facts(graph)
    assert step._graph_facts(graph) is facts
    kinds, groups = task_kinds(graph.plan), _stage_groups_shared(graph)
    assert facts.kinds is kinds and facts.groups is groups
    assert facts.kinds_key == cache.object_key(kinds[0])
    assert facts.nic_key == nic_key(graph, kinds) and hash(facts.nic_key) == hash(nic_key(graph, kinds))
    assert facts.statics_key == statics_key(groups, graph.plan)
    assert facts.sync_key.value == (cache.object_key(graph.stages), graph.plan.chunk_layers)
