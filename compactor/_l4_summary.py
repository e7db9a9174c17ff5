"""L4 — replace the old middle of the conversation by a model-written summary.

L4 describes the span as a :class:`SummaryRequest`; the driver obtains the text (from a cache,
a callable, or not at all) and L4 builds the view. Only messages are summarised.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._blocks import DROPPABLE_ROLES, THINKING, UNCUTTABLE, Message, blocks_of, first_user_index
from ._protocol import Interaction
from ._turns import protected_opening
from ._view import View

__all__ = ["SummaryRequest", "summary_cache_key", "summary_view"]

SUMMARY_TAG = "compact-proxy-summary"
_SUMMARY_OPEN = f"<{SUMMARY_TAG} "


def summary_cache_key(messages_json: str) -> str:
    """The key to cache a summary of ``messages_json`` by: its sha256 hex."""
    return hashlib.sha256(messages_json.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class SummaryRequest:
    """The span L4 wants summarised: ``messages_json`` (as :func:`summary_view` reads
    them), its ``cache_key``, how many messages it replaces, and the ``conversation`` up to
    the kept recent turns as sent before (a forked summary call's cached prompt)."""

    messages_json: str
    cache_key: str
    message_count: int
    conversation: tuple[Message, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class SummaryPlan:
    """Where L4 cuts: ``head`` kept verbatim, ``middle`` summarised, ``kept_after`` kept.
    With ``attach`` the summary is a block at the end of ``head``'s last message (the answer
    to the turn in progress's opener, see ``_turns``), else a message of its own."""

    head: list[Message]
    middle: list[Message]
    kept_after: list[Message]
    request: SummaryRequest
    attach: bool = False


def is_summary_block(block: dict[str, Any]) -> bool:
    """True for a text block L4 or L3 wrote."""
    text = block.get("text")
    return block.get("type") == "text" and isinstance(text, str) and text.startswith(_SUMMARY_OPEN)


def is_summary_message(message: Message) -> bool:
    """True for a message L4 wrote."""
    blocks = blocks_of(message)
    return message.get("role") == "user" and len(blocks) == 1 and is_summary_block(blocks[0])


def holds_summary(message: Message) -> bool:
    """True for a message L4 wrote, or one L4 attached its summary to."""
    return message.get("role") == "user" and any(is_summary_block(b) for b in blocks_of(message))


def _detach_summary(message: Message) -> tuple[Message, Message | None]:
    """``message`` without an attached summary block, and that summary as a message of its
    own (None when it holds none)."""
    blocks = blocks_of(message)
    found = [b for b in blocks if is_summary_block(b)]
    if not found or is_summary_message(message):
        return message, None
    rest = [b for b in blocks if not is_summary_block(b)]
    return {**message, "content": rest}, {"role": "user", "content": found}


def _for_summary(block: dict[str, Any]) -> dict[str, Any] | None:
    if "cache_control" in block:  # (a marker is no content: the breakpoint moves on)
        block = {k: v for k, v in block.items() if k != "cache_control"}
    block_type = block.get("type")
    if block_type in THINKING:
        return None
    if block_type in UNCUTTABLE:
        return {"type": block_type, "omitted": True}
    if block_type == "tool_result" and isinstance(block.get("content"), list):
        inner = [b for b in (_for_summary(x) for x in block["content"] if isinstance(x, dict))
                 if b is not None]
        return {**block, "content": inner}
    return block


def summary_view(message: Message) -> Message:
    """``message`` as a summary reads it: its role and content, thinking left out, the bytes
    of images and documents (and other uncuttable blocks) omitted, no cache markers."""
    content = message.get("content")
    if isinstance(content, list):
        content = [b for b in (_for_summary(x) for x in content if isinstance(x, dict))
                   if b is not None]
    return {"role": message.get("role"), "content": content}


def recent_start(messages: list[Message], interactions: Mapping[str, Interaction], first: int,
                keep_recent: int) -> int:
    """Where the kept recent turns start: ``keep_recent`` from the end, moved back until no
    interaction is split by it, so the kept turns start with a complete exchange."""
    tail_start = max(first + 1, len(messages) - max(1, keep_recent))
    moved = True
    while moved and tail_start > first + 1:
        moved = False
        for it in interactions.values():
            if it.result_index is not None and it.use_index < tail_start <= it.result_index:
                tail_start = max(first + 1, it.use_index)
                moved = True
    return tail_start


def plan_summary(view: View, interactions: Mapping[str, Interaction],
                 keep_recent: int, *, to_end: bool = False) -> SummaryPlan | None:
    """The span to summarise (``to_end``: up to the last message), or None. An opener of
    the turn in progress inside it stays, with its answer, after the original intent, and
    the summary is attached to that answer."""
    messages = view.messages
    first = first_user_index(messages)
    if first is None:
        return None
    tail_start = (len(messages) if to_end
                  else recent_start(messages, interactions, first, keep_recent))
    head = messages[: first + 1]
    span = list(range(first + 1, tail_start))
    earlier: list[Message] = []
    opening = protected_opening(messages)
    attach = opening is not None and first < opening[0] and opening[1] < tail_start
    if opening is not None and attach:
        opener, answer = opening
        anchor, earlier_summary = _detach_summary(messages[answer])
        head = [*head, messages[opener], anchor]
        earlier = [earlier_summary] if earlier_summary is not None else []
        span = [i for i in span if i not in (opener, answer)]
    middle = earlier + [messages[i] for i in span if messages[i].get("role") in DROPPABLE_ROLES]
    if not middle or (len(middle) == 1 and is_summary_message(middle[0])):
        return None
    others = [messages[i] for i in span if messages[i].get("role") not in DROPPABLE_ROLES]
    payload = json.dumps([summary_view(m) for m in middle], ensure_ascii=False,
                         separators=(",", ":"))
    request = SummaryRequest(
        messages_json=payload,
        cache_key=summary_cache_key(payload),
        message_count=len(middle),
        conversation=tuple(messages[:tail_start]),
    )
    return SummaryPlan(head, middle, others + messages[tail_start:], request, attach)


def _summary_block(text: str, message_count: int, kept: str = "") -> dict[str, Any]:
    body = text.strip() + (f"\n\n{kept}" if kept else "")
    return {"type": "text", "text": (
        f'{_SUMMARY_OPEN}messages="{message_count}">\n'
        "Summary of earlier conversation, written when it was compacted to fit the context "
        f"window:\n{body}\n</{SUMMARY_TAG}>")}


def record_message(kept: str, message_count: int) -> Message:
    """The user message L3 leaves where it cut: ``kept`` (the span's user texts and trail,
    ``_record``) in a block of the summary's kind, so later layers keep and merge it."""
    return {"role": "user", "content": [{"type": "text", "text": (
        f'{_SUMMARY_OPEN}messages="{message_count}" dropped="true">\n'
        f"{message_count} earlier messages were dropped here to fit the context window.\n\n"
        f"{kept}\n</{SUMMARY_TAG}>")}]}


def dropped_count(record: Message) -> int:
    """How many messages a record :func:`record_message` wrote stands for."""
    found = re.match(r'<\S+ messages="(\d+)"', blocks_of(record)[0]["text"])
    return int(found.group(1)) if found else 1


def is_drop_record(message: Message) -> bool:
    """True for a message :func:`record_message` wrote (no model summary in it)."""
    blocks = blocks_of(message)
    return (is_summary_message(message) and 'dropped="true">' in
            blocks[0]["text"].split("\n", 1)[0])


def apply_summary(view: View, plan: SummaryPlan, text: str, kept: str = "") -> View:
    """L4's view: head, the summary (with ``kept``, the span's user texts and trail), then the
    kept messages."""
    block = _summary_block(text, plan.request.message_count, kept)
    if plan.attach:
        *before, anchor = plan.head
        head = [*before, {**anchor, "content": [*blocks_of(anchor), block]}]
        return view.derive([*head, *plan.kept_after])
    return view.derive([*plan.head, {"role": "user", "content": [block]}, *plan.kept_after])
