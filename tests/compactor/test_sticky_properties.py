"""Sticky mode over generated sessions: every request of a growing history, in order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionCheckpoint,
    CompactionOptions,
    ProtocolMemo,
    compact_context,
)
from compactor._fingerprint import strip_cache_control
from policies import CompactionPolicy

from .invariants import assert_valid_view
from .strategies import History, histories
from .test_properties import PROPERTY, STATE, short_summary


def _requests(history: History) -> list[list[dict]]:
    """Each prefix of the history that a client would send (it ends with a user turn)."""
    messages = history.messages
    return [messages[: i + 1] for i, m in enumerate(messages)
            if m["role"] == "user"
            and (i + 1 == len(messages) or messages[i + 1]["role"] != "user")]


@PROPERTY
@given(histories(min_turns=4, max_turns=14), st.integers(60, 600), st.integers(0, 8),
       st.sampled_from([None, short_summary]))
def test_every_request_of_a_sticky_session_is_a_valid_view(
        history: History, soft: int, keep_recent: int, summarizer) -> None:
    """Reused or fresh, each view passes every invariant, and a reused one starts with the
    checkpoint's view byte for byte."""
    policy = CompactionPolicy(soft_threshold_tokens=soft, hard_limit_tokens=10**9,
                              max_tool_result_tokens=max(20, soft // 3),
                              keep_recent_messages=keep_recent, summary_keep_recent=2)
    counter = CachingCounter(Chars4Counter())
    checkpoint: CompactionCheckpoint | None = None
    for request in _requests(history):
        result = compact_context(request, STATE, policy=policy, summarizer=summarizer,
                                 counter=counter,
                                 options=CompactionOptions(checkpoint=checkpoint, sticky=True))
        assert_valid_view(request, result, counter=Chars4Counter())
        assert result.durable_state is STATE
        if result.reused_checkpoint and result.checkpoint is checkpoint:
            assert checkpoint is not None
            assert [strip_cache_control(m) for m in result.messages[: len(checkpoint.view)]] \
                == checkpoint.view
        checkpoint = result.checkpoint or checkpoint


@PROPERTY
@given(histories(min_turns=4, max_turns=14), st.integers(60, 600),
       st.sampled_from([None, short_summary]))
def test_a_protocol_memo_changes_no_view(history: History, soft: int, summarizer) -> None:
    """Every request of a sticky session with walks kept across requests: the same view,
    counts and checkpoint as validating each view whole."""
    policy = CompactionPolicy(soft_threshold_tokens=soft, hard_limit_tokens=10**9,
                              max_tool_result_tokens=max(20, soft // 3),
                              keep_recent_messages=2, summary_keep_recent=2)
    memo = ProtocolMemo()
    kept: dict[bool, CompactionCheckpoint | None] = {True: None, False: None}
    for request in _requests(history):
        results = {}
        for with_memo in (True, False):
            results[with_memo] = compact_context(
                request, STATE, policy=policy, summarizer=summarizer,
                counter=CachingCounter(Chars4Counter()),
                options=CompactionOptions(checkpoint=kept[with_memo], sticky=True,
                                          protocol_memo=memo if with_memo else None))
            kept[with_memo] = results[with_memo].checkpoint or kept[with_memo]
        fast, whole = results[True], results[False]
        assert fast.messages == whole.messages
        assert (fast.tokens_before, fast.tokens_after, fast.layers_applied) \
            == (whole.tokens_before, whole.tokens_after, whole.layers_applied)
