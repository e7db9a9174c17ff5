"""The log redaction processor: allow-list, credential patterns, configured secrets."""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import structlog
from hypothesis import example, given
from hypothesis import strategies as st

from proxy.config import LoggingConfig
from proxy.telemetry.logs import (
    Redactor,
    bind_request_fields,
    configure_logging,
    reset_logging,
    start_request_fields,
)
from proxy.telemetry.redaction import _CREDENTIAL, _may_hold_credential


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


def test_a_remembered_value_is_cleaned_as_the_first_time() -> None:
    """The cleaned form of a short string is remembered: a credential stays blanked, a plain
    value stays itself, on every line, and the memory stays bounded."""
    redactor = Redactor(("tok-123",))
    for _ in range(3):
        out = redactor(None, "info", {"event": "x", "detail": "Bearer abcdefgh12345",
                                      "reason": "tok-123", "route": "messages"})
        assert out == {"event": "x", "detail": "[redacted]", "reason": "[redacted]",
                       "route": "messages"}
    for number in range(10_000):
        redactor(None, "info", {"event": "x", "session_id": f"s-{number}"})
    assert len(redactor._cleaned) <= 4096


def test_trusted_fields_are_kept_as_the_chain_set_them() -> None:
    """``level`` and ``timestamp`` (set by add_log_level and the stamper) skip the string
    tests; a trusted name outside the allow-list is still dropped."""
    redactor = Redactor(trusted=frozenset({"timestamp", "prompt"}))
    out = redactor(None, "info", {"timestamp": "2026-12-03T15:00:00.123456Z", "event": "x",
                                  "prompt": "text"})
    assert out == {"timestamp": "2026-12-03T15:00:00.123456Z", "event": "x",
                   "redacted": ["prompt"]}


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
    assert any(f.startswith("telemetry/test_logs.py:") and f.endswith(" in "
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


# Credentials of every form the pattern knows, their pieces, the words around them, and text
# that is none of them.
_PIECES = ["sk-ant-api03-abcd", "sk-0123456789abcdef", "Bearer abcdefgh", "basic abcdefgh",
           "eyJhbGciOiJI.UzI1NiJ9x", "api_key=1", "Secret: x", "PASSWORD =x", "ſecret:x",
           "sk-", "sk-ant-", "Bearer", "Basic", "eyJ", "api_key", "API-KEY", "Auth-Token",
           "secret", "x-api-key", "\u212aey", "=", ":", " ", "\t", ".", "-", "_", "abcdefgh",
           "0123456789abcdef", "2026-12-03T13:13:04.123456Z", "é", "\n"]


def _missed(value: str) -> bool:
    return _CREDENTIAL.search(value) is not None and not _may_hold_credential(value)


def test_the_cheap_credential_test_misses_no_credential() -> None:
    """``_may_hold_credential`` is a necessary condition for a :data:`_CREDENTIAL` match: a
    string it lets through unsearched holds nothing the pattern would find."""
    assert all(_CREDENTIAL.search(piece) for piece in _PIECES[:9])
    assert [piece for piece in _PIECES if _missed(piece)] == []


@given(st.one_of(st.text(), st.lists(st.sampled_from(_PIECES)).map("".join)))
def test_the_cheap_credential_test_misses_no_credential_in_any_text(value: str) -> None:
    """The same for any text, and any mix of those pieces."""
    assert not _missed(value)


class _Count(int):
    pass


@pytest.mark.parametrize("value", [None, True, 0, -3, 2**70, 1.5, float("nan"), _Count(4)])
def test_values_without_text_pass_as_they_are(value: object) -> None:
    """None, bools, ints (and their subclasses) and floats are kept unchanged."""
    out = redact({"event": "x", "status": value})
    assert out["status"] is value


@pytest.mark.parametrize("fields", [
    {"status": 200, "duration_ms": 2.5, "layers": ["L1", "L2"], "outcome": "forwarded",
     "summary_enabled": True},
    {"status": None, "layers": [1, None, 2.5], "estimate_error": float("nan")},
    {"detail": "caf\u00e9 \u2028 \U0001f600", "reason": "tab\there \"quoted\" \\"},
    {"detail": "a\x00b\x7f", "hard_limit": 2**70, "estimate_error": float("-inf")},
])
def test_a_json_line_holds_the_values_json_dumps_would_write(fields: dict[str, Any]) -> None:
    """Whichever encoder writes it, a line is one ASCII JSON object holding exactly what
    ``json.dumps`` of the redacted event holds (a NaN stays a NaN, not a null)."""
    stream = io.StringIO()
    configure_logging(LoggingConfig(format="json", level="info"), stream=stream)
    try:
        structlog.get_logger("test").info("line", **fields)
    finally:
        reset_logging()
    [line] = stream.getvalue().splitlines()
    assert line.isascii()
    parsed = json.loads(line)
    # Compact whichever encoder wrote it: every line of a log alike for grep.
    assert line == json.dumps(parsed, separators=(",", ":"))
    expected = json.loads(json.dumps({"level": "info", "event": "line", **fields}))
    assert list(parsed)[:3] == ["timestamp", "level", "event"]
    del parsed["timestamp"]
    assert json.dumps(parsed, sort_keys=True) == json.dumps(expected, sort_keys=True)


def _lines(run: Any) -> list[dict[str, Any]]:
    stream = io.StringIO()
    configure_logging(LoggingConfig(format="json", level="info"), stream=stream)
    try:
        run(structlog.get_logger("test"))
    finally:
        reset_logging()
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_request_s_fields_are_on_its_lines_and_a_line_s_own_field_wins() -> None:
    """The request's fields are added after the line's own (the framing first), a field
    the line sets itself is not replaced, and a later bind adds to the same request."""
    async def serve(log: Any) -> None:
        start_request_fields(request_id="req-1", session_id=None)
        log.info("first")
        bind_request_fields(session_id="sess-1", tenant="none")
        log.info("second", tenant="t1", status=200)

    first, second = _lines(lambda log: asyncio.run(serve(log)))
    assert list(first) == ["timestamp", "level", "event", "request_id", "session_id"]
    assert (first["request_id"], first["session_id"]) == ("req-1", None)
    assert list(second)[3:] == ["tenant", "status", "request_id", "session_id"]
    assert (second["session_id"], second["tenant"]) == ("sess-1", "t1")


def test_a_new_request_keeps_nothing_of_the_one_before_but_its_tasks_keep_theirs() -> None:
    """Requests served one after another in the same task (a keep-alive connection): the
    second's lines carry none of the first's fields. A task the first request started
    keeps the first's fields, whatever the second binds."""
    async def serve(log: Any) -> None:
        start_request_fields(request_id="req-1", session_id=None)
        bind_request_fields(session_id="sess-1", tenant="t1")
        go_on = asyncio.Event()

        async def background() -> None:
            await go_on.wait()
            log.info("background")

        task = asyncio.create_task(background())
        await asyncio.sleep(0)
        start_request_fields(request_id="req-2", session_id=None)
        bind_request_fields(tenant="t2")
        log.info("next")
        go_on.set()
        await task

    by_event = {line["event"]: line for line in _lines(lambda log: asyncio.run(serve(log)))}
    assert {k: by_event["next"][k] for k in ("request_id", "session_id", "tenant")} == {
        "request_id": "req-2", "session_id": None, "tenant": "t2"}
    assert {k: by_event["background"][k] for k in ("request_id", "session_id", "tenant")} == {
        "request_id": "req-1", "session_id": "sess-1", "tenant": "t1"}


@given(st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-3))])))
@example(datetime(2026, 12, 4, 16, 0, 0, 0, tzinfo=UTC))
@example(datetime(2026, 12, 4, 16, 0, 0, 120, tzinfo=UTC))
def test_a_line_s_timestamp_is_structlog_s_iso_utc_text(when: datetime) -> None:
    """The proxy's stamper writes what structlog's TimeStamper(fmt="iso", utc=True) writes:
    ``isoformat()`` of the UTC time with ``Z`` for ``+00:00``."""
    from proxy.telemetry.logs import utc_text

    assert utc_text(when) == when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def test_a_line_is_stamped_now_in_utc() -> None:
    lines = _lines(lambda log: log.info("tick"))
    stamped = datetime.fromisoformat(lines[0]["timestamp"])
    assert stamped.tzinfo is not None and stamped.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - stamped).total_seconds()) < 5


