"""Work shared by the candidates one process evaluates: bounded, content-keyed caches.

A search evaluates thousands of candidates that differ in a few degrees (dp, global batch, network
provisioning) while most of what a replay computes is the same: the transformer layer's blocks at a
given tp / sp / cp slice, micro-batch, recompute and precision are identical op graphs, and their
replay on the same durations is the same. Every cache here is keyed by the *content* that determines
its value, never by where a value was first computed, so a hit returns exactly what a miss would
compute (tests/replay/test_cache.py checks this on random candidates):

- block signature: the block's ops (every field, frozen dataclasses) and edges (with their data);
- op durations of a block: (block signature, cluster content, precision) -> durations in node order;
- block replay: (block signature, durations, overlap slowdown) -> duration and exposure parts. Two
  clusters that differ only where a block does not look (e.g. the scale-out bandwidth for a block whose
  collectives stay inside a node) give equal durations, so that block is replayed once for both.

Caches are LRU-bounded (a few MB) and live per process (per Ray worker). `clear()` empties them.
This module is the registry (the caches, clear(), disabled()); the bounded dicts are replay/lru.py,
the signatures replay/signatures.py, the keys of clusters, configurations and objects replay/cache_keys.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache, wraps

from comet.hardware import network as network_model
from comet.replay import lru as _lru
# the caches' parts, used through this module (cache.LRU, cache.block_signature, cache.network_key, ...)
from comet.replay.cache_keys import (COMPUTE_FIELDS, MEMORY_FIELDS, NETWORK_FIELDS, _cluster_keys,  # noqa: F401
                                     _Held, _object_keys, block_config, cluster_key, compute_key, memory_key,
                                     network_key, object_key, objects_key, stage_config, timing_key)
from comet.replay.lru import _PENDING, LRU, BytesLRU, _OrderedLRU  # noqa: F401
from comet.replay.signatures import (BlockSignature, Signature, _interned, _signature_of,  # noqa: F401
                                     _signatures, block_signature)

# Sizes bound memory, not correctness: a miss recomputes. A block entry is a few hundred bytes.
_BLOCK_ENTRIES = 4096
_GRAPH_ENTRIES = 1024              # a StepGraph shares its blocks: a few KB of its own
_BLOCK_SETS = 128                  # builder blocks of one configuration: ~100 KB

enabled = True                      # False: every value computed afresh (see disabled())

durations = LRU(_BLOCK_ENTRIES)     # (signature, cluster key, precision) -> tuple of op durations
replays = LRU(_BLOCK_ENTRIES)       # (signature, durations, slowdown) -> (duration, parts)
# signature -> CompiledGraph; (signature, "table") -> the block's op table (replay/blocks.py: its structure and the
# GPU-side durations of a few compute models, a few KB an entry)
compiled = LRU(512)
graphs = LRU(_GRAPH_ENTRIES)        # (base key, model, parallel, cluster key | None) -> StepGraph
blocks = LRU(_BLOCK_SETS)          # (model, block_config(parallel)) -> builder blocks
# (question, object key) -> answer about a read-only input; per-task-kind tables (a few KB each) of a
# study's distinct block timings x pipeline shapes x networks, and bucket layouts (step.py): ~4,000 on
# the gpt3_1t study
facts = LRU(8 * _GRAPH_ENTRIES)
memory = LRU(_BLOCK_ENTRIES)        # (model, parallel, cluster key) -> MemoryEstimate (pruning, then evaluate)
resolved = LRU(_BLOCK_ENTRIES)      # (model, parallel as given) -> the resolved ParallelConfig (evaluate.resolve)
# (model, parallel as given, memory key) -> [resolved, memory estimate, FLOPs per token]: the values
# the caches above hold, one look-up for a candidate (evaluate._prepared); a short list an entry
candidates = LRU(_BLOCK_ENTRIES)
network = LRU(4 * _BLOCK_ENTRIES)   # (what, its arguments, cluster key) -> seconds (replay/timing.py)
# pipeline shape -> task visit order (replay/pipeline.py), 8 B a task; a shape's warm-up, period and
# tail windows (replay/periodic.py), 8 B a task of a short schedule
orders = BytesLRU(32 << 20, 1024)
# (pipeline shape without m, task durations and releases as bytes) -> each stage's clock and idle sums
# where its increment per period turned uniform (replay/periodic.py): ~2 KB an entry
transients = LRU(4096)
# (pipeline shape, task durations and releases as bytes) -> PipelineSummary (replay/step.py): a few
# (pp, vpp) arrays, ~2-10 KB an entry
summaries = LRU(_BLOCK_ENTRIES)

_memoized: list = []                # lru_cache'd structure functions registered by memoized()


def memoized(maxsize: int):
    """functools.lru_cache for pure functions of hashable structure (schedule shapes), emptied by
    clear() and bypassed by disabled()."""
    def wrap(fn):
        shared = lru_cache(maxsize=maxsize)(fn)
        _memoized.append(shared)

        @wraps(fn)
        def call(*args):
            return shared(*args) if enabled else fn(*args)
        call.cache_clear = shared.cache_clear
        return call
    return wrap


@contextmanager
def disabled():
    """Evaluate without any sharing: the reference the caches are tested against."""
    global enabled
    before, enabled = enabled, False
    _lru.enabled = False      # the switch the LRUs read (comet/replay/lru.py); this one is for callers
    try:
        yield
    finally:
        enabled = _lru.enabled = before


def clear() -> None:
    """Empty every cache (tests; a cold-start benchmark)."""
    for c in (durations, replays, compiled, graphs, blocks, facts, _interned, memory, resolved, candidates, network,
              orders, summaries, transients):
        c.clear()
    for fn in _memoized:
        fn.cache_clear()
    network_model.clear_groups()   # the collective models' per-group placements (hardware/network.py)
    _signatures.clear()
    _cluster_keys.clear()
    _object_keys.clear()


def stats() -> dict[str, tuple[int, int, int]]:
    """{cache: (entries, hits, misses)}."""
    return {name: (len(c), c.hits, c.misses) for name, c in
            (("durations", durations), ("replays", replays), ("compiled", compiled), ("graphs", graphs), ("blocks", blocks),
             ("network", network), ("orders", orders), ("summaries", summaries),
             ("transients", transients))}
