"""Summaries made ahead: the crossing uses the prepared span's summary and keeps the later
messages verbatim; a preparation that does not fit the view is never used."""

from __future__ import annotations

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionOptions,
    compact_context,
    prepare_span,
    summary_cache_key,
)
from compactor._l4_summary import _summary_block, holds_summary
from compactor._record import SpanRecord, parse_record
from compactor._view import View
from policies import CompactionPolicy
from proxy.fake_upstream.rules import check_messages_request

from .builders import exchange, user

POLICY = CompactionPolicy(soft_threshold_tokens=6_000, hard_limit_tokens=50_000,
                          max_tool_result_tokens=2_000, keep_recent_messages=60,
                          summary_keep_recent=4)


def _turns(messages: list, start: int, count: int, chars: int = 1_200) -> list:
    for n in range(start, start + count):
        messages = [*messages, *exchange(f"toolu_{n:04d}", f"out {n} " * (chars // 8),
                                         command=f"step {n}")]
    return messages


def _prepared_at(messages: list, counter: CachingCounter):
    found = prepare_span(messages, POLICY, counter)
    assert found is not None
    return found


def test_the_crossing_uses_the_prepared_summary_and_keeps_the_rest_verbatim() -> None:
    counter = CachingCounter(Chars4Counter())
    early = _turns([user("Fix the parser")], 0, 18)
    request, span = _prepared_at(early, counter)
    assert View(early, counter).total() < POLICY.soft_threshold_tokens
    grown = _turns(early, 18, 6)
    asked: list[str] = []

    def summarise(payload: str) -> str:
        asked.append(summary_cache_key(payload))
        return "prepared summary text"

    result = compact_context(grown, policy=POLICY, summarizer=summarise, counter=counter,
                             options=CompactionOptions(prepared=span))
    assert asked == [span.cache_key] == [request.cache_key]
    assert result.tokens_after < POLICY.soft_threshold_tokens
    l4 = [o for o in result.outcomes if o.layer == "L4"]
    assert l4 and l4[0].detail == "prepared summary"
    # Everything after the prepared span is the client's, verbatim.
    after = grown[span.cut:]
    assert result.messages[-len(after):] == after
    assert any(holds_summary(m) for m in result.messages)
    check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})


def test_a_preparation_for_another_history_is_not_used() -> None:
    counter = CachingCounter(Chars4Counter())
    early = _turns([user("Fix the parser")], 0, 18)
    _, span = _prepared_at(early, counter)
    other = _turns([user("Fix the lexer")], 0, 18)
    asked: list[str] = []

    def summarise(payload: str) -> str:
        asked.append(summary_cache_key(payload))
        return "inline"

    result = compact_context(other, policy=POLICY, summarizer=summarise, counter=counter,
                             options=CompactionOptions(prepared=span))
    assert span.cache_key not in asked
    assert result.tokens_after < POLICY.soft_threshold_tokens


def test_a_tail_too_large_for_the_target_falls_back_to_inline() -> None:
    """A session that grew fast past its preparation: not used, the span is summarised now."""
    counter = CachingCounter(Chars4Counter())
    early = _turns([user("Fix the parser")], 0, 6)
    _, span = _prepared_at(early, counter)
    grown = _turns(early, 6, 30)
    asked: list[str] = []

    def summarise(payload: str) -> str:
        asked.append(summary_cache_key(payload))
        return "summary"

    result = compact_context(grown, policy=POLICY, summarizer=summarise, counter=counter,
                             options=CompactionOptions(prepared=span))
    assert asked[0] == span.cache_key and len(asked) == 2
    assert result.tokens_after < POLICY.soft_threshold_tokens
    assert [o.detail for o in result.outcomes if o.layer == "L4"] != ["prepared summary"]


def test_no_preparation_when_the_cheap_layers_reach_the_target() -> None:
    """A crossing L3 alone brings below the target makes no summary: none is prepared."""
    counter = CachingCounter(Chars4Counter())
    early = _turns([user("Fix the parser")], 0, 18)
    assert prepare_span(early, POLICY, counter, stop_below=4_200) is not None
    pruning = CompactionPolicy(soft_threshold_tokens=6_000, hard_limit_tokens=50_000,
                               max_tool_result_tokens=2_000, keep_recent_messages=6,
                               summary_keep_recent=4)
    assert prepare_span(early, pruning, counter, stop_below=4_200) is None


def test_what_the_user_typed_in_the_prepared_span_stays_verbatim_beside_its_summary() -> None:
    """The prepared path keeps the span's user texts and artifact trail as a crossing's own
    summary does (issue #34 meets #33)."""
    counter = CachingCounter(Chars4Counter())
    early = _turns([user("Fix the parser")], 0, 9)
    early = _turns([*early, user("Never touch the public parse_* names.")], 9, 9)
    request, span = _prepared_at(early, counter)
    grown = _turns(early, 18, 6)
    result = compact_context(grown, policy=POLICY, summarizer=lambda _: "prepared summary",
                             counter=counter, options=CompactionOptions(prepared=span))
    l4 = [o for o in result.outcomes if o.layer == "L4"]
    assert l4 and l4[0].detail == "prepared summary"
    text = repr(result.messages)
    assert "Never touch the public parse_* names." in text
    assert "step 3" in text  # a command of the summarised span, in the artifact trail
    check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})


