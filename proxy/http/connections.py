"""Connections a caller holds without finishing a request: bounded in time and in number.

Headers are bounded by aiohttp's ``keepalive_timeout`` (``listen.header_timeout_s``); a body
by :func:`body_deadline_middleware` (``listen.body_timeout_s``, then 408); their number by
:class:`CappedTCPSite` (``listen.max_connections``, then 503 and closed).
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Final, cast

import structlog
from aiohttp import StreamReader, web
from aiohttp.typedefs import Handler, Middleware

from proxy.http.errors import RequestRejected, error_body

__all__ = [
    "BodyTimeout",
    "CappedTCPSite",
    "body_deadline_middleware",
    "connection_cap",
    "raise_open_files_limit",
]

_log = structlog.get_logger("proxy.http.connections")


#: Open files kept for what is not a connection (the store, logs, sources).
OPEN_FILES_SPARE: Final = 64
#: Seconds a refused connection is kept for its client to read the 503 and close.
REFUSED_LINGER_S: Final = 1.0
#: Seconds between two ``connections_refused`` lines (each counts those since the last).
REFUSED_LOG_INTERVAL_S: Final = 10.0

_FULL_BODY: Final = json.dumps(error_body(
    "overloaded_error", "compact-proxy has too many open connections "
    "(listen.max_connections); retry shortly")).encode()
#: What a connection over the cap gets before it is closed (no request read).
FULL_RESPONSE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
    + str(len(_FULL_BODY)).encode() + b"\r\n\r\n" + _FULL_BODY)


class BodyTimeout(TimeoutError):
    """The request body did not arrive whole within ``listen.body_timeout_s``."""


def _overdue(content: StreamReader, timeout_s: float) -> None:
    if not content.is_eof():
        content.set_exception(BodyTimeout(f"request body not received within {timeout_s:g}s"))


def body_deadline_middleware(timeout_s: float) -> Middleware:
    """A body still arriving when its handler starts has ``timeout_s`` more to end; then 408
    and the connection closed (inside the error middleware, which answers it)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        content = request.content
        if content.is_eof():  # (no body, or all of it came with the headers)
            return await handler(request)
        timer = asyncio.get_running_loop().call_later(timeout_s, _overdue, content, timeout_s)
        try:
            return await handler(request)
        except BodyTimeout:
            _log.warning("request_body_timeout", timeout_s=timeout_s)
            raise RequestRejected(
                408, "invalid_request_error",
                f"request body not received within {timeout_s:g}s (listen.body_timeout_s)",
                reason="body_timeout", headers={"Connection": "close"}) from None
        finally:
            timer.cancel()

    return middleware


class _Refused(asyncio.Protocol):
    """A connection over the cap: the 503 and our end shut; what the client sends is dropped
    until it closes (closing on unread bytes would reset the 503), for at most
    :data:`REFUSED_LINGER_S`."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        transport = cast(asyncio.Transport, transport)
        transport.write(FULL_RESPONSE)
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class CappedTCPSite(web.TCPSite):
    """aiohttp's TCP site, but a connection accepted while ``max_connections`` are open gets
    :data:`FULL_RESPONSE` and is closed instead of being served."""

    __slots__ = ("_max_connections",)

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 max_connections: int, reuse_port: bool | None = None) -> None:
        super().__init__(runner, host, port, reuse_port=reuse_port)
        self._max_connections = max_connections

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        cap = self._max_connections
        loop = asyncio.get_running_loop()
        refused, logged_at = 0, -REFUSED_LOG_INTERVAL_S

        def protocol() -> asyncio.Protocol:
            nonlocal refused, logged_at
            if len(server.connections) < cap:
                return server()
            refused += 1
            if loop.time() - logged_at >= REFUSED_LOG_INTERVAL_S:  # (one line, not a flood)
                _log.warning("connections_refused", refused=refused, max_connections=cap)
                refused, logged_at = 0, loop.time()
            return _Refused()

        self._server = await loop.create_server(
            protocol, self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


def raise_open_files_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit (each connection, to
    a client or to the provider, is one); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # (a hard limit of "unlimited" above the kernel's)
            return soft
        return target
    return soft


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to what the open-files limit allows (each client
    connection may need one to the provider too, and a few files are kept for the rest)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, (soft - OPEN_FILES_SPARE) // 2))
