"""Decoded spans kept across requests, bounded by what their objects occupy.

A span (one message's or one top-level field's bytes) seen before is not decoded again:
:class:`DecodedSpans` hands back the same decoded object. Three rules make the cache safe on a
gateway shared by callers it has not judged yet:

- **Bounded by memory, not by JSON bytes.** Python objects take several times the JSON they
  come from, so each entry is charged :func:`object_bytes`, a safe over-estimate made from a
  few byte counts of the span (C scans, no walk over the objects).
- **Nothing kept for a refused request.** A request decodes into a :class:`Staged` set of its
  own; the entries join the cache only when the request's answer was a success
  (:meth:`DecodedSpans.commit`).
- **No cross-tenant timing oracle.** Entries are keyed by the tenant as well as the bytes, so
  a tenant never finds another tenant's body in the cache by how fast it is answered.

Used from the event loop and from the compaction threads: every access to the shared map
holds a lock (decoding itself does not).
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
#: Characters a Python string may store in 4 bytes each: a 4-byte UTF-8 sequence, or a
#: surrogate escape (a string holding one stores every character in 4 bytes).
_WIDE: Final = re.compile(rb"[\xf0-\xf4]|\\u[dD][89abAB]")

T = TypeVar("T")


def object_bytes(span: bytes | memoryview | msgspec.Raw) -> int:
    """A safe over-estimate of the memory the decoded objects of JSON ``span`` occupy.

    Each string costs its characters (1, 2 or 4 bytes each: the widest the span may hold)
    plus a header (charged per quote), each object a dict (charged per ``{"`` and ``{}``),
    each array a list, each element a pointer and possibly a boxed number (charged per
    comma). Quotes, braces and commas inside strings are charged too: over, never under.
    """
    data = bytes(span) if not isinstance(span, bytes) else span
    if data.isascii() and b"\\u" not in data:
        width = 1
    else:
        width = 4 if _WIDE.search(data) else 2
    return (len(data) * width + 32 * data.count(b'"') + 240 * data.count(b'{"')
            + 72 * data.count(b"{}") + 72 * data.count(b"[") + 40 * data.count(b",")
            + _ENTRY_BYTES)


class Decoded(msgspec.Struct, eq=False):
    """One span's decoded value, shared by every request that sends the same bytes.

    Attributes:
        value: the decoded JSON value (read-only).
        size: what it costs in the cache (:func:`object_bytes`).
        memo: facts derived from ``value`` by its users (a message's
            :class:`compactor.MessageFact`, token counts, conversation keys), made once per
            decoded object.
    """

    value: Any
    size: int
    memo: dict[str, Any] = msgspec.field(default_factory=dict)


def remembered(memo: dict[str, Any] | None, name: str, make: Callable[[], T]) -> T:
    """``memo[name]``, made by ``make`` the first time (``make()`` each time with no memo:
    a value parsed the plain way)."""
    if memo is None:
        return make()
    try:
        found: T = memo[name]
    except KeyError:
        found = memo[name] = make()
    return found


class Staged:
    """What one request decoded that the cache did not hold: kept aside until the request
    succeeds (:meth:`DecodedSpans.commit`), and dropped with the request otherwise.

    Args:
        tenant: the request's tenant; its entries are found only by the same tenant.
    """

    __slots__ = ("entries", "seed")

    def __init__(self, tenant: str = "") -> None:
        self.seed = xxhash.xxh3_64_intdigest(tenant.encode("utf-8", "surrogatepass"))
        self.entries: dict[int, Decoded] = {}


class DecodedSpans:
    """Decoded spans by tenant and the hash of their bytes, least recently used evicted
    beyond ``max_bytes`` of objects (:func:`object_bytes`).

    Args:
        max_bytes: how many bytes of decoded objects to keep (0: keep none).
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        # key -> entry, each charged its size.
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
        """The decoded value of ``span``, from the cache when these bytes were seen.

        With ``staged``, a span the cache does not hold is decoded into it (see
        :class:`Staged`); without, straight into the cache under the default tenant.

        Raises:
            msgspec.DecodeError, msgspec.ValidationError: the span is not JSON the fast
                decoder takes.
        """
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
