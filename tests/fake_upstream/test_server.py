"""The fake upstream served on 127.0.0.1 and driven by the real anthropic SDK."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import (
    FakeUpstream,
    Fault,
    RecordedRequest,
    Reply,
    redacted_thinking_block,
    run_fake_upstream,
    start_fake_upstream,
    text_block,
    thinking_block,
    tool_use_block,
)
from proxy.fake_upstream.replies import Usage, build_message, stream_events

MODEL = "claude-sonnet-4-5"
HELLO: list[Any] = [{"role": "user", "content": "Hello there"}]


async def _wait_for(predicate: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def test_create_returns_a_deterministic_message(client: anthropic.AsyncAnthropic) -> None:
    """A non-streaming create gets the default text naming the message count, model echoed."""
    messages: list[Any] = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}]
    message = await client.messages.create(model=MODEL, max_tokens=64, messages=messages)
    assert message.id == "msg_fake_000001"
    assert message.model == MODEL and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.content[0].text == "Fake upstream reply: I saw 3 messages."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


async def test_every_response_carries_request_id_and_rate_limit_headers(
    client: anthropic.AsyncAnthropic,
) -> None:
    """request-id and anthropic-ratelimit-requests-* come with each reply, like the real API."""
    raw = await client.messages.with_raw_response.create(model=MODEL, max_tokens=8, messages=HELLO)
    assert raw.headers["request-id"] == "req_fake_000001"
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "4000"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "3999"
    assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")


async def test_stream_with_thinking_text_and_tool_use_parses_in_the_sdk(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """messages.stream assembles thinking, text and tool_use blocks into the scripted message."""
    blocks = (thinking_block("Check the test first.", "EqQBCkYIsig"),
              text_block("Reading the test."),
              tool_use_block("toolu_01AbCdEf", "Read", {"path": "tests/test_x.py", "n": [1, 2]}))
    upstream.push(Reply(content=blocks, stop_reason="tool_use"))
    event_types: list[str] = []
    async with client.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
        async for event in stream:
            event_types.append(event.type)
        final = await stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in final.content] == [
        {"type": "thinking", "thinking": "Check the test first.", "signature": "EqQBCkYIsig"},
        {"type": "text", "text": "Reading the test."},
        {"type": "tool_use", "id": "toolu_01AbCdEf", "name": "Read",
         "input": {"path": "tests/test_x.py", "n": [1, 2]}},
    ]
    assert final.stop_reason == "tool_use"
    assert {"thinking", "signature", "text", "input_json"} <= set(event_types)
    assert event_types[-1] == "message_stop"


async def test_stream_is_sse_with_the_reference_framing(
    upstream: FakeUpstream, http: aiohttp.ClientSession,
) -> None:
    """The raw stream is text/event-stream made of 'event:'/'data:' frames in §7 order."""
    async with http.post("/v1/messages", headers={"x-api-key": "k"}, json={
        "model": MODEL, "max_tokens": 8, "messages": HELLO, "stream": True,
    }) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payload = (await response.read()).decode()
    frames = [frame for frame in payload.split("\n\n") if frame]
    names = [frame.split("\n")[0].removeprefix("event: ") for frame in frames]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(frame.split("\n")[1].startswith("data: {") for frame in frames)


async def test_count_tokens_matches_the_usage_of_the_same_prompt(
    client: anthropic.AsyncAnthropic,
) -> None:
    """count_tokens returns the same estimate that usage splits between input and cache."""
    counted = await client.messages.count_tokens(model=MODEL, messages=HELLO, system="terse")
    message = await client.messages.create(model=MODEL, max_tokens=8, messages=HELLO,
                                           system="terse")
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0)


async def test_models_are_listed_and_retrieved(client: anthropic.AsyncAnthropic) -> None:
    """GET /v1/models pages the fixed list; GET /v1/models/{id} returns one or 404."""
    ids = [model.id async for model in client.models.list(limit=2)]
    assert ids == ["claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5"]
    model = await client.models.retrieve("claude-haiku-4-5")
    assert model.display_name == "Claude Haiku 4.5"
    with pytest.raises(anthropic.NotFoundError):
        await client.models.retrieve("claude-unknown")


async def test_requests_without_credentials_get_401(http: aiohttp.ClientSession) -> None:
    """Without x-api-key or a bearer token the answer is 401 authentication_error."""
    async with http.post("/v1/messages", json={"model": MODEL, "max_tokens": 8,
                                               "messages": HELLO}) as response:
        assert response.status == 401
        error = await response.json()
    assert error["error"] == {"type": "authentication_error",
                              "message": "x-api-key header is required"}
    assert error["request_id"] == response.headers["request-id"]


async def test_only_the_accepted_keys_pass_when_the_provider_knows_its_keys(
        upstream: FakeUpstream, base_url: str) -> None:
    """With ``accepted_keys`` set, any other credential gets 401 ``invalid x-api-key`` on
    every route (as the provider refuses a made-up key); a known one is served."""
    upstream.accepted_keys = frozenset({"known"})
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="made-up",
                                        max_retries=0) as stranger:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await stranger.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
        assert caught.value.body["error"] == {"type": "authentication_error",
                                              "message": "invalid x-api-key"}
        with pytest.raises(anthropic.AuthenticationError):
            await stranger.models.list(limit=1)
    async with anthropic.AsyncAnthropic(base_url=base_url, auth_token="known",
                                        max_retries=0) as known:
        message = await known.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
    assert message.content[0].type == "text"


async def test_bearer_token_is_accepted(base_url: str) -> None:
    """Authorization: Bearer (the SDK's auth_token) authenticates as well as x-api-key."""
    async with anthropic.AsyncAnthropic(base_url=base_url, auth_token="tok",
                                        max_retries=0) as sdk:
        message = await sdk.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
    assert message.content[0].type == "text"


async def test_rule_violation_surfaces_as_bad_request_with_the_rule_text(
    client: anthropic.AsyncAnthropic, upstream: FakeUpstream,
) -> None:
    """A broken tool protocol is a 400 BadRequestError carrying the provider's sentence."""
    messages: list[Any] = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
        {"role": "user", "content": "never answered"},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model=MODEL, max_tokens=8, messages=messages)
    error: Any = caught.value.body
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_1.")
    assert caught.value.request_id == error["request_id"]
    assert upstream.queue == type(upstream.queue)()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_fake_signed_thinking_round_trips_and_an_edit_is_refused(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic, stream: bool,
) -> None:
    """The fake signs the thinking it produces; sent back unchanged in the tool loop it passes,
    edited it is a 400 with the provider's "cannot be modified" sentence."""
    upstream.push(Reply(content=(thinking_block("Check the test first."),
                                 redacted_thinking_block("hidden step"),
                                 tool_use_block("toolu_01", "Read", {"path": "a.py"})),
                        stop_reason="tool_use"),
                  Reply.text("Fine."))
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    if stream:
        async with client.messages.stream(model=MODEL, max_tokens=2048, messages=HELLO,
                                          thinking=thinking) as events:
            first = await events.get_final_message()
    else:
        first = await client.messages.create(model=MODEL, max_tokens=2048, messages=HELLO,
                                             thinking=thinking)
    blocks = [block.model_dump(exclude_none=True) for block in first.content]
    assert blocks[0]["signature"].startswith("fakesig.")
    assert blocks[1]["data"].startswith("fakeredacted.")
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                           "content": "print(1)"}]}
    history: list[Any] = [*HELLO, {"role": "assistant", "content": blocks}, answer]
    second = await client.messages.create(model=MODEL, max_tokens=2048, messages=history,
                                          thinking=thinking)
    assert second.content[0].type == "text"
    edited = [{**blocks[0], "thinking": "Check the test first, then lint."}, *blocks[1:]]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model=MODEL, max_tokens=2048, thinking=thinking,
            messages=[*HELLO, {"role": "assistant", "content": edited}, answer])
    error: Any = caught.value.body
    assert error["error"]["message"] == (
        "messages.1.content.0: `thinking` or `redacted_thinking` blocks in the latest assistant "
        "message cannot be modified. These blocks must remain as they were in the original "
        "response.")


