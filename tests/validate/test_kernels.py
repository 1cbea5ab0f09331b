"""`comet validate` on the kernel- and NCCL-level files: every row predicted or skipped with a reason,
the error reported per collective / scale / source, and a size label or a busbw-only row read right."""

import json
import math
from pathlib import Path

import pytest

from comet.cli import main
from comet.validate.kernels import file_kind, size_bytes, stats, summary, validate_kernels

ROOT = Path(__file__).resolve().parents[2]
CAL = ROOT.parent / "shared" / "calibration"
needs_shared = pytest.mark.skipif(not (CAL / "collectives.csv").is_file(),
                                  reason="../shared/calibration/collectives.csv not present")
HEADER = ("source,gpu,num_gpus,num_nodes,gpus_per_node,fabric,nccl_version,settings,collective,size_bytes,dtype,"
          "time_us,algbw_GBps,busbw_GBps,scaleout,algo,notes")


def test_size_labels_and_file_kinds():
    assert size_bytes("65K") == 65536 and size_bytes("8G") == 8 * 2**30 and size_bytes("1048576") == 2**20
    assert math.isnan(size_bytes("large"))
    assert file_kind(HEADER.split(",")) == "collectives"
    assert file_kind(["source", "gpu", "kernel", "bytes", "GBps", "notes"]) == "memory"
    assert file_kind(["source", "model", "value"]) is None


def test_rows_by_hand(tmp_path):
    # 8 x H100 ring all-gather of 1 GiB: (n-1)/n * S / (450 GB/s * 0.82) + latency; a busbw-only row
    # becomes the time it implies; an unknown GPU is skipped with its reason
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "\n"
                 "s,H100 SXM,8,1,8,NVLink,x,NCCL_ALGO=Ring,all_gather,1073741824,float,3300,,,none,ring,\n"
                 "s,H100 SXM,8,1,8,NVLink,x,default,all_reduce,8G,float,,,470,none,nvls,\n"
                 "s,MI300X,8,1,8,xGMI,x,default,all_reduce,8G,float,100,,,none,default,\n")
    kind, rows = validate_kernels(p, ROOT / "cluster_specs")
    assert kind == "collectives"
    ag, ar, mi = rows
    assert ag.predicted_s == pytest.approx(7 / 8 * 2**30 / (450e9 * 0.82), rel=0.02)
    assert ar.measured_s == pytest.approx(8 * 2**30 * 2 * 7 / 8 / 470e9)
    assert ar.detail.endswith("nvls") and abs(ar.error_pct) < 5
    assert mi.skip.startswith("no cluster spec")
    assert stats(rows).n == 2 and set(summary(rows)) == {"overall", "kind", "scale", "source"}


