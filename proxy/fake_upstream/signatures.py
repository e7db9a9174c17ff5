"""The fake provider's own thinking signatures: what it signs, and how it tells an edit.

The real provider signs every ``thinking`` block it returns (``signature``) and encrypts every
``redacted_thinking`` block (``data``); both are opaque to clients, and a request whose latest
assistant message carries an edited one is refused (reference §5.4). The fake cannot check real
signatures, but it can check its own: every thinking block it produces carries

* ``signature = "fakesig." + hex(HMAC-SHA256(FAKE_KEY, "thinking\\0" + thinking))``, and every
  redacted block it produces carries
* ``data = "fakeredacted." + base64url(payload) + "." + hex(HMAC-SHA256(FAKE_KEY,
  "redacted\\0" + payload))``.

A value that starts with one of these prefixes is *fake-format* and is verified; any other value
(a real corpus signature, a hand-written test signature) is opaque and accepted. The key is a
fixed constant and values are compared with ``==``: this is an offline test double, not a
security boundary.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "FAKE_REDACTED_PREFIX",
    "FAKE_SIGNATURE_PREFIX",
    "block_intact",
    "redacted_data",
    "sign_thinking",
]

FAKE_KEY: Final = b"compact-proxy fake upstream thinking key"
FAKE_SIGNATURE_PREFIX: Final = "fakesig."
FAKE_REDACTED_PREFIX: Final = "fakeredacted."


def _mac(kind: str, text: str) -> str:
    message = kind.encode() + b"\0" + text.encode("utf-8", "surrogatepass")
    return hmac.new(FAKE_KEY, message, hashlib.sha256).hexdigest()


def sign_thinking(thinking: str) -> str:
    """The fake's signature of a ``thinking`` block holding ``thinking``."""
    return FAKE_SIGNATURE_PREFIX + _mac("thinking", thinking)


def redacted_data(payload: str) -> str:
    """The fake's ``data`` of a ``redacted_thinking`` block hiding ``payload``."""
    encoded = base64.urlsafe_b64encode(payload.encode("utf-8", "surrogatepass")).decode()
    return f"{FAKE_REDACTED_PREFIX}{encoded}.{_mac('redacted', payload)}"


def _redacted_intact(data: str) -> bool:
    encoded, dot, mac = data.removeprefix(FAKE_REDACTED_PREFIX).rpartition(".")
    if not dot:
        return False
    try:
        payload = base64.urlsafe_b64decode(encoded.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        return False
    return mac == _mac("redacted", payload)


def block_intact(block: Mapping[str, Any]) -> bool:
    """Whether a ``thinking`` / ``redacted_thinking`` block is as the fake produced it.

    True for a fake-format block that verifies and for every block whose signature or data is
    not in the fake's format (opaque: the fake cannot judge it); False for a fake-format block
    whose text, signature or data was changed.
    """
    if block.get("type") == "thinking":
        signature, thinking = block.get("signature"), block.get("thinking")
        if not isinstance(signature, str) or not signature.startswith(FAKE_SIGNATURE_PREFIX):
            return True
        return isinstance(thinking, str) and signature == sign_thinking(thinking)
    if block.get("type") == "redacted_thinking":
        data = block.get("data")
        if not isinstance(data, str) or not data.startswith(FAKE_REDACTED_PREFIX):
            return True
        return _redacted_intact(data)
    return True
