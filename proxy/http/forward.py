"""Forwarding a request to the provider and relaying its answer as it arrives.

The request goes as received but for hop-by-hop headers, ``Host`` and ``Content-Length``
(aiohttp adds none of its own); the answer comes back unchanged and undecompressed, chunk by
chunk. An uncompressed event stream is relayed event by event, so a provider failing
mid-stream is ended with a well-formed ``event: error`` instead of half an event.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.http.audit import Outcome, RequestRecord
from proxy.http.body import decoded
from proxy.http.connections import BodyTimeout
from proxy.http.errors import UpstreamFailure
from proxy.http.sse import SSEFramer, StreamWatch, json_usage, sse_error_event
from proxy.http.upstream_headers import ForwardPolicy
from proxy.providers import TOO_LONG_STATUSES, Provider
from proxy.providers.eventstream import CONTENT_TYPE as EVENT_STREAM
from proxy.providers.eventstream import EventStreamWatch

if TYPE_CHECKING:
    from proxy.config import UpstreamConfig
    from proxy.http.services import Services

__all__ = [
    "HOP_BY_HOP",
    "BeforeEnd",
    "PromptTooLong",
    "Retry",
    "forward",
    "upstream_request_headers",
    "upstream_url",
]

_log = structlog.get_logger("proxy.http.forward")

#: Headers of one connection, not the message (RFC 9110 7.6.1), and the answered ``Expect``.
HOP_BY_HOP: Final = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    "expect",
})
_NOT_FORWARDED: Final = HOP_BY_HOP | {"host", "content-length"}

# aiohttp would add these when absent.
_AUTO_HEADERS: Final = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


#: The provider's refusal of a prompt over the model's window (reference §5.6).
_PROMPT_TOO_LONG: Final = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
#: A refusal without numbers: the window is taken as this share of the refused view.
ESTIMATED_WINDOW_SHARE: Final = 0.85
#: An error body is small; a refusal is read whole only up to this.
_MAX_REFUSAL_BYTES: Final = 64 * 1024
#: A JSON answer is kept (alongside relaying it) up to this, to read its ``usage``.
_MAX_USAGE_BODY_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True)
class PromptTooLong:
    """The provider's ``prompt is too long: N tokens > M maximum`` (``tokens`` N, ``maximum``
    M); Bedrock's and Vertex's refusals carry no numbers (both ``None``)."""

    tokens: int | None
    maximum: int | None

    def counts(self, view_tokens: int) -> tuple[int, int]:
        """N and M; without numbers, ``view_tokens`` (the refused view as counted) and
        :data:`ESTIMATED_WINDOW_SHARE` of it."""
        if self.tokens is not None and self.maximum is not None:
            return self.tokens, self.maximum
        return view_tokens, max(1, int(view_tokens * ESTIMATED_WINDOW_SHARE))

    @classmethod
    def from_error_body(cls, raw: bytes, content_encoding: str) -> PromptTooLong | None:
        """Read an error body; ``None`` unless it is that refusal."""
        plain = decoded(raw, content_encoding, _MAX_REFUSAL_BYTES)
        if plain is None:
            return None
        try:
            body = json.loads(plain)
        except ValueError:
            return None
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        found = _PROMPT_TOO_LONG.match(message) if isinstance(message, str) else None
        if found is None:
            return None
        return cls(int(found.group(1)), int(found.group(2)))


#: For a too-long refusal the client has not seen: the body to send instead (once), or ``None``.
Retry = Callable[[PromptTooLong], Awaitable["bytes | None"]]
#: Awaited once the answer was relayed but for its end (its ``usage`` is on the record).
BeforeEnd = Callable[[], Awaitable[None]]


def upstream_url(base_url: str, request: web.Request) -> URL:
    """``base_url`` (its own path kept) joined with the request's raw path and query."""
    return _joined(base_url, request.raw_path)


@functools.lru_cache(maxsize=256)
def _joined(base_url: str, raw_path: str) -> URL:
    return URL(base_url.rstrip("/") + raw_path, encoded=True)


