"""The provider's rule checker as a pure function: tables of valid and invalid bodies, and the
real corpus."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.fake_upstream import (
    ProviderRuleError,
    cache_control_count,
    check_count_tokens_request,
    check_messages_request,
    redacted_thinking_block,
    thinking_block,
)
from tests.paths import CORPUS

from .conftest import corpus_bodies, load_body

CC = {"type": "ephemeral"}


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A request body around ``messages``."""
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": list(messages), **extra}


def user(*content: Any) -> dict[str, Any]:
    """A user message; a single string argument stays a string."""
    if len(content) == 1 and isinstance(content[0], str):
        return {"role": "user", "content": content[0]}
    return {"role": "user", "content": list(content)}


def assistant(*content: Any) -> dict[str, Any]:
    """An assistant message; a single string argument stays a string."""
    if len(content) == 1 and isinstance(content[0], str):
        return {"role": "assistant", "content": content[0]}
    return {"role": "assistant", "content": list(content)}


def system_msg(text: str) -> dict[str, Any]:
    """A 2026 role-``system`` message."""
    return {"role": "system", "content": text}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def use(tool_id: str, name: str = "Read", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"path": "a.py"}, **extra}


def result(tool_id: str, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content, **extra}


def thinking(value: str = "hmm", signature: str = "sig") -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": signature}


def server_use(tool_id: str, kind: str = "server_tool_use") -> dict[str, Any]:
    return {"type": kind, "id": tool_id, "name": "web_search", "input": {"query": "q"}}


def server_result(tool_id: str, kind: str = "web_search_tool_result") -> dict[str, Any]:
    return {"type": kind, "tool_use_id": tool_id, "content": []}


TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]

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


# -- the real corpus ---------------------------------------------------------------------------

# Real Claude Code sessions where the user interrupted a turn after its thinking, or where the
# converter merged two responses so a text block leads: the provider's thinking rules reject
# them although the corpus' own (tool-protocol) check accepts them.
THINKING_RULE_BREAKERS = {
    "m-claude__de0891f0-8f37-4cb1-b2bc-04c278fd5ae2.json":
        "messages.5: The final block in an assistant message cannot be `thinking`.",
    "m-claude__ff59cfd2-09dc-4a18-8c9f-0d46c3d4e8cd.json":
        "messages.47: The final block in an assistant message cannot be `thinking`.",
    "m-claude__8914a511-2982-4b5b-886b-cb526da278b1.json":
        "messages.17: The final block in an assistant message cannot be `thinking`.",
    "repaired/m-claude__95f81cf4-2300-4739-9018-2d0ff510912a.json":
        "messages.57.content.0: If an assistant message contains any thinking blocks, the first "
        "block must be thinking or redacted_thinking. Found text.",
    "repaired/m-claude__3bd9cf18-3c9b-42f5-8fd1-47f5456c1fec.json":
        "messages.29: The final block in an assistant message cannot be `thinking`.",
}


def _corpus_key(path: Path) -> str:
    return str(path.relative_to(CORPUS))


@pytest.mark.parametrize(
    "path", corpus_bodies(CORPUS) + corpus_bodies(CORPUS / "repaired")
)
def test_valid_and_repaired_corpus_bodies_pass(path: Path) -> None:
    """Every valid and repaired real conversation passes, except the listed thinking-rule
    breakers, which fail with exactly their thinking error."""
    key = _corpus_key(path)
    if key in THINKING_RULE_BREAKERS:
        with pytest.raises(ProviderRuleError) as caught:
            check_messages_request(load_body(path))
        assert caught.value.message == THINKING_RULE_BREAKERS[key]
    else:
        check_messages_request(load_body(path))


@pytest.mark.parametrize("path", corpus_bodies(CORPUS / "invalid"))
def test_invalid_corpus_bodies_fail(path: Path) -> None:
    """Every conversation in invalid/ is rejected with a positioned provider error."""
    with pytest.raises(ProviderRuleError, match=r"^messages\.\d+"):
        check_messages_request(load_body(path))


def test_corpus_bodies_are_checked_quickly() -> None:
    """The longest real conversation (639 messages) is checked in well under a second."""
    name = "m-claude__c76e5be5-ffd2-4901-a935-885527c83a61.json"
    request_body = load_body(CORPUS / "repaired" / name)
    started = time.perf_counter()
    check_messages_request(request_body)
    assert time.perf_counter() - started < 0.5


# -- the thinking rules (reference §5.4), each with the provider's whole sentence ---------------

ENABLED = {"type": "enabled", "budget_tokens": 2048}
ADAPTIVE = {"type": "adaptive"}
DISABLED = {"type": "disabled"}
THINKING_ON = [pytest.param(ENABLED, id="enabled"), pytest.param(ADAPTIVE, id="adaptive")]
THINKING_OFF: list[Any] = [pytest.param(None, id="absent"), pytest.param(DISABLED, id="disabled")]
REDACTED = {"type": "redacted_thinking", "data": "EnCrYpTeD"}


def _with_thinking(request_body: dict[str, Any], mode: dict[str, Any] | None) -> dict[str, Any]:
    return request_body if mode is None else {**request_body, "thinking": mode}


