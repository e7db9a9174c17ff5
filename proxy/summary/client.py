"""The summary calls' anthropic SDK client, made on first use.

Importing the SDK costs more CPU than the rest of the proxy's imports together, and most
processes never make a summary call: it is imported when the first one is needed, in a thread.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import anthropic

    from proxy.providers.base import Provider

__all__ = ["NO_CREDENTIAL", "SummaryClient", "sdk", "transport_client"]

# The SDK insists on a credential at construction; calls on a caller's behalf replace it.
NO_CREDENTIAL: Final = "compact-proxy-no-credential"
# SDK headers a forked call keeps when the client did not send them: the body is JSON, and
# the provider needs a version. Every other SDK header the client did not send is omitted.
_SDK_HEADERS_KEPT: Final = frozenset({"accept", "content-type", "anthropic-version",
                                      "user-agent"})
# Set by the SDK per request, outside its default headers.
_SDK_REQUEST_HEADERS: Final = ("x-stainless-retry-count", "x-stainless-timeout",
                               "x-stainless-read-timeout")


def sdk() -> Any:
    """The anthropic SDK module (imported by now: a call is made only on a built client)."""
    return importlib.import_module("anthropic")


def transport_client(provider: Provider | None, timeout_s: float) -> Callable[[], Any]:
    """What builds the SDK's HTTP client that sends each call in ``provider``'s format."""
    assert provider is not None

    def make() -> Any:
        import httpx2

        from proxy.providers.summary import ProviderTransport
        return httpx2.AsyncClient(transport=ProviderTransport(provider), timeout=timeout_s)

    return make


class SummaryClient:
    """One ``anthropic.AsyncAnthropic(**options)``, built by the first :meth:`get`, with the
    HTTP client ``make_http_client`` makes (``None``: the SDK's own)."""

    def __init__(self, make_http_client: Callable[[], Any] | None = None,
                 **options: Any) -> None:
        self._make_http_client = make_http_client
        self._options = options
        self._client: anthropic.AsyncAnthropic | None = None
        #: The SDK's headers a forked call omits unless the client sent them (lower case),
        #: known once the client is built.
        self.omitted_headers: frozenset[str] = frozenset()

    async def get(self) -> anthropic.AsyncAnthropic:
        """The client, built on the first call (the SDK imported off the event loop)."""
        if self._client is None:
            module = await asyncio.to_thread(importlib.import_module, "anthropic")
            if self._client is None:  # (another call may have built it meanwhile)
                http_client = (self._make_http_client() if self._make_http_client is not None
                               else None)
                client = module.AsyncAnthropic(http_client=http_client, **self._options)
                self.omitted_headers = frozenset(
                    {name.lower() for name in client.default_headers}
                    | set(_SDK_REQUEST_HEADERS)) - _SDK_HEADERS_KEPT
                self._client = client
        return self._client

    async def close(self) -> None:
        """Close the client's connections, if it was built."""
        if self._client is not None:
            await self._client.close()
