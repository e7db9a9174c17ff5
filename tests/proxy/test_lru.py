"""The per-request caches' bounded mapping (lru-dict's C :class:`lru.LRU`): that it does
what cachetools' ``LRUCache`` does with the operations the proxy uses, as the proxy assumes
(``in`` does not count as a use; ``get`` and ``[]`` do)."""

from __future__ import annotations

import pytest
from cachetools import Cache, LRUCache
from hypothesis import given, settings
from hypothesis import strategies as st
from lru import LRU

_OPS = st.lists(st.tuples(st.sampled_from(["get", "getitem", "set", "in", "pop"]),
                          st.integers(0, 6)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, maxsize=st.integers(1, 4))
def test_it_keeps_and_forgets_exactly_what_cachetools_lru_cache_does(
        ops: list[tuple[str, int]], maxsize: int) -> None:
    ours: LRU[int, int] = LRU(maxsize)
    theirs: LRUCache[int, int] = LRUCache(maxsize=maxsize)
    for step, (op, key) in enumerate(ops):
        if op == "get":
            assert ours.get(key, -1) == theirs.get(key, -1)
        elif op == "getitem":
            if key in theirs:
                assert ours[key] == theirs[key]
            else:
                with pytest.raises(KeyError):
                    ours[key]
        elif op == "set":
            ours[key] = theirs[key] = step
        elif op == "in":
            assert (key in ours) == (key in theirs)
        else:
            assert ours.pop(key, None) == theirs.pop(key, None)
        assert len(ours) == len(theirs)
        # (Cache.__getitem__: LRUCache's own would count as a use and reorder it.)
        assert sorted(ours.items()) == sorted(
            (key, Cache.__getitem__(theirs, key)) for key in theirs)


def test_the_least_recently_used_goes_first() -> None:
    cache: LRU[str, int] = LRU(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # now "b" is the oldest
    assert "b" in cache  # looking does not count as using
    cache["c"] = 3
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)
    assert cache.pop("a") == 1 and cache.get("a") is None and len(cache) == 1
    with pytest.raises(KeyError):
        cache.pop("a")
    cache.clear()
    assert len(cache) == 0


def test_a_cache_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError):
        LRU(0)
