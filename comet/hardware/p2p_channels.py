"""How many NCCL channels a point-to-point send to a peer on another node gets, and what rate they reach.

Read from NCCL's own code: the host code of libnccl.so.2 in the nvidia-nccl-cu12 2.32.3 wheel (symbols
and defaults as disassembled; the NCCL source is not on PyPI), with the names of NCCL's source:

  * ncclTopoComputeP2pChannelsPerPeer: unless NCCL_NCHANNELS_PER_NET_PEER is set, a peer reached
    through the network gets max(local NICs, ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW)) channels;
    NCCL_P2P_PER_CHANNEL_NET_BW defaults to 14 (GB/s a channel is sized for). A 400 Gb/s NIC
    (50 GB/s): 4 channels.
  * ncclTopoComputeP2pChannels (communicators spanning nodes, NCCL_NCHANNELS_PER_NET_PEER unset):
    p2pnChannels is the communicator's channel count rounded up to a power of two (at most
    NCCL_MAX_P2P_NCHANNELS, 64), and the channels per peer halve while
    channels x ceil(nRanks / 8) > p2pnChannels.
  * addP2pToPlan: a send uses up to that many channels, one per chunk of the op (a large buffer all).

The communicator's channel count (p2pnChannels before rounding) comes from NCCL's topology search, whose
rules are in the same binary (comm_channels): an inter-node ring graph runs at most 48 GB/s a channel
(sm90SpeedArrayInter starts at 48), and comm takes one ring per NIC the communicator's ranks use on a
node; ncclTopoDupChannels doubles a graph of >= 25 GB/s a channel but, on sm90 below 50 GB/s, only one
of at most 4 channels; ncclTopoPostset doubles the channels again ("nChannels*2", at most 64). So 1, 2
and 4 GPUs per node give 4, 8 and 16 channels, 8 GPUs per node 16 (not 32). NCCL prints the result at
init: "%d coll channels, ..., %d p2p channels, %d p2p channels per peer".

So nccl-tests sendrecv between 2 nodes of 400 Gb/s NICs gets 4 channels (more than the NIC); over 10
nodes 2 with 1, 2 or 4 GPUs per node (4 x ceil(10/8) = 8 > 4 channels, 2 x 2 <= 4): 28 GB/s, and 1 with
8 GPUs per node (4 x 10 > 16, 2 x 10 > 16): 14 GB/s. collectives.csv: 24.9-26.2 GB/s on 10 nodes with
1, 2 or 4 GPUs per node, 15.2 GB/s with 8, 44-46 GB/s on 2 nodes, while the ring all-gather on the same
10 nodes runs at 46-48 GB/s per NIC.
"""

from __future__ import annotations

import math

P2P_PER_CHANNEL_NET_GBPS = 14.0   # NCCL_P2P_PER_CHANNEL_NET_BW default (libnccl 2.32.3)
P2P_RANKS_PER_CHANNEL = 8         # ncclTopoComputeP2pChannels: channels x ceil(nRanks / 8) <= p2pnChannels
MAX_P2P_NCHANNELS = 64            # NCCL_MAX_P2P_NCHANNELS default and MAXCHANNELS (libnccl 2.32.3)
INTER_CHANNEL_MAX_GBPS = 48.0     # sm90SpeedArrayInter[0]: the fastest inter-node channel the search tries
DUP_MIN_GBPS, DUP_FULL_GBPS, DUP_MAX_CHANNELS = 25.0, 50.0, 4   # ncclTopoDupChannels thresholds (sm90)


def _pow2_up(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def comm_channels(nic_GBps: float, local_ranks: int) -> int:
    """Channels of a communicator spanning nodes whose `local_ranks` ranks per node each use their own
    NIC (module doc): one ring per NIC, duplicated by ncclTopoDupChannels, doubled by ncclTopoPostset."""
    rings = max(1, local_ranks)
    bw = min(INTER_CHANNEL_MAX_GBPS, nic_GBps)
    if bw >= DUP_FULL_GBPS or (bw >= DUP_MIN_GBPS and rings <= DUP_MAX_CHANNELS):
        rings *= 2
    return min(MAX_P2P_NCHANNELS, 2 * rings)


def net_channels_per_peer(nic_GBps: float, ranks: int = 0, local_ranks: int = 1) -> int:
    """Channels NCCL gives a send to a peer on another node over a NIC of nic_GBps, in a communicator
    of `ranks` ranks, `local_ranks` of them (each with its own NIC) per node; ranks <= 0: not known,
    the per-peer count before the communicator-size rule."""
    per_peer = _pow2_up(max(1, math.ceil(nic_GBps / P2P_PER_CHANNEL_NET_GBPS)))
    if ranks <= 0:
        return per_peer
    p2p_channels = _pow2_up(min(MAX_P2P_NCHANNELS, comm_channels(nic_GBps, local_ranks)))
    groups = math.ceil(ranks / P2P_RANKS_PER_CHANNEL)
    while per_peer > 1 and per_peer * groups > p2p_channels:
        per_peer //= 2
    return min(per_peer, p2p_channels)


def net_p2p_rate_GBps(nic_GBps: float, ranks: int = 0, local_ranks: int = 1) -> float:
    """The rate the send's channels are sized for (channels x NCCL_P2P_PER_CHANNEL_NET_BW); the NIC
    caps it where it is lower."""
    return net_channels_per_peer(nic_GBps, ranks, local_ranks) * P2P_PER_CHANNEL_NET_GBPS
