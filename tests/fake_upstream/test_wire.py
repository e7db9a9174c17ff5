"""What the fake upstream sees on the wire: ``Content-Encoding`` and ``Content-Length`` must agree
with the body, the body must be strict JSON in UTF-8, and size limits hold before and after
decoding. Every test talks to the real fake server on 127.0.0.1, raw bytes where the SDK would
never send them."""

from __future__ import annotations

import asyncio
import gzip
import importlib
import json
import zlib
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.fake_upstream import FakeUpstream

MODEL = "claude-sonnet-4-5"
BODY: dict[str, Any] = {"model": MODEL, "max_tokens": 8,
                        "messages": [{"role": "user", "content": "Hello there"}]}
RAW = json.dumps(BODY).encode()
KEY = {"x-api-key": "k", "content-type": "application/json"}
MIB = 1024 * 1024
TOO_LARGE = {"error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}


async def _post(http: aiohttp.ClientSession, data: bytes, encoding: str | None = None,
                path: str = "/v1/messages") -> tuple[int, Any]:
    headers = dict(KEY) if encoding is None else {**KEY, "content-encoding": encoding}
    async with http.post(path, data=data, headers=headers) as response:
        return response.status, await response.json(content_type=None)


def _deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def _invalid_request(payload: Any) -> str:
    assert payload["type"] == "error" and payload["request_id"].startswith("req_fake_")
    assert payload["error"]["type"] == "invalid_request_error"
    message: str = payload["error"]["message"]
    return message


@pytest.mark.parametrize(("encoding", "data"), [
    pytest.param(None, RAW, id="absent"),
    pytest.param("identity", RAW, id="identity"),
    pytest.param("gzip", gzip.compress(RAW), id="gzip"),
    pytest.param("GZip", gzip.compress(RAW), id="gzip, any case"),
    pytest.param("x-gzip", gzip.compress(RAW), id="x-gzip"),
    pytest.param("gzip", gzip.compress(RAW[:20]) + gzip.compress(RAW[20:]), id="gzip members"),
    pytest.param("deflate", zlib.compress(RAW), id="deflate (zlib)"),
    pytest.param("deflate", _deflate_raw(RAW), id="deflate (raw)"),
    pytest.param("deflate, gzip", gzip.compress(zlib.compress(RAW)), id="deflate then gzip"),
    pytest.param("gzip, identity", gzip.compress(RAW), id="gzip then identity"),
])
async def test_compressed_bodies_are_decoded_by_their_content_encoding(
    http: aiohttp.ClientSession, upstream: FakeUpstream, encoding: str | None, data: bytes,
) -> None:
    """The fake reads the raw bytes (aiohttp's auto-decompression is off) and undoes each
    listed encoding, last applied first; the request is then judged on the decoded JSON."""
    status, payload = await _post(http, data, encoding)
    assert status == 200, payload
    (record,) = upstream.requests
    assert record.body == BODY and record.raw_length == len(data)
    status, payload = await _post(http, data, encoding, "/v1/messages/count_tokens")
    assert status == 200 and payload["input_tokens"] > 0


def _could_not_decode(encoding: str) -> str:
    return f"The request body could not be decoded with its Content-Encoding `{encoding}`."


@pytest.mark.parametrize(("encoding", "data", "failing"), [
    pytest.param("gzip", RAW, "gzip", id="plain JSON still labelled gzip"),
    pytest.param("deflate", RAW, "deflate", id="plain JSON still labelled deflate"),
    pytest.param("gzip", gzip.compress(RAW)[:-9], "gzip", id="truncated gzip"),
    pytest.param("gzip", gzip.compress(RAW) + b"trailing", "gzip", id="gzip then garbage"),
    pytest.param("gzip, gzip", gzip.compress(RAW), "gzip", id="labelled twice, sent once"),
    pytest.param("deflate, gzip", gzip.compress(RAW), "deflate", id="inner encoding missing"),
])
async def test_a_body_that_does_not_decode_as_labelled_is_refused(
    http: aiohttp.ClientSession, encoding: str, data: bytes, failing: str,
) -> None:
    """A body whose Content-Encoding does not match its bytes is a 400 (text: assumption)."""
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, payload = await _post(http, data, encoding, path)
        assert status == 400
        assert _invalid_request(payload) == _could_not_decode(failing)


def _importable(*names: str) -> bool:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return True
    return False


def _supported() -> str:
    names = ["identity", "gzip", "x-gzip", "deflate"]
    if _importable("brotli", "brotlicffi"):
        names.append("br")
    if _importable("compression.zstd", "backports.zstd", "zstandard"):
        names.append("zstd")
    return ", ".join(names)


UNKNOWN = ["compress", "xz", "snappy"]
if "br" not in _supported():
    UNKNOWN.append("br")
if "zstd" not in _supported():
    UNKNOWN.append("zstd")


@pytest.mark.parametrize("encoding", UNKNOWN)
async def test_an_unsupported_content_encoding_is_415(
    http: aiohttp.ClientSession, encoding: str,
) -> None:
    """An encoding the fake cannot decode is 415 in the Anthropic shape (text: assumption)."""
    status, payload = await _post(http, gzip.compress(RAW), f"gzip, {encoding}")
    assert status == 415
    assert _invalid_request(payload) == (
        f"Unsupported Content-Encoding `{encoding}`. Supported encodings: {_supported()}.")


async def test_brotli_bodies_are_decoded(
    http: aiohttp.ClientSession,
) -> None:
    """``br`` is decoded (brotli is a dependency of the project); plain or truncated bytes
    labelled ``br`` are refused, and a stream inflating past 32 MiB is the 413."""
    import brotli
    status, _ = await _post(http, brotli.compress(RAW), "br")
    assert status == 200
    for broken in (RAW, brotli.compress(RAW)[:-3]):
        status, payload = await _post(http, broken, "br")
        assert status == 400 and _invalid_request(payload) == _could_not_decode("br")
    bomb = brotli.compress(json.dumps({**BODY, "padding": "x" * (33 * MIB)}).encode())
    assert len(bomb) < MIB
    assert await _post(http, bomb, "br") == (413, TOO_LARGE)


async def test_zstd_bodies_are_decoded(
    http: aiohttp.ClientSession,
) -> None:
    """``zstd`` is decoded (backports.zstd below Python 3.14, a dependency of the project), frame
    after frame; plain or truncated bytes labelled ``zstd`` are refused, and a stream inflating
    past 32 MiB is the 413."""
    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef]
    for packed in (zstd.compress(RAW), zstd.compress(RAW[:30]) + zstd.compress(RAW[30:])):
        status, _ = await _post(http, packed, "zstd")
        assert status == 200
    for broken in (RAW, zstd.compress(RAW)[:-3]):
        status, payload = await _post(http, broken, "zstd")
        assert status == 400 and _invalid_request(payload) == _could_not_decode("zstd")
    bomb = zstd.compress(json.dumps({**BODY, "padding": "x" * (33 * MIB)}).encode())
    assert len(bomb) < MIB
    assert await _post(http, bomb, "zstd") == (413, TOO_LARGE)


