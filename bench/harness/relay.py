"""The reference relay, the floor any Python hop costs.

A bare aiohttp reverse proxy (read, forward, relay the chunks; nothing else), served in its own
process (``bench/proxy.py --null-relay``).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import aiohttp
from aiohttp import web

from bench.harness.processes import ManagedProcess, Service, free_port, wait_until_up
from proxy.config import EventLoopName
from proxy.server.allocator import tune_allocator
from proxy.server.app import READ_BUFSIZE
from proxy.server.event_loop import loop_factory

# Not forwarded by the reference relay: per-connection headers and the ones aiohttp recomputes.
_RELAY_DROPPED: Final = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade",
                                   "te", "trailer", "proxy-connection", "host",
                                   "content-length"})
_RELAY_SESSION: Final = web.AppKey("bench_relay_session", aiohttp.ClientSession)


def null_relay_app(upstream_url: str) -> web.Application:
    """The reference relay: reads the body, sends it upstream with the client's headers and
    relays the answer chunk by chunk — what any aiohttp reverse proxy must do, and nothing
    else (no parse, no compaction, no store, no log line)."""

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _RELAY_DROPPED]
        session = request.app[_RELAY_SESSION]
        async with session.request(request.method, upstream_url + request.raw_path, data=body,
                                   headers=headers, allow_redirects=False,
                                   skip_auto_headers=("User-Agent", "Accept",
                                                      "Accept-Encoding", "Content-Type"),
                                   ) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _RELAY_DROPPED:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[_RELAY_SESSION] = aiohttp.ClientSession(
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0))
        yield
        await app[_RELAY_SESSION].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def serve_null_relay(port: int, upstream_url: str, event_loop: EventLoopName = "asyncio",
                     ) -> None:
    """Serve :func:`null_relay_app` on 127.0.0.1 until SIGINT / SIGTERM, with the proxy's
    allocator thresholds and read buffer: the floor is what the same tuning gives a relay.
    ``event_loop``: the loop it runs on (the proxy's ``listen.event_loop`` values)."""
    tune_allocator()
    web.run_app(null_relay_app(upstream_url), host="127.0.0.1", port=port, access_log=None,
                print=None, handler_cancellation=True, read_bufsize=READ_BUFSIZE,
                loop=loop_factory(event_loop)())


@asynccontextmanager
async def relay_process(client: aiohttp.ClientSession, workdir: Path, upstream_url: str,
                        event_loop: EventLoopName = "asyncio") -> AsyncIterator[Service]:
    """The reference relay as a child process on a free port (on asyncio's own loop, unless
    ``event_loop`` says otherwise)."""
    port = free_port()
    name = "null-relay" if event_loop == "asyncio" else f"null-relay-{event_loop}"
    process = ManagedProcess(name, [sys.executable, "-m", "bench.proxy", "--null-relay",
                                    str(port), upstream_url, "--relay-loop", event_loop],
                             workdir / f"{name}.log")
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_until_up(client, process, f"{url}/healthz")
        yield Service(url, process)
    finally:
        process.stop()

