"""Provider faults, end to end: each gets the client the right Anthropic-shaped answer within
its timeout, the same proxy serves the next request, and nothing is recorded as a success
(the ``request_completed`` line, ``/metrics``, the summary cache, the sticky checkpoints)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

import compactor
from proxy.fake_upstream import FakeUpstream, Fault, Reply, start_fake_upstream
from proxy.fake_upstream.replies import MALFORMED_SSE_EVENT, MALFORMED_SSE_TAIL, FaultKind
from tests.conftest import (
    TEST_API_KEY,
    LoopThread,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    log_lines_for,
    read_log,
    user_text,
)
from tests.proxy.e2e.helpers import SUMMARY_POLICY, read_turns

MODEL = "claude-sonnet-4-5"
HEADERS = {"x-api-key": TEST_API_KEY, "content-type": "application/json"}
READ_TIMEOUT_S = 0.5
# Generous slack over a timeout on a loaded 2-core machine, still far below "hangs".
SLACK_S = 2.0


def body(stream: bool, text: str = "fault probe") -> bytes:
    """A small valid request."""
    return json.dumps({"model": MODEL, "max_tokens": 16, "stream": stream,
                       "messages": [{"role": "user", "content": user_text(text)}]}).encode()


async def post(proxy: RunningProxy, data: bytes
               ) -> tuple[int, CIMultiDict[str], bytes, float]:
    """POST to ``/v1/messages``: status, headers, the whole body, seconds taken."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", data=data,
                             headers=HEADERS) as resp:
            try:
                payload = await resp.read()
            except aiohttp.ClientPayloadError:
                payload = b"<cut>"
            return resp.status, CIMultiDict(resp.headers), payload, time.monotonic() - started


def sse_events(payload: bytes) -> list[tuple[str, str]]:
    """``(event name, data)`` of each complete event of an SSE body."""
    events = []
    for block in payload.split(b"\n\n"):
        name = data = ""
        for line in block.decode("utf-8", "replace").split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        if name:
            events.append((name, data))
    return events


def completed_line(proxy_log: Path, headers: CIMultiDict[str]) -> dict[str, Any]:
    """The one ``request_completed`` line of the request that got ``headers`` (written just
    after the response ends, so it is waited for)."""
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + 5
    while not lines and time.monotonic() < deadline:
        lines = [line for line in log_lines_for(proxy_log, headers["x-compact-request-id"])
                 if line["event"] == "request_completed"]
        time.sleep(0.01)
    assert len(lines) == 1
    return lines[0]


async def metrics(proxy: RunningProxy) -> dict[str, float]:
    """``compact_proxy_requests_total`` samples of the messages route, by outcome."""
    await asyncio.sleep(0.05)  # a request is counted just after its response ends
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base_url}/metrics") as resp:
            text = await resp.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("compact_proxy_requests_total{") and 'route="messages"' in line:
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


async def assert_next_request_served(proxy: RunningProxy) -> None:
    """The proxy still answers a normal request, streamed and not."""
    for stream in (False, True):
        status, _, payload, _ = await post(proxy, body(stream, "still there?"))
        assert status == 200
        if stream:
            assert sse_events(payload)[-1][0] == "message_stop"
        else:
            assert json.loads(payload)["type"] == "message"


@pytest.fixture
def fault_proxy(proxy_factory: ProxyFactory) -> RunningProxy:
    """A proxy with a short read timeout in front of the fake upstream."""
    return proxy_factory({"upstream": {"read_timeout_s": READ_TIMEOUT_S}})


# -- relayed provider errors -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("status", "error_type", "headers"), [
    (429, "rate_limit_error", {"retry-after": "7",
                               "anthropic-ratelimit-requests-remaining": "0"}),
    (500, "api_error", {}),
    (529, "overloaded_error", {}),
])
async def test_provider_error_status_is_relayed_with_its_headers_and_not_counted_as_success(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path,
    status: int, error_type: str, headers: dict[str, str], stream: bool,
) -> None:
    """429 (retry-after), 500 and 529 come back as sent; the record says upstream_error."""
    upstream_server.upstream.push(Reply.api_error(status, error_type, "provider says no",
                                                  headers=headers))
    got, got_headers, payload, _ = await post(fault_proxy, body(stream))
    assert got == status
    error = json.loads(payload)
    assert error["type"] == "error" and error["error"]["type"] == error_type
    assert error["error"]["message"] == "provider says no"
    assert got_headers["request-id"] == error["request_id"]
    for name, value in headers.items():
        assert got_headers[name] == value
    line = completed_line(proxy_log, got_headers)
    assert (line["upstream_status"], line["outcome"]) == (status, "upstream_error")
    assert await metrics(fault_proxy) == {"upstream_error": 1.0}
    await assert_next_request_served(fault_proxy)
    assert (await metrics(fault_proxy))["forwarded"] == 2.0


