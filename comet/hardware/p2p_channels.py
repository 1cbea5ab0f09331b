"""How many NCCL channels a point-to-point send gets, and the rate they are sized for.

Read from NCCL's own code: the host code of libnccl.so.2 in the nvidia-nccl-cu12 2.32.3 wheel (defaults
and rules as disassembled; the NCCL source is not on PyPI), named as in NCCL's source. A channel is one
thread block of NCCL's kernel with its own buffers and connection. Assumed: the rows' NCCL (2.26-2.31)
follows the same rules, and other GPUs than sm90 (Hopper) the sm90 constants (no per-architecture table).

Channels per peer (ncclTopoComputeP2pChannelsPerPeer, the smallest over the communicator's peers):
  * a peer on NVLink: 2 x (path bandwidth / SM90_NVLINK_BW), SM90_NVLINK_BW = 20.6 GB/s a link
    (18 NVLink 4 links of an H100: 36);
  * a peer on another node, NCCL_NCHANNELS_PER_NET_PEER unset: max(local NICs,
    ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW)), that parameter defaulting to 14 (GB/s a channel is
    sized for): 4 for a 400 Gb/s NIC.
ncclTopoComputeP2pChannels: p2pnChannels is the communicator's channel count rounded up to a power of
two (at most NCCL_MAX_P2P_NCHANNELS, 64), the channels per peer are rounded up to a power of two and
capped by it, and a communicator spanning nodes halves them while channels x ceil(nRanks / 8) >
p2pnChannels. ncclLaunchPrepare: the least a send uses (nChannelsMin) halves while channels x nRanks >
p2pnChannels. addP2pToPlan: a send starts on nChannelsMin channels and doubles them, up to the
channels per peer, while a channel would carry more than 32 x NCCL_P2P_NVL_CHUNKSIZE (512 KiB: 16 MiB)
in a single-node communicator, NCCL_P2P_NET_CHUNKSIZE (128 KiB) in one spanning nodes; a buffer
smaller than nChannelsMin chunks of 1/8 (single node) or 1/2 (across nodes) of that chunk size uses
one channel per such chunk.

The communicator's channel count comes from NCCL's topology search, whose rules are in the same binary
(comm_channels): a ring channel runs at most sm90SpeedArrayIntra[0] = 60 GB/s inside a node and
sm90SpeedArrayInter[0] = 48 GB/s across nodes; comm takes as many rings as the NVLink path (links x
20.6 GB/s) holds at 60 inside a node, and one per NIC in use across nodes; ncclTopoDupChannels doubles a
graph of >= 50 GB/s a channel, or of >= 25 with at most 4 channels (sm90); ncclTopoPostset doubles again
("nChannels*2", at most 64). NCCL prints the result at init ("%d coll channels, ..., %d p2p channels,
%d p2p channels per peer"), which settles it for a given system.

The rate of a send is its channels x the rate a channel is sized for (20.6 GB/s on NVLink,
NCCL_P2P_PER_CHANNEL_NET_BW on the network), capped by the port. collectives.csv (NCCL 2.29): on 10
nodes of 400 Gb/s NICs the sendrecv runs at 24.9-26.2 GB/s with 1, 2 or 4 GPUs per node (2 channels:
28) and 15.2 with 8 (1 channel: 14), on 2 nodes at 44-46 (4 channels: the NIC); inside one node at
79-82 GB/s with 8 GPUs up to 67 MB (4 channels: 82), 149-163 with 4 GPUs up to 134 MB (8 channels:
165), 300 at 268 MB (16 channels: 330), NVLink's rate beyond.
"""

from __future__ import annotations

import math

SM90_NVLINK_GBPS = 20.6           # NCCL's NVLink bandwidth per link for sm90 (libnccl 2.32.3, ncclTopoNVLinkBw)
NVLINK_LINK_GBPS = 25.0           # NVLink 3 / 4: 25 GB/s per link per direction (18 links = 450 GB/s on H100)
P2P_PER_CHANNEL_NET_GBPS = 14.0   # NCCL_P2P_PER_CHANNEL_NET_BW default
P2P_NVL_CHUNK = 512 * 1024        # NCCL_P2P_NVL_CHUNKSIZE default
P2P_NET_CHUNK = 128 * 1024        # NCCL_P2P_NET_CHUNKSIZE default
SINGLE_NODE_CHUNKS_PER_CHANNEL = 32   # addP2pToPlan: at most 32 chunks a channel in a single-node communicator
P2P_RANKS_PER_CHANNEL = 8         # ncclTopoComputeP2pChannels: channels x ceil(nRanks / 8) <= p2pnChannels
MAX_P2P_NCHANNELS = 64            # NCCL_MAX_P2P_NCHANNELS default and MAXCHANNELS
INTRA_CHANNEL_MAX_GBPS = 60.0     # sm90SpeedArrayIntra[0]
INTER_CHANNEL_MAX_GBPS = 48.0     # sm90SpeedArrayInter[0]
DUP_MIN_GBPS, DUP_FULL_GBPS, DUP_MAX_CHANNELS = 25.0, 50.0, 4   # ncclTopoDupChannels thresholds (sm90)