def test_a_prepared_summary_over_an_earlier_one_keeps_its_trail_whole() -> None:
    """An earlier summary's trail (two heredoc commands both ending in ``EOF``) is carried into
    the prepared summary entry by entry, whole and in order, before the span's own entries."""
    heredocs = [f"cat > /src/{name}.py <<'EOF'\nimport os\nprint(os.getcwd())\nEOF"
                for name in ("one", "two")]
    earlier = SpanRecord(("Keep the old API.",), tuple(f"ran {h} (exit 0)" for h in heredocs))
    summary = {"role": "user", "content": [_summary_block("Earlier work.", 12, earlier.render())]}
    early = _turns([user("Fix the parser"), summary], 0, 18)
    request, span = _prepared_at(early, CachingCounter(Chars4Counter()))
    grown = _turns(early, 18, 6)
    result = compact_context(grown, policy=POLICY, summarizer=lambda _: "prepared summary",
                             counter=CachingCounter(Chars4Counter()),
                             options=CompactionOptions(prepared=span))
    assert [o.detail for o in result.outcomes if o.layer == "L4"] == ["prepared summary"]
    summaries = [b["text"] for m in result.messages for b in m["content"]
                 if isinstance(b, dict) and "prepared summary" in b.get("text", "")]
    assert len(summaries) == 1
    kept = parse_record(summaries[0])
    assert kept.user_texts[0] == "Keep the old API."
    assert kept.trail[:3] == (f"ran {heredocs[0]} (exit 0)", f"ran {heredocs[1]} (exit 0)",
                              "ran step 0")
    check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})


def test_a_preparation_keeps_only_what_an_inline_crossing_would_keep_less_the_growth_to_come(
) -> None:
    """Prepared at 0.8 of the threshold, the growth still to come is more than an inline
    summary keeps verbatim (``summary_keep_recent``): the span runs to the last tool answer,
    so the crossing's verbatim tail is only what was added since (before: the span left
    ``summary_keep_recent`` more behind, and the crossing landed that much higher)."""
    counter = CachingCounter(Chars4Counter())
    early = [user("Fix the parser")]
    index = 0
    while View(early, counter).total() < 0.8 * POLICY.soft_threshold_tokens:
        early = _turns(early, index, 1)
        index += 1
    _, span = _prepared_at(early, counter)
    assert span.cut == len(early)
    grown = early
    while View(grown, counter).total() < POLICY.soft_threshold_tokens:
        grown = _turns(grown, index, 1)
        index += 1
    result = compact_context(grown, policy=POLICY, summarizer=lambda _: "summary",
                             counter=counter, options=CompactionOptions(prepared=span))
    assert [o.detail for o in result.outcomes if o.layer == "L4"] == ["prepared summary"]
    assert result.messages[-(len(grown) - span.cut):] == grown[span.cut:]
    check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})


def test_a_preparation_near_the_threshold_keeps_what_inline_keeps_less_the_growth() -> None:
    """Prepared just below the threshold (one exchange's growth to come), the span keeps
    what an inline summary keeps less about that exchange; far from it, nothing after the
    last tool answer, and a person's message not yet answered stays."""
    counter = CachingCounter(Chars4Counter())
    policy = CompactionPolicy(soft_threshold_tokens=6_000, hard_limit_tokens=50_000,
                              max_tool_result_tokens=2_000, keep_recent_messages=60,
                              summary_keep_recent=8)
    early = [user("Fix the parser")]
    index = 0
    while View(_turns(early, index, 1), counter).total() < policy.soft_threshold_tokens:
        early = _turns(early, index, 1)
        index += 1
    found = prepare_span(early, policy, counter)
    assert found is not None
    assert len(early) - found[1].cut == 6
    far = _turns([user("Fix the parser")], 0, 6)
    found = prepare_span(far, policy, counter)
    assert found is not None
    assert found[1].cut == len(far)
    asked = [*far, {"role": "assistant", "content": "Done."}, user("Now the lexer.")]
    found = prepare_span(asked, policy, counter)
    assert found is not None
    assert found[1].cut == len(asked) - 1


def test_a_preparation_ending_at_the_moving_breakpoint_is_used_once_it_moved_on() -> None:
    """The span of a preparation ends at the message that carried the client's moving cache
    breakpoint; at the crossing the marker is on a later message: same span, same summary."""
    counter = CachingCounter(Chars4Counter())
    early = [user("Fix the parser")]
    index = 0
    while View(early, counter).total() < 0.8 * POLICY.soft_threshold_tokens:
        early = _turns(early, index, 1)
        index += 1
    last = early[-1]
    marked = {**last, "content": [{**last["content"][-1], "cache_control": {"type": "ephemeral"}}]}
    _, span = _prepared_at([*early[:-1], marked], counter)
    assert span.cut == len(early)
    grown = _turns(early, index, 6)
    result = compact_context(grown, policy=POLICY, summarizer=lambda _: "summary",
                             counter=counter, options=CompactionOptions(prepared=span))
    assert [o.detail for o in result.outcomes if o.layer == "L4"] == ["prepared summary"]


def test_a_prepared_summary_serves_the_crossing_even_where_l1_alone_would_do() -> None:
    """A huge tool result crosses the threshold and L1 alone would take the view just below
    it (so the next crossing comes soon): the summary prepared for it, paid for already,
    serves the crossing and lands it far lower (before: unused, and paid again later)."""
    counter = CachingCounter(Chars4Counter())
    early = _turns([user("Fix the parser")], 0, 9)
    _, span = _prepared_at(early, counter)
    grown = _turns(early, 9, 1, chars=20_000)
    assert View(grown, counter).total() >= POLICY.soft_threshold_tokens
    cheap = compact_context(grown, policy=POLICY, counter=counter)
    assert [o.layer for o in cheap.outcomes if o.applied] == ["L1"]
    result = compact_context(grown, policy=POLICY, summarizer=lambda _: "summary",
                             counter=counter, options=CompactionOptions(prepared=span))
    assert [o.detail for o in result.outcomes if o.layer == "L4"] == ["prepared summary"]
    assert result.tokens_after < cheap.tokens_after / 2
