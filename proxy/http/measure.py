"""What a request's body is, counted once, and the caches and compute turn it is counted
with: the shared token counts and protocol walks, or a large body's staged ones."""

from __future__ import annotations

import contextlib
import functools

import msgspec
from aiohttp import web

import compactor
from proxy.http.compute import Turn
from proxy.http.spans import RequestBody, remembered
from proxy.keys import COUNTER, PROTOCOL_MEMO

__all__ = ["Measured", "RequestScope", "measure"]


def _reserved_tokens(counter: compactor.CachingCounter, parsed: RequestBody,
                     durable_text: str) -> int:
    """Tokens outside ``messages`` that count toward the thresholds (``system`` and
    ``tools`` counted once per decoded value)."""
    doc = parsed.doc
    reserved = 0
    for name in ("system", "tools"):  # (a loop, not a generator: this runs on every request)
        reserved += remembered(parsed.memo(name), "tokens",
                               functools.partial(counter.count_value, doc.get(name)))
    if durable_text:
        reserved += counter.count_value({"type": "text", "text": durable_text})
    return reserved


def _conversation_key(parsed: RequestBody) -> str:
    """:meth:`compactor.CompactionCheckpoint.conversation_key` of the request's messages,
    made once per decoded first user message."""
    key_of = compactor.CompactionCheckpoint.conversation_key
    for index, message in enumerate(parsed.messages):
        if message.get("role") == "user":
            return remembered(parsed.message_memo(index), "conversation_key",
                              functools.partial(key_of, [message]))
    return key_of([])


class Measured(msgspec.Struct, frozen=True):
    """What a request's body is, counted once (on the compute threads for a large body):
    its conversation key, the tokens outside ``messages`` and each message's facts."""

    conversation: str
    reserved: int
    facts: compactor.FactColumns | None


def measure(counter: compactor.CachingCounter, parsed: RequestBody,
             durable_text: str) -> Measured:
    return Measured(_conversation_key(parsed), _reserved_tokens(counter, parsed, durable_text),
                    parsed.facts(counter))


class RequestScope(msgspec.Struct, frozen=True):
    """What one request works with: the token counts and tool-protocol walks it reads and
    adds to — the shared ones, or (a large body) staged ones kept only when its answer is a
    success, so a refused body leaves nothing, not even the small entries that would pin its
    memory —, and a large body's turn at the compute threads."""

    counter: compactor.CachingCounter
    memo: compactor.ProtocolMemo | compactor.StagedMemo
    turn: Turn | None = None

    @classmethod
    def of(cls, app: web.Application, parsed: RequestBody, turn: Turn | None) -> RequestScope:
        if turn is None:
            return cls(app[COUNTER], app[PROTOCOL_MEMO])
        counter, memo = app[COUNTER].staged(), app[PROTOCOL_MEMO].staged()
        parsed.on_commit(counter.commit)
        parsed.on_commit(memo.commit)
        return cls(counter, memo, turn)

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The turn given up meanwhile (a summary call)."""
        return contextlib.nullcontext() if self.turn is None else self.turn.paused()
