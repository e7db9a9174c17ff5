"""What the fake provider does with the raw request bytes before any rule: undo the
``Content-Encoding`` and parse strict JSON.

The server reads the body exactly as it came off the wire (aiohttp's request decompression is
off, see ``server.start_fake_upstream``), so a body that disagrees with its headers is seen:

* ``Content-Encoding`` lists the codings applied, in order; they are undone last one first.
  ``identity`` (or no header) is the bytes as they are; ``gzip`` / ``x-gzip`` (several members
  allowed), ``deflate`` (zlib-wrapped or raw), ``br`` when a brotli module is importable and
  ``zstd`` when a zstd one is (``compression.zstd``, ``backports.zstd`` or ``zstandard``; the
  project depends on brotli and backports.zstd). Bytes that do not decode as labelled are a
  400, an encoding outside that list a 415 (both texts are assumptions: no real sample was
  found).
* The decoded body may not exceed the same 32 MiB as the wire body (413, the edge's text); every
  decoder stops at that size (except brotlicffi's and the zstandard package's, which have no
  output limit), so a small bomb never inflates whole.
* ``Content-Length`` is honoured by the HTTP layer itself: exactly that many bytes are read, so a
  too-small length cuts the JSON (refused below) and a too-large one is never answered.
* JSON is strict RFC 8259 in UTF-8: no BOM, no ``NaN`` / ``Infinity`` / ``-Infinity``, no number
  that overflows a double, no lone UTF-16 surrogate escape. Python's ``json`` accepts all of
  these, the provider none. The error text starts with the provider's
  ``The request body is not valid JSON: `` (anthropics/claude-code#8272) and goes on with
  Python's decoder message and position (the provider's own decoder reads like it, e.g.
  ``no low surrogate in string: line 1 column 37589 (char 37588)``).

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import zlib
from collections.abc import Callable, Iterable
from typing import Any, Final

from .rules import ProviderRuleError

__all__ = [
    "MAX_BODY_BYTES",
    "MSG_TOO_LARGE",
    "decode_content",
    "parse_json_strict",
    "supported_encodings",
    "too_large",
]

# The provider refuses bodies over 32 MB with 413 request_too_large (reference §1, §5.6).
MAX_BODY_BYTES: Final = 32 * 1024 * 1024
# The edge's own words (anthropics/anthropic-sdk-python#938, anthropics/claude-code#14567).
MSG_TOO_LARGE: Final = "Request exceeds the maximum size"
MSG_INVALID_JSON: Final = "The request body is not valid JSON: {detail}"
# Assumptions: no real sample of these two was found.
MSG_UNDECODABLE: Final = (
    "The request body could not be decoded with its Content-Encoding `{encoding}`."
)
MSG_UNSUPPORTED_ENCODING: Final = (
    "Unsupported Content-Encoding `{encoding}`. Supported encodings: {supported}."
)
UNSUPPORTED_ENCODING_STATUS: Final = 415
IDENTITY: Final = "identity"
GZIP_NAMES: Final = ("gzip", "x-gzip")
DEFLATE: Final = "deflate"
# Modules that decode ``br`` and ``zstd``, tried in order; the codings are offered only when one
# is importable.
BROTLI_MODULES: Final = ("brotli", "brotlicffi")
ZSTD_MODULES: Final = ("compression.zstd", "backports.zstd", "zstandard")

_Decoder = Callable[[bytes], bytes]


class _Undecodable(Exception):
    """The bytes are not valid data of the coding they are labelled with."""


class _TooLarge(Exception):
    """The decoded body would exceed :data:`MAX_BODY_BYTES`."""


def too_large() -> ProviderRuleError:
    """The 413 of a body over the limit."""
    return ProviderRuleError(MSG_TOO_LARGE, 413, "request_too_large")


# -- Content-Encoding ---------------------------------------------------------------------------


def _inflate(data: bytes, wbits: int, *, members: bool) -> bytes:
    """Inflate ``data`` completely (every member when ``members``), at most the body limit."""
    out = bytearray()
    rest = data
    while True:
        inflater = zlib.decompressobj(wbits=wbits)
        try:
            out += inflater.decompress(rest, MAX_BODY_BYTES + 1 - len(out))
        except zlib.error:
            raise _Undecodable from None
        if inflater.unconsumed_tail or len(out) > MAX_BODY_BYTES:
            raise _TooLarge
        if not inflater.eof:
            raise _Undecodable  # truncated
        rest = inflater.unused_data
        if not rest:
            return bytes(out)
        if not members:
            raise _Undecodable  # bytes after the end of the stream


def _gunzip(data: bytes) -> bytes:
    return _inflate(data, 16 + zlib.MAX_WBITS, members=True)


def _deflate(data: bytes) -> bytes:
    # RFC 9110 "deflate" is the zlib format; some clients send raw deflate, which servers
    # commonly accept as well.
    try:
        return _inflate(data, zlib.MAX_WBITS, members=False)
    except _Undecodable:
        return _inflate(data, -zlib.MAX_WBITS, members=False)


def _module(names: Iterable[str]) -> Any:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _brotli_decoder(module: Any) -> _Decoder:
    def decode(data: bytes) -> bytes:
        inflater = module.Decompressor()
        limit = MAX_BODY_BYTES + 1
        try:
            out = bytearray(inflater.process(data, output_buffer_limit=limit))
        except TypeError:  # brotlicffi and brotli < 1.2: no output limit, decode whole
            return bytes(module.decompress(data))
        while not inflater.is_finished() and len(out) <= MAX_BODY_BYTES:
            more = inflater.process(b"", output_buffer_limit=limit)
            if not more:
                break
            out += more
        if len(out) > MAX_BODY_BYTES:
            raise _TooLarge
        if not inflater.is_finished():
            raise _Undecodable  # truncated
        return bytes(out)
    return decode


def _zstd_decoder(module: Any) -> _Decoder:
    if not hasattr(module.ZstdDecompressor(), "eof"):  # the zstandard package: no limit
        def whole(data: bytes) -> bytes:
            return bytes(module.ZstdDecompressor().decompressobj().decompress(data))
        return whole

    def decode(data: bytes) -> bytes:  # compression.zstd (3.14) and its backport: every frame
        out, rest = bytearray(), data
        while rest:
            inflater = module.ZstdDecompressor()
            out += inflater.decompress(rest, max_length=MAX_BODY_BYTES + 1 - len(out))
            if len(out) > MAX_BODY_BYTES or not (inflater.eof or inflater.needs_input):
                raise _TooLarge
            if not inflater.eof:
                raise _Undecodable  # truncated
            rest = inflater.unused_data
        return bytes(out)
    return decode


def _decoders() -> dict[str, _Decoder]:
    decoders: dict[str, _Decoder] = {name: _gunzip for name in GZIP_NAMES}
    decoders[DEFLATE] = _deflate
    brotli, zstd = _module(BROTLI_MODULES), _module(ZSTD_MODULES)
    if brotli is not None:
        decoders["br"] = _brotli_decoder(brotli)
    if zstd is not None:
        decoders["zstd"] = _zstd_decoder(zstd)
    return decoders


_DECODERS: Final = _decoders()


def supported_encodings() -> tuple[str, ...]:
    """Every ``Content-Encoding`` coding the fake decodes, ``identity`` first."""
    return (IDENTITY, *_DECODERS)


def _codings(header_values: Iterable[str]) -> list[str]:
    return [coding.strip().lower() for value in header_values for coding in value.split(",")
            if coding.strip()]


def decode_content(raw: bytes, header_values: Iterable[str]) -> bytes:
    """The body ``raw`` with its ``Content-Encoding`` (all header values, in order) undone.

    An empty body stays empty whatever its label.

    Raises:
        ProviderRuleError: 415 for a coding the fake does not know, 400 for bytes that do not
            decode as labelled, 413 when the decoded body exceeds :data:`MAX_BODY_BYTES`.
    """
    codings = _codings(header_values)
    for coding in codings:
        if coding != IDENTITY and coding not in _DECODERS:
            raise ProviderRuleError(MSG_UNSUPPORTED_ENCODING.format(
                encoding=coding, supported=", ".join(supported_encodings())),
                UNSUPPORTED_ENCODING_STATUS)
    data = raw
    for coding in reversed(codings):
        if coding == IDENTITY or not data:
            continue
        try:
            data = _DECODERS[coding](data)
        except _TooLarge:
            raise too_large() from None
        except Exception:  # every library's own error type: the bytes are not that coding
            raise ProviderRuleError(MSG_UNDECODABLE.format(encoding=coding)) from None
        if len(data) > MAX_BODY_BYTES:
            raise too_large()
    return data


# -- strict JSON ----------------------------------------------------------------------------------

# One JSON token of interest at a time, strings first so nothing inside a string matches.
_TOKENS: Final = re.compile(
    r'(?P<string>"(?:[^"\\]|\\.)*")'
    r"|(?P<constant>-?Infinity|NaN)"
    r"|(?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)",
    re.DOTALL,
)
_ESCAPE: Final = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class _NotStrict(Exception):
    """The text uses a JSON extension Python accepts and the provider does not."""


def _position(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return f"line {line} column {column} (char {pos})"


def _invalid(detail: str) -> ProviderRuleError:
    return ProviderRuleError(MSG_INVALID_JSON.format(detail=detail))


def _lone_surrogate(token: str) -> tuple[int, str] | None:
    """Where a string token has an unpaired surrogate escape, and which half is missing."""
    escapes = list(_ESCAPE.finditer(token))
    k = 0
    while k < len(escapes):
        hex_unit = escapes[k].group(1)
        unit = int(hex_unit, 16) if hex_unit else -1
        if 0xD800 <= unit <= 0xDBFF:
            after = escapes[k + 1] if k + 1 < len(escapes) else None
            low = int(after.group(1), 16) if after is not None and after.group(1) else -1
            if after is None or after.start() != escapes[k].end() or not 0xDC00 <= low <= 0xDFFF:
                return escapes[k].start(), "no low surrogate in string"
            k += 2
            continue
        if 0xDC00 <= unit <= 0xDFFF:
            return escapes[k].start(), "no high surrogate in string"
        k += 1
    return None


def _first_extension(text: str) -> str:
    """The provider's detail for the first non-strict token of ``text`` (which Python parsed)."""
    for match in _TOKENS.finditer(text):
        if match.group("constant") is not None:
            return f"Expecting value: {_position(text, match.start())}"
        number = match.group("number")
        if number is not None and not math.isfinite(float(number)):
            return f"Number out of range: {_position(text, match.start())}"
        token = match.group("string")
        if token is not None and _SURROGATE_ESCAPE.search(token):
            found = _lone_surrogate(token)
            if found is not None:
                offset, detail = found
                return f"{detail}: {_position(text, match.start() + offset)}"
    return "not strict JSON"  # unreachable when the caller saw an extension


def _reject_constant(name: str) -> Any:
    raise _NotStrict(name)


def _strict_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotStrict(literal)
    return value


def parse_json_strict(data: bytes) -> Any:
    """``data`` parsed as strict JSON in UTF-8.

    Raises:
        ProviderRuleError: 400 ``The request body is not valid JSON: …`` for anything else.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(str(exc)) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_strict_float)
    except _NotStrict:
        raise _invalid(_first_extension(text)) from None
    except RecursionError:
        raise _invalid("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past Python's digit limit
        raise _invalid(str(exc)) from None
    if _SURROGATE_ESCAPE.search(text):
        detail = _first_extension(text)
        if detail != "not strict JSON":
            raise _invalid(detail)
    return value
