"""The bodies of L4's summary calls (pure): the fork of the client's request, the proxy's own
call, pieces and their merge — each judged by the fake provider's strict rules."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

import compactor
from proxy.fake_upstream import check_messages_request, is_summarizer_request
from proxy.fake_upstream.rules import cache_control_count
from proxy.summary.calls import (
    FORK_INSTRUCTION,
    SUMMARIZER_MARKER,
    SUMMARY_MERGE_SYSTEM_PROMPT,
    SUMMARY_SYSTEM_PROMPT,
    ForkSource,
    SummaryCall,
    breakpoint_count,
    fork_call,
    merge_call,
    plan_calls,
    prompt_tokens,
)
from proxy.summary.flights import SingleFlight

CACHED = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
           "cache_control": CACHED}]
TOOLS = [{"name": "Read", "description": "Read a file", "cache_control": CACHED,
          "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}]
SOURCE = ForkSource(headers=(("x-api-key", "k"),), query_string="beta=true",
                    model="claude-sonnet-4-5", system=SYSTEM, tools=TOOLS,
                    tool_choice={"type": "auto"}, metadata={"user_id": "u1"})


def conversation(turns: int, size: int = 400) -> list[dict[str, Any]]:
    """A first user message, then ``turns`` Read calls and their results."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the parser"}]
    for index in range(turns):
        tool_id = f"toolu_{index:03d}"
        messages += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "opaque-sig"},
                {"type": "text", "text": f"Reading {index}."},
                {"type": "tool_use", "id": tool_id, "name": "Read",
                 "input": {"file_path": f"/src/m{index}.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": [
                    {"type": "text", "text": "x" * size},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": "iVBORw0KGgo="}}]}]},
        ]
    return messages


def request_for(messages: list[dict[str, Any]]) -> compactor.SummaryRequest:
    """The request L4 would make for ``messages`` (the span: all but the first)."""
    payload = json.dumps([{"role": m["role"], "content": m["content"]} for m in messages[1:]])
    return compactor.SummaryRequest(payload, compactor.summary_cache_key(payload),
                                    len(messages) - 1, tuple(messages))


def body_of(call: SummaryCall, model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    """The JSON body the summariser sends for ``call``."""
    body: dict[str, Any] = {"model": model, "max_tokens": 256, "messages": list(call.messages)}
    for name in ("system", "tools", "tool_choice", "metadata"):
        if getattr(call, name) is not None:
            body[name] = getattr(call, name)
    return body


def test_a_forked_call_is_the_clients_request_with_the_summary_asked_last() -> None:
    """Same system, tools, tool_choice, metadata; the conversation as the message prefix, one
    breakpoint on its last block, the instruction as the last user turn; the strict provider
    accepts it and recognises it as a summary call."""
    messages = conversation(3)
    before = copy.deepcopy(messages)
    call = fork_call(SOURCE, messages)
    assert call is not None
    assert (call.system, call.tools, call.tool_choice, call.metadata) == (
        SYSTEM, TOOLS, {"type": "auto"}, {"user_id": "u1"})
    sent = list(call.messages)
    assert sent[:-2] == messages[:-1]
    assert sent[-2]["content"][-1]["cache_control"] == CACHED
    assert {**sent[-2]["content"][-1], "cache_control": None} == {
        **messages[-1]["content"][-1], "cache_control": None}
    assert sent[-1] == {"role": "user", "content": [{"type": "text", "text": FORK_INSTRUCTION}]}
    assert messages == before  # the view's own messages are never touched
    body = body_of(call)
    check_messages_request(body)
    assert is_summarizer_request(body)
    assert cache_control_count(body) == 3
    for heading in ("Goal", "Decisions", "Failed approaches", "State of the work", "Next step"):
        assert f"## {heading}" in FORK_INSTRUCTION
    assert "do not call any tool" in FORK_INSTRUCTION


def test_the_breakpoint_is_added_only_while_the_request_keeps_at_most_four() -> None:
    """Tools, system and message blocks (nested tool_result content included) all count."""
    messages = conversation(2)
    messages[2]["content"][0]["content"][0]["cache_control"] = CACHED  # nested: counts
    assert breakpoint_count(TOOLS, SYSTEM, messages) == 3
    call = fork_call(SOURCE, messages)
    assert call is not None and cache_control_count(body_of(call)) == 4
    messages[1]["content"][1]["cache_control"] = CACHED
    call = fork_call(SOURCE, messages)
    assert call is not None and cache_control_count(body_of(call)) == 4
    assert "cache_control" not in call.messages[-2]["content"][-1]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "Read"}])
