"""Reading the provider's answers as they are relayed: Server-Sent-Event framing, the event
names and ``usage`` of a Messages stream, the ``usage`` of a whole JSON Message, and the
``error`` event the proxy writes itself."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from proxy.accounting.usage import ProviderUsage
from proxy.http.body import decoded
from proxy.http.errors import error_body

__all__ = ["SSEFramer", "StreamWatch", "json_usage", "sse_error_event"]


@dataclass(slots=True)
class SSEFramer:
    """Splits a byte stream at Server-Sent-Event boundaries (a blank line): :meth:`feed`
    returns the complete events, :meth:`flush` the incomplete rest when the stream ends."""

    _pending: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> bytes:
        if not self._pending and chunk.endswith(b"\n\n"):
            return chunk  # whole events, nothing held (a provider's usual chunk): no copy
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
        rest = bytes(self._pending)
        self._pending.clear()
        return rest

    @property
    def mid_event(self) -> bool:
        """True when part of an event is held back."""
        return bool(self._pending)


# An SSE ``event:`` field at the start of a line (JSON ``data`` never holds a raw newline).
_EVENT_NAME: Final = re.compile(rb"^event:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.MULTILINE)
_USAGE_EVENTS: Final = (b"message_start", b"message_delta")
#: Where one event ends and the next begins (a blank line).
_EVENT_END: Final = re.compile(rb"\r?\n\r?\n")
_DATA_LINE: Final = re.compile(rb"^data:[ \t]?([^\r\n]*)", re.MULTILINE)


def _last_event_name(data: bytes) -> bytes | None:
    """``_EVENT_NAME.findall(data)[-1]`` (or None), found from the end with C searches."""
    end = len(data)
    while True:
        at = data.rfind(b"event:", 0, end)
        if at < 0:
            return None
        found = _EVENT_NAME.match(data, at)  # (its ``^``: only at a line's start)
        if found is not None:
            return found.group(1)
        end = at


@dataclass(slots=True)
class StreamWatch:
    """The event names seen in a relayed Messages stream (the last one, and any ``error``)
    and the ``usage`` its ``message_start`` and ``message_delta`` report; on every chunk, so
    a regular expression runs only where a C search found it can match."""

    last_event: bytes = b""
    provider_error: bool = False
    usage: ProviderUsage | None = None

    def see(self, data: bytes) -> None:
        last = _last_event_name(data)
        if last is None:
            return
        self.last_event = last
        if not self.provider_error and b"error" in data:
            self.provider_error = b"error" in _EVENT_NAME.findall(data)
        if _USAGE_EVENTS[0] in data or _USAGE_EVENTS[1] in data:
            self._read_usage(data)

    def _read_usage(self, data: bytes) -> None:
        # Only the two small usage events are decoded; text deltas are never parsed.
        events = data.split(b"\n\n") if b"\r" not in data else _EVENT_END.split(data)
        for event in events:
            if b"message_" not in event:
                continue
            found = _EVENT_NAME.search(event)
            if found is None or found.group(1) not in _USAGE_EVENTS:
                continue
            payload = b"".join(_DATA_LINE.findall(event))
            try:
                if found.group(1) == _USAGE_EVENTS[0]:
                    message = _MESSAGE_START.decode(payload).message
                    usage = None if message is None else message.usage
                else:
                    usage = _USAGE_ONLY.decode(payload).usage
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if usage is not None:
                self.usage = ProviderUsage.from_usage(usage, self.usage)


def json_usage(body: bytes, content_encoding: str, limit: int) -> ProviderUsage | None:
    """The ``usage`` of a whole JSON Message body (``None`` when it has none)."""
    plain = decoded(body, content_encoding, limit)
    if plain is None:
        return None
    try:
        usage = _USAGE_ONLY.decode(plain).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return None if usage is None else ProviderUsage.from_usage(usage)


class _UsageOnly(msgspec.Struct):
    usage: dict[str, Any] | None = None


class _MessageStart(msgspec.Struct):
    message: _UsageOnly | None = None


_USAGE_ONLY: Final = msgspec.json.Decoder(_UsageOnly)
_MESSAGE_START: Final = msgspec.json.Decoder(_MessageStart)


def sse_error_event(error_type: str, message: str) -> bytes:
    """An ``event: error`` carrying an Anthropic error object (what SDKs raise on)."""
    data = json.dumps(error_body(error_type, message))
    return f"event: error\ndata: {data}\n\n".encode()
