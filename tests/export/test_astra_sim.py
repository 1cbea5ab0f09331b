"""`comet export astra-sim`: ET files that the Chakra schema reads, SEND/RECV pairs for the pipeline,
and network / system / memory configs that describe the cluster."""

import json
import sys
from pathlib import Path

import pytest
import yaml

from comet.cli import main
from comet.config.cluster import MemoryTier
from comet.config.parallel import ParallelConfig
from comet.evaluate import resolve
from comet.export.astra_sim import export, npus_per_dim, remote_memory_config
from comet.trace.chakra import decode_et

CONFIG = {"model": "gpt_1_7b", "cluster": "h100_dgx", "gpus": 32, "tp": 4, "pp": 2, "global_batch": 16}


def test_cli_writes_every_distinct_rank_and_the_configs(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    assert main(["export", "astra-sim", str(cfg), "-o", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    ets = sorted((out / "et").glob("comet.*.et"))
    assert [p.name for p in ets] == ["comet.0.et", "comet.16.et"]          # one per pipeline stage
    net = yaml.safe_load((out / "network.yml").read_text())
    assert net["topology"] == ["Switch", "Switch"] and net["npus_count"] == [8, 4]
    assert net["bandwidth"][1] == pytest.approx(50 * 0.95) and net["latency"][1] == pytest.approx(14000)
    assert json.loads((out / "system.json").read_text())["all-reduce-implementation"] == ["ring", "ring"]
    ranks = json.loads((out / "ranks.json").read_text())["et_of_rank"]
    assert ranks["15"] == "et/comet.0.et" and ranks["16"] == "et/comet.16.et" and len(ranks) == 32
    sends, recvs = {}, {}
    for p in ets:
        meta, nodes = decode_et(p.read_bytes(), str(p))
        ids = {n["id"] for n in nodes}
        assert all(d in ids for n in nodes for d in n.get("data_deps", []))   # no dangling (cross-rank) deps
        for n in nodes:
            a = n.get("attrs", n.get("attr", {}))
            if n["type"] in (5, 6):   # COMM_SEND_NODE, COMM_RECV_NODE
                (sends if n["type"] == 5 else recvs)[a["comm_tag"]] = (a["comm_src"], a["comm_dst"], a["comm_size"])
    assert sends and sends == recvs        # every pipeline send has its receive, same ends and bytes


def test_et_parses_with_the_official_protobuf_runtime(tmp_path):
    pytest.importorskip("google.protobuf")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
    from test_chakra_protobuf import _classes
    from comet.trace.chakra import _varint
    Meta, Node = _classes()
    from comet.config.cluster import load_cluster
    from comet.config.model import load_model
    model, cluster = load_model("gpt_1_7b"), load_cluster("h100_dgx")
    par = resolve(model, cluster, ParallelConfig(tp=2, pp=2, gpus=8, global_batch=4))
    written = export(model, cluster, par, tmp_path)
    for path in written["et"]:
        data, pos, n_nodes = Path(path).read_bytes(), 0, 0
        n, pos = _varint(data, pos)
        assert Meta.FromString(data[pos:pos + n]).version == "0.0.4"
        pos += n
        while pos < len(data):
            n, pos = _varint(data, pos)
            node = Node.FromString(data[pos:pos + n])
            assert node.name and node.type in (4, 5, 6, 7)
            pos += n
            n_nodes += 1
        assert n_nodes > 100


def test_npus_and_memory_configs(h100):
    assert npus_per_dim(h100, 4096) == [8, 32, 16]       # node, 256-GPU scalable unit, spine
    assert npus_per_dim(h100, 4) == [4, 1, 1]
    assert remote_memory_config(h100, 64) == {"memory-type": "NO_MEMORY_EXPANSION"}
    node = h100.with_changes(memory_expansion=MemoryTier("ddr", 2048, 400, shared_by=8, latency_us=0.3))
    cfg = remote_memory_config(node, 64)
    assert cfg["memory-type"] == "PER_NODE_MEMORY_EXPANSION" and cfg["num-nodes"] == 8
    assert cfg["remote-mem-bw"] == 400 and cfg["remote-mem-latency"] == pytest.approx(300)
