"""The pipeline: cheapest layer first, stop below the soft threshold, reject at the hard limit."""

from __future__ import annotations

import copy
import json

import pytest

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionOptions,
    MessageViewLimitExceeded,
    SummaryRequest,
    TiktokenCounter,
    ToolProtocolError,
    compact_context,
    compact_context_async,
    compact_if_needed,
    estimate_tokens,
    summary_cache_key,
)
from policies import CompactionPolicy

from .builders import assistant, exchange, tool_use, user


def _policy(soft: int, hard: int = 1_000_000, **kw: int) -> CompactionPolicy:
    return CompactionPolicy(soft_threshold_tokens=soft, hard_limit_tokens=hard, **kw)


def _big_results_session() -> list:
    messages = [user("Original intent")]
    for n in range(4):
        messages += exchange(f"t{n}", f"log {n}\n" * 5_000)
    return messages


def test_below_the_soft_threshold_nothing_runs() -> None:
    """A small view comes back equal, with no layer recorded."""
    messages = [user("hi"), assistant("hello"), user("bye")]
    result = compact_context(messages, None, policy=_policy(10_000))
    assert result.messages == messages and result.layers_applied == () and result.outcomes == ()
    assert result.tokens_before == result.tokens_after


def test_the_pipeline_stops_after_the_first_layer_that_is_enough() -> None:
    """Truncating tool results is enough here, so L2..L4 never run."""
    result = compact_context(_big_results_session(), None,
                             policy=_policy(10_000, max_tool_result_tokens=1_000),
                             summarizer=lambda s: pytest.fail("L4 must not run"))
    assert result.layers_applied == ("L1",)
    assert [o.layer for o in result.outcomes] == ["L1"]
    assert result.tokens_after < 10_000 <= result.tokens_before
    assert result.outcomes[0].saved == result.tokens_before - result.tokens_after


def test_the_hard_limit_raises_with_counts_and_layers_but_no_text() -> None:
    """MessageViewLimitExceeded carries numbers and layer names only."""
    messages = [user("SECRET-INTENT " * 3_000), assistant("ok"), user("go on")]
    with pytest.raises(MessageViewLimitExceeded) as caught:
        compact_context(messages, None, policy=_policy(1_000, 2_000))
    error = caught.value
    assert error.tokens_after >= error.hard_limit == 2_000
    assert error.tokens_before >= error.tokens_after
    assert error.layers_applied == ("L1", "L2", "L3")
    assert "SECRET" not in str(error)
    assert str(error) == f"prompt is too long: {error.tokens_after} tokens > 2000 maximum"


def test_the_callers_messages_are_never_mutated() -> None:
    """Every layer works on copies; the input is deep-equal to before."""
    messages = _big_results_session()
    before = copy.deepcopy(messages)
    compact_context(messages, None, policy=_policy(500, max_tool_result_tokens=100),
                    summarizer=lambda s: "summary")
    assert messages == before


def test_the_default_deep_copy_shares_nothing_with_the_input() -> None:
    """The sync API returns objects that are not the caller's."""
    messages = [user("hi"), assistant("hello"), user("bye")]
    result = compact_context(messages, None, policy=_policy(10_000))
    assert all(a is not b for a, b in zip(result.messages, messages, strict=True))


def test_durable_state_comes_out_identical() -> None:
    """The durable state bypasses every layer."""
    state = object()
    result = compact_context(_big_results_session(), state, policy=_policy(500),
                             summarizer=lambda s: "summary")
    assert result.durable_state is state


def test_reserved_tokens_count_toward_the_thresholds() -> None:
    """Tokens outside messages (system, tools) can push a view over the soft threshold."""
    messages = _big_results_session()
    size = estimate_tokens(messages, Chars4Counter())  # the pipeline's default count
    assert compact_context(messages, None, policy=_policy(size + 10)).layers_applied == ()
    pushed = compact_context(messages, None, policy=_policy(size + 10, max_tool_result_tokens=500),
                             options=CompactionOptions(reserved_tokens=20))
    assert pushed.layers_applied == ("L1",) and pushed.tokens_before == size + 20


def test_a_broken_protocol_is_rejected_before_any_layer() -> None:
    """An unanswered tool_use raises ToolProtocolError even below the threshold."""
    with pytest.raises(ToolProtocolError):
        compact_context([user("go"), assistant(tool_use("a"))], None, policy=_policy(10_000))


def test_compact_if_needed_returns_the_messages_only() -> None:
    """The convenience wrapper gives the compacted list."""
    messages = _big_results_session()
    out = compact_if_needed(messages, None, policy=_policy(10_000, max_tool_result_tokens=1_000))
    assert isinstance(out, list) and estimate_tokens(out) < 10_000


def test_an_already_compact_view_is_left_as_it_is() -> None:
    """Compacting the output of a compaction changes nothing."""
    policy = _policy(2_000, max_tool_result_tokens=200, keep_recent_messages=4,
                     summary_keep_recent=2)
    first = compact_context(_big_results_session(), None, policy=policy,
                            summarizer=lambda s: "summary")
    second = compact_context(first.messages, None, policy=policy, summarizer=lambda s: "other")
    assert second.messages == first.messages


