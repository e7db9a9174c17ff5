"""The provider's rule checker as a pure function: tables of valid and invalid bodies, the
top-level and counting rules. The real corpus is in test_rules_corpus.py, the thinking rules
(reference §5.4) in test_rules_thinking.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.fake_upstream import (
    ProviderRuleError,
    cache_control_count,
    check_count_tokens_request,
    check_messages_request,
)

from .bodies import (
    CC,
    TOOLS,
    assistant,
    body,
    result,
    server_result,
    server_use,
    system_msg,
    text,
    thinking,
    use,
    user,
)

VALID: list[Any] = [
    pytest.param(body(user("hi")), id="minimal string content"),
    pytest.param(body(user("hi"), max_tokens=0), id="max_tokens zero pre-warms the cache"),
    pytest.param(
        body(user("read"), assistant(text("ok"), use("toolu_1")),
             user(result("toolu_1"), text("also lint")), tools=TOOLS),
        id="tool loop, results first then text",
    ),
    pytest.param(
        body(user("read"), assistant(use("toolu_1"), use("toolu_2")),
             user(result("toolu_2"), result("toolu_1"))),
        id="parallel results in any order",
    ),
    pytest.param(
        body(user("read"), assistant(use("toolu_1")), system_msg("be brief"),
             user(result("toolu_1"))),
        id="system message is transparent for tool adjacency",
    ),
    pytest.param(body(user("a"), user("b"), assistant("c"), assistant("d"), user("e")),
                 id="consecutive same-role messages are accepted"),
    pytest.param(body(user("hi"), assistant("")), id="final assistant prefill may be empty"),
    pytest.param(body(user("hi"), {"role": "assistant", "content": []}),
                 id="final assistant prefill may be an empty list"),
    pytest.param(
        body(user("q"), assistant(thinking(), text("a"), thinking("more"), use("toolu_1")),
             user(result("toolu_1"))),
        id="interleaved thinking after a leading thinking block",
    ),
    pytest.param(
        body(user("q"), assistant({"type": "redacted_thinking", "data": "EnCr"}, text("a")),
             user("next")),
        id="redacted thinking counts as leading thinking",
    ),
    pytest.param(
        body(user("q"), assistant(server_use("srvtoolu_1"), server_result("srvtoolu_1"),
                                  text("found it")), user("thanks")),
        id="server tool pair inside one assistant message",
    ),
    pytest.param(
        body(user("q"), assistant(server_use("mcptoolu_1", "mcp_tool_use"),
                                  server_result("mcptoolu_1", "mcp_tool_result"), text("done")),
             user("thanks")),
        id="mcp tool pair inside one assistant message",
    ),
    pytest.param(
        body(user("q"), assistant(server_use("srvtoolu_1")), user("continue")),
        id="server tool use without result (paused turn)",
    ),
    pytest.param(
        body(user({"type": "future_block", "payload": 1}), future_field={"x": 1}),
        id="unknown block types and top-level fields pass",
    ),
    pytest.param(
        body(user(text("a", cache_control=CC)), assistant(use("toolu_1")),
             user(result("toolu_1", [text("b", cache_control=CC)])),
             system=[text("sys", cache_control=CC)],
             tools=[{**TOOLS[0], "cache_control": CC}]),
        id="four cache_control markers across tools, system, messages, tool_result",
    ),
    pytest.param(body(user("hi"), system="You are terse."), id="string system"),
    pytest.param(
        body(user("read"), assistant(use("toolu_1")),
             user(result("toolu_1", [text("x"), {"type": "image", "source": {}}]))),
        id="tool_result content as blocks",
    ),
    pytest.param(
        body(user("read"), assistant(use("toolu_1")),
             user({"type": "tool_result", "tool_use_id": "toolu_1"})),
        id="tool_result without content",
    ),
    pytest.param(
        body(user("hi"), tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        id="versioned server tool needs no input_schema",
    ),
    pytest.param(body(user("hi"), cache_control=CC), id="top-level automatic cache_control"),
]


@pytest.mark.parametrize("request_body", VALID)
def test_valid_bodies_pass(request_body: dict[str, Any]) -> None:
    """Bodies that keep every provider rule raise nothing."""
    check_messages_request(request_body)


def _many(n: int) -> dict[str, Any]:
    return body(*[user("x") if i % 2 == 0 else assistant("y") for i in range(n)])


INVALID: list[Any] = [
    pytest.param([], "body: Input should be a valid dictionary", id="body not an object"),
    pytest.param({"max_tokens": 1, "messages": [user("x")]}, "model: Field required",
                 id="model missing"),
    pytest.param(body(user("x"), model=""), "model: String should have at least 1 character",
                 id="model empty"),
    pytest.param(body(user("x"), model=3), "model: Input should be a valid string",
                 id="model not a string"),
    pytest.param({"model": "m", "messages": [user("x")]}, "max_tokens: Field required",
                 id="max_tokens missing"),
    pytest.param(body(user("x"), max_tokens=True), "max_tokens: Input should be a valid integer",
                 id="max_tokens bool"),
    pytest.param(body(user("x"), max_tokens=1.5), "max_tokens: Input should be a valid integer",
                 id="max_tokens float"),
    pytest.param(body(user("x"), max_tokens=-1), "greater than or equal to 0",
                 id="max_tokens negative"),
    pytest.param(body(user("x"), stream="yes"), "stream: Input should be a valid boolean",
                 id="stream not a bool"),
    pytest.param({"model": "m", "max_tokens": 1}, "messages: Field required",
                 id="messages missing"),
    pytest.param({"model": "m", "max_tokens": 1, "messages": {}},
                 "messages: Input should be a valid list", id="messages not a list"),
    pytest.param(body(), "messages: at least one message is required", id="messages empty"),
    pytest.param(_many(100_001), "at most 100000 items", id="over 100000 messages"),
    pytest.param(body({"role": "tool", "content": "x"}),
                 "messages.0.role: Input should be 'user', 'assistant' or 'system'",
                 id="unknown role"),
    pytest.param(body(assistant("hi")), 'messages: first message must use the "user" role',
                 id="assistant first"),
    pytest.param(body(system_msg("s"), user("x")), "messages.0: a \"system\" message cannot",
                 id="system message first"),
    pytest.param(body(user("")),
                 "messages.0: all messages must have non-empty content except for the optional "
                 "final assistant message", id="empty string content"),
    pytest.param(body(user("x"), {"role": "assistant", "content": []}, user("y")),
                 "messages.1: all messages must have non-empty content", id="empty list content"),
    pytest.param(body(user("x"), assistant(""), user("y")),
                 "messages.1: all messages must have non-empty content",
                 id="empty non-final assistant"),
    pytest.param(body(user(text(""))), "messages: text content blocks must be non-empty",
                 id="empty text block"),
    pytest.param(body(user(text(" \n"))),
                 "messages: text content blocks must contain non-whitespace text",
                 id="whitespace text block"),
    pytest.param(body(user("  ")), "must contain non-whitespace text",
                 id="whitespace string content"),
    pytest.param(body(user("x"), assistant(use("toolu_1")),
                      user(result("toolu_1", [text("")]))),
                 "text content blocks must be non-empty", id="empty text nested in tool_result"),
    pytest.param(body(user("x"), assistant(use("toolu_1")), user(result("toolu_1")),
                      assistant(use("toolu_1")), user(result("toolu_1"))),
                 "messages.3.content.0: `tool_use` ids must be unique", id="duplicate tool_use id"),
    pytest.param(body(user("x"), assistant(use("toolu.1")), user(result("toolu.1"))),
                 "messages.1.content.0.tool_use.id: String should match pattern "
                 "'^[a-zA-Z0-9_-]+$'", id="tool_use id pattern"),
    pytest.param(body(user("x"), assistant(use("toolu_1"), use("toolu_2")),
                      user(result("toolu_1"))),
                 "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
                 "after: toolu_2. Each `tool_use` block must have a corresponding `tool_result` "
                 "block in the next message.", id="missing result"),
    pytest.param(body(user("x"), assistant(use("toolu_1")), user("wait"),
                      user(result("toolu_1"))),
                 "messages.1: `tool_use` ids were found without `tool_result` blocks",
                 id="result one message too late despite same-role merging"),
    pytest.param(body(user("x"), assistant(use("toolu_1")), system_msg("s"), assistant("y")),
                 "messages.1: `tool_use` ids were found without", id="system then assistant"),
    pytest.param(body(user("x"), assistant(use("toolu_1"))),
                 "messages.1: `tool_use` ids were found without",
                 id="final assistant tool_use has no result"),
    pytest.param(body(user("x"), assistant(use("toolu_1")), user(text("first"),
                                                                  result("toolu_1"))),
                 "messages.2: Did not find 1 tool_result block(s) at the beginning of this "
                 "message. Messages following tool_use blocks must begin with a matching number "
                 "of tool_result blocks.", id="result after text"),
    pytest.param(body(user("x"), assistant(use("toolu_1")),
                      user(result("toolu_1"), result("toolu_9"))),
                 "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: "
                 "toolu_9. Each `tool_result` block must have a corresponding `tool_use` block in "
                 "the previous message.", id="unknown result id"),
    pytest.param(body(user(result("toolu_1"))),
                 "messages.0.content.0: unexpected `tool_use_id`", id="result in first message"),
    pytest.param(body(user("x"), assistant(use("toolu_1")),
                      user(result("toolu_1"), result("toolu_1"))),
                 "messages.2.content.1: each `tool_use` id must be answered by exactly one",
                 id="duplicate result"),
    pytest.param(body(user("x"), assistant(result("toolu_1"))),
                 "messages.1.content.0: `tool_result` blocks can only be in `user` messages",
                 id="tool_result in assistant message"),
    pytest.param(body(user(use("toolu_1"))),
                 "messages.0.content.0: `tool_use` blocks can only be in `assistant` messages",
                 id="tool_use in user message"),
    pytest.param(body(user("x"), assistant(server_result("srvtoolu_1")), user("y")),
                 "messages.1.content.0: unexpected `tool_use_id` found in `web_search_tool_result`"
                 " blocks: srvtoolu_1. Each `web_search_tool_result` block must have a "
                 "corresponding `server_tool_use` block before it.", id="orphan server result"),
    pytest.param(body(user("x"), assistant(server_result("srvtoolu_1"), server_use("srvtoolu_1")),
                      user("y")),
                 "corresponding `server_tool_use` block before it", id="server result before use"),
    pytest.param(body(user("x"), assistant(server_use("srvtoolu_1")),
                      assistant(server_result("srvtoolu_1")), user("y")),
                 "messages.2.content.0: unexpected `tool_use_id`",
                 id="server result in a later message"),
    pytest.param(body(user("x"), assistant(server_result("m_1", "mcp_tool_result")), user("y")),
                 "corresponding `mcp_tool_use` block before it", id="orphan mcp result"),
    pytest.param(body(user("x"), assistant(server_use("srvtoolu_1"), server_result("srvtoolu_1"),
                                           server_result("srvtoolu_1")), user("y")),
                 "is already answered", id="server use answered twice"),
    pytest.param(body(user("x"), assistant(text("a"), thinking()), user("y")),
                 "messages.1.content.0: If an assistant message contains any thinking blocks, the "
                 "first block must be thinking or redacted_thinking. Found text.",
                 id="thinking not first"),
    pytest.param(body(user("x"), assistant(thinking(), text("a"), thinking()), user("y")),
                 "messages.1: The final block in an assistant message cannot be `thinking`.",
                 id="non-final assistant ends with thinking"),
    pytest.param(body(user("x"), assistant(thinking()),
                      thinking={"type": "enabled", "budget_tokens": 1024}),
                 "messages.1: The final block in an assistant message cannot be `thinking`.",
                 id="final assistant prefill ends with thinking"),
    pytest.param(body(user("x"), assistant(thinking(), {"type": "redacted_thinking",
                                                        "data": "EnCr"}), user("y")),
                 "messages.1: The final block in an assistant message cannot be "
                 "`redacted_thinking`.", id="assistant ends with redacted thinking"),
    pytest.param(body(user("x"), assistant({"type": "thinking", "thinking": "t"}, text("a")),
                      user("y")),
                 "messages.1.content.0.thinking.signature: Field required",
                 id="thinking without signature"),
    pytest.param(body(user("x"), assistant(thinking(signature=""), text("a")), user("y")),
                 "messages.1.content.0: Invalid `signature` in `thinking` block.",
                 id="thinking with empty signature"),
    pytest.param(
        body(user(text("a", cache_control=CC)), assistant(use("toolu_1")),
             user(result("toolu_1", [text("b", cache_control=CC)], cache_control=CC)),
             system=[text("sys", cache_control=CC)],
             tools=[{**TOOLS[0], "cache_control": CC}]),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        id="five cache_control markers"),
    pytest.param(body(user("x"), system=3), "system: Input should be a valid string",
                 id="system not string or list"),
    pytest.param(body(user("x"), system=[{"type": "image"}]), "system.0.type: Input should be "
                 "'text'", id="system block not text"),
    pytest.param(body(user("x"), system=[text("")]), "system: text content blocks must be "
                 "non-empty", id="system block empty text"),
    pytest.param(body(user("x"), tools={}), "tools: Input should be a valid list",
                 id="tools not a list"),
    pytest.param(body(user("x"), tools=[{"input_schema": {}}]), "tools.0.name: Field required",
                 id="tool without name"),
    pytest.param(body(user("x"), tools=[{"name": "Read"}]),
                 "tools.0.custom.input_schema: Field required", id="custom tool without schema"),
    pytest.param(body(user("x"), tools=TOOLS + TOOLS), "tools: Tool names must be unique",
                 id="duplicate tool names"),
    pytest.param({"model": "m", "max_tokens": 1, "messages": [user("x"), "not a message"]},
                 "messages.1: Input should be a valid dictionary",
                 id="message not an object"),
    pytest.param(body(user("x"), {"role": "assistant"}), "messages.1.content: Field required",
                 id="content missing"),
    pytest.param(body(user({"text": "no type"})), "messages.0.content.0.type: Field required",
                 id="block without type"),
]


@pytest.mark.parametrize(("request_body", "expected"), INVALID)
def test_invalid_bodies_raise_the_provider_text(request_body: Any, expected: str) -> None:
    """Each broken body raises ProviderRuleError (400 invalid_request_error) naming the rule."""
    with pytest.raises(ProviderRuleError) as caught:
        check_messages_request(request_body)
    assert expected in caught.value.message
    assert caught.value.status == 400
    assert caught.value.error_type == "invalid_request_error"


def test_cache_control_limit_message_is_exact() -> None:
    """The cache_control error is the provider's sentence word for word, with the count."""
    blocks = [text(f"b{i}", cache_control=CC) for i in range(6)]
    with pytest.raises(ProviderRuleError) as caught:
        check_messages_request(body(user(*blocks)))
    assert caught.value.message == (
        "A maximum of 4 blocks with cache_control may be provided. Found 6."
    )


