"""timing.transfer_call / transfer_s (a block table's transfers, replay/blocks.py) equal op_time_s bit for bit."""

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.cluster import load_cluster
from comet.graph.ir import Collective, GroupKind, Op, OpKind
from comet.replay import cache
from comet.replay.timing import op_time_s, transfer_call, transfer_s

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = [load_cluster(p) for p in sorted((ROOT / "cluster_specs").glob("*.yaml"))]


def _outcome(f):
    try:
        return f()
    except Exception as e:     # the same error either way
        return type(e)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV]), st.sampled_from([None, *Collective]),
       st.sampled_from([None, *GroupKind]), st.floats(0, 1e11) | st.integers(0, 2**40),
       st.sampled_from([1, 2, 3, 4, 8, 16, 64, 512]), st.sampled_from([1, 2, 8, 16, 64, 1024]), st.booleans(),
       st.sampled_from(range(len(CLUSTERS))), st.booleans())
def test_transfer_s_equals_op_time_s(kind, collective, group, msg_bytes, size, stride, flat, c, cached):
    cluster = CLUSTERS[c]
    op = Op("t", kind, collective=collective, group_kind=group, msg_bytes=msg_bytes, group_size=size,
            group_stride=stride, flat_ring=flat)
    if not cached:
        cache.clear()
    head, cost = transfer_call(op)
    fast = _outcome(lambda: transfer_s(head, cost, cache.network_key(cluster), cluster))
    cache.clear()
    reference = _outcome(lambda: op_time_s(op, cluster, "bf16"))
    assert type(fast) is type(reference) and (fast == reference if isinstance(fast, float) else fast is reference)
