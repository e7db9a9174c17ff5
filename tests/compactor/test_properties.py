"""Property tests of the sync pipeline: random valid histories, random low-threshold policies.

Every property runs ``compact_context`` on histories from ``strategies.histories()`` and checks
the result with ``invariants.assert_valid_view`` plus the property's own claim. The profile is
derandomized and database-free, so CI sees the same examples on every run.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compactor import (
    Chars4Counter,
    CompactionOptions,
    CompactionResult,
    DurableContextState,
    DurableFact,
    MessageViewLimitExceeded,
    ToolProtocolError,
    compact_context,
    estimate_tokens,
    validate_tool_protocol,
)
from policies import CompactionPolicy
from proxy.fake_upstream.rules import cache_control_count, check_messages_request

from .invariants import assert_valid_view, first_user
from .strategies import MAX_CACHE_CONTROL, History, histories

# Deterministic and database-free for CI; COMPACT_PROPERTY_EXAMPLES=1000 explores further locally.
EXAMPLES = int(os.environ.get("COMPACT_PROPERTY_EXAMPLES", "60"))
PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STATE = DurableContextState(facts=(DurableFact(
    "f1", "the build uses uv", "transcript:s1:1", datetime(2025, 3, 1, tzinfo=UTC)),))
SUMMARY_TAG = "<compact-proxy-summary"
LAYERS = ("L1", "L2", "L3", "L4")


def short_summary(messages_json: str) -> str:
    """A deterministic summariser: a short line that names the size of what it read."""
    return f"Earlier turns: {len(json.loads(messages_json))} messages, {len(messages_json)} chars."


def long_summary(messages_json: str) -> str:
    """A summariser whose answer is larger than what it summarises (L4 must keep the view)."""
    return "recap " * (len(messages_json) // 2 + 50)


def raising_summary(messages_json: str) -> str:
    """A summariser whose model call fails."""
    raise TimeoutError("upstream summary call timed out")


def empty_summary(messages_json: str) -> str:
    """A summariser that answers nothing."""
    return ""


def blank_summary(messages_json: str) -> str:
    """A summariser that answers whitespace only."""
    return "  \n "


SUMMARISERS: dict[str, Callable[[str], str] | None] = {
    "none": None, "short": short_summary, "long": long_summary,
    "raises": raising_summary, "empty": empty_summary, "blank": blank_summary,
}
FAILING = ("raises", "empty", "blank")


@dataclass(frozen=True)
class Scenario:
    """A history, a policy sized to it and a summariser name."""

    history: History
    policy: CompactionPolicy
    summariser: str

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The generated history's messages."""
        return self.history.messages

    def run(self, messages: list[dict[str, Any]] | None = None, *,
            summariser: str | None = None, **kwargs: Any) -> CompactionResult:
        """``compact_context`` on ``messages`` (default: the history) with this policy."""
        return compact_context(self.messages if messages is None else messages, STATE,
                               policy=self.policy,
                               summarizer=SUMMARISERS[summariser or self.summariser], **kwargs)