def _filtered(headers: CIMultiDictProxy[str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """``headers`` but ``dropped`` and what ``Connection`` lists, in their order."""
    out = CIMultiDict(headers)
    names = dropped.intersection(map(str.lower, headers.keys()))
    if "Connection" in headers:  # the names it lists: hop-by-hop for this message only
        names |= {token.strip().lower() for value in headers.getall("Connection", ())
                  for token in value.split(",") if token.strip()}
    for name in names:
        out.popall(name, None)
    return out


def upstream_request_headers(headers: CIMultiDictProxy[str],
                             policy: ForwardPolicy | None = None) -> CIMultiDict[str]:
    """The headers to send upstream: all of ``headers`` but hop-by-hop, Host, Content-Length,
    and what ``policy`` drops (:mod:`proxy.http.upstream_headers`)."""
    out = _filtered(headers, _NOT_FORWARDED)
    if policy is not None:
        policy.apply(out)
    return out


class _WholeAnswerResponse(web.StreamResponse):
    """A relayed answer that is not an event stream: its headers go out with its first body
    bytes, in one send (an event stream's go out at once: a client may wait on them)."""

    _send_headers_immediately = False


def _upstream_error(exc: BaseException, config: UpstreamConfig, waited_s: float,
                    url: str) -> UpstreamFailure:
    name = type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError) and waited_s >= 0.99 * config.pool_wait_s:
        # ClientTimeout.connect (not sock_connect): no pooled or new connection in time.
        return UpstreamFailure(
            529, "overloaded_error",
            f"no connection to the upstream provider within {config.pool_wait_s:g}s "
            "(upstream.pool_wait_s: every connection busy, or the provider not accepting); "
            "retry shortly", reason="upstream_pool_wait", headers={"retry-after": "1"})
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamFailure(
            504, "api_error", "upstream provider did not accept a connection within "
            f"{config.connect_timeout_s:g}s (timeout, {name})", reason="upstream_timeout")
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamFailure(
            504, "api_error", f"upstream provider did not answer within "
            f"{config.read_timeout_s:g}s (timeout, {name})", reason="upstream_timeout")
    return UpstreamFailure(502, "api_error", f"upstream provider {url} unreachable ({name})",
                           reason="upstream_unreachable")


async def forward(
    s: Services,
    request: web.Request,
    record: RequestRecord,
    *,
    body: bytes | AsyncIterable[bytes] | None,
    headers: CIMultiDict[str],
    retry: Retry | None = None,
    before_end: BeforeEnd | None = None,
) -> web.StreamResponse:
    """Send the request upstream and relay the answer (``record`` gets its status, outcome
    and usage). ``retry``: see :data:`Retry`; ``before_end``: see :data:`BeforeEnd`, not
    awaited when the answer failed or the client went away.

    Raises:
        UpstreamFailure: 502 / 504 / 529, before anything was sent to the client.
    """
    upstream = await _send(s, request, record, body, headers)
    held = b""
    try:
        provider = s.provider_of(request)
        if retry is not None and upstream.status in TOO_LONG_STATUSES:
            held, whole = await _read_refusal(upstream)
            encoding = upstream.headers.get("Content-Encoding", "")
            refusal = PromptTooLong.from_error_body(held, encoding) if whole else None
            if refusal is None and whole and provider is not None and provider.too_long(
                    upstream.status, decoded(held, encoding, _MAX_REFUSAL_BYTES) or b""):
                refusal = PromptTooLong(None, None)
            again = None if refusal is None else await retry(refusal)
            if again is not None:
                _done_with(upstream)
                upstream, held = await _send(s, request, record, again, headers), b""
        return await _relay(request, record, upstream, held, before_end, provider)
    finally:
        _done_with(upstream)


def _done_with(upstream: aiohttp.ClientResponse) -> None:
    # Fully read: back to the pool; else closed, which cancels the provider's work.
    if upstream.content.at_eof():
        upstream.release()
    else:
        upstream.close()


async def _read_refusal(upstream: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The start of an error body (up to :data:`_MAX_REFUSAL_BYTES`), and whether it is all."""
    chunks = bytearray()
    while len(chunks) <= _MAX_REFUSAL_BYTES:
        try:
            chunk = await upstream.content.readany()
        except (TimeoutError, aiohttp.ClientError):
            return bytes(chunks), False
        if not chunk:
            return bytes(chunks), True
        chunks += chunk
    return bytes(chunks), False


async def _send(s: Services, request: web.Request, record: RequestRecord,
                body: bytes | AsyncIterable[bytes] | None,
                headers: CIMultiDict[str]) -> aiohttp.ClientResponse:
    upstream_config = s.config.upstream
    url = upstream_url(upstream_config.require_base_url(), request)
    provider = s.provider_of(request)
    if provider is not None and (body is None or isinstance(body, bytes)):
        try:
            headers = await provider.authorise(request.method, url, headers, body or b"")
        except LookupError as exc:
            record.outcome = Outcome.UPSTREAM_UNREACHABLE
            raise UpstreamFailure(500, "api_error", f"no upstream credentials: {exc}",
                                  reason="upstream_credentials") from None
    started = time.perf_counter()
    try:
        upstream = await s.upstream.session.request(
            request.method,
            url,
            data=body,
            headers=headers,
            skip_auto_headers=_AUTO_HEADERS,
            allow_redirects=False,
        )
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        stalled = request.content.exception()
        if isinstance(stalled, BodyTimeout):
            raise stalled from None  # the client's body, not the provider (answered 408)
        timed_out = isinstance(exc, asyncio.TimeoutError)
        record.outcome = Outcome.UPSTREAM_TIMEOUT if timed_out else Outcome.UPSTREAM_UNREACHABLE
        health = s.upstream.health
        if not timed_out:
            health.unreachable(type(exc).__name__)
        raise _upstream_error(exc, upstream_config, time.perf_counter() - started,
                              health.url) from None
    s.upstream.health.answered()
    s.metrics.observe_upstream(record.route, time.perf_counter() - started)
    record.upstream_status = upstream.status
    return upstream


async def _relay(request: web.Request, record: RequestRecord,
                 upstream: aiohttp.ClientResponse, held: bytes = b"",
                 before_end: BeforeEnd | None = None,
                 provider: Provider | None = None) -> web.StreamResponse:
    """Relay the answer as it arrives; ``held`` is the start of its body, already read."""
    content_type = upstream.headers.get("Content-Type", "")
    framer = (
        SSEFramer()
        if content_type.startswith("text/event-stream")
        and "Content-Encoding" not in upstream.headers
        else None
    )
    response = (web.StreamResponse if framer is not None else _WholeAnswerResponse)(
        status=upstream.status, reason=upstream.reason)
    headers = _filtered(upstream.headers, HOP_BY_HOP)
    if framer is not None:  # relayed event by event, chunked
        headers.popall("Content-Length", None)
    response.headers.extend(headers)
    response.headers.update(record.response_headers())
    await response.prepare(request)
    # A Messages stream is complete only with ``message_stop`` and no ``error`` event.
    answered = record.route == "messages" and upstream.status == 200
    watch = StreamWatch() if framer is not None and answered else None
    # Bedrock's event stream: relayed as it comes, read from a decoded copy.
    frames = (EventStreamWatch() if answered and framer is None
              and content_type.startswith(EVENT_STREAM) else None)
    if frames is not None:
        watch = frames.watch
    kept = bytearray() if framer is None and answered and content_type.startswith(
        "application/json") else None
    last = b""  # with before_end, a body not framed here: its chunk not written yet
    while True:
        if held:
            chunk, held = held, b""
        else:
            try:
                chunk = await upstream.content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                return await _failed_mid_body(response, record, framer, exc)
        if not chunk:
            break
        if kept is not None:
            kept += chunk
            if len(kept) > _MAX_USAGE_BODY_BYTES:
                kept = None
        out = framer.feed(chunk) if framer is not None else chunk
        if frames is not None:
            frames.see(chunk)
        elif watch is not None and out:
            watch.see(out)
        if before_end is not None and framer is None:
            out, last = last, out
        if out and not await _write(response, record, out):
            return response
    rest = framer.flush() if framer is not None else last
    if watch is not None and rest and frames is None:
        watch.see(rest)
    if kept is not None:
        record.usage = json_usage(bytes(kept), upstream.headers.get("Content-Encoding", ""),
                                  _MAX_USAGE_BODY_BYTES)
    elif watch is not None:
        record.usage = watch.usage
    if before_end is not None:
        await before_end()
    if rest and not await _write(response, record, rest):
        return response
    if watch is not None and watch.provider_error:
        record.outcome = Outcome.UPSTREAM_ERROR_EVENT
    elif watch is not None and watch.last_event != b"message_stop":
        # Ended early: say so in the stream's own terms.
        _log.warning("upstream_stream_incomplete")
        record.outcome = Outcome.STREAM_FAILED
        incomplete = "upstream provider stream ended before message_stop (incomplete)"
        tail = provider.incomplete_tail(incomplete) if provider is not None else None
        event = tail if tail is not None else sse_error_event("api_error", incomplete)
        if frames is not None:
            rest = b""  # frames: whole, no blank line needed
        # Bytes after the last blank line would otherwise run into the error event.
        if not await _write(response, record, b"\n\n" + event if rest else event):
            return response
    else:
        record.outcome = (Outcome.FORWARDED if upstream.status < 400
                          else Outcome.UPSTREAM_ERROR)
    await response.write_eof()
    return response


async def _write(response: web.StreamResponse, record: RequestRecord, data: bytes) -> bool:
    try:
        await response.write(data)
    except ConnectionResetError:  # includes aiohttp's ClientConnectionResetError
        record.outcome = Outcome.CLIENT_GONE
        return False
    return True


async def _failed_mid_body(response: web.StreamResponse, record: RequestRecord,
                           framer: SSEFramer | None, exc: BaseException) -> web.StreamResponse:
    record.outcome = Outcome.STREAM_FAILED
    _log.warning("upstream_stream_failed", error_class=type(exc).__name__)
    if framer is None:
        # Closed, so the client sees a short body rather than a complete-looking one.
        response.force_close()
        return response
    framer.flush()  # a partial event is dropped, never sent half
    reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else "failed"
    event = sse_error_event(
        "api_error", f"upstream provider stream {reason} mid-response ({type(exc).__name__})"
    )
    if await _write(response, record, event):
        await response.write_eof()
    return response
