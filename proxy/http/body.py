"""Reading, checking and re-serialising the JSON body of ``/v1/messages`` and ``count_tokens``.

The size limit holds for the declared length, the bytes as they arrive and the bytes decoded
from a ``Content-Encoding`` (decoded here: the server does not), so no body is held whole
past it. What is forwarded is plain, without ``Content-Encoding``.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import compression_utils as codecs
from aiohttp import web

from proxy.http.errors import RequestRejected

__all__ = ["SUPPORTED_ENCODINGS", "check_body", "check_objects", "decoded", "dump_body",
           "may_hold_lone_surrogates", "parse_body", "parse_json_object", "read_body",
           "replace_lone_surrogates"]


def _too_large(limit: int) -> RequestRejected:
    return RequestRejected(
        413, "request_too_large",
        f"request body is larger than the proxy's limit of {limit} bytes",
        reason="body_too_large",
    )


class _Overflow(Exception):
    pass


class _Undecodable(Exception):
    pass


@dataclass(slots=True)
class _ZlibDecoder:
    """``gzip`` (members may be concatenated) or ``deflate`` (zlib, or raw DEFLATE, told by
    its first byte)."""

    coding: str
    inflater: Any = None  # made on the first byte

    def _current(self, data: bytes) -> Any:
        inflater = self.inflater
        if inflater is None or inflater.eof:
            if inflater is not None and self.coding == "deflate":
                raise _Undecodable("data after the end of the compressed stream")
            if self.coding == "gzip":
                wbits = 16 + zlib.MAX_WBITS
            else:
                wbits = zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS
            inflater = self.inflater = zlib.decompressobj(wbits=wbits)
        return inflater

    def feed(self, data: bytes, budget: int) -> bytes:
        out = bytearray()
        while data:
            inflater = self._current(data)
            try:
                # At most one byte past the budget: enough to know it is exceeded.
                out += inflater.decompress(data, budget - len(out) + 1)
            except zlib.error as exc:
                raise _Undecodable(str(exc)) from None
            if len(out) > budget:
                raise _Overflow
            data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        return bytes(out)

    def finish(self) -> None:
        if self.inflater is not None and not self.inflater.eof:
            raise _Undecodable("the compressed data ends early")


@dataclass(slots=True)
class _AiohttpDecoder:
    """``br`` / ``zstd`` through aiohttp's own decompressors (when their libraries are there)."""

    decompressor: Any

    def feed(self, data: bytes, budget: int) -> bytes:
        decompressor = self.decompressor
        try:
            out = bytearray(decompressor.decompress_sync(data, budget + 1))
            while len(out) <= budget and decompressor.data_available:
                more = decompressor.decompress_sync(b"", budget - len(out) + 1)
                if not more:
                    break
                out += more
        except Exception as exc:  # noqa: BLE001 - each library has its own error class
            raise _Undecodable(type(exc).__name__) from None
        if len(out) > budget:
            raise _Overflow
        return bytes(out)

    def finish(self) -> None:
        """A truncated stream shows as JSON that ends early."""


#: Decodes one content coding incrementally (``feed``): :class:`_Overflow` past ``budget``
#: bytes, :class:`_Undecodable` for bad or (at ``finish``) incomplete data.
_BodyDecoder = _ZlibDecoder | _AiohttpDecoder


def _optional_decoders() -> dict[str, Callable[[], _BodyDecoder]]:
    found: dict[str, Callable[[], _BodyDecoder]] = {}
    if getattr(codecs, "HAS_BROTLI", False) and hasattr(codecs, "BrotliDecompressor"):
        found["br"] = lambda: _AiohttpDecoder(codecs.BrotliDecompressor())
    if getattr(codecs, "HAS_ZSTD", False) and hasattr(codecs, "ZSTDDecompressor"):
        found["zstd"] = lambda: _AiohttpDecoder(codecs.ZSTDDecompressor())
    return found


_DECODERS: Final[dict[str, Callable[[], _BodyDecoder]]] = {
    "gzip": lambda: _ZlibDecoder("gzip"),
    "x-gzip": lambda: _ZlibDecoder("gzip"),
    "deflate": lambda: _ZlibDecoder("deflate"),
    **_optional_decoders(),
}
#: The content codings a ``/v1/messages`` or ``count_tokens`` body may arrive in.
SUPPORTED_ENCODINGS: Final = ("identity", *_DECODERS)


