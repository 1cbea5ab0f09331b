"""cache.LRU: bounded, least recently used evicted first, None values cached, disabled() bypasses it."""

import random

from comet.replay import cache


def test_bounded_and_evicts_the_least_recently_used():
    lru = cache.LRU(8)
    for k in range(8):
        lru.put(k, k * 10)
    assert lru.get_or(0, lambda: None) == 0          # 0 used again: now the most recent
    lru.put(8, 80)                                   # over the bound: the oldest quarter (1, 2) goes
    assert len(lru) <= 8
    assert 0 in dict(lru.items()) and 8 in dict(lru.items())
    assert 1 not in dict(lru.items()) and 2 not in dict(lru.items())
    assert [k for k, _ in lru.items()][-2:] == [0, 8]   # least recently used first


def test_random_use_matches_a_model_of_recency():
    rng = random.Random(3)
    lru, calls = cache.LRU(16), []
    for _ in range(2000):
        k = rng.randrange(40)
        assert lru.get_or(k, lambda k=k: calls.append(k) or -k) == -k   # a hit or a recompute: the same value
        assert len(lru) <= 16
        order = [key for key, _ in lru.items()]
        assert order[-1] == k and len(set(order)) == len(order)
    assert lru.hits + lru.misses == 2000 and lru.misses == len(calls)


def test_none_values_and_disabled():
    lru = cache.LRU(4)
    n = []
    assert lru.get_or("x", lambda: n.append(1)) is None
    assert lru.get_or("x", lambda: n.append(1)) is None and n == [1]   # a stored None is a hit
    with cache.disabled():
        assert lru.get_or("x", lambda: 5) == 5 and lru.items() == []
    lru.clear()
    assert len(lru) == 0 and lru.hits == lru.misses == 0


def test_a_compute_that_raises_leaves_no_entry():
    lru = cache.LRU(4)

    def broken():
        raise ValueError("no")
    for _ in range(2):
        try:
            lru.get_or("x", broken)
        except ValueError:
            pass
        assert len(lru) == 0 and lru.items() == [] and lru.get("x") is None
    assert lru.get_or("x", lambda: 3) == 3 and lru.get_or("x", lambda: 4) == 3


def test_nested_look_ups_while_a_value_is_computed():
    # the miss reserves the key's entry before computing: a nested look-up of the same key computes its
    # own value (never the reservation), and nested misses that evict it lose only the caching
    lru = cache.LRU(4)
    assert lru.get_or("x", lambda: lru.get_or("x", lambda: 1) + 1) == 2
    assert lru.get_or("x", lambda: 99) == 2 and lru.get("x") == 2
    lru.clear()
    assert lru.get_or("y", lambda: [lru.get_or(k, lambda k=k: k) for k in range(10)] and "v") == "v"
    assert len(lru) <= 4 and all(v is not cache._PENDING for _, v in lru.items())
    assert lru.get_or("y", lambda: "w") in ("v", "w")
