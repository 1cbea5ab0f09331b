"""How many NCCL channels a point-to-point send over the network gets, and what share of the NIC that is.

NCCL runs a send/recv to a peer on another node over `p2p channels per peer` channels (NCCL 2.12-2.29,
names as in its source and its "Environment variables" documentation):

  * init.cc: p2pnChannelsPerPeer is the smallest channel count over all peers of the communicator,
    and a peer reached through the network gets NCCL_NCHANNELS_PER_NET_PEER channels (default 2);
    p2pnChannels (all channels p2p may use) is the communicator's collective channel count, rounded
    up to a power of two.
  * enqueue.cc (scheduleP2pTasksToPlan): "Avoid overloading channels with 8+ operations": the
    channels per peer, nChannelsMax, halve while nChannelsMax x nRanks > p2pnChannels x 4.
  * The collective channels of a communicator whose ranks each use their own NIC: the topology
    search finds one ring per NIC in use, search.cc duplicates a graph of >= 25 GB/s per channel
    (halving bwInter per channel) and connect.cc (ncclTopoPostset) doubles the rings again: 4
    channels per NIC in use, e.g. the 32 channels NCCL logs on a DGX H100 with 8 NICs.
  * A network channel is planned by the search at half of its NIC after that duplication (bwInter /= 2),
    so one channel per peer moves data at half the NIC rate and two fill it.

So a sendrecv between two nodes (nccl-tests sendrecv_perf: rank r sends to r+1) uses 2 channels and
the full NIC, and one over more than 8 nodes (nRanks = nodes x G, p2pnChannels = 4 G: 2 x nodes x G
> 16 G) only 1 channel, half the NIC: the 10-node nccl-tests sendrecv of collectives.csv runs at
24.9-26.2 GB/s on 400 Gb/s NICs whose ring all-gather on the same nodes reaches 46-48 GB/s.
"""

from __future__ import annotations

NCCL_NCHANNELS_PER_NET_PEER = 2   # NCCL env default (docs "Environment variables", since 2.12)
P2P_OPS_PER_CHANNEL = 4           # enqueue.cc: nChannelsMax x nRanks <= p2pnChannels x 4
CHANNELS_PER_NIC = 4              # search.cc channel duplication x connect.cc ncclTopoPostset doubling
CHANNELS_TO_FILL_NIC = 2          # search.cc: the duplicated channels each carry bwInter / 2
NCCL_MAXCHANNELS = 32             # src/include/device.h MAXCHANNELS


def _pow2_up(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def net_channels_per_peer(ranks: int, local_ranks: int) -> int:
    """Channels NCCL gives a send to a peer on another node in a communicator of `ranks` ranks,
    `local_ranks` of them (each with its own NIC) per node. ranks <= 0: not known, NCCL's default."""
    if ranks <= 0:
        return NCCL_NCHANNELS_PER_NET_PEER
    p2p_channels = _pow2_up(min(NCCL_MAXCHANNELS, CHANNELS_PER_NIC * max(1, local_ranks)))
    n = NCCL_NCHANNELS_PER_NET_PEER
    while n > 1 and n * ranks > p2p_channels * P2P_OPS_PER_CHANNEL:
        n //= 2
    return n


def net_p2p_share(ranks: int, local_ranks: int) -> float:
    """Share of the NIC rate that one send to a remote peer reaches (module doc)."""
    return min(1.0, net_channels_per_peer(ranks, local_ranks) / CHANNELS_TO_FILL_NIC)
