"""`comet trace replay` / `comet trace import` end to end, and the replay figures on the real fixtures."""

from __future__ import annotations

import json

import pytest

from comet.cli import main
from comet.trace import load_trace
from comet.trace.replay import rank_offsets, replay_trace

from trace_synth import kineto_doc, write_kineto

SINGLE = ["nccl_msg_args/nccl_data.json.gz", "nccl_msg_args/b200_eager_trace.json.gz",
          "single_gpu/alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
          "single_gpu/benchmark_simple_add_trace.json.gz"]


def test_dlrm_replay_within_5_percent_per_rank(traces):
    rep = replay_trace(load_trace(traces / "multi_rank_dlrm_8xV100"))
    assert [r.rank for r in rep.ranks] == list(range(8)) and rep.aligned
    for r in rep.ranks:
        assert r.measured_s > 0.01 and abs(r.error_pct) < 5.0, r
    assert abs(rep.error_pct) < 5.0
    assert rep.critical_path and rep.critical_path_len > len(rep.critical_path)


@pytest.mark.parametrize("name", SINGLE)
def test_single_rank_fixtures_replay(traces, name):
    rep = replay_trace(load_trace(traces / name))
    (r,) = rep.ranks
    assert r.measured_s > 0 and abs(r.error_pct) < 5.0, r


def test_offsets_only_when_clocks_comparable(tmp_path):
    g = load_trace(write_kineto(tmp_path / "near", [kineto_doc(0, 2), kineto_doc(1, 2, offset_us=30.0)]))
    assert rank_offsets(g) == {0: 0.0, 1: pytest.approx(30e-6)}
    far = load_trace(write_kineto(tmp_path / "far", [kineto_doc(0, 2), kineto_doc(1, 2, offset_us=5e6)]))
    assert rank_offsets(far) == {}       # different hosts' clocks: every rank starts at 0
    assert not replay_trace(far).aligned


def test_cli_replay_json(traces, capsys):
    assert main(["trace", "replay", str(traces / "multi_rank_dlrm_8xV100"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"ranks", "measured_s", "predicted_s", "error_pct", "critical_path"} <= set(out)
    assert [r["rank"] for r in out["ranks"]] == list(range(8))
    assert all(set(r) == {"rank", "measured_s", "predicted_s", "error_pct"} for r in out["ranks"])
    assert all(abs(r["error_pct"]) < 5 for r in out["ranks"])
    assert {"name", "rank", "stream", "kind", "duration_s"} <= set(out["critical_path"][0])


def test_cli_import_then_replay_graph_json_and_timeline(tmp_path, capsys):
    write_kineto(tmp_path / "in", [kineto_doc(0, 2), kineto_doc(1, 2, offset_us=20.0)])
    graph = tmp_path / "g.json"
    assert main(["trace", "import", str(tmp_path / "in"), "-o", str(graph), "--chakra-out", str(tmp_path / "et"),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["matched_comms"] == 1 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "et").iterdir()) == ["comet.0.et", "comet.1.et"]
    tl = tmp_path / "tl.json"
    assert main(["trace", "replay", str(graph), "--json", "--timeline", str(tl)]) == 0
    from_graph = json.loads(capsys.readouterr().out)
    assert main(["trace", "replay", str(tmp_path / "in"), "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert from_graph["ranks"] == direct["ranks"] and from_graph["predicted_s"] == direct["predicted_s"]
    events = json.loads(tl.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert {"cpu:100", "cuda:7", "cuda:20"} <= {e["tid"] for e in spans}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)


def test_cli_human_output(traces, capsys):
    assert main(["trace", "replay", str(traces / "single_gpu/benchmark_simple_add_trace.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "critical path" in out
    assert main(["trace", "import", str(traces / "chakra_et/astra_sim_all_reduce_8npus_1MB")]) == 0
    assert "1 matched collectives" in capsys.readouterr().out
