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


def test_get_add_put_and_get_or_interleaved_keep_each_key_to_its_value():
    # get() misses without their add(), adds of an equal but different key object, other misses between
    # a get and its add, evictions: a key reads back its own value (values are a function of the key,
    # as a cache's are) or a miss
    rng = random.Random(5)
    lru = cache.LRU(12)

    def value(k):
        return ("value of", k)
    for _ in range(4000):
        k = rng.randrange(30)
        op = rng.random()
        if op < 0.5:
            got = lru.get(k)
            assert got is None or got == value(k)
            if got is None and rng.random() < 0.8:
                if rng.random() < 0.2:            # other misses between the get and its add
                    for j in rng.sample(range(30, 60), 3):
                        lru.get(j)
                lru.add(k if rng.random() < 0.7 else int(str(k)), value(k))   # int(str(k)): equal, not identical
        elif op < 0.8:
            assert lru.get_or(k, lambda k=k: value(k)) == value(k)
        else:
            lru.put(k, value(k))
        assert len(lru) <= 12 + 1 and all(v == value(key) for key, v in lru.items())
    assert lru.hits > 500 and lru.misses > 100


def test_canonical_returns_the_first_stored_equal_key_and_stays_bounded():
    """LRU.canonical (the block-signature intern table): an equal key gives back the object stored
    first, the table keeps its bound, and disabled() hands back the key itself."""
    rng = random.Random(5)
    lru, first = cache.LRU(8), {}
    for _ in range(500):
        key = (rng.randrange(20), "k")     # a new, equal tuple each time
        got = lru.canonical(key)
        assert got == key and len(lru) <= 8
        if got is not key:                 # a hit: the stored object, still the one kept first
            assert got is first[key]
        first[key] = got
    with cache.disabled():
        key = (1, "k")
        assert lru.canonical(key) is key


def test_signature_compares_by_value_and_hashes_as_its_int():
    """cache.Signature is the int of its value's hash (hashed in C in a key) but equal only to a Signature
    of an equal value: never to a plain int, nor to another value given the same hash."""
    import pickle
    rng = random.Random(7)
    for _ in range(200):
        value = tuple(rng.random() for _ in range(rng.randrange(1, 6)))
        a, b = cache.Signature(value), cache.Signature(tuple(value))
        assert a == b and not a != b and hash(a) == hash(b) and {a: 1}[b] == 1
        assert a != int(a) and not a == int(a)
        other = cache.Signature(value + (1.0,), hash_value=int(a))    # a forced collision
        assert a != other and not a == other and hash(other) == hash(a)
        back = pickle.loads(pickle.dumps(a))
        assert back == a and back.value == value and type(back) is cache.Signature


def test_object_keys_hold_their_object_and_match_only_by_identity():
    """cache.object_key: the same tuple for one object, an equal key for no other object, and never
    equal to a key of plain ints."""
    a, b = [1], [1]
    ka, kb = cache.object_key(a), cache.object_key(b)
    assert cache.object_key(a) is ka and ka[1].obj is a and ka != kb and ka != (id(a), 0)
    assert hash(ka) == hash(cache.object_key(a)) and {ka: 1}.get((id(b), ka[1])) is None
    assert cache.objects_key((a, b)) == cache.objects_key((a, b)) != cache.objects_key((b, a))
