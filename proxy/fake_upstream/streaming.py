"""How the fake provider writes an answer over time: a pause that ends when the client is
gone, a dropped connection, a JSON body cut halfway, and the SSE stream event by event with
its faults (:class:`.replies.Fault`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from .replies import (
    MALFORMED_SSE_EVENT,
    MALFORMED_SSE_TAIL,
    Fault,
    Reply,
    encode_event,
    stream_events,
)

if TYPE_CHECKING:
    from .server import FakeUpstream

__all__ = ["cut_json", "drop_connection", "pause", "stream"]

#: How often a pause looks whether the client is still there.
DISCONNECT_POLL_S: Final = 0.02


async def pause(request: web.Request, seconds: float) -> None:
    """Sleep ``seconds``, raising ``ConnectionResetError`` as soon as the client is gone.

    aiohttp only cancels a handler on disconnect when ``handler_cancellation`` is on; polling
    the transport makes delays and hangs end promptly with either runner setting.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client disconnected")
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(remaining, DISCONNECT_POLL_S))


def drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def cut_json(
    request: web.Request, reply: Reply, message: Mapping[str, Any]
) -> web.StreamResponse:
    """Announce the whole JSON body, send half of it, then drop the connection."""
    payload = json.dumps(message).encode()
    response = web.StreamResponse(status=reply.status, headers={
        **reply.headers, "content-type": "application/json", "content-length": str(len(payload)),
    })
    await response.prepare(request)
    await response.write(payload[: len(payload) // 2])
    drop_connection(request)
    return response


async def stream(
    request: web.Request, upstream: FakeUpstream, reply: Reply, message: Mapping[str, Any]
) -> web.StreamResponse:
    """Write the SSE events one by one, each flushed on its own, honouring delay and faults.

    A client that disconnects mid-stream is counted in ``upstream.cancelled``.
    """
    response = web.StreamResponse(status=200, headers={
        **reply.headers, "content-type": "text/event-stream", "cache-control": "no-cache",
    })
    events = stream_events(message)
    fault: Fault | None = reply.fault
    stop_at = fault.after_events if fault is not None and fault.kind in (
        "cut_after_events", "error_event", "malformed_sse", "cut_mid_event") else None
    try:
        await response.prepare(request)
        for index, (name, data) in enumerate(events):
            if index == stop_at:
                if fault is not None and fault.kind == "cut_mid_event":
                    encoded = encode_event(name, data)
                    await response.write(encoded[: len(encoded) // 2])
                break
            if index and reply.event_delay_s:
                await pause(request, reply.event_delay_s)
            await response.write(encode_event(name, data))
            upstream.events_sent += 1
        if fault is not None and fault.kind == "error_event":
            await response.write(encode_event("error", fault.error_payload()))
            upstream.events_sent += 1
        if fault is not None and fault.kind == "malformed_sse":
            await response.write(MALFORMED_SSE_EVENT)
            await response.write(MALFORMED_SSE_TAIL)
            upstream.events_sent += 1
    except asyncio.CancelledError:
        upstream.cancelled += 1
        raise
    except ConnectionResetError:
        # Re-raising would make aiohttp log a traceback and try a 500 on a dead connection;
        # returning lets it notice the disconnect and drop the connection quietly.
        upstream.cancelled += 1
        return response
    if fault is not None and fault.kind in ("cut_after_events", "cut_mid_event"):
        drop_connection(request)
        return response
    await response.write_eof()
    return response
