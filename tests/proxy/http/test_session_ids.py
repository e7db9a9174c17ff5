"""One rule for session ids, the same verdict everywhere an id is checked.

The same ids go through every place that accepts or refuses a session id: the compactor's
validator, source pointers, the source-access policy, the config, the session resolver, the
admin API over real HTTP and the proxy's session header over real HTTP. A place that drifts
from the rule fails here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

import compactor
from compactor import ArtifactPointer, TranscriptPointer, parse_source_pointer
from policies import SourceAccessPolicy
from proxy.config import Config, ConfigError
from proxy.http.errors import RequestRejected
from proxy.http.session import resolve_session_id
from tests.conftest import TEST_API_KEY, ProxyFactory, RunningProxy, UpstreamServer, user_text

HEADER = "x-compact-session-id"
HEX12 = "0123456789ab"
ADMIN_TOKEN = "tok-session-ids-0123456789abcdef0123"

VALID = [
    "132b2f66-ee5f-4690-8904-32d9dc4d36c3",
    "demo-session",
    "a.b",
    "conv-AZaz09_-.v2",
    "a" * 128,
]
INVALID = [
    "team alpha",
    "a:b",
    ".",
    "..",
    "a..b",
    ".hidden",
    "trailing.",
    "a/b",
    "a\\b",
    "semi;colon",
    "a" * 129,
    "",
    "\u00e9t\u00e9",
]
EXPECTED = {sid: True for sid in VALID} | {sid: False for sid in INVALID}

Verdicts = dict[str, bool]


def _accepts(check: Callable[[str], object], exc: type[Exception] = ValueError) -> Verdicts:
    verdicts: Verdicts = {}
    for sid in EXPECTED:
        try:
            check(sid)
        except exc:
            verdicts[sid] = False
        else:
            verdicts[sid] = True
    return verdicts


def _pointers(sid: str) -> None:
    parse_source_pointer(f"transcript:{sid}:1")
    parse_source_pointer(f"artifact:{sid}:notes.txt:{HEX12}")
    TranscriptPointer(sid, 1)
    ArtifactPointer(sid, "notes.txt", HEX12)


def _source_access(sid: str) -> None:
    SourceAccessPolicy(shared_sessions=[sid])
    SourceAccessPolicy().authorizer(sid)
    SourceAccessPolicy(allow_cross_session=True).authorizer(sid)


def _config(sid: str) -> None:
    Config.from_mapping({"upstream": {"base_url": "https://api.anthropic.com"},
                         "policies": {"source_access": {"shared_sessions": [sid]}}})


def _resolver(sid: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    resolved = resolve_session_id(CIMultiDict({HEADER: sid}), body, HEADER)
    assert resolved == sid


PURE_PLACES: dict[str, Callable[[], Verdicts]] = {
    "compactor.check_session_id": lambda: _accepts(compactor.check_session_id),
    "compactor.is_session_id": lambda: {sid: compactor.is_session_id(sid) for sid in EXPECTED},
    "source pointers": lambda: _accepts(_pointers),
    "source access policy": lambda: _accepts(_source_access),
    "config shared_sessions": lambda: _accepts(_config, ConfigError),
    "session resolver": lambda: _accepts(_resolver, RequestRejected),
}


@pytest.mark.parametrize("place", sorted(PURE_PLACES))
def test_every_place_gives_the_same_verdict(place: str) -> None:
    """The validator, pointers, source access, config and resolver agree on every id."""
    assert PURE_PLACES[place]() == EXPECTED


def test_the_rule_is_documented_in_the_messages() -> None:
    """A refusal says why and states the rule."""
    with pytest.raises(ValueError) as info:
        compactor.check_session_id("team alpha")
    message = str(info.value)
    assert message.startswith("session_id: ") and "' '" in message
    assert compactor.SESSION_ID_RULE in message
    with pytest.raises(ValueError, match=r"^shared_sessions\[0\]: .*129 characters"):
        SourceAccessPolicy(shared_sessions=["a" * 129])
    assert compactor.MAX_SESSION_ID_CHARS == 128
    assert compactor.SESSION_ID_PATTERN.pattern == r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*"


def test_the_derived_conv_id_is_valid() -> None:
    """Without any id the derived ``conv-…`` id follows the rule by construction."""
    body = {"system": "s", "messages": [{"role": "user", "content": "é" * 10_000}]}
    derived = resolve_session_id(CIMultiDict(), body, HEADER)
    assert derived.startswith("conv-") and compactor.is_session_id(derived)


# --- over real HTTP ---------------------------------------------------------------------


@pytest.fixture
def admin_proxy(proxy_factory: ProxyFactory) -> RunningProxy:
    """The real proxy with its admin API enabled."""
    return proxy_factory(admin_token=ADMIN_TOKEN)


def _state_body() -> dict[str, Any]:
    return {"facts": [{"fact_id": "f1", "content": "uses SQLite WAL",
                       "source_pointer": "transcript:demo-session:1",
                       "last_confirmed_at": "2026-11-30T10:00:00+00:00"}]}


async def test_admin_put_gives_the_same_verdict(admin_proxy: RunningProxy) -> None:
    """PUT /admin/sessions/{sid}/state: valid ids are created, invalid ones are 400 naming
    the rule (an empty id cannot be put in the URL at all: 404)."""
    verdicts: Verdicts = {}
    async with aiohttp.ClientSession() as http:
        for sid in EXPECTED:
            url = f"{admin_proxy.base_url}/admin/sessions/{quote(sid, safe='')}/state"
            async with http.put(URL(url, encoded=True), json=_state_body(),
                                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp:
                body = await resp.json()
                verdicts[sid] = resp.status == 201
                if resp.status == 201:
                    assert body["session_id"] == sid
                elif sid:
                    assert resp.status == 400, (sid, body)
                    assert body["error"]["type"] == "invalid_request_error"
                    assert compactor.SESSION_ID_RULE in body["error"]["message"]
                else:
                    assert resp.status == 404
    assert verdicts == EXPECTED


async def test_session_header_gives_the_same_verdict(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """POST /v1/messages with the session header: a valid id is the session (echoed back); an
    invalid one is a 400 naming the header and the rule, and is never forwarded."""
    verdicts: Verdicts = {}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 16,
            "messages": [{"role": "user", "content": user_text("hello")}]}
    async with aiohttp.ClientSession() as http:
        for sid in EXPECTED:  # each can travel in a header (no CR, LF or NUL)
            sent_before = len(upstream_server.upstream.requests)
            headers = {"x-api-key": TEST_API_KEY, "content-type": "application/json",
                       HEADER: sid}
            async with http.post(f"{proxy.base_url}/v1/messages", data=json.dumps(body),
                                 headers=headers) as resp:
                reply = await resp.json()
                verdicts[sid] = resp.status == 200
                if resp.status == 200:
                    assert resp.headers[HEADER] == sid
                else:
                    assert resp.status == 400, (sid, reply)
                    assert reply["type"] == "error"
                    assert reply["error"]["type"] == "invalid_request_error"
                    assert HEADER in reply["error"]["message"]
                    assert compactor.SESSION_ID_RULE in reply["error"]["message"]
                    assert len(upstream_server.upstream.requests) == sent_before
    assert verdicts == EXPECTED
