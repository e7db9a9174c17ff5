"""End to end: what one tenant teaches the proxy never changes how another is served.

With ``session.scope: credential`` and two API keys, through the real proxy, the real SDK
and the strict fake provider:

- calibration: tenant B's traffic, counted by the provider far above the proxy's estimate
  (as CJK text is), leaves tenant A's fresh-session estimate as it was (a new session starts
  from its own tenant's factors), so A's request is not summarised on A's bill;
- the learnt window: B's ``prompt is too long: N tokens > 300 maximum`` clamps B's later
  requests only, and B's clamp itself is forgotten after ``compaction.learnt_window_ttl_s``.

Source pointers: :mod:`tests.proxy.e2e.test_e2e_tenant_sources`.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream.replies import TokenRule
from tests.conftest import ProxyFactory, UpstreamServer, user_text
from tests.proxy.e2e.helpers import (
    KEY_A,
    KEY_B,
    SECRET_ENV,
    TENANT_SECRET,
    forwarded,
    read_turns,
    send,
    summary_calls,
)

SCOPE = {"session": {"scope": "credential", "secret_env": SECRET_ENV}}
#: Tenant A's history: about 2,400 tokens, below the soft threshold as A's provider counts it.
POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
          "max_tool_result_tokens": 2000, "keep_recent_messages": 4, "summary_keep_recent": 2}
CJK = "東京の会議は来週の火曜日に延期されました。資料を確認してください。" * 12


def cjk_history(index: int) -> list[dict[str, Any]]:
    """One CJK-heavy request of tenant B."""
    return [{"role": "user", "content": user_text(f"{index} {CJK}")}]


def test_one_tenants_traffic_does_not_move_another_tenants_fresh_session_estimate(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's fresh session is estimated, then B sends 60 requests the provider counts 3.5x the
    proxy's estimate; A's next fresh session with the same history gets the very same
    estimate, no compaction layer and no summary call (the fleet's defaults are per tenant)."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory({**SCOPE, "compaction": {**POLICY, "calibration": True}})
    upstream = upstream_server.upstream
    history = read_turns(3)

    def fresh_a(name: str) -> Any:
        return send(proxy, history, api_key=KEY_A, headers={"x-compact-session-id": name})

    fresh_a("a-warm-1")  # A's own fleet learns A's ratio
    before = fresh_a("a-fresh-1")
    estimate = int(before.headers["x-compact-tokens-after"])
    assert before.headers["x-compact-layers"] == ""
    assert 1500 < estimate < POLICY["soft_threshold_tokens"]

    upstream.token_rule = TokenRule(3.5)  # B's content: the provider counts far more
    for index in range(60):
        answer = send(proxy, cjk_history(index), api_key=KEY_B,
                      headers={"x-compact-session-id": f"b-{index}"})
        assert answer.http_response.status_code == 200
    upstream.token_rule = TokenRule(1)

    after = fresh_a("a-fresh-2")
    assert int(after.headers["x-compact-tokens-after"]) == estimate
    assert after.headers["x-compact-layers"] == ""
    assert summary_calls(upstream_server) == []
    assert forwarded(upstream_server)[-1]["messages"] == history


def test_scope_none_keeps_one_fleet_for_every_session(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Without a scope (one tenant) a new session still starts from every session's factors:
    after traffic the provider counts 3.5x, a fresh session's estimate moves with it."""
    proxy = proxy_factory({"compaction": {**POLICY, "calibration": True,
                                          "soft_threshold_tokens": 50_000}})
    upstream = upstream_server.upstream
    history = read_turns(3)
    first = send(proxy, history, headers={"x-compact-session-id": "one-1"})
    upstream.token_rule = TokenRule(3.5)
    for index in range(5):
        send(proxy, cjk_history(index), headers={"x-compact-session-id": f"other-{index}"})
    upstream.token_rule = TokenRule(1)
    fresh = send(proxy, history, headers={"x-compact-session-id": "one-2"})
    assert (int(fresh.headers["x-compact-tokens-after"])
            > 2 * int(first.headers["x-compact-tokens-after"]))


# -- the learnt window ----------------------------------------------------------------------


def test_a_window_learnt_from_one_tenant_clamps_only_that_tenant_and_expires(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's key meets a 300-token window (``prompt is too long: N tokens > 300 maximum``); A's
    key has the full window: A's next request goes out untouched, B's is still compacted
    below 300 until ``compaction.learnt_window_ttl_s`` has passed, then B's goes out untouched
    too."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    ttl = 3.0
    proxy = proxy_factory({**SCOPE, "compaction": {**POLICY, "soft_threshold_tokens": 50_000,
                                                   "learnt_window_ttl_s": ttl},
                           "summary": {"enabled": False}})
    upstream = upstream_server.upstream
    history = read_turns(3)

    def big(key: str, name: str) -> Any:
        try:
            return send(proxy, history, api_key=key, headers={"x-compact-session-id": name})
        except anthropic.APIStatusError as exc:  # a refusal, relayed or the proxy's own
            return exc

    upstream.context_window = 300
    big(KEY_B, "b-1")
    learnt_at = time.monotonic()
    assert upstream.message_requests, "B's request reached the provider"
    upstream.context_window = 200_000  # the other calls see the full window

    seen = len(upstream.message_requests)
    answer_a = big(KEY_A, "a-1")
    assert not isinstance(answer_a, Exception), answer_a
    assert answer_a.headers["x-compact-layers"] == ""
    assert len(upstream.message_requests) == seen + 1
    assert forwarded(upstream_server)[-1]["messages"] == history

    seen = len(upstream.message_requests)
    clamped = big(KEY_B, "b-2")  # B's own window still holds
    assert time.monotonic() - learnt_at < ttl, "too slow to see B's clamp"
    if isinstance(clamped, Exception):  # refused by the proxy: nothing sent
        assert len(upstream.message_requests) == seen
    else:
        assert clamped.headers["x-compact-layers"] != ""
        assert int(clamped.headers["x-compact-tokens-after"]) <= 300

    time.sleep(max(0.0, ttl + 0.2 - (time.monotonic() - learnt_at)))
    again_b = big(KEY_B, "b-3")
    assert not isinstance(again_b, Exception), again_b
    assert again_b.headers["x-compact-layers"] == ""
    assert forwarded(upstream_server)[-1]["messages"] == history