def test_a_tool_choice_that_forces_a_call_becomes_none(choice: dict[str, Any]) -> None:
    source = ForkSource(system=SYSTEM, tools=TOOLS, tool_choice=choice)
    forked = fork_call(source, conversation(1))
    assert forked is not None and forked.tool_choice == {"type": "none"}
    assert merge_call(source, ["a", "b"]).tool_choice == {"type": "none"}


def test_a_string_content_takes_its_breakpoint_as_a_text_block() -> None:
    call = fork_call(SOURCE, [{"role": "user", "content": "hello"}])
    assert call is not None
    assert call.messages[0] == {"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": CACHED}]}


@pytest.mark.parametrize("last", [
    {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                      {"type": "thinking", "thinking": "t", "signature": "s"}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x", "name": "Read",
                                       "input": {}}]},
])
def test_a_conversation_no_user_turn_may_follow_is_not_forked(last: dict[str, Any]) -> None:
    assert fork_call(SOURCE, []) is None
    assert fork_call(SOURCE, [{"role": "user", "content": "hi"}, last]) is None


def test_a_fork_that_fits_is_one_call_and_a_larger_one_is_made_in_pieces() -> None:
    """Over the budget, ``conversation[1:]`` is cut into JSON transcripts that each fit (thinking
    left out, image bytes omitted), each sent with the client's system and tools."""
    counter = compactor.CachingCounter(compactor.Chars4Counter())
    messages = conversation(12)
    request = request_for(messages)
    single = plan_calls(request, SOURCE, counter=counter, budget=100_000)
    assert single is not None and len(single) == 1 and single[0].messages[-1]["content"][0][
        "text"] == FORK_INSTRUCTION
    budget = 1200
    pieces = plan_calls(request, SOURCE, counter=counter, budget=budget)
    assert pieces is not None and len(pieces) >= 3
    seen: list[Any] = []
    for index, piece in enumerate(pieces, start=1):
        assert prompt_tokens(piece, counter) <= budget
        assert (piece.system, piece.tools) == (SYSTEM, TOOLS)
        body = body_of(piece)
        check_messages_request(body)
        assert is_summarizer_request(body)
        text = piece.messages[-1]["content"][0]["text"]
        assert f"part {index} of {len(pieces)}" in text
        seen += json.loads(text[text.index("Transcript:\n") + len("Transcript:\n"):])
    assert len(seen) == len(messages) - 1
    dumped = json.dumps(seen)
    assert '"thinking"' not in dumped and "iVBORw0KGgo" not in dumped
    assert '{"type": "image", "omitted": true}' in dumped


def test_separate_mode_is_todays_call_and_its_pieces_use_the_proxys_prompt() -> None:
    counter = compactor.CachingCounter(compactor.Chars4Counter())
    request = request_for(conversation(12))
    single = plan_calls(request, None, counter=counter, budget=100_000)
    assert single == [SummaryCall(({"role": "user", "content": request.messages_json},),
                                  system=SUMMARY_SYSTEM_PROMPT)]
    pieces = plan_calls(request, None, counter=counter, budget=1200)
    assert pieces is not None and len(pieces) >= 3
    assert all(p.system == SUMMARY_SYSTEM_PROMPT and p.tools is None for p in pieces)
    spans = [json.loads(p.messages[0]["content"]) for p in pieces]
    assert [m for span in spans for m in span] == json.loads(request.messages_json)


