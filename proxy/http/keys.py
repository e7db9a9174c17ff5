"""The one application key: the app's :class:`~proxy.http.services.Services`, for what reaches
them through the app (the error middleware, the demo, tests); ``RECORD`` is in audit.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web

if TYPE_CHECKING:
    from proxy.http.services import Services

__all__ = ["SERVICES"]

# Typed in the annotation only: the services import most of the proxy.
SERVICES: Final[web.AppKey[Services]] = web.AppKey("services")
