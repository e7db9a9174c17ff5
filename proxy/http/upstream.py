"""The provider as the request path reaches it: one HTTP session (its connection pool), the
waits for answers under way and the provider's reachability (``/healthz``).

The session needs a running event loop, so it is opened when the app starts
(:meth:`Upstream.running`, a cleanup context) and closed when it stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress

import aiohttp
from aiohttp import web

from proxy.config import UpstreamConfig
from proxy.http.upstream_health import UpstreamHealth
from proxy.http.upstream_waits import UpstreamWaits

__all__ = ["Upstream"]


class Upstream:
    """The provider's connection pool, its waits and its health.

    Args:
        config: the ``upstream`` section.
        masked_url: its base URL with any credentials masked (for logs and ``/healthz``).
    """

    def __init__(self, config: UpstreamConfig, masked_url: str) -> None:
        self.config = config
        self.waits = UpstreamWaits(config.read_timeout_s)
        self.health = UpstreamHealth(masked_url)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (only while the app runs)."""
        if self._session is None:
            raise RuntimeError("the upstream session is opened when the app starts")
        return self._session

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """The app's cleanup context: the session and the waits' sweep while it runs."""
        config = self.config
        self._session = aiohttp.ClientSession(
            # The read timeout is UpstreamWaits' (one sweep, no timer per read). ``connect``
            # bounds getting a connection: waiting for one of the pool's to be free, and
            # opening a new one (the TCP connect itself also within ``sock_connect``).
            timeout=aiohttp.ClientTimeout(
                total=None, connect=config.pool_wait_s, sock_connect=config.connect_timeout_s,
                sock_read=None),
            # Bodies are relayed as the bytes they are, Content-Encoding included.
            auto_decompress=False,
            # Cookies set by the provider belong to the client, never to the next caller.
            cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=config.max_connections, limit_per_host=0),
        )
        sweeping = asyncio.get_running_loop().create_task(self.waits.run())
        try:
            yield
        finally:
            sweeping.cancel()
            with suppress(asyncio.CancelledError):
                await sweeping
            await self._session.close()
            self._session = None
