"""The provider's own input-token count: ``FakeUpstream(token_ratio=…, token_noise=…)`` counts
``ratio × chars/4`` per block plus a deterministic per-block noise, and reports and checks that
count everywhere (usage in JSON and ``message_start``, count_tokens, the context window)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.fake_upstream.replies import PromptCache, TokenRule, canonical_prompt, estimate_tokens

MODEL = "claude-sonnet-4-5"
TOOLS: list[Any] = [{"name": "read_file", "description": "Read a file " * 10,
                     "input_schema": {"type": "object", "properties": {}}}]
# A breakpoint on the system prompt (the documented pattern): only a marked request reads and
# writes the prompt cache.
SYSTEM: list[Any] = [{"type": "text", "text": "You are terse. " * 30},
                     {"type": "text", "text": "Answer in English. " * 20,
                      "cache_control": {"type": "ephemeral"}}]
MESSAGES: list[Any] = [
    {"role": "user", "content": "Read the config please " * 40},
    {"role": "assistant", "content": [{"type": "text", "text": "Reading it now."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                       "input": {"path": "a.cfg"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": "key = value\n" * 80}]},
]


def _length(messages: list[Any] = MESSAGES) -> int:
    return len(canonical_prompt({"tools": TOOLS, "system": SYSTEM, "messages": messages}))


def _total(usage: Any) -> int:
    return int(usage.input_tokens + (usage.cache_creation_input_tokens or 0)
               + (usage.cache_read_input_tokens or 0))


@pytest.fixture
async def served() -> AsyncIterator[Any]:
    """Start fake upstreams with the given options; each gets its own SDK client."""
    runners: list[Any] = []
    clients: list[anthropic.AsyncAnthropic] = []

    async def serve(**options: Any) -> tuple[FakeUpstream, anthropic.AsyncAnthropic]:
        upstream = FakeUpstream(**options)
        runner, url = await start_fake_upstream(upstream)
        runners.append(runner)
        sdk = anthropic.AsyncAnthropic(base_url=url, api_key="test-key", max_retries=0)
        clients.append(sdk)
        return upstream, sdk

    try:
        yield serve
    finally:
        for sdk in clients:
            await sdk.close()
        for runner in runners:
            await runner.cleanup()


async def _count(sdk: anthropic.AsyncAnthropic, messages: list[Any] = MESSAGES) -> int:
    counted = await sdk.messages.count_tokens(model=MODEL, tools=TOOLS, system=SYSTEM,
                                              messages=messages)
    return counted.input_tokens


async def _usage_json(sdk: anthropic.AsyncAnthropic, messages: list[Any] = MESSAGES) -> Any:
    message = await sdk.messages.create(model=MODEL, max_tokens=8, tools=TOOLS, system=SYSTEM,
                                        messages=messages)
    return message.usage


async def _usage_stream(sdk: anthropic.AsyncAnthropic, messages: list[Any] = MESSAGES) -> Any:
    """The usage of the ``message_start`` event of a streamed request."""
    stream = await sdk.messages.create(model=MODEL, max_tokens=8, tools=TOOLS, system=SYSTEM,
                                       messages=messages, stream=True)
    start: Any = None
    async for event in stream:
        if event.type == "message_start":
            start = event.message.usage
    return start


async def test_the_defaults_keep_characters_over_four(served: Any) -> None:
    """No options: every count is today's ``len(canonical) // 4``."""
    _, sdk = await served()
    expected = _length() // 4
    assert await _count(sdk) == expected
    assert _total(await _usage_json(sdk)) == expected
    assert _total(await _usage_stream(sdk)) == expected


async def test_a_ratio_scales_every_reported_count(served: Any) -> None:
    """With ratio 1.3 (no noise) count_tokens, the JSON usage total and the message_start usage
    total are exactly ``floor(1.3 × chars / 4)`` = ``13 × chars // 40``."""
    _, sdk = await served(token_ratio=1.3)
    expected = 13 * _length() // 40
    assert expected > _length() // 4 * 1.29
    assert await _count(sdk) == expected
    assert _total(await _usage_json(sdk)) == expected
    assert _total(await _usage_stream(sdk)) == expected


async def test_cache_reads_use_the_same_count(served: Any) -> None:
    """A growing conversation reads its shared prefix in the provider's units: read =
    ``13 × prefix chars // 40``, and read + the rest = the whole count."""
    _, sdk = await served(token_ratio=1.3)
    await _usage_json(sdk)
    grown = [*MESSAGES, {"role": "assistant", "content": "Done."},
             {"role": "user", "content": "Thanks"}]
    usage = await _usage_json(sdk, grown)
    first = canonical_prompt({"tools": TOOLS, "system": SYSTEM, "messages": MESSAGES})
    second = canonical_prompt({"tools": TOOLS, "system": SYSTEM, "messages": grown})
    prefix = len(os.path.commonprefix([first, second]))
    assert usage.cache_read_input_tokens == 13 * prefix // 40
    assert _total(usage) == 13 * len(second) // 40