# -- no answer at all ----------------------------------------------------------------------


def closed_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_refused_connection_is_502_quickly_and_served_once_the_provider_is_back(
    proxy_factory: ProxyFactory, servers: LoopThread, proxy_log: Path
) -> None:
    """Nobody listening: 502 api_error at once, naming the provider's URL; one
    ``upstream_unreachable`` warning; ``/healthz`` says since when. The same proxy serves when
    a provider returns, and ``/healthz`` forgets it."""
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    proxy = proxy_factory(upstream_url=url)
    for stream in (False, True):
        status, headers, payload, took = await post(proxy, body(stream))
        assert status == 502 and took < SLACK_S
        error = json.loads(payload)["error"]
        assert error["type"] == "api_error"
        assert error["message"] == f"upstream provider {url} unreachable (ClientConnectorError)"
        line = completed_line(proxy_log, headers)
        assert (line.get("upstream_status"), line["outcome"]) == (None, "upstream_unreachable")
    warned = [line for line in read_log(proxy_log) if line["event"] == "upstream_unreachable"
              and line.get("upstream") == url]
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    health = await healthz(proxy)
    assert health["status"] == "ok" and health["store"] == "ok"
    assert health["upstream"].startswith("unreachable since 20")
    assert await metrics(proxy) == {"upstream_unreachable": 2.0}
    runner, _ = await asyncio.wrap_future(
        servers.submit(start_fake_upstream(FakeUpstream(), port=port)))
    try:
        await assert_next_request_served(proxy)
    finally:
        await asyncio.wrap_future(servers.submit(runner.cleanup()))
    assert await healthz(proxy) == {"status": "ok", "store": "ok"}


async def healthz(proxy: RunningProxy) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base_url}/healthz") as resp:
            assert resp.status == 200
            answer: dict[str, Any] = await resp.json()
            return answer


async def test_connection_closed_without_a_response_is_502(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path
) -> None:
    """The provider accepts, reads, and closes without a byte: 502, recorded as unreachable."""
    upstream_server.upstream.push(Reply.text("never", fault=Fault("close_connection")))
    status, headers, payload, took = await post(fault_proxy, body(True))
    assert status == 502 and took < SLACK_S
    assert json.loads(payload)["error"]["type"] == "api_error"
    assert completed_line(proxy_log, headers)["outcome"] == "upstream_unreachable"
    await assert_next_request_served(fault_proxy)


@pytest.mark.parametrize("stream", [False, True])
async def test_accept_then_hang_is_504_within_the_read_timeout_and_cancels_upstream(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path, stream: bool
) -> None:
    """No first byte within ``read_timeout_s``: 504 in time; the provider sees the hang-up."""
    upstream = upstream_server.upstream
    upstream.push(Reply.text("late", fault=Fault("hang_before_first_byte", hang_s=30)))
    status, headers, payload, took = await post(fault_proxy, body(stream))
    assert status == 504
    assert READ_TIMEOUT_S <= took < READ_TIMEOUT_S + SLACK_S
    assert json.loads(payload)["error"]["type"] == "api_error"
    line = completed_line(proxy_log, headers)
    assert (line.get("upstream_status"), line["outcome"]) == (None, "upstream_timeout")
    for _ in range(100):
        if upstream.cancelled:
            break
        await asyncio.sleep(0.02)
    assert upstream.cancelled == 1
    assert await metrics(fault_proxy) == {"upstream_timeout": 1.0}
    await assert_next_request_served(fault_proxy)


