"""Hostile request and admin bodies, end to end through the real proxy and the strict fake
provider: never a 500, never a traceback, always an Anthropic-shaped error or a forward the
provider accepted; and a provider refusal is never of a view the proxy rewrote."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.fake_upstream import ProviderRuleError, check_messages_request
from tests.conftest import TEST_API_KEY, ProxyFactory, RunningProxy, user_text
from tests.reliability.conftest import RELIABILITY_ADMIN_TOKEN

MODEL = "claude-sonnet-4-5"
COMPACTING = {"compaction": {"soft_threshold_tokens": 300, "hard_limit_tokens": 200_000,
                             "max_tool_result_tokens": 40, "keep_recent_messages": 2,
                             "summary_keep_recent": 2},
              "summary": {"enabled": False}}
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
#: How many inputs each test tried; printed at the end for the report.
TRIED: dict[str, int] = {}


class Client:
    """A blocking HTTP/1.1 client on one keep-alive connection to the proxy."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self._conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)

    def send(self, method: str, path: str, data: bytes,
             headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        """One request; status, headers (lower-cased names) and body."""
        try:
            self._conn.request(method, path, body=data, headers=headers)
            resp = self._conn.getresponse()
            payload = resp.read()
        except (ConnectionError, http.client.HTTPException):
            # The proxy may close the connection after refusing a huge body unread.
            self._conn.close()
            raise
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


@pytest.fixture
def fuzz_proxy(proxy_factory: ProxyFactory) -> RunningProxy:
    """A proxy that compacts early (so fuzzed bodies also go through the layers)."""
    return proxy_factory(COMPACTING, admin_token=RELIABILITY_ADMIN_TOKEN)


@pytest.fixture
def client(fuzz_proxy: RunningProxy) -> Iterator[Client]:
    """A client of :func:`fuzz_proxy`."""
    c = Client(fuzz_proxy.base_url)
    try:
        yield c
    finally:
        c.close()


def assert_answer_is_well_formed(status: int, headers: dict[str, str], payload: bytes) -> str:
    """Never a 500 or a traceback; a message (200) or the Anthropic error shape. Returns
    ``"forwarded"``, ``"proxy_refused"``, ``"provider_refused"`` (the client's own bytes) or
    ``"refused_rewritten"`` (the provider refused a view the proxy compacted)."""
    assert status != 500 and status < 600, payload[:300]
    assert b"Traceback" not in payload and b'File "' not in payload
    body = json.loads(payload)
    if status == 200:
        assert body["type"] == "message"
        return "forwarded"
    assert body["type"] == "error", body
    assert isinstance(body["error"]["type"], str) and body["error"]["message"]
    if "request_id" in body:  # the fake provider refused what it got
        return "provider_refused" if not headers.get("x-compact-layers") else "refused_rewritten"
    return "proxy_refused"


def post_messages(client: Client, data: bytes) -> str:
    """POST ``data`` to /v1/messages and check the answer."""
    status, headers, payload = client.send(
        "POST", "/v1/messages", data,
        {"x-api-key": TEST_API_KEY, "content-type": "application/json"})
    return assert_answer_is_well_formed(status, headers, payload)


# -- strategies ------------------------------------------------------------------------------

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "\ud800", "\udfff", "\u202e", "a" * 5000, "🙂" * 300,
                     '"}]', "\\u0000", "sk-ant-fake", "\r\n\r\n"]),
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), hostile_text)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=12)
ids = st.one_of(st.sampled_from(["toolu_01", "toolu_02", "toolu_03", ""]), hostile_text,
                json_scalars)


@st.composite
def blocks(draw: st.DrawFn, role: str) -> Any:
    """A content block that is usually well formed, sometimes not at all."""
    kind = draw(st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking",
                                 "unknown", "junk"]))
    if kind == "text":
        return {"type": "text", "text": draw(hostile_text)}
    if kind == "tool_use":
        return {"type": "tool_use", "id": draw(ids), "name": draw(hostile_text),
                "input": draw(json_values)}
    if kind == "tool_result":
        content = draw(st.one_of(hostile_text, st.lists(st.builds(
            lambda t: {"type": "text", "text": t}, hostile_text), max_size=3), json_values))
        return {"type": "tool_result", "tool_use_id": draw(ids), "content": content}
    if kind == "image":
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": draw(hostile_text)}}
    if kind == "thinking":
        return {"type": "thinking", "thinking": draw(hostile_text), "signature": "sig"}
    if kind == "unknown":
        return {"type": draw(hostile_text), **draw(st.dictionaries(hostile_text, json_values,
                                                                   max_size=3))}
    return draw(json_values)


