"""One helper that checks every SPEC §5 invariant of a compacted view against its input.

``assert_valid_view(original_messages, result)`` is the compactor tests' round-trip check (the
h11 ``ConnectionPair`` idea): whatever the pipeline did, the view it returns must still be a
request the provider accepts and must keep what SPEC §5 says is never lost or edited.

The strict judge is the fake upstream's ``check_messages_request``. A few real conversations
already break the provider's thinking rules on input (an assistant message whose last block is
``thinking``, or whose thinking is not first); for those the helper demands that compaction adds
no *new* violation: the view passes, or its first violation is the same rule as the input's,
and with the input's own kinds of violation neutralised on both sides the view passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from compactor import CachingCounter, CompactionResult, TokenCounter, validate_tool_protocol
from proxy.fake_upstream.rules import (
    ProviderRuleError,
    cache_control_count,
    check_messages_request,
)

__all__ = ["assert_valid_view", "canonical", "first_user", "rule_of"]

Message = dict[str, Any]

THINKING = ("thinking", "redacted_thinking")
# Blocks L1 must never cut inside (SPEC §5): they must reach the view byte-identical or not at all.
UNCUTTABLE = ("image", "document", "search_result", "tool_reference", "container_upload")
SERVER_USES = ("server_tool_use", "mcp_tool_use")
DROPPABLE = ("user", "assistant")

# The two thinking rules real corpus inputs already break (rules.MSG_THINKING_LAST / _FIRST).
_RULE_THINKING_LAST = "The final block in an assistant message cannot be"
_RULE_THINKING_FIRST = "If an assistant message contains any thinking blocks, the first block"


def canonical(value: object) -> str:
    """A byte-exact, order-stable JSON text of ``value`` (for set membership of blocks)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def rule_of(error: ProviderRuleError) -> str:
    """The provider rule an error names, without the positions and ids that vary."""
    return re.sub(r"\d+", "N", error.message)


def first_user(messages: list[Message]) -> Message | None:
    """The first message with role ``user`` (the original intent), or None."""
    return next((m for m in messages if m.get("role") == "user"), None)


def _blocks(message: Message) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _all_blocks(messages: Iterable[Message]) -> Iterable[dict[str, Any]]:
    """Every block, including the blocks nested in a tool_result's content."""
    for message in messages:
        for block in _blocks(message):
            yield block
            inner = block.get("content")
            if block.get("type") == "tool_result" and isinstance(inner, list):
                yield from (b for b in inner if isinstance(b, dict))


def _check(body: dict[str, Any]) -> ProviderRuleError | None:
    try:
        check_messages_request(body)
    except ProviderRuleError as error:
        return error
    return None


def _neutralise(messages: list[Message], rules: set[str]) -> list[Message]:
    """``messages`` with the given pre-existing thinking violations taken out (a copy)."""
    out: list[Message] = []
    last = len(messages) - 1
    for index, message in enumerate(messages):
        blocks = _blocks(message)
        has_thinking = any(b.get("type") in THINKING for b in blocks)
        if message.get("role") != "assistant" or not has_thinking:
            out.append(message)
            continue
        if _RULE_THINKING_FIRST in rules and blocks[0].get("type") not in THINKING:
            blocks = [b for b in blocks if b.get("type") not in THINKING]
        if _RULE_THINKING_LAST in rules and index != last:
            while blocks and blocks[-1].get("type") in THINKING:
                blocks = blocks[:-1]
        if blocks:
            out.append({**message, "content": blocks})
    return out


def _violation_rules(body: dict[str, Any]) -> set[str]:
    """Which of the two known thinking rules the body's messages break anywhere."""
    found: set[str] = set()
    messages = body["messages"]
    for index, message in enumerate(messages):
        blocks = _blocks(message)
        if message.get("role") != "assistant" or not any(b.get("type") in THINKING for b in blocks):
            continue
        if blocks[0].get("type") not in THINKING:
            found.add(_RULE_THINKING_FIRST)
        if blocks[-1].get("type") in THINKING and index != len(messages) - 1:
            found.add(_RULE_THINKING_LAST)
    return found


def _request_body(messages: list[Message], original_body: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": (original_body or {}).get("model", "claude-sonnet-4-5"),
        "max_tokens": (original_body or {}).get("max_tokens", 1024),
        "messages": messages,
    }
    if original_body is not None and "tools" in original_body:
        body["tools"] = original_body["tools"]
    return body


def _assert_provider_accepts(original: list[Message], view: list[Message],
                             original_body: dict[str, Any] | None) -> None:
    before = _request_body(original, original_body)
    after = _request_body(view, original_body)
    input_error = _check(before)
    output_error = _check(after)
    if input_error is None:
        assert output_error is None, f"compacted view breaks a provider rule: {output_error}"
        return
    # The input already broke a provider rule (a handful of real corpus files end an assistant
    # turn on a thinking block, or put text before thinking). Compaction may keep that, but must
    # not add a new violation: the same rule or none comes first, and once the input's own kinds
    # of violation are taken out of both sides, the view passes wherever the input does.
    if output_error is not None:
        assert rule_of(output_error) == rule_of(input_error), (
            f"compaction changed the first provider violation from {input_error} "
            f"to {output_error}")
    rules = _violation_rules(before)
    clean_before = {**before, "messages": _neutralise(original, rules)}
    if _check(clean_before) is None:
        clean_after = {**after, "messages": _neutralise(view, rules)}
        extra = _check(clean_after)
        assert extra is None, f"compaction added a provider violation: {extra}"


