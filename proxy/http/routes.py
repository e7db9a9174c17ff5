"""Every route of the proxy, in one place and in match order.

The catch-all comes last: ``/admin`` and everything under it (the admin sub-application:
the admin API, or 404 when it is off) and the proxy's own routes resolve before anything is
forwarded.
"""

from __future__ import annotations

from aiohttp import web

from proxy.admin import setup_admin
from proxy.auth_throttle import AUTH_THROTTLE
from proxy.http.handlers import count_tokens_handler, messages_handler, passthrough_handler
from proxy.http.upstream_health import UPSTREAM_HEALTH
from proxy.keys import AUDIT_LOG, CONFIG, METRICS, RESOLVERS, STORE, STORE_HEALTH
from proxy.metrics import CONTENT_TYPE
from proxy.providers import add_provider_routes

__all__ = ["setup_routes"]


async def healthz_handler(request: web.Request) -> web.Response:
    """``GET /healthz``: ``{"status": "ok", "store": "ok"}`` while the process serves
    requests and reaches its store; 503 with ``"store": "unavailable"`` while the store
    cannot be reached (a load balancer routes away). The store is asked cheaply: a PING at
    most once a second, none while it is known to be down. While the provider cannot be
    reached, ``"upstream": "unreachable since <time>"`` is added (the status stays)."""
    upstream = request.app[UPSTREAM_HEALTH].status()
    extra = {} if upstream is None else {"upstream": upstream}
    if await request.app[STORE_HEALTH].available():
        return web.json_response({"status": "ok", "store": "ok", **extra})
    return web.json_response({"status": "unavailable", "store": "unavailable", **extra},
                             status=503)


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: the app's metrics in the Prometheus text format."""
    return web.Response(body=request.app[METRICS].render(),
                        headers={"Content-Type": CONTENT_TYPE})


async def root_handler(request: web.Request) -> web.Response:
    """``HEAD /`` (Claude Code's check that its base URL answers, at each launch): answered
    here, 200 and no body, never forwarded (the provider would answer 404)."""
    return web.Response(status=200)


def setup_routes(app: web.Application) -> None:
    """Register the routes on ``app`` (which already holds its config and store)."""
    router = app.router
    router.add_post("/v1/messages", messages_handler, name="messages")
    router.add_post("/v1/messages/count_tokens", count_tokens_handler, name="count_tokens")
    router.add_get("/healthz", healthz_handler, name="healthz")
    router.add_get("/metrics", metrics_handler, name="metrics")
    router.add_route("HEAD", "/", root_handler, name="root")
    config = app[CONFIG]
    setup_admin(app, app[STORE], config.admin_token(), log=app[AUDIT_LOG],  # mounts /admin
                resolvers=app[RESOLVERS], record_changes=config.audit.enabled,
                throttle=app[AUTH_THROTTLE])
    add_provider_routes(app, {"messages": messages_handler, "count_tokens": count_tokens_handler,
                              "passthrough": passthrough_handler})  # Bedrock's, Vertex's paths
    router.add_route("*", "/{tail:.*}", passthrough_handler, name="passthrough")
