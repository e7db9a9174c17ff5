"""What an upstream provider changes on the wire (``upstream.provider``), as one interface:
where requests go and which model they name, how they are authorised, how it refuses a prompt
as too long, how its errors look and how a summary call is put in its format.
:class:`Provider` is the first-party API: nothing changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

__all__ = ["Provider", "Route", "TOO_LONG_STATUSES"]

#: Statuses a provider refuses a prompt as too long with (first-party 400, Vertex 413).
TOO_LONG_STATUSES: Final = frozenset({400, 413})

#: One route of a provider: method, path pattern, and what it is (``messages``,
#: ``count_tokens`` or ``passthrough``).
Route = tuple[str, str, str]


class Provider:
    """The first-party Messages API; Bedrock and Vertex override what differs."""

    name = "anthropic"
    #: Whether the proxy's own credentials authorise requests (summary calls too).
    signs_calls = False

    def routes(self) -> tuple[Route, ...]:
        """The provider's own client paths (the first-party ones are the proxy's)."""
        return ()

    def model_of(self, request: web.Request) -> str | None:
        """The model a request names outside its body (in its path), if any."""
        return None

    async def authorise(self, method: str, url: URL, headers: CIMultiDict[str],
                        body: bytes) -> CIMultiDict[str]:
        """The headers to send ``body`` to ``url`` with (a copy when anything changes)."""
        return headers

    def too_long(self, status: int, plain: bytes) -> bool:
        """Whether an error body (decoded) is the provider's too-long refusal without numbers
        (the first-party one, with them, is read by :class:`proxy.http.forward.PromptTooLong`).
        """
        return False

    def error_response(self, status: int, error_type: str, message: str,
                       headers: Mapping[str, str]) -> web.Response | None:
        """The proxy's own error in the provider's shape; ``None``: the Anthropic shape."""
        return None

    def fork_parts(self, request: web.Request, body: Mapping[str, Any], model: str | None,
                   headers: CIMultiDict[str]) -> dict[str, Any]:
        """A request body as a summary call forked from it reads it (Anthropic fields, the
        ``model``); moves what the provider carries in the body into ``headers``."""
        return dict(body)

    def summary_request(self, path: str, headers: CIMultiDict[str],
                        body: bytes) -> tuple[str, bytes]:
        """A summary call the SDK made as ``POST /v1/messages`` in the provider's format:
        its path and body (``headers`` changed in place)."""
        return path, body

    def incomplete_tail(self, message: str) -> bytes | None:
        """What ends a stream the provider cut short, in the stream's own terms; ``None``
        for SSE (the first-party ``event: error``)."""
        return None


def decoded_json(raw: bytes) -> Any:
    """``raw`` as JSON, ``None`` when it is not."""
    try:
        return json.loads(raw)
    except ValueError:
        return None
