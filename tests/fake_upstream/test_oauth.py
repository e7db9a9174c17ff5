"""Claude Code subscription credentials (``Authorization: Bearer sk-ant-oat…``, reference §2.3):
refused without the ``oauth-2025-04-20`` beta (401) and on a request that does not carry Claude
Code's own system identity (400); served on the real fake upstream, driven by the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import FakeUpstream, ProviderRuleError
from proxy.fake_upstream.rules import (
    CLAUDE_CODE_IDENTITIES,
    MSG_CLAUDE_CODE_ONLY,
    MSG_OAUTH_NOT_SUPPORTED,
    check_claude_code_identity,
    check_oauth_beta,
    is_oauth_credential,
)

MODEL = "claude-sonnet-4-5"
HELLO: list[Any] = [{"role": "user", "content": "Hello there"}]
OAUTH_TOKEN = "sk-ant-oat01-fake-subscription-token"
CLAUDE_CODE_BETAS = ["claude-code-20250219", "oauth-2025-04-20", "interleaved-thinking-2025-05-14"]
BILLING = {"type": "text",
           "text": "x-anthropic-billing-header: cc_version=2.1.0.abc; cc_entrypoint=cli; cch=00;"}
CLI = {"type": "text", "text": CLAUDE_CODE_IDENTITIES[0]}
AGENT_SDK = {"type": "text", "text": CLAUDE_CODE_IDENTITIES[1]}
INSTRUCTIONS = {"type": "text", "text": "You are an interactive agent that helps with code."}

ACCEPTED_SYSTEMS = [
    pytest.param([BILLING, CLI, INSTRUCTIONS], id="billing block then the CLI identity"),
    pytest.param([BILLING, AGENT_SDK], id="billing block then the Agent SDK identity"),
    pytest.param([CLI, INSTRUCTIONS], id="no billing block, the CLI identity first"),
    pytest.param([AGENT_SDK], id="no billing block, the Agent SDK identity alone"),
    pytest.param([BILLING, {"type": "text", "text": CLAUDE_CODE_IDENTITIES[0] + "\n\nMore."}],
                 id="identity block that goes on after the identity"),
    pytest.param([BILLING, {**CLI, "cache_control": {"type": "ephemeral"}}],
                 id="identity block with a cache_control marker"),
]
REFUSED_SYSTEMS = [
    pytest.param(None, id="no system"),
    pytest.param(CLAUDE_CODE_IDENTITIES[0], id="identity as a plain string"),
    pytest.param([], id="empty system list"),
    pytest.param([INSTRUCTIONS], id="other text only"),
    pytest.param([BILLING], id="billing block alone"),
    pytest.param([BILLING, INSTRUCTIONS, CLI], id="identity after another block"),
    pytest.param([INSTRUCTIONS, CLI], id="identity second without a billing block"),
    pytest.param([BILLING, BILLING, CLI], id="two billing blocks"),
    pytest.param([{"type": "text", "text": "Hi. " + CLAUDE_CODE_IDENTITIES[0]}],
                 id="identity not at the start of the block"),
    pytest.param([{"type": "text", "text": "You are Claude Code."}], id="shortened identity"),
]


@pytest.fixture
async def oauth_client(base_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """The real SDK sending ``Authorization: Bearer sk-ant-oat…`` and no ``x-api-key``."""
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key=None, auth_token=OAUTH_TOKEN,
                                   max_retries=0)
    try:
        yield sdk
    finally:
        await sdk.close()


def _system(system: Any) -> dict[str, Any]:
    return {} if system is None else {"system": system}


async def _create(sdk: anthropic.AsyncAnthropic, endpoint: str, betas: list[str],
                  system: Any) -> int:
    """Send one request to ``endpoint``; the whole prompt size it reports."""
    if endpoint == "messages":
        message = await sdk.beta.messages.create(model=MODEL, max_tokens=8, messages=HELLO,
                                                 betas=betas, **_system(system))
        usage = message.usage
        return usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (
            usage.cache_read_input_tokens or 0)
    counted = await sdk.beta.messages.count_tokens(model=MODEL, messages=HELLO, betas=betas,
                                                   **_system(system))
    return counted.input_tokens


ENDPOINTS = [pytest.param("messages", id="messages"),
             pytest.param("count_tokens", id="count_tokens")]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("betas", [
    pytest.param([], id="no anthropic-beta"),
    pytest.param(["claude-code-20250219", "interleaved-thinking-2025-05-14"],
                 id="betas without oauth"),
    pytest.param(["oauth-2025-04-21"], id="another oauth date"),
])
async def test_an_oauth_token_without_the_oauth_beta_is_401(
    oauth_client: anthropic.AsyncAnthropic, upstream: FakeUpstream, endpoint: str,
    betas: list[str],
) -> None:
    """Without ``oauth-2025-04-20`` in ``anthropic-beta`` the answer is the exact 401, even for
    a request that is otherwise Claude Code's own."""
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await _create(oauth_client, endpoint, betas, [BILLING, CLI])
    body: Any = caught.value.body
    assert caught.value.status_code == 401
    assert body["type"] == "error"
    assert body["error"] == {"type": "authentication_error", "message": MSG_OAUTH_NOT_SUPPORTED}
    assert body["request_id"] == caught.value.response.headers["request-id"]
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {OAUTH_TOKEN}"


