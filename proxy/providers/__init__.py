"""Upstream providers other than the first-party Messages API: Amazon Bedrock and Google
Vertex AI (``upstream.provider``). The body inside is the Messages API's, so the request path
is the same; here are the hooks it calls (routes, the request's provider, errors in the
provider's shape), the summary calls' transport and the event-stream frames.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.config import Config, ConfigError
from proxy.providers.base import TOO_LONG_STATUSES, Provider, decoded_json

__all__ = ["TOO_LONG_STATUSES", "Provider", "add_provider_routes", "make_provider",
           "provider_error_middleware", "provider_of"]

#: A provider route's name: ``<kind>:<provider>:<n>`` (its audit label is ``<kind>``).
_SEPARATOR: Final = ":"


def make_provider(config: Config) -> Provider:
    """The provider ``upstream.provider`` names, with its settings."""
    upstream = config.upstream
    if upstream.provider == "bedrock":
        try:
            from proxy.providers.bedrock import BedrockProvider
        except ImportError:
            raise ConfigError("upstream.provider", "bedrock needs botocore: pip install "
                              "'compact-proxy[bedrock]'") from None
        return BedrockProvider(upstream.aws_region, upstream.aws_profile)
    if upstream.provider == "vertex":
        from proxy.providers.vertex import VertexProvider

        if upstream.vertex_token_env is None:
            try:
                import google.auth.transport.requests  # noqa: F401 - checked at startup
            except ImportError:
                raise ConfigError("upstream.provider", "vertex with application-default "
                                  "credentials needs google-auth: pip install "
                                  "'compact-proxy[vertex]' (or set upstream.vertex_token_env)"
                                  ) from None

        return VertexProvider(upstream.vertex_token_env, upstream.vertex_project,
                              upstream.vertex_region)
    return Provider()


def add_provider_routes(app: web.Application, provider: Provider,
                        handlers: dict[str, Handler]) -> None:
    """The provider's own client paths, each to the handler of its kind."""
    for index, (method, path, kind) in enumerate(provider.routes()):
        app.router.add_route(method, path, handlers[kind],
                             name=f"{kind}{_SEPARATOR}{provider.name}{_SEPARATOR}r{index}")


def provider_of(request: web.Request, provider: Provider) -> Provider | None:
    """``provider`` (the app's) when the request came on its own path; ``None`` for
    first-party paths."""
    name = request.match_info.route.name  # only a provider's own routes have the separator
    return provider if name is not None and _SEPARATOR in name else None


def provider_error_middleware(provider: Provider) -> Middleware:
    """The proxy's own error answers (never a relayed one: those are streamed) on a
    provider's path, in that provider's shape."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if response.status < 400 or provider_of(request, provider) is None:
            return response
        return _shaped(provider, response)

    return middleware


def _shaped(provider: Provider, response: web.StreamResponse) -> web.StreamResponse:
    if not isinstance(response, web.Response) or response.prepared:
        return response
    body = decoded_json(response.body) if isinstance(response.body, bytes) else None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return response
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-type", "content-length")}
    shaped = provider.error_response(response.status, str(error.get("type", "api_error")),
                                     str(error.get("message", "")), headers)
    return shaped if shaped is not None else response