async def test_the_async_driver_awaits_the_summariser_with_the_request() -> None:
    """compact_context_async hands the summariser the SummaryRequest: the same JSON span as the
    sync driver, its cache key summary_cache_key of it, and the conversation it comes from
    (the first message up to the kept recent turns, as they stand)."""
    seen: list[str] = []
    conversations: list[tuple[dict[str, object], ...]] = []

    async def summarise(request: SummaryRequest) -> str:
        seen.append(request.messages_json)
        conversations.append(request.conversation)
        return "async summary"

    messages = [user("go")]
    for n in range(8):
        messages += exchange(f"t{n}", "r" * 800)
    result = await compact_context_async(messages, None, policy=_policy(500, summary_keep_recent=2),
                                         summarizer=summarise)
    assert result.layers_applied[-1] == "L4" and len(seen) == 1
    request: SummaryRequest | None = result.summary_request
    assert request is not None and request.messages_json == seen[0]
    assert len(request.cache_key) == 64 and request.message_count == len(messages) - 3
    assert summary_cache_key(seen[0]) == request.cache_key
    # The conversation: the original intent, then the span, in the client's own blocks.
    assert list(conversations[0]) == messages[: len(messages) - 2]
    again = await compact_context_async(messages, None, policy=_policy(500, summary_keep_recent=2),
                                        summarizer=summarise)
    assert summary_cache_key(seen[1]) == request.cache_key and again.messages == result.messages


def test_a_shared_caching_counter_counts_each_block_once_across_calls() -> None:
    """The second identical request is counted entirely from the cache."""
    counter = CachingCounter(TiktokenCounter())
    messages = _big_results_session()
    policy = _policy(5_000, max_tool_result_tokens=500)
    compact_context(messages, None, policy=policy, counter=counter)
    misses = counter.misses
    compact_context(messages, None, policy=policy, counter=counter)
    assert counter.misses == misses


def test_chars4_is_the_default_counter() -> None:
    """Without a counter the 4-characters estimate is used."""
    messages = [user("x" * 4_000)]
    result = compact_context(messages, None, policy=_policy(100_000))
    assert result.tokens_before == CachingCounter(Chars4Counter()).count_message(messages[0])


def test_a_token_scale_moves_every_threshold_comparison_to_the_providers_figures() -> None:
    """With a calibration factor the thresholds are compared with counted tokens times the
    factor: a view under the soft threshold as counted is compacted when the provider counts
    it over, the reported figures are scaled, and counted_after stays the counter's own."""
    messages = _big_results_session()
    counted = compact_context(messages, None, policy=_policy(900_000)).tokens_before
    policy = _policy(int(counted * 1.2), max_tool_result_tokens=1_000)
    plain = compact_context(messages, None, policy=policy)
    assert plain.layers_applied == () and plain.tokens_after == plain.counted_after == counted
    scaled = compact_context(messages, None, policy=policy,
                             options=CompactionOptions(token_scale=1.5))
    assert scaled.layers_applied == ("L1",)
    assert scaled.tokens_before == round(counted * 1.5)
    assert scaled.tokens_after == round(scaled.counted_after * 1.5) < policy.soft_threshold_tokens
    intent = [user("x" * 40_000)]  # nothing to compact: the original intent stays
    with pytest.raises(MessageViewLimitExceeded) as refused:
        compact_context(intent, None, policy=_policy(15_000, hard=15_001),
                        options=CompactionOptions(token_scale=2.0))
    assert refused.value.tokens_after == 2 * compact_context(
        intent, None, policy=_policy(15_000, hard=15_001)).tokens_after
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="token_scale"):
            CompactionOptions(token_scale=bad)


async def test_the_summarys_conversation_is_the_history_as_it_was_sent() -> None:
    """L2 drops an early superseded read before L4 runs; the conversation handed to the
    summariser is still the client's own history up to the kept turns (a prefix the provider
    has cached), not the view L2 left, while the span summarised is the view's."""
    from .builders import read_call, tool_result

    messages: list = [user("Refactor app.py")]
    messages += [assistant(read_call("r0", "/src/app.py")), user(tool_result("r0", "v1 " * 300))]
    for n in range(8):
        messages += exchange(f"t{n}", "log " * 300)
    messages += [assistant(read_call("r9", "/src/app.py")), user(tool_result("r9", "v2 " * 300))]
    seen: list[SummaryRequest] = []

    async def summarise(request: SummaryRequest) -> str:
        seen.append(request)
        return "summary"

    result = await compact_context_async(
        messages, None, policy=_policy(1_000, max_tool_result_tokens=5_000,
                                       keep_recent_messages=40, summary_keep_recent=4),
        summarizer=summarise, options=CompactionOptions(copy=False))
    assert "L2" in result.layers_applied and "L4" in result.layers_applied
    conversation = list(seen[0].conversation)
    assert conversation == messages[: len(conversation)]
    assert all(a is b for a, b in zip(conversation, messages, strict=False))
    assert '"r0"' in json.dumps(conversation) and '"r0"' not in seen[0].messages_json


def test_the_result_is_an_ordinary_frozen_compaction_result() -> None:
    """The pipeline's result is equal to the one the constructor makes from its fields,
    frozen, and takes dataclasses.replace."""
    import dataclasses

    from compactor import CompactionResult

    result = compact_context(_big_results_session(), policy=_policy(soft=2_000),
                             counter=Chars4Counter())
    values = {spec.name: getattr(result, spec.name) for spec in dataclasses.fields(result)}
    assert result.layers_applied and result.tokens_after < result.tokens_before
    assert result == CompactionResult(**values)
    assert dataclasses.replace(result, tokens_after=1).tokens_after == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.tokens_after = 0  # type: ignore[misc]
