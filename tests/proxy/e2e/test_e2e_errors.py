"""End to end: what the proxy refuses, how it says so, and how upstream failures look."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import FakeUpstream, Fault, Reply, start_fake_upstream
from proxy.server.app import READ_BUFSIZE
from tests.conftest import (
    PROMPT_MARKER,
    TEST_API_KEY,
    LoopThread,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    error_of,
    first_text,
    log_lines_for,
    user_text,
)

MODEL = "claude-sonnet-4-5"
HEADERS = {"x-api-key": TEST_API_KEY, "content-type": "application/json"}


async def post_raw(proxy: RunningProxy, data: Any, path: str = "/v1/messages",
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], Any]:
    """POST ``data`` as is; the status, the response headers and the JSON body."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}{path}", data=data,
                             headers=headers or HEADERS) as resp:
            return resp.status, dict(resp.headers), await resp.json()


def assert_invalid_request(status: int, body: Any, expected_status: int = 400,
                           error_type: str = "invalid_request_error") -> str:
    """The Anthropic error shape; returns the message."""
    assert status == expected_status
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    message: str = body["error"]["message"]
    assert message
    return message


@pytest.mark.parametrize(("data", "names"), [
    (b'{"model": "m", "messages": [', "not valid JSON"),
    (b"\xff\xfe{}", "not valid UTF-8"),
    (b'[{"role": "user", "content": "hi"}]', "must be a JSON object"),
    (b'"just a string"', "must be a JSON object"),
    (b'{"model": "m", "max_tokens": 1}', "messages: is missing"),
    (b'{"model": "m", "max_tokens": 1, "messages": {"role": "user"}}', "messages: must be a list"),
    (b'{"model": "m", "max_tokens": 1, "messages": ["hi"]}', "messages.0: must be an object"),
    (b'{"model": "m", "max_tokens": 1, "system": 3, "messages": []}', "system: must be"),
])
async def test_malformed_bodies_are_refused_with_400_and_never_forwarded(
    proxy: RunningProxy, upstream_server: UpstreamServer, data: bytes, names: str
) -> None:
    """Bad JSON, a non-object body, a bad ``messages``/``system``: 400 naming the problem."""
    status, _, body = await post_raw(proxy, data)
    assert names in assert_invalid_request(status, body)
    assert upstream_server.upstream.requests == []


