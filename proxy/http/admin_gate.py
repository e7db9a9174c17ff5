"""Where ``/admin`` is served, and that nothing like it is ever forwarded (docs/admin.md).

An *admin-like* path (``//admin/…``, ``/ADMIN/…``, ``/admin%2f…``, ``/x/../admin``) that the
router would forward, with the caller's admin token, is answered 404. With ``admin.listen``,
the admin listener (told by its local port) serves only the admin, the main one never.
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
    """Whether a request target's path is ``/admin`` or below it, however spelt (decoded,
    slashes collapsed, dot segments resolved, case folded)."""
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
    """Whether the admin API has a listener of its own (``admin.listen``), and once bound its
    local ports and base URL."""

    separate: bool = False
    ports: set[int] = field(default_factory=set)
    url: str | None = None

    def on_admin_listener(self, request: web.Request) -> bool:
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
            elif admin_like or not forwarded and len(request.match_info.apps) > 1:
                raise _not_found()  # (every sub-application is the admin's)
        elif forwarded and is_admin_like(request.raw_path):
            raise _not_found()
        return await handler(request)

    return middleware