def _assert_thinking_kept(original: list[Message], view: list[Message]) -> None:
    known = {canonical(b) for b in _all_blocks(original) if b.get("type") in THINKING}
    for block in _all_blocks(view):
        if block.get("type") in THINKING:
            assert canonical(block) in known, "a thinking block was edited or invented"

    # Thinking-first: a view message holding thinking starts with it, unless the input already
    # had a message with this very first block that broke the rule (a corpus input violation).
    input_bad_firsts = set()
    began_with_thinking: set[str] = set()  # ids of uses in input messages that began with thinking
    for message in original:
        blocks = _blocks(message)
        if message.get("role") != "assistant" or not blocks:
            continue
        thinking_first = blocks[0].get("type") in THINKING
        if any(b.get("type") in THINKING for b in blocks) and not thinking_first:
            input_bad_firsts.add(canonical(blocks[0]))
        if thinking_first:
            began_with_thinking.update(
                b["id"] for b in blocks if b.get("type") in ("tool_use", *SERVER_USES))
    for index, message in enumerate(view):
        blocks = _blocks(message)
        if message.get("role") != "assistant" or not blocks:
            continue
        starts = blocks[0].get("type") in THINKING
        if any(b.get("type") in THINKING for b in blocks) and not starts:
            assert canonical(blocks[0]) in input_bad_firsts, (
                f"messages.{index}: assistant message holds thinking but does not start with it")
        # An assistant turn that began with thinking still does (anchored by its tool ids).
        ids = {b.get("id") for b in blocks if b.get("type") in ("tool_use", *SERVER_USES)}
        if ids & began_with_thinking:
            assert starts, f"messages.{index}: assistant turn lost its leading thinking block"


def _assert_uncut(original: list[Message], view: list[Message]) -> None:
    known = {canonical(b) for b in _all_blocks(original) if b.get("type") in UNCUTTABLE}
    for block in _all_blocks(view):
        if block.get("type") in UNCUTTABLE:
            assert canonical(block) in known, f"an uncuttable {block.get('type')} block was edited"


def _assert_server_pairs_together(original: list[Message], view: list[Message]) -> None:
    answered = {b.get("tool_use_id") for b in _all_blocks(original)
                if isinstance(b.get("type"), str) and b["type"].endswith("_tool_result")
                and b["type"] != "tool_result"}
    for index, message in enumerate(view):
        blocks = _blocks(message)
        here_results = {b.get("tool_use_id") for b in blocks
                        if isinstance(b.get("type"), str) and b["type"].endswith("_tool_result")
                        and b["type"] != "tool_result"}
        for block in blocks:
            if block.get("type") in SERVER_USES and block.get("id") in answered:
                assert block["id"] in here_results, (
                    f"messages.{index}: server use {block['id']} kept without its result")


def _assert_not_empty(view: list[Message]) -> None:
    for index, message in enumerate(view):
        content = message.get("content")
        if isinstance(content, str):
            assert content.strip(), f"messages.{index}: empty string content"
        else:
            assert isinstance(content, list) and content, f"messages.{index}: empty content"


def assert_valid_view(original_messages: list[Message], result: CompactionResult, *,
                      original_body: dict[str, Any] | None = None,
                      counter: TokenCounter | CachingCounter | None = None,
                      reserved_tokens: int = 0) -> None:
    """Assert every SPEC §5 invariant of ``result.messages`` against ``original_messages``.

    Args:
        original_messages: the messages given to the compactor (unmodified).
        result: what ``compact_context`` returned for them.
        original_body: the full request body, when there is one (its ``model``,
            ``max_tokens`` and ``tools`` go into the strict check).
        counter: when given, ``tokens_after`` must equal the view's count with it (plus
            ``reserved_tokens``).
        reserved_tokens: the reserved tokens the compaction was given.
    """
    view = result.messages
    assert isinstance(view, list) and view, "the view is empty"

    _assert_provider_accepts(original_messages, view, original_body)
    validate_tool_protocol(view)  # raises ToolProtocolError on a broken pair
    _assert_thinking_kept(original_messages, view)
    _assert_uncut(original_messages, view)
    _assert_server_pairs_together(original_messages, view)
    _assert_not_empty(view)

    assert first_user(view) == first_user(original_messages), "the first user message changed"
    assert (cache_control_count({"messages": view})
            <= cache_control_count({"messages": original_messages})), "cache_control markers grew"
    others_before = [m for m in original_messages if m.get("role") not in DROPPABLE]
    others_after = [m for m in view if m.get("role") not in DROPPABLE]
    assert others_after == others_before, "a message whose role is not user/assistant was lost"

    assert result.tokens_after <= result.tokens_before, "compaction made the view larger"
    if counter is not None:
        caching = counter if isinstance(counter, CachingCounter) else CachingCounter(counter)
        counted = reserved_tokens + sum(caching.count_message(m) for m in view)
        assert result.tokens_after == counted, "tokens_after does not match the view"
    assert set(result.layers_applied) <= {"L1", "L2", "L3", "L4"}
    assert list(result.layers_applied) == sorted(result.layers_applied), "layers out of order"
