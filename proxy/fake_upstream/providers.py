"""The fake provider as Amazon Bedrock and as Google Vertex AI (``FakeUpstream.provider``).

Both serve the Messages API behind their own wire, and every Messages rule applies to the
Anthropic body inside (:func:`.server.answer_messages`). What each adds:

Bedrock (``POST /model/{modelId}/invoke``, ``/invoke-with-response-stream``, ``/count-tokens``;
``GET /inference-profiles[/{id}]``):

* SigV4 (signing name ``bedrock``) recomputed with botocore over the bytes, path and signed
  headers as received, for a key pair in ``aws_keys`` (``x-amz-date`` within 15 minutes);
  or a Bedrock API key as ``Authorization: Bearer`` (``bedrock_api_keys``).
* The model id from the raw path, percent-decoded once (``:`` as sent or ``%3A``; an ARN's
  ``/`` as ``%2F``): a twice-encoded id is not a model identifier.
* The body: no ``model``, no ``stream``, ``anthropic_version: "bedrock-2023-05-31"``, an
  ``anthropic_beta`` list without a beta Bedrock refuses (``invalid beta flag``).
* The stream as event-stream ``chunk`` frames (:mod:`proxy.providers.eventstream`); errors as
  ``x-amzn-ErrorType`` + ``{"message": ...}``; too long as ``400 ValidationException "Input is
  too long for requested model."`` (no numbers).

Vertex (``POST [/v1]/projects/{p}/locations/{l}/publishers/anthropic/models/{m}:rawPredict``,
``:streamRawPredict``, ``count-tokens:rawPredict``): a bearer token in ``vertex_tokens``; the
body without ``model`` (count-tokens keeps it), ``anthropic_version: "vertex-2023-10-16"``,
``stream`` true exactly on ``:streamRawPredict``; SSE as first-party; too long as ``413 "Prompt
is too long"``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, unquote

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy.providers.eventstream import CONTENT_TYPE, chunk_frame, exception_frame

from .credentials import TEST_AWS_ACCESS_KEY, TEST_AWS_SECRET_KEY, TEST_VERTEX_TOKEN
from .replies import Reply, stream_events
from .rules import ProviderRuleError, check_count_tokens_request
from .server import PROVIDER_ROUTE, RAW_KEY, UPSTREAM_KEY, Dialect, answer_messages, request_json

if TYPE_CHECKING:
    from .server import FakeUpstream

__all__ = [
    "BEDROCK_REJECTED_BETAS",
    "BEDROCK_VERSION",
    "TEST_AWS_ACCESS_KEY",
    "TEST_AWS_SECRET_KEY",
    "TEST_VERTEX_TOKEN",
    "VERTEX_VERSION",
    "add_provider_routes",
]

BEDROCK_VERSION: Final = "bedrock-2023-05-31"
VERTEX_VERSION: Final = "vertex-2023-10-16"
#: First-party betas Bedrock answers ``invalid beta flag`` to.
BEDROCK_REJECTED_BETAS: Final = frozenset({
    "oauth-2025-04-20", "claude-code-20250219", "files-api-2025-04-14",
    "mcp-client-2025-04-04", "mcp-client-2025-11-20", "skills-2025-10-02",
    "code-execution-2025-05-22", "code-execution-2025-08-25", "prompt-caching-2024-07-31",
})
JWT_GRANT: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MSG_BEDROCK_TOO_LONG: Final = "Input is too long for requested model."
MSG_VERTEX_TOO_LONG: Final = "Prompt is too long"
MSG_BAD_SIGNATURE: Final = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details.")
_SIGNATURE_WINDOW: Final = timedelta(minutes=15)
_AUTH_HEADER: Final = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request, "
    r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$")
_MODEL_ID: Final = re.compile(
    r"^(?:[a-z]{2,4}\.)?anthropic\.claude-[a-z0-9.-]+(?::\d+)?$"
    r"|^arn:aws[a-z-]*:bedrock:[a-z0-9-]+:\d{12}:"
    r"(?:inference-profile|application-inference-profile|foundation-model)/[A-Za-z0-9.:-]+$")
_BEDROCK_PATH: Final = re.compile(r"^/model/([^/]+)/(invoke|invoke-with-response-stream|"
                                  r"count-tokens)$")
_AWS_ERROR_TYPES: Final = {400: "ValidationException", 401: "UnrecognizedClientException",
                           403: "AccessDeniedException", 404: "ResourceNotFoundException",
                           413: "ValidationException", 429: "ThrottlingException",
                           503: "ServiceUnavailableException", 529: "ServiceUnavailableException"}


class _AwsError(ProviderRuleError):
    """A Bedrock refusal with its own AWS error type."""

    def __init__(self, message: str, status: int, aws_type: str) -> None:
        super().__init__(message, status)
        self.aws_type = aws_type


def add_provider_routes(app: web.Application, upstream: FakeUpstream) -> None:
    """The routes of ``upstream.provider`` (``bedrock`` or ``vertex``)."""
    if upstream.provider == "bedrock":
        upstream.provider_errors = _bedrock_error
        for action in ("invoke", "invoke-with-response-stream", "count-tokens"):
            app.router.add_post(f"/model/{{model_id}}/{action}", _handle_bedrock,
                                name=f"{PROVIDER_ROUTE}bedrock:{action.replace('-', '_')}")
        app.router.add_get("/inference-profiles", _handle_profiles,
                           name=f"{PROVIDER_ROUTE}bedrock:profiles")
        app.router.add_get("/inference-profiles/{profile}", _handle_profiles,
                           name=f"{PROVIDER_ROUTE}bedrock:profile")
    elif upstream.provider == "vertex":
        upstream.provider_errors = _vertex_error
        app.router.add_post("/token", _handle_google_token,
                            name=f"{PROVIDER_ROUTE}vertex_token")
        for prefix in ("", "/v1"):
            app.router.add_post(
                prefix + "/projects/{project}/locations/{location}/publishers/anthropic/"
                "models/{action}", _handle_vertex,
                name=f"{PROVIDER_ROUTE}vertex{prefix.replace('/', '_')}")
    else:
        raise ValueError(f"unknown provider {upstream.provider!r} (bedrock or vertex)")


# -- Bedrock --------------------------------------------------------------------------------


def _bedrock_error(exc: ProviderRuleError, request_id: str) -> web.Response:
    aws_type = getattr(exc, "aws_type", None) or _AWS_ERROR_TYPES.get(
        exc.status, "InternalServerException")
    return web.json_response({"message": exc.message}, status=exc.status, headers={
        "x-amzn-ErrorType": f"{aws_type}:http://internal.amazon.com/coral/com.amazon.bedrock/",
        "x-amzn-RequestId": request_id})


def verify_sigv4(request: web.Request, upstream: FakeUpstream, raw: bytes) -> str:
    """The access key (or API key) a Bedrock request was signed with, once its signature
    is recomputed over what was received.

    Raises:
        _AwsError: no credential, an unknown key, a stale date or a wrong signature.
    """
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer":
        if token.strip() not in upstream.bedrock_api_keys:
            raise _AwsError("Invalid API Key format: Must start with pre-defined prefix",
                            403, "AccessDeniedException")
        return token.strip()
    found = _AUTH_HEADER.match(authorization)
    if found is None:
        raise _AwsError("Missing Authentication Token", 403, "MissingAuthenticationTokenException")
    access_key, day, region, service, signed, signature = found.groups()
    secret = upstream.aws_keys.get(access_key)
    if secret is None:
        raise _AwsError("The security token included in the request is invalid.", 403,
                        "UnrecognizedClientException")
    if service != "bedrock":
        raise _AwsError("Credential should be scoped to correct service: 'bedrock'. ", 403,
                        "InvalidSignatureException")
    names = signed.split(";")
    if "host" not in names or "x-amz-date" not in names:
        raise _AwsError("'Host' and 'X-Amz-Date' must be signed.", 403,
                        "InvalidSignatureException")
    amz_date = request.headers.get("X-Amz-Date", "")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise _AwsError("X-Amz-Date is not a valid date", 403,
                        "InvalidSignatureException") from None
    if abs(datetime.now(UTC) - when) > _SIGNATURE_WINDOW or amz_date[:8] != day:
        raise _AwsError("Signature expired", 403, "InvalidSignatureException")
    headers = {name: ", ".join(request.headers.getall(name, ())) for name in names}
    url = f"http://{request.headers.get('Host', '')}{request.raw_path}"
    aws = AWSRequest(method=request.method, url=url, data=raw, headers=headers)
    aws.context["timestamp"] = amz_date
    auth = SigV4Auth(Credentials(access_key, secret), "bedrock", region)
    expected = auth.signature(auth.string_to_sign(aws, auth.canonical_request(aws)), aws)
    if expected != signature:
        raise _AwsError(MSG_BAD_SIGNATURE, 403, "InvalidSignatureException")
    return access_key


def _bedrock_model(request: web.Request) -> tuple[str, str]:
    """The model id (decoded once from the raw path) and the action."""
    path = request.raw_path.partition("?")[0]
    found = _BEDROCK_PATH.match(path)
    model = unquote(found.group(1)) if found else ""
    if found is None or not _MODEL_ID.match(model):
        raise _AwsError("The provided model identifier is invalid.", 400, "ValidationException")
    return model, found.group(2)


def _malformed(detail: str) -> _AwsError:
    return _AwsError(f"Malformed input request: {detail}, please reformat your input and try "
                     "again.", 400, "ValidationException")


def check_bedrock_body(body: object) -> dict[str, Any]:
    """A Bedrock Messages body as the Anthropic body inside it (no version, no betas).

    Raises:
        _AwsError: a Bedrock shape rule is broken.
    """
    if not isinstance(body, dict):
        raise _malformed("#: expected type: JSONObject")
    for extra in ("model", "stream"):
        if extra in body:
            raise _malformed(f"#: extraneous key [{extra}] is not permitted")
    if body.get("anthropic_version") != BEDROCK_VERSION:
        raise _malformed("#/anthropic_version: expected " + BEDROCK_VERSION)
    betas = body.get("anthropic_beta", [])
    if not isinstance(betas, list) or not all(isinstance(beta, str) for beta in betas):
        raise _malformed("#/anthropic_beta: expected type: JSONArray of strings")
    if any(beta in BEDROCK_REJECTED_BETAS for beta in betas):
        raise _AwsError("invalid beta flag", 400, "ValidationException")
    return {k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")}


async def _handle_bedrock(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM_KEY]
    raw = request[RAW_KEY]
    verify_sigv4(request, upstream, raw)
    model, action = _bedrock_model(request)
    try:
        body = request_json(request)
    except ProviderRuleError as exc:
        raise _malformed(f"#: {exc.message}") from None
    if action == "count-tokens":
        upstream.counts["count_tokens"] += 1
        inner = _count_tokens_body(body)
        check_count_tokens_request({**inner, "model": model})
        return web.json_response(
            {"inputTokens": upstream.token_rule.measure({**inner, "model": model}).total})
    upstream.counts["messages"] += 1
    anthropic = {**check_bedrock_body(body), "model": model}
    if action == "invoke-with-response-stream":
        anthropic["stream"] = True
    return await answer_messages(request, anthropic, Dialect(
        too_long=lambda total, window: _AwsError(MSG_BEDROCK_TOO_LONG, 400,
                                                 "ValidationException"),
        stream=_event_stream, error=_bedrock_scripted_error))


def _count_tokens_body(body: object) -> dict[str, Any]:
    """CountTokens' ``{"input": {"invokeModel": {"body": base64(InvokeModel body)}}}``."""
    try:
        blob = body["input"]["invokeModel"]["body"]  # type: ignore[index]
        inner = json.loads(base64.b64decode(blob, validate=True))
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise _malformed("#/input/invokeModel/body: expected a base64 InvokeModel body") from None
    return check_bedrock_body(inner)