def _written(fmt: str, final: bool, run: Any, **kw: Any) -> list[str]:
    """The lines ``run(logger)`` writes under ``configure_logging(..., **kw)``, timestamps
    blanked (two lines written one after the other differ only there)."""
    stream = io.StringIO()
    configure_logging(LoggingConfig(format=fmt, level="info"), stream=stream, final=final, **kw)
    try:
        run(structlog.get_logger("test"))
    finally:
        reset_logging()
        start_request_fields()  # (this thread's lines carry no request's fields after it)
    return [re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<now>", line)
            for line in stream.getvalue().splitlines()]


_REQUEST_LINE = {
    "route": "messages", "method": "POST", "status": 200, "role": "main",
    "session_id": "sess-1", "tenant": "none", "tokens_before": None, "tokens_after": 12,
    "layers": ["L1", "tok-123"], "upstream_status": 200, "estimate_error": float("nan"),
    "outcome": "forwarded", "duration_ms": 0.5, "reason": "sk-ant-api03-abcdefgh",
    "detail": "caf\u00e9", "prompt": "never written",
}


@pytest.mark.parametrize("final", [False, True])
def test_the_request_line_is_framed_redacted_and_ordered(final: bool) -> None:
    """The request middleware's line (structlog's logger, the configured chain): request
    and process fields, a NaN, text outside ASCII, secrets blanked, a field outside the
    allow-list dropped and named, the framing fields first."""
    def run(log: Any) -> None:
        start_request_fields(request_id="req-1", session_id=None)
        bind_request_fields(session_id="sess-0", tenant="t1")
        log.info("request_completed", **_REQUEST_LINE)

    [written] = _written("json", final, run, secrets=["tok-123"],
                         fields={"worker": 2, "pid": 7})
    assert "tok-123" not in written and "never written" not in written
    assert "sk-ant" not in written
    line = json.loads(written)
    assert list(line)[:4] == ["timestamp", "level", "event", "route"]
    assert list(line)[-4:] == ["request_id", "worker", "pid", "redacted"]
    assert (line["session_id"], line["tenant"], line["redacted"]) == ("sess-1", "none",
                                                                      ["prompt"])


@pytest.mark.parametrize("value", [float("nan"), [1.0, float("inf")], (float("-inf"),)])
def test_a_line_with_a_null_is_msgspec_s_unless_a_float_is_not_finite(value: Any) -> None:
    """A ``null`` in msgspec's text is a None, unless a float is a NaN or an infinity:
    then ``json.dumps`` writes the line (``NaN``, ``Infinity``), as before."""
    [plain] = _written("json", False, lambda log: log.info("x", status=None))
    assert plain.endswith('"event":"x","status":null}')
    [odd] = _written("json", False, lambda log: log.info("x", status=None, layers=value))
    assert "NaN" in odd or "Infinity" in odd