@st.composite
def scenarios(draw: st.DrawFn, *, summarisers: tuple[str, ...] = tuple(SUMMARISERS),
              hard: str = "any", min_turns: int = 0, l4_wins: bool | None = None) -> Scenario:
    """A history with a policy whose thresholds sit low relative to its size (``l4_wins``:
    thresholds under which L4's summary usually beats L3; None draws it)."""
    history = draw(histories(min_turns=min_turns))
    if l4_wins is None:
        l4_wins = draw(st.integers(0, 3)) == 0
    tokens = estimate_tokens(history.messages, Chars4Counter())  # the pipeline's count
    soft = max(1, int(tokens * draw(st.sampled_from(
        (0.05, 0.2) if l4_wins else (0.05, 0.2, 0.4, 0.6, 0.9, 1.5)))))
    if hard == "any":
        hard = draw(st.sampled_from(("large", "large", "near")))
    hard_limit = 10**9 if hard == "large" else soft + max(1, int(tokens * draw(
        st.sampled_from((0.05, 0.2, 0.5)))))
    # L4 only wins over L3 when it keeps fewer recent turns than L3 does (its summary costs a
    # message), so many draws keep summary_keep_recent below keep_recent_messages; l4_wins
    # makes the gap wide so the summary is usually the smaller view.
    keep_recent = draw(st.integers(6, 12) if l4_wins else st.integers(0, 10))
    summary_keep = draw(st.integers(0, 2) if l4_wins else st.one_of(
        st.integers(0, max(0, keep_recent - 2)), st.integers(0, 10)))
    policy = CompactionPolicy(
        soft_threshold_tokens=soft,
        hard_limit_tokens=hard_limit,
        max_tool_result_tokens=draw(st.sampled_from((1, 20, 100, 400, 2000))),
        keep_recent_messages=keep_recent,
        summary_keep_recent=summary_keep,
    )
    return Scenario(history, policy, draw(st.sampled_from(summarisers)))


def run_or_limit(scenario: Scenario, **kwargs: Any) -> CompactionResult | MessageViewLimitExceeded:
    """The result, or the limit error it raised (every other exception propagates)."""
    try:
        return scenario.run(**kwargs)
    except MessageViewLimitExceeded as error:
        return error


def is_summary(message: dict[str, Any]) -> bool:
    """True for a message L4 wrote (not a record of what L3 dropped, which has no summary)."""
    content = message.get("content")
    blocks = content if isinstance(content, list) else [{"text": content}]
    texts = [str(b.get("text", "")) for b in blocks]
    return any(t.startswith(SUMMARY_TAG) and 'dropped="true"' not in t.split("\n", 1)[0]
               for t in texts)


# -- compactor bugs these properties found (fixed in 0ae095a) -------------------------------
# Each is the minimal example, written out so the properties always try it first.

_WIDE = 10**9
_RESULT_247 = "\n".join(f"zq0001 alpha output line {i:05d}" for i in range(8))  # 247 characters


def _one_call(result: str) -> History:
    """An intent, one Bash call and its result."""
    return History([
        {"role": "user", "content": "zq0001 hello there"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]},
    ], ("zq0001 hello there", result))


# L1 cut a 201-285 character result to a 100-character head, an ~85-character marker and a
# 100-character tail (MIN_PART_CHARS floors the budget at 200): the "cut" result was longer.
L1_GROWS = Scenario(_one_call(_RESULT_247), CompactionPolicy(
    soft_threshold_tokens=1, hard_limit_tokens=_WIDE, max_tool_result_tokens=20), "none")
# L1 counted a result it cannot shorten (<= 200 characters, over max_tool_result_tokens) as
# changed: "L1" was reported applied while the view was unchanged, on every pass.
L1_NOOP_APPLIED = Scenario(_one_call("zq0001 alpha output line 00000"), CompactionPolicy(
    soft_threshold_tokens=1, hard_limit_tokens=_WIDE, max_tool_result_tokens=1), "none")
# L1's own output was still over a small budget, so a second pass cut the cut text again.
L1_RECUTS = Scenario(_one_call("\n".join(f"zq0001 alpha output line {i:05d}" for i in range(40))),
                     CompactionPolicy(soft_threshold_tokens=1, hard_limit_tokens=_WIDE,
                                      max_tool_result_tokens=1), "none")
# L4 puts the kept role-system message between the summary and the kept turns; L3 counted
# it in keep_recent_messages, so a second pass dropped the summary message itself.
_LONG = "zq0001 " + "echo " * 80
L3_DROPS_SUMMARY = Scenario(History([
    {"role": "user", "content": "zq0001 fix the build"},
    {"role": "assistant", "content": "zq0001 looking"},
    {"role": "system", "content": "zq0001 be brief"},
    {"role": "user", "content": _LONG},
    {"role": "assistant", "content": "zq0001 done"},
    {"role": "user", "content": "zq0001 thanks"},
], ("zq0001 fix the build", "zq0001 looking", "zq0001 be brief", _LONG, "zq0001 done",
    "zq0001 thanks")), CompactionPolicy(soft_threshold_tokens=1, hard_limit_tokens=_WIDE,
                                        keep_recent_messages=3, summary_keep_recent=2), "short")