def _bedrock_scripted_error(error: Any, status: int, headers: Any) -> web.Response:
    message = error.get("error", {}).get("message", "") if isinstance(error, dict) else ""
    return _bedrock_error(ProviderRuleError(str(message), status), "")


async def _event_stream(request: web.Request, upstream: FakeUpstream, reply: Reply,
                        message: dict[str, Any]) -> web.StreamResponse:
    """The answer as event-stream ``chunk`` frames (a scripted ``error_event`` as an
    ``internalServerException`` frame; a cut drops the connection)."""
    response = web.StreamResponse(status=200, headers={
        **reply.headers, "content-type": CONTENT_TYPE,
        "x-amzn-bedrock-content-type": "application/json"})
    fault = reply.fault
    stop_at = fault.after_events if fault is not None and fault.kind in (
        "cut_after_events", "error_event", "cut_mid_event") else None
    try:
        await response.prepare(request)
        for index, (_name, data) in enumerate(stream_events(message)):
            if index == stop_at:
                break
            if index and reply.event_delay_s:
                await asyncio.sleep(reply.event_delay_s)
            await response.write(chunk_frame(data))
            upstream.events_sent += 1
        if fault is not None and fault.kind == "error_event":
            await response.write(exception_frame("internalServerException",
                                                 "The system encountered an internal error."))
    except (asyncio.CancelledError, ConnectionResetError):
        upstream.cancelled += 1
        raise
    if fault is not None and fault.kind in ("cut_after_events", "cut_mid_event"):
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response


