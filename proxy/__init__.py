"""compact-proxy's aiohttp service: an Anthropic Messages API reverse proxy that compacts long
agent histories (through :mod:`compactor`) and injects each session's durable context.

Entry points: :func:`proxy.server.app.create_app` (the application factory),
:func:`proxy.server.app.run_server`
(``compact-proxy serve``) and :func:`proxy.server.app.start_proxy` (serve on a TCP site, for tests
and the demo). The request path reads top to bottom in :mod:`proxy.http.handlers`.
"""