async def test_the_noise_is_deterministic_and_bounded(served: Any) -> None:
    """The same body gets the same count, twice on one upstream and on another one with the same
    options; the noise moves the count away from the plain ratio by at most ±noise."""
    _, sdk = await served(token_ratio=1.3, token_noise=0.2)
    _, twin = await served(token_ratio=1.3, token_noise=0.2)
    first = await _count(sdk)
    assert await _count(sdk) == first == await _count(twin)
    plain = 1.3 * _length() / 4
    assert first != int(plain)
    assert plain * 0.8 - 1 <= first <= plain * 1.2 + 1


@pytest.mark.parametrize("noise", [pytest.param(0.0, id="no noise"),
                                   pytest.param(0.25, id="with noise")])
async def test_count_tokens_equals_the_usage_total(served: Any, noise: float) -> None:
    """count_tokens is the same number as the usage total of the same body, JSON and stream,
    cold and with part of the prompt read from the cache."""
    _, sdk = await served(token_ratio=1.3, token_noise=noise)
    counted = await _count(sdk)
    assert _total(await _usage_json(sdk)) == counted
    assert _total(await _usage_stream(sdk)) == counted
    grown = [*MESSAGES, {"role": "assistant", "content": "Done."},
             {"role": "user", "content": "Thanks"}]
    warm = await _usage_json(sdk, grown)
    assert warm.cache_read_input_tokens > 0
    assert _total(warm) == await _count(sdk, grown)


@pytest.mark.parametrize("noise", [pytest.param(0.0, id="no noise"),
                                   pytest.param(0.25, id="with noise")])
async def test_the_context_window_is_judged_by_the_providers_count(
    served: Any, noise: float,
) -> None:
    """A body whose default count fits the window but whose provider count does not gets the
    exact ``prompt is too long: N tokens > M maximum`` with N the provider's count."""
    _, probe = await served(token_ratio=1.3, token_noise=noise)
    provider_count = await _count(probe)
    window = _length() // 4 + 1
    assert provider_count > window
    _, sdk = await served(token_ratio=1.3, token_noise=noise, context_window=window)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await _usage_json(sdk)
    body: Any = caught.value.body
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {provider_count} tokens > {window} maximum"}
    _, roomy = await served(token_ratio=1.3, token_noise=noise, context_window=provider_count)
    assert _total(await _usage_json(roomy)) == provider_count


@pytest.mark.parametrize("options", [
    pytest.param({"token_ratio": 0}, id="ratio zero"),
    pytest.param({"token_ratio": -1.0}, id="negative ratio"),
    pytest.param({"token_noise": -0.1}, id="negative noise"),
    pytest.param({"token_noise": 1.0}, id="noise of one"),
])
def test_token_options_are_validated(options: dict[str, Any]) -> None:
    """A ratio must be positive and a noise in [0, 1)."""
    with pytest.raises(ValueError, match="token_"):
        FakeUpstream(**options)


@pytest.mark.parametrize("options", [
    pytest.param({}, id="default"),
    pytest.param({"ratio": 1.3}, id="ratio"),
    pytest.param({"ratio": 0.7, "noise": 0.3}, id="ratio and noise"),
])
def test_the_prompt_cache_splits_the_rules_count(options: dict[str, Any]) -> None:
    """Pure: for any rule, reads + writes add up to the rule's whole count, reads never exceed
    it, and a repeated prompt is read whole; without a breakpoint it is all plain input."""
    rule = TokenRule(**options)
    cache = PromptCache()
    bodies = [{"system": SYSTEM, "messages": MESSAGES[:k]} for k in (1, 2, 3)]
    bodies.append({"system": SYSTEM[:1], "messages": MESSAGES})
    for breakpoints in (False, True):
        for body in [*bodies, bodies[-1]]:
            measure = rule.measure(body)
            usage = cache.usage(f"key-{breakpoints}", measure, has_breakpoints=breakpoints)
            assert sum(usage.as_dict().values()) == measure.total
            assert 0 <= usage.cache_read_input_tokens <= measure.total
            if not breakpoints:
                assert usage.input_tokens == measure.total
        assert usage.cache_read_input_tokens == (measure.total if breakpoints else 0)
    if not options:
        assert rule.measure(bodies[0]).total == estimate_tokens(canonical_prompt(bodies[0]))


def test_the_noise_depends_on_the_block_bytes() -> None:
    """Pure: the noise follows a block's content, not its position or the request: the same
    blocks in another body keep their counts, a changed block moves its own count."""
    rule = TokenRule(ratio=1, noise=0.5)
    plain = TokenRule(ratio=1)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" * 400}]}]}
    changed = json.loads(json.dumps(body))
    changed["messages"][0]["content"][0]["text"] = "b" * 400
    assert plain.measure(body).total == plain.measure(changed).total
    assert rule.measure(body).total != rule.measure(changed).total
    assert rule.measure(body).total == TokenRule(ratio=1, noise=0.5).measure(body).total