async def _handle_profiles(request: web.Request) -> web.StreamResponse:
    verify_sigv4(request, request.app[UPSTREAM_KEY], request[RAW_KEY])
    profiles = [{
        "inferenceProfileName": f"US {model['display_name']}",
        "inferenceProfileId": f"us.anthropic.{model['id']}-v1:0",
        "inferenceProfileArn": "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
                               f"us.anthropic.{model['id']}-v1:0",
        "models": [{"modelArn": "arn:aws:bedrock:us-east-1::foundation-model/"
                                f"anthropic.{model['id']}-v1:0"}],
        "status": "ACTIVE", "type": "SYSTEM_DEFINED",
    } for model in request.app[UPSTREAM_KEY].models]
    wanted = request.match_info.get("profile")
    if wanted is None:
        return web.json_response({"inferenceProfileSummaries": profiles})
    for profile in profiles:
        if wanted in (profile["inferenceProfileId"], profile["inferenceProfileArn"]):
            return web.json_response(profile)
    raise _AwsError("The specified inference profile does not exist.", 404,
                    "ResourceNotFoundException")


# -- Vertex ---------------------------------------------------------------------------------


def _vertex_error(exc: ProviderRuleError, request_id: str) -> web.Response:
    if exc.status == 401:
        return web.json_response({"error": {
            "code": 401, "status": "UNAUTHENTICATED", "message": exc.message}}, status=401)
    return web.json_response(exc.error_body(request_id), status=exc.status)