def _decoder_for(values: Sequence[str]) -> tuple[str, _BodyDecoder] | None:
    """The decoder for a ``Content-Encoding`` (``None``: identity); 415 when unsupported."""
    if not values:
        return None
    label = ", ".join(values)
    codings = [c.strip().lower() for c in label.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) > 1:
        problem = "more than one coding is not supported"
    elif codings[0] not in _DECODERS:
        problem = "is not supported"
    else:
        return codings[0], _DECODERS[codings[0]]()
    raise RequestRejected(
        415, "invalid_request_error",
        f"Content-Encoding {label!r} {problem} (supported: {', '.join(SUPPORTED_ENCODINGS)})",
        reason="unsupported_encoding",
    )


def decoded(data: bytes, content_encoding: str, limit: int) -> bytes | None:
    """``data`` undone of its ``Content-Encoding``, or ``None`` when the coding is unknown,
    the data invalid or over ``limit`` bytes decoded (for reading the provider's answers)."""
    try:
        found = _decoder_for([content_encoding] if content_encoding else [])
    except RequestRejected:
        return None
    if found is None:
        return data if len(data) <= limit else None
    try:
        out = found[1].feed(data, limit)
        found[1].finish()
    except (_Overflow, _Undecodable):
        return None
    return out


def check_objects(raw: bytes, limit: int) -> None:
    """413 for a body of more than ``limit`` JSON objects (counted as ``{"`` and ``{}``
    before decoding: a million of them would hold the interpreter for seconds)."""
    if len(raw) < 2 * limit or raw.count(b"{") <= limit:
        return  # (an object takes two bytes; a brace is counted fastest, alone)
    objects = raw.count(b'{"') + raw.count(b"{}")
    if objects > limit:
        raise RequestRejected(
            413, "request_too_large",
            f"request body holds {objects} JSON objects, more than the proxy's limit of "
            f"{limit} (limits.max_json_objects)",
            reason="too_many_objects",
        )


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body, decoded from its ``Content-Encoding``; 413 past ``limit``
    bytes as sent or decoded, 415 for an unknown coding, 400 for data invalid in it."""
    decoding = _decoder_for(request.headers.getall("Content-Encoding", ()))
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = decoded = 0
    try:
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            if decoding is not None:
                chunk = decoding[1].feed(chunk, limit - decoded)
                decoded += len(chunk)
            chunks.append(chunk)
        if decoding is not None:
            decoding[1].finish()
    except _Overflow:
        raise _too_large(limit) from None
    except _Undecodable as exc:
        assert decoding is not None
        raise _invalid(f"request body is not valid {decoding[0]} data ({exc})",
                       "bad_encoding") from None
    return b"".join(chunks)


class _NotJSONConstant(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotJSONConstant(name)


def _invalid(message: str, reason: str) -> RequestRejected:
    return RequestRejected(400, "invalid_request_error", message, reason=reason)


@dataclass(slots=True, eq=False)
class _OutOfRange:
    """Stands in, while parsing, for a number no float or int holds (``1e400``, 5000 digits)."""

    text: str


def _number_parsers() -> tuple[list[_OutOfRange], Callable[[str], Any], Callable[[str], Any]]:
    found: list[_OutOfRange] = []

    def parse_float(text: str) -> Any:
        value = float(text)
        if math.isfinite(value):
            return value
        found.append(_OutOfRange(text))  # would be Infinity, which is not JSON
        return found[-1]

    def parse_int(text: str) -> Any:
        try:
            return int(text)
        except ValueError:  # longer than the interpreter converts (sys.int_info)
            found.append(_OutOfRange(text))
            return found[-1]

    return found, parse_float, parse_int


def _path_of(root: Any, target: object, what: str) -> str:
    """The dotted JSON path (``messages.3.content.1``) of ``target`` in ``root`` (iterative:
    the body may be as deep as the parser allows)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    while stack:
        value, path = stack.pop()
        if value is target:
            return ".".join(path) or what
        if isinstance(value, dict):
            stack.extend((item, (*path, str(key))) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, (*path, str(index))) for index, item in enumerate(value))
    return what  # pragma: no cover - the target came from this very parse