def test_checker_does_not_mutate_the_body() -> None:
    """Checking is read-only: the body is equal to its deep copy afterwards."""
    request_body = body(user("read"), assistant(thinking(), use("toolu_1")),
                        user(result("toolu_1")), system=[text("s", cache_control=CC)])
    snapshot = copy.deepcopy(request_body)
    check_messages_request(request_body)
    assert request_body == snapshot


def test_error_body_has_the_anthropic_shape() -> None:
    """ProviderRuleError renders the provider's error object with its request_id."""
    error = ProviderRuleError("model: Field required")
    assert error.error_body("req_1") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "model: Field required"},
        "request_id": "req_1",
    }


def test_count_tokens_needs_no_max_tokens_but_keeps_message_rules() -> None:
    """count_tokens bodies need no max_tokens; message rules still apply."""
    check_count_tokens_request({"model": "m", "messages": [user("hi")]})
    with pytest.raises(ProviderRuleError, match="first message must use"):
        check_count_tokens_request({"model": "m", "messages": [assistant("hi")]})


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        pytest.param(body(user("x")), 0, id="none"),
        pytest.param(body(user(text("a", cache_control=None))), 0, id="null marker not counted"),
        pytest.param(
            body(user(text("a", cache_control=CC)), assistant(use("toolu_1", cache_control=CC)),
                 user(result("toolu_1", [text("b", cache_control=CC)])),
                 system=[text("s", cache_control=CC)], tools=[{**TOOLS[0], "cache_control": CC}],
                 cache_control=CC),
            5, id="tools, system, blocks and nested results; top level not counted"),
        pytest.param("not a body", 0, id="malformed body"),
    ],
)
def test_cache_control_count_counts_every_marker(request_body: Any, expected: int) -> None:
    """cache_control_count counts markers the way the provider's limit does."""
    assert cache_control_count(request_body) == expected