async def test_invalid_json_is_a_400(http: aiohttp.ClientSession) -> None:
    """A body that is not JSON gets 400 invalid_request_error, never a traceback."""
    async with http.post("/v1/messages", data=b"{not json", headers={
        "x-api-key": "k", "content-type": "application/json",
    }) as response:
        assert response.status == 400
        error = await response.json()
    assert error["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in error["error"]["message"]


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/nothing"), ("GET", "/v1/messages"),
                                              ("POST", "/v1/messages/batches")])
async def test_other_paths_are_404_not_found(
    http: aiohttp.ClientSession, method: str, path: str,
) -> None:
    """Routes the fake does not serve answer 404 not_found_error in the Anthropic shape."""
    async with http.request(method, path, headers={"x-api-key": "k"}) as response:
        assert response.status == 404
        error = await response.json()
    assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
    assert error["request_id"].startswith("req_fake_")


async def test_queued_replies_drive_a_tool_loop_in_order(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """Pushed replies are served one per request in order, then the script takes over."""
    upstream.push(
        Reply.tool_call("Read", {"path": "a.py"}, tool_use_id="toolu_a"),
        Reply.text("The file is fine."),
    )
    history: list[Any] = [{"role": "user", "content": "check a.py"}]
    first = await client.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert first.stop_reason == "tool_use"
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                  for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a",
                                              "content": "print(1)"}]}]
    second = await client.messages.create(model=MODEL, max_tokens=64, messages=history)
    third = await client.messages.create(model=MODEL, max_tokens=64, messages=HELLO)
    assert second.content[0].type == "text" and second.content[0].text == "The file is fine."
    assert third.content[0].type == "text"
    assert third.content[0].text == "Fake upstream reply: I saw 1 message."
    recorded = upstream.message_requests
    assert [len(r.body["messages"]) for r in recorded] == [1, 3, 1]


