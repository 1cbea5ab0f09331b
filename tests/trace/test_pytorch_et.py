"""PyTorch execution traces: comm records (1.0.1 tensor tuples, >=1.1.0 attrs) and ET-only graphs."""

from __future__ import annotations

import collections
import gzip
import json
import tarfile

from comet.graph.ir import Collective, OpKind, ops
from comet.trace import load_trace
from comet.trace.pytorch_et import comm_records


def _dlrm_et(traces, rank):
    with tarfile.open(traces / "multi_rank_dlrm_8xV100/dlrm_pytorch_et.tar.gz") as tar:
        return json.load(tar.extractfile(f"dlrm_pytorch_et/dlrm_eg_{rank}.json"))


def test_dlrm_et_comm_records(traces):
    recs = comm_records(_dlrm_et(traces, 0), "dlrm_eg_0.json")
    # 13 record_param_comms = 8 collectives + 5 waits (README); sizes from tensor 6-tuples numel x itemsize
    assert [r.collective for r in recs] == ["all_to_allv", "all_to_all", "all_to_allv", "all_to_allv",
                                            "allreduce", "all_to_allv", "allreduce", "allreduce"]
    assert (recs[0].in_bytes, recs[0].out_bytes) == (6144 * 4, 6144 * 4)
    assert (recs[3].in_bytes, recs[3].out_bytes) == (3392 * 4, 768 * 4)
    assert recs[4].in_bytes == 394241 * 4


def test_resnet_et_attrs(traces):
    doc = json.loads(gzip.decompress((traces / "pytorch_et/resnet_2gpu_et.json.gz").read_bytes()))
    recs = comm_records(doc, "resnet")
    assert collections.Counter(r.collective for r in recs) == {"allreduce": 15, "broadcast": 6}
    assert all(r.group == "0" and r.group_size == 2 for r in recs)
    g = load_trace(traces / "pytorch_et/resnet_2gpu_et.json.gz")
    colls = [op for _, op in ops(g) if op.is_comm]
    assert len(colls) == 21 and all(op.duration_s is None for _, op in ops(g))
    assert {op.collective for op in colls} == {Collective.ALL_REDUCE, Collective.BROADCAST}
    # the 8 196 000-byte fc bucket of ResNet-50 (2048 x 1000 + 1000 floats), as in chakra.0.et
    assert 8196000.0 in {op.msg_bytes for op in colls}


def test_schema_102_allgather(traces):
    g = load_trace(traces / "pytorch_et/1.0.2-chakra.0.0.4.tgz")
    colls = [op for _, op in ops(g) if op.kind is OpKind.COLLECTIVE]
    assert len(colls) == 10
    # all_gather of 1-float tensors over the 2-rank PG from "## process_group:init ##": output 2 x 4 bytes
    assert {(op.collective, op.msg_bytes, op.group, op.group_size) for op in colls} == \
        {(Collective.ALL_GATHER, 8.0, "0", 2)}


def test_simple_add_et_alone_has_no_timings(traces):
    g = load_trace(traces / "single_gpu/benchmark_simple_add_et.json.gz")
    assert g.number_of_nodes() >= 1 and all(op.duration_s is None for _, op in ops(g))


def test_et_that_does_not_match_the_kineto_step(traces, tmp_path):
    import pytest

    from comet.errors import TraceError
    kineto = traces / "multi_rank_dlrm_8xV100/dlrm_kineto.tar.gz::dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json"
    doc = _dlrm_et(traces, 0)
    doc["nodes"] = [n for n in doc["nodes"] if not (n["name"] == "record_param_comms" and n["id"] == 727)]
    et = tmp_path / "dlrm_eg_0.json"
    et.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"dlrm_eg_0\.json: execution trace has 7 collectives but the Kineto "
                                         r"trace .* has 8"):
        load_trace([str(kineto), et])
    doc = _dlrm_et(traces, 0)
    for n in doc["nodes"]:
        if n["id"] == 727:
            n["inputs"][4] = "allreduce"          # first collective: all_to_allv in Kineto
    et.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"collective #0: execution trace says allreduce but .* has all_to_all"):
        load_trace([str(kineto), et])
