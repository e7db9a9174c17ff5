"""Every route of the proxy, in one place and in match order (the forwarding catch-all last)."""

from __future__ import annotations

from aiohttp import web

from proxy.admin.api import setup_admin
from proxy.http.handlers import make_handlers
from proxy.http.services import Services
from proxy.providers import add_provider_routes
from proxy.telemetry.metrics import CONTENT_TYPE

__all__ = ["setup_routes"]


async def root_handler(request: web.Request) -> web.Response:
    """``HEAD /`` (Claude Code's check that its base URL answers): 200, never forwarded."""
    return web.Response(status=200)


def setup_routes(app: web.Application, s: Services) -> None:
    """Register the routes on ``app``, their handlers holding ``s``."""

    async def healthz(request: web.Request) -> web.Response:
        """``GET /healthz`` (docs/operations.md): 503 while the store cannot be reached."""
        upstream = s.upstream.health.status()
        extra = {} if upstream is None else {"upstream": upstream}
        if await s.store_health.available():
            return web.json_response({"status": "ok", "store": "ok", **extra})
        return web.json_response({"status": "unavailable", "store": "unavailable", **extra},
                                 status=503)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=s.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    handlers = make_handlers(s)
    router = app.router
    router.add_post("/v1/messages", handlers["messages"], name="messages")
    router.add_post("/v1/messages/count_tokens", handlers["count_tokens"], name="count_tokens")
    router.add_get("/healthz", healthz, name="healthz")
    router.add_get("/metrics", metrics, name="metrics")
    router.add_route("HEAD", "/", root_handler, name="root")
    config = s.config
    setup_admin(app, s.store, config.admin_token(), log=s.backend,  # mounts /admin
                resolvers=s.resolvers, record_changes=config.audit.enabled,
                throttle=s.auth_throttle)
    add_provider_routes(app, s.provider, handlers)  # Bedrock's, Vertex's paths
    router.add_route("*", "/{tail:.*}", handlers["passthrough"], name="passthrough")