async def test_an_empty_gzip_body_is_an_empty_body(http: aiohttp.ClientSession) -> None:
    """A gzip stream of nothing decodes to an empty body: a JSON object is required."""
    status, payload = await _post(http, gzip.compress(b""), "gzip")
    assert status == 400 and _invalid_request(payload) == "body: a JSON object is required"


async def test_a_body_over_32_mib_is_413_request_too_large(
    http: aiohttp.ClientSession, upstream: FakeUpstream,
) -> None:
    """Over 32 MiB on the wire the answer is the edge's 413, its exact body (no request_id)."""
    big = json.dumps({**BODY, "padding": "x" * (32 * MIB)}).encode()
    status, payload = await _post(http, big)
    assert (status, payload) == (413, TOO_LARGE)
    assert upstream.counts["messages"] == 0


async def test_a_body_over_32_mib_once_decoded_is_413(http: aiohttp.ClientSession) -> None:
    """The limit holds for the decoded body too: a small gzip that inflates past 32 MiB is 413
    (assumption: the provider limits what it decodes as well as what it receives)."""
    bomb = gzip.compress(json.dumps({**BODY, "padding": "x" * (33 * MIB)}).encode())
    assert len(bomb) < MIB
    status, payload = await _post(http, bomb, "gzip")
    assert (status, payload) == (413, TOO_LARGE)


async def _exchange(base_url: str, data: bytes, wait: float = 5.0) -> bytes:
    """Send ``data`` on a fresh keep-alive connection; return the first response's bytes (head
    and Content-Length body), or what came before ``wait`` seconds passed without more."""
    url = URL(base_url)
    assert url.host is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(data)
        await writer.drain()
        received = b""
        while not _complete(received):
            try:
                chunk = await asyncio.wait_for(reader.read(65536), wait)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        return received
    finally:
        writer.close()


