"""AWS event-stream frames, as Bedrock streams a Messages answer.

A frame is a prelude (total length, headers length, the prelude's CRC-32), typed headers, the
payload and the CRC-32 of all before it. Each Anthropic stream event is one ``chunk`` event
(payload ``{"bytes": base64(the event's JSON)}``), a failure an ``exception`` frame. Frames
are written here (the fake provider, the proxy's own exception frames) and read by
:class:`EventStreamWatch` (the bytes are relayed untouched).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
import zlib
from collections.abc import Mapping
from typing import Any, Final

from proxy.http.sse import StreamWatch

__all__ = ["CONTENT_TYPE", "EventStreamWatch", "chunk_frame", "encode_frame", "exception_frame"]

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
    """What a :class:`StreamWatch` would see of a relayed Bedrock stream's events: the last
    event's name, a provider failure (an ``exception`` frame, or bytes that are not frames:
    nothing after them is read) and the usage (only ``message_start``/``message_delta`` are
    decoded whole; of other chunks, only the event's ``type``)."""

    __slots__ = ("_broken", "_pending", "watch")

    def __init__(self) -> None:
        self.watch = StreamWatch()
        self._pending = b""
        self._broken = False

    def see(self, data: bytes) -> None:
        """Read the frames completed by ``data`` (the bytes as relayed)."""
        if self._broken:
            return
        buffer = self._pending + data if self._pending else data
        at, end = 0, len(buffer)
        while end - at >= _PRELUDE:
            total, header_length = _LENGTHS.unpack_from(buffer, at)
            if total < _PRELUDE + 4 + header_length or total > _MAX_FRAME:
                return self._break()
            if end - at < total:
                break
            frame = buffer[at:at + total]
            if zlib.crc32(frame[:-4]) != int.from_bytes(frame[-4:], "big"):
                return self._break()
            self._frame(frame[_PRELUDE:_PRELUDE + header_length],
                        frame[_PRELUDE + header_length:-4])
            at += total
        self._pending = buffer[at:]
        return None

    def _break(self) -> None:
        self._broken = True
        self._pending = b""
        self.watch.provider_error = True

    def _frame(self, headers: bytes, payload: bytes) -> None:
        if _EVENT_MESSAGE not in headers:  # an exception or error frame
            self.watch.provider_error = True
            self.watch.last_event = b"error"
            return
        if _CHUNK_EVENT not in headers:
            return
        if payload.startswith(_BYTES_FIELD):  # as Bedrock writes it: no regex needed
            encoded = payload[len(_BYTES_FIELD):payload.find(b'"', len(_BYTES_FIELD))]
        else:
            found = _BYTES.search(payload)
            if found is None:
                return
            encoded = found.group(1)
        try:
            head = binascii.a2b_base64(encoded[:_HEAD_CHARS])
        except binascii.Error:
            return
        name = _TYPE.search(head)
        if name is None:
            return
        event = name.group(1)
        if event in (b"message_start", b"message_delta"):
            data = binascii.a2b_base64(encoded)
            self.watch.see(b"event: " + event + b"\ndata: " + data + b"\n\n")
        else:
            self.watch.last_event = event
            if event == b"error":
                self.watch.provider_error = True


_PRELUDE: Final = 12
_LENGTHS: Final = struct.Struct(">II")
_MAX_FRAME: Final = 16 * 1024 * 1024
# Header bytes: name length, name, type 7 (string), value length, value.
_EVENT_MESSAGE: Final = b"\x0d:message-type\x07\x00\x05event"
_CHUNK_EVENT: Final = b"\x0b:event-type\x07\x00\x05chunk"
_BYTES_FIELD: Final = b'{"bytes":"'
_BYTES: Final = re.compile(rb'"bytes"\s*:\s*"([A-Za-z0-9+/=]*)"')
#: Base64 characters decoded to read an event's ``type`` (a multiple of 4).
_HEAD_CHARS: Final = 64
_TYPE: Final = re.compile(rb'"type"\s*:\s*"([a-z_]+)"')
