"""Bounded dicts for the caches of comet/replay/cache.py: an LRU stamped with a use counter, an
OrderedDict-based one for few large entries, and one bounded by the bytes of its numpy values.

`enabled` is the switch cache.disabled() turns off: every look-up then computes afresh."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable

_PENDING = object()     # the value of an LRU entry while it is computed

enabled = True                      # False: every value computed afresh (cache.disabled())


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
    """LRU on an OrderedDict (an entry moved to the end on use): the byte-bounded caches (BytesLRU), whose
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

