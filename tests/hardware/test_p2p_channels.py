"""NCCL's channels per network peer for a send/recv (comet/hardware/p2p_channels.py), by hand from
NCCL's rule: 2 channels per net peer (NCCL_NCHANNELS_PER_NET_PEER), halved while
channels x nRanks > p2pnChannels x 4, with p2pnChannels = 4 channels per NIC in use; one channel moves
half a NIC."""

import dataclasses

import pytest

from comet.config.cluster import NetworkDim
from comet.hardware.network import PROTOCOLS, p2p_time_s
from comet.hardware.p2p_channels import net_channels_per_peer, net_p2p_share

SIMPLE_BASE = PROTOCOLS["simple"][1]
GB = 1e9


@pytest.mark.parametrize("ranks, local, channels", [
    (0, 1, 2),      # communicator not known: NCCL's default, 2 channels
    (2, 1, 2),      # 2 nodes x 1 GPU: 2 x 2 = 4 <= 4 channels x 4
    (16, 8, 2),     # 2 nodes x 8 GPUs: 2 x 16 = 32 <= 32 x 4
    (16, 2, 2),     # 8 nodes x 2 GPUs: 32 <= 8 x 4 (the last node count that keeps 2)
    (18, 2, 1),     # 9 nodes x 2 GPUs: 36 > 32
    (10, 1, 1),     # 10 nodes x 1 GPU: 20 > 4 x 4
    (80, 8, 1),     # 10 nodes x 8 GPUs: 160 > 32 x 4
])
def test_channels_per_network_peer_by_hand(ranks, local, channels):
    assert net_channels_per_peer(ranks, local) == channels
    assert net_p2p_share(ranks, local) == channels / 2


def test_a_send_across_more_than_8_nodes_gets_half_the_nic_and_one_inside_a_node_is_unchanged(h100):
    ideal = dict(latency_us=0.0, bus_efficiency=1.0, half_efficiency_bytes=0.0)
    c = dataclasses.replace(h100, network=(NetworkDim("node", 4, 100.0, **ideal), NetworkDim("fabric", 0, 10.0, **ideal)))
    # across nodes: 2 nodes -> 2 channels, the NIC's 10 GB/s; 10 nodes of 1 GPU -> 1 channel, 5 GB/s
    assert p2p_time_s(GB, 4, c, ranks=2, local_ranks=1) == pytest.approx(SIMPLE_BASE + GB / 10e9)
    assert p2p_time_s(GB, 4, c, ranks=10, local_ranks=1) == pytest.approx(SIMPLE_BASE + GB / 5e9)
    assert p2p_time_s(GB, 4, c) == pytest.approx(SIMPLE_BASE + GB / 10e9)       # communicator not given
    # inside the node no network channel is involved, whatever the communicator
    assert p2p_time_s(GB, 1, c, ranks=10, local_ranks=1) == pytest.approx(SIMPLE_BASE + GB / 100e9)
