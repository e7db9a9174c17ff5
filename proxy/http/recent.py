"""The last body of recent conversations, so the next one is read from where it stops
repeating it: a warm request costs what is new in it."""

from __future__ import annotations

import operator
import threading
from typing import Any, Final

import msgspec
import xxhash
from cachetools import LRUCache

from proxy.http.decoded import DEFAULT_CACHE_BYTES, DecodedSpans, Staged
from proxy.http.spans import _GAP, _SPANS, RequestBody, _distinct

__all__ = ["CUTS", "RecentBodies"]


#: How many of a body's last message starts are tried as the end of what the next repeats.
CUTS: Final = 4


class _Seen(msgspec.Struct, eq=False):
    """What the next body of a conversation needs of this one, without its bytes."""

    cuts: list[tuple[int, int, int]]  # (message index, its start, xxh3-128 of all before)
    # each cut's start -> (that digest, the hasher having hashed all before it: never updated)
    marks: dict[int, tuple[int, Any]]
    suffix: bytes  # from the end of the last message to the end of the body
    body: RequestBody  # raw dropped
    size: int  # what its decoded objects are charged


class RecentBodies:
    """When a body's bytes up to one of the previous body's last message starts hash
    (xxh3-128) as they did, and its bytes after the messages are the same, only the rest is
    decoded; the messages before are the previous body's own objects. At most
    ``max_entries`` conversations and ``max_bytes`` of decoded objects (a lock: the
    compaction threads use it too)."""

    def __init__(self, max_entries: int = 1024, *,
                 max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max(1, max_entries)
        self._seen: LRUCache[object, list[_Seen]] = LRUCache(max(1, max_bytes),
                                                             getsizeof=_charged)
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """What the kept bodies are charged in all."""
        return int(self._seen.currsize)

    @staticmethod
    def key_of(tenant: str, session: str | None, raw: bytes) -> object:
        """The key of ``raw``'s conversation: tenant and session header, else its first bytes."""
        if session is not None:
            return (tenant, session)
        return (tenant, xxhash.xxh3_64_intdigest(memoryview(raw)[:4096]))

    def extend(self, raw: bytes, key: object, cache: DecodedSpans,
               staged: Staged | None = None) -> RequestBody | None:
        """``raw`` read as a known earlier body plus what is new, or None."""
        with self._lock:
            candidates = self._seen.get(key, ())
        for seen in candidates:
            parsed = _extend(raw, seen, cache, staged)
            if parsed is not None:
                return parsed
        return None

    def keep(self, key: object, parsed: RequestBody) -> None:
        """Remember ``parsed`` as the latest body of its conversation."""
        bounds = parsed.bounds
        if not bounds or parsed.entries is None:
            return
        first = max(0, len(bounds) - CUTS)
        starts = list(map(operator.itemgetter(0), bounds[first:]))
        # Each cut's (digest, hasher): the earlier body's where valid, else hashed on.
        before, upto = parsed._hashed, parsed._hashed_upto
        marks: list[tuple[int, Any]] = list(map(before.get, starts))  # type: ignore[arg-type]  # (Nones filled:)
        if None in marks or starts[-1] > upto:
            view = memoryview(parsed.raw)
            last: tuple[int, Any] | None = None  # the previous cut's start and state
            for position, start in enumerate(starts):
                mark: tuple[int, Any] | None = marks[position] if start <= upto else None
                if mark is None:
                    hasher = xxhash.xxh3_128() if last is None else last[1].copy()
                    hasher.update(view[0 if last is None else last[0]:start])
                    mark = marks[position] = (hasher.intdigest(), hasher)
                last = (start, mark[1])
        cuts = list(zip(range(first, len(bounds)), starts,
                        map(operator.itemgetter(0), marks), strict=True))
        cuts.reverse()
        kept = RequestBody(b"", parsed.doc, parsed.fields, bounds, parsed.entries,
                           parsed.values, reused=0)
        size = (sum(map(operator.attrgetter("size"), parsed.entries))
                + sum(entry.size for entry in parsed.values.values()))
        if size > self.max_bytes:
            return
        seen = _Seen(cuts, dict(zip(starts, marks, strict=True)),
                     parsed.raw[bounds[-1][1]:], kept, size)
        with self._lock:
            kept_now = [seen, *(self._seen.get(key) or [])[:3]]
            while _charged(kept_now) > self.max_bytes:  # (``seen`` alone fits)
                kept_now.pop()
            self._seen[key] = kept_now
            while len(self._seen) > self.max_entries:
                self._seen.popitem()


def _charged(seen: list[_Seen]) -> int:
    return sum(entry.size for entry in seen)


def _extend(raw: bytes, seen: _Seen, cache: DecodedSpans,
            staged: Staged | None) -> RequestBody | None:
    suffix = seen.suffix
    if not raw.endswith(suffix):
        return None
    view = memoryview(raw)
    end = len(raw) - len(suffix)
    for index, start, digest in seen.cuts:
        if start >= end or xxhash.xxh3_128_intdigest(view[:start]) != digest:
            continue
        tail = b"[" + view[start:end] + b"]"
        spans = _SPANS.decode(tail)
        if not spans:
            return None  # a trailing comma: the plain parse names it
        before = seen.body
        assert before.entries is not None and before.bounds is not None
        entries = before.entries[:index]
        entries.extend(cache.decode(span, staged) for span in spans)
        _distinct(entries, spans, index, set(map(id, before.doc["messages"][:index])))
        bounds = before.bounds[:index]
        at = 1
        for span in spans:
            at = _GAP.match(tail, at).end()  # type: ignore[union-attr]  # (matches the empty)
            if not tail.startswith(span, at):
                return None
            bounds.append((start + at - 1, start + at - 1 + len(span)))
            at += len(span)
        doc = dict(before.doc)
        messages = before.doc["messages"][:index]
        messages.extend(entry.value for entry in entries[index:])
        doc["messages"] = messages
        return RequestBody(raw, doc, before.fields, bounds, entries, before.values,
                           reused=index, _hashed=seen.marks, _hashed_upto=start)
    return None
