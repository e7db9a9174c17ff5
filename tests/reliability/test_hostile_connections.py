"""Callers that hold what a shared gateway keeps for them (issue #31): the upstream pool, a
tenant's share of the proxy, and connections that never finish a request (slowloris). Each
gets a prompt answer in the provider's error shape, and everyone else is still served.

Real proxies on loopback in front of the strict fake provider; the slow callers are raw
sockets. Counts and times are kept small (CI runs on 2 cores)."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from proxy.fake_upstream import Fault, Reply
from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    log_lines_for,
    read_log,
)
from tests.reliability.conftest import ProxyProcessFactory, ServiceProcess
from tests.reliability.test_provider_faults import HEADERS, SLACK_S, body, post

HANG_S = 20.0


async def _send(proxy: RunningProxy, data: bytes, headers: Mapping[str, str] = HEADERS,
                path: str = "/v1/messages") -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as http, http.post(
            f"{proxy.base_url}{path}", data=data, headers=dict(headers)) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


async def _wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def _held(count: int, upstream: UpstreamServer) -> None:
    upstream.upstream.push(*(Reply.text("late", fault=Fault("hang_before_first_byte",
                                                               hang_s=HANG_S))
                             for _ in range(count)))


async def _healthz(proxy: RunningProxy) -> int:
    async with aiohttp.ClientSession() as http, http.get(
            f"{proxy.base_url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return resp.status


# -- the upstream pool ---------------------------------------------------------------------


async def test_a_full_upstream_pool_answers_529_within_pool_wait_not_the_read_timeout(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
) -> None:
    """Every upstream connection held by streams on a stalling provider: the next caller gets
    529 ``overloaded_error`` with ``retry-after`` after ``pool_wait_s``, not after
    ``read_timeout_s``; once the pool frees, it is served."""
    proxy = proxy_factory({"upstream": {"max_connections": 2, "pool_wait_s": 0.5,
                                        "read_timeout_s": 30}})
    _held(2, upstream_server)
    holders = [asyncio.create_task(post(proxy, body(True, f"hold {i}"))) for i in range(2)]
    await _wait_for(lambda: len(upstream_server.upstream.requests) >= 2)
    started = time.monotonic()
    status, headers, payload = await _send(proxy, body(False, "next caller"))
    took = time.monotonic() - started
    assert status == 529, payload
    assert json.loads(payload)["error"]["type"] == "overloaded_error"
    assert headers["retry-after"] == "1"
    assert 0.4 <= took < 0.5 + SLACK_S
    completed = [line for line in log_lines_for(proxy_log, headers["x-compact-request-id"])
                 if line["event"] == "request_completed"]
    assert [line["outcome"] for line in completed] == ["upstream_busy"]
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    await _wait_for(lambda: upstream_server.upstream.cancelled >= 2)
    status, _, payload = await _send(proxy, body(False, "after"))
    assert status == 200, payload


@contextmanager
def _provider_not_accepting() -> Iterator[str]:
    """A provider whose accept queue is full (listen backlog 0, one connection never
    accepted): a new TCP connect to it hangs. Its base URL."""
    with socket.socket() as server, socket.socket() as first:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        first.connect(server.getsockname())
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize(("connect_timeout_s", "pool_wait_s", "status", "waited_s"), [
    (0.3, 3.0, 504, 0.3),  # the TCP connect's own timeout first: as before, 504
    (5.0, 0.5, 529, 0.5),  # pool_wait_s bounds opening a connection too
])
async def test_a_provider_slow_to_accept_is_bounded_by_the_shorter_of_both_timeouts(
    proxy_factory: ProxyFactory, connect_timeout_s: float, pool_wait_s: float, status: int,
    waited_s: float,
) -> None:
    """A connect that hangs ends at ``upstream.connect_timeout_s`` (504 ``api_error``) or at
    ``upstream.pool_wait_s`` when that is shorter (529 ``overloaded_error``)."""
    with _provider_not_accepting() as url:
        proxy = proxy_factory({"upstream": {"connect_timeout_s": connect_timeout_s,
                                            "pool_wait_s": pool_wait_s}}, upstream_url=url)
        started = time.monotonic()
        got, _, payload = await _send(proxy, body(False))
        took = time.monotonic() - started
    assert got == status, payload
    assert json.loads(payload)["error"]["type"] == (
        "api_error" if status == 504 else "overloaded_error")
    assert waited_s * 0.9 <= took < waited_s + SLACK_S


# -- per-tenant concurrency ----------------------------------------------------------------


def _tenant(name: str) -> dict[str, str]:
    return {**HEADERS, "x-tenant": name}


async def test_a_tenant_over_its_concurrency_gets_429_before_its_body_and_others_are_served(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
) -> None:
    """Tenant A holds its two slots: its third request is answered 429 ``rate_limit_error``
    with ``retry-after`` at once, though its body has not been sent; tenant B is served."""
    proxy = proxy_factory({"session": {"scope": "header:x-tenant"},
                           "limits": {"max_concurrent_per_tenant": 2}})
    _held(2, upstream_server)
    holders = [asyncio.create_task(_send(proxy, body(True, f"a {i}"), _tenant("a")))
               for i in range(2)]
    await _wait_for(lambda: len(upstream_server.upstream.requests) >= 2)
    # A third request of A: headers only, a large body announced and never sent.
    host, port = proxy.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-tenant: a\r\n"
                 b"x-api-key: " + TEST_API_KEY.encode() + b"\r\n"
                 b"content-type: application/json\r\ncontent-length: 1000000\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK_S)
    assert head.startswith(b"HTTP/1.1 429 "), head
    assert b"\r\nretry-after: 1\r\n" in head.lower()
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    error = json.loads(await reader.readexactly(length))
    assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
    writer.close()
    # B is not affected; the upstream never saw A's third request.
    status, _, payload = await _send(proxy, body(False, "b"), _tenant("b"))
    assert status == 200, payload
    assert len(upstream_server.upstream.requests) == 3
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    # A's slots come back once its requests are over.
    await _wait_for(lambda: upstream_server.upstream.cancelled >= 2)
    status, _, payload = await _send(proxy, body(False, "a again"), _tenant("a"))
    assert status == 200, payload


# -- slowloris -------------------------------------------------------------------------------

SLOW = 200


async def _open(proxy: RunningProxy, count: int, first: bytes
                ) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = proxy.base_url.removeprefix("http://").split(":")
    conns = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(first)
        conns.append((reader, writer))
    return conns


async def _reader_ends(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
                       seconds: float) -> list[bytes | None]:
    """What each connection received until the proxy closed it (``None``: still open after
    ``seconds``), while a byte is sent on each every 0.2 s."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        received = bytearray()

        async def dribble() -> None:
            while not received:  # (a byte after the answer would only reset the connection)
                await asyncio.sleep(0.2)
                writer.write(b"a")

        dribbling = asyncio.create_task(dribble())
        try:
            async with asyncio.timeout(seconds):
                while chunk := await reader.read(65536):
                    received += chunk
            return bytes(received)
        except TimeoutError:
            return None
        except ConnectionError:
            return bytes(received)
        finally:
            dribbling.cancel()
            writer.close()

    return await asyncio.gather(*(one(r, w) for r, w in conns))


