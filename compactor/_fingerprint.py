"""Content fingerprints: the same for the same content in every process.

The 64-bit xxh3 hash of the value's canonical JSON (``msgspec``, keys sorted, so a message
rebuilt in another key order matches), every ``cache_control`` field left out (clients move
their breakpoints every turn). It depends on the content alone, not on salted string hashes,
so replicas and restarted processes agree: it keys token counts, calibration and checkpoints.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
import xxhash

_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_MARKER: Final = b'"cache_control"'
# Leads the bytes of a value msgspec cannot write (a lone surrogate, a non-JSON object): no
# JSON text starts with it, so such a value never shares its bytes with one that is JSON.
_OTHER: Final = b"\x00"


def fingerprint(value: object) -> int:
    """An unsigned 64-bit fingerprint of a JSON value, ``cache_control`` ignored at any
    depth."""
    try:
        data = _ENCODER.encode(value)
    except (TypeError, ValueError):  # (UnicodeEncodeError is a ValueError)
        data = _MARKER  # (perhaps only a marker is not JSON: see without them)
    if _MARKER in data:  # (only a marked value, or a text quoting the key, is copied)
        data = _canonical(strip_cache_control(value))
    return xxhash.xxh3_64_intdigest(data)


def _canonical(value: object) -> bytes:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError):
        return _OTHER + _fallback(value)


def _fallback(value: object) -> bytes:
    """Canonical bytes of what msgspec refuses: ASCII JSON (lone surrogates escaped), other
    objects by their type and ``repr``."""
    def other(found: object) -> str:
        return f"{type(found).__qualname__}:{found!r}"

    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=other)
    except TypeError:  # (keys of several types cannot be sorted)
        text = json.dumps(value, separators=(",", ":"), default=other)
    return text.encode("ascii")


def strip_cache_control(value: Any) -> Any:
    """A copy of ``value`` without any ``cache_control`` field, at any depth."""
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value
