"""The one application key: the app's :class:`~proxy.http.services.Services`.

The request path is handed its services when its handlers and middlewares are made; this key
is for what is reached through the app instead (the error middleware's rare store outage, the
demo, tests). The per-request key, ``RECORD``, lives with its record in :mod:`proxy.http.audit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web

if TYPE_CHECKING:
    from proxy.http.services import Services

__all__ = ["SERVICES"]

#: The app's services (set by :func:`proxy.server.app.create_app`).
# Typed in the annotation only: the services import most of the proxy.
SERVICES: Final[web.AppKey[Services]] = web.AppKey("services")