def test_a_message_no_piece_can_hold_gives_no_plan() -> None:
    counter = compactor.CachingCounter(compactor.Chars4Counter())
    request = request_for(conversation(2, size=40_000))
    assert plan_calls(request, SOURCE, counter=counter, budget=2000) is None
    assert plan_calls(request, None, counter=counter, budget=2000) is None


def test_an_unforkable_conversation_is_summarised_as_one_transcript() -> None:
    """No conversation (or one ending in thinking): the span as a JSON transcript, still with
    the client's system and tools."""
    request = request_for(conversation(2))
    bare = compactor.SummaryRequest(request.messages_json, request.cache_key, 4)
    calls = plan_calls(bare, SOURCE, counter=None, budget=10)
    assert calls is not None and len(calls) == 1
    assert calls[0].system == SYSTEM
    assert "part 1 of" not in calls[0].messages[0]["content"][0]["text"]
    assert is_summarizer_request(body_of(calls[0]))


def test_the_merge_asks_for_one_summary_of_the_parts() -> None:
    forked = merge_call(SOURCE, ["one", "two"])
    assert forked.system == SYSTEM and forked.tools == TOOLS
    text = forked.messages[-1]["content"][0]["text"]
    assert text.startswith(f"[{SUMMARIZER_MARKER}]")
    assert "### Part 1 of 2\none" in text and "### Part 2 of 2\ntwo" in text
    check_messages_request(body_of(forked))
    own = merge_call(None, ["one", "two"])
    assert own.system == SUMMARY_MERGE_SYSTEM_PROMPT
    assert is_summarizer_request(body_of(own))


def test_the_fake_tells_summary_calls_from_client_requests() -> None:
    """The marker in ``system`` or in the last user message's text; anything else is not."""
    client = {"model": "m", "max_tokens": 1, "system": SYSTEM, "messages": conversation(1)}
    assert not is_summarizer_request(client)
    earlier = {**client, "messages": [
        {"role": "user", "content": f"[{SUMMARIZER_MARKER}] quoted"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]}
    assert not is_summarizer_request(earlier)
    assert is_summarizer_request({**client, "system": SUMMARY_SYSTEM_PROMPT})
    assert is_summarizer_request({**client, "messages": [
        {"role": "user", "content": f"x [{SUMMARIZER_MARKER}]"}]})


def test_fork_source_takes_the_forwarded_system_and_the_clients_fields() -> None:
    body = {"model": "claude-sonnet-4-5", "system": "client", "tools": TOOLS,
            "metadata": {"user_id": "u"}, "messages": []}
    source = ForkSource.from_request([("x-app", "cli"), ("anthropic-beta", "a"),
                                      ("anthropic-beta", "b")], "beta=true", body,
                                     system=[{"type": "text", "text": "client"}])
    assert source.headers == (("x-app", "cli"), ("anthropic-beta", "a"), ("anthropic-beta", "b"))
    assert (source.model, source.tools, source.tool_choice, source.metadata) == (
        "claude-sonnet-4-5", TOOLS, None, {"user_id": "u"})
    assert source.system == [{"type": "text", "text": "client"}]


async def test_single_flight_runs_one_task_per_key_and_forgets_it_when_done() -> None:
    flights: SingleFlight[str] = SingleFlight()
    gate = asyncio.Event()
    runs = 0

    async def work() -> str:
        nonlocal runs
        runs += 1
        await gate.wait()
        return "done"

    first = flights.start("k", work)
    assert flights.start("k", work) is first and flights.running("k") is first
    other = flights.start("other", work)
    waiter = asyncio.ensure_future(asyncio.shield(first))
    waiter.cancel()  # one waiter leaving never cancels the call
    gate.set()
    assert await first == "done" and await other == "done"
    await asyncio.sleep(0)  # the done callbacks run
    assert runs == 2 and len(flights) == 0 and flights.running("k") is None


async def test_closing_single_flight_cancels_what_still_runs() -> None:
    flights: SingleFlight[None] = SingleFlight()
    task = flights.start("k", lambda: asyncio.sleep(3600))
    await asyncio.sleep(0)
    await flights.close()
    assert task.cancelled() and len(flights) == 0


def _sdk_body(call: SummaryCall, model: str, max_tokens: int) -> Any:
    """What ``messages.create`` sends for ``call``: the SDK's own body, taken off the wire."""
    import anthropic
    import httpx2

    sent: list[bytes] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request.read())
        return httpx2.Response(200, json={
            "id": "msg_1", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})

    def given(value: Any) -> Any:
        return anthropic.omit if value is None else value

    async def create() -> None:
        async with anthropic.AsyncAnthropic(
                api_key="k", base_url="http://provider.invalid", max_retries=0,
                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer))) as sdk:
            await sdk.messages.create(
                model=model, max_tokens=max_tokens, messages=list(call.messages),
                system=given(call.system), tools=given(call.tools),
                tool_choice=given(call.tool_choice), metadata=given(call.metadata))

    asyncio.run(create())
    (body,) = sent
    return json.loads(body)


