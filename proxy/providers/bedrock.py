"""Amazon Bedrock behind the proxy (``upstream.provider: bedrock``; docs/bedrock.md).

Clients send ``POST /model/{modelId}/invoke[-with-response-stream]`` with an Anthropic body less
``model`` and ``stream``. The path is kept byte for byte (built encoded, never re-encoded) and
what is sent is signed with SigV4 over the exact bytes (botocore's credential chain), unless
the client brings its own Bedrock API key. The proxy's own errors take Bedrock's shape.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import web
from botocore.credentials import RefreshableCredentials
from botocore.session import Session
from multidict import CIMultiDict
from yarl import URL

from proxy.providers.base import Provider, Route, decoded_json
from proxy.providers.eventstream import exception_frame
from proxy.providers.sigv4 import SigV4

__all__ = ["FIRST_PARTY_ONLY_BETAS", "VERSION", "BedrockProvider"]

VERSION: Final = "bedrock-2023-05-31"
#: First-party betas Bedrock refuses (``invalid beta flag``): never moved into a body sent.
FIRST_PARTY_ONLY_BETAS: Final = frozenset({
    "oauth-2025-04-20", "claude-code-20250219", "files-api-2025-04-14",
    "mcp-client-2025-04-04", "mcp-client-2025-11-20", "skills-2025-10-02",
    "code-execution-2025-05-22", "code-execution-2025-08-25", "prompt-caching-2024-07-31",
})
#: The client's own signature headers (made for the proxy's host): never forwarded.
_CLIENT_SIGNATURE: Final = ("authorization", "x-amz-date", "x-amz-security-token",
                            "x-amz-content-sha256")
_ERROR_TYPES: Final[Mapping[str, str]] = {
    "invalid_request_error": "ValidationException",
    "authentication_error": "UnrecognizedClientException",
    "permission_error": "AccessDeniedException",
    "not_found_error": "ResourceNotFoundException",
    "request_too_large": "ValidationException",
    "rate_limit_error": "ThrottlingException",
    "overloaded_error": "ServiceUnavailableException",
    "timeout_error": "ModelTimeoutException",
}
#: Bedrock's too-long wordings (its own; the Messages API's passed through).
_TOO_LONG: Final = ("input is too long", "prompt is too long")


class BedrockProvider(Provider):
    """Bedrock's paths, SigV4 signing, refusal, error shape and summary-call format."""

    name = "bedrock"
    signs_calls = True

    def __init__(self, region: str | None, profile: str | None) -> None:
        self._session = Session(profile=profile)
        self.region = (region or os.environ.get("AWS_REGION")
                       or os.environ.get("AWS_DEFAULT_REGION")
                       or self._session.get_config_variable("region") or "us-east-1")
        self._credentials: Any = None
        self._signer = SigV4(self.region)

    def routes(self) -> tuple[Route, ...]:
        return (("POST", "/model/{model_id}/invoke", "messages"),
                ("POST", "/model/{model_id}/invoke-with-response-stream", "messages"),
                ("POST", "/model/{model_id}/count-tokens", "passthrough"),
                ("GET", "/inference-profiles", "passthrough"),
                ("GET", "/inference-profiles/{profile_id}", "passthrough"))

    def model_of(self, request: web.Request) -> str | None:
        parts = request.raw_path.partition("?")[0].split("/")
        return unquote(parts[2]) if len(parts) > 3 and parts[1] == "model" else None

    async def authorise(self, method: str, url: URL, headers: CIMultiDict[str],
                        body: bytes) -> CIMultiDict[str]:
        out = CIMultiDict(headers)
        authorization = headers.get("Authorization", "")
        if authorization[:7].lower() == "bearer ":
            return out  # the client's Bedrock API key
        for name in _CLIENT_SIGNATURE:
            out.popall(name, None)
        credentials = self._credentials
        if credentials is None:  # the chain may read files or a metadata service
            credentials = self._credentials = await asyncio.to_thread(
                self._session.get_credentials)
        if credentials is None:
            raise LookupError("no AWS credentials (environment, profile or instance role)")
        if isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed():
            frozen = await asyncio.to_thread(credentials.get_frozen_credentials)
        else:
            frozen = credentials.get_frozen_credentials()
        out.update(self._signer.headers(method, url, body, frozen))
        return out

    def too_long(self, status: int, plain: bytes) -> bool:
        body = decoded_json(plain)
        message = body.get("message") if isinstance(body, dict) else None
        return (status == 400 and isinstance(message, str)
                and any(wording in message.lower() for wording in _TOO_LONG))

    def error_response(self, status: int, error_type: str, message: str,
                       headers: Mapping[str, str]) -> web.Response:
        aws_type = _ERROR_TYPES.get(error_type, "InternalServerException")
        return web.json_response({"message": message}, status=status, headers={
            **headers, "x-amzn-ErrorType": aws_type})

    def fork_parts(self, request: web.Request, body: Mapping[str, Any], model: str | None,
                   headers: CIMultiDict[str]) -> dict[str, Any]:
        betas = body.get("anthropic_beta")
        if isinstance(betas, list) and betas:
            headers.popall("anthropic-beta", None)
            headers["anthropic-beta"] = ",".join(str(beta) for beta in betas)
        return {**{k: v for k, v in body.items()
                   if k not in ("anthropic_version", "anthropic_beta")}, "model": model}

    def summary_request(self, path: str, headers: CIMultiDict[str],
                        body: bytes) -> tuple[str, bytes]:
        call = json.loads(body)
        model = call.pop("model")
        stream = call.pop("stream", False)
        call["anthropic_version"] = VERSION
        betas = [beta.strip() for value in headers.popall("anthropic-beta", ())
                 for beta in value.split(",") if beta.strip()]
        kept = [beta for beta in betas if beta not in FIRST_PARTY_ONLY_BETAS]
        if kept:
            call["anthropic_beta"] = kept
        # A model id is sent as Claude Code sends it: ':' as is, an ARN's '/' as %2F.
        quoted = str(model).replace("%", "%25").replace("/", "%2F")
        action = "invoke-with-response-stream" if stream else "invoke"
        return f"/model/{quoted}/{action}", json.dumps(call).encode()

    def incomplete_tail(self, message: str) -> bytes | None:
        return exception_frame("internalServerException", message)
