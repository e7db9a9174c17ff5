"""The stream watch's C-search reading of relayed events (and its decoding of the usage
events' ``usage`` alone) gives what reading every event with the regular expressions and
``json.loads`` gave (its earlier code, kept here as the oracle), on the provider's streams and
on any bytes a property test makes."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.accounting.usage import ProviderUsage
from proxy.http.sse import SSEFramer
from proxy.http.sse import StreamWatch as _StreamWatch

_EVENT_NAME = re.compile(rb"^event:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.MULTILINE)
_DATA_LINE = re.compile(rb"^data:[ \t]?([^\r\n]*)", re.MULTILINE)
_USAGE_EVENTS = (b"message_start", b"message_delta")


class Oracle:
    """The watch as it read every chunk with regular expressions."""

    def __init__(self) -> None:
        self.last_event = b""
        self.provider_error = False
        self.usage: ProviderUsage | None = None

    def see(self, data: bytes) -> None:
        names = _EVENT_NAME.findall(data)
        if names:
            self.last_event = names[-1]
            self.provider_error = self.provider_error or b"error" in names
            if _USAGE_EVENTS[0] in names or _USAGE_EVENTS[1] in names:
                for event in re.split(rb"\r?\n\r?\n", data):
                    found = _EVENT_NAME.search(event)
                    if found is None or found.group(1) not in _USAGE_EVENTS:
                        continue
                    payload = b"".join(_DATA_LINE.findall(event))
                    try:
                        parsed = json.loads(payload)
                    except ValueError:
                        continue
                    message = (parsed.get("message") if found.group(1) == _USAGE_EVENTS[0]
                               else parsed) if isinstance(parsed, dict) else None
                    usage = message.get("usage") if isinstance(message, dict) else None
                    if isinstance(usage, dict):
                        self.usage = ProviderUsage.from_usage(usage, self.usage)


def watched(chunks: list[bytes], framed: bool = True) -> tuple[Any, Any]:
    """(the watch, the oracle) after seeing ``chunks`` as relayed (framed, then the rest)."""
    watch, oracle = _StreamWatch(), Oracle()
    framer = SSEFramer()
    for chunk in chunks:
        out = framer.feed(chunk) if framed else chunk
        if out:
            watch.see(out)
            oracle.see(out)
    rest = framer.flush()
    if rest:
        watch.see(rest)
        oracle.see(rest)
    return watch, oracle


def state(watch: Any) -> tuple[bytes, bool, ProviderUsage | None]:
    return watch.last_event, watch.provider_error, watch.usage


def event(name: str, data: dict[str, Any], end: str = "\n") -> bytes:
    return f"event: {name}{end}data: {json.dumps(data)}{end}{end}".encode()


START = event("message_start", {"type": "message_start", "message": {
    "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}}})
DELTA = event("content_block_delta", {"type": "content_block_delta",
                                      "delta": {"type": "text_delta", "text": "an error here"}})
END = event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 42}})
STOP = event("message_stop", {"type": "message_stop"})


def test_a_whole_stream_is_read_alike_in_one_chunk_or_event_by_event() -> None:
    whole = START + DELTA + DELTA + END + STOP
    for chunks in ([whole], [START, DELTA, DELTA, END, STOP], [whole[:7], whole[7:333],
                                                             whole[333:]]):
        watch, oracle = watched(chunks)
        assert state(watch) == state(oracle)
        assert watch.last_event == b"message_stop" and not watch.provider_error
        assert watch.usage == ProviderUsage(input=10, cache_read=5, cache_write=0, output=42)


def test_an_error_event_and_crlf_streams_are_read_alike() -> None:
    error = event("error", {"type": "error", "error": {"type": "overloaded_error"}})
    for end in ("\n", "\r\n"):
        chunks = [event("message_start", {"message": {"usage": {"input_tokens": 3}}}, end),
                  event("ping", {}, end), error.replace(b"\n", end.encode())]
        watch, oracle = watched(chunks)
        assert state(watch) == state(oracle)
        assert watch.provider_error and watch.last_event == b"error"


_LINES = st.sampled_from([
    b"event: message_start", b"event:message_delta", b"event: message_delta \r",
    b"event:\terror", b"event: error\r", b"event: ping", b"event: content_block_delta",
    b"event: message_stop", b" event: error", b"event: a\rb", b"xevent: error",
    b'data: {"message": {"usage": {"input_tokens": 7, "output_tokens": 2}}}',
    b'data: {"usage": {"output_tokens": 9}}', b'data: {"usage": {"output_tokens": 9}',
    b'data:{"type": "error"}', b"data: event: error", b": comment", b"id: 3", b"",
    b"data: message_start", b'data: {"usage": {"output_tokens": "x"}}',
    b'data: {"usage": {"output_tokens": 4, "output_tokens": 6}, "usage": {"input_tokens": 1}}',
    b'data:  { "message" : { "usage" : { "cache_creation_input_tokens" : 8 } } } ',
    b'data: {"message": null}', b'data: {"message": {"usage": "none"}}', b"data: [1, 2]",
    b'data: {"usage": {"output_tokens": 1.5}}', b'data: {"usage": {"output_tokens": -3}}',
])
_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_LINES, _ENDS), max_size=30), st.lists(st.integers(0, 2000),
                                                                 max_size=5))
def test_any_bytes_are_read_as_the_regular_expressions_read_them(
        lines: list[tuple[bytes, bytes]], cuts: list[int]) -> None:
    stream = b"".join(line + end for line, end in lines)
    points = sorted({min(cut, len(stream)) for cut in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    for framed in (True, False):
        watch, oracle = watched([c for c in chunks if c], framed)
        assert state(watch) == state(oracle)