@st.composite
def request_bodies(draw: st.DrawFn) -> Any:
    """A Messages request, plausible in shape, hostile in its details."""
    messages = []
    for index in range(draw(st.integers(0, 8))):
        role = draw(st.sampled_from(["user", "assistant"] if draw(st.booleans())
                                    else ["user", "assistant", "system", "tool", "", 7]))
        role = role if draw(st.integers(0, 9)) else ("user" if index % 2 == 0 else "assistant")
        content = draw(st.one_of(hostile_text, st.lists(blocks(str(role)), max_size=4),
                                 json_values))
        message: Any = {"role": role, "content": content}
        if draw(st.integers(0, 19)) == 0:
            message = draw(json_values)
        messages.append(message)
    body: dict[str, Any] = {"model": draw(st.one_of(st.just(MODEL), json_scalars)),
                            "max_tokens": draw(st.one_of(st.just(64), json_scalars)),
                            "messages": messages}
    if draw(st.booleans()):
        body["system"] = draw(st.one_of(hostile_text, st.lists(st.one_of(
            st.builds(lambda t: {"type": "text", "text": t}, hostile_text), json_values),
            max_size=3), json_values))
    if draw(st.booleans()):
        body.update(draw(st.dictionaries(hostile_text, json_values, max_size=3)))
    return body


def long_tool_history(pairs: int, result_chars: int = 200) -> list[dict[str, Any]]:
    """A valid history of ``pairs`` tool calls, each answered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text("go")}]
    for k in range(pairs):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{k:05d}", "name": "Read",
             "input": {"file_path": f"/src/{k}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{k:05d}",
             "content": "r" * result_chars}]})
    messages.append({"role": "assistant", "content": "done"})
    messages.append({"role": "user", "content": user_text("next?")})
    return messages


# -- /v1/messages --------------------------------------------------------------------------


@FUZZ
@given(body=request_bodies(), stream=st.booleans())
def test_fuzzed_request_bodies_never_get_a_500_or_an_invalid_forward(
    client: Client, body: Any, stream: bool
) -> None:
    """Generated bodies: a message, or an Anthropic-shaped error; the provider refuses a view
    the proxy rewrote only if the client's own body was already against its rules."""
    TRIED["fuzzed request bodies"] = TRIED.get("fuzzed request bodies", 0) + 1
    body["stream"] = False  # a streamed 200 is checked by the named cases below
    data = json.dumps(body, ensure_ascii=stream).encode("utf-8", "surrogatepass")
    if post_messages(client, data) == "refused_rewritten":
        # The provider refused a view the proxy rewrote: only acceptable when the client's
        # own body already broke the provider's rules (the proxy never breaks a valid one).
        with pytest.raises(ProviderRuleError):
            check_messages_request(json.loads(data))


def nested(depth: int) -> bytes:
    """A valid-looking body whose tool input nests ``depth`` levels deep."""
    return (b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": '
            + b"[" * depth + b"]" * depth + b"}]}")


HOSTILE_BODIES: list[tuple[str, bytes, str]] = [
    ("invalid UTF-8", b'{"model": "\xff\xfe", "messages": []}', "proxy_refused"),
    ("overlong UTF-8 slash", b'{"messages": [], "x": "\xc0\xaf"}', "proxy_refused"),
    ("NaN", b'{"model": "m", "max_tokens": NaN, "messages": []}', "proxy_refused"),
    ("Infinity", b'{"model": "m", "max_tokens": 8, "temperature": Infinity, "messages": []}',
     "proxy_refused"),
    ("-Infinity in a block",
     b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": '
     b'[{"type": "text", "text": "x", "w": -Infinity}]}]}', "proxy_refused"),
    ("deep nesting 100k", nested(100_000), "proxy_refused"),
    ("deep nesting 900", nested(900), "proxy_refused"),
    ("deep nesting 500", nested(500), "proxy_refused"),
    ("duplicate keys", json.dumps({"model": MODEL, "max_tokens": 8}).encode()[:-1]
     + b', "messages": [], "messages": [{"role": "user", "content": "hi"}]}', "forwarded"),
    ("messages not a list", b'{"model": "m", "max_tokens": 8, "messages": "hi"}',
     "proxy_refused"),
    ("content a number", b'{"model": "m", "max_tokens": 8, "messages": '
     b'[{"role": "user", "content": 5}]}', "proxy_refused"),
    ("block a number", b'{"model": "m", "max_tokens": 8, "messages": '
     b'[{"role": "user", "content": [5]}]}', "proxy_refused"),
    ("lone surrogate escape", json.dumps({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "x\ud800y"}]}).encode(), "forwarded"),
    ("body is null", b"null", "proxy_refused"),
    ("empty body", b"", "proxy_refused"),
    ("huge string 8 MiB", json.dumps({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "h" * (8 * 2**20)}]}).encode(), "proxy_refused"),
    ("33 MiB body", json.dumps({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "b" * (33 * 2**20)}]}).encode(), "proxy_refused"),
    ("3000 tool calls", json.dumps({"model": MODEL, "max_tokens": 8,
                                    "messages": long_tool_history(3000)}).encode(), "forwarded"),
]


@pytest.mark.parametrize(("name", "data", "expected"), HOSTILE_BODIES,
                         ids=[name for name, _, _ in HOSTILE_BODIES])
