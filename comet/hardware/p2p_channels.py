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

The communicator's channel count is not a constant of NCCL but the result of its topology search; comm
takes 4 per NIC the communicator's ranks use on a node (the search's ring per NIC, doubled for
bandwidth >= 25 GB/s per channel in search.cc and again when the rings are set up), which a user reads
off NCCL's init line "%d coll channels, ..., %d p2p channels, %d p2p channels per peer".

So nccl-tests sendrecv between 2 nodes of 400 Gb/s NICs gets 4 channels (more than the NIC), over 10
nodes 2 (10 ranks: 4 x 2 > 4 channels): 28 GB/s. collectives.csv: 24.9-26.2 GB/s on 10 nodes with 1,
2 or 4 GPUs per node, 44-46 GB/s on 2 nodes, where the ring all-gather on the same 10 nodes runs at
46-48 GB/s per NIC.
"""

from __future__ import annotations

import math

P2P_PER_CHANNEL_NET_GBPS = 14.0   # NCCL_P2P_PER_CHANNEL_NET_BW default (libnccl 2.32.3)
P2P_RANKS_PER_CHANNEL = 8         # ncclTopoComputeP2pChannels: channels x ceil(nRanks / 8) <= p2pnChannels
MAX_P2P_NCHANNELS = 64            # NCCL_MAX_P2P_NCHANNELS default (libnccl 2.32.3)
CHANNELS_PER_NIC = 4              # the communicator's channels per NIC in use (topology search; module doc)


def _pow2_up(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def net_channels_per_peer(nic_GBps: float, ranks: int = 0, local_ranks: int = 1) -> int:
    """Channels NCCL gives a send to a peer on another node over a NIC of nic_GBps, in a communicator
    of `ranks` ranks, `local_ranks` of them (each with its own NIC) per node; ranks <= 0: not known,
    the per-peer count before the communicator-size rule."""
    per_peer = _pow2_up(max(1, math.ceil(nic_GBps / P2P_PER_CHANNEL_NET_GBPS)))
    if ranks <= 0:
        return per_peer
    p2p_channels = _pow2_up(min(MAX_P2P_NCHANNELS, CHANNELS_PER_NIC * max(1, local_ranks)))
    groups = math.ceil(ranks / P2P_RANKS_PER_CHANNEL)
    while per_peer > 1 and per_peer * groups > p2p_channels:
        per_peer //= 2
    return min(per_peer, p2p_channels)


def net_p2p_rate_GBps(nic_GBps: float, ranks: int = 0, local_ranks: int = 1) -> float:
    """The rate the send's channels are sized for (channels x NCCL_P2P_PER_CHANNEL_NET_BW); the NIC
    caps it where it is lower."""
    return net_channels_per_peer(nic_GBps, ranks, local_ranks) * P2P_PER_CHANNEL_NET_GBPS
