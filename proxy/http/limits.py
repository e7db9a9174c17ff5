"""Per-tenant concurrency: at most ``limits.max_concurrent_per_tenant`` forwarded requests
of a tenant in flight in one process; the next gets 429 before its body is read. A request
whose tenant cannot be told counts in one shared bucket (its handler answers the 401).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.http.audit import RECORD
from proxy.http.errors import RequestRejected
from proxy.http.tenants import TenantScope

__all__ = ["LIMITED_ROUTES", "TenantLimiter", "tenant_limit_middleware"]


#: The routes that are forwarded to the provider (the names in :mod:`proxy.http.routes`).
LIMITED_ROUTES: Final = frozenset({"messages", "count_tokens", "passthrough"})
#: Where requests whose tenant cannot be told are counted.
UNKNOWN_TENANT: Final = ""
#: Seconds a refused caller is told to wait (``retry-after``).
RETRY_AFTER_S: Final = 1


class TenantLimiter:
    """How many requests each tenant has in flight, up to ``limit`` each."""

    __slots__ = ("_in_flight", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        self.limit = limit
        self._in_flight: dict[str, int] = {}

    def in_flight(self, tenant: str) -> int:
        """The tenant's requests now in flight."""
        return self._in_flight.get(tenant, 0)

    def enter(self, tenant: str) -> bool:
        """Count one more request of ``tenant``; ``False`` (nothing counted) when it already
        has ``limit`` in flight."""
        held = self._in_flight.get(tenant, 0)
        if held >= self.limit:
            return False
        self._in_flight[tenant] = held + 1
        return True

    def leave(self, tenant: str) -> None:
        """One request of ``tenant`` is over (a tenant with none left is forgotten)."""
        held = self._in_flight[tenant] - 1
        if held:
            self._in_flight[tenant] = held
        else:
            del self._in_flight[tenant]


def tenant_limit_middleware(limiter: TenantLimiter, tenants: TenantScope) -> Middleware:
    """Hold a slot of the request's tenant while a forwarded request runs; 429 when none is
    free (inside the error middleware, which answers it)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request[RECORD].route not in LIMITED_ROUTES:  # (a provider's path: its kind)
            return await handler(request)
        try:
            tenant = tenants.tenant_of(request.headers)
        except RequestRejected:
            tenant = UNKNOWN_TENANT
        if not limiter.enter(tenant):
            raise RequestRejected(
                429, "rate_limit_error",
                f"too many concurrent requests for this tenant (at most {limiter.limit} at "
                "once, limits.max_concurrent_per_tenant); retry when one has finished",
                reason="tenant_concurrency", headers={"retry-after": str(RETRY_AFTER_S)})
        try:
            return await handler(request)
        finally:
            limiter.leave(tenant)

    return middleware
