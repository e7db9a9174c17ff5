"""AWS event-stream frames, as Bedrock streams a Messages answer (``application/vnd.amazon.
eventstream``).

A frame is a prelude (total length, headers length, the prelude's CRC-32), typed headers, the
payload and the CRC-32 of all before it. Bedrock sends each Anthropic stream event as one
``chunk`` event whose payload is ``{"bytes": base64(the event's JSON)}``, and a failure as an
``exception`` frame (``:exception-type``, payload ``{"message": ...}``).

Frames are written here (the fake provider, the proxy's own exception frames) and read with
botocore's own decoder (:class:`EventStreamWatch`: the proxy relays the bytes untouched and
reads the usage from a decoded copy).
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any, Final

from proxy.http.sse import StreamWatch

__all__ = [
    "CONTENT_TYPE",
    "EventStreamWatch",
    "chunk_frame",
    "encode_frame",
    "exception_frame",
]

CONTENT_TYPE: Final = "application/vnd.amazon.eventstream"
_STRING: Final = 7  # the header value type of a UTF-8 string


def encode_frame(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One frame: ``headers`` (string values) and ``payload``, both CRCs computed."""
    encoded = bytearray()
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        encoded += struct.pack(">B", len(raw_name)) + raw_name
        encoded += struct.pack(">BH", _STRING, len(raw_value)) + raw_value
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + bytes(encoded) + payload
    return head + struct.pack(">I", zlib.crc32(head))


def chunk_frame(event: Mapping[str, Any]) -> bytes:
    """A ``chunk`` event carrying one Anthropic stream event (base64 of its JSON)."""
    data = base64.b64encode(json.dumps(event, separators=(",", ":")).encode()).decode()
    return encode_frame(
        {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
        json.dumps({"bytes": data}).encode())


def exception_frame(exception_type: str, message: str) -> bytes:
    """An ``exception`` frame (``internalServerException``, ``throttlingException``, ...)."""
    return encode_frame(
        {":exception-type": exception_type, ":content-type": "application/json",
         ":message-type": "exception"},
        json.dumps({"message": message}).encode())


class EventStreamWatch:
    """A decoded copy of a relayed Bedrock stream, told to a :class:`StreamWatch` as the SSE
    the same events would be: its last event, a provider failure and the usage.

    An ``exception`` frame counts as the provider's error; bytes that do not decode as frames
    (a bad CRC) too, and nothing after them is read.
    """

    __slots__ = ("_buffer", "_broken", "watch")

    def __init__(self) -> None:
        from botocore.eventstream import EventStreamBuffer  # (the bedrock extra)

        self.watch = StreamWatch()
        self._buffer = EventStreamBuffer()
        self._broken = False

    def see(self, data: bytes) -> None:
        """Read the frames completed by ``data`` (the bytes as relayed)."""
        if self._broken:
            return
        self._buffer.add_data(data)
        from botocore.eventstream import ParserError

        sse = bytearray()
        try:
            for message in self._buffer:
                sse += _as_sse(message.headers, message.payload)
        except ParserError:
            self._broken = True
            sse += b"event: error\ndata: {}\n\n"
        if sse:
            self.watch.see(bytes(sse))


def _as_sse(headers: Mapping[str, Any], payload: bytes) -> bytes:
    if headers.get(":message-type") != "event":
        return b"event: error\ndata: {}\n\n"
    if headers.get(":event-type") != "chunk":
        return b""
    try:
        event = base64.b64decode(json.loads(payload)["bytes"])
        name = json.loads(event)["type"]
    except (ValueError, KeyError, TypeError):
        return b""
    return b"event: " + str(name).encode() + b"\ndata: " + event + b"\n\n"