# -- the generator itself ------------------------------------------------------------------


@PROPERTY
@given(histories())
def test_generated_histories_pass_the_strict_checker(history: History) -> None:
    """Every generated history is a request the provider accepts and a valid tool protocol."""
    check_messages_request({"model": "claude-sonnet-4-5", "max_tokens": 1024,
                            "messages": history.messages})
    validate_tool_protocol(history.messages)
    assert cache_control_count({"messages": history.messages}) <= MAX_CACHE_CONTROL
    assert history.messages[-1]["role"] == "user"


# -- the pipeline --------------------------------------------------------------------------


@settings(PROPERTY, max_examples=3 * EXAMPLES)
@given(scenarios())
def test_compacted_view_keeps_every_spec_invariant(scenario: Scenario) -> None:
    """Whatever the policy and summariser, the view passes every SPEC §5 invariant."""
    outcome = run_or_limit(scenario)
    if isinstance(outcome, MessageViewLimitExceeded):
        assert outcome.tokens_after >= scenario.policy.hard_limit_tokens
        return
    assert_valid_view(scenario.messages, outcome, counter=Chars4Counter())
    assert outcome.durable_state is STATE


@PROPERTY
@given(scenarios(), st.booleans())
def test_compaction_never_mutates_the_input(scenario: Scenario, deep_copy: bool) -> None:
    """The caller's messages are equal to a deep copy taken before, with or without copy=."""
    before = copy.deepcopy(scenario.messages)
    run_or_limit(scenario, options=CompactionOptions(copy=deep_copy))
    assert scenario.messages == before


@PROPERTY
@given(scenarios(hard="large"))
@example(L1_GROWS)
def test_tokens_never_grow_overall_or_in_any_layer(scenario: Scenario) -> None:
    """tokens_after <= tokens_before for the whole run and for every layer that ran."""
    result = scenario.run()
    assert result.tokens_after <= result.tokens_before
    for outcome in result.outcomes:
        assert outcome.tokens_after <= outcome.tokens_before, outcome


@PROPERTY
@given(scenarios(hard="large"))
def test_view_below_soft_threshold_is_returned_unchanged(scenario: Scenario) -> None:
    """A view already below the soft threshold comes back equal, with no layer run."""
    tokens = estimate_tokens(scenario.messages, Chars4Counter())  # the pipeline's count
    policy = replace(scenario.policy, soft_threshold_tokens=tokens + 1,
                     hard_limit_tokens=tokens + 2)
    result = compact_context(scenario.messages, STATE, policy=policy,
                             summarizer=SUMMARISERS[scenario.summariser])
    assert result.messages == scenario.messages
    assert result.layers_applied == () and result.outcomes == ()
    assert result.tokens_before == result.tokens_after == tokens


@PROPERTY
@given(scenarios(hard="large", summarisers=("none", "short")))
def test_view_compacted_below_soft_threshold_is_a_fixpoint(scenario: Scenario) -> None:
    """A view the first pass brought below the soft threshold comes back unchanged."""
    first = scenario.run()
    if first.tokens_after >= scenario.policy.soft_threshold_tokens:
        return  # covered by the between-soft-and-hard property below
    second = scenario.run(first.messages)
    assert second.messages == first.messages
    assert second.layers_applied == () and second.outcomes == ()
    assert second.tokens_before == second.tokens_after == first.tokens_after


