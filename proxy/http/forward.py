"""Forwarding a request to the provider and relaying its answer as it arrives.

Request side: method, path and query string exactly as received; every header except the
hop-by-hop ones, ``Host`` and ``Content-Length`` (recomputed); aiohttp adds no header of its
own (``skip_auto_headers``), so what the client sent is what the provider sees.

Response side: status, reason, headers (minus hop-by-hop) and body bytes unchanged. The
upstream session does not decompress (``auto_decompress=False``), so a compressed body is
relayed as the compressed bytes it is, with its own ``Content-Encoding`` and
``Content-Length``. Nothing is buffered whole: each chunk is written as it arrives. An
uncompressed ``text/event-stream`` is relayed event by event (a chunk is held back only up to
the end of the event it belongs to), so that if the provider fails mid-stream the proxy can
end the stream with a well-formed ``event: error`` instead of half an event.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterable
from typing import Final

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.http.audit import Outcome, RequestRecord
from proxy.http.errors import UpstreamFailure
from proxy.keys import CONFIG, METRICS, UPSTREAM

__all__ = [
    "HOP_BY_HOP",
    "SSEFramer",
    "forward",
    "request_body_stream",
    "upstream_request_headers",
    "upstream_url",
]

_log = structlog.get_logger("proxy.http.forward")

#: Headers that describe one connection, not the message (RFC 9110 section 7.6.1), plus
#: ``Expect``, which the proxy's own server has already answered.
HOP_BY_HOP: Final = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    "expect",
})
_NOT_FORWARDED: Final = HOP_BY_HOP | {"host", "content-length"}

# aiohttp would add these when absent; the provider must see the client's headers only.
_AUTO_HEADERS: Final = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def upstream_url(base_url: str, request: web.Request) -> URL:
    """``base_url`` joined with the request's raw path and query string (kept byte for byte).

    A base with a path (``https://gw.example/anthropic``) keeps it: ``/v1/messages`` becomes
    ``https://gw.example/anthropic/v1/messages``.
    """
    return URL(base_url.rstrip("/") + request.raw_path, encoded=True)


def _connection_tokens(headers: CIMultiDictProxy[str]) -> set[str]:
    """Header names the ``Connection`` header lists: hop-by-hop for this message only."""
    return {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    }


def _filtered(headers: CIMultiDictProxy[str], dropped: frozenset[str]) -> CIMultiDict[str]:
    extra = _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in dropped or lowered in extra:
            continue
        out.add(name, value)
    return out


def upstream_request_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The headers to send upstream: all of ``headers`` but hop-by-hop, Host, Content-Length."""
    return _filtered(headers, _NOT_FORWARDED)


def _downstream_headers(headers: CIMultiDictProxy[str], *, framed: bool) -> CIMultiDict[str]:
    out = _filtered(headers, HOP_BY_HOP)
    if framed:
        # Relayed event by event with chunked framing of our own.
        out.popall("Content-Length", None)
    return out


async def request_body_stream(request: web.Request) -> AsyncIterable[bytes]:
    """The client's body, chunk by chunk as it arrives (for requests forwarded untouched)."""
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return
        yield chunk


class SSEFramer:
    """Splits a byte stream at Server-Sent-Event boundaries (a blank line).

    :meth:`feed` returns every complete event received so far and keeps the incomplete
    rest; :meth:`flush` returns that rest when the stream ends.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        """Append ``chunk``; return the complete events now available (may be empty)."""
        start = max(0, len(self._pending) - 3)  # a boundary may straddle the old tail
        self._pending += chunk
        end = 0
        for boundary in (b"\n\n", b"\r\n\r\n"):
            found = self._pending.rfind(boundary, start)
            if found >= 0:
                end = max(end, found + len(boundary))
        if end == 0:
            return b""
        ready = bytes(self._pending[:end])
        del self._pending[:end]
        return ready

    def flush(self) -> bytes:
        """Whatever is left after the last boundary."""
        rest = bytes(self._pending)
        self._pending.clear()
        return rest

    @property
    def mid_event(self) -> bool:
        """True when part of an event is held back."""
        return bool(self._pending)


# An SSE ``event:`` field at the start of a line (a JSON ``data`` value never holds a raw
# newline, so text inside the data cannot match).
_EVENT_NAME: Final = re.compile(rb"^event:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.MULTILINE)


class _StreamWatch:
    """The event names seen in a relayed Messages stream: the last one, and any ``error``."""

    __slots__ = ("last_event", "provider_error")

    def __init__(self) -> None:
        self.last_event = b""
        self.provider_error = False

    def see(self, data: bytes) -> None:
        """Note the ``event:`` names in ``data`` (complete events, as relayed)."""
        names = _EVENT_NAME.findall(data)
        if names:
            self.last_event = names[-1]
            self.provider_error = self.provider_error or b"error" in names


def sse_error_event(error_type: str, message: str) -> bytes:
    """An ``event: error`` carrying an Anthropic error object (what SDKs raise on)."""
    data = json.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    return f"event: error\ndata: {data}\n\n".encode()


def _upstream_error(exc: BaseException, timeout_s: float,
                    connect_timeout_s: float) -> UpstreamFailure:
    name = type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamFailure(
            504, "api_error",
            f"upstream provider did not accept a connection within {connect_timeout_s:g}s "
            f"(timeout, {name})", reason="upstream_timeout",
        )
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamFailure(
            504, "api_error",
            f"upstream provider did not answer within {timeout_s:g}s (timeout, {name})",
            reason="upstream_timeout",
        )
    return UpstreamFailure(502, "api_error", f"upstream provider unreachable ({name})",
                           reason="upstream_unreachable")


async def forward(
    request: web.Request,
    record: RequestRecord,
    *,
    body: bytes | AsyncIterable[bytes] | None,
    headers: CIMultiDict[str],
) -> web.StreamResponse:
    """Send the request upstream and relay the answer; the response is already prepared.

    Args:
        request: the client's request (method, path, query string are taken from it).
        record: its audit record (``upstream_status`` and ``outcome`` are set here; its
            ``x-compact-*`` headers are added to the response).
        body: the bytes to send, a stream of them, or ``None``.
        headers: the headers to send (see :func:`upstream_request_headers`).

    Raises:
        UpstreamFailure: 502 when the provider cannot be reached, 504 when it does not answer
            in time; both before anything was sent to the client.
    """
    app = request.app
    upstream_config = app[CONFIG].upstream
    started = time.perf_counter()
    try:
        upstream = await app[UPSTREAM].request(
            request.method,
            upstream_url(upstream_config.require_base_url(), request),
            data=body,
            headers=headers,
            skip_auto_headers=_AUTO_HEADERS,
            allow_redirects=False,
        )
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        timed_out = isinstance(exc, asyncio.TimeoutError)
        record.outcome = Outcome.UPSTREAM_TIMEOUT if timed_out else Outcome.UPSTREAM_UNREACHABLE
        raise _upstream_error(exc, upstream_config.read_timeout_s,
                              upstream_config.connect_timeout_s) from None
    app[METRICS].observe_upstream(record.route, time.perf_counter() - started)
    record.upstream_status = upstream.status
    try:
        return await _relay(request, record, upstream)
    finally:
        # Fully read: the connection goes back to the pool. Otherwise (client gone, failure)
        # it is closed, which is what cancels the provider's work.
        if upstream.content.at_eof():
            upstream.release()
        else:
            upstream.close()


async def _relay(request: web.Request, record: RequestRecord,
                 upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    content_type = upstream.headers.get("Content-Type", "")
    framer = (
        SSEFramer()
        if content_type.startswith("text/event-stream")
        and "Content-Encoding" not in upstream.headers
        else None
    )
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(_downstream_headers(upstream.headers, framed=framer is not None))
    response.headers.update(record.response_headers())
    await response.prepare(request)
    # A Messages stream is complete only with ``message_stop``; one that carried the
    # provider's own ``error`` event failed. Either is noted from the event names of what was
    # relayed (one regex scan per chunk), so neither is counted as a success.
    watch = (_StreamWatch() if framer is not None and record.route == "messages"
             and upstream.status == 200 else None)
    while True:
        try:
            chunk = await upstream.content.readany()
        except (TimeoutError, aiohttp.ClientError) as exc:
            return await _failed_mid_body(response, record, framer, exc)
        if not chunk:
            break
        out = framer.feed(chunk) if framer is not None else chunk
        if watch is not None and out:
            watch.see(out)
        if out and not await _write(response, record, out):
            return response
    rest = framer.flush() if framer is not None else b""
    if rest and not await _write(response, record, rest):
        return response
    if watch is not None and rest:
        watch.see(rest)
    if watch is not None and watch.provider_error:
        record.outcome = Outcome.UPSTREAM_ERROR_EVENT
    elif watch is not None and watch.last_event != b"message_stop":
        # Ended cleanly but early, or in bytes that are not SSE: say so in the stream's own
        # terms, so the client does not take a partial answer for a whole one.
        _log.warning("upstream_stream_incomplete")
        record.outcome = Outcome.STREAM_FAILED
        event = sse_error_event(
            "api_error", "upstream provider stream ended before message_stop (incomplete)"
        )
        # Bytes after the last blank line would otherwise run into the error event.
        if not await _write(response, record, b"\n\n" + event if rest else event):
            return response
    else:
        # A provider error relayed as it came is not a success either.
        record.outcome = (Outcome.FORWARDED if upstream.status < 400
                          else Outcome.UPSTREAM_ERROR)
    await response.write_eof()
    return response


async def _write(response: web.StreamResponse, record: RequestRecord, data: bytes) -> bool:
    """Write to the client; ``False`` when it has gone away."""
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
        # No way to signal inside an opaque body: close the connection, so the client sees
        # a short body rather than a complete-looking one.
        response.force_close()
        return response
    framer.flush()  # a partial event is dropped, never sent half
    reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else "failed"
    event = sse_error_event(
        "api_error", f"upstream provider stream {reason} mid-response ({type(exc).__name__})"
    )
    if await _write(response, record, event):
        record.outcome = Outcome.STREAM_FAILED
        await response.write_eof()
    return response
