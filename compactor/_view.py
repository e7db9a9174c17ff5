"""The message view the layers work on, and the structural edits they share.

A layer never mutates a message it did not create: it builds a new list that reuses every
unchanged message object and replaces only what it edits (copy-on-write). The view keeps one
token count per message and re-counts only the messages a layer replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._blocks import (
    CLIENT_RESULT,
    CLIENT_USE,
    DROPPABLE_ROLES,
    SERVER_USES,
    THINKING,
    Message,
    first_user_index,
    is_empty_content,
    is_server_result,
)
from ._fingerprint import fingerprint
from ._tokens import CachingCounter


class View:
    """``messages`` with a fingerprint and a token count per message (made once each), and
    the tokens reserved outside them. Totals use the provider's ``known`` counts by
    fingerprint where there are some, else the counted tokens times ``scale``."""

    __slots__ = ("messages", "fingerprints", "tokens", "counter", "reserved", "scale", "known",
                 "marked", "_total")

    def __init__(self, messages: list[Message], counter: CachingCounter, reserved: int = 0,
                 fingerprints: list[int] | None = None, tokens: list[int] | None = None,
                 scale: float = 1.0, known: Mapping[int, float] | None = None) -> None:
        self.messages = messages
        self.counter = counter
        self.reserved = reserved
        self.scale = scale
        self.known = known or None
        #: The only indexes that may carry ``cache_control`` markers, when the caller knew.
        self.marked: list[int] | None = None
        self._total: int | None = None
        self.fingerprints = (fingerprints if fingerprints is not None
                             else [fingerprint(m) for m in messages])
        if tokens is None:
            counter.prefetch(messages, self.fingerprints)
        self.tokens = tokens if tokens is not None else [
            counter.count_message(m, p) for m, p in zip(messages, self.fingerprints, strict=True)]

    def counted(self) -> int:
        """Tokens of the whole view as the counter counts them, reserved tokens included."""
        return self.reserved + sum(self.tokens)

    def total(self) -> int:
        """Tokens of the whole view as the provider would count them (see the class)."""
        if self._total is None:
            scale, known = self.scale, self.known
            if known is None:
                counted = self.reserved + sum(self.tokens)
                self._total = counted if scale == 1.0 else round(counted * scale)
            else:
                # Each message's known count, else its count x scale (C loops: hot path).
                self._total = round(self.reserved * scale + sum(
                    map(known.get, self.fingerprints, map(scale.__mul__, self.tokens))))
        return self._total

    def derive(self, messages: list[Message]) -> View:
        """A new view over ``messages``; counts of messages kept from this view are reused."""
        known = {id(m): (p, t) for m, p, t in zip(self.messages, self.fingerprints, self.tokens,
                                                           strict=True)}
        prints: list[int] = []
        tokens: list[int] = []
        for message in messages:
            found = known.get(id(message))
            if found is None:
                print_ = fingerprint(message)
                found = (print_, self.counter.count_message(message, print_))
            prints.append(found[0])
            tokens.append(found[1])
        return View(messages, self.counter, self.reserved, prints, tokens, self.scale,
                    self.known)


def _pair_id(block: dict[str, Any]) -> str | None:
    block_type = block.get("type")
    if block_type == CLIENT_USE or block_type in SERVER_USES:
        value = block.get("id")
    elif block_type == CLIENT_RESULT or is_server_result(block_type):
        value = block.get("tool_use_id")
    else:
        return None
    return value if isinstance(value, str) else None


def drop_pairs(messages: list[Message], ids: set[str]) -> list[Message]:
    """Remove every use and result block whose id is in ``ids`` (pairs go together), then
    tidy the view."""
    if not ids:
        return messages
    out: list[Message] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(_pair_id(b) in ids for b in content):
            message = {**message, "content": [b for b in content if _pair_id(b) not in ids]}
        out.append(message)
    return tidy(out)


def _strip_trailing_thinking(message: Message) -> Message:
    content = message.get("content")
    if not isinstance(content, list) or not content or content[-1].get("type") not in THINKING:
        return message
    end = len(content)
    while end and content[end - 1].get("type") in THINKING:
        end -= 1
    return {**message, "content": content[:end]}


def tidy(messages: list[Message]) -> list[Message]:
    """Make a view the provider accepts again after blocks were removed: trailing thinking
    goes from assistant messages (but a final prefill), then empty messages; an empty user
    message between two assistant ones answered calls that all went, so the assistant
    message before it goes too (the exchange goes whole; no made-up user turn)."""
    last = len(messages) - 1
    kept = [
        _strip_trailing_thinking(m) if m.get("role") == "assistant" and i != last else m
        for i, m in enumerate(messages)
    ]
    intent = first_user_index(messages)  # the original intent is never dropped
    out: list[Message] = []
    for index, message in enumerate(kept):
        if index == intent or not (is_empty_content(message)
                                   and message.get("role") in DROPPABLE_ROLES):
            out.append(message)
            continue
        if message.get("role") == "user":
            before = _last_conversational(out)
            after = _next_role(kept[index + 1:])
            if (before is not None and out[before].get("role") == "assistant"
                    and after == "assistant"):
                del out[before]
    return out


def _last_conversational(messages: list[Message]) -> int | None:
    """The index of the last user or assistant message."""
    return next((i for i in range(len(messages) - 1, -1, -1)
                 if messages[i].get("role") in DROPPABLE_ROLES), None)


def _next_role(messages: list[Message]) -> str | None:
    """The role of the first user or assistant message that is not empty."""
    return next((str(m.get("role")) for m in messages
                 if m.get("role") in DROPPABLE_ROLES and not is_empty_content(m)), None)
