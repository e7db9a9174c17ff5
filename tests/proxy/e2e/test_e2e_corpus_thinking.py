"""The whole shared corpus through the real proxy, thinking on wherever the history has thinking.

Every conversation in ``../shared/corpus/real`` (and ``repaired/``) goes through the proxy to
the strict fake provider with the real SDK, compacted at low thresholds (L4's summary calls go
to the fake as well). A conversation with thinking blocks is sent with ``thinking`` enabled,
as the agent that wrote it ran; so are two earlier points of it where a tool loop is in
progress (the provider's tool-loop thinking rule applies there), in one session, so the later
requests reuse the earlier ones' checkpoints.

The claim: wherever the provider accepts the conversation as the client sent it, it accepts
what the proxy forwards. A refusal by the proxy itself (``MessageViewLimitExceeded``, with its
``error.compaction``) is allowed; a provider refusal relayed (no ``compaction``) never is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream.rules import ProviderRuleError, check_messages_request
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, load_corpus_body
from tests.paths import CORPUS

MODEL = "claude-sonnet-4-5"
THINKING_ON = {"type": "enabled", "budget_tokens": 2048}
THINKING = ("thinking", "redacted_thinking")
THRESHOLDS = {"soft_threshold_tokens": 3_000, "hard_limit_tokens": 150_000,
              "max_tool_result_tokens": 1_000, "keep_recent_messages": 6,
              "summary_keep_recent": 2}


def _names() -> list[str]:
    def folder(path: Path) -> list[str]:
        return sorted(p.relative_to(CORPUS).as_posix() for p in path.glob("*.json")
                      if p.name != "manifest.json")
    return folder(CORPUS) + folder(CORPUS / "repaired")


def _has_thinking(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m["content"], list) and any(b.get("type") in THINKING
                                                       for b in m["content"])
               for m in messages)


def _ends_in_tool_loop(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1]
    return last["role"] == "user" and isinstance(last["content"], list) and any(
        b.get("type") == "tool_result" for b in last["content"])


def _one_thinking_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the model writes it without interleaved thinking: thinking only
    on the first assistant message of each turn (a turn ends at a user message that is no
    tool answer), none on the tool-loop steps after it."""
    out: list[dict[str, Any]] = []
    in_loop = False
    for message in messages:
        content = message["content"]
        if message["role"] == "assistant" and in_loop and isinstance(content, list):
            kept = [b for b in content if b.get("type") not in THINKING]
            message = {**message, "content": kept or content}
        if message["role"] == "user":
            in_loop = _ends_in_tool_loop([message])
        out.append(message)
    return out


def _requests(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The bodies to send for one conversation, shortest first: as recorded, and as it would
    be without interleaved thinking (``claude -p`` style: one thinking block per turn)."""
    messages = body["messages"]
    body = {**body, "model": MODEL}
    if not _has_thinking(messages):
        return [body]
    body["thinking"] = THINKING_ON
    loops = [i + 1 for i in range(len(messages)) if _ends_in_tool_loop(messages[: i + 1])]
    cuts = sorted({loops[len(loops) // 2], loops[3 * len(loops) // 4]}) if loops else []
    out: list[dict[str, Any]] = []
    for variant in (messages, _one_thinking_per_turn(messages)):
        out += [{**body, "messages": variant[:end]} for end in cuts if end < len(variant)]
        out.append({**body, "messages": variant})
    return out


def _provider_accepts(body: dict[str, Any]) -> bool:
    try:
        check_messages_request(body)
    except ProviderRuleError:
        return False
    return True


def test_every_corpus_conversation_the_provider_accepts_is_accepted_after_compaction(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer) -> None:
    proxy = proxy_factory({"compaction": THRESHOLDS})
    sent = compacted = thinking_sent = refused_raw = proxy_refused = 0
    failures: list[str] = []
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        for number, name in enumerate(_names()):
            for body in _requests(load_corpus_body(name)):
                if not _provider_accepts(body):
                    refused_raw += 1  # the client's own body breaks a rule: nothing to prove
                    continue
                sent += 1
                thinking_sent += "thinking" in body
                try:
                    raw = client.messages.with_raw_response.create(
                        **body, extra_headers={"x-compact-session-id": f"corpus-{number}"})
                except anthropic.BadRequestError as exc:
                    error = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
                    if "compaction" in error:
                        proxy_refused += 1
                        continue
                    failures.append(f"{name} ({len(body['messages'])} messages): "
                                    f"{error.get('message')}")
                    continue
                compacted += raw.headers["x-compact-layers"] != ""
    print(f"\ncorpus through the proxy: {sent} requests ({thinking_sent} with thinking on), "
          f"{compacted} compacted, {proxy_refused} over the hard limit, "
          f"{refused_raw} refused as sent, {len(failures)} provider rejections")
    assert not failures, "the provider refused compacted views:\n" + "\n".join(failures[:10])
    assert thinking_sent >= 30 and compacted >= 100  # the test really exercised both
    # Every summary call the proxy made was one the provider accepted too.
    assert all(r.body is not None for r in upstream_server.upstream.message_requests)


@pytest.mark.parametrize("name", [n for n in _names()
                                  if _has_thinking(load_corpus_body(n)["messages"])][:1])
def test_a_thinking_conversation_is_sent_with_thinking_and_compacted(
        name: str, proxy_factory: ProxyFactory, upstream_server: UpstreamServer) -> None:
    """One of them, looked at closely: the forwarded body keeps ``thinking`` and every
    assistant turn that began with thinking still does."""
    proxy = proxy_factory({"compaction": THRESHOLDS})
    body = _requests(load_corpus_body(name))[-1]
    assert body["thinking"] == THINKING_ON
    with anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                             max_retries=0) as client:
        client.messages.create(**body)
    forwarded = upstream_server.upstream.message_requests[-1].body
    assert forwarded["thinking"]["type"] == "enabled"
    check_messages_request(forwarded)