@PROPERTY
@given(scenarios(hard="large", summarisers=("none", "short")))
@example(L1_NOOP_APPLIED)
@example(L1_RECUTS)
@example(L3_DROPS_SUMMARY)
def test_second_pass_over_a_compacted_view_changes_nothing(scenario: Scenario) -> None:
    """Compacting the compacted view again returns it unchanged, also when the first pass
    could not get below the soft threshold (every layer already did what it could)."""
    first = scenario.run()
    second = scenario.run(first.messages)
    assert second.messages == first.messages
    assert second.layers_applied == ()


@PROPERTY
@given(scenarios(hard="large"))
def test_first_user_message_and_durable_state_come_out_identical(scenario: Scenario) -> None:
    """The first user message is the very object given (copy=False) or an equal one, and the
    durable state is the object given."""
    copied = scenario.run()
    assert copied.durable_state is STATE
    assert first_user(copied.messages) == first_user(scenario.messages)
    shared = scenario.run(options=CompactionOptions(copy=False))
    assert shared.durable_state is STATE
    assert first_user(shared.messages) is first_user(scenario.messages)


@PROPERTY
@given(scenarios(hard="large", min_turns=1))
def test_limit_error_carries_no_message_text(scenario: Scenario) -> None:
    """MessageViewLimitExceeded holds numbers and layer names only, never a generated text."""
    policy = replace(scenario.policy, soft_threshold_tokens=1, hard_limit_tokens=2)
    with pytest.raises(MessageViewLimitExceeded) as caught:
        compact_context(scenario.messages, STATE, policy=policy,
                        summarizer=SUMMARISERS[scenario.summariser])
    error = caught.value
    assert type(error.tokens_before) is int and type(error.tokens_after) is int
    assert error.hard_limit == 2 and error.tokens_after >= 2
    assert isinstance(error.layers_applied, tuple)
    assert set(error.layers_applied) <= set(LAYERS)
    rendered = " ".join([str(error), repr(error), repr(vars(error)), repr(error.args)])
    # Every generated text starts with the history's marker, so its absence rules out all.
    marker = scenario.history.texts[0].split()[0]
    assert marker not in rendered
    assert not any(text in rendered for text in scenario.history.texts)


@PROPERTY
@given(scenarios(summarisers=FAILING, min_turns=2, l4_wins=True))
def test_failing_summariser_loses_nothing_l3_would_not(scenario: Scenario) -> None:
    """A summariser that raises or answers nothing leaves the view exactly as without L4."""
    failed = run_or_limit(scenario)
    without = run_or_limit(scenario, summariser="none")
    if isinstance(without, MessageViewLimitExceeded):
        assert isinstance(failed, MessageViewLimitExceeded)
        assert failed.tokens_after == without.tokens_after
        return
    assert isinstance(failed, CompactionResult)
    assert failed.messages == without.messages
    assert failed.layers_applied == without.layers_applied
    assert "L4" not in failed.layers_applied
    assert not any(is_summary(m) for m in failed.messages)


@PROPERTY
@given(scenarios(summarisers=("short",), hard="large", min_turns=4, l4_wins=True))
def test_working_summariser_replaces_the_middle_with_one_summary(scenario: Scenario) -> None:
    """When L4 applies, the view holds exactly one summary: a message right after the intent,
    or — when the turn in progress opened with thinking inside the summarised span — a block
    at the end of that opener's answer, which follows the intent directly."""
    result = scenario.run()
    assert_valid_view(scenario.messages, result)
    summaries = [i for i, m in enumerate(result.messages) if is_summary(m)]
    if "L4" in result.layers_applied:
        assert len(summaries) == 1
        intent = result.messages.index(first_user(scenario.messages))  # type: ignore[arg-type]
        at = summaries[0]
        if at == intent + 1:
            assert not any(b.get("type") == "tool_result"
                           for b in result.messages[at]["content"])
        else:
            assert at == intent + 2
            opener, answer = result.messages[intent + 1], result.messages[at]
            assert opener["content"][0]["type"] in ("thinking", "redacted_thinking")
            assert answer["content"][0]["type"] == "tool_result"
            assert is_summary({"content": answer["content"][-1:]})
        assert result.summary_request is not None
    else:
        assert summaries == []