async def test_accept_then_silence_on_a_raw_socket_is_504(
    proxy_factory: ProxyFactory, proxy_log: Path
) -> None:
    """A provider that accepts the TCP connection and never reads or writes: 504 in time."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = proxy_factory({"upstream": {"read_timeout_s": READ_TIMEOUT_S}},
                          upstream_url=f"http://127.0.0.1:{port}")
    try:
        status, headers, payload, took = await post(proxy, body(False))
    finally:
        server.close()
        for writer in held:
            writer.close()
    assert status == 504 and took < READ_TIMEOUT_S + SLACK_S
    assert completed_line(proxy_log, headers)["outcome"] == "upstream_timeout"


@pytest.mark.parametrize("stream", [False, True])
async def test_slow_first_byte_within_the_timeout_is_a_normal_answer(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path, stream: bool
) -> None:
    """A provider slow to start (but inside ``read_timeout_s``) is waited for, not failed."""
    proxy = proxy_factory({"upstream": {"read_timeout_s": 3}})
    upstream_server.upstream.push(Reply.text("slow but fine",
                                             fault=Fault("slow_first_byte", hang_s=0.4)))
    status, headers, payload, took = await post(proxy, body(stream))
    assert status == 200 and took >= 0.4
    if stream:
        assert sse_events(payload)[-1][0] == "message_stop"
    else:
        assert json.loads(payload)["content"][0]["text"] == "slow but fine"
    assert completed_line(proxy_log, headers)["outcome"] == "forwarded"


async def test_slow_first_byte_past_the_timeout_is_504(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """Slower than ``read_timeout_s``: the same 504 as a hang."""
    upstream_server.upstream.push(Reply.text("too slow",
                                             fault=Fault("slow_first_byte", hang_s=3)))
    status, _, _, took = await post(fault_proxy, body(False))
    assert status == 504 and took < READ_TIMEOUT_S + SLACK_S
    await assert_next_request_served(fault_proxy)


# -- failures inside a stream --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cut_after_events", "cut_mid_event"])
async def test_stream_cut_ends_with_an_error_event_and_never_half_an_event(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path,
    kind: FaultKind,
) -> None:
    """Connection dropped after 3 events (or inside the 4th): 3 whole events, then ``error``."""
    upstream_server.upstream.push(Reply.text("one two three four",
                                             fault=Fault(kind, after_events=3)))
    status, headers, payload, took = await post(fault_proxy, body(True))
    assert status == 200 and took < SLACK_S
    events = sse_events(payload)
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start",
                                            "error"]
    for _, data in events:
        json.loads(data)  # every relayed event is whole
    error = json.loads(events[-1][1])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert payload.endswith(b"\n\n")
    line = completed_line(proxy_log, headers)
    assert (line["upstream_status"], line["outcome"]) == (200, "stream_failed")
    assert await metrics(fault_proxy) == {"stream_failed": 1.0}
    await assert_next_request_served(fault_proxy)


async def test_stream_stalling_mid_way_ends_with_a_timeout_error_event(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path
) -> None:
    """Events stop coming for longer than ``read_timeout_s``: an ``error`` event, in time."""
    upstream_server.upstream.push(Reply.text("a b c", event_delay_s=5))
    status, headers, payload, took = await post(fault_proxy, body(True))
    assert status == 200 and took < READ_TIMEOUT_S + SLACK_S
    events = sse_events(payload)
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert "timed out" in json.loads(events[-1][1])["error"]["message"]
    assert completed_line(proxy_log, headers)["outcome"] == "stream_failed"


async def test_provider_error_event_is_relayed_and_recorded_as_an_error(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path
) -> None:
    """The provider's own ``event: error`` (overloaded) reaches the client once, as sent."""
    upstream_server.upstream.push(Reply.text("x", fault=Fault("error_event", after_events=2)))
    status, headers, payload, _ = await post(fault_proxy, body(True))
    events = sse_events(payload)
    assert status == 200
    assert [name for name, _ in events] == ["message_start", "ping", "error"]
    assert json.loads(events[-1][1])["error"]["type"] == "overloaded_error"
    line = completed_line(proxy_log, headers)
    assert (line["upstream_status"], line["outcome"]) == (200, "upstream_error_event")
    assert await metrics(fault_proxy) == {"upstream_error_event": 1.0}
    await assert_next_request_served(fault_proxy)


async def test_malformed_sse_is_relayed_as_sent_then_closed_with_an_error_event(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path
) -> None:
    """A non-JSON data line and non-SSE bytes, then EOF without ``message_stop``: relayed
    unchanged, then a separate ``error`` event says the stream was incomplete."""
    upstream_server.upstream.push(Reply.text("x", fault=Fault("malformed_sse", after_events=3)))
    status, headers, payload, took = await post(fault_proxy, body(True))
    assert status == 200 and took < SLACK_S
    assert MALFORMED_SSE_EVENT + MALFORMED_SSE_TAIL in payload
    events = sse_events(payload)
    assert events[-1][0] == "error"
    error = json.loads(events[-1][1])
    assert error["error"]["type"] == "api_error" and "message_stop" in error["error"]["message"]
    line = completed_line(proxy_log, headers)
    assert (line["upstream_status"], line["outcome"]) == (200, "stream_failed")
    await assert_next_request_served(fault_proxy)