def test_named_hostile_bodies_get_the_documented_answer(
    client: Client, name: str, data: bytes, expected: str
) -> None:
    """Each classic hostile body: the expected kind of answer, well formed, never a 500."""
    TRIED["named hostile request bodies"] = TRIED.get("named hostile request bodies", 0) + 1
    assert post_messages(client, data) == expected


def test_thousands_of_tool_calls_stream_through_compacted_and_valid(client: Client) -> None:
    """5000 tool calls, streamed: compacted (L1/L3), accepted by the strict provider."""
    data = json.dumps({"model": MODEL, "max_tokens": 8, "stream": True,
                       "messages": long_tool_history(5000)}).encode()
    status, headers, payload = client.send("POST", "/v1/messages", data,
                                           {"x-api-key": TEST_API_KEY})
    assert status == 200, payload[:300]
    assert headers["x-compact-layers"]
    assert payload.endswith(b'data: {"type":"message_stop"}\n\n')


# -- the admin API ---------------------------------------------------------------------------

ADMIN_HEADERS = {"Authorization": f"Bearer {RELIABILITY_ADMIN_TOKEN}",
                 "content-type": "application/json"}


@st.composite
def admin_bodies(draw: st.DrawFn) -> Any:
    """A PUT body: the right field names with hostile items, or anything at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(json_values)
    item = st.dictionaries(st.sampled_from([
        "fact_id", "content", "source_pointer", "last_confirmed_at", "item_id", "description",
        "memory_id", "source_id", "source_type", "source_title", "captured_at", "score",
        "source_rank", "conflict_key"]), st.one_of(json_values, st.sampled_from([
            "2025-03-01T12:00:00Z", "2025-03-01T12:00:00", "transcript:s:1",
            "artifact:s:a.txt:" + "0" * 64, "transcript:../x:1", 0.5, 1, -1, 2.0])),
        max_size=14)
    return {field: draw(st.one_of(st.lists(item, max_size=3), json_values))
            for field in draw(st.sets(st.sampled_from(
                ["facts", "pending_items", "retrieval_evidence", "session_id", "version",
                 "extra"]), max_size=6))}


@FUZZ
@given(body=admin_bodies(), if_match=st.sampled_from([None, '"1"', '"0"', "*", "1", '"x"']))
def test_fuzzed_admin_bodies_get_a_clear_answer_never_a_500(
    client: Client, body: Any, if_match: str | None
) -> None:
    """Generated PUT bodies: a state (200/201) or a 4xx Anthropic-shaped error."""
    TRIED["fuzzed admin bodies"] = TRIED.get("fuzzed admin bodies", 0) + 1
    headers = dict(ADMIN_HEADERS)
    if if_match is not None:
        headers["If-Match"] = if_match
    status, _, payload = client.send("PUT", "/admin/sessions/fuzz/state",
                                     json.dumps(body).encode(), headers)
    assert status in (200, 201, 400, 409, 428), payload[:300]
    answer = json.loads(payload)
    if status >= 400:
        assert answer["type"] == "error" and answer["error"]["message"]
    else:
        assert answer["session_id"] == "fuzz"


ADMIN_HOSTILE: list[tuple[str, bytes]] = [
    ("invalid UTF-8", b'{"facts": ["\xff"]}'),
    ("NaN score", b'{"retrieval_evidence": [{"score": NaN}]}'),
    ("deep nesting", b"[" * 100_000),
    ("duplicate keys", b'{"facts": [], "facts": 3}'),
    ("not an object", b"[]"),
    ("over 1 MiB", b'{"facts": "' + b"x" * (2**20 + 10) + b'"}'),
    ("wrong types", b'{"facts": {"fact_id": 1}, "pending_items": 7}'),
    ("items not objects", b'{"facts": [1, "a", null]}'),
]


@pytest.mark.parametrize(("name", "data"), ADMIN_HOSTILE, ids=[n for n, _ in ADMIN_HOSTILE])
def test_named_hostile_admin_bodies_are_refused_with_4xx(
    client: Client, name: str, data: bytes
) -> None:
    """Each classic hostile PUT body: 400 or 413 in the Anthropic shape, nothing stored."""
    TRIED["named hostile admin bodies"] = TRIED.get("named hostile admin bodies", 0) + 1
    status, _, payload = client.send("PUT", "/admin/sessions/hostile/state", data,
                                     ADMIN_HEADERS)
    assert status in (400, 413), payload[:300]
    assert json.loads(payload)["type"] == "error"
    status, _, _ = client.send("GET", "/admin/sessions/hostile/state", b"", ADMIN_HEADERS)
    assert status == 404


def test_zz_report_how_many_hostile_inputs_were_tried() -> None:
    """Print the counts (for the report); every group above ran at least once."""
    print(f"\nhostile inputs tried: {TRIED}")
    assert TRIED.get("fuzzed request bodies", 0) > 0
    assert TRIED.get("fuzzed admin bodies", 0) > 0
