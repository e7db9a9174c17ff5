"""Content fingerprints: fast ones for this process, stable ones for the store.

Both ignore ``cache_control`` fields: clients move their cache breakpoints to the newest
messages on every turn, and a marker is neither content nor tokens.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

__all__: list[str] = []

# Python's string and bytes hashes are salted per process: a fingerprint is only comparable
# within the processes that share the salt. This value differs between two processes exactly
# when the salt does, or when they make fingerprints differently (the text names the way).
PROCESS_SALT = hash("compact-proxy-fingerprint-salt; objects as msgspec JSON")

_ENCODE = msgspec.json.Encoder().encode
#: What the encoder raises for a value that is not JSON (or a string it cannot write).
_NOT_JSON = (TypeError, ValueError, OverflowError, UnicodeEncodeError, RecursionError)


def fingerprint(value: object) -> int:
    """A 64-bit fingerprint of a JSON value, from Python's own per-process hashes.

    An object (a message, a block) is hashed as its compact JSON bytes, written by one C
    encoder with the keys in their order; a ``cache_control`` field anywhere in it is left
    out first (only when its name appears in those bytes at all, or they cannot be written).
    What the encoder refuses even then (a lone surrogate, a value that is not JSON) is hashed
    part by part; values the wire cannot tell apart (a tuple and a list) may hash alike. A
    string is its own hash: computed once per string object. Collisions are possible in
    principle (2^-64 per pair); this fingerprint keys token counts and, within one process
    (or the workers forked from one), the sticky-prefix match.
    """
    if type(value) is dict:
        try:
            encoded: bytes | None = _ENCODE(value)
        except _NOT_JSON:
            encoded = None  # (it may be in a marker: tried again without them)
        if encoded is None or b'"cache_control"' in encoded:
            try:
                encoded = _ENCODE(strip_cache_control(value))
            except _NOT_JSON:
                return _walked(value)
        return hash(encoded)
    return _walked(value)


def _walked(value: object) -> int:
    """The fingerprint of a value the encoder does not take (and of strings, lists and
    scalars): its parts' fingerprints hashed together."""
    if isinstance(value, str):
        return hash(value)
    if isinstance(value, dict):
        return hash(tuple((k, fingerprint(v)) for k, v in value.items() if k != "cache_control"))
    if isinstance(value, list):
        return hash((len(value), *map(fingerprint, value)))
    return hash((type(value).__name__, value))


def strip_cache_control(value: Any) -> Any:
    """A copy of ``value`` without any ``cache_control`` field, at any depth."""
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def stable_digest(value: object) -> str:
    """A digest of a JSON value that is the same in every process."""
    canonical = json.dumps(strip_cache_control(value), sort_keys=True, ensure_ascii=False,
                           separators=(",", ":"), default=str)
    return hashlib.blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
