"""The strict fake provider for ``bench/proxy.py``, run as its own process, with two additions.

    python -m bench.stamped_upstream --port 8788      (from the repository root)

1. Every SSE event carries ``"bench_sent_ns": <time.time_ns()>`` taken the moment the fake
   provider writes it (a top-level field of the event's JSON ``data``; the proxy relays events
   byte for byte, so the client sees the stamp the provider wrote). The client subtracts it
   from its own receive time: the relay latency of that event. It is done by wrapping the
   fake server's ``encode_event``, which ``_stream`` calls right before each ``write``.
2. The request header ``x-bench-event-delay-ms`` (forwarded by the proxy like any header)
   sets the reply's ``event_delay_s``, so a benchmark can hold many streams open at once.

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
import json
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

import proxy.fake_upstream.server as fake_server
from proxy.fake_upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    default_script,
    start_fake_upstream,
)

__all__ = ["DELAY_HEADER", "STAMP_FIELD", "make_upstream", "stamp_events", "main"]

#: The field every streamed event carries: when the provider wrote it, in ``time.time_ns()``.
STAMP_FIELD: Final = "bench_sent_ns"
#: Request header: milliseconds between two SSE events of the reply.
DELAY_HEADER: Final = "x-bench-event-delay-ms"
#: Generous enough for an uncompacted multi-megabyte history sent straight to the provider.
CONTEXT_WINDOW: Final = 50_000_000
MAX_DELAY_MS: Final = 10_000.0
# The fake server's module global that writes one SSE event, and the mark of our wrapper.
_PATCHED: Final = "encode_event"
_MARK: Final = "bench_stamped"


def stamp_events() -> None:
    """Make the fake server stamp every SSE event with its send time (idempotent)."""
    # ``_stream`` looks the name up in its module's globals at every event, so replacing that
    # global is enough; the fake provider's own files stay as they are.
    original: Callable[[str, Mapping[str, Any]], bytes] = getattr(fake_server, _PATCHED)
    if getattr(original, _MARK, False):
        return

    def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
        return original(name, {**data, STAMP_FIELD: time.time_ns()})

    setattr(encode_event, _MARK, True)
    setattr(fake_server, _PATCHED, encode_event)


def _delay_s(headers: Mapping[str, str]) -> float:
    raw = headers.get(DELAY_HEADER)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return min(max(value, 0.0), MAX_DELAY_MS) / 1000.0


def make_upstream() -> FakeUpstream:
    """A fake provider with the default script, the delay header and no request history."""
    upstream = FakeUpstream(context_window=CONTEXT_WINDOW)

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