@needs_shared
def test_collectives_csv_report(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["validate", str(CAL / "collectives.csv"), "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kind: all_reduce" in text and "scale: 80 GPUs = 10 x 8" in text
    doc = json.loads(out.read_text())
    assert doc["predicted"] >= 0.9 * len(doc["rows"])
    # regression guard at the level reached (docs/network.md), not a target: 18.3% on 2026-11-22,
    # 10.9% with NCCL's p2p channels for sendrecv (2026-11-23)
    assert doc["mape_pct"] < 12.0


@needs_shared
@pytest.mark.parametrize("name", ["gemm.csv", "attention.csv", "memory.csv"])
def test_kernel_files_report(name, capsys):
    assert main(["validate", str(CAL / name), "--quiet"]) == 0
    assert "rows predicted" in capsys.readouterr().out


def test_rows_run_on_the_spec_of_their_fabric(tmp_path):
    # a 2 x 8 H100 ring all-reduce of 8 GiB on IB NDR (50 GB/s per GPU) and on GCP A3 Mega's
    # GPUDirect-TCPXO (25 GB/s per GPU, no NVLS): on IB the ring is bound by NVLink (450 GB/s x 0.82
    # < 8 NICs x 50 GB/s x 0.95), on TCPXO by the node's 8 NICs
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "\n"
                 "s,H100 SXM,16,2,8,IB,x,NCCL_ALGO=Ring,all_reduce,8589934592,float,40000,,,ib-ndr-400g,ring,\n"
                 "s,H100 SXM,16,2,8,TCPXO,x,NCCL_ALGO=Ring,all_reduce,8589934592,float,80000,,,gcp-tcpxo,ring,\n"
                 "s,H100 SXM,16,2,8,TCPXO,x,default,all_reduce,8589934592,float,80000,,,gcp-tcpxo,default,\n")
    _, (ib, tcpxo, default) = validate_kernels(p, ROOT / "cluster_specs")
    assert ib.detail == "h100_dgx ring" and tcpxo.detail == "h100_a3mega ring"
    assert ib.predicted_s == pytest.approx(2 * 15 / 16 * 2**33 / (450e9 * 0.82), rel=0.02)
    assert tcpxo.predicted_s == pytest.approx(2 * 15 / 16 * 2**33 / (8 * 25e9 * 0.95), rel=0.02)
    assert "nvls" not in default.detail          # A3 Mega runs without NVLink SHARP


def test_an_h800_row_runs_at_the_h800_nvlink_rate(tmp_path):
    # H800: the H100 die with NVLink cut to 200 GB/s per direction: an 8-GPU ring all-gather of 1 GiB
    # takes 7/8 x 1 GiB / (200 GB/s x 0.82), 2.25x the H100's time
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "\n"
                 "s,H800 SXM,8,1,8,NVLink,x,NCCL_ALGO=Ring,all_gather,1073741824,float,6000,,,none,ring,\n"
                 "s,H100 SXM,8,1,8,NVLink,x,NCCL_ALGO=Ring,all_gather,1073741824,float,3000,,,none,ring,\n")
    _, (h800, h100) = validate_kernels(p, ROOT / "cluster_specs")
    assert h800.detail == "h800_hgx ring"
    assert h800.predicted_s == pytest.approx(7 / 8 * 2**30 / (200e9 * 0.82), rel=0.02)
    assert h800.predicted_s == pytest.approx(2.25 * h100.predicted_s, rel=0.02)


def test_every_spec_named_for_a_system_exists_and_loads():
    from comet.config.cluster import load_cluster
    from comet.validate.kernels import SPEC_FOR
    for spec in SPEC_FOR.values():
        assert load_cluster(ROOT / "cluster_specs" / f"{spec}.yaml").network


def test_sendrecv_rows_run_on_nccls_channels_per_network_peer(tmp_path):
    # nccl-tests sendrecv of 1 GiB between nodes (one GPU each): over 2 nodes NCCL gives the peer 4
    # channels of 14 GB/s, more than the NIC's 50 GB/s x 0.95; over 10 nodes 2 channels, 28 GB/s.
    # RoCE rows run on the RoCE spec (50 GB/s x 0.937), H200 rows on the H200 spec
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "\n"
                 "s,H100 SXM,2,2,1,IB,x,default,sendrecv,1073741824,float,23000,,,ib-ndr-400g,default,\n"
                 "s,H100 SXM,10,10,1,IB,x,default,sendrecv,1073741824,float,43000,,,unstated,default,\n"
                 "s,H100 SXM,2,2,1,RoCE,x,default,sendrecv,1073741824,float,23000,,,roce-400g,default,\n"
                 "s,H200 SXM,2,2,1,IB,x,default,sendrecv,1073741824,float,23000,,,ib-ndr-400g,default,\n")
    _, (two, ten, roce, h200) = validate_kernels(p, ROOT / "cluster_specs")
    assert two.predicted_s == pytest.approx(2**30 / (50e9 * 0.95), rel=0.03)
    assert ten.predicted_s == pytest.approx(2**30 / 28e9, rel=0.03)
    assert roce.detail == "h100_roce p2p" and roce.predicted_s == pytest.approx(2**30 / (50e9 * 0.937), rel=0.03)
    assert h200.detail == "h200_dgx p2p" and h200.predicted_s == pytest.approx(two.predicted_s)