async def test_requests_are_recorded_with_query_headers_and_body(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """Each request is kept with its query string, lower-cased headers, body and size."""
    await client.messages.create(
        model=MODEL, max_tokens=8, messages=HELLO, extra_query={"beta": "true"},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    (record,) = upstream.requests
    assert isinstance(record, RecordedRequest)
    assert (record.method, record.path, record.query_string) == ("POST", "/v1/messages",
                                                                 "beta=true")
    # This SDK release sends api_key as a bearer token; x-api-key is covered by the raw tests.
    assert record.api_key == "test-key"
    assert record.headers["authorization"] == "Bearer test-key"
    assert record.headers["anthropic-version"]
    assert record.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert record.body["messages"] == HELLO and record.raw_length > 0
    assert upstream.counts["messages"] == 1


async def test_stream_events_are_flushed_one_by_one(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """With a per-event delay the client holds the first event before the last is sent."""
    reply = Reply.text("one two three four five six seven", event_delay_s=0.05)
    total = len(stream_events(build_message(reply, message_id="m", model=MODEL,
                                            usage=Usage(1, 0, 0))))
    upstream.push(reply)
    sent_at_first_event = -1
    async with client.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
        async for _event in stream:
            if sent_at_first_event < 0:
                sent_at_first_event = upstream.events_sent
        text = await stream.get_final_text()
    assert 1 <= sent_at_first_event < total
    assert upstream.events_sent == total
    assert text == "one two three four five six seven"


async def test_closing_a_stream_early_is_counted_as_cancelled(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """A client that leaves mid-stream increments `cancelled`; the server stops sending."""
    upstream.push(Reply.text("a long answer that will not be read to the end",
                             event_delay_s=0.05))
    async with client.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
        async for _event in stream:
            break
    await _wait_for(lambda: upstream.cancelled == 1)
    sent = upstream.events_sent
    await asyncio.sleep(0.2)
    assert upstream.events_sent == sent


async def test_prompt_too_long_for_the_context_window(client: anthropic.AsyncAnthropic,
                                                      upstream: FakeUpstream) -> None:
    """Above context_window estimated tokens the answer is the provider's 'prompt is too long'."""
    upstream.context_window = 50
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model=MODEL, max_tokens=8,
                                     messages=[{"role": "user", "content": "x" * 400}])
    error: Any = caught.value.body
    assert error["error"]["message"].startswith("prompt is too long: ")
    assert error["error"]["message"].endswith(" tokens > 50 maximum")


async def test_scripted_errors_keep_status_headers_and_shape(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """A queued api_error reply is served with its status, extra headers and a request_id."""
    upstream.push(Reply.api_error(529, "overloaded_error", "Overloaded",
                                  headers={"retry-after": "7"}))
    with pytest.raises(anthropic.OverloadedError) as caught:
        await client.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
    assert caught.value.response.headers["retry-after"] == "7"
    body: Any = caught.value.body
    assert body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert body["request_id"] == caught.value.response.headers["request-id"]


async def test_prompt_cache_reads_the_prefix_of_a_growing_conversation(
    client: anthropic.AsyncAnthropic,
) -> None:
    """The second turn of a conversation reports its shared prefix as cache_read tokens (a
    breakpoint on the system prompt, as agents put one)."""
    system: list[Any] = [{"type": "text", "text": "Be brief.",
                          "cache_control": {"type": "ephemeral"}}]
    history: list[Any] = [{"role": "user", "content": "context " * 200}]
    first = await client.messages.create(model=MODEL, max_tokens=8, system=system,
                                         messages=history)
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    second = await client.messages.create(model=MODEL, max_tokens=8, system=system,
                                          messages=history)
    assert first.usage.cache_read_input_tokens == 0
    assert (second.usage.cache_read_input_tokens or 0) >= (
        first.usage.cache_creation_input_tokens or 0) - 1


async def test_summarizer_marker_gets_a_structured_summary(
    client: anthropic.AsyncAnthropic,
) -> None:
    """A request whose system names the summarizer gets the headed summary text."""
    message = await client.messages.create(
        model=MODEL, max_tokens=256, system="You are the compact-proxy-summarizer.",
        messages=[{"role": "user", "content": '[{"role": "user", "content": "x"}]'}])
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("## Goal\nSummarized 1 messages")


async def test_async_scripts_and_failing_scripts(base_url: str, upstream: FakeUpstream) -> None:
    """An async script's reply is awaited; a script that raises becomes 500 api_error."""
    async def answer(body: dict[str, Any], meta: RecordedRequest) -> Reply:
        return Reply.text(f"async answer to {meta.request_id}")

    upstream.script = answer
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="k", max_retries=0) as sdk:
        message = await sdk.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
        assert message.content[0].type == "text"
        assert message.content[0].text == "async answer to req_fake_000001"

        def broken(body: dict[str, Any], meta: RecordedRequest) -> Reply:
            raise RuntimeError("secret text must not leak")

        upstream.script = broken
        with pytest.raises(anthropic.InternalServerError) as caught:
            await sdk.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
    body: Any = caught.value.body
    assert body["error"] == {"type": "api_error", "message": "Internal server error"}


async def test_fault_error_event_mid_stream(upstream: FakeUpstream,
                                            client: anthropic.AsyncAnthropic) -> None:
    """An error_event fault sends an SSE error after N events, which the SDK raises."""
    upstream.push(Reply.text("partial answer", fault=Fault("error_event", after_events=3)))
    received: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        async with client.messages.stream(model=MODEL, max_tokens=8, messages=HELLO) as stream:
            async for event in stream:
                received.append(event.type)
    body: Any = caught.value.body
    assert body["error"]["type"] == "overloaded_error"
    assert "message_stop" not in received


async def test_fault_cut_stream_drops_the_connection(upstream: FakeUpstream,
                                                     client: anthropic.AsyncAnthropic) -> None:
    """A cut_after_events fault ends the stream without message_stop: the client errors."""
    upstream.push(Reply.text("cut short", fault=Fault("cut_after_events", after_events=2)))
    with pytest.raises(Exception) as caught:
        async with client.messages.stream(model=MODEL, max_tokens=8, messages=HELLO) as stream:
            async for _event in stream:
                pass
    assert "incomplete" in str(caught.value) or isinstance(caught.value,
                                                             anthropic.APIConnectionError)
    assert upstream.events_sent == 2


async def test_fault_close_connection_is_a_connection_error(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """A close_connection fault gives the client no response at all."""
    upstream.push(Reply(fault=Fault("close_connection")))
    with pytest.raises(anthropic.APIConnectionError):
        await client.messages.create(model=MODEL, max_tokens=8, messages=HELLO)


async def test_fault_hang_times_the_client_out_and_counts_it(
    upstream: FakeUpstream, client: anthropic.AsyncAnthropic,
) -> None:
    """hang_before_first_byte sends nothing; a client timeout leaves and is counted (1 s, so the
    request reaches the server first even on a loaded machine)."""
    upstream.push(Reply.text("late", fault=Fault("hang_before_first_byte", hang_s=30)))
    with pytest.raises(anthropic.APITimeoutError):
        await client.with_options(timeout=1.0).messages.create(model=MODEL, max_tokens=8,
                                                               messages=HELLO)
    await _wait_for(lambda: upstream.cancelled == 1)


async def test_two_fake_upstreams_keep_separate_state() -> None:
    """No module globals: two servers side by side count and queue independently."""
    first, second = FakeUpstream(), FakeUpstream()
    first.push(Reply.text("from first"))
    runners = [await start_fake_upstream(first), await start_fake_upstream(second)]
    try:
        for _, url in runners:
            async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as sdk:
                await sdk.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
    finally:
        for runner, _ in runners:
            await runner.cleanup()
    assert len(first.requests) == len(second.requests) == 1
    assert not first.queue and second.requests[0].request_id == "req_fake_000001"


def test_run_fake_upstream_serves_until_sigterm(tmp_path: Path) -> None:
    """The blocking runner prints its URL, serves requests and exits 0 on SIGTERM."""
    code = "from proxy.fake_upstream import run_fake_upstream; run_fake_upstream('127.0.0.1', 0)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("fake upstream listening on http://127.0.0.1:")
        url = line.removeprefix("fake upstream listening on ")
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as sdk:
            assert [model.id for model in sdk.models.list()][0] == "claude-opus-4-5"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_run_fake_upstream_reports_a_busy_port_in_one_line() -> None:
    """A port already in use ends the runner with a one-line SystemExit, not a traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit, match=f"cannot listen on http://127.0.0.1:{port}"):
            run_fake_upstream("127.0.0.1", port)
