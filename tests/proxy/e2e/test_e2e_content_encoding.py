"""End to end: request bodies sent with a ``Content-Encoding``.

``/v1/messages`` and ``count_tokens`` decode the body themselves (the decoded size counts
toward ``limits.max_body_bytes``) and forward it decoded, without the encoding header and with
its own length; every other path relays the client's compressed bytes as they came, encoding
and length agreeing. What the fake provider recorded is what it accepted.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import brotli
import pytest

from tests.conftest import TEST_API_KEY, ProxyFactory, RunningProxy, UpstreamServer, user_text

MODEL = "claude-sonnet-4-5"


def request_body(text: str = "compressed hello") -> dict[str, Any]:
    """A small Messages request."""
    return {"model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": user_text(text)}]}


def raw_deflate(data: bytes) -> bytes:
    """``data`` as a raw DEFLATE stream (no zlib header), as some clients send ``deflate``."""
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def zstd_compress(data: bytes) -> bytes:
    """``data`` as a zstd frame (the standard library from Python 3.14, the backport before)."""
    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef]
    compressed: bytes = zstd.compress(data)
    return compressed


ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,  # RFC 9110: the zlib format
    "deflate-raw": raw_deflate,
    "br": brotli.compress,
    "zstd": zstd_compress,
}


async def post(proxy: RunningProxy, path: str, data: bytes | AsyncIterator[bytes],
               encoding: str) -> tuple[int, Any]:
    """POST ``data`` labelled ``Content-Encoding: encoding``; the status and the JSON body."""
    headers = {"x-api-key": TEST_API_KEY, "content-type": "application/json",
               "content-encoding": encoding}
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(f"{proxy.base_url}{path}", data=data, headers=headers) as resp:
            payload = await resp.read()
            return resp.status, json.loads(gzip.decompress(payload)
                                           if resp.headers.get("Content-Encoding") == "gzip"
                                           else payload)


@pytest.mark.parametrize("name", sorted(ENCODERS))
async def test_compressed_messages_body_is_forwarded_decoded(
    proxy: RunningProxy, upstream_server: UpstreamServer, name: str
) -> None:
    """gzip, deflate (zlib or raw), br, zstd: the provider gets the decoded bytes, labelled as
    such."""
    body = request_body()
    plain = json.dumps(body).encode()
    encoding = name.split("-")[0]
    status, answer = await post(proxy, "/v1/messages", ENCODERS[name](plain), encoding)
    assert status == 200, answer
    assert answer["type"] == "message"
    record = upstream_server.upstream.message_requests[0]
    assert "content-encoding" not in record.headers
    assert record.body == body
    # Nothing to compact: the client's decoded bytes, exactly, with their own length.
    assert record.raw_length == len(plain)
    assert record.headers["content-length"] == str(len(plain))


async def test_chunked_gzip_body_is_decoded_as_it_arrives(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """A gzip body without ``Content-Length`` (chunked) is decoded the same way."""
    body = request_body("chunked and compressed")
    packed = gzip.compress(json.dumps(body).encode())

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(packed), 7):
            yield packed[start:start + 7]

    status, answer = await post(proxy, "/v1/messages", chunks(), "gzip")
    assert status == 200, answer
    record = upstream_server.upstream.message_requests[0]
    assert "content-encoding" not in record.headers
    assert record.body == body
    assert record.headers["content-length"] == str(record.raw_length)


async def test_compressed_body_that_is_rewritten_goes_out_decoded(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """A compacted (rewritten) gzip body: the new JSON, no encoding header, its own length."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 300,
                                          "max_tool_result_tokens": 40,
                                          "keep_recent_messages": 2},
                           "summary": {"enabled": False}})
    long_output = "line of tool output\n" * 400
    body = {"model": MODEL, "max_tokens": 16, "messages": [
        {"role": "user", "content": user_text("run it")},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"cmd": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": long_output}]},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": user_text("and now?")},
    ]}
    status, answer = await post(proxy, "/v1/messages", gzip.compress(json.dumps(body).encode()),
                                "gzip")
    assert status == 200, answer
    record = upstream_server.upstream.message_requests[0]
    assert "content-encoding" not in record.headers
    assert record.headers["content-length"] == str(record.raw_length)
    assert record.body is not None and record.body["messages"] != body["messages"]
    assert len(json.dumps(record.body)) < len(json.dumps(body))


