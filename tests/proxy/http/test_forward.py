"""Forwarding helpers: SSE framing, header filtering, URL joining."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.http.forward import upstream_request_headers, upstream_url
from proxy.http.sse import SSEFramer


def test_framer_releases_only_complete_events() -> None:
    """Bytes are held back up to the end of the event they belong to."""
    framer = SSEFramer()
    assert framer.feed(b"event: a\ndata: {}\n\nevent: b\nda") == b"event: a\ndata: {}\n\n"
    assert framer.mid_event
    assert framer.feed(b"ta: {}\n") == b""
    assert framer.feed(b"\n") == b"event: b\ndata: {}\n\n"
    assert not framer.mid_event


def test_framer_finds_a_boundary_split_across_chunks_and_crlf_endings() -> None:
    """A blank line split over two chunks, and CRLF line endings, both end an event."""
    framer = SSEFramer()
    assert framer.feed(b"data: 1\n") == b""
    assert framer.feed(b"\ndata: 2\r\n\r") == b"data: 1\n\n"
    assert framer.feed(b"\n") == b"data: 2\r\n\r\n"
    assert framer.flush() == b""


def test_request_headers_drop_hop_by_hop_host_and_length_only() -> None:
    """Connection-listed and hop-by-hop headers, Host and Content-Length go; the rest stays."""
    headers = CIMultiDictProxy(CIMultiDict([
        ("Host", "proxy"), ("Content-Length", "10"), ("Connection", "close, X-Private"),
        ("X-Private", "1"), ("Transfer-Encoding", "chunked"), ("x-api-key", "k"),
        ("anthropic-beta", "a"), ("anthropic-beta", "b"), ("Accept-Encoding", "gzip"),
    ]))
    assert list(upstream_request_headers(headers).items()) == [
        ("x-api-key", "k"), ("anthropic-beta", "a"), ("anthropic-beta", "b"),
        ("Accept-Encoding", "gzip"),
    ]


@pytest.mark.parametrize(("base", "path", "expected"), [
    ("https://api.example", "/v1/messages?beta=true", "https://api.example/v1/messages?beta=true"),
    ("https://gw.example/anthropic/", "/v1/models?limit=2&after_id=a%2Fb",
     "https://gw.example/anthropic/v1/models?limit=2&after_id=a%2Fb"),
])
def test_upstream_url_keeps_base_path_and_raw_query(base: str, path: str, expected: str) -> None:
    """The base's own path is kept and the query string is passed byte for byte."""
    request = make_mocked_request("GET", path)
    assert str(upstream_url(base, request)) == expected