async def test_count_tokens_refuses_malformed_bodies_the_same_way(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """``count_tokens`` has the same parsing and the same 400."""
    status, _, body = await post_raw(proxy, b"[]", path="/v1/messages/count_tokens")
    assert "must be a JSON object" in assert_invalid_request(status, body)
    assert upstream_server.upstream.requests == []


async def test_a_body_past_the_read_buffer_is_read_whole(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """A body over twice ``READ_BUFSIZE``, where the server pauses its socket until the
    handler has taken what it holds, arrives whole: its only fault, at its very end, is
    found."""
    filler = b"y" * (2 * READ_BUFSIZE + 1024 * 1024)
    data = (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "'
            + filler + b'"}]')  # the closing brace is missing
    status, _, body = await post_raw(proxy, data)
    message = assert_invalid_request(status, body)
    assert f"not valid JSON: Expecting ',' delimiter at line 1 column {len(data) + 1}" in message
    assert upstream_server.upstream.requests == []


def test_body_over_the_limit_is_refused_with_413_from_content_length(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """A 33 MiB body (over the default 32 MiB) gets 413 ``request_too_large``."""
    filler = "x" * (33 * 1024 * 1024)
    with pytest.raises(anthropic.RequestTooLargeError) as caught:
        sdk.messages.create(model=MODEL, max_tokens=1,
                            messages=[{"role": "user", "content": filler}])
    body = caught.value.body
    message = assert_invalid_request(413, body, 413, "request_too_large")
    assert "33554432 bytes" in message
    assert upstream_server.upstream.requests == []


async def test_chunked_body_over_the_limit_is_refused_while_reading(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """A body without ``Content-Length`` is cut off with 413 as soon as it passes the limit."""
    proxy = proxy_factory({"limits": {"max_body_bytes": 4096}})

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1024
        yield b'"}]}'

    status, _, body = await post_raw(proxy, chunks())
    assert "4096 bytes" in assert_invalid_request(status, body, 413, "request_too_large")
    assert upstream_server.upstream.requests == []


def tool_use_turns(answer_id: str) -> list[Any]:
    """A tool call whose result names ``answer_id``."""
    return [
        {"role": "user", "content": user_text("read the file")},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01", "name": "Read",
             "input": {"file_path": "/tmp/a.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": answer_id, "content": "print(1)"}]},
    ]


def test_broken_tool_protocol_is_refused_with_the_documented_shape(
    sdk: anthropic.Anthropic, proxy: RunningProxy, upstream_server: UpstreamServer,
    proxy_log: Any,
) -> None:
    """A result answering an unknown id: 400 in the provider's words naming the id,
    ``compaction`` fields, a ``request_invalid`` line with the kind and the id."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(model=MODEL, max_tokens=16, messages=tool_use_turns("toolu_99"))
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error"
    assert error["message"] == (
        "messages.2: unexpected `tool_use_id` found in `tool_result` blocks: toolu_99. Each "
        "`tool_result` block must have a corresponding `tool_use` block in the previous message.")
    compaction = error["compaction"]
    assert compaction["error"] == "ToolProtocolError"
    assert compaction["kind"] in ("missing", "unknown")
    assert compaction["tool_use_id"] in error["message"]
    assert upstream_server.upstream.requests == []
    request_id = caught.value.response.headers["x-compact-request-id"]
    invalid = [line for line in log_lines_for(proxy_log, request_id)
               if line["event"] in ("request_invalid", "request_blocked")]
    assert len(invalid) == 1 and invalid[0]["event"] == "request_invalid"
    assert (invalid[0]["reason"], invalid[0]["kind"], invalid[0]["tool_use_id"]) == (
        "ToolProtocolError", compaction["kind"], "toolu_99")
    assert invalid[0]["session_id"] == caught.value.response.headers["x-compact-session-id"]


def test_view_over_the_hard_limit_is_refused_with_the_documented_shape(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    """Still over the hard limit after compaction: 400 ``prompt is too long`` + compaction data."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 100,
                                          "hard_limit_tokens": 200},
                           "summary": {"enabled": False}})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": user_text("z" * 4000)}]
    with client, pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=16, messages=messages,
                               extra_headers={"x-compact-session-id": "sess-hard-limit"})
    error = error_of(caught.value)
    compaction = error["compaction"]
    assert set(compaction) == {"error", "tokens_before", "tokens_after", "hard_limit", "layers",
                               "saved", "fixed_tokens", "messages_tokens", "detail"}
    assert compaction["error"] == "MessageViewLimitExceeded"
    assert compaction["hard_limit"] == 200
    assert compaction["tokens_after"] >= 200
    # Exactly the provider's own pattern, which clients parse; the details are in compaction.
    match = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["message"])
    assert match is not None, error["message"]
    assert re.match(r"^prompt is too long: \d+ tokens > \d+ maximum$", error["message"])
    assert (int(match[1]), int(match[2])) == (compaction["tokens_after"],
                                              compaction["hard_limit"])
    assert upstream_server.upstream.requests == []
    request_id = caught.value.response.headers["x-compact-request-id"]
    lines = log_lines_for(proxy_log, request_id)
    blocked = [line for line in lines if line["event"] == "request_blocked"]
    assert len(blocked) == 1
    assert {key: blocked[0][key] for key in ("session_id", "reason", "tokens_before",
                                             "tokens_after", "hard_limit", "layers")} == {
        "session_id": "sess-hard-limit", "reason": "MessageViewLimitExceeded",
        "tokens_before": compaction["tokens_before"], "tokens_after": compaction["tokens_after"],
        "hard_limit": 200, "layers": compaction["layers"],
    }
    completed = [line for line in lines if line["event"] == "request_completed"]
    assert "upstream_status" not in completed[0]
    assert completed[0]["outcome"] == "blocked"


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_provider_is_502_and_the_proxy_recovers_when_it_returns(
    proxy_factory: ProxyFactory, servers: LoopThread
) -> None:
    """Provider down: 502 ``api_error``; once it listens again, the next request succeeds."""
    port = free_port()
    proxy = proxy_factory(upstream_url=f"http://127.0.0.1:{port}")
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": user_text("anyone there?")}]
    with client:
        with pytest.raises(anthropic.InternalServerError) as caught:
            client.messages.create(model=MODEL, max_tokens=16, messages=messages)
        assert caught.value.status_code == 502
        assert error_of(caught.value)["type"] == "api_error"
        assert "unreachable" in error_of(caught.value)["message"]
        upstream = FakeUpstream()
        runner, _ = servers.run(start_fake_upstream(upstream, port=port))
        try:
            message = client.messages.create(model=MODEL, max_tokens=16, messages=messages)
        finally:
            servers.run(runner.cleanup())
    assert first_text(message) == "Fake upstream reply: I saw 1 message."
    assert len(upstream.message_requests) == 1