async def _handle_google_token(request: web.Request) -> web.StreamResponse:
    """Google's OAuth token endpoint as a service account's ``token_uri`` names it: a JWT
    grant gets the test access token (``counts["token"]``)."""
    upstream = request.app[UPSTREAM_KEY]
    upstream.counts["token"] += 1
    form = parse_qs(request[RAW_KEY].decode("ascii", "replace"))
    if form.get("grant_type") != [JWT_GRANT] or not form.get("assertion"):
        return web.json_response({"error": "invalid_grant"}, status=400)
    return web.json_response({"access_token": TEST_VERTEX_TOKEN, "expires_in": 3600,
                              "token_type": "Bearer"})


async def _handle_vertex(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM_KEY]
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or token.strip() not in upstream.vertex_tokens:
        raise ProviderRuleError(
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
            401, "authentication_error")
    model, _, method = request.match_info["action"].partition(":")
    body = request_json(request)
    if body.get("anthropic_version") != VERTEX_VERSION:
        raise ProviderRuleError(f"anthropic_version: Input should be '{VERTEX_VERSION}'")
    inner = {k: v for k, v in body.items() if k != "anthropic_version"}
    if model == "count-tokens" and method == "rawPredict":
        upstream.counts["count_tokens"] += 1
        check_count_tokens_request(inner)
        return web.json_response({"input_tokens": upstream.token_rule.measure(inner).total})
    if method not in ("rawPredict", "streamRawPredict"):
        raise ProviderRuleError(f"Not found: {request.path}", 404, "not_found_error")
    if "model" in inner:
        raise ProviderRuleError("model: Extra inputs are not permitted")
    if (inner.get("stream") is True) != (method == "streamRawPredict"):
        raise ProviderRuleError("stream: streamRawPredict needs stream: true, rawPredict no "
                                "stream")
    upstream.counts["messages"] += 1
    return await answer_messages(request, {**inner, "model": model}, Dialect(
        too_long=lambda total, window: ProviderRuleError(MSG_VERTEX_TOO_LONG, 413)))