async def test_malformed_json_body_is_relayed_unchanged(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """A non-streaming answer that is not JSON is the provider's business: passed on as is."""
    upstream_server.upstream.push(Reply.text("x", fault=Fault("malformed_sse")))
    status, _, payload, _ = await post(fault_proxy, body(False))
    assert status == 200 and payload == MALFORMED_SSE_EVENT
    await assert_next_request_served(fault_proxy)


async def test_anthropic_sdk_raises_on_every_stream_fault_instead_of_hanging(
    fault_proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """The real async SDK raises (never returns a silent partial message) on each fault."""
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=fault_proxy.base_url, api_key=TEST_API_KEY,
                                      max_retries=0, timeout=10)
    faults = [Fault("cut_after_events", after_events=4), Fault("cut_mid_event", after_events=4),
              Fault("malformed_sse", after_events=4), Fault("error_event", after_events=4)]
    async with client:
        for fault in faults:
            upstream_server.upstream.push(Reply.text("abc def", fault=fault))
            # The provider's garbage is relayed as sent, so the SDK's JSON decoder may be the
            # one to raise (ValueError) before it reaches the proxy's closing error event.
            with pytest.raises((anthropic.APIError, ValueError)):
                async with client.messages.stream(
                        model=MODEL, max_tokens=16,
                        messages=[{"role": "user", "content": user_text("sdk")}]) as stream:
                    await stream.get_final_message()
        message = await client.messages.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": user_text("ok")}])
    assert message.stop_reason == "end_turn"


# -- a failed summary leaves nothing behind ------------------------------------------------


def stored_rows(db: Path) -> tuple[int, list[tuple[str, bytes]]]:
    """The summary cache size and the checkpoint records of a store file."""
    with sqlite3.connect(db) as conn:
        summaries = conn.execute("SELECT count(*) FROM summary_cache").fetchone()[0]
        records = conn.execute(
            "SELECT kind, data FROM session_record WHERE kind LIKE 'checkpoint:%'").fetchall()
    return int(summaries), [(str(kind), bytes(data)) for kind, data in records]


@pytest.mark.parametrize("fault", [
    Reply.api_error(500, "api_error", "summary backend down"),
    Reply.api_error(529, "overloaded_error", "Overloaded"),
    Reply.text("late summary", fault=Fault("hang_before_first_byte", hang_s=30)),
    Reply.text("cut summary", fault=Fault("cut_after_events", after_events=2)),
    Reply.text("not json", fault=Fault("malformed_sse")),
    Reply.text("   "),
], ids=["500", "529", "hang", "cut", "malformed", "empty"])
async def test_failed_summary_writes_no_summary_and_no_l4_checkpoint(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
    fault: Reply,
) -> None:
    """Whatever way the summary call fails, the request is served without L4, nothing is
    cached, no checkpoint claims L4; the next request summarises and caches properly."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY,
                           "upstream": {"read_timeout_s": READ_TIMEOUT_S},
                           "summary": {"timeout_s": READ_TIMEOUT_S}})
    db = Path(proxy.config.store.path)
    messages = read_turns(12)
    data = json.dumps({"model": MODEL, "max_tokens": 16, "messages": messages}).encode()
    upstream_server.upstream.push(fault)
    status, headers, _, took = await post(proxy, data)
    assert status == 200 and took < READ_TIMEOUT_S + SLACK_S
    assert "L4" not in headers["x-compact-layers"].split(",")
    events = [line["event"] for line in log_lines_for(proxy_log, headers["x-compact-request-id"])]
    assert "summary_failed" in events and "summary_ready" not in events
    summaries, records = stored_rows(db)
    assert summaries == 0
    for _, blob in records:
        checkpoint = compactor.CompactionCheckpoint.from_bytes(blob)
        assert checkpoint is not None and "L4" not in checkpoint.layers
    status, headers, _, _ = await post(proxy, data)
    assert status == 200 and "L4" in headers["x-compact-layers"].split(",")
    summaries, records = stored_rows(db)
    assert summaries == 1
    checkpoints = [compactor.CompactionCheckpoint.from_bytes(blob) for _, blob in records]
    assert any(c is not None and "L4" in c.layers for c in checkpoints)
