"""The request body as raw spans: each message kept as the bytes the client sent, decoded
once per process, and the forwarded body spliced from bytes.

An agent's request is its previous one plus a message or two, so a span seen before is not
decoded again (:class:`DecodedSpans`; shared objects are read-only), and
:meth:`RequestBody.encode` splices the client's own bytes for what the proxy did not change.
Anything the fast decoder refuses takes :func:`proxy.http.body.parse_body`.
"""

from __future__ import annotations

import functools
import operator
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any, Final

import msgspec
from cachetools import LRUCache

import compactor
from proxy.http.body import (
    check_body,
    dump_body,
    may_hold_lone_surrogates,
    parse_body,
    replace_lone_surrogates,
)
from proxy.http.decoded import (
    DEFAULT_CACHE_BYTES,
    Decoded,
    DecodedSpans,
    Staged,
    remembered,
)

if TYPE_CHECKING:
    from proxy.http.recent import RecentBodies

__all__ = ["DEFAULT_CACHE_BYTES", "Decoded", "DecodedSpans", "EncodedViews", "RequestBody",
           "parse_request", "remembered"]

_FIELDS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_SPANS: Final = msgspec.json.Decoder(list[msgspec.Raw])
#: What may stand between two elements of a JSON array.
_GAP: Final = re.compile(rb"[ \t\n\r,]*")
_ENCODER: Final = msgspec.json.Encoder()


class _Slow(Exception):
    """The fast path cannot take this body: parse it the plain way."""


class RequestBody(msgspec.Struct, eq=False):
    """A parsed ``/v1/messages`` (or ``count_tokens``) body; ``doc["messages"]`` read-only
    (shared with other requests). The span fields are ``None`` when parsed the plain way."""

    raw: bytes  # as read (decoded from its content coding)
    doc: dict[str, Any]
    fields: dict[str, bytes | None] | None = None  # top-level fields' bytes, messages None
    bounds: list[tuple[int, int]] | None = None  # each message's (start, end) in raw
    entries: list[Decoded] | None = None  # each message's
    values: dict[str, Decoded] = msgspec.field(default_factory=dict)  # the other fields'
    mended: int = 0  # lone surrogates replaced
    reused: int = 0  # leading messages taken from an earlier body (RecentBodies)
    # The earlier body's cuts (start -> (digest before it, hasher)), valid up to _hashed_upto.
    _hashed: dict[int, tuple[int, Any]] = msgspec.field(default_factory=dict)
    _hashed_upto: int = -1
    # What this request decoded, kept aside until commit(): (cache, staged, recent, key).
    _pending: tuple[DecodedSpans, Staged, RecentBodies | None, object] | None = None
    _also: list[Callable[[], None]] = msgspec.field(default_factory=list)

    def on_commit(self, keep: Callable[[], None]) -> None:
        """Run ``keep`` too when the request is committed (once)."""
        self._also.append(keep)

    def commit(self) -> None:
        """Keep what this request decoded, and remember it as its conversation's latest
        body: its answer was a success. Idempotent."""
        also, self._also = self._also, []
        for keep in also:
            keep()
        pending, self._pending = self._pending, None
        if pending is not None:
            cache, staged, recent, key = pending
            cache.commit(staged)
            if recent is not None:
                recent.keep(key, self)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages (read-only)."""
        messages: list[dict[str, Any]] = self.doc["messages"]
        return messages

    def facts(self, counter: compactor.CachingCounter) -> list[compactor.MessageFact] | None:
        """Each message's facts (made once per decoded message: always pass the same
        ``counter``), or None on the plain path or for a message not well shaped."""
        entries = self.entries
        if entries is None:
            return None
        new = [entry for entry in entries if "fact" not in entry.memo]
        if len(new) > 1:  # (counted in one batch)
            made = compactor.message_facts([entry.value for entry in new], counter)
            for entry, fact in zip(new, made, strict=True):
                entry.memo["fact"] = fact
        facts = [remembered(entry.memo, "fact",
                            functools.partial(compactor.message_fact, entry.value, counter))
                 for entry in entries]
        if not all(facts):  # (a fact is always true)
            return None
        return facts  # type: ignore[return-value]  # (all true: no None)

    def memo(self, name: str) -> dict[str, Any] | None:
        """The memo of top-level field ``name``'s decoded value (None: none kept)."""
        found = self.values.get(name)
        return None if found is None else found.memo

    def message_memo(self, index: int) -> dict[str, Any] | None:
        """The memo of message ``index``'s decoded object (None: none kept)."""
        return None if self.entries is None else self.entries[index].memo

    def encode(self, messages: Sequence[dict[str, Any]], replaced: Mapping[str, Any],
               reused: Iterable[tuple[Sequence[dict[str, Any]], Sequence[bytes]]] = (),
               since: dict[int, tuple[Any, bytes]] | None = None) -> bytes:
        """The body to forward: ``messages`` and ``replaced``'s fields in place of the client's.

        Each message goes out as the bytes a ``reused`` ``(objects, encoded)`` pair, the
        client's own body or ``since`` (left holding what was encoded now) has for that very
        object, else through the one encoder.
        """
        if self.fields is None or self.bounds is None:
            return dump_body({**self.doc, **replaced, "messages": list(messages)})
        bounds = self.bounds
        known: dict[int, bytes] = {}
        for objects, encoded in reused:
            known.update(zip(map(id, objects), encoded, strict=True))
        parts: list[Any] = list(map(known.get, map(id, messages)))
        tail = _own_tail(messages, self.doc["messages"], parts)
        head = len(messages) - tail
        del parts[head:]
        before = {} if since is None else since
        made: dict[int, tuple[Any, bytes]] = {}
        encode = _ENCODER.encode
        view = memoryview(self.raw)
        try:
            missing = list(compress(range(head), map(operator.is_, parts, repeat(None))))
            if missing:
                own = dict(zip(map(id, self.doc["messages"]), bounds, strict=True))
                for index in missing:
                    message = messages[index]
                    bound = own.get(id(message))
                    if bound is not None:
                        parts[index] = view[bound[0]:bound[1]]
                        continue
                    kept = before.get(id(message))
                    found = kept[1] if kept is not None and kept[0] is message else encode(
                        message)
                    made[id(message)] = (message, found)
                    parts[index] = found
            if tail:
                parts.append(view[bounds[-tail][0]:bounds[-1][1]])
            out: list[Any] = [b"{"]
            for key, value in self.fields.items():
                out += (encode(key), b":")
                if key == "messages":
                    out.append(b"[")
                    if parts:
                        separated = [b","] * (2 * len(parts) - 1)
                        separated[::2] = parts
                        out += separated
                    out.append(b"]")
                elif key in replaced:
                    out.append(encode(replaced[key]))
                else:
                    out.append(value or b"null")
                out.append(b",")
            for key, value in replaced.items():
                if key not in self.fields:
                    out += (encode(key), b":", encode(value), b",")
        except (UnicodeEncodeError, OverflowError, TypeError):
            # (a lone surrogate a layer made by cutting a text: the plain dump escapes it)
            return dump_body({**self.doc, **replaced, "messages": list(messages)})
        out[-1] = b"}"  # (the last separator)
        if since is not None:
            since.clear()
            since.update(made)
        return b"".join(out)