async def test_the_oauth_beta_is_checked_before_the_body(http: aiohttp.ClientSession) -> None:
    """A credential problem is answered before the body is judged: a body that is not even JSON
    still gets the 401."""
    async with http.post("/v1/messages", data=b"{not json", headers={
            "authorization": f"Bearer {OAUTH_TOKEN}", "content-type": "application/json"}) as r:
        assert r.status == 401
        assert (await r.json())["error"]["message"] == MSG_OAUTH_NOT_SUPPORTED


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("system", REFUSED_SYSTEMS)
async def test_an_oauth_request_that_is_not_claude_codes_own_is_400(
    oauth_client: anthropic.AsyncAnthropic, endpoint: str, system: Any,
) -> None:
    """With the beta but without Claude Code's system identity the answer is the exact 400."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        await _create(oauth_client, endpoint, CLAUDE_CODE_BETAS, system)
    body: Any = caught.value.body
    assert body["error"] == {"type": "invalid_request_error", "message": MSG_CLAUDE_CODE_ONLY}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("system", ACCEPTED_SYSTEMS)
async def test_claude_code_shaped_oauth_requests_are_served(
    oauth_client: anthropic.AsyncAnthropic, upstream: FakeUpstream, endpoint: str, system: Any,
) -> None:
    """The beta plus the identity (after an optional billing block) is served normally."""
    assert await _create(oauth_client, endpoint, CLAUDE_CODE_BETAS, system) > 0
    assert upstream.requests[-1].api_key == OAUTH_TOKEN


async def test_the_oauth_beta_may_come_in_any_position_or_header(
    http: aiohttp.ClientSession,
) -> None:
    """``anthropic-beta`` is a comma list, also split over repeated headers, spaces allowed."""
    body = {"model": MODEL, "max_tokens": 8, "messages": HELLO, "system": [BILLING, CLI]}
    headers = [("authorization", f"Bearer {OAUTH_TOKEN}"),
               ("anthropic-beta", "claude-code-20250219 , interleaved-thinking-2025-05-14"),
               ("anthropic-beta", " oauth-2025-04-20")]
    async with http.post("/v1/messages", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()


async def test_the_body_rules_still_apply_to_an_accepted_oauth_request(
    oauth_client: anthropic.AsyncAnthropic,
) -> None:
    """Passing the credential check does not skip the provider's body rules."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        await oauth_client.beta.messages.create(
            model=MODEL, max_tokens=8, betas=CLAUDE_CODE_BETAS, system=[BILLING, CLI],
            messages=[{"role": "user", "content": "   "}])
    body: Any = caught.value.body
    assert body["error"]["message"] != MSG_CLAUDE_CODE_ONLY


@pytest.mark.parametrize("headers", [
    pytest.param({"x-api-key": "sk-ant-api03-key"}, id="api key"),
    pytest.param({"authorization": "Bearer gateway-token"}, id="other bearer token"),
    pytest.param({"x-api-key": "sk-ant-oat01-in-the-api-key-header"},
                 id="oat token in x-api-key is not a bearer"),
])
async def test_other_credentials_are_not_held_to_the_oauth_rules(
    http: aiohttp.ClientSession, headers: dict[str, str],
) -> None:
    """An API key or another bearer token needs neither the beta nor the identity."""
    body = {"model": MODEL, "max_tokens": 8, "messages": HELLO}
    async with http.post("/v1/messages", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()


def test_the_pure_oauth_rules() -> None:
    """The rule functions on their own: what counts as an OAuth credential and which checks
    raise which status, type and text."""
    assert is_oauth_credential(f"Bearer {OAUTH_TOKEN}")
    assert is_oauth_credential(f"bearer   {OAUTH_TOKEN}")
    assert not is_oauth_credential("Bearer sk-ant-api03-x")
    assert not is_oauth_credential(OAUTH_TOKEN)
    assert not is_oauth_credential("")
    check_oauth_beta("Bearer other", "")
    check_oauth_beta(f"Bearer {OAUTH_TOKEN}", "a,oauth-2025-04-20")
    with pytest.raises(ProviderRuleError) as refused:
        check_oauth_beta(f"Bearer {OAUTH_TOKEN}", "claude-code-20250219")
    assert (refused.value.status, refused.value.error_type, refused.value.message) == (
        401, "authentication_error", MSG_OAUTH_NOT_SUPPORTED)
    check_claude_code_identity("Bearer other", {"system": "anything"})
    check_claude_code_identity(f"Bearer {OAUTH_TOKEN}", {"system": [BILLING, AGENT_SDK]})
    for body in ({"system": [INSTRUCTIONS]}, {}, [], {"system": [BILLING, "not a block"]}):
        with pytest.raises(ProviderRuleError) as refused:
            check_claude_code_identity(f"Bearer {OAUTH_TOKEN}", body)
        assert (refused.value.status, refused.value.error_type, refused.value.message) == (
            400, "invalid_request_error", MSG_CLAUDE_CODE_ONLY)