def test_provider_timeout_is_504(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """No response headers within ``read_timeout_s``: 504 ``api_error``."""
    proxy = proxy_factory({"upstream": {"read_timeout_s": 0.3}})
    upstream_server.upstream.push(Reply.text("late", fault=Fault("hang_before_first_byte",
                                                                 hang_s=5)))
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client, pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(model=MODEL, max_tokens=16,
                               messages=[{"role": "user", "content": user_text("slow")}])
    assert caught.value.status_code == 504
    assert error_of(caught.value)["type"] == "api_error"
    assert "timeout" in error_of(caught.value)["message"]


async def test_healthz_answers_ok(proxy: RunningProxy) -> None:
    """``GET /healthz`` is ``{"status": "ok", "store": "ok"}``, served by the proxy itself."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base_url}/healthz") as resp:
            assert resp.status == 200
            assert await resp.json() == {"status": "ok", "store": "ok"}


async def test_metrics_count_requests_by_route_and_outcome(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """``/metrics`` is Prometheus text with requests by route/outcome and upstream latency."""
    body = json.dumps({"model": MODEL, "max_tokens": 8,
                       "messages": [{"role": "user", "content": user_text("count me")}]})
    await post_raw(proxy, body)
    await post_raw(proxy, b"not json")
    await asyncio.sleep(0.05)  # the request line is written after the response
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base_url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    assert 'compact_proxy_requests_total{outcome="forwarded",route="messages"} 1.0' in text
    assert 'compact_proxy_requests_total{outcome="invalid",route="messages"} 1.0' in text
    assert 'compact_proxy_upstream_latency_seconds_count{route="messages"} 1.0' in text


def out_of_range_body(number: str) -> bytes:
    """A body with ``number`` (as written) inside a tool input, deep in the history."""
    body = {"model": MODEL, "max_tokens": 16, "messages": [
        {"role": "user", "content": user_text("compute")},
        {"role": "assistant", "content": [
            {"type": "text", "text": "calling"},
            {"type": "tool_use", "id": "toolu_01", "name": "Calc", "input": {"x": "NUMBER"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "r" * 3000}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": user_text("and?")},
    ]}
    return json.dumps(body).replace('"NUMBER"', number).encode()


@pytest.mark.parametrize("number", ["1e400", "-1E+400", "123456789e999", "9" * 5000])
async def test_numbers_out_of_range_are_refused_naming_their_path(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, number: str
) -> None:
    """A number no float or int can hold (``1e400`` would become ``Infinity``, not JSON):
    400 naming the number's JSON path; never forwarded, even when the body would be rewritten."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 300,
                                          "max_tool_result_tokens": 40,
                                          "keep_recent_messages": 2},
                           "summary": {"enabled": False}})
    status, _, body = await post_raw(proxy, out_of_range_body(number))
    message = assert_invalid_request(status, body)
    assert message.startswith("messages.1.content.1.input.x: number ")
    assert message.endswith(" is out of range")
    if len(number) < 40:
        assert message == f"messages.1.content.1.input.x: number {number} is out of range"
    assert upstream_server.upstream.requests == []