async def test_compressed_count_tokens_body_is_forwarded_decoded(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """``count_tokens`` decodes its body the same way."""
    body = request_body("count me")
    plain = json.dumps(body).encode()
    status, answer = await post(proxy, "/v1/messages/count_tokens", gzip.compress(plain), "gzip")
    assert status == 200, answer
    assert "input_tokens" in answer
    record = upstream_server.upstream.requests[-1]
    assert record.path == "/v1/messages/count_tokens"
    assert "content-encoding" not in record.headers
    assert record.body == body
    assert (record.raw_length, record.headers["content-length"]) == (len(plain), str(len(plain)))


async def test_compressed_passthrough_body_is_relayed_as_the_clients_bytes(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """Any other path: the compressed bytes, ``Content-Encoding`` and their ``Content-Length``."""
    payload = json.dumps({"requests": [{"custom_id": "a", "params": request_body()}]}).encode()
    packed = gzip.compress(payload)
    status, answer = await post(proxy, "/v1/messages/batches", packed, "gzip")
    assert status == 404  # the fake's answer, relayed
    assert answer["error"]["type"] == "not_found_error"
    record = upstream_server.upstream.requests[-1]
    assert record.path == "/v1/messages/batches"
    assert record.headers["content-encoding"] == "gzip"
    assert record.headers["content-length"] == str(len(packed))
    assert record.raw_length == len(packed)  # on the wire: the client's compressed bytes
    # The provider decoded what it got: the client's whole body, nothing cut.
    assert record.body == json.loads(payload)


@pytest.mark.parametrize(("encoding", "named"), [
    ("compress", "'compress'"),
    ("xz", "'xz'"),
    ("gzip, gzip", "'gzip, gzip'"),
    ("compress", "'compress'"),
])
async def test_encoding_the_proxy_cannot_decode_is_415(
    proxy: RunningProxy, upstream_server: UpstreamServer, encoding: str, named: str
) -> None:
    """Unknown or stacked: 415 naming the encoding."""
    status, answer = await post(proxy, "/v1/messages", gzip.compress(b"{}"), encoding)
    assert status == 415
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert named in answer["error"]["message"]
    assert "Content-Encoding" in answer["error"]["message"]
    assert upstream_server.upstream.requests == []


@pytest.mark.parametrize(("encoding", "data", "problem"), [
    ("gzip", b"this is not gzip at all", "not valid gzip"),
    ("gzip", gzip.compress(json.dumps(request_body()).encode())[:-12], "not valid gzip"),
    ("deflate", b"\x78\x9c garbage", "not valid deflate"),
])
async def test_body_that_does_not_decode_is_400(
    proxy: RunningProxy, upstream_server: UpstreamServer, encoding: str, data: bytes,
    problem: str,
) -> None:
    """Corrupt or truncated compressed data: 400 naming the problem, never forwarded."""
    status, answer = await post(proxy, "/v1/messages", data, encoding)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert problem in answer["error"]["message"]
    assert upstream_server.upstream.requests == []


async def test_decoded_size_counts_toward_the_body_limit(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """A small gzip body that inflates past ``max_body_bytes`` is 413 (no zip bomb)."""
    proxy = proxy_factory({"limits": {"max_body_bytes": 4096}})
    bomb = json.dumps(request_body("z" * 2_000_000)).encode()
    packed = gzip.compress(bomb)
    assert len(packed) < 4096
    status, answer = await post(proxy, "/v1/messages", packed, "gzip")
    assert status == 413
    assert answer["error"]["type"] == "request_too_large"
    assert "4096 bytes" in answer["error"]["message"]
    assert upstream_server.upstream.requests == []


async def test_identity_encoding_is_accepted_and_not_forwarded(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """``Content-Encoding: identity`` is no encoding at all."""
    body = request_body()
    plain = json.dumps(body).encode()
    status, answer = await post(proxy, "/v1/messages", plain, "identity")
    assert status == 200, answer
    record = upstream_server.upstream.message_requests[0]
    assert "content-encoding" not in record.headers
    assert record.raw_length == len(plain)