def _pow2_up(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _search_channels(rings: int, ring_GBps: float) -> int:
    """The search's rings, duplicated (ncclTopoDupChannels) and doubled (ncclTopoPostset)."""
    if ring_GBps >= DUP_FULL_GBPS or (ring_GBps >= DUP_MIN_GBPS and rings <= DUP_MAX_CHANNELS):
        rings *= 2
    return min(MAX_P2P_NCHANNELS, 2 * rings)


def comm_channels(nic_GBps: float, local_ranks: int) -> int:
    """Channels of a communicator spanning nodes whose `local_ranks` ranks per node each use their own
    NIC: one ring per NIC at min(48 GB/s, NIC)."""
    return _search_channels(max(1, local_ranks), min(INTER_CHANNEL_MAX_GBPS, nic_GBps))


def _nvlink_path_GBps(nvlink_GBps: float) -> float:
    return max(1, round(nvlink_GBps / NVLINK_LINK_GBPS)) * SM90_NVLINK_GBPS


def nvlink_comm_channels(nvlink_GBps: float) -> int:
    """Channels of a single-node communicator on NVLink: the rings of 60 GB/s the path holds."""
    path = _nvlink_path_GBps(nvlink_GBps)
    ring = min(INTRA_CHANNEL_MAX_GBPS, path)
    return _search_channels(max(1, int(path // ring)), ring)


def _per_op(msg_bytes: float, ranks: int, per_peer: int, p2p_channels: int, min_chunk: float,
            max_chunk: float) -> int:
    """Channels one send of msg_bytes uses: nChannelsMin (ncclLaunchPrepare), or fewer for a buffer of
    fewer than nChannelsMin x min_chunk bytes, doubled up to per_peer while a channel would carry
    more than max_chunk (addP2pToPlan)."""
    n_min = per_peer
    while n_min > 1 and ranks * n_min > p2p_channels:
        n_min //= 2
    n = n_min if msg_bytes >= n_min * min_chunk else max(1, math.ceil(msg_bytes / min_chunk))
    while msg_bytes / n > max_chunk and n <= per_peer // 2:
        n *= 2
    return n


def net_channels_per_peer(nic_GBps: float, ranks: int = 0, local_ranks: int = 1, msg_bytes: float = math.inf) -> int:
    """Channels NCCL gives a send of msg_bytes to a peer on another node over a NIC of nic_GBps, in a
    communicator of `ranks` ranks, `local_ranks` of them (each with its own NIC) per node; ranks <= 0:
    not known, the per-peer count before the communicator-size rules."""
    per_peer = _pow2_up(max(1, math.ceil(nic_GBps / P2P_PER_CHANNEL_NET_GBPS)))
    if ranks <= 0:
        return per_peer
    p2p_channels = _pow2_up(comm_channels(nic_GBps, local_ranks))
    groups = math.ceil(ranks / P2P_RANKS_PER_CHANNEL)
    while per_peer > 1 and per_peer * groups > p2p_channels:
        per_peer //= 2
    per_peer = min(per_peer, p2p_channels)
    return _per_op(msg_bytes, ranks, per_peer, p2p_channels, P2P_NET_CHUNK / 2, P2P_NET_CHUNK)


def nvlink_channels(nvlink_GBps: float, ranks: int, msg_bytes: float) -> int:
    """Channels a send of msg_bytes to an NVLink peer uses in a single-node communicator of `ranks`."""
    p2p_channels = _pow2_up(nvlink_comm_channels(nvlink_GBps))
    per_peer = min(_pow2_up(2 * round(_nvlink_path_GBps(nvlink_GBps) / SM90_NVLINK_GBPS)), p2p_channels)
    return _per_op(msg_bytes, ranks, per_peer, p2p_channels, P2P_NVL_CHUNK / 8,
                   SINGLE_NODE_CHUNKS_PER_CHANNEL * P2P_NVL_CHUNK)


def net_p2p_rate_GBps(nic_GBps: float, ranks: int = 0, local_ranks: int = 1, msg_bytes: float = math.inf) -> float:
    """The rate a send to a peer on another node is sized for (channels x NCCL_P2P_PER_CHANNEL_NET_BW);
    the NIC caps it where it is lower."""
    return net_channels_per_peer(nic_GBps, ranks, local_ranks, msg_bytes) * P2P_PER_CHANNEL_NET_GBPS


def nvlink_p2p_rate_GBps(nvlink_GBps: float, ranks: int, msg_bytes: float) -> float:
    """The rate a send to an NVLink peer of a single-node communicator is sized for (channels x
    SM90_NVLINK_BW); ranks <= 0 (communicator not known): no limit below the port's."""
    if ranks <= 0:
        return math.inf
    return nvlink_channels(nvlink_GBps, ranks, msg_bytes) * SM90_NVLINK_GBPS
