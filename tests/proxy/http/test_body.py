"""The body helpers on their own: what ``parse_body`` refuses and what ``dump_body`` can emit."""

from __future__ import annotations

import json
import math

import pytest

from proxy.http.body import dump_body, parse_body
from proxy.http.errors import RequestRejected


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"messages": [], "temperature": 1e400}', "temperature: number 1e400 is out of range"),
    (b'{"messages": [{"role": "user", "content": [{"type": "tool_use", "input": '
     b'{"a": [0, -2e308]}}]}]}',
     "messages.0.content.0.input.a.1: number -2e308 is out of range"),
    (b'{"messages": [], "metadata": {"n": ' + b"1" * 5000 + b"}}",
     "metadata.n: number 11111111111111111111... (5000 digits) is out of range"),
])
def test_numbers_out_of_range_are_refused_with_their_path(raw: bytes, message: str) -> None:
    """``1e400`` would parse to infinity and come back out as ``Infinity``: a 400 instead."""
    with pytest.raises(RequestRejected) as caught:
        parse_body(raw)
    assert (caught.value.status, caught.value.reason) == (400, "number_out_of_range")
    assert caught.value.message == message


def test_small_and_large_finite_numbers_parse_as_numbers() -> None:
    """Underflow is still a number (``1e-400`` is 0.0); ``1e308`` and big integers are kept."""
    body = parse_body(b'{"messages": [], "a": 1e308, "b": 1e-400, "c": ' + b"9" * 400 + b"}")
    assert body["a"] == 1e308 and body["b"] == 0.0 and body["c"] == int("9" * 400)
    assert json.loads(dump_body(body)) == body


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_dump_body_never_emits_what_is_not_json(value: float) -> None:
    """A non-finite float that reached the serialiser anyway is an error, never ``Infinity``."""
    with pytest.raises(ValueError):
        dump_body({"messages": [], "x": value})


@pytest.mark.parametrize(("text", "lone"), [
    ("plain", False), ("😀", False), ("😀😀 and 😀", False),
    ("x\ud800y", True), ("a\udc00", True), ("😀\ud800", True), ("\ud800\ud800\udc00", True),
    ("\udc00😀", True),
])
def test_lone_surrogate_escapes_are_told_from_pairs(text: str, lone: bool) -> None:
    """The pre-check of the body: a surrogate escape without its other half, never a pair."""
    from proxy.http.body import may_hold_lone_surrogates

    assert may_hold_lone_surrogates(json.dumps({"content": text}).encode()) is lone
