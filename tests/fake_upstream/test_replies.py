"""Building replies without a server: the Message JSON, its SSE events, usage and the
simulated prompt cache, the default script and the summary."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.fake_upstream import (
    SUMMARIZER_MARKER,
    Fault,
    RecordedRequest,
    Reply,
    default_script,
    redacted_thinking_block,
    sign_thinking,
    summary_text,
    text_block,
    thinking_block,
    tool_use_block,
)
from proxy.fake_upstream.replies import (
    PromptCache,
    Usage,
    build_message,
    canonical_prompt,
    encode_event,
    estimate_tokens,
    stream_events,
)
from proxy.fake_upstream.replies.tokens import _common_prefix_length

META = RecordedRequest(method="POST", path="/v1/messages", query_string="")
USAGE = Usage(input_tokens=10, cache_creation_input_tokens=2, cache_read_input_tokens=30)


def _message(*blocks: dict[str, Any], stop_reason: str = "end_turn") -> dict[str, Any]:
    reply = Reply(content=blocks, stop_reason=stop_reason)
    return build_message(reply, message_id="msg_fake_000001", model="claude-x", usage=USAGE)


def test_message_json_has_the_provider_shape() -> None:
    """build_message returns a complete Message: id, type, role, model, stop fields, usage."""
    message = _message(text_block("Done."))
    assert message == {
        "id": "msg_fake_000001", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 2,
                  "cache_read_input_tokens": 30, "output_tokens": 1, "service_tier": "standard"},
    }


def test_thinking_the_fake_produces_is_signed_and_explicit_signatures_are_kept() -> None:
    """A thinking block without a signature is served with the fake's own (``fakesig.`` + HMAC
    of its text), in JSON and in the signature_delta; an explicit signature is served as is."""
    unsigned = {"type": "thinking", "thinking": "Look first."}
    message = _message(unsigned, thinking_block("Then edit."), thinking_block("x", "EqQBreal"),
                       redacted_thinking_block("secret"), text_block("ok"))
    signatures = [block.get("signature") for block in message["content"][:3]]
    assert signatures == [sign_thinking("Look first."), sign_thinking("Then edit."), "EqQBreal"]
    assert signatures[0] != sign_thinking("Look first!")
    assert signatures[0].startswith("fakesig.")
    assert message["content"][3]["data"].startswith("fakeredacted.")
    assert "secret" not in message["content"][3]["data"]
    deltas = [data["delta"]["signature"] for name, data in stream_events(message)
              if name == "content_block_delta" and data["delta"]["type"] == "signature_delta"]
    assert deltas == signatures


def _replay(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rebuild the content blocks from the deltas, as a client does."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "content_block_stop" and data["index"] in partial:
            blocks[data["index"]]["input"] = json.loads(partial.pop(data["index"]))
    return blocks


def test_stream_follows_the_reference_event_sequence() -> None:
    """Events run message_start, ping, start/delta*/stop per block, message_delta, message_stop."""
    events = stream_events(_message(text_block("Reading it."), tool_use_block(
        "toolu_1", "Read", {"path": "tests/test_x.py"}), stop_reason="tool_use"))
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    assert all(name == data["type"] for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_stream_deltas_rebuild_every_block_exactly() -> None:
    """Concatenated text, thinking and input_json fragments give back the original blocks."""
    blocks = (
        thinking_block("Check the test before editing it.", "EqQBCkYI"),
        text_block("Reading the failing test now, then the module."),
        tool_use_block("toolu_1", "Read", {"path": "tests/test_x.py", "limit": [1, 2]}),
        {"type": "redacted_thinking", "data": "EnCr"},
    )
    events = stream_events(_message(*blocks))
    assert _replay(events) == [dict(block) for block in blocks]


def test_stream_splits_text_and_json_into_several_fragments() -> None:
    """Text and tool input arrive in more than one delta, the thinking signature in its own."""
    events = stream_events(_message(
        thinking_block("long enough thinking", "sig"), text_block("a reasonably long text"),
        tool_use_block("toolu_1", "Bash", {"command": "pytest -q tests"}),
    ))
    kinds = [data["delta"]["type"] for name, data in events if name == "content_block_delta"]
    assert kinds.count("text_delta") > 1
    assert kinds.count("thinking_delta") > 1
    assert kinds.count("input_json_delta") > 2
    signature_at = kinds.index("signature_delta")
    assert kinds[signature_at - 1] == "thinking_delta"


def test_stream_usage_is_cumulative_in_message_delta() -> None:
    """message_delta repeats the input counts and carries the final output_tokens."""
    message = _message(text_block("x" * 400))
    delta = stream_events(message)[-2][1]
    assert delta["usage"] == {"input_tokens": 10, "cache_creation_input_tokens": 2,
                              "cache_read_input_tokens": 30,
                              "output_tokens": message["usage"]["output_tokens"]}
    assert message["usage"]["output_tokens"] == 100


def test_blocks_without_deltas_arrive_complete_in_their_start_event() -> None:
    """Server tool results and unknown block types come whole in content_block_start."""
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    events = stream_events(_message(result, {"type": "future_block", "x": 1}))
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert starts == [result, {"type": "future_block", "x": 1}]
    assert not [name for name, _ in events if name == "content_block_delta"]


def test_encoded_event_is_one_sse_frame() -> None:
    """An event on the wire is 'event: name', 'data: json' and a blank line."""
    frame = encode_event("ping", {"type": "ping"})
    assert frame == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_token_estimate_is_characters_over_four() -> None:
    """The input estimate is len(canonical JSON of tools, system, messages) // 4."""
    request_body = {"messages": [{"role": "user", "content": "x" * 400}], "system": "s"}
    canonical = canonical_prompt(request_body)
    assert estimate_tokens(canonical) == len(canonical) // 4
    assert estimate_tokens(canonical) > 100


