"""The provider as the request path reaches it: one HTTP session (opened and closed with the
app) and the provider's reachability (``/healthz``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.config import UpstreamConfig
from proxy.http.upstream_health import UpstreamHealth

__all__ = ["Upstream"]


class Upstream:
    """The provider's connection pool and its health (``masked_url`` for logs and healthz)."""

    def __init__(self, config: UpstreamConfig, masked_url: str) -> None:
        self.config = config
        self.health = UpstreamHealth(masked_url)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream session is opened when the app starts")
        return self._session

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """The app's cleanup context: the session while the app runs."""
        config = self.config
        self._session = aiohttp.ClientSession(
            # ``connect`` bounds getting a connection: a pooled one free, or a new one opened.
            timeout=aiohttp.ClientTimeout(
                total=None, connect=config.pool_wait_s, sock_connect=config.connect_timeout_s,
                sock_read=config.read_timeout_s),
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
