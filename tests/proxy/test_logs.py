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


def _raise_key_error() -> None:
    raise KeyError("message text")


@pytest.mark.parametrize("form", ["tuple", "exception"])
def test_exception_info_becomes_the_class_and_the_frames_only(form: str) -> None:
    """``exc_info`` becomes ``error_class`` and ``traceback`` (``file:line in function``
    for every frame, then the class): where it failed, never what the exception said."""
    try:
        try:
            _raise_key_error()
        except KeyError:
            raise ValueError("more message text") from None
    except ValueError as exc:
        info: object = (type(exc), exc, exc.__traceback__) if form == "tuple" else exc
        out = redact({"event": "x", "exc_info": info})
    assert set(out) == {"event", "error_class", "traceback"}
    assert out["error_class"] == "ValueError"
    frames = out["traceback"]
    assert frames[-1] == "ValueError"
    assert any(f.startswith("proxy/test_logs.py:") and f.endswith(" in "
               "test_exception_info_becomes_the_class_and_the_frames_only") for f in frames)
    assert "message text" not in repr(out)


def test_a_chained_exception_shows_its_cause_frames_first() -> None:
    """``raise ... from exc``: the cause's frames and class, then the exception's."""
    try:
        try:
            _raise_key_error()
        except KeyError as cause:
            raise ValueError("more message text") from cause
    except ValueError as exc:
        out = redact({"event": "x", "exc_info": exc})
    frames = out["traceback"]
    assert frames.index("KeyError") < frames.index("ValueError") == len(frames) - 1
    assert any(f.endswith(" in _raise_key_error") for f in frames)
    assert "message text" not in repr(out)
