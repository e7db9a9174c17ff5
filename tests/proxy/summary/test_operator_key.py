"""``summary.mode: separate`` with ``summary.api_key_env``: the operator's key pays for the
summaries, so it is spent only for callers whose own credential the provider has accepted.

End to end: the real proxy, the real SDK, and the fake provider told which keys it knows
(``FakeUpstream.accepted_keys``: any other gets 401 ``invalid x-api-key``); the summary calls
made with the operator's key are counted at the provider.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import is_summarizer_request
from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    log_lines_for,
    user_text,
)
from tests.proxy.e2e.helpers import SUMMARY_POLICY, read_turns

MODEL = "claude-sonnet-4-5"
OPERATOR_KEY = "sk-ant-api03-the-operators-own-summary-key"
KEY_ENV = "COMPACT_PROXY_TEST_SUMMARY_KEY"


def history(tag: str, reads: int = 12) -> list[dict[str, Any]]:
    """A conversation that needs a summary, its content unique to ``tag`` (so no summary of
    another conversation is in the cache)."""
    messages: list[dict[str, Any]] = read_turns(reads, tag=tag)
    return messages


def operator_summary_calls(upstream_server: UpstreamServer) -> int:
    """The summary calls the provider got with the operator's key."""
    return sum(1 for r in upstream_server.upstream.message_requests
               if r.api_key == OPERATOR_KEY and is_summarizer_request(r.body))


@pytest.fixture
def operator_proxy(proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
                   monkeypatch: pytest.MonkeyPatch) -> RunningProxy:
    """A proxy whose summaries are paid by the operator's key, in front of a provider that
    knows two keys: the operator's and one caller's."""
    upstream_server.upstream.accepted_keys = frozenset({OPERATOR_KEY, TEST_API_KEY})
    monkeypatch.setenv(KEY_ENV, OPERATOR_KEY)
    return proxy_factory({"compaction": SUMMARY_POLICY,
                          "summary": {"mode": "separate", "api_key_env": KEY_ENV}})


def ask(proxy: RunningProxy, api_key: str, messages: list[dict[str, Any]]) -> Any:
    """One /v1/messages request with ``api_key``: the raw response."""
    with anthropic.Anthropic(base_url=proxy.base_url, api_key=api_key, max_retries=0) as client:
        return client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                        messages=messages)


def test_made_up_keys_spend_nothing_on_the_operators_key(
        operator_proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path) -> None:
    """Requests with made-up keys, each a new conversation that needs a summary: each is
    refused by the provider (401 to the caller), and no summary call is made on the
    operator's key (``summary_failed`` says why)."""
    for index in range(5):
        with pytest.raises(anthropic.AuthenticationError) as caught:
            ask(operator_proxy, f"sk-ant-made-up-{index}", history(f"stranger{index}"))
        lines = log_lines_for(proxy_log, caught.value.response.headers["x-compact-request-id"])
        assert [line["error_class"] for line in lines
                if line["event"] == "summary_failed"] == ["CallerNotAccepted"]
    refused = [r for r in upstream_server.upstream.message_requests
               if r.api_key.startswith("sk-ant-made-up-")]
    assert len(refused) == 5  # forwarded, and refused by the provider itself
    assert operator_summary_calls(upstream_server) == 0


def test_an_accepted_caller_gets_its_summary_on_the_operators_key(
        operator_proxy: RunningProxy, upstream_server: UpstreamServer) -> None:
    """A caller the provider knows gets its summary on its first request (one cheap check of
    its credential, with its own credential), made with the operator's key; its next
    requests need no check."""
    first = ask(operator_proxy, TEST_API_KEY, history("known"))
    assert "L4" in first.headers["x-compact-layers"].split(",")
    assert operator_summary_calls(upstream_server) == 1
    second = ask(operator_proxy, TEST_API_KEY, history("known-2"))
    assert "L4" in second.headers["x-compact-layers"].split(",")
    assert operator_summary_calls(upstream_server) == 2
    checks = [r for r in upstream_server.upstream.requests if r.path.startswith("/v1/models")]
    assert [r.api_key for r in checks] == [TEST_API_KEY]


def test_a_caller_the_provider_answered_needs_no_check(
        operator_proxy: RunningProxy, upstream_server: UpstreamServer) -> None:
    """A caller whose earlier request the provider answered (a short one: no summary) is
    known from that answer: its summary needs no check."""
    ask(operator_proxy, TEST_API_KEY, [{"role": "user", "content": user_text("hello")}])
    long = ask(operator_proxy, TEST_API_KEY, history("answered"))
    assert "L4" in long.headers["x-compact-layers"].split(",")
    assert operator_summary_calls(upstream_server) == 1
    assert upstream_server.upstream.counts["models"] == 0


def test_a_revoked_key_is_forgotten_at_the_providers_first_refusal(
        operator_proxy: RunningProxy, upstream_server: UpstreamServer) -> None:
    """A key accepted once, then revoked at the provider: its first refused request makes
    the proxy forget it, so it spends nothing on the operator's key after that."""
    ask(operator_proxy, TEST_API_KEY, [{"role": "user", "content": user_text("hello")}])
    upstream_server.upstream.accepted_keys = frozenset({OPERATOR_KEY})
    spent = operator_summary_calls(upstream_server)
    for index in range(3):
        with pytest.raises(anthropic.AuthenticationError):
            ask(operator_proxy, TEST_API_KEY, history(f"revoked{index}"))
    assert operator_summary_calls(upstream_server) - spent <= 1
