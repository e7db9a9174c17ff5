"""Google Vertex AI behind the proxy (``upstream.provider: vertex``; docs/vertex.md).

Clients send ``POST …/publishers/anthropic/models/{m}:streamRawPredict`` (or ``:rawPredict``),
an Anthropic body less ``model``; answers are SSE as first-party. The proxy sends the client's
own ``Authorization``, else its own token (``upstream.vertex_token_env`` or application-default
credentials); ``Prompt is too long`` (413, no numbers) is recovered by recompaction.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Final

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.providers.base import Provider, Route, decoded_json

__all__ = ["VERSION", "VertexProvider"]

VERSION: Final = "vertex-2023-10-16"
_SCOPES: Final = ("https://www.googleapis.com/auth/cloud-platform",)
#: Carries the client's ``…/publishers/anthropic/models/`` path from its request to the
#: summary call forked from it (taken off before the call is sent).
MODELS_PATH_HEADER: Final = "x-compact-vertex-models-path"
_MODELS: Final = "/projects/{project}/locations/{location}/publishers/anthropic/models/"


class VertexProvider(Provider):
    """Vertex's paths, bearer token, refusal and summary-call format."""

    name = "vertex"
    signs_calls = True

    def __init__(self, token_env: str | None, project: str | None = None,
                 region: str | None = None) -> None:
        self._token_env = token_env
        self._credentials: Any = None
        # Where a summary call not forked from a request goes (summary.mode separate).
        self._models_path = (_MODELS.format(project=project, location=region)
                             if project and region else None)

    def routes(self) -> tuple[Route, ...]:
        routes: list[Route] = []
        for prefix in ("", "/v1"):
            base = prefix + _MODELS
            routes += [("POST", base + "count-tokens:rawPredict", "passthrough"),
                       ("POST", base + "{model}:rawPredict", "messages"),
                       ("POST", base + "{model}:streamRawPredict", "messages")]
        return tuple(routes)

    def model_of(self, request: web.Request) -> str | None:
        return request.match_info.get("model")

    async def authorise(self, method: str, url: URL, headers: CIMultiDict[str],
                        body: bytes) -> CIMultiDict[str]:
        if headers.get("Authorization"):
            return headers  # the client's own token
        out = CIMultiDict(headers)
        out.popall("x-api-key", None)
        out["Authorization"] = f"Bearer {await self._token()}"
        return out

    async def _token(self) -> str:
        if self._token_env is not None:
            token = os.environ.get(self._token_env, "").strip()
            if not token:
                raise LookupError(f"no Vertex access token in ${self._token_env}")
            return token
        if self._credentials is None:
            import google.auth  # only with application-default credentials

            self._credentials, _ = await asyncio.to_thread(google.auth.default, scopes=_SCOPES)
        if not self._credentials.valid:
            from google.auth.transport.requests import Request

            await asyncio.to_thread(self._credentials.refresh, Request())
        return str(self._credentials.token)

    def too_long(self, status: int, plain: bytes) -> bool:
        if status != 413:
            return False
        body = decoded_json(plain)
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return isinstance(message, str) and "prompt is too long" in message.lower()

    def fork_parts(self, request: web.Request, body: Any, model: str | None,
                   headers: CIMultiDict[str]) -> dict[str, Any]:
        # The summary call goes to the project and location the client's request named.
        prefix = request.raw_path.partition("?")[0].rsplit("/", 1)[0] + "/"
        headers[MODELS_PATH_HEADER] = prefix  # (replaces any the client sent)
        return {**{k: v for k, v in body.items() if k != "anthropic_version"}, "model": model}

    def summary_request(self, path: str, headers: CIMultiDict[str],
                        body: bytes) -> tuple[str, bytes]:
        forked = headers.popall(MODELS_PATH_HEADER, None)
        prefix = forked[0] if forked else self._models_path
        if prefix is None:
            raise LookupError("a Vertex summary call needs a project and location "
                              "(upstream.vertex_project, vertex_region)")
        call = json.loads(body)
        model = call.pop("model")
        call["anthropic_version"] = VERSION
        action = "streamRawPredict" if call.get("stream") else "rawPredict"
        return f"{prefix}{model}:{action}", json.dumps(call).encode()
