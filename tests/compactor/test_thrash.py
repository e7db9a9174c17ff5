"""Issue #34: a session that re-crosses the soft threshold right after a compaction (one huge
tool result per turn) is flagged and compacted deeper, so it is not summarised every request."""

from __future__ import annotations

import pytest

import compactor._thrash
from compactor import CompactionOptions, compact_context
from policies import CompactionPolicy
from proxy.fake_upstream.rules import check_messages_request

from .builders import exchange, user
from .test_sticky import Session

# Each turn adds about 1,500 tokens (L1 cuts its result to that): over a third of the soft
# threshold, so a compaction to the usual 70 % is crossed again by the next turn.
POLICY = CompactionPolicy(soft_threshold_tokens=4_000, hard_limit_tokens=40_000,
                          max_tool_result_tokens=1_500, keep_recent_messages=6,
                          summary_keep_recent=4)


def _play(session: Session, turns: int) -> list:
    messages: list = [user("Watch the build logs.")]
    results = []
    for n in range(turns):
        messages = [*messages, *exchange(f"t{n}", "log line of the build\n" * 2_000,
                                         command=f"tail build{n}.log")]
        results.append(session.send(messages))
    return results


def test_a_recrossing_soon_after_a_compaction_is_flagged_and_goes_deeper() -> None:
    """The re-crossings within a few requests are flagged, and each flagged compaction is
    made by the cheap layers, deeper (fewer recent messages kept), with no summary paid for:
    it ends under the soft threshold all the same."""
    results = _play(Session(POLICY), 40)
    thrashes = [r for r in results if r.thrash]
    assert len(thrashes) >= 10
    assert all(r.summary_request is None for r in thrashes)
    assert all(r.tokens_after < POLICY.soft_threshold_tokens for r in thrashes)
    assert all(any(o.layer == "L3" and o.applied for o in r.outcomes) for r in thrashes)
    assert not any(r.thrash for r in results if not r.outcomes)


def test_the_guard_halves_the_summary_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 40 such turns: a summary every other request with the guard, every request
    without it."""
    guarded = Session(POLICY)
    _play(guarded, 40)
    monkeypatch.setattr(compactor._thrash, "THRASH_WITHIN_MESSAGES", -1)
    unguarded = Session(POLICY)
    results = _play(unguarded, 40)
    assert not any(r.thrash for r in results)
    assert len(guarded.summary_inputs) <= 20 < 30 <= len(unguarded.summary_inputs)


def test_a_first_compaction_is_no_thrash() -> None:
    """Without a checkpoint there is nothing to re-cross."""
    messages: list = [user("go")]
    for n in range(20):
        messages += exchange(f"t{n}", "x" * 6_000, command=f"c{n}")
    result = compact_context(messages, None, policy=POLICY, summarizer=lambda s: "sum",
                             options=CompactionOptions(sticky=True))
    assert result.changed and not result.thrash
    check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})
