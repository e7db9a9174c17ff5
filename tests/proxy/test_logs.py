"""The log redaction processor: allow-list, credential patterns, configured secrets."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.logs import Redactor


def redact(event: dict[str, Any], secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the redactor on one event dict."""
    return dict(Redactor(secrets)(None, "info", dict(event)))


def test_unknown_fields_are_dropped_and_named() -> None:
    """A field outside the allow-list never reaches the output; its name is listed."""
    out = redact({"event": "x", "session_id": "s", "messages": [{"content": "secret"}],
                  "prompt": "secret text"})
    assert out == {"event": "x", "session_id": "s", "redacted": ["messages", "prompt"]}


@pytest.mark.parametrize("value", [
    "sk-ant-api03-abcdefgh", "Bearer abcdefgh12345", "x-api-key: abc",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig",
])
def test_credential_looking_values_are_blanked(value: str) -> None:
    """A safe field whose value looks like a credential is replaced."""
    assert redact({"event": "x", "detail": f"failed with {value}"})["detail"] == "[redacted]"


def test_configured_secrets_are_blanked_everywhere() -> None:
    """An exact secret (the admin token) is blanked even inside a list."""
    out = redact({"event": "x", "layers": ["L1", "tok-123"], "reason": "tok-123!"},
                 secrets=("tok-123",))
    assert out["layers"] == ["L1", "[redacted]"]
    assert out["reason"] == "[redacted]"


def test_nested_values_are_dropped_and_long_strings_cut() -> None:
    """Only scalars and lists of scalars pass; strings are capped."""
    out = redact({"event": "x", "detail": "y" * 1000, "layers": [{"a": 1}]})
    assert len(out["detail"]) < 300
    assert "layers" not in out and out["redacted"] == ["layers"]


def test_exception_info_becomes_the_class_name_only() -> None:
    """``exc_info`` is replaced by ``error_class``; no traceback text survives."""
    try:
        raise KeyError("message text")
    except KeyError as exc:
        out = redact({"event": "x", "exc_info": (type(exc), exc, exc.__traceback__)})
    assert out == {"event": "x", "error_class": "KeyError"}
