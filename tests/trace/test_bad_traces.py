"""Bad input: one TraceError / GraphError naming the file and the problem; via the CLI one line, exit 2."""

from __future__ import annotations

import gzip
import json
import tarfile

import pytest

from comet.cli import main
from comet.errors import GraphError, TraceError
from comet.trace import load_trace

from trace_synth import kineto_doc, write_kineto


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_truncated_gzip(traces, tmp_path, capsys):
    data = (traces / "nccl_msg_args/nccl_data.json.gz").read_bytes()
    bad = tmp_path / "nccl_data.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"nccl_data\.json\.gz: bad or truncated gzip"):
        load_trace(bad)
    assert "bad or truncated gzip" in _cli_error(capsys, ["trace", "import", str(bad)])


def test_truncated_json(traces, tmp_path, capsys):
    with tarfile.open(traces / "multi_rank_dlrm_8xV100/dlrm_kineto.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".json"))
        data = tar.extractfile(member).read()
    bad = tmp_path / "worker0.pt.trace.json"
    bad.write_bytes(data[:100_000])
    with pytest.raises(TraceError, match=r"worker0\.pt\.trace\.json: bad JSON at line \d+ column \d+.*truncated"):
        load_trace(bad)
    assert "bad JSON" in _cli_error(capsys, ["trace", "replay", str(bad)])


def test_truncated_tar(traces, tmp_path, capsys):
    data = (traces / "multi_rank_dlrm_8xV100/dlrm_kineto.tar.gz").read_bytes()
    bad = tmp_path / "dlrm_kineto.tar.gz"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceError, match=r"dlrm_kineto\.tar\.gz: bad or truncated tar archive"):
        load_trace(bad)
    assert "tar archive" in _cli_error(capsys, ["trace", "import", str(bad)])


def test_truncated_protobuf(traces, tmp_path, capsys):
    data = (traces / "chakra_et/astra_sim_all_reduce_8npus_1MB/all_reduce.0.et").read_bytes()
    bad = tmp_path / "all_reduce.0.et"
    bad.write_bytes(data[:-7])
    with pytest.raises(TraceError, match=r"all_reduce\.0\.et: bad or truncated Chakra ET protobuf"):
        load_trace(bad)
    garbage = tmp_path / "junk.1.et"
    garbage.write_bytes(b"\x05\xff\xff\xff\xff\xff")
    assert "Chakra ET protobuf" in _cli_error(capsys, ["trace", "import", str(garbage)])


@pytest.mark.parametrize("doc,what", [({"foo": 1, "bar": []}, "top-level keys: foo, bar"),
                                      ([1, 2, 3], "a JSON list")])
def test_foreign_json(tmp_path, capsys, doc, what):
    p = tmp_path / "other.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="other.json: not a Kineto trace"):
        load_trace(p)
    assert what in _cli_error(capsys, ["trace", "import", str(p)])


def test_kineto_without_events(tmp_path):
    p = tmp_path / "empty.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": []}).encode()))
    with pytest.raises(TraceError, match="empty.json.gz: Kineto trace has no CPU or GPU events"):
        load_trace(p)


def test_missing_rank(tmp_path, capsys):
    paths = write_kineto(tmp_path, [kineto_doc(r, 4) for r in (0, 1, 3)])
    with pytest.raises(TraceError, match=r"rank\(s\) 2 missing from the set: got ranks 0, 1, 3 of world_size 4"):
        load_trace(paths)
    assert "rank(s) 2 missing" in _cli_error(capsys, ["trace", "replay", str(tmp_path)])


def test_duplicate_rank(tmp_path):
    a = write_kineto(tmp_path / "a", [kineto_doc(0, 1)])
    b = write_kineto(tmp_path / "b", [kineto_doc(0, 1)])
    with pytest.raises(TraceError, match="two files claim rank 0"):
        load_trace(a + b)


