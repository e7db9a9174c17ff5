"""Decoded spans kept across requests, safe on a gateway shared by callers not judged yet:
bounded by what their objects occupy (:func:`object_bytes`), nothing kept for a refused
request (:class:`Staged` until commit), and keyed by tenant as well as bytes (no
cross-tenant timing oracle). A lock guards the shared map (the compaction threads use it).
"""

from __future__ import annotations

import operator
import re
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec
import xxhash
from cachetools import LRUCache

__all__ = ["DEFAULT_CACHE_BYTES", "Decoded", "DecodedSpans", "Staged", "object_bytes",
           "remembered"]

#: Bytes of decoded objects kept (least recently used go first).
DEFAULT_CACHE_BYTES: Final = 256 * 1024 * 1024
#: What an entry costs beyond its objects (the entry, its key, the facts in its memo).
_ENTRY_BYTES: Final = 1024
_VALUE: Final = msgspec.json.Decoder()
#: What makes a Python string store every character in 4 bytes.
_WIDE: Final = re.compile(rb"[\xf0-\xf4]|\\u[dD][89abAB]")

T = TypeVar("T")


def object_bytes(span: bytes | memoryview | msgspec.Raw) -> int:
    """A safe over-estimate of the memory the decoded objects of JSON ``span`` occupy,
    from byte counts: characters at the widest width, quotes, objects, arrays, commas."""
    data = bytes(span) if not isinstance(span, bytes) else span
    if data.isascii() and b"\\u" not in data:
        width = 1
    else:
        width = 4 if _WIDE.search(data) else 2
    return (len(data) * width + 32 * data.count(b'"') + 240 * data.count(b'{"')
            + 72 * data.count(b"{}") + 72 * data.count(b"[") + 40 * data.count(b",")
            + _ENTRY_BYTES)


class Decoded(msgspec.Struct, eq=False):
    """One span's decoded value (read-only), shared by every request that sends its bytes."""

    value: Any
    size: int  # :func:`object_bytes`
    memo: dict[str, Any] = msgspec.field(default_factory=dict)  # facts its users derive


def remembered(memo: dict[str, Any] | None, name: str, make: Callable[[], T]) -> T:
    """``memo[name]``, made by ``make`` the first time (every time with no memo)."""
    if memo is None:
        return make()
    try:
        found: T = memo[name]
    except KeyError:
        found = memo[name] = make()
    return found


class Staged:
    """What one request of ``tenant`` decoded anew: kept aside until it succeeds
    (:meth:`DecodedSpans.commit`), dropped with it otherwise."""

    __slots__ = ("entries", "seed")

    def __init__(self, tenant: str = "") -> None:
        self.seed = xxhash.xxh3_64_intdigest(tenant.encode("utf-8", "surrogatepass"))
        self.entries: dict[int, Decoded] = {}


class DecodedSpans:
    """Decoded spans by tenant and the hash of their bytes, least recently used evicted
    beyond ``max_bytes`` of objects (0: keep none)."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: LRUCache[int, Decoded] = LRUCache(max(1, max_bytes),
                                                         getsizeof=operator.attrgetter("size"))
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        """What the kept entries are charged in all."""
        return int(self._entries.currsize)

    def decode(self, span: msgspec.Raw, staged: Staged | None = None) -> Decoded:
        """The decoded value of ``span``, from the cache when these bytes were seen, else
        decoded into ``staged`` (without: into the cache). msgspec's errors pass."""
        key = xxhash.xxh3_128_intdigest(span, 0 if staged is None else staged.seed)
        entries = self._entries
        with self._lock:
            found = entries.get(key)
        if found is not None:
            return found
        size = object_bytes(span)
        if size > self.max_bytes:
            return Decoded(_VALUE.decode(span), size)
        if staged is not None:
            found = staged.entries.get(key)
            if found is None:
                found = staged.entries[key] = Decoded(_VALUE.decode(span), size)
            return found
        found = Decoded(_VALUE.decode(span), size)
        self._insert({key: found})
        return found

    def commit(self, staged: Staged) -> None:
        """Keep what ``staged`` decoded (the request it came from succeeded)."""
        if staged.entries:
            self._insert(staged.entries)
            staged.entries = {}

    def _insert(self, new: dict[int, Decoded]) -> None:
        entries = self._entries
        with self._lock:
            for key, entry in new.items():
                if key not in entries and entry.size <= self.max_bytes:
                    entries[key] = entry

    @staticmethod
    def fresh(span: msgspec.Raw) -> Decoded:
        """``span`` decoded into objects of its own (never cached)."""
        return Decoded(_VALUE.decode(span), object_bytes(span))