def _number_text(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def parse_json_object(raw: bytes, what: str = "request body") -> dict[str, Any]:
    """``raw`` as a JSON object, strictly (UTF-8, RFC 8259: no ``NaN``, no number out of a
    float's or int's range); else a 400 naming the problem and calling the body ``what``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"{what} is not valid UTF-8 (byte {exc.start})", "bad_json") from None
    out_of_range, parse_float, parse_int = _number_parsers()
    try:
        body = json.loads(text, parse_constant=_reject_constant, parse_float=parse_float,
                          parse_int=parse_int)
    except _NotJSONConstant as exc:
        raise _invalid(f"{what} is not valid JSON: {exc} is not a JSON value",
                       "bad_json") from None
    except json.JSONDecodeError as exc:
        raise _invalid(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            "bad_json",
        ) from None
    except RecursionError:
        raise _invalid(f"{what} is not valid JSON: nested too deeply", "bad_json") from None
    if out_of_range:
        first = out_of_range[0]
        raise _invalid(f"{_path_of(body, first, what)}: number {_number_text(first.text)} "
                       "is out of range", "number_out_of_range")
    if not isinstance(body, dict):
        raise _invalid(f"{what} must be a JSON object, got {_json_type(body)}", "body_not_object")
    return body


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, checked (:func:`check_body`); else a 400."""
    return check_body(parse_json_object(raw))


def check_body(body: dict[str, Any]) -> dict[str, Any]:
    """``body``, checked: ``messages`` a list of objects, ``system`` a string or a list."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        problem = ("is missing" if "messages" not in body
                   else f"must be a list, got {_json_type(messages)}")
        raise _invalid(f"messages: {problem}", "messages_not_list")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise _invalid(
            f"system: must be a string or an array of text blocks, got {_json_type(system)}",
            "system_invalid",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(
                f"messages.{index}: must be an object, got {_json_type(message)}",
                "message_not_object",
            )
    return body


_JSON_TYPES: Final = ((type(None), "null"), (bool, "a boolean"), ((int, float), "a number"),
                      (str, "a string"), (list, "an array"))


def _json_type(value: object) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "an object")


def dump_body(body: dict[str, Any]) -> bytes:
    """The body as compact UTF-8 JSON (ValueError for a NaN or an infinity)."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate arrived as a \uXXXX escape; only an escape can carry it back out.
        return json.dumps(body, ensure_ascii=True, separators=(",", ":"),
                          allow_nan=False).encode("ascii")


# A lone UTF-16 surrogate (half an emoji) arrives as an escape; the provider refuses a body
# holding one, and an agent cannot mend its own history.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# A surrogate escape (``\\uD800``-``\\uDFFF``); whether it is paired is checked around it.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD]([89a-fA-F])[0-9a-fA-F]{2}")
_HIGH: Final = frozenset(b"89abAB")
_OPAQUE_BLOCKS: Final = frozenset({"thinking", "redacted_thinking"})
REPLACEMENT: Final = "\ufffd"


def may_hold_lone_surrogates(raw: bytes) -> bool:
    """Whether the raw body has an unpaired surrogate escape (a byte search)."""
    paired_low = -1  # where the low half of the last pair found starts
    for found in _SURROGATE_ESCAPE.finditer(raw):
        start = found.start()
        if start == paired_low:
            continue
        if found.group(1)[0] not in _HIGH:
            return True  # a low half with no high half before it
        after = _SURROGATE_ESCAPE.match(raw, found.end())
        if after is None or after.group(1)[0] in _HIGH:
            return True  # a high half with no low half after it
        paired_low = after.start()
    return False


def replace_lone_surrogates(body: dict[str, Any]) -> int:
    """Replace every lone surrogate in ``body``'s strings by U+FFFD, in place; how many.
    Signed thinking blocks are left as they are (the provider checks them byte for byte)."""
    replaced = 0

    def mend(text: str) -> str:
        nonlocal replaced
        mended, count = _SURROGATE.subn(REPLACEMENT, text)
        replaced += count
        return mended

    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if value.get("type") in _OPAQUE_BLOCKS:
                continue
            for key in list(value):
                item = value[key]
                if isinstance(item, str):
                    value[key] = mend(item)
                else:
                    stack.append(item)
                if _SURROGATE.search(key):
                    value[mend(key)] = value.pop(key)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, str):
                    value[index] = mend(item)
                else:
                    stack.append(item)
    return replaced
