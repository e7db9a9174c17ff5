"""Summary calls in the provider's format: the summarizer's SDK client makes them as
``POST /v1/messages`` (its credentials, retries, errors and answer parsing unchanged), and
this transport puts each in the provider's path and body and authorises the exact bytes and
path it sends (:meth:`proxy.providers.base.Provider.summary_request`, ``authorise``)."""

from __future__ import annotations

import httpx2
from multidict import CIMultiDict
from yarl import URL

from proxy.providers.base import Provider

__all__ = ["ProviderTransport"]

_MESSAGES = "/v1/messages"


class ProviderTransport(httpx2.AsyncHTTPTransport):
    """An HTTP transport that rewrites ``POST …/v1/messages`` for ``provider``."""

    def __init__(self, provider: Provider) -> None:
        super().__init__()
        self._provider = provider

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = str(request.url).partition("?")[0]
        if request.method != "POST" or not url.endswith(_MESSAGES):
            return await super().handle_async_request(request)
        body = await request.aread()
        headers = CIMultiDict(request.headers.multi_items())
        for name in ("x-api-key", "content-length", "host"):
            headers.popall(name, None)
        path, body = self._provider.summary_request(_MESSAGES, headers, body)
        target = URL(url[: -len(_MESSAGES)] + path, encoded=True)
        headers = await self._provider.authorise("POST", target, headers, body)
        sent = httpx2.Request("POST", str(target), headers=list(headers.items()), content=body,
                              extensions=request.extensions)
        return await super().handle_async_request(sent)