def test_prompt_cache_reports_the_common_prefix_as_read() -> None:
    """A marked request extending an earlier one reads the shared prefix from the cache and
    writes the rest."""
    cache = PromptCache()
    turns: list[dict[str, str]] = [{"role": "user", "content": "a" * 400}]
    first: dict[str, Any] = {"system": "s" * 400, "messages": turns}
    second = {**first, "messages": [*turns, {"role": "assistant", "content": "b"}]}
    cold = cache.usage("key", canonical_prompt(first), has_breakpoints=True)
    warm = cache.usage("key", canonical_prompt(second), has_breakpoints=True)
    total = estimate_tokens(canonical_prompt(second))
    assert cold.cache_read_input_tokens == 0 and cold.cache_creation_input_tokens > 0
    assert warm.cache_read_input_tokens >= estimate_tokens(canonical_prompt(first)) - 1
    assert warm.cache_creation_input_tokens + warm.cache_read_input_tokens == total
    assert warm.input_tokens == 0


def test_without_a_breakpoint_the_cache_is_neither_read_nor_written() -> None:
    """The provider caches only what a cache_control breakpoint names: an unmarked request
    is all plain input, and leaves nothing for a later request to read."""
    cache = PromptCache()
    body: dict[str, Any] = {"system": "s" * 400, "messages": [{"role": "user", "content": "a"}]}
    prompt = canonical_prompt(body)
    for _ in range(2):
        assert cache.usage("key", prompt, has_breakpoints=False) == Usage(
            estimate_tokens(prompt), 0, 0)
    marked = cache.usage("key", prompt, has_breakpoints=True)
    assert marked == Usage(0, estimate_tokens(prompt), 0)  # nothing was written before


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        pytest.param("", "abc", 0, id="empty"),
        pytest.param("abc", "abc", 3, id="identical"),
        pytest.param("abcdef", "abcxyz", 3, id="short difference"),
        pytest.param("x" * 200_000 + "a", "x" * 200_000 + "b", 200_000, id="past several chunks"),
        pytest.param("x" * 70_000, "x" * 65_536 + "y", 65_536, id="at a chunk boundary"),
    ],
)
def test_common_prefix_length_is_exact(a: str, b: str, expected: int) -> None:
    """The chunked prefix search finds the exact shared length, across chunk boundaries."""
    assert _common_prefix_length(a, b) == expected == _common_prefix_length(b, a)


def test_prompt_cache_is_separate_per_key_and_reports_creation_with_breakpoints() -> None:
    """Another key shares nothing; with cache_control markers the uncached rest is written."""
    cache = PromptCache()
    prompt = canonical_prompt({"messages": [{"role": "user", "content": "a" * 800}]})
    cache.usage("one", prompt, has_breakpoints=True)
    other = cache.usage("two", prompt, has_breakpoints=True)
    again = cache.usage("one", prompt, has_breakpoints=True)
    assert other == Usage(0, estimate_tokens(prompt), 0)
    assert again == Usage(0, 0, estimate_tokens(prompt))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        pytest.param({"status": 400}, "Reply.error is required", id="error status without body"),
        pytest.param({"error": {"type": "error"}}, "must be >= 400", id="error with status 200"),
        pytest.param({"content": [{"text": "x"}]}, r"Reply\.content\[0\]",
                     id="block without type"),
        pytest.param({"status": 99}, "HTTP status", id="impossible status"),
        pytest.param({"event_delay_s": -1}, "event_delay_s", id="negative delay"),
    ],
)
def test_reply_rejects_inconsistent_fields(kwargs: dict[str, Any], fragment: str) -> None:
    """A Reply that could not be served raises ValueError naming the field."""
    with pytest.raises(ValueError, match=fragment):
        Reply(**kwargs)


