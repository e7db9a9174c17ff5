"""What the fake upstream remembers about each request it received.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["RecordedRequest"]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake upstream saw it; also the ``request_meta`` a script receives.

    Attributes:
        method: the HTTP method.
        path: the URL path, without the query string.
        query_string: the raw query string (``""`` when there is none).
        headers: a copy of the request headers, names lower-cased (repeated headers joined
            with ``", "``).
        body: the parsed JSON body (``Content-Encoding`` undone), or ``None`` when it was
            empty, did not decode as labelled, or was not strict JSON.
        raw_length: the size of the raw body in bytes, as received on the wire (still
            encoded).
        request_id: the ``request-id`` the fake upstream answered with.
        api_key: the credential the request carried (``x-api-key`` or the bearer token), or
            ``""``.
    """

    method: str
    path: str
    query_string: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    raw_length: int = 0
    request_id: str = ""
    api_key: str = ""


def api_key_of(request: web.Request) -> str:
    """The credential a request carries: its ``x-api-key``, else its bearer token."""
    key = request.headers.get("x-api-key", "")
    if key:
        return key
    authorization = request.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def copy_headers(request: web.Request) -> dict[str, str]:
    """The request's headers, names lowercased, repeated ones joined as HTTP joins them."""
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers
