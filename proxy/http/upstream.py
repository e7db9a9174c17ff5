"""The provider as the request path reaches it: one HTTP session (its connection pool) and
the provider's reachability (``/healthz``).

The session needs a running event loop, so it is opened when the app starts
(:meth:`Upstream.running`, a cleanup context) and closed when it stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.config import UpstreamConfig
from proxy.http.upstream_health import UpstreamHealth

__all__ = ["Upstream"]


class Upstream:
    """The provider's connection pool and its health.

    Args:
        config: the ``upstream`` section.
        masked_url: its base URL with any credentials masked (for logs and ``/healthz``).
    """

    def __init__(self, config: UpstreamConfig, masked_url: str) -> None:
        self.config = config
        self.health = UpstreamHealth(masked_url)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (only while the app runs)."""
        if self._session is None:
            raise RuntimeError("the upstream session is opened when the app starts")
        return self._session

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """The app's cleanup context: the session while the app runs."""
        config = self.config
        self._session = aiohttp.ClientSession(
            # ``sock_read``: the read timeout, from the end of the upload. ``connect`` bounds
            # getting a connection: waiting for one of the pool's to be free, and opening a
            # new one (the TCP connect itself also within ``sock_connect``).
            timeout=aiohttp.ClientTimeout(
                total=None, connect=config.pool_wait_s, sock_connect=config.connect_timeout_s,
                sock_read=config.read_timeout_s),
            # Bodies are relayed as the bytes they are, Content-Encoding included.
            auto_decompress=False,
            # Cookies set by the provider belong to the client, never to the next caller.
            cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=config.max_connections, limit_per_host=0),
        )
        try:
            yield
        finally:
            await self._session.close()
            self._session = None