# -- the helper itself: it must catch what it claims to check -------------------------------


def _base() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "fix the failing test please"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look first", "signature": "sig1"},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "pytest"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"},
            {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}]},
    ]


def _edit_thinking(v: list[dict[str, Any]]) -> None:
    v[1]["content"][0]["thinking"] = "edited"


def _thinking_not_first(v: list[dict[str, Any]]) -> None:
    v[1]["content"].insert(0, {"type": "text", "text": "first"})


def _drop_intent(v: list[dict[str, Any]]) -> None:
    v[0]["content"] = "something else"


def _drop_system(v: list[dict[str, Any]]) -> None:
    del v[2]


def _extra_cache(v: list[dict[str, Any]]) -> None:
    v[3]["content"][0]["cache_control"] = {"type": "ephemeral"}


def _lone_server_use(v: list[dict[str, Any]]) -> None:
    del v[1]["content"][2]


def _broken_pair(v: list[dict[str, Any]]) -> None:
    del v[3]["content"][0]


def _empty_text(v: list[dict[str, Any]]) -> None:
    v[3]["content"][1]["text"] = " "


@pytest.mark.parametrize("damage", [
    _edit_thinking, _thinking_not_first, _drop_intent, _drop_system, _extra_cache,
    _lone_server_use, _broken_pair, _empty_text,
])
def test_invariant_helper_rejects_a_damaged_view(
        damage: Callable[[list[dict[str, Any]]], None]) -> None:
    """assert_valid_view fails on a view that breaks one SPEC §5 invariant."""
    original = _base()
    view = copy.deepcopy(original)
    damage(view)
    result = CompactionResult(view, STATE, 100, 90, ("L1",), ())
    with pytest.raises((AssertionError, ToolProtocolError)):
        assert_valid_view(original, result)


def test_invariant_helper_rejects_a_view_that_grew() -> None:
    """assert_valid_view fails when tokens_after is above tokens_before."""
    original = _base()
    result = CompactionResult(copy.deepcopy(original), STATE, 90, 100, (), ())
    with pytest.raises(AssertionError, match="larger"):
        assert_valid_view(original, result)


def test_invariant_helper_accepts_an_undamaged_copy() -> None:
    """assert_valid_view passes on an equal copy of a valid history."""
    original = _base()
    assert_valid_view(original, CompactionResult(copy.deepcopy(original), STATE, 100, 100, (), ()))


# -- the bugs above, one regression test each ----------------------------------------------


def test_l1_never_makes_a_tool_result_larger() -> None:
    """Truncating a result just over L1's 200-character floor does not grow the view."""
    result = L1_GROWS.run()
    assert result.tokens_after <= result.tokens_before


def test_l1_reports_no_layer_when_it_cannot_shorten_a_result() -> None:
    """A result L1 cannot shorten leaves the view equal and L1 out of layers_applied."""
    result = L1_NOOP_APPLIED.run()
    assert result.messages == L1_NOOP_APPLIED.messages
    assert "L1" not in result.layers_applied


def test_l1_leaves_its_own_truncated_output_alone() -> None:
    """A result L1 already truncated comes through a second L1 pass unchanged."""
    first = L1_RECUTS.run()
    assert "L1" in first.layers_applied
    assert L1_RECUTS.run(first.messages).messages == first.messages


def test_second_pass_keeps_the_l4_summary() -> None:
    """Compacting an L4 view again keeps its summary message."""
    first = L3_DROPS_SUMMARY.run()
    assert first.layers_applied == ("L4",) and any(is_summary(m) for m in first.messages)
    second = L3_DROPS_SUMMARY.run(first.messages)
    assert any(is_summary(m) for m in second.messages)