def test_fault_rejects_unknown_kind_and_negative_counts() -> None:
    """Fault validates its kind and its numbers."""
    with pytest.raises(ValueError, match="Fault.kind"):
        Fault("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after_events"):
        Fault("cut_after_events", after_events=-1)


def test_reply_helpers_build_tool_calls_and_errors() -> None:
    """Reply.tool_call stops on tool_use; Reply.api_error carries the Anthropic error body."""
    call = Reply.tool_call("Read", {"path": "a"}, tool_use_id="toolu_9", text="Reading.")
    assert call.stop_reason == "tool_use"
    assert [block["type"] for block in call.content] == ["text", "tool_use"]
    error = Reply.api_error(529, "overloaded_error", "Overloaded", headers={"retry-after": "1"})
    assert error.error == {"type": "error",
                           "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert error.status == 529 and error.headers == {"retry-after": "1"}


def test_default_script_names_the_message_count() -> None:
    """Without the summarizer marker the default script answers how many messages it saw."""
    request_body = {"messages": [{"role": "user", "content": "a"},
                                 {"role": "assistant", "content": "b"},
                                 {"role": "user", "content": "c"}]}
    reply = default_script(request_body, META)
    assert reply.content == ({"type": "text", "text": "Fake upstream reply: I saw 3 messages."},)


def _summarizer_body() -> dict[str, Any]:
    old = [
        {"role": "user", "content": "Fix the failing test"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a.py"}},
            {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "pytest"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t3", "name": "Read", "input": {"file_path": "b.py"}}]},
    ]
    return {"system": [{"type": "text", "text": f"You are the {SUMMARIZER_MARKER}."}],
            "messages": [{"role": "user",
                          "content": "Summarize these messages:\n" + json.dumps(old)}]}


def test_summarizer_requests_get_a_structured_summary_from_counts() -> None:
    """With the marker in system the answer has the five headings and counts of the input."""
    reply = default_script(_summarizer_body(), META)
    summary = reply.content[0]["text"]
    headings = [line for line in summary.splitlines() if line.startswith("## ")]
    assert headings == ["## Goal", "## Decisions", "## Failed approaches",
                        "## State of the work", "## Next step"]
    assert "Summarized 4 messages (2 from the user, 2 from the assistant)" in summary
    assert "3 tool calls (by name: Bash x1, Read x2)" in summary
    assert "2 distinct file paths and 1 commands" in summary
    assert "1 tool results were marked as errors" in summary
    assert "1 tool calls had no result" in summary
    assert "Fix the failing test" not in summary


def test_summary_is_deterministic_and_never_empty() -> None:
    """The same input gives the same summary; even an input without messages has all sections."""
    assert summary_text(_summarizer_body()) == summary_text(_summarizer_body())
    empty = summary_text({"messages": []})
    assert empty.count("## ") == 5 and "Summarized 0 messages" in empty


def test_a_moved_breakpoint_reads_the_whole_previous_prompt() -> None:
    """The documented multi-turn pattern: the client moves its breakpoint to the newest block
    every turn. The cache key is the content, not the markers (reference §5.5), so the next
    turn reads all of the previous prompt; a marker is not counted as tokens either."""
    cache = PromptCache()
    marker = {"type": "ephemeral"}
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "a" * 800,
                                            "cache_control": marker}]}]
    turn2 = [{"role": "user", "content": [{"type": "text", "text": "a" * 800}]},
             {"role": "assistant", "content": [{"type": "text", "text": "b" * 400}]},
             {"role": "user", "content": [{"type": "text", "text": "c" * 400,
                                           "cache_control": marker}]}]
    first = canonical_prompt({"messages": turn1})
    assert "cache_control" not in first
    assert first == canonical_prompt({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a" * 800}]}]})
    cache.usage("key", first, has_breakpoints=True)
    second = cache.usage("key", canonical_prompt({"messages": turn2}), has_breakpoints=True)
    # The whole first prompt but its closing brackets is a prefix of the second.
    assert second.cache_read_input_tokens >= estimate_tokens(first) - 1