def _own_tail(messages: Sequence[Any], own: Sequence[Any], parts: Sequence[Any]) -> int:
    """How many of ``messages`` at the end are the last of ``own`` with no bytes in ``parts``."""
    same = map(operator.is_, reversed(messages), reversed(own))
    unknown = map(operator.is_, reversed(parts), repeat(None))
    run = list(map(operator.and_, same, unknown))
    try:
        return run.index(False)
    except ValueError:
        return len(run)


class EncodedViews:
    """The encoded messages of recent checkpoints' views, so a warm request encodes none of
    the prefix it forwarded before (``max_bytes`` of them at most)."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, *, max_checkpoints: int = 1024) -> None:
        self._entries: LRUCache[int, tuple[compactor.CompactionCheckpoint, list[bytes]]] = (
            LRUCache(maxsize=max(1, max_bytes), getsizeof=lambda entry: sum(map(len, entry[1]))))
        self._since: LRUCache[int, tuple[compactor.CompactionCheckpoint,
                                         dict[int, tuple[Any, bytes]]]] = LRUCache(
            maxsize=max(1, max_checkpoints))
        # cachetools' caches are not thread-safe; the compaction threads use these too.
        self._lock = threading.Lock()

    def since(self, checkpoint: compactor.CompactionCheckpoint | None,
              ) -> dict[int, tuple[Any, bytes]] | None:
        """What the last body forwarded on ``checkpoint`` encoded beyond its view, for
        :meth:`RequestBody.encode` to reuse and refill."""
        if checkpoint is None:
            return None
        with self._lock:
            found = self._since.get(id(checkpoint))
            if found is None or found[0] is not checkpoint:
                found = self._since[id(checkpoint)] = (checkpoint, {})
        return found[1]

    def of(self, checkpoint: compactor.CompactionCheckpoint | None,
           ) -> list[tuple[Sequence[dict[str, Any]], Sequence[bytes]]]:
        """``[(checkpoint.view, its messages encoded)]`` for :meth:`RequestBody.encode`."""
        if checkpoint is None:
            return []
        with self._lock:
            found = self._entries.get(id(checkpoint))
        if found is None or found[0] is not checkpoint:
            try:
                found = (checkpoint, [_ENCODER.encode(m) for m in checkpoint.view])
            except (UnicodeEncodeError, OverflowError, TypeError):
                return []
            if sum(map(len, found[1])) <= self._entries.maxsize:
                with self._lock:
                    self._entries[id(checkpoint)] = found
        return [(checkpoint.view, found[1])]


def parse_request(raw: bytes, cache: DecodedSpans, recent: RecentBodies | None = None,
                  key: object = None, *, tenant: str | None = None) -> RequestBody:
    """``raw`` as a :class:`RequestBody`: an earlier body of its conversation (``recent``,
    ``key``) plus what is new, or by spans, else the plain way (lone surrogates mended; a 400
    naming the problem). With ``tenant``, what is decoded anew is that tenant's and kept only
    at :meth:`RequestBody.commit`."""
    staged = None if tenant is None else Staged(tenant)
    try:
        # (the fast decoder refuses every lone surrogate: a body needing mending is not here)
        parsed = None if recent is None else recent.extend(raw, key, cache, staged)
        if parsed is None:
            parsed = _by_spans(raw, cache, staged)
        if staged is not None:
            parsed._pending = (cache, staged, recent, key)
        elif recent is not None:
            recent.keep(key, parsed)
        return parsed
    except (_Slow, msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        body = parse_body(raw)
    mended = replace_lone_surrogates(body) if may_hold_lone_surrogates(raw) else 0
    return RequestBody(raw, body, mended=mended)


def _distinct(entries: list[Decoded], spans: Sequence[Any], start: int,
              seen: set[int]) -> None:
    """Give every message from ``start`` on an object of its own; _Slow for a non-object."""
    for index in range(start, len(entries)):
        entry = entries[index]
        if id(entry.value) in seen:
            entries[index] = entry = DecodedSpans.fresh(spans[index - start])
        seen.add(id(entry.value))
        if not isinstance(entry.value, dict):
            raise _Slow  # the plain parse names it


def _by_spans(raw: bytes, cache: DecodedSpans, staged: Staged | None) -> RequestBody:
    raw_fields = _FIELDS.decode(raw)
    spans_raw = raw_fields.get("messages")
    if spans_raw is None:
        raise _Slow
    spans = _SPANS.decode(spans_raw)
    doc: dict[str, Any] = {}
    values: dict[str, Decoded] = {}
    fields: dict[str, bytes | None] = {}
    for key, value in raw_fields.items():
        if key == "messages":
            doc[key] = fields[key] = None  # the client's position; filled below
            continue
        decoded = cache.decode(value, staged)
        values[key] = decoded
        doc[key] = decoded.value
        fields[key] = bytes(value)
    entries = [cache.decode(span, staged) for span in spans]
    _distinct(entries, spans, 0, set())
    doc["messages"] = [entry.value for entry in entries]
    check_body(doc)
    return RequestBody(raw, doc, fields, _bounds(raw, spans_raw, spans), entries, values)


def _bounds(raw: bytes, array: bytes | msgspec.Raw, spans: list[msgspec.Raw],
            ) -> list[tuple[int, int]] | None:
    """Where each span is in ``raw`` (None when the array's place is not certain: it is
    found by its first bytes, then compared whole, and must be there once)."""
    head = bytes(memoryview(array)[:64])
    found = [at for at in _occurrences(raw, head) if raw.startswith(array, at)]
    if len(found) != 1:
        return None
    start = found[0]
    bounds = []
    at = start + 1
    for span in spans:
        at = _GAP.match(raw, at).end()  # type: ignore[union-attr]  # (matches the empty)
        if not raw.startswith(span, at):
            return None
        bounds.append((at, at + len(span)))
        at += len(span)
    return bounds


def _occurrences(raw: bytes, needle: bytes) -> Iterable[int]:
    at = raw.find(needle)
    while at >= 0:
        yield at
        at = raw.find(needle, at + 1)
