"""NCCL's channels per network peer for a send/recv (comet/hardware/p2p_channels.py), by hand from
NCCL's rules (libnccl 2.32.3): ceil(NIC GB/s / 14) channels per net peer, halved while
channels x ceil(nRanks / 8) > p2pnChannels; p2pnChannels from the search (one ring per NIC, doubled by
ncclTopoDupChannels when at most 4 rings of 25-50 GB/s, doubled again by ncclTopoPostset); each channel
sized for 14 GB/s."""

import dataclasses

import pytest

from comet.config.cluster import NetworkDim
from comet.hardware.network import PROTOCOLS, p2p_time_s
from comet.hardware.p2p_channels import comm_channels, net_channels_per_peer, net_p2p_rate_GBps

SIMPLE_BASE = PROTOCOLS["simple"][1]
GB = 1e9


@pytest.mark.parametrize("nic, ranks, local, channels", [
    (50, 0, 1, 4),      # communicator not known: ceil(50 / 14) = 4
    (25, 0, 1, 2),      # a 200 Gb/s NIC: ceil(25 / 14) = 2
    (50, 2, 1, 4),      # 2 nodes x 1 GPU: 4 x ceil(2/8) = 4 <= 4 channels
    (50, 16, 8, 4),     # 2 nodes x 8 GPUs: 4 x 2 = 8 <= 16
    (50, 10, 1, 2),     # 10 nodes x 1 GPU: 4 x 2 = 8 > 4, 2 x 2 = 4 <= 4
    (50, 20, 2, 2),     # 10 nodes x 2 GPUs: 4 x 3 = 12 > 8, 2 x 3 = 6 <= 8
    (50, 40, 4, 2),     # 10 nodes x 4 GPUs: 4 x 5 = 20 > 16, 2 x 5 = 10 <= 16
    (50, 80, 8, 1),     # 10 nodes x 8 GPUs: 4 x 10 = 40 > 16, 2 x 10 = 20 > 16
    (50, 200, 1, 1),    # 200 nodes x 1 GPU: 2 x 25 = 50 > 4
])
def test_channels_per_network_peer_by_hand(nic, ranks, local, channels):
    assert net_channels_per_peer(nic, ranks, local) == channels
    assert net_p2p_rate_GBps(nic, ranks, local) == 14 * channels


@pytest.mark.parametrize("nic, local, channels", [
    (50, 1, 4), (50, 2, 8), (50, 4, 16),    # 1-4 rings of 48 GB/s: duplicated, then doubled
    (50, 8, 16),                            # 8 rings below 50 GB/s: not duplicated (sm90), doubled
    (25, 1, 4), (20, 1, 2),                 # a ring below 25 GB/s is not duplicated
])
def test_communicator_channels_by_hand(nic, local, channels):
    assert comm_channels(nic, local) == channels


def test_a_send_across_10_nodes_runs_on_two_channels_and_one_inside_a_node_is_unchanged(h100):
    ideal = dict(latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    c = dataclasses.replace(h100, network=(NetworkDim("node", 4, 100.0, **ideal), NetworkDim("fabric", 0, 50.0, **ideal)))
    # across nodes: 2 nodes -> 4 channels (56 GB/s), the NIC's 50 GB/s binds; 10 nodes of 1 GPU ->
    # 2 channels, 28 GB/s; communicator not given: the NIC
    assert p2p_time_s(GB, 4, c, ranks=2, local_ranks=1) == pytest.approx(SIMPLE_BASE + GB / 50e9)
    assert p2p_time_s(GB, 4, c, ranks=10, local_ranks=1) == pytest.approx(SIMPLE_BASE + GB / 28e9)
    assert p2p_time_s(GB, 4, c) == pytest.approx(SIMPLE_BASE + GB / 50e9)
    # inside the node no network channel is involved, whatever the communicator
    assert p2p_time_s(GB, 1, c, ranks=10, local_ranks=1) == pytest.approx(SIMPLE_BASE + GB / 100e9)