def test_collective_without_partner(tmp_path, capsys):
    docs = [kineto_doc(0, 2, ("allreduce", "broadcast")), kineto_doc(1, 2, ("allreduce",))]
    write_kineto(tmp_path, docs)
    with pytest.raises(GraphError, match=r"rank-0\.json: collective ncclKernel_Broadcast\S* \(broadcast\) #1 on "
                                         r"process group '0' \(rank 0\) has no partner on rank\(s\) 1"):
        load_trace(tmp_path)
    assert "has no partner" in _cli_error(capsys, ["trace", "replay", str(tmp_path)])


def test_collective_kind_mismatch(tmp_path):
    write_kineto(tmp_path, [kineto_doc(0, 2, ("allreduce",)), kineto_doc(1, 2, ("broadcast",))])
    with pytest.raises(GraphError, match=r"collective #0 on process group '0' differs across ranks"):
        load_trace(tmp_path)


def test_dependency_cycle_in_graph_json(tmp_path, capsys):
    op = {"name": "k", "kind": "compute"}
    doc = {"comet_graph": 1, "graph": {}, "nodes": [{"id": "a", "op": op}, {"id": "b", "op": {**op, "name": "j"}}],
           "edges": [{"source": "a", "target": "b", "dep": "data"}, {"source": "b", "target": "a", "dep": "data"}]}
    p = tmp_path / "cyc.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match=r"cyc\.json: dependency cycle: (k -> j|j -> k)"):
        load_trace(p)
    assert "dependency cycle" in _cli_error(capsys, ["trace", "replay", str(p)])


def test_graph_json_bad_field(tmp_path):
    doc = {"comet_graph": 1, "nodes": [{"id": "a", "op": {"name": "k", "kind": "warp"}}], "edges": []}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"g\.json: nodes\[0\]: 'warp' is not a valid OpKind"):
        load_trace(p)


def test_graph_json_null_kind(tmp_path, capsys):
    # the fuzz corpus found a null kind reaching the replay's report (op.kind.value)
    doc = {"comet_graph": 1, "graph": {}, "nodes": [{"id": "a", "op": {"name": "k", "kind": None}}], "edges": []}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"g\.json: nodes\[0\]\.kind: must be one of .*got null"):
        load_trace(p)
    assert "nodes[0]." in _cli_error(capsys, ["trace", "replay", str(p)])


@pytest.mark.parametrize("rank_info, field", [
    ({"rank": 0, "measured_s": "1.5"}, r"graph\.ranks\[0\]\.measured_s must be a number"),
    ({"rank": 0, "step_start_us": [1]}, r"graph\.ranks\[0\]\.step_start_us must be a number"),
    ({"rank": "0"}, r"graph\.ranks\[0\]\.rank must be a rank number"),
    ({"measured_s": 1.0}, r"graph\.ranks\[0\]\.rank must be a rank number"),
    ({"rank": 0, "root": ["a"]}, r"graph\.ranks\[0\]\.root must be a node id"),
])
def test_graph_json_bad_rank_info(tmp_path, capsys, rank_info, field):
    # what the trace replay reads of each rank is checked where the file is read (the fuzz corpus found a
    # string measured_s reaching the replay's arithmetic)
    doc = {"comet_graph": 1, "graph": {"ranks": [rank_info]}, "nodes": [{"id": "a", "op": {"name": "k", "kind": "compute"}}],
           "edges": []}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"g\.json: " + field):
        load_trace(p)
    assert "graph.ranks[0]." in _cli_error(capsys, ["trace", "replay", str(p)])


def test_missing_path_and_empty_dir(tmp_path, capsys):
    with pytest.raises(TraceError, match="no such file or directory"):
        load_trace(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    assert "holds no trace files" in _cli_error(capsys, ["trace", "import", str(tmp_path / "empty")])


def test_bad_step_flag(tmp_path, capsys):
    write_kineto(tmp_path, [kineto_doc(0, 1)])
    assert "--step: must be a step number or 'all'" in _cli_error(capsys, ["trace", "import", str(tmp_path),
                                                                           "--step", "last"])
