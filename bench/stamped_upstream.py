"""The strict fake provider for ``bench/proxy.py``, run as its own process, with three additions.

    python -m bench.stamped_upstream --port 8788      (from the repository root)

1. Every SSE event carries ``"bench_sent_ns": <time.time_ns()>`` taken the moment the fake
   provider writes it (a top-level field of the event's JSON ``data``; the proxy relays events
   byte for byte, so the client sees the stamp the provider wrote). The client subtracts it
   from its own receive time: the relay latency of that event. It is done by wrapping the
   fake server's ``encode_event``, which ``_stream`` calls right before each ``write``.
2. The request header ``x-bench-event-delay-ms`` (forwarded by the proxy like any header)
   sets the reply's ``event_delay_s``, so a benchmark can hold many streams open at once.
3. Every answer says how long the provider spent on it, measured inside this process from the
   moment its outermost middleware starts (request headers parsed, body not yet read) to the
   last write: a JSON answer in the response header ``x-bench-provider-ms`` (set after the
   handler returns, before aiohttp writes the small body) and in a top-level body field
   ``"bench_provider_ms"`` (taken when the message is built, for hops that rebuild the headers,
   as LiteLLM does); a stream in a ``"bench_provider_ms"`` field of every SSE event (the time so
   far, taken as the event is written), so the last event carries the whole time. The client
   subtracts it from its own latency: the hop's *own time*, whatever the hop sends upstream.

Everything else is :mod:`proxy.fake_upstream` unchanged: the same strict rules (a view that
breaks them gets a 400), the default script (summaries for the summarizer), the simulated
prompt cache. The context window is raised so an uncompacted 800 KB history sent directly is
still answered (the direct baseline must do the same work as the provider would), and the
recorded requests are dropped as they come (the benchmark reads nothing back from this
process, and keeping thousands of large parsed bodies would only grow its memory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from aiohttp import web

import proxy.fake_upstream.server as fake_server
import proxy.fake_upstream.streaming as fake_streaming
from proxy.fake_upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    default_script,
    start_fake_upstream,
)

__all__ = ["DELAY_HEADER", "PROVIDER_MS_FIELD", "PROVIDER_MS_HEADER", "STAMP_FIELD",
           "BenchUpstream", "make_upstream", "stamp_events", "main"]

#: The field every streamed event carries: when the provider wrote it, in ``time.time_ns()``.
STAMP_FIELD: Final = "bench_sent_ns"
#: Response header of a JSON answer: milliseconds the provider spent on the request.
PROVIDER_MS_HEADER: Final = "x-bench-provider-ms"
#: The same in a JSON answer's body and in every SSE event (time so far when it was written).
PROVIDER_MS_FIELD: Final = "bench_provider_ms"
#: Request header: milliseconds between two SSE events of the reply.
DELAY_HEADER: Final = "x-bench-event-delay-ms"
#: Generous enough for an uncompacted multi-megabyte history sent straight to the provider.
CONTEXT_WINDOW: Final = 50_000_000
MAX_DELAY_MS: Final = 10_000.0
# The fake server's module global that writes one SSE event, and the mark of our wrapper.
_PATCHED: Final = "encode_event"
_PATCHED_MESSAGE: Final = "build_message"
_MARK: Final = "bench_stamped"
# perf_counter_ns() when the outermost middleware started on the current request (its task).
_STARTED: Final[contextvars.ContextVar[int | None]] = contextvars.ContextVar(
    "bench_provider_started", default=None)


def _elapsed_ms() -> float | None:
    started = _STARTED.get()
    return None if started is None else round((time.perf_counter_ns() - started) / 1e6, 3)


def stamp_events() -> None:
    """Make the fake server stamp every SSE event with its send time and the provider time so
    far, and every JSON message with the provider time (idempotent)."""
    # ``stream`` (in ``streaming``) and ``answer_messages`` look the names up in their
    # module's globals at every call, so replacing those globals is enough; the fake
    # provider's own files stay as they are.
    original: Callable[[str, Mapping[str, Any]], bytes] = getattr(fake_streaming, _PATCHED)
    if getattr(original, _MARK, False):
        return

    def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
        stamped = {**data, STAMP_FIELD: time.time_ns()}
        elapsed = _elapsed_ms()
        if elapsed is not None:
            stamped[PROVIDER_MS_FIELD] = elapsed
        return original(name, stamped)

    build: Callable[..., dict[str, Any]] = getattr(fake_server, _PATCHED_MESSAGE)

    def build_message(*args: Any, **kwargs: Any) -> dict[str, Any]:
        message = build(*args, **kwargs)
        elapsed = _elapsed_ms()
        return message if elapsed is None else {**message, PROVIDER_MS_FIELD: elapsed}

    setattr(encode_event, _MARK, True)
    setattr(fake_streaming, _PATCHED, encode_event)
    setattr(fake_server, _PATCHED_MESSAGE, build_message)


@web.middleware
async def provider_time(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                        ) -> web.StreamResponse:
    """Outermost: start the provider's clock for this request; a JSON answer (not yet
    prepared when the handler returns) gets the time as a header."""
    token = _STARTED.set(time.perf_counter_ns())
    try:
        response = await handler(request)
        elapsed = _elapsed_ms()
        if not response.prepared and elapsed is not None:
            response.headers[PROVIDER_MS_HEADER] = f"{elapsed:.3f}"
        return response
    finally:
        _STARTED.reset(token)


def _delay_s(headers: Mapping[str, str]) -> float:
    raw = headers.get(DELAY_HEADER)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return min(max(value, 0.0), MAX_DELAY_MS) / 1000.0


class BenchUpstream(FakeUpstream):
    """:class:`FakeUpstream` whose app times every request (:func:`provider_time`)."""

    def make_app(self) -> web.Application:
        """The fake provider's app with the timing middleware outermost."""
        app = super().make_app()
        app.middlewares.insert(0, provider_time)
        return app


def make_upstream() -> FakeUpstream:
    """A fake provider with the default script, the delay header, the provider-time stamps
    and no request history."""
    upstream = BenchUpstream(context_window=CONTEXT_WINDOW)

    def script(body: dict[str, Any], meta: RecordedRequest) -> Reply:
        # The current request's record is the last one; older ones are not needed.
        del upstream.requests[:-1]
        reply = default_script(body, meta)
        delay = _delay_s(meta.headers)
        return replace(reply, event_delay_s=delay) if delay else reply

    upstream.script = script
    return upstream


def main(argv: list[str] | None = None) -> int:
    """Serve the stamped fake provider on 127.0.0.1 until SIGINT / SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    stamp_events()

    async def serve() -> None:
        runner, url = await start_fake_upstream(make_upstream(), "127.0.0.1", args.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        print(json.dumps({"event": "listening", "url": url}), flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