@pytest.mark.parametrize("kind", ["fork", "separate", "merge"])
def test_a_summary_call_sends_the_body_the_sdks_create_would(kind: str) -> None:
    """L4's calls go out as bytes encoded by the proxy (``messages.create`` would copy and
    re-encode the whole conversation in Python): the same JSON, field for field, with the
    fields the client did not send left out."""
    from proxy.summary.summarizer import _call_body

    conversation = [{"role": "user", "content": "Fix the bug in ünïcode.py"},
                    {"role": "assistant", "content": [{"type": "text", "text": "On it 🛠"}]}]
    call = {"fork": lambda: fork_call(SOURCE, conversation),
            "separate": lambda: plan_calls(
                compactor.SummaryRequest(json.dumps(conversation), "key", 2, tuple(conversation)),
                None, counter=None, budget=100_000)[0],  # type: ignore[index]
            "merge": lambda: merge_call(None, ["first part", "second part"])}[kind]()
    assert call is not None
    body = _call_body(call, "claude-sonnet-4-5", 2048)
    assert json.loads(body) == _sdk_body(call, "claude-sonnet-4-5", 2048)
    assert (b'"system"' in body) == (call.system is not None)


def test_a_summary_call_that_cannot_be_encoded_fails_as_the_sdks_did() -> None:
    """A lone surrogate has no UTF-8 form: the SDK's encoder raised ``UnicodeEncodeError``,
    so does the proxy's, before anything is sent; the summary fails (the view is kept), the
    request does not."""
    from proxy.config import SummaryConfig
    from proxy.summary.summarizer import CallerCredentials, ProviderSummarizer

    span = "half \ud83d a pair"  # (what L4 was asked to summarise, as separate mode sends it)
    calls = plan_calls(compactor.SummaryRequest(span, "key", 1), None, counter=None,
                       budget=100_000)
    assert calls is not None
    with pytest.raises(UnicodeEncodeError):
        _sdk_body(calls[0], "claude-sonnet-4-5", 64)

    async def summarize() -> Any:
        # Nothing listens there: a body that was encoded would fail to connect instead.
        provider = ProviderSummarizer(SummaryConfig(mode="separate", max_retries=0),
                                      "http://127.0.0.1:9", "k")
        try:
            return await provider.summarize(compactor.SummaryRequest(span, "key", 1),
                                            CallerCredentials.from_headers({}))
        finally:
            await provider.close()

    result = asyncio.run(summarize())
    assert result.text is None and result.error_class == "UnicodeEncodeError"
