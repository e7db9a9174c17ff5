"""The application factory and the server runner.

:func:`create_app` builds the app's :class:`~proxy.http.services.Services` from a validated
config and hands them to the routes and middlewares; cleanup contexts open what needs a running
loop (the store, the upstream session) and close everything when the app stops.
:func:`start_proxy` serves an app on a TCP site; :func:`run_server` is ``compact-proxy serve``.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import Final
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from proxy.admin.console import setup_console
from proxy.config import Config, ConfigError
from proxy.http.admin_gate import admin_gate_middleware
from proxy.http.audit import request_context_middleware
from proxy.http.connections import (
    CappedTCPSite,
    body_deadline_middleware,
    connection_cap,
    raise_open_files_limit,
)
from proxy.http.errors import error_middleware
from proxy.http.keys import SERVICES
from proxy.http.limits import tenant_limit_middleware
from proxy.http.routes import setup_routes
from proxy.http.services import build_services
from proxy.providers import provider_error_middleware
from proxy.server.allocator import tune_allocator
from proxy.server.event_loop import run as run_loop
from proxy.server.startup import print_banner
from proxy.store import StoreBackend, StoreError, store_for
from proxy.store.revocations import LoginRevocations
from proxy.telemetry.logs import configure_logging
from proxy.telemetry.masking import config_secrets

__all__ = ["create_app", "run_server", "serve", "start_proxy"]

_log = structlog.get_logger("proxy.server.app")

#: Seconds shutdown waits for bookkeeping still running.
BACKGROUND_DRAIN_S: Final = 5.0
#: Seconds between two trims of the audit log to its retention (also one at startup): each
#: write trims too, but a session nobody writes to any more only goes this way.
AUDIT_TRIM_INTERVAL_S: Final = 3600.0
#: How long a stopping process waits for a trim it cancelled.
AUDIT_TRIM_STOP_S: Final = 2.0
#: Bytes of a request body the server buffers before it stops reading the socket until the
#: handler takes them (aiohttp pauses at twice this); the proxy holds a whole ``/v1/messages``
#: body anyway, so fewer, larger reads cost less CPU than aiohttp's default of 64 KiB.
READ_BUFSIZE: Final = 4 * 1024 * 1024


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    # A bad store.path or store.url fails here, before the site accepts a connection.
    await app[SERVICES].backend.open()
    yield
    await app[SERVICES].backend.close()


async def _background_ctx(app: web.Application) -> AsyncIterator[None]:
    # Registered after the store's context, so it ends first: bookkeeping still running
    # at shutdown finishes (bounded) while the store is open.
    yield
    s = app[SERVICES]
    await s.backend.flush()  # the audit entries gathered for a batch: written now
    if s.background.tasks:
        await asyncio.wait(s.background.tasks, timeout=BACKGROUND_DRAIN_S)
    await s.usage_ledger.close()  # the usage summed since its last write


async def _audit_trim_ctx(app: web.Application) -> AsyncIterator[None]:
    # Registered after the store's context, so the store is open while it runs.
    backend = app[SERVICES].backend

    async def trim_now_and_then() -> None:
        while True:
            try:
                removed = await backend.trim(datetime.now(UTC))
            except Exception as exc:  # noqa: BLE001 - retried at the next interval
                _log.warning("audit_trim_failed", error_class=type(exc).__name__)
            else:
                if removed:
                    _log.info("audit_trimmed", removed=removed)
            await asyncio.sleep(AUDIT_TRIM_INTERVAL_S)

    task = asyncio.get_running_loop().create_task(trim_now_and_then())
    yield
    task.cancel()
    # A trim in the middle of a store call may not end at once (redis-py shields giving
    # its connection back): it must not hold the shutdown; the store is closed right after.
    await asyncio.wait({task}, timeout=AUDIT_TRIM_STOP_S)


async def _summarizer_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    summarizer = app[SERVICES].summarizer
    if summarizer is not None:
        await summarizer.close()


def create_app(config: Config, *, store: StoreBackend | None = None) -> web.Application:
    """Build the proxy application from a validated config (``upstream.base_url`` set).

    ``store``: used instead of opening ``config.store``; the caller keeps it (never closed
    here). ``ConfigError`` for a setting that cannot work here, naming its key.
    """
    config.upstream.require_base_url()
    # The request path reads the session's state on every call; the admin API writes
    # through the same store object, so its changes are seen at once.
    backend = store if store is not None else store_for(config)
    s = build_services(config, backend)
    # Request bodies are never decoded by the server (whatever runner serves the app: the
    # handler arguments are the app's): other paths relay the client's compressed bytes with
    # the Content-Encoding and Content-Length that describe them, and /v1/messages and
    # count_tokens decode (under the size limit) in proxy.http.body.read_body.
    app = web.Application(middlewares=[
        request_context_middleware(s), provider_error_middleware(s.provider), error_middleware,
        admin_gate_middleware(s.admin_gate),
        body_deadline_middleware(config.listen.body_timeout_s),
        tenant_limit_middleware(s.tenant_limiter, s.tenants)],
        handler_args={"auto_decompress": False})
    app[SERVICES] = s
    # The compute threads stop off the loop (a step still running finishes first).
    app.on_cleanup.append(lambda _app: asyncio.to_thread(s.compute.shutdown))
    # The object store's client (s3:// roots) is closed with the app.
    app.on_cleanup.append(lambda _app: s.resolvers.close())
    if store is None:
        app.cleanup_ctx.append(_store_ctx)
    if config.audit.enabled:
        app.cleanup_ctx.append(_audit_trim_ctx)
    app.cleanup_ctx.append(_background_ctx)
    app.cleanup_ctx.append(s.upstream.running)
    app.cleanup_ctx.append(_summarizer_ctx)
    setup_routes(app, s)
    # The console at /admin/ui (resolved before the admin API's /admin), when the token is set.
    setup_console(app, token=config.admin_token(), store=s.store, log=s.backend,
                  resolvers=s.resolvers, policies=s.role_policies,
                  record_changes=config.audit.enabled, throttle=s.auth_throttle,
                  revocations=backend if isinstance(backend, LoginRevocations) else None,
                  cookie_secure=config.admin.cookie_secure, price_for=config.price_for,
                  summaries=backend)
    return app


async def start_proxy(config: Config, *, store: StoreBackend | None = None,
                      reuse_port: bool = False) -> tuple[web.AppRunner, str]:
    """Serve a new app on ``config.listen`` (and ``admin.listen``); returns the runner and the
    base URL. A client going away cancels its handler; ``runner.cleanup()`` drains for up to
    ``listen.drain_timeout_s``. ``ConfigError``: the app cannot be built, the store opened or an
    address bound."""
    app = create_app(config, store=store)
    # keepalive_timeout: a request's headers must come whole within it of the connection's
    # opening or of its previous answer (proxy.http.connections).
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=config.listen.drain_timeout_s,
                           read_bufsize=READ_BUFSIZE,
                           keepalive_timeout=config.listen.header_timeout_s)
    try:
        await runner.setup()
    except StoreError as exc:
        await runner.cleanup()
        key = "store.url" if config.store.backend == "redis" else "store.path"
        raise ConfigError(key, f"cannot open the state store: {exc}") from None
    listen = config.listen
    await _start_site(runner, "listen", listen.host, listen.port, CappedTCPSite(
        runner, listen.host, listen.port, reuse_port=True if reuse_port else None,
        max_connections=connection_cap(listen.max_connections)))
    host, port = runner.addresses[0][:2]
    await _start_admin_listener(runner, config, reuse_port)
    return runner, f"http://{host}:{port}"


async def _start_site(runner: web.AppRunner, section: str, host: str, port: int,
                      site: web.TCPSite) -> None:
    """Start ``site`` on ``host:port``; when it cannot bind, clean the app up and raise the
    ``ConfigError`` of ``<section>.port``."""
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"{section}.port",
                          f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def _start_admin_listener(runner: web.AppRunner, config: Config, reuse_port: bool) -> None:
    """Bind ``admin.listen`` (when set) on the same app; its ports go to the app's
    :class:`~proxy.http.admin_gate.AdminGate`, which serves only the admin there."""
    listen = config.admin.listen
    if listen is None:
        return
    before = len(runner.addresses)
    await _start_site(runner, "admin.listen", listen.host, listen.port, web.TCPSite(
        runner, listen.host, listen.port, reuse_port=True if reuse_port else None))
    gate = runner.app[SERVICES].admin_gate
    addresses = runner.addresses[before:]
    gate.ports.update(address[1] for address in addresses)
    host, port = addresses[0][:2]
    gate.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(config: Config, *, reuse_port: bool = False, stop: asyncio.Event | None = None,
                started: Callable[[], None] | None = None) -> int:
    """Serve until SIGINT / SIGTERM (or ``stop`` is set), then drain and clean up; returns 0.
    ``started`` is called once the site accepts connections (a worker tells its supervisor)."""
    loop = asyncio.get_running_loop()
    allocator = tune_allocator()
    open_files = raise_open_files_limit()
    runner, base_url = await start_proxy(config, reuse_port=reuse_port)
    # What startup made (modules, the app, the config) lives as long as the process: frozen,
    # it is left out of every later garbage collection. Startup's garbage goes first.
    gc.collect()
    gc.freeze()
    upstream = urlsplit(config.upstream.require_base_url())
    _log.info(
        "proxy_started",
        host=config.listen.host,
        port=int(base_url.rsplit(":", 1)[1]),
        upstream_host=upstream.hostname,
        store_backend=config.store.backend,
        token_counter=config.compaction.token_counter,
        summary_enabled=config.summary.enabled,
        admin_enabled=config.admin_token() is not None,
        admin_port=min(runner.app[SERVICES].admin_gate.ports, default=None),
        log_format=config.logging.format,
        allocator=allocator,
        event_loop=type(loop).__module__.partition(".")[0],  # uvloop or asyncio
        open_files_limit=open_files,
    )
    if started is None:  # the process serves alone (a worker's supervisor prints it)
        print_banner(config, int(base_url.rsplit(":", 1)[1]), sys.stdout)
    cap = connection_cap(config.listen.max_connections)
    if cap < config.listen.max_connections:
        _log.warning("connection_cap_lowered", max_connections=cap,
                     configured=config.listen.max_connections, open_files_limit=open_files)
    stop = asyncio.Event() if stop is None else stop
    for signum in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    if started is not None:
        started()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        _log.info("proxy_stopped")
    return 0


def run_server(config: Config) -> int:
    """Run the proxy in this one process until SIGINT or SIGTERM; returns the exit code (0)
    (``ConfigError``: it could not start, nothing is served). ``--workers``: ``supervise``."""
    configure_logging(config.logging, secrets=config_secrets(config), final=True)
    return run_loop(serve(config), config.listen.event_loop)
