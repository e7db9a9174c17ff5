"""Where ``/admin`` is served, and that nothing like it is ever forwarded.

A path is *admin-like* when, percent-decoded (until it no longer changes), with backslashes
read as slashes, runs of slashes collapsed, dot segments resolved and case folded, it starts
with ``/admin``: ``//admin/…``, ``/ADMIN/…``, ``/admin%2f…``, ``/x/../admin``. The router
sends the exact ``/admin`` prefix to the admin sub-application; every other admin-like path
would reach the catch-all forwarder, and with it the caller's headers (the admin bearer token
among them) would reach the provider. :func:`admin_gate_middleware` answers those 404.

With ``admin.listen`` the admin API and the console are served on an address of their own
(:class:`AdminGate`, filled by :func:`proxy.server.app.start_proxy` once that listener is bound): a
request arriving there is served only when it is for them, and on the main listener nothing
admin-like is served. A connection's listener is told by its local port (the two ports
differ: the config checks it).
"""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.http.errors import RequestRejected

__all__ = ["AdminGate", "admin_gate_middleware", "is_admin_like"]

_SLASHES: Final = re.compile(r"/{2,}")
#: Percent-decoding rounds before giving up (``%25252f``: anything deeper is refused too).
_DECODE_ROUNDS: Final = 4
_PASSTHROUGH: Final = "passthrough"


def is_admin_like(raw_path: str) -> bool:
    """Whether a request target's path is ``/admin`` or below it, however spelt."""
    return _is_admin_path(raw_path.partition("?")[0])


@functools.lru_cache(maxsize=512)
def _is_admin_path(path: str) -> bool:
    for _ in range(_DECODE_ROUNDS):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    else:
        return True  # still encoded after every round: nobody's honest path
    path = _SLASHES.sub("/", "/" + path.replace("\\", "/"))
    return posixpath.normpath(path).casefold().startswith("/admin")


@dataclass
class AdminGate:
    """Whether the admin API has a listener of its own, and its ports once bound.

    Attributes:
        separate: ``admin.listen`` is set.
        ports: the local ports of the admin listener (filled when it is bound).
        url: its base URL (``http://host:port``), once bound.
    """

    separate: bool = False
    ports: set[int] = field(default_factory=set)
    url: str | None = None

    def on_admin_listener(self, request: web.Request) -> bool:
        """Whether ``request`` came in on the admin listener."""
        if not self.ports or request.transport is None:
            return False
        sockname = request.transport.get_extra_info("sockname")
        return isinstance(sockname, tuple) and len(sockname) >= 2 and sockname[1] in self.ports


def _not_found() -> RequestRejected:
    return RequestRejected(404, "not_found_error", "not found", reason="not_found")


def admin_gate_middleware(gate: AdminGate) -> Middleware:
    """404 for an admin-like path the router would forward, and for whatever is on the wrong
    listener when ``admin.listen`` is set."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        forwarded = request.match_info.route.name == _PASSTHROUGH
        if gate.separate:
            admin_like = is_admin_like(request.raw_path)
            if gate.on_admin_listener(request):
                if forwarded or not admin_like:
                    raise _not_found()
            elif admin_like or not forwarded and _in_sub_app(request):
                raise _not_found()
        elif forwarded and is_admin_like(request.raw_path):
            raise _not_found()
        return await handler(request)

    return middleware


def _in_sub_app(request: web.Request) -> bool:
    """Whether the router sent ``request`` into a sub-application (the admin API, the
    console): every one of them is the admin's."""
    return len(request.match_info.apps) > 1
