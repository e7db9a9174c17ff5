"""The fake upstream as an aiohttp service: a strict, offline, deterministic stand-in for the
Anthropic Messages API.

Routes: ``POST /v1/messages`` (JSON, or SSE with ``"stream": true``; any query string), ``POST
/v1/messages/count_tokens``, ``GET /v1/models`` and ``GET /v1/models/{id}``; anything else is
``404 not_found_error``. Every request needs ``x-api-key`` or ``Authorization: Bearer`` (any
value, unless :attr:`FakeUpstream.accepted_keys` names the known ones); a Claude Code
subscription login (``Bearer sk-ant-oat…``) on the message and count routes also needs the OAuth
beta and Claude Code's system identity (:mod:`.rules`, reference §2.3). Every response carries
``request-id`` and the ``anthropic-ratelimit-requests-*`` headers; every error has the Anthropic
shape with a top-level ``request_id``, except the 413 of a body over 32 MiB, which is the edge's
own ``{"error": {"type": "request_too_large", …}}``.

The body is read as the raw wire bytes: the app must be served with aiohttp's request
decompression off (``auto_decompress=False``, as :func:`start_fake_upstream` does) so that
:mod:`.wire` can undo ``Content-Encoding`` itself and refuse a body that disagrees with it, and
parse strict JSON (no ``NaN``, no lone surrogates, UTF-8 only).

State lives on a :class:`FakeUpstream` instance reached through a typed ``web.AppKey``; there are
no module globals, so several fake upstreams can run side by side in one test.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import structlog
from aiohttp import web

from proxy.server.allocator import tune_allocator

from .credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_AWS_SECRET_KEY,
    TEST_BEDROCK_API_KEY,
    TEST_VERTEX_TOKEN,
)
from .models import DEFAULT_MODELS, handle_model, handle_models
from .records import RecordedRequest, api_key_of, copy_headers
from .replies import (
    MALFORMED_SSE_EVENT,
    PromptCache,
    Reply,
    TokenRule,
    build_message,
)
from .rules import (
    ProviderRuleError,
    cache_control_count,
    check_claude_code_identity,
    check_count_tokens_request,
    check_messages_request,
    check_oauth_beta,
)
from .scripts import Script, default_script, is_summarizer_request
from .streaming import cut_json, drop_connection, pause, stream
from .timing import SummaryTiming
from .wire import MAX_BODY_BYTES, MSG_TOO_LARGE, decode_content, parse_json_strict

__all__ = ["DEFAULT_MODELS", "FakeUpstream", "SummaryTiming", "run_fake_upstream",
           "start_fake_upstream"]

_log = structlog.get_logger("proxy.fake_upstream")

DEFAULT_CONTEXT_WINDOW: Final = 200_000
RATE_LIMIT_REQUESTS: Final = 4_000
# How often a pause re-checks whether the client is still connected.
SHUTDOWN_TIMEOUT_S: Final = 2.0

_HTTP_ERROR_TYPES: Final[Mapping[int, str]] = {
    404: "not_found_error",
    405: "not_found_error",
}


class FakeUpstream:
    """The fake provider's state: its script, queued replies and what it has seen.

    Attributes:
        script: ``(body, request_meta) -> Reply`` (or an awaitable of one), used when the queue
            is empty. Defaults to :func:`~proxy.fake_upstream.scripts.default_script`.
        queue: one-shot replies served, in order, before the script is asked.
        requests: every request received, in arrival order (also unauthorized and invalid ones).
        counts: requests per route (``messages``, ``count_tokens``, ``models``, ``not_found``).
        cancelled: streams (or hung replies) whose client disconnected before the end.
        events_sent: SSE events written so far, over all streams.
        context_window: above this many input tokens (as ``token_rule`` counts them) a message
            request is refused with ``prompt is too long``.
        token_rule: the provider's own input-token count (``token_ratio``, ``token_noise``;
            the defaults keep characters / 4), used for usage, count_tokens and the window.
        prompt_cache: the simulated prompt cache behind the ``cache_*`` usage counts.
        accepted_keys: the credentials the provider knows (``x-api-key`` or the bearer
            token); any other is refused with 401 ``invalid x-api-key`` on every route.
            ``None`` (the default): any non-empty credential is accepted.
        on_record: called with each request once recorded (``--dump`` writes it to disk).
        summary_timing: how long a summary call (fork or separate) takes to be answered, as
            a model writing it would (:class:`SummaryTiming`; the default answers at once).
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        models: Sequence[Mapping[str, Any]] = DEFAULT_MODELS,
        token_ratio: float = 1.0,
        token_noise: float = 0.0,
        provider: str = "anthropic",
    ) -> None:
        if context_window < 1:
            raise ValueError(f"context_window must be >= 1, got {context_window}")
        self.token_rule = TokenRule(token_ratio, token_noise)
        self.script: Script = script if script is not None else default_script
        self.queue: deque[Reply] = deque()
        self.requests: list[RecordedRequest] = []
        self.counts: Counter[str] = Counter()
        self.cancelled = 0
        self.events_sent = 0
        self.context_window = context_window
        self.models: tuple[Mapping[str, Any], ...] = tuple(models)
        self.prompt_cache = PromptCache()
        self.accepted_keys: frozenset[str] | None = None
        # ``bedrock`` or ``vertex``: that provider's routes too, and the credentials they
        # know (:mod:`.providers`: a test key pair, a Bedrock API key, a Vertex token).
        self.provider: str = provider
        self.aws_keys: dict[str, str] = {TEST_AWS_ACCESS_KEY: TEST_AWS_SECRET_KEY}
        self.bedrock_api_keys: set[str] = {TEST_BEDROCK_API_KEY}
        self.vertex_tokens: set[str] = {TEST_VERTEX_TOKEN}
        self.provider_errors: Callable[[ProviderRuleError, str], web.Response] | None = None
        self.on_record: Callable[[RecordedRequest], None] | None = None
        self.summary_timing = SummaryTiming()
        self._request_counter = 0
        self._message_counter = 0

    def push(self, *replies: Reply) -> None:
        """Queue replies to serve to the next ``/v1/messages`` requests, in order."""
        for reply in replies:
            if not isinstance(reply, Reply):
                raise TypeError(f"push() takes Reply objects, got {type(reply).__name__}")
            self.queue.append(reply)

    @property
    def message_requests(self) -> list[RecordedRequest]:
        """The recorded ``POST /v1/messages`` requests only."""
        return [r for r in self.requests if r.method == "POST" and r.path == "/v1/messages"]

    def next_request_id(self) -> str:
        """A fresh deterministic ``request-id`` (``req_fake_000001``, …)."""
        self._request_counter += 1
        return f"req_fake_{self._request_counter:06d}"

    def next_message_id(self) -> str:
        """A fresh deterministic message id (``msg_fake_000001``, …)."""
        self._message_counter += 1
        return f"msg_fake_{self._message_counter:06d}"

    def rate_limit_headers(self) -> dict[str, str]:
        """The ``anthropic-ratelimit-requests-*`` headers for the current request count."""
        reset = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=60)
        return {
            "anthropic-ratelimit-requests-limit": str(RATE_LIMIT_REQUESTS),
            "anthropic-ratelimit-requests-remaining": str(
                max(0, RATE_LIMIT_REQUESTS - self._request_counter)
            ),
            "anthropic-ratelimit-requests-reset": reset.isoformat().replace("+00:00", "Z"),
        }

    def make_app(self) -> web.Application:
        """A fresh aiohttp application serving this fake upstream.

        Serve it with ``auto_decompress=False`` (as :func:`start_fake_upstream` does): the app
        decodes ``Content-Encoding`` itself.
        """
        app = web.Application(middlewares=[_error_middleware], client_max_size=MAX_BODY_BYTES)
        app[UPSTREAM_KEY] = self
        app.on_response_prepare.append(_add_common_headers)
        app.router.add_post("/v1/messages", _handle_messages)
        app.router.add_post("/v1/messages/count_tokens", _handle_count_tokens)
        app.router.add_get("/v1/models", handle_models)
        app.router.add_get("/v1/models/{model_id}", handle_model)
        if self.provider != "anthropic":
            from .providers import add_provider_routes  # (it builds on this module)

            add_provider_routes(app, self)
        app.router.add_route("*", "/{tail:.*}", _handle_not_found)
        return app