async def test_numbers_in_range_are_forwarded(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Large but finite numbers (``1e300``, a 300-digit integer) go through, compacted or not."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 300,
                                          "max_tool_result_tokens": 40,
                                          "keep_recent_messages": 2},
                           "summary": {"enabled": False}})
    for number in ("1e300", "7" * 300):
        status, _, body = await post_raw(proxy, out_of_range_body(number))
        assert status == 200, body
        forwarded = upstream_server.upstream.message_requests[-1].body
        assert forwarded["messages"][1]["content"][1]["input"]["x"] == json.loads(number)


COMPACTING = {"compaction": {"soft_threshold_tokens": 300, "max_tool_result_tokens": 40,
                             "keep_recent_messages": 2},
              "summary": {"enabled": False}}


@pytest.mark.parametrize("error_class", [TypeError, ValueError])
async def test_a_bug_inside_a_layer_is_a_500_not_the_clients_fault(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any,
    monkeypatch: pytest.MonkeyPatch, error_class: type[Exception],
) -> None:
    """A layer that raises (fault injected into L1): 500 ``api_error`` with a generic message,
    nothing forwarded, and a server-side log line with the traceback's frames but not the
    exception's text."""
    import compactor._pipeline

    def broken_layer(*args: Any, **kwargs: Any) -> Any:
        raise error_class(f"layer bug while reading {PROMPT_MARKER}")

    first, *rest = compactor._pipeline.LAYERS
    monkeypatch.setattr(compactor._pipeline, "LAYERS",
                        (compactor._pipeline.Layer(first.name, broken_layer, first.reshapes),
                         *rest))
    proxy = proxy_factory(COMPACTING)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", data=out_of_range_body("1"),
                             headers=HEADERS) as resp:
            status, raw = resp.status, await resp.read()
            request_id = resp.headers["x-compact-request-id"]
    body = json.loads(raw)
    assert status == 500
    assert body == {"type": "error", "error": {
        "type": "api_error", "message": f"compact-proxy internal error ({error_class.__name__})"}}
    assert PROMPT_MARKER.encode() not in raw and b"Traceback" not in raw
    assert b"layer bug" not in raw
    assert upstream_server.upstream.requests == []
    lines = log_lines_for(proxy_log, request_id)
    failed = [line for line in lines if line["event"] == "request_failed"]
    assert len(failed) == 1
    assert failed[0]["error_class"] == error_class.__name__
    frames = failed[0]["traceback"]
    assert frames[-1] == error_class.__name__
    assert any(frame.startswith("compactor/_pipeline.py:") for frame in frames)
    assert any(frame.endswith(" in broken_layer") for frame in frames)
    assert any(frame.startswith("http/handlers.py:") for frame in frames)
    assert "layer bug" not in json.dumps(lines) and PROMPT_MARKER not in json.dumps(lines)
    completed = [line for line in lines if line["event"] == "request_completed"]
    assert completed[0]["outcome"] == "internal_error"


@pytest.mark.parametrize(("messages", "named"), [
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}, "not a block"]}],
     "messages.0.content.1: must be an object"),
    ([{"role": "user", "content": 5}], "messages.0.content: must be a string or a list"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "name": "Read", "input": {}}]},
      {"role": "user", "content": "go"}],
     "messages.1: tool_use block has no id"),
])
async def test_a_message_of_the_wrong_shape_is_still_a_400(
    proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Any,
    messages: list[Any], named: str,
) -> None:
    """The client's own mistake (a block that is not an object, content of the wrong type, a
    tool_use without id): 400 ``invalid_request_error`` naming the place, never forwarded."""
    data = json.dumps({"model": MODEL, "max_tokens": 16, "messages": messages}).encode()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", data=data,
                             headers=HEADERS) as resp:
            status, body = resp.status, await resp.json()
            request_id = resp.headers["x-compact-request-id"]
    assert assert_invalid_request(status, body).startswith(named)
    assert upstream_server.upstream.requests == []
    invalid = [line for line in log_lines_for(proxy_log, request_id)
               if line["event"] in ("request_invalid", "request_blocked")]
    assert [(line["event"], line["reason"]) for line in invalid] == [
        ("request_invalid", "invalid_messages")]
