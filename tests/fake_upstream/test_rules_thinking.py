"""The provider's thinking rules (reference §5.4) as the pure checker applies them, each with
the provider's whole sentence."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.fake_upstream import (
    ProviderRuleError,
    check_count_tokens_request,
    check_messages_request,
    redacted_thinking_block,
    thinking_block,
)

from .bodies import (
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