@dataclass(frozen=True)
class _Body:
    """The request body as the handlers need it: decoded size and why it is refused, if so."""

    length: int
    error: ProviderRuleError | None


UPSTREAM_KEY: Final = web.AppKey("fake_upstream", FakeUpstream)
_REQUEST_ID_KEY: Final = web.RequestKey("fake_upstream_request_id", str)
_RECORD_KEY: Final = web.RequestKey("fake_upstream_record", RecordedRequest)
_BODY_KEY: Final = web.RequestKey("fake_upstream_body", _Body)
RAW_KEY: Final = web.RequestKey("fake_upstream_raw", bytes)
#: Route names of a provider's own routes start with this: they check their own auth, and
#: their errors have the provider's shape (``FakeUpstream.provider_errors``).
PROVIDER_ROUTE: Final = "provider:"


# -- request plumbing ---------------------------------------------------------------------------


def _decode_body(request: web.Request, raw: bytes) -> tuple[Any, _Body]:
    """The parsed body (``None`` when empty or refused) and what the handlers need to know."""
    try:
        data = decode_content(raw, request.headers.getall("Content-Encoding", ()))
    except ProviderRuleError as exc:
        return None, _Body(len(raw), exc)
    if not data:
        return None, _Body(0, None)
    try:
        return parse_json_strict(data), _Body(len(data), None)
    except ProviderRuleError as exc:
        return None, _Body(len(data), exc)


