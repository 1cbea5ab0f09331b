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
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from contextlib import contextmanager
from functools import lru_cache, wraps
from typing import Any, Callable, Hashable

from comet.config.frozen import replace_fields
from comet.graph.block import Block, block_lists, content as block_content, content_hash, lists_content
from comet.hardware import network as network_model

# Sizes bound memory, not correctness: a miss recomputes. A block entry is a few hundred bytes.
_BLOCK_ENTRIES = 4096
_GRAPH_ENTRIES = 1024              # a StepGraph shares its blocks: a few KB of its own
_BLOCK_SETS = 128                  # builder blocks of one configuration: ~100 KB


_PENDING = object()     # the value of an LRU entry while it is computed


class LRU:
    """A dict bounded to `size` entries, least recently used evicted first (in batches of a quarter
    of `size`: an eviction pass sorts the entries by their last use)."""

    # perf (i16g-glue): a hit hashes and compares its key once. An OrderedDict moves the entry to its end
    # on every hit, which hashes the key again (a tuple of configurations and identity holders: ~1-3 us
    # of Python-level __hash__ / __eq__); here a hit stamps the entry with a use counter instead, and
    # the least recently used quarter is dropped in one pass when the cache is full (~2 us amortized
    # per insert at 8,192 entries). Which entries are evicted never changes a value (a miss recomputes).

    # perf (i18g-glue): a miss hashes its key once too: dict.setdefault finds the key or puts a spare
    # entry in its place in one probe (get, then set, hashed it twice: ~0.5 us of a cold call's ~75
    # misses each), and the entry is filled once computed. A hit is the same one probe. While computed,
    # the entry holds _PENDING: a nested look-up of the same key computes its own value, and a compute
    # that raises leaves no entry behind.

    def __init__(self, size: int):
        self.size = size
        self._d: dict = {}          # key -> [value, last use]
        self._spare = [_PENDING, 0]
        self._clock = 0
        self.hits = self.misses = 0

    def get_or(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        if not enabled:
            return compute()
        spare = self._spare
        entry = self._d.setdefault(key, spare)
        self._clock = entry[1] = self._clock + 1
        if entry is not spare:
            value = entry[0]
            if value is not _PENDING:
                self.hits += 1
                return value
            return compute()    # the same key looked up while its value is computed
        self._spare = [_PENDING, 0]
        self.misses += 1
        try:
            value = compute()
        except BaseException:
            if self._d.get(key) is entry:
                del self._d[key]
            raise
        entry[0] = value
        if len(self._d) > self.size:
            self._evict(len(self._d) - max(self.size - self.size // 4, 1))
        return value

    def get(self, key: Hashable) -> Any:
        """The value, or None when absent (or caching is disabled)."""
        # perf (i21c-cache): one method frame per look-up (no helper calls); ~45 a cold call
        if enabled:
            entry = self._d.get(key)
            if entry is not None:
                value = entry[0]
                if value is not None and value is not _PENDING:
                    self.hits += 1
                    self._clock = entry[1] = self._clock + 1
                    return value
        self.misses += 1
        return None

    def put(self, key: Hashable, value: Any) -> None:
        # perf (i21c-cache): the insert inlined (was put -> _insert: ~38 a cold call)
        if enabled:
            d = self._d
            self._clock = clock = self._clock + 1
            d[key] = [value, clock]
            if len(d) > self.size:
                self._evict(len(d) - max(self.size - self.size // 4, 1))

    add = put    # the value of a key that get() just missed (_OrderedLRU's add skips its move_to_end)

    def canonical(self, key: Hashable) -> Hashable:
        """The stored key equal to `key` (an interning table: each key is its own value); `key` itself,
        stored, when there is none. One probe (get then add hashed and compared twice)."""
        if not enabled:
            return key
        spare = self._spare
        entry = self._d.setdefault(key, spare)
        self._clock = entry[1] = self._clock + 1
        if entry is not spare:
            self.hits += 1
            return entry[0]
        self._spare = [_PENDING, 0]
        self.misses += 1
        entry[0] = key
        if len(self._d) > self.size:
            self._evict(len(self._d) - max(self.size - self.size // 4, 1))
        return key

    def _evict(self, n: int) -> None:
        """Drop the `n` least recently used entries."""
        d = self._d
        for key, _ in sorted(d.items(), key=lambda kv: kv[1][1])[:n]:
            del d[key]

    def clear(self) -> None:
        self._d.clear()
        self.hits = self.misses = 0

    def items(self) -> list:
        """(key, value) pairs, least recently used first (not counted as uses)."""
        if not enabled:
            return []
        return [(k, e[0]) for k, e in sorted(self._d.items(), key=lambda kv: kv[1][1]) if e[0] is not _PENDING]

    def __len__(self) -> int:
        return len(self._d)


class _OrderedLRU(LRU):
    """LRU on an OrderedDict (an entry moved to the end on use): the byte-bounded caches below, whose
    entries are few and large (and whose values tests read from `_d`)."""

    def __init__(self, size: int):
        super().__init__(size)
        self._d: OrderedDict = OrderedDict()

    def get_or(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        if not enabled:
            return compute()
        d = self._d
        try:
            value = d[key]
        except KeyError:
            self.misses += 1
            value = d[key] = compute()
            if len(d) > self.size:
                d.popitem(last=False)
            return value
        self.hits += 1
        d.move_to_end(key)
        return value

    def get(self, key: Hashable) -> Any:
        value = self._d.get(key) if enabled else None
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
            self._d.move_to_end(key)
        return value

    def add(self, key: Hashable, value: Any) -> None:
        """Insert the value of a key that get() just missed (perf: no move_to_end, one eviction)."""
        if enabled:
            d = self._d
            d[key] = value
            if len(d) > self.size:
                d.popitem(last=False)

    def put(self, key: Hashable, value: Any) -> None:
        if enabled:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def items(self) -> list:
        return list(self._d.items()) if enabled else []


class BytesLRU(_OrderedLRU):
    """An LRU bounded by the bytes of its numpy values (large arrays of varying size)."""

    def __init__(self, budget_bytes: int, size: int):
        super().__init__(size)
        self.budget = budget_bytes

    def put(self, key: Hashable, value: Any) -> None:
        super().put(key, value)
        while len(self._d) > 1 and sum(map(_nbytes, self._d.values())) > self.budget:
            self._d.popitem(last=False)


def _nbytes(value: Any) -> int:
    """Bytes of a numpy array, or of the arrays of a tuple."""
    if isinstance(value, tuple):
        return sum(getattr(v, "nbytes", 0) for v in value)
    return getattr(value, "nbytes", 0)


enabled = True                      # False: every value computed afresh (see disabled())

durations = LRU(_BLOCK_ENTRIES)     # (signature, cluster key, precision) -> tuple of op durations
replays = LRU(_BLOCK_ENTRIES)       # (signature, durations, slowdown) -> (duration, parts)
# signature -> CompiledGraph; (signature, "table") -> the block's op table (replay/blocks.py: its structure and the
# GPU-side durations of a few compute models, a few KB an entry)
compiled = LRU(512)
graphs = LRU(_GRAPH_ENTRIES)        # (base key, model, parallel, cluster key | None) -> StepGraph
blocks = LRU(_BLOCK_SETS)          # (model, block_config(parallel)) -> builder blocks
_interned = LRU(_BLOCK_ENTRIES)     # Signature -> its canonical instance
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

_signatures: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_cluster_keys: dict[int, tuple[Any, dict]] = {}
_object_keys: dict[int, tuple] = {}   # id -> object_key's tuple (holds the object: bounded)
_OBJECT_KEYS = 256


class Signature(int):
    """A hashable value with its hash computed once (a block's content is a few hundred fields).
    `hash_value`: the value's hash when the caller has a cheaper one than hash(value); every
    Signature of one kind of value must be hashed the same way (equal values, equal hashes)."""

    # perf (i21c-cache): the object is the int of its hash, so a cache key holding it is hashed in C
    # (int.__hash__) instead of through a Python-level __hash__ (~66 a cold call, one per block look-up);
    # equality stays by value (only __eq__ / __ne__ are Python, and a look-up of an interned signature
    # matches by identity before either runs). Only ==, != and hash are meant for it, not arithmetic.
    # An int subclass cannot have slots: the value lives in the instance __dict__.

    def __new__(cls, value: tuple, hash_value: int | None = None):
        self = int.__new__(cls, hash(value) if hash_value is None else hash_value)
        self._value = value
        return self

    def __reduce__(self):
        return _signature_of, (type(self), self.__dict__, int(self))

    @property
    def value(self) -> tuple:
        return self._value

    __hash__ = int.__hash__

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Signature) and int.__eq__(self, other)
                                 and self.value == other.value)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(hash={int(self)})"


def _signature_of(cls, state: dict, hash_value: int) -> Signature:
    """A pickled Signature back: its hash as the int, its attributes as they were."""
    self = int.__new__(cls, hash_value)
    self.__dict__.update(state)
    return self


class BlockSignature(Signature):
    """A block's signature: its content (graph.block.content) hashed by graph.block.content_hash, its
    ops in node order at hand (`ops`). perf: a Block's content tuple is built only when the signature
    is compared with another of the same hash (never on a cold call: ~10 us on the flagship's blocks)."""

    def __new__(cls, ops: list, edges: list | None, value: tuple | None = None):
        self = int.__new__(cls, content_hash(ops, len(edges if value is None else value[1])))
        state = self.__dict__
        state["ops"] = ops
        state["_edges"] = edges      # a Block's edge list while the content is not built
        state["_value"] = value
        return self

    @classmethod
    def of(cls, g) -> "BlockSignature":
        lists = block_lists(g)
        if lists is not None:
            return cls(*lists)
        value = block_content(g)
        return cls([op for _, op in value[0]], None, value)

    @property
    def value(self) -> tuple:
        if self._value is None:
            self._value = lists_content(self.ops, self._edges)
            self._edges = None
        return self._value


def block_signature(g) -> BlockSignature:
    """Everything of a block graph that its replay reads: node ids and ops (every field) in insertion
    order, edges with their data. Computed once per graph object (blocks are not modified once built)."""
    # perf (i21c-cache): a builder Block keeps its signature in its own __dict__ (dropped when the Block
    # turns into a graph: graph/block.py), as a cluster keeps its keys: no WeakKeyDictionary look-up and
    # weak reference per block (~1 us each, six blocks a cold call). Other graphs are kept in _signatures.
    if type(g) is Block:
        state = g.__dict__
        sig = state.get("_signature")
        if sig is None:
            # equal blocks of different graphs share one Signature object, so cache look-ups compare
            # identities, not every op
            sig = state["_signature"] = _interned.canonical(BlockSignature(*state["_lists"]))
        return sig
    sig = _signatures.get(g)
    if sig is None:
        sig = _signatures[g] = _interned.canonical(BlockSignature.of(g))
    return sig


def _keys(cluster) -> dict:
    """The memoized keys of one cluster object (reprs of its frozen content). Kept in the object itself,
    as a ParallelConfig keeps its hash and label: they are the content's, so they outlive clear() and
    travel with a copy or a pickle; dataclasses.replace builds a new object without them. An object
    without a __dict__ keeps them here, held so its id cannot be reused while the entry lives."""
    # perf: a cold call (every cache emptied) no longer re-derives the cluster's keys: two reprs of
    # nested dataclasses, ~14 us in a loop and more on a cold CPU cache (i19c-cold's measurement)
    state = getattr(cluster, "__dict__", None)
    if state is not None:
        keys = state.get("_cache_keys")
        if keys is None:
            keys = state["_cache_keys"] = {}
        return keys
    hit = _cluster_keys.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    if len(_cluster_keys) >= 256:
        _cluster_keys.clear()
    keys = {}
    _cluster_keys[id(cluster)] = (cluster, keys)
    return keys


def cluster_key(cluster) -> str:
    """The cluster's full content (frozen dataclasses: their repr lists every field)."""
    keys = _keys(cluster)
    if "all" not in keys:
        keys["all"] = repr(cluster)
    return keys["all"]


# What the cost models read of a cluster (tests/replay/test_cache.py runs them on a cluster that has
# nothing else, so a model that starts reading another field fails there until it is added here).
NETWORK_FIELDS = ("network",)                             # comet/hardware/network.py (levels derive from it)
COMPUTE_FIELDS = ("gpu", "efficiency", "memory_expansion")  # comet/hardware/compute.py
MEMORY_FIELDS = ("name", "gpu", "workspace_GB", "memory_expansion")  # comet/workload/memory.py (fit, reasons)


def network_key(cluster) -> str:
    """The part of the cluster that collective and point-to-point times read: clusters that differ
    elsewhere (GPU, HBM, prices) share their network costs."""
    keys = _keys(cluster)
    if "network" not in keys:
        keys["network"] = repr(tuple(getattr(cluster, f) for f in NETWORK_FIELDS))
    return keys["network"]


def compute_key(cluster) -> str:
    """The part of the cluster that compute and copy kernel times read."""
    keys = _keys(cluster)
    if "compute" not in keys:
        keys["compute"] = repr(tuple(getattr(cluster, f) for f in COMPUTE_FIELDS))
    return keys["compute"]


def memory_key(cluster) -> str:
    """The part of the cluster that the memory estimate reads: clusters that differ only in their
    network or prices share a configuration's estimate."""
    keys = _keys(cluster)
    if "memory" not in keys:
        keys["memory"] = repr(tuple(getattr(cluster, f) for f in MEMORY_FIELDS))
    return keys["memory"]


def timing_key(cluster) -> tuple[str, str]:
    """The part of the cluster that op durations read (compute and network models): clusters that
    differ elsewhere (HBM capacity, prices, power) time every op alike."""
    keys = _keys(cluster)
    if "timing" not in keys:
        keys["timing"] = (compute_key(cluster), network_key(cluster))
    return keys["timing"]


def block_config(par):
    """The parallel configuration with what only the pipeline plan and stage sync read blanked out:
    the global batch (micro-batch count), the GPU count, the pipeline shape (pp, vpp, schedule) and,
    below ZeRO-3, dp (layer blocks hold DP collectives only under ZeRO-3 and FSDP SHARD_GRAD_OP;
    comet/workload/layers.py).
    Candidates of a search that differ in these share their blocks. tests/replay/test_cache.py checks on random configurations that equal
    keys build equal blocks, so a builder that starts to read one of these fields fails it."""
    # perf: a key, never a configuration to run: the fields set without re-running __init__ (config/frozen.py)
    return replace_fields(par, global_batch=1, gpus=None, dp=par.dp if par.per_module_dp_collectives else None, pp=1,
                          vpp=1, schedule=None)


def stage_config(par):
    """The parallel configuration without the global batch, which only the pipeline plan reads (its
    micro-batch count): configurations equal here build equal stage syncs (tests/replay/test_cache.py).
    A key, never a configuration to run."""
    # perf: kept by the configuration once computed (ParallelConfig.batch_free: the same object, its hash
    # computed once, for each cache keyed by it)
    return par.batch_free()


def object_key(obj) -> tuple:
    """Identity key of a large read-only input (a study's base graph): the object is held by the
    key, so its id is not reused while a cache entry lives."""
    # perf (i16g-glue): one key tuple per object while it is in use, so a look-up's key is the stored
    # key's own tuple (compared by identity, not through _Held.__eq__) and no holder is built per call;
    # bounded (a dropped tuple is rebuilt equal)
    key = _object_keys.get(id(obj))
    if key is None or key[1].obj is not obj:
        if len(_object_keys) >= _OBJECT_KEYS:
            _object_keys.clear()
        key = _object_keys[id(obj)] = (id(obj), _Held(obj))
    return key


def objects_key(objs: tuple) -> tuple:
    """Identity key of several shared read-only objects (cached BlockTimings): their ids, with the
    objects held by the key so no id is reused while the entry lives."""
    return (tuple(map(id, objs)), _Held(objs))


class _Held(int):
    """Holds a reference; equal to any other _Held (the id beside it carries the identity)."""
    # perf (i21c-cache): the int 0, so a key holding it is hashed in C (was a Python __hash__: ~18 a cold
    # call); equality stays Python (a _Held never equals a plain 0), reached only when the ids beside match

    def __new__(cls, obj):
        self = int.__new__(cls, 0)
        self.obj = obj
        return self

    __hash__ = int.__hash__

    def __eq__(self, other) -> bool:
        return isinstance(other, _Held)

    def __ne__(self, other) -> bool:
        return not isinstance(other, _Held)


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
    try:
        yield
    finally:
        enabled = before


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
