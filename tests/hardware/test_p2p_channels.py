"""NCCL's channels per network peer for a send/recv (comet/hardware/p2p_channels.py), by hand from
NCCL's rules (libnccl 2.32.3): ceil(NIC GB/s / 14) channels per net peer, halved while
channels x ceil(nRanks / 8) > p2pnChannels; p2pnChannels from the search (one ring per NIC, doubled by
ncclTopoDupChannels when at most 4 rings of 25-50 GB/s, doubled again by ncclTopoPostset); each channel
sized for 14 GB/s."""

import dataclasses

import pytest

from comet.config.cluster import NetworkDim
from comet.hardware.network import PROTOCOLS, p2p_time_s
from comet.hardware.p2p_channels import (comm_channels, net_channels_per_peer, net_p2p_rate_GBps, nvlink_channels,
                                         nvlink_p2p_rate_GBps)

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


MiB = 2**20


@pytest.mark.parametrize("ranks, msg, channels", [
    # H100 NVLink (18 links of 20.6 GB/s in NCCL's model): 6 rings of 60 GB/s, duplicated, doubled:
    # 24 -> 32 p2p channels; 36 -> 32 channels per peer; nChannelsMin halves while ranks x n > 32
    (8, 32 * MiB, 4),      # 8 ranks: 4 channels; 8 MiB a channel <= 16 MiB
    (8, 64 * MiB, 4),      # 16 MiB a channel: not more than 16 MiB, still 4
    (8, 128 * MiB, 8),     # 32 MiB > 16 MiB: doubled to 8
    (8, 256 * MiB, 16),
    (8, 1024 * MiB, 32),   # up to the 32 channels per peer
    (4, 32 * MiB, 8),      # 4 ranks: 8 channels from the start
    (4, 256 * MiB, 16),
    (2, 32 * MiB, 16),
    (8, 128 * 1024, 2),    # 128 KiB: one channel per 64 KiB chunk (NCCL_P2P_NVL_CHUNKSIZE / 8)
])
def test_nvlink_channels_of_a_single_node_send_by_hand(ranks, msg, channels):
    assert nvlink_channels(450, ranks, msg) == channels
    assert nvlink_p2p_rate_GBps(450, ranks, msg) == pytest.approx(20.6 * channels)


def test_a_single_node_send_runs_at_its_channels_rate_until_the_port_binds(h100):
    ideal = dict(latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    c = dataclasses.replace(h100, network=(NetworkDim("node", 8, 450.0, **ideal), NetworkDim("fabric", 0, 50.0, **ideal)))
    # 8 ranks, 32 MiB: 4 channels x 20.6 GB/s; 1 GiB: 32 x 20.6 = 659 GB/s > the 450 GB/s port
    assert p2p_time_s(32 * MiB, 1, c, ranks=8, local_ranks=8) == pytest.approx(SIMPLE_BASE + 32 * MiB / (4 * 20.6e9))
    assert p2p_time_s(1024 * MiB, 1, c, ranks=8, local_ranks=8) == pytest.approx(SIMPLE_BASE + 1024 * MiB / 450e9)
    # communicator not known: the port
    assert p2p_time_s(32 * MiB, 1, c) == pytest.approx(SIMPLE_BASE + 32 * MiB / 450e9)