def _too_large_response() -> web.Response:
    # The edge answers this one, before the API: no top-level ``type`` and no ``request_id``.
    return web.json_response(
        {"error": {"type": "request_too_large", "message": MSG_TOO_LARGE}}, status=413)


def _error_response(
    request_id: str, status: int, error_type: str, message: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body = {"type": "error", "error": {"type": error_type, "message": message},
            "request_id": request_id}
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def _error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Record the request, check auth, and turn every failure into the Anthropic error shape."""
    upstream = request.app[UPSTREAM_KEY]
    request_id = upstream.next_request_id()
    request[_REQUEST_ID_KEY] = request_id
    api_key = api_key_of(request)
    raw = b""
    shaped: Callable[[ProviderRuleError, str], web.Response] | None = None
    try:
        try:
            raw = await request.read()
        finally:
            parsed, request[_BODY_KEY] = _decode_body(request, raw)
            record = RecordedRequest(
                method=request.method, path=request.path, query_string=request.query_string,
                headers=copy_headers(request), body=parsed, raw_length=len(raw),
                request_id=request_id, api_key=api_key,
            )
            request[_RECORD_KEY] = record
            request[RAW_KEY] = raw
            upstream.requests.append(record)
            if upstream.on_record is not None:
                upstream.on_record(record)
        name = request.match_info.route.name or ""
        if name.startswith(PROVIDER_ROUTE) and upstream.provider_errors is not None:
            shaped = upstream.provider_errors
            return await handler(request)
        if not api_key:
            raise ProviderRuleError("x-api-key header is required", 401, "authentication_error")
        if upstream.accepted_keys is not None and api_key not in upstream.accepted_keys:
            raise ProviderRuleError("invalid x-api-key", 401, "authentication_error")
        return await handler(request)
    except ProviderRuleError as exc:
        if shaped is not None:
            return shaped(exc, request_id)
        if exc.status == 413:
            return _too_large_response()
        return web.json_response(exc.error_body(request_id), status=exc.status)
    except web.HTTPException as exc:
        if exc.status == 413:
            return _too_large_response()
        error_type = _HTTP_ERROR_TYPES.get(exc.status, "invalid_request_error")
        status = 404 if error_type == "not_found_error" else exc.status
        message = f"{request.method} {request.path}: {exc.reason}"
        return _error_response(request_id, status, error_type, message)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # a broken script must still answer like the provider, no traceback
        _log.error("fake_upstream_handler_failed", request_id=request_id,
                   error_type=type(exc).__name__)
        return _error_response(request_id, 500, "api_error", "Internal server error")


async def _add_common_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``request-id`` and rate-limit headers on every response; scripted headers win."""
    upstream = request.app[UPSTREAM_KEY]
    request_id = request.get(_REQUEST_ID_KEY) or upstream.next_request_id()
    response.headers.setdefault("request-id", request_id)
    for name, value in upstream.rate_limit_headers().items():
        response.headers.setdefault(name, value)


def _checked_body(request: web.Request) -> dict[str, Any]:
    """The body of a message or count request once its credential may make it: an OAuth
    credential needs the OAuth beta (401, judged before the body) and Claude Code's system
    identity (400, judged before the body rules)."""
    authorization = ", ".join(request.headers.getall("Authorization", ()))
    check_oauth_beta(authorization, ",".join(request.headers.getall("anthropic-beta", ())))
    body = _json_object(request)
    check_claude_code_identity(authorization, body)
    return body


def _json_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or the provider's refusal of its bytes, encoding or shape."""
    received = request[_BODY_KEY]
    if received.error is not None:
        raise received.error
    if received.length == 0:
        raise ProviderRuleError("body: a JSON object is required")
    body = request[_RECORD_KEY].body
    if not isinstance(body, dict):
        raise ProviderRuleError(
            f"body: Input should be a valid dictionary (got {type(body).__name__})"
        )
    return body


#: The request's JSON object as the provider routes judge it (strict, decoded).
request_json = _json_object


# -- handlers -------------------------------------------------------------------------------------


async def _handle_messages(request: web.Request) -> web.StreamResponse:
    request.app[UPSTREAM_KEY].counts["messages"] += 1
    return await answer_messages(request, _checked_body(request), Dialect())


@dataclass(frozen=True)
class Dialect:
    """How a provider in front of the Messages API (:mod:`.providers`) says what differs:
    its too-long refusal (given N and M), its stream, its scripted errors."""

    too_long: Callable[[int, int], ProviderRuleError] = lambda total, window: ProviderRuleError(
        f"prompt is too long: {total} tokens > {window} maximum")
    stream: Callable[..., Awaitable[web.StreamResponse]] | None = None
    error: Callable[[Mapping[str, Any], int, Mapping[str, str]], web.Response] | None = None


async def answer_messages(request: web.Request, body: dict[str, Any],
                          dialect: Dialect) -> web.StreamResponse:
    """Judge an Anthropic-shaped Messages body (every rule, the window) and answer it."""
    upstream = request.app[UPSTREAM_KEY]
    record = request[_RECORD_KEY]
    check_messages_request(body)
    measure = upstream.token_rule.measure(body)
    total = measure.total
    if total > upstream.context_window:
        raise dialect.too_long(total, upstream.context_window)

    if upstream.queue:
        reply = upstream.queue.popleft()
    else:
        produced = upstream.script(body, record)
        reply = await produced if inspect.isawaitable(produced) else produced
        if not isinstance(reply, Reply):
            raise TypeError(f"the script returned {type(reply).__name__}, not a Reply")

    fault = reply.fault
    if fault is not None and fault.kind == "close_connection":
        drop_connection(request)
        return web.Response(status=500)  # never reaches the client: the connection is gone
    if fault is not None and fault.kind in ("hang_before_first_byte", "slow_first_byte"):
        try:
            await pause(request, fault.hang_s)
        except asyncio.CancelledError:
            upstream.cancelled += 1
            raise
        except ConnectionResetError:
            upstream.cancelled += 1
            return web.Response(status=499)  # dropped quietly by aiohttp: the client is gone

    if reply.error is not None:
        if dialect.error is not None:
            return dialect.error(reply.error, reply.status, reply.headers)
        error_body = {**reply.error, "request_id": record.request_id}
        return web.json_response(error_body, status=reply.status, headers=reply.headers)

    usage = upstream.prompt_cache.usage(
        f"{record.api_key}\n{body['model']}", measure,
        has_breakpoints=cache_control_count(body) > 0 or body.get("cache_control") is not None,
    )
    message = build_message(reply, message_id=upstream.next_message_id(), model=body["model"],
                            usage=usage)
    if is_summarizer_request(body):
        writing = upstream.summary_timing.seconds(body, message["usage"]["output_tokens"])
        if writing > 0:
            try:
                await pause(request, writing)
            except ConnectionResetError:
                upstream.cancelled += 1
                return web.Response(status=499)
    if body.get("stream") is True:
        return await (dialect.stream or stream)(request, upstream, reply, message)
    if fault is not None and fault.kind in ("cut_after_events", "cut_mid_event"):
        return await cut_json(request, reply, message)
    if fault is not None and fault.kind == "malformed_sse":
        return web.Response(body=MALFORMED_SSE_EVENT, status=reply.status, headers={
            **reply.headers, "content-type": "application/json"})
    return web.json_response(message, status=reply.status, headers=reply.headers)


async def _handle_count_tokens(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM_KEY]
    upstream.counts["count_tokens"] += 1
    body = _checked_body(request)
    check_count_tokens_request(body)
    return web.json_response({"input_tokens": upstream.token_rule.measure(body).total})


async def _handle_not_found(request: web.Request) -> web.StreamResponse:
    request.app[UPSTREAM_KEY].counts["not_found"] += 1
    raise ProviderRuleError(f"Not found: {request.method} {request.path}", 404, "not_found_error")


# -- running it -----------------------------------------------------------------------------------


async def start_fake_upstream(
    upstream: FakeUpstream, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve ``upstream`` on ``host:port`` (0 = a free port); returns the runner and base URL.

    Call ``await runner.cleanup()`` to stop it.
    """
    runner = web.AppRunner(
        upstream.make_app(), handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        access_log=None,
        # The fake judges the body as sent: it undoes Content-Encoding itself (.wire).
        auto_decompress=False,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


def run_fake_upstream(host: str, port: int, provider: str = "anthropic",
                      script: Script | None = None,
                      on_record: Callable[[RecordedRequest], None] | None = None,
                      summary_timing: SummaryTiming | None = None) -> None:
    """Serve a :class:`FakeUpstream` (``script``, the default one when ``None``; also
    ``provider``'s wire; summary calls as slow as ``summary_timing``) until SIGINT or SIGTERM
    (``compact-proxy fake-upstream``), calling ``on_record`` with each request; prints
    ``fake upstream listening on http://host:port`` once started.

    Raises:
        SystemExit: with a one-line message when the address cannot be bound.
    """

    async def serve() -> None:
        tune_allocator()  # as the proxy does: no page-fault lottery in what it is measured by
        try:
            upstream = FakeUpstream(script, provider=provider)
            upstream.on_record = on_record
            if summary_timing is not None:
                upstream.summary_timing = summary_timing
            runner, url = await start_fake_upstream(upstream, host, port)
        except OSError as exc:
            raise SystemExit(
                f"fake upstream: cannot listen on http://{host}:{port}: {exc.strerror or exc}"
            ) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        print(f"fake upstream listening on {url}", flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(serve())