async def test_slow_headers_are_closed_after_header_timeout_and_healthz_is_served(
    proxy_factory: ProxyFactory,
) -> None:
    """200 connections sending their headers a byte at a time are closed once
    ``listen.header_timeout_s`` has passed; ``/healthz`` answers meanwhile."""
    proxy = proxy_factory({"listen": {"header_timeout_s": 1.0}})
    conns = await _open(proxy, SLOW, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-a: ")
    started = time.monotonic()
    ends = asyncio.create_task(_reader_ends(conns, 1.0 + 2 * SLACK_S))
    assert await _healthz(proxy) == 200
    got = await ends
    assert all(end is not None for end in got), f"{got.count(None)} still open"
    assert time.monotonic() - started < 1.0 + 2 * SLACK_S
    assert await _healthz(proxy) == 200


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/files"])
async def test_a_slow_body_gets_408_after_body_timeout_and_the_connection_closes(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, path: str,
) -> None:
    """Bodies sent a byte at a time, on the compacted route and a forwarded one: 408 in the
    provider's error shape once ``listen.body_timeout_s`` has passed, then closed; nothing
    of a compacted route's body reached the provider."""
    proxy = proxy_factory({"listen": {"body_timeout_s": 1.0}})
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nx-api-key: {TEST_API_KEY}\r\n"
            "content-type: application/json\r\ncontent-length: 100000\r\n\r\n{").encode()
    conns = await _open(proxy, 50, head)
    started = time.monotonic()
    got = await _reader_ends(conns, 1.0 + 2 * SLACK_S)
    took = time.monotonic() - started
    assert all(end is not None for end in got), f"{got.count(None)} still open"
    assert took < 1.0 + 2 * SLACK_S
    for answer in got:
        assert answer is not None
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert error["type"] == "error" and "body_timeout_s" in error["error"]["message"]
    if path == "/v1/messages":
        assert upstream_server.upstream.requests == []
    assert await _healthz(proxy) == 200