def _split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {name.lower(): value for name, value in
               (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def _complete(raw: bytes) -> bool:
    if b"\r\n\r\n" not in raw:
        return False
    _, headers, rest = _split(raw)
    return len(rest) >= int(headers.get("content-length", "0"))


def _request(length: int, body: bytes) -> bytes:
    return (f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: k\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
            ).encode() + body


async def test_a_content_length_smaller_than_the_body_is_refused(
    base_url: str, upstream: FakeUpstream,
) -> None:
    """The server reads exactly Content-Length bytes: a too-small length cuts the JSON, which is
    refused as invalid JSON before any rule or script; the bytes left over are not a request
    (sent in the same segment, the HTTP layer refuses the whole exchange with its own 400)."""
    cut = len(RAW) - 5
    raw = await _exchange(base_url, _request(cut, RAW[:cut]))
    status, headers, rest = _split(raw)
    payload = json.loads(rest[: int(headers["content-length"])])
    assert status == 400
    opened = RAW.index(b'"Hello there')
    assert _invalid_request(payload) == (
        NOT_JSON + f"Unterminated string starting at: line 1 column {opened + 1} (char {opened})")
    assert upstream.requests[-1].raw_length == cut
    status, _, _ = _split(await _exchange(base_url, _request(cut, RAW)))
    assert status == 400
    assert upstream.counts["messages"] == 1  # the second exchange never reached a handler


async def test_a_content_length_larger_than_the_body_is_never_answered(
    base_url: str, upstream: FakeUpstream,
) -> None:
    """With fewer bytes than announced the server keeps waiting for the rest: nothing is
    answered, nothing reaches the handler."""
    assert await _exchange(base_url, _request(len(RAW) + 50, RAW), wait=0.5) == b""
    assert upstream.counts["messages"] == 0


NOT_JSON = "The request body is not valid JSON: "


@pytest.mark.parametrize(("raw", "detail"), [
    pytest.param(b'{"model": "m", "max_tokens": NaN, "messages": []}',
                 "Expecting value: line 1 column 30 (char 29)", id="NaN"),
    pytest.param(b'{"model": "m",\n "temperature": Infinity}',
                 "Expecting value: line 2 column 17 (char 31)", id="Infinity"),
    pytest.param(b'{"temperature": -Infinity, "model": "NaN"}',
                 "Expecting value: line 1 column 17 (char 16)", id="-Infinity"),
    pytest.param(b'{"model": "1e400", "top_p": 1e400}',
                 "Number out of range: line 1 column 29 (char 28)", id="1e400 overflows"),
    pytest.param(b'{"top_p": -2.5E+999}',
                 "Number out of range: line 1 column 11 (char 10)", id="-2.5E+999 overflows"),
    pytest.param(b'{"model": "ab\\ud83d"}',
                 "no low surrogate in string: line 1 column 14 (char 13)",
                 id="lone high surrogate"),
    pytest.param(b'{"model": "\\\\ud83d ok", "x": "\\udc00"}',
                 "no high surrogate in string: line 1 column 31 (char 30)",
                 id="lone low surrogate"),
    pytest.param(b"{not json", "Expecting property name enclosed in double quotes: line 1 "
                 "column 2 (char 1)", id="not JSON at all"),
    pytest.param('{"model": "é"}'.encode("utf-16"),
                 "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
                 id="UTF-16 is not UTF-8"),
    pytest.param(b"[" * 100_000, "nested too deeply", id="nested too deeply"),
])
async def test_only_strict_json_is_accepted(
    http: aiohttp.ClientSession, raw: bytes, detail: str,
) -> None:
    """Python's json.loads accepts NaN, ±Infinity, numbers that overflow to inf, lone
    surrogates and UTF-16; the provider accepts none of them. The prefix is the provider's
    (anthropics/claude-code#8272); the details after it are Python's or assumptions."""
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, payload = await _post(http, raw, path=path)
        assert status == 400
        assert _invalid_request(payload) == NOT_JSON + detail


async def test_strict_json_keeps_what_is_valid(
    http: aiohttp.ClientSession, upstream: FakeUpstream,
) -> None:
    """Surrogate pairs, escaped backslashes, big integers and large finite floats are JSON."""
    raw = (b'{"model": "claude-sonnet-4-5", "max_tokens": 8, "top_p": 1.5e300, '
           b'"metadata": {"n": 123456789012345678901234567890}, "messages": [{"role": "user", '
           b'"content": "smile \\ud83d\\ude00 and \\\\ud800 NaN Infinity"}]}')
    status, payload = await _post(http, raw)
    assert status == 200, payload
    assert upstream.requests[0].body["messages"][0]["content"] == (
        "smile \U0001f600 and \\ud800 NaN Infinity")
