"""Cache keys of the inputs of an evaluation: what of a cluster each model reads (kept by the cluster),
the configuration with what a block or a stage sync does not read blanked out, identity keys of large
read-only inputs."""

from __future__ import annotations

from dataclasses import fields
from operator import itemgetter
from typing import Any

from comet.config.parallel import ParallelConfig

_cluster_keys: dict[int, tuple[Any, dict]] = {}
_object_keys: dict[int, tuple] = {}   # id -> object_key's tuple (holds the object: bounded)
_OBJECT_KEYS = 256


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


# perf (i22g-glue): each key function reads a kept key in C first (two dict subscripts inside a try,
# free when nothing raises) and calls _keys only to make one: ~10 calls a cold call and several a search
# candidate, each a Python-level _keys call before (0.35 -> 0.15 us a key in a loop)
def _kept(cluster, name: str, make) -> Any:
    """The key `name` kept by the cluster, made by make(cluster) the first time."""
    keys = _keys(cluster)
    if name not in keys:
        keys[name] = make(cluster)
    return keys[name]


def cluster_key(cluster) -> str:
    """The cluster's full content (frozen dataclasses: their repr lists every field)."""
    try:
        return cluster.__dict__["_cache_keys"]["all"]
    except (AttributeError, KeyError):
        return _kept(cluster, "all", repr)


# What the cost models read of a cluster (tests/replay/test_cache.py runs them on a cluster that has
# nothing else, so a model that starts reading another field fails there until it is added here).
NETWORK_FIELDS = ("network",)                             # comet/hardware/network.py (levels derive from it)
COMPUTE_FIELDS = ("gpu", "efficiency", "memory_expansion")  # comet/hardware/compute.py
MEMORY_FIELDS = ("name", "gpu", "workspace_GB", "memory_expansion")  # comet/workload/memory.py (fit, reasons)


def _fields_repr(fields: tuple[str, ...]):
    return lambda cluster: repr(tuple(getattr(cluster, f) for f in fields))


def network_key(cluster) -> str:
    """The part of the cluster that collective and point-to-point times read: clusters that differ
    elsewhere (GPU, HBM, prices) share their network costs."""
    try:
        return cluster.__dict__["_cache_keys"]["network"]
    except (AttributeError, KeyError):
        return _kept(cluster, "network", _fields_repr(NETWORK_FIELDS))


def compute_key(cluster) -> str:
    """The part of the cluster that compute and copy kernel times read."""
    try:
        return cluster.__dict__["_cache_keys"]["compute"]
    except (AttributeError, KeyError):
        return _kept(cluster, "compute", _fields_repr(COMPUTE_FIELDS))


def memory_key(cluster) -> str:
    """The part of the cluster that the memory estimate reads: clusters that differ only in their
    network or prices share a configuration's estimate."""
    try:
        return cluster.__dict__["_cache_keys"]["memory"]
    except (AttributeError, KeyError):
        return _kept(cluster, "memory", _fields_repr(MEMORY_FIELDS))


def timing_key(cluster) -> tuple[str, str]:
    """The part of the cluster that op durations read (compute and network models): clusters that
    differ elsewhere (HBM capacity, prices, power) time every op alike."""
    try:
        return cluster.__dict__["_cache_keys"]["timing"]
    except (AttributeError, KeyError):
        return _kept(cluster, "timing", lambda c: (compute_key(c), network_key(c)))


def block_config(par) -> tuple:
    """The parallel configuration with what only the pipeline plan and stage sync read blanked out:
    the global batch (micro-batch count), the GPU count, the pipeline shape (pp, vpp, schedule) and,
    below ZeRO-3, dp (layer blocks hold DP collectives only under ZeRO-3 and FSDP SHARD_GRAD_OP;
    comet/workload/layers.py), as a tuple of the other fields' values (and dp or None).
    Candidates of a search that differ in these share their blocks. tests/replay/test_cache.py checks on random configurations that equal
    keys build equal blocks, so a builder that starts to read one of these fields fails it."""
    # perf (i22g-glue): a key, never a configuration to run: the fields read in one C call
    # (operator.itemgetter), where a configuration with those fields replaced was built and hashed
    # (replace_fields 1.4 us + a first hash 1.1 us -> ~0.9 us, one a cold call); equal exactly where those
    # configurations are equal (tests/replay/test_cache.py)
    return _block_fields(par.__dict__), (par.dp if par.per_module_dp_collectives else None)


# the fields block_config keeps, in declaration order
BLOCK_BLANKED = ("global_batch", "gpus", "dp", "pp", "vpp", "schedule")
_block_fields = itemgetter(*(f.name for f in fields(ParallelConfig) if f.name not in BLOCK_BLANKED))


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
    i = id(obj)
    key = _object_keys.get(i)
    if key is None or key[1].obj is not obj:
        if len(_object_keys) >= _OBJECT_KEYS:
            _object_keys.clear()
        key = _object_keys[i] = (i, _Held(obj))
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