async def test_connections_over_the_cap_get_503_at_once_and_healthz_recovers(
    proxy_factory: ProxyFactory, proxy_log: Path,
) -> None:
    """With ``listen.max_connections`` held by slow callers, a new connection is answered
    503 ``overloaded_error`` at once (not left hanging, no descriptor kept); once the slow
    ones are closed by the header timeout, ``/healthz`` is served again."""
    proxy = proxy_factory({"listen": {"max_connections": 40, "header_timeout_s": 1.5}})
    conns = await _open(proxy, 40, b"GET /healthz HTTP/1.1\r\n")
    await asyncio.sleep(0.2)
    started = time.monotonic()
    extra = await _open(proxy, 5, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    for reader, writer in extra:
        answer = await asyncio.wait_for(reader.read(), SLACK_S)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "overloaded_error"
        writer.close()
    assert time.monotonic() - started < SLACK_S
    refused = [line for line in read_log(proxy_log) if line["event"] == "connections_refused"]
    assert refused and refused[0]["max_connections"] == 40  # one line, not one per connection
    await _reader_ends(conns, 1.5 + 2 * SLACK_S)
    assert await _healthz(proxy) == 200


# -- open files, in a real `serve` process (uvloop) --------------------------------------------


@contextmanager
def _soft_open_files_limit(soft: int) -> Iterator[None]:
    """This process's soft limit on open files lowered to ``soft`` (a child inherits it)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _serve_with_few_files(proxy_process: ProxyProcessFactory, upstream: UpstreamServer,
                          overrides: Mapping[str, Any] | None = None) -> ServiceProcess:
    with _soft_open_files_limit(FEW_FILES):
        return proxy_process(upstream.base_url, overrides)


FEW_FILES = 256


async def test_slow_connections_past_the_soft_open_files_limit_do_not_break_healthz(
    proxy_process: ProxyProcessFactory, upstream_server: UpstreamServer,
) -> None:
    """``serve`` started with a soft limit of 256 open files (the hard one higher), 300 slow
    connections: ``/healthz`` is still served (the soft limit is raised at startup;
    accepting no longer fails for want of descriptors)."""
    service = _serve_with_few_files(proxy_process, upstream_server)
    started = next(json.loads(line) for line in service.stderr_lines
                   if '"proxy_started"' in line)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert started["open_files_limit"] == (
        hard if hard != resource.RLIM_INFINITY else started["open_files_limit"])
    assert started["open_files_limit"] > FEW_FILES + 44  # raised at startup
    proxy = RunningProxy(service.base_url, None, *(Path(),) * 3)  # type: ignore[arg-type]
    conns = await _open(proxy, FEW_FILES + 44, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
    try:
        await asyncio.sleep(0.3)
        assert await _healthz(proxy) == 200
    finally:
        for _, writer in conns:
            writer.close()


async def test_the_connection_cap_answers_503_on_uvloop_too(
    proxy_process: ProxyProcessFactory, upstream_server: UpstreamServer,
) -> None:
    """``serve`` (uvloop) with ``listen.max_connections`` 50 held by slow callers: the next
    connections get the 503 ``overloaded_error`` at once."""
    service = proxy_process(upstream_server.base_url, {"listen": {"max_connections": 50}})
    proxy = RunningProxy(service.base_url, None, *(Path(),) * 3)  # type: ignore[arg-type]
    conns = await _open(proxy, 50, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
    try:
        await asyncio.sleep(0.3)
        for reader, writer in await _open(proxy, 5, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"):
            answer = await asyncio.wait_for(reader.read(), SLACK_S)
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            writer.close()
    finally:
        for _, writer in conns:
            writer.close()
