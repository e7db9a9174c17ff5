"""The fake provider's model list (``GET /v1/models``, ``GET /v1/models/{id}``), paged as
the provider pages it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web

from .rules import ProviderRuleError

__all__ = ["DEFAULT_MODELS", "handle_model", "handle_models"]

#: The models the fake provider lists (its ``GET /v1/models``), newest first.
DEFAULT_MODELS: Final[tuple[Mapping[str, Any], ...]] = (
    {"type": "model", "id": "claude-opus-4-5", "display_name": "Claude Opus 4.5",
     "created_at": "2025-11-24T00:00:00Z", "max_input_tokens": 200_000, "max_tokens": 64_000},
    {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
     "created_at": "2025-09-29T00:00:00Z", "max_input_tokens": 200_000, "max_tokens": 64_000},
    {"type": "model", "id": "claude-haiku-4-5", "display_name": "Claude Haiku 4.5",
     "created_at": "2025-10-15T00:00:00Z", "max_input_tokens": 200_000, "max_tokens": 64_000},
)

# Status of an aiohttp HTTPException -> the Anthropic error type it is reported as.


def _int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ProviderRuleError(f"{name}: Input should be a valid integer") from None
    if not low <= value <= high:
        raise ProviderRuleError(f"{name}: Input should be between {low} and {high}")
    return value


async def handle_models(request: web.Request) -> web.StreamResponse:
    from .server import UPSTREAM_KEY  # (the server imports this module)

    upstream = request.app[UPSTREAM_KEY]
    upstream.counts["models"] += 1
    limit = _int_query(request, "limit", 20, 1, 1000)
    ids = [str(model["id"]) for model in upstream.models]
    models = list(upstream.models)
    after_id = request.query.get("after_id")
    before_id = request.query.get("before_id")
    if after_id is not None:
        start = ids.index(after_id) + 1 if after_id in ids else len(ids)
        page = models[start:start + limit]
        has_more = start + limit < len(models)
    elif before_id is not None:
        end = ids.index(before_id) if before_id in ids else 0
        page = models[max(0, end - limit):end]
        has_more = end - limit > 0
    else:
        page = models[:limit]
        has_more = limit < len(models)
    return web.json_response({
        "data": [dict(model) for model in page],
        "has_more": has_more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    })


async def handle_model(request: web.Request) -> web.StreamResponse:
    from .server import UPSTREAM_KEY  # (the server imports this module)

    upstream = request.app[UPSTREAM_KEY]
    upstream.counts["models"] += 1
    model_id = request.match_info["model_id"]
    for model in upstream.models:
        if model["id"] == model_id:
            return web.json_response(dict(model))
    raise ProviderRuleError(f"model: {model_id}", 404, "not_found_error")
