"""replay_step's per-graph facts and prebuilt task-level layouts (comet/replay/step.py, branch
i21s-step) against the path that builds every key and layout per call, on random configurations."""

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from comet.replay import cache, step
from comet.replay.contention import nic_key
from comet.replay.schedule import task_kinds
from comet.replay.tails import _stage_groups_shared, statics_key

from test_stage_work import random_graph


def _fresh_graph(data, h100):
    """A random small-model step graph and its cluster, drawn with every cache emptied."""
    graph, cluster = random_graph(data, h100, zero_max=3, batches=st.integers(1, 4))
    assume(graph is not None)
    cache.clear()
    return graph, cluster


_examples = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_examples
@given(st.data())
def test_step_with_graph_facts_equals_the_per_call_path(h100, data):
    graph, cluster = _fresh_graph(data, h100)
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


@_examples
@given(st.data())
def test_graph_facts_hold_the_keys_built_per_call(h100, data):
    graph, _ = _fresh_graph(data, h100)
    facts = step._graph_facts(graph)
    assert step._graph_facts(graph) is facts
    kinds, groups = task_kinds(graph.plan), _stage_groups_shared(graph)
    assert facts.kinds is kinds and facts.groups is groups
    assert facts.kinds_key == cache.object_key(kinds[0])
    assert facts.nic_key == nic_key(graph, kinds) and hash(facts.nic_key) == hash(nic_key(graph, kinds))
    assert facts.statics_key == statics_key(groups, graph.plan)
    assert facts.sync_key.value == (cache.object_key(graph.stages), graph.plan.chunk_layers)
