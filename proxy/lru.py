"""A bounded mapping that forgets its least recently used entries, for the per-request caches.

cachetools' ``LRUCache`` has the same behaviour, but each of its lookups runs some thirty
bytecode steps (``Cache.get`` → ``__contains__`` → ``__getitem__`` → the order update), and a
request makes about ten of them. This one is the C ``OrderedDict`` with ``move_to_end``: a
lookup is one Python call. It keeps only what the proxy's caches use; sized caches (a cost per
entry) stay on cachetools.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar, overload

__all__ = ["LRU"]

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")
_ABSENT: object = object()


class LRU(Generic[K, V]):
    """At most ``maxsize`` entries; reading one (``get``, ``[]``) or writing one makes it the
    most recently used, and writing beyond ``maxsize`` drops the least recently used.
    ``in`` and ``len`` do not change the order. Not thread-safe: used from the event loop
    (or under its owner's lock)."""

    __slots__ = ("_data", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        data = self._data
        data[key] = value
        data.move_to_end(key)
        if len(data) > self.maxsize:
            data.popitem(last=False)

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        """The value of ``key`` (now the most recently used), else ``default``."""
        data = self._data
        try:
            value = data[key]
        except KeyError:
            return default
        data.move_to_end(key)
        return value

    @overload
    def pop(self, key: K) -> V: ...

    @overload
    def pop(self, key: K, default: D) -> V | D: ...

    def pop(self, key: K, default: object = _ABSENT) -> object:
        """Remove ``key`` and return its value (``default`` when absent, else ``KeyError``)."""
        if default is _ABSENT:
            return self._data.pop(key)
        return self._data.pop(key, default)

    def clear(self) -> None:
        self._data.clear()