def _message_of(request_body: Any, check: Any = check_messages_request) -> str:
    with pytest.raises(ProviderRuleError) as caught:
        check(request_body)
    assert (caught.value.status, caught.value.error_type) == (400, "invalid_request_error")
    return caught.value.message


def tool_loop_message(n: int, found: str) -> str:
    """The provider's tool-loop sentence, verbatim (Kilo-Org/kilocode#5219)."""
    return (
        f"messages.{n}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        f"`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
        "We recommend you include thinking blocks from previous turns. To avoid this "
        "requirement, disable `thinking`. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    )


TOOL_LOOP_BREAKERS: list[Any] = [
    pytest.param(body(user("q"), assistant(text("a"), use("toolu_1")), user(result("toolu_1"))),
                 1, "text", id="opener starts with text"),
    pytest.param(body(user("q"), assistant(use("toolu_1")), user(result("toolu_1"))),
                 1, "tool_use", id="opener starts with tool_use"),
    pytest.param(body(user("q"), assistant("let me look"), user("go on"),
                      assistant(use("toolu_1")), user(result("toolu_1"), text("and lint"))),
                 3, "tool_use", id="opener after the last real user turn"),
    pytest.param(body(user("q"), assistant(use("toolu_1")), user(result("toolu_1")),
                      assistant(thinking(), use("toolu_2")), user(result("toolu_2"))),
                 1, "tool_use", id="thinking later in the loop does not rescue the opener"),
    pytest.param(body(user("q"), system_msg("be brief"), assistant(use("toolu_1")),
                      user(result("toolu_1"))),
                 2, "tool_use", id="system messages are skipped to find the opener"),
    pytest.param(body(user("q"), assistant(server_use("srvtoolu_1"),
                                           server_result("srvtoolu_1"), use("toolu_1")),
                      user(result("toolu_1"))),
                 1, "server_tool_use", id="opener starts with a server tool"),
]


@pytest.mark.parametrize("mode", THINKING_ON)
@pytest.mark.parametrize(("request_body", "n", "found"), TOOL_LOOP_BREAKERS)
def test_tool_loop_turn_must_start_with_thinking(
    request_body: dict[str, Any], n: int, found: str, mode: dict[str, Any],
) -> None:
    """With thinking on and a tool loop in progress (the last message is a user message holding
    a tool_result), the first assistant message after the last real user turn must start with
    thinking or redacted_thinking; N is that message, X its first block type."""
    on = _with_thinking(request_body, mode)
    assert _message_of(on) == tool_loop_message(n, found)
    assert _message_of(on, check_count_tokens_request) == tool_loop_message(n, found)
    for off in (None, DISABLED):  # the same history is fine with thinking off
        check_messages_request(_with_thinking(request_body, off))


TOOL_LOOP_KEEPERS: list[Any] = [
    pytest.param(body(user("q"), assistant(thinking(), use("toolu_1")), user(result("toolu_1"))),
                 id="opener starts with thinking"),
    pytest.param(body(user("q"), assistant(REDACTED, use("toolu_1")), user(result("toolu_1"))),
                 id="opener starts with redacted thinking"),
    pytest.param(body(user("q"), assistant(thinking(), use("toolu_1")), user(result("toolu_1")),
                      assistant(text("next"), use("toolu_2")), user(result("toolu_2"))),
                 id="later assistant messages of the loop need no thinking"),
    pytest.param(body(user("q1"), assistant("a1"), user("q2"),
                      assistant(thinking(), use("toolu_1")), user(result("toolu_1"))),
                 id="earlier turns without thinking"),
    pytest.param(body(user("q1"), assistant(use("toolu_0")), user(result("toolu_0")),
                      assistant("done"), user("q2"), assistant(thinking(), use("toolu_1")),
                      user(result("toolu_1"))),
                 id="an earlier finished tool loop without thinking"),
    pytest.param(body(user("q"), assistant(use("toolu_1")), user(result("toolu_1")),
                      assistant("done"), user("thanks")),
                 id="no tool loop in progress: the last user message is a real turn"),
    pytest.param(body(user("q"), assistant(text("prefill"))),
                 id="no tool loop in progress: final assistant prefill"),
]


@pytest.mark.parametrize("mode", THINKING_ON)
@pytest.mark.parametrize("request_body", TOOL_LOOP_KEEPERS)
def test_tool_loop_rule_accepts_a_thinking_opener_and_other_shapes(
    request_body: dict[str, Any], mode: dict[str, Any],
) -> None:
    """Only the opener of the turn in progress is bound, and only during a tool loop."""
    check_messages_request(_with_thinking(request_body, mode))


@pytest.mark.parametrize("mode", THINKING_OFF)
@pytest.mark.parametrize("block", [pytest.param(thinking(), id="thinking"),
                                   pytest.param(REDACTED, id="redacted_thinking")])
def test_thinking_disabled_final_assistant_cannot_contain_thinking(
    mode: dict[str, Any] | None, block: dict[str, Any],
) -> None:
    """With thinking off, a final assistant message (a prefill) holding thinking is refused."""
    prefill = _with_thinking(body(user("q"), assistant("a"), user("more"),
                                  assistant(block, text("Sure"))), mode)
    assert _message_of(prefill) == (
        "messages.3.content.0: When thinking is disabled, an `assistant` message in the final "
        "position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your "
        "request."
    )
    assert _message_of(prefill, check_count_tokens_request).startswith("messages.3.content.0: ")
    # Thinking in earlier assistant messages is fine with thinking off (the corpus is so).
    check_messages_request(_with_thinking(body(user("q"), assistant(block, text("a")),
                                               user("more")), mode))
    # And the same prefill is fine with thinking on.
    check_messages_request({**prefill, "thinking": ENABLED})


def test_thinking_must_come_first_in_an_assistant_message() -> None:
    """An assistant message holding thinking must start with it (whole sentence)."""
    request_body = body(user("q"), assistant(text("a"), thinking(), text("b")), user("y"))
    assert _message_of(request_body) == (
        "messages.1.content.0: If an assistant message contains any thinking blocks, the first "
        "block must be thinking or redacted_thinking. Found text."
    )


@pytest.mark.parametrize("mode", [None, ENABLED])
@pytest.mark.parametrize("final", [False, True], ids=["earlier message", "final prefill"])
def test_final_block_of_an_assistant_message_cannot_be_thinking(
    mode: dict[str, Any] | None, final: bool,
) -> None:
    """No assistant message, not even a final prefill, may end with a thinking block
    (router-for-me/CLIProxyAPI#5321 measured user + trailing thinking → 400)."""
    messages = [user("q"), assistant(thinking(), text("a"), thinking("more"))]
    if not final:
        messages.append(user("y"))
    request_body = _with_thinking(body(*messages), mode)
    if final and mode is None:  # with thinking off the disabled-prefill rule speaks first
        assert "When thinking is disabled" in _message_of(request_body)
        return
    assert _message_of(request_body) == (
        "messages.1: The final block in an assistant message cannot be `thinking`."
    )


@pytest.mark.parametrize("mode", THINKING_OFF)
def test_clear_thinking_strategy_requires_thinking(mode: dict[str, Any] | None) -> None:
    """A clear_thinking_20251015 context-management edit needs thinking on."""
    edits = {"edits": [{"type": "clear_tool_uses_20250919"},
                       {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns",
                                                                    "value": 1}}]}
    request_body = _with_thinking(body(user("q"), context_management=edits), mode)
    expected = "`clear_thinking_20251015` strategy requires `thinking` to be enabled"
    assert _message_of(request_body) == expected
    assert _message_of(request_body, check_count_tokens_request) == expected
    for on in (ENABLED, ADAPTIVE):
        check_messages_request({**request_body, "thinking": on})
    check_messages_request(_with_thinking(
        body(user("q"), context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}),
        mode))


MODIFIED = (
    "messages.{n}.content.{m}: `thinking` or `redacted_thinking` blocks in the latest assistant "
    "message cannot be modified. These blocks must remain as they were in the original response."
)


def _altered(signature: str) -> str:
    return signature[:-1] + ("0" if signature[-1] != "0" else "1")


@pytest.mark.parametrize("mode", [None, ENABLED])
def test_latest_assistant_thinking_cannot_be_modified(mode: dict[str, Any] | None) -> None:
    """Blocks the fake signed itself are verified in the latest assistant message: an edited
    text, signature or redacted payload is refused at its position; opaque (real) signatures
    and earlier messages are not checked."""
    signed = thinking_block("Plan: read the test, then edit.")
    redacted = redacted_thinking_block("the hidden part")
    assert signed["signature"].startswith("fakesig.")
    assert redacted["data"].startswith("fakeredacted.")

    def loop(*blocks: dict[str, Any]) -> dict[str, Any]:
        return _with_thinking(body(user("q"), assistant(*blocks, use("toolu_1")),
                                   user(result("toolu_1"))), mode)

    check_messages_request(loop(signed, text("a"), redacted))
    check_messages_request(loop(thinking("real", "EqQBCkYIBxgCKkB-opaque")))
    edited_text = {**signed, "thinking": signed["thinking"] + " "}
    edited_signature = {**signed, "signature": _altered(signed["signature"])}
    edited_data = {**redacted, "data": _altered(redacted["data"])}
    assert _message_of(loop(edited_text)) == MODIFIED.format(n=1, m=0)
    assert _message_of(loop(edited_signature)) == MODIFIED.format(n=1, m=0)
    assert _message_of(loop(signed, text("a"), edited_text)) == MODIFIED.format(n=1, m=2)
    assert _message_of(loop(signed, text("a"), edited_data)) == MODIFIED.format(n=1, m=2)
    assert _message_of(loop({**redacted, "data": "fakeredacted.not-base64!"})) == (
        MODIFIED.format(n=1, m=0))
    # Only the latest assistant message is bound; earlier edited blocks are not checked here.
    check_messages_request(_with_thinking(
        body(user("q"), assistant(edited_text, text("a")), user("more"), assistant("b"),
             user("ok")), mode))
